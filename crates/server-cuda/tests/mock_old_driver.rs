//! The CUDA server on an older or virtualised driver: the mock built with
//! `SCOPE_MOCK_OLD_DRIVER` is a CUDA 12.2 driver (Linux 535) that reports
//! no memory pools (and refuses `cuMemPoolCreate`) and has no
//! `cuFuncGetParamInfo` (CUDA < 12.4), beside a 12.2 NVRTC
//! (`SCOPE_MOCK_NVRTC_VERSION=122`) — the NVRTC the CUDA bundle carries,
//! whose PTX (ISA 8.2) that driver JITs. Two paths the default mock never
//! takes: plain `cuMemAlloc`/`cuMemFree` with the server counting reserved
//! bytes itself, and scalar blobs passed from a zero-padded copy because
//! the kernel's parameter sizes are unknown. And NVRTC 13.0's PTX (ISA
//! 9.0), which this driver refuses, named as such.
//!
//! A binary of its own: the mock variant is chosen once per process.

#[macro_use]
mod common;
#[path = "mock/harness.rs"]
mod harness;

use common::{FILL, bytes, kernel, words};
use harness::{assert_versions, mock};
use scope_core::{Binding, Client, Dispatch, Error, Kernel, Result};
use server_cuda::{Cuda, CudaVersion, PtxIsa, UnsupportedPtx};

const OLD: &[&str] = &["SCOPE_MOCK_OLD_DRIVER", "SCOPE_MOCK_NVRTC_VERSION=122"];

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
        fn capabilities() -> &'static [scope_test::Capability] {
            &[scope_test::Capability::Reopen]
        }
    }
);

mod conformance {
    scope_test::conformance_tests!(super::OldDriverSuite);
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

/// The bundle's pairing: the driver reports CUDA 12.2, NVRTC 12.2 writes
/// PTX ISA 8.2, which that driver JITs, and the server compiles for the
/// device's own architecture (sm_90, which NVRTC 12.2 knows).
#[test]
fn a_12_2_driver_runs_what_nvrtc_12_2_writes() {
    let c = client();
    assert_versions(
        &c,
        CudaVersion::new(12, 2),
        CudaVersion::new(12, 2),
        "compute_90",
    );
    let description = c.describe();
    assert!(description.contains("driver CUDA 12.2"), "{description}");
    let ptx = server_cuda::nvrtc_ptx(&kernel("fill", FILL), "compute_90").unwrap();
    assert_eq!(PtxIsa::of(&ptx), Some(PtxIsa::new(8, 2)), "{ptx}");
    assert_eq!(
        server_cuda::driver_jits(CudaVersion::new(12, 2), PtxIsa::new(8, 2)),
        Some(true)
    );
    let out = c.try_allocate(256).unwrap();
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&out)],
        &bytes(&[64, 5]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![5; 64]);
    mock().assert_clean();
}

/// PTX as NVRTC 13.0 writes it (ISA 9.0) on this 12.2 driver: the JIT
/// refuses it with `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`, and the error is
/// [`UnsupportedPtx`] naming the driver's version, the PTX's, the newest
/// ISA the driver takes and the fix (a 13.0 driver, Linux 580), not a bare
/// code. The same PTX declared 8.2 loads and runs.
#[test]
fn nvrtc_13_ptx_on_a_12_2_driver_is_unsupported_ptx_with_the_fix() {
    let c = client();
    let entry = ".target sm_90\n.address_size 64\n.scope_mock_entry fill fill 8 8\n";
    // SAFETY: never runs: the driver refuses it.
    let too_new =
        unsafe { Kernel::ptx("fill", format!(".version 9.0\n{entry}")) }.block([64, 1, 1]);
    let error = c.compile(&too_new).unwrap_err();
    let unsupported = error
        .external_root::<UnsupportedPtx>()
        .unwrap_or_else(|| panic!("expected UnsupportedPtx, got {error:?}"));
    assert_eq!(unsupported.ptx_isa, Some(PtxIsa::new(9, 0)));
    assert_eq!(unsupported.driver, Some(CudaVersion::new(12, 2)));
    assert_eq!(unsupported.driver_isa(), Some(PtxIsa::new(8, 2)));
    assert_eq!(unsupported.driver_needed(), Some(CudaVersion::new(13, 0)));
    let text = error.to_string();
    for part in [
        "the CUDA driver (CUDA 12.2) cannot JIT its PTX (ISA 9.0",
        "it JITs PTX ISA 8.2 and older (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)",
        "a driver for CUDA 13.0 or newer (Linux 580 or newer)",
        "Unsupported .version 9.0; current version is '8.2'",
    ] {
        assert!(text.contains(part), "{part:?} missing from:\n{text}");
    }
    // SAFETY: the mock's `fill` entry writing `n` words of its one binding;
    // the launch passes the binding's length.
    let taken = unsafe { Kernel::ptx("fill", format!(".version 8.2\n{entry}")) }.block([64, 1, 1]);
    let out = c.try_allocate(256).unwrap();
    c.launch(
        &taken,
        &[Binding::write(&out)],
        &bytes(&[64, 9]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![9; 64]);
    mock().assert_clean();
}
