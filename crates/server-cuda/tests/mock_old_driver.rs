//! The CUDA server on an older or virtualised driver: the mock built with
//! `SCOPE_MOCK_OLD_DRIVER` reports no memory pools (and refuses
//! `cuMemPoolCreate`) and has no `cuFuncGetParamInfo` (CUDA < 12.4). Two
//! paths the default mock never takes: plain `cuMemAlloc`/`cuMemFree` with
//! the server counting reserved bytes itself, and scalar blobs passed from
//! a zero-padded copy because the kernel's parameter sizes are unknown.
//!
//! A binary of its own: the mock variant is chosen once per process.

#[macro_use]
mod common;
#[path = "mock/harness.rs"]
mod harness;

use common::{FILL, bytes, kernel, words};
use harness::mock;
use scope_core::{Binding, Client, Dispatch, Error, Result};
use server_cuda::Cuda;

const OLD: &[&str] = &["SCOPE_MOCK_OLD_DRIVER"];

fn old_client() -> Result<Client<Cuda>> {
    harness::mock_built_with(OLD);
    server_cuda::client()
}

fn client() -> Client<Cuda> {
    old_client().expect("the server starts on the old mock driver")
}

cuda_suite!(
    OldDriverSuite,
    {
        let client = old_client();
        mock().assert_clean();
        client
    },
    Some(1 << 30),
    mock().assert_clean(),
    {
        // The plain-allocation path reopens too: its memory is made again
        // with cuMemAlloc on the context that comes back.
        fn reopens() -> bool {
            true
        }
    }
);

mod conformance {
    scope_test::conformance_tests!(super::OldDriverSuite);
    scope_test::conformance_tests!(@recovery super::OldDriverSuite);
}

/// Without pools, memory is `cuMemAlloc`'d and counted by the server:
/// reserved bytes rise with allocations and fall with frees, and freeing a
/// buffer whose copy is still queued leaves the copy's result intact. (The
/// pool path is ruled out: the mock refuses `cuMemPoolCreate`, and the
/// test ends by asserting it refused nothing.)
#[test]
fn without_pools_memory_is_allocated_and_counted_by_the_server() {
    let c = client();
    assert_eq!(c.bytes_reserved(), 0);
    let a = c.try_allocate(4096).unwrap();
    let b = c.try_allocate(8192).unwrap();
    assert_eq!(c.bytes_reserved(), 4096 + 8192);
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&a)],
        &bytes(&[1024, 7]),
        Dispatch::linear(16),
    )
    .unwrap();
    c.copy(a.slice(0..4096), b.slice(0..4096)).unwrap();
    c.free(&a).unwrap();
    drop(a);
    assert_eq!(words(&c.read(b.slice(0..4096)).unwrap()), vec![7; 1024]);
    assert_eq!(c.bytes_reserved(), 8192);
    c.free(&b).unwrap();
    drop(b);
    assert_eq!(c.bytes_reserved(), 0);
    mock().assert_clean();
}

/// Without `cuFuncGetParamInfo` the server cannot check a launch against
/// the kernel's parameters, so it passes the blob from a zero-padded copy:
/// a kernel whose struct is larger than the blob reads zeros for the rest,
/// never the caller's neighbouring bytes. A blob past the classic 4 KiB
/// parameter space is an invalid argument, refused before anything runs.
#[test]
fn without_param_info_a_short_blob_reads_zeros_and_a_huge_one_is_refused() {
    let c = client();
    // What the padded launch can pass, and so what the server reports.
    assert_eq!(c.limits().launch.max_scalar_bytes, 4096);
    let out = c.try_allocate(256).unwrap();
    let fill = kernel("fill", FILL);
    c.launch(
        &fill,
        &[Binding::write(&out)],
        &bytes(&[64, 3]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![3; 64]);
    // Only `n`: `value` reads as the padding's zero.
    c.launch(
        &fill,
        &[Binding::write(&out)],
        &bytes(&[64]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![0; 64]);
    let huge = vec![0u8; 4100];
    let refused = c
        .launch(&fill, &[Binding::write(&out)], &huge, Dispatch::linear(1))
        .unwrap_err();
    assert!(
        matches!(&refused, Error::InvalidArgument { why, .. } if why.contains("parameter space")),
        "{refused}"
    );
    // Refused before its scope opened: nothing claimed, nothing ran.
    assert_eq!(words(&c.read(&out).unwrap()), vec![0; 64]);
    assert_eq!(c.failures_held(), 0);
    mock().assert_clean();
}
