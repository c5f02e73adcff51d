//! Driver failures the mock would not make by itself, planted with
//! `fail_next`: each lands as a typed error on the work that met it, claims
//! what that work would have written, leaves the device unpoisoned (none of
//! these codes is sticky), and the next attempt works. These are the paths
//! real hardware takes rarely and a GPU test run cannot provoke on demand.
//!
//! A planted failure is process-wide (the mock is one driver), so the tests
//! of this binary take turns: under `cargo test` they share a process, and
//! one test's plan must not meet another's call.

mod common;
#[path = "mock/harness.rs"]
mod harness;

use common::{FILL, bytes, kernel, words};
use harness::{client, mock};
use parking_lot::{Mutex, MutexGuard};
use scope_core::{Binding, Client, Dispatch};
use server_cuda::Cuda;

/// Held for the whole of each test.
fn alone() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock()
}

/// `cudaError_enum` values (CUDA 13.0).
const OUT_OF_MEMORY: i32 = 2;
const LAUNCH_OUT_OF_RESOURCES: i32 = 701;

fn fill(c: &Client<Cuda>, out: &scope_core::Buffer, value: u32) -> scope_core::Result<()> {
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(out)],
        &bytes(&[64, value]),
        Dispatch::linear(1),
    )
}

/// A launch the driver refuses for resources is a launch error on that
/// launch; its output carries it, and the same launch then runs.
#[test]
fn a_launch_out_of_resources_claims_its_output_and_the_next_runs() {
    let _turn = alone();
    let c = client();
    let out = c.try_allocate(256).unwrap();
    c.compile(&kernel("fill", FILL)).unwrap();
    mock().fail_next("cuLaunchKernel", LAUNCH_OUT_OF_RESOURCES);
    let error = fill(&c, &out, 1).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
        "{error}"
    );
    assert!(!error.is_sticky(), "{error}");
    let report = c.read(&out).unwrap_err();
    assert!(
        report
            .to_string()
            .contains("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
        "{report}"
    );
    assert!(c.poison().is_none());
    fill(&c, &out, 2).unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![2; 64]);
    mock().assert_clean();
}

/// A module load that runs out of memory is a compile-time failure of the
/// launch that needed it (rule 21), not cached: the next launch compiles.
#[test]
fn a_module_load_out_of_memory_is_retried_by_the_next_launch() {
    let _turn = alone();
    let c = client();
    let out = c.try_allocate(256).unwrap();
    mock().fail_next("cuModuleLoadDataEx", OUT_OF_MEMORY);
    let error = fill(&c, &out, 1).unwrap_err();
    assert!(error.is_out_of_memory(), "{error}");
    assert!(c.read(&out).is_err());
    fill(&c, &out, 3).unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![3; 64]);
    mock().assert_clean();
}

/// Pinned staging that cannot be had fails the host write as out of
/// memory; the destination carries it until a write succeeds.
#[test]
fn a_write_whose_staging_cannot_be_pinned_claims_its_bytes() {
    let _turn = alone();
    let c = client();
    let out = c.try_allocate(256).unwrap();
    mock().fail_next("cuMemHostAlloc", OUT_OF_MEMORY);
    let error = c.write(&out, &bytes(&[9; 64])).unwrap_err();
    assert!(error.is_out_of_memory(), "{error}");
    assert!(c.read(&out).unwrap_err().is_out_of_memory());
    c.write(&out, &bytes(&[10; 64])).unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![10; 64]);
    mock().assert_clean();
}

/// A captured graph the driver cannot instantiate does not seal: the
/// window's outputs carry the error (rule 33), the stream is no longer
/// capturing, and the next window seals and replays.
#[test]
fn a_graph_that_cannot_be_instantiated_claims_the_window_outputs() {
    let _turn = alone();
    let c = client();
    let out = c.try_allocate(256).unwrap();
    let capture = c.begin_capture().unwrap();
    fill(&c, &out, 4).unwrap();
    mock().fail_next("cuGraphInstantiateWithFlags", OUT_OF_MEMORY);
    let error = c.end_capture(capture).unwrap_err();
    assert!(error.is_out_of_memory(), "{error}");
    assert!(c.read(&out).unwrap_err().is_out_of_memory());
    assert!(c.poison().is_none());
    let capture = c.begin_capture().unwrap();
    fill(&c, &out, 5).unwrap();
    let graph = c.end_capture(capture).unwrap();
    c.replay(&graph).unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![5; 64]);
    c.destroy_graph(&graph).unwrap();
    mock().assert_clean();
}

/// A stream (or one of its events) the driver cannot create is an error
/// from `new_stream`, and a later stream is created and works.
#[test]
fn a_stream_that_cannot_be_created_is_an_error_and_the_next_works() {
    let _turn = alone();
    let c = client();
    for call in ["cuStreamCreate", "cuEventCreate"] {
        mock().fail_next(call, OUT_OF_MEMORY);
        let error = c
            .new_stream()
            .err()
            .unwrap_or_else(|| panic!("a failed {call} made a stream"));
        assert!(
            error.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"),
            "{error}"
        );
    }
    let other = c.new_stream().unwrap();
    let out = other.try_allocate(256).unwrap();
    fill(&other, &out, 6).unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![6; 64]);
    mock().assert_clean();
}

/// A planted failure is consumed by its first match: the calls after it
/// run as usual.
#[test]
fn a_planted_failure_is_consumed_once() {
    let _turn = alone();
    let c = client();
    let out = c.try_allocate(256).unwrap();
    mock().fail_next("cuLaunchKernel", LAUNCH_OUT_OF_RESOURCES);
    assert!(fill(&c, &out, 7).is_err());
    fill(&c, &out, 8).unwrap();
    fill(&c, &out, 9).unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![9; 64]);
    mock().assert_clean();
}
