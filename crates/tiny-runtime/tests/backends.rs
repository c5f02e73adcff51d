//! The runtime on each linked server: the forward pass against the CPU
//! reference, the fault act, capture/replay and the data-parallel step on
//! four servers of the backend (four logical devices on one adapter), at a
//! test size that is not a multiple of any group size — each on both
//! kernel paths, the `#[cube]` kernels (the default) and the hand-written
//! native ones. On Vulkan the cube kernels also run as WGSL through naga,
//! the target the runtime does not pick by default.
//!
//! A backend with no device here prints `skipped: no <backend> device (...)`
//! and passes; with `SCOPE_REQUIRE=<backend>` (as `cargo xtask test
//! --backend <backend>` sets) it fails instead.

#![allow(unused)]

mod common;

use scope_core::{Backend, Client, Result};
use scope_cube::Target;
use scope_test::client_or_skip;
use tiny_runtime::demo::{self, TOLERANCE};
use tiny_runtime::{Mlp, Runtime, Shape, Weights};

/// How a test makes its runtime: one per kernel path.
type Make<B> = fn(Client<B>) -> Result<Runtime<B>>;

fn paths<B: Backend>() -> Vec<(&'static str, Make<B>)> {
    let mut paths: Vec<(&'static str, Make<B>)> = vec![
        ("cube", Runtime::new as Make<B>),
        ("native", Runtime::native as Make<B>),
    ];
    if B::NAME == "vulkan" {
        paths.push(("cube wgsl", |c| Runtime::cube(c, Target::Wgsl)));
    }
    paths
}

fn forward_matches_the_reference<B: Backend>(client: Option<Client<B>>) {
    let Some(client) = client else { return };
    for (path, make) in paths::<B>() {
        forward_on(path, make(client.clone()).expect("the runtime builds"));
    }
}

fn forward_on<B: Backend>(path: &str, rt: Runtime<B>) {
    for (shape, seed) in [
        (Shape::TEST, 11),
        (
            Shape {
                batch: 64,
                input: 128,
                hidden: 96,
                output: 10,
            },
            12,
        ),
    ] {
        let weights = Weights::random(shape, seed);
        let setup = demo::setup(&rt, &weights, seed + 100).unwrap();
        let fwd = demo::forward(&rt, &setup.mlp, &setup.reference).unwrap();
        println!("{} {path}: max error {:.2e}", B::NAME, fwd.max_error);
        assert!(
            fwd.max_error <= TOLERANCE,
            "{} {path}: max error {} at {shape:?}",
            B::NAME,
            fwd.max_error
        );
    }
}

fn a_fault_reads_as_its_chain_and_heals<B: Backend>(client: Option<Client<B>>) {
    let Some(client) = client else { return };
    for (path, make) in paths::<B>() {
        println!("{} {path}:", B::NAME);
        fault_on(make(client.clone()).expect("the runtime builds"));
    }
}

fn fault_on<B: Backend>(rt: Runtime<B>) {
    let weights = Weights::random(Shape::TEST, 21);
    let setup = demo::setup(&rt, &weights, 22).unwrap();
    demo::forward(&rt, &setup.mlp, &setup.reference).unwrap();
    let fault = demo::fault(&rt, &setup.mlp, &setup.x, &setup.reference).unwrap();
    println!("{}: what the user sees:\n{}", B::NAME, fault.read_error);
    let expected: Vec<&str> = Mlp::KERNELS[1..].iter().rev().copied().collect();
    assert_eq!(fault.skipped, expected);
    assert!(
        fault.root.contains("INJECTED_LAUNCH_FAILURE"),
        "{}",
        fault.root
    );
    assert!(!fault.poisoned && fault.device_kept_working);
    assert!(
        fault.rerun_max_error <= TOLERANCE,
        "{}",
        fault.rerun_max_error
    );
    assert_eq!(rt.client().failures_held(), 0);
}

fn a_captured_pass_replays<B: Backend>(client: Option<Client<B>>) {
    let Some(client) = client else { return };
    for (path, make) in paths::<B>() {
        println!("{} {path}:", B::NAME);
        replay_on(make(client.clone()).expect("the runtime builds"));
    }
}

fn replay_on<B: Backend>(rt: Runtime<B>) {
    let weights = Weights::random(Shape::TEST, 31);
    let setup = demo::setup(&rt, &weights, 32).unwrap();
    demo::forward(&rt, &setup.mlp, &setup.reference).unwrap();
    let replay = demo::replay(&rt, &setup.mlp, &setup.reference, 3).unwrap();
    assert!(
        replay.max_error <= TOLERANCE,
        "{}: {}",
        B::NAME,
        replay.max_error
    );
}

/// Act four on four clients of one backend, each its own server, on every
/// kernel path; `None` (no device) has already printed the skip.
fn a_data_parallel_step<B: Backend>(clients: Option<Vec<Client<B>>>) {
    let Some(clients) = clients else { return };
    for (path, make) in paths::<B>() {
        println!("{} {path}:", B::NAME);
        let runtimes: Vec<Runtime<B>> = clients
            .iter()
            .map(|c| make(c.clone()).expect("the runtime builds"))
            .collect();
        let report = demo::data_parallel(
            runtimes,
            (
                common::data_parallel_shape(clients.len()),
                demo::LEARNING_RATE,
                61,
            ),
            // A real loss where the backend has one (wgpu's destroy), so
            // the recovery replaces a device that is really gone.
            &tiny_runtime::backends::lose_device,
        )
        .unwrap();
        common::assert_data_parallel(&report);
        let runtimes = clients
            .iter()
            .map(|c| make(c.clone()).expect("the runtime builds"))
            .collect();
        let shape = common::data_parallel_shape(clients.len());
        let step = demo::bf16_step(runtimes, (shape, demo::LEARNING_RATE, 62)).unwrap();
        println!(
            "   bf16: gradient error {:.2e} (bound {:.2e}), weights error {:.2e} (bound {:.2e})",
            step.check.gradient_error,
            step.gradient_bound,
            step.check.weights_error,
            step.weights_bound
        );
        assert!(
            step.passed(),
            "{} {path}, bf16 gradients: {step:#?}",
            B::NAME
        );
    }
}

macro_rules! backend_tests {
    ($feature:literal, $module:ident, $server:ident) => {
        #[cfg(feature = $feature)]
        mod $module {
            use super::*;

            #[test]
            fn forward_matches_the_cpu_reference() {
                forward_matches_the_reference(client_or_skip($server::client));
            }

            #[test]
            fn a_fault_in_layer1_matmul_reads_as_its_chain_and_heals() {
                a_fault_reads_as_its_chain_and_heals(client_or_skip($server::client));
            }

            #[test]
            fn a_captured_pass_replays_to_the_reference() {
                a_captured_pass_replays(client_or_skip($server::client));
            }

            #[test]
            fn a_data_parallel_step_on_four_devices_survives_a_fault_on_rank_2() {
                a_data_parallel_step(
                    (0..4)
                        .map(|_| client_or_skip($server::client))
                        .collect::<Option<Vec<_>>>(),
                );
            }
        }
    };
}

backend_tests!("wgpu", wgpu, server_wgpu);
backend_tests!("vulkan", vulkan, server_vulkan);
backend_tests!("cuda", cuda, server_cuda);
backend_tests!("hip", hip, server_hip);
