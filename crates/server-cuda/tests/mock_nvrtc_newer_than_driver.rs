//! The CUDA server where the machine's NVRTC is newer than its driver: the
//! mock driver reports CUDA 12.2 (`SCOPE_MOCK_DRIVER_VERSION=12020`, a 535
//! driver) and the mock NVRTC is 13.0, whose PTX (ISA 9.0) that driver's
//! JIT refuses with `CUDA_ERROR_UNSUPPORTED_PTX_VERSION` — every CUDA C++
//! kernel, whatever it does. The server still compiles for the device's own
//! architecture, and its error names the driver's version, the PTX's, the
//! NVRTC that wrote it and both fixes (a newer driver, or an NVRTC no newer
//! than the driver).
//!
//! A binary of its own: the mock variant is chosen once per process.

#[macro_use]
mod common;
#[path = "mock/harness.rs"]
mod harness;

use common::{FILL, bytes, kernel, words};
use harness::{assert_versions, mock, mock_built_with};
use scope_core::{Binding, Client, Dispatch, Kernel};
use server_cuda::{Cuda, CudaVersion, PtxIsa, UnsupportedPtx};

const DRIVER_12_2: &[&str] = &["SCOPE_MOCK_DRIVER_VERSION=12020"];

fn client() -> Client<Cuda> {
    mock_built_with(DRIVER_12_2);
    server_cuda::client().expect("the server starts on the 12.2 mock driver")
}

#[test]
fn nvrtc_13_on_a_12_2_driver_is_unsupported_ptx_naming_both_and_the_fix() {
    let c = client();
    // The device's own architecture, as NVRTC 13.0 knows it.
    assert_versions(
        &c,
        CudaVersion::new(12, 2),
        CudaVersion::new(13, 0),
        "compute_90",
    );
    let fill = kernel("fill", FILL);
    let error = c.compile(&fill).unwrap_err();
    let unsupported = error
        .external_root::<UnsupportedPtx>()
        .unwrap_or_else(|| panic!("expected UnsupportedPtx, got {error:?}"));
    assert_eq!(&*unsupported.kernel, "fill");
    assert_eq!(unsupported.ptx_isa, Some(PtxIsa::new(9, 0)));
    assert_eq!(unsupported.driver, Some(CudaVersion::new(12, 2)));
    assert_eq!(unsupported.nvrtc, Some(CudaVersion::new(13, 0)));
    let text = error.to_string();
    println!("{text}");
    for part in [
        "kernel `fill`: the CUDA driver (CUDA 12.2) cannot JIT its PTX (ISA 9.0, written by NVRTC 13.0)",
        "it JITs PTX ISA 8.2 and older (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)",
        "a driver for CUDA 13.0 or newer (Linux 580 or newer)",
        "an NVRTC no newer than the driver (CUDA 12.2), such as the NVRTC 12.2",
        "Unsupported .version 9.0; current version is '8.2'",
    ] {
        assert!(text.contains(part), "{part:?} missing from:\n{text}");
    }
    // The launch fails the same way, and nothing is poisoned: PTX of an
    // ISA the driver takes loads and runs.
    let out = c.try_allocate(256).unwrap();
    let launched = c.launch(
        &fill,
        &[Binding::write(&out)],
        &bytes(&[64, 3]),
        Dispatch::linear(1),
    );
    let launch_error = launched.unwrap_err();
    assert!(
        launch_error.external_root::<UnsupportedPtx>().is_some(),
        "{launch_error:?}"
    );
    // SAFETY: the mock's `fill` entry, which writes `n` words of its one
    // binding; the launch passes the binding's length.
    let ptx = unsafe {
        Kernel::ptx(
            "fill",
            ".version 8.2\n.target sm_90\n.address_size 64\n.scope_mock_entry fill fill 8 8\n",
        )
    }
    .block([64, 1, 1]);
    c.launch(
        &ptx,
        &[Binding::write(&out)],
        &bytes(&[64, 3]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![3; 64]);
    assert!(c.poison().is_none());
    mock().assert_clean();
}
