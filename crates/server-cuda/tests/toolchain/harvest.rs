//! What is CUDA's in collecting the CUDA C++ cubecl-cpp writes for scope's
//! CUDA server with no device (the rest, shared with server-hip, is
//! scope-cubecl's `tests/support/toolchain.rs`): the children run on the
//! mock driver and NVRTC (`tests/mock`), with `SCOPE_MOCK_NVRTC_DUMP` set,
//! so the mock NVRTC writes every source it is given into a folder.
//!
//! A child finds the mocks by name: copies named by their sonames
//! (`libcuda.so`, `libnvrtc.so`) sit in a folder put first on its
//! `LD_LIBRARY_PATH`, and cudarc's first candidates are those names. The
//! runtime tests are scope-cubecl's `runtime_cuda` test binary (or the one
//! `SCOPE_CUBECL_RUNTIME_CUDA` names).
//!
//! The mock NVRTC refuses to compile cubecl's kernels (after writing them
//! out), so a runtime test stops at its first kernel. The runtime tests'
//! other kernels are not collected — about half: the same tests on
//! lavapipe compile 469 WGSL kernels where the mock collects 273 CUDA
//! sources, the rest being the later vectorisations and steps of tests
//! that compile several.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::harness;
use crate::support;

/// The mock driver and NVRTC, as files named by their sonames, in a
/// folder of `scratch` that goes first on a child's `LD_LIBRARY_PATH`.
pub fn mock(scratch: &Path) -> Result<support::Mock, String> {
    let folder = scratch.join("mock-lib");
    std::fs::create_dir_all(&folder).map_err(|e| format!("{}: {e}", folder.display()))?;
    for (source, soname) in [
        ("mock_cuda.c", "libcuda.so"),
        ("mock_nvrtc.c", "libnvrtc.so"),
    ] {
        let built = harness::build(source, soname, &[]);
        std::fs::rename(&built, folder.join(soname))
            .map_err(|e| format!("moving {}: {e}", built.display()))?;
    }
    let library_path = match std::env::var_os("LD_LIBRARY_PATH") {
        Some(old) if !old.is_empty() => {
            let mut path = OsString::from(&folder);
            path.push(":");
            path.push(old);
            path
        }
        _ => OsString::from(&folder),
    };
    Ok(support::Mock {
        env: vec![("LD_LIBRARY_PATH", Some(library_path))],
        dump: "SCOPE_MOCK_NVRTC_DUMP",
        extension: "cu",
        language: "CUDA C++",
    })
}

/// scope-cubecl's `runtime_cuda` test binary of the same build.
pub fn runtime_cuda() -> Result<PathBuf, String> {
    support::runtime_tests("runtime_cuda", "SCOPE_CUBECL_RUNTIME_CUDA", "cuda")
}

/// In the cubek child: the server opens on the mock driver, not a real one.
pub fn assert_on_the_mock() {
    let mock = server_cuda::client().expect("the mock driver is first on LD_LIBRARY_PATH");
    let described = mock.describe();
    assert!(
        described.starts_with("Mock"),
        "the child must run on the mock driver, not {described}"
    );
}
