//! What is HIP's in collecting the HIP C++ cubecl-cpp writes for scope's
//! HIP server with no device (the rest, shared with server-cuda, is
//! scope-cubecl's `tests/support/toolchain.rs`): the children run on the
//! mock runtime (`tests/mock/mock_hip.c`, which carries a mock hiprtc),
//! with `SCOPE_MOCK_HIPRTC_DUMP` set, so the mock hiprtc writes every
//! source it is given into a folder.
//!
//! A child finds the mock where the server's loader looks first: the mock
//! as `lib/libamdhip64.so` (and `lib/libhiprtc.so`, a link to the same
//! file, so that hiprtc is the mock's too) of a folder named by
//! `ROCM_PATH`. A ROCm installed on the machine (`/opt/rocm`, Debian's
//! ROCm 5.2 that the toolchain row compiles with) comes later in the
//! loader's list and is never reached. The runtime tests are
//! scope-cubecl's `runtime_hip` test binary (or the one
//! `SCOPE_CUBECL_RUNTIME_HIP` names).
//!
//! The mock compiles cubecl's kernels (after writing them out) and then
//! finds no function of their name in the module, so a runtime test stops
//! at its first kernel. The runtime tests' later kernels are not
//! collected, as on the CUDA mock (server-cuda's `tests/toolchain/
//! harvest.rs` counts what that misses).

use std::path::{Path, PathBuf};

use crate::support;

/// A folder of `scratch` laid out as a ROCm install whose runtime and
/// hiprtc are the mock, built here: what a child's `ROCM_PATH` names.
pub fn mock(scratch: &Path) -> Result<support::Mock, String> {
    let rocm = scratch.join("mock-rocm");
    let lib = rocm.join("lib");
    std::fs::create_dir_all(&lib).map_err(|e| format!("{}: {e}", lib.display()))?;
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mock/mock_hip.c");
    let built = scope_test::clib::CLibrary {
        source: &source,
        stem: "libscope_mock_hip",
        ..Default::default()
    }
    .build(Path::new(env!("CARGO_TARGET_TMPDIR")))?;
    let runtime = lib.join("libamdhip64.so");
    std::fs::copy(&built, &runtime).map_err(|e| format!("{}: {e}", runtime.display()))?;
    let rtc = lib.join("libhiprtc.so");
    let _ = std::fs::remove_file(&rtc);
    std::os::unix::fs::symlink("libamdhip64.so", &rtc)
        .map_err(|e| format!("linking {}: {e}", rtc.display()))?;
    Ok(support::Mock {
        env: vec![("ROCM_PATH", Some(rocm.into())), ("HIP_PATH", None)],
        dump: "SCOPE_MOCK_HIPRTC_DUMP",
        extension: "hip",
        language: "HIP C++",
    })
}

/// scope-cubecl's `runtime_hip` test binary of the same build.
pub fn runtime_hip() -> Result<PathBuf, String> {
    support::runtime_tests("runtime_hip", "SCOPE_CUBECL_RUNTIME_HIP", "hip")
}

/// In the cubek child: the server opens on the mock runtime, not a real
/// one.
pub fn assert_on_the_mock() {
    let mock = server_hip::client().expect("the mock runtime is the first the loader finds");
    let described = mock.describe();
    assert!(
        described.contains("Mock"),
        "the child must run on the mock runtime, not {described}"
    );
}
