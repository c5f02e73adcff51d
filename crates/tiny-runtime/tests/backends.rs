//! The runtime on each linked server: the forward pass against the CPU
//! reference, the fault act and capture/replay, at a test size that is not
//! a multiple of any group size.
//!
//! A backend with no device here prints `skipped: no <backend> device (...)`
//! and passes; with `SCOPE_REQUIRE=<backend>` (as `cargo xtask test
//! --backend <backend>` sets) it fails instead.

#![allow(unused)]

use scope_core::conformance::client_or_skip;
use scope_core::{Backend, Client, Result};
use tiny_runtime::demo::{self, TOLERANCE};
use tiny_runtime::{Mlp, Runtime, Shape, Weights};

fn forward_matches_the_reference<B: Backend>(client: Option<Client<B>>) {
    let Some(client) = client else { return };
    let rt = Runtime::new(client).expect("the server takes one of the shipped dialects");
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
        assert!(
            fwd.max_error <= TOLERANCE,
            "{}: max error {} at {shape:?}",
            B::NAME,
            fwd.max_error
        );
    }
}

fn a_fault_reads_as_its_chain_and_heals<B: Backend>(client: Option<Client<B>>) {
    let Some(client) = client else { return };
    let rt = Runtime::new(client).unwrap();
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
    let rt = Runtime::new(client).unwrap();
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
        }
    };
}

backend_tests!("wgpu", wgpu, server_wgpu);
backend_tests!("vulkan", vulkan, server_vulkan);
backend_tests!("cuda", cuda, server_cuda);
backend_tests!("hip", hip, server_hip);
