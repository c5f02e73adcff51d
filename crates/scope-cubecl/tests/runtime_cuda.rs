//! cubecl-core's own runtime tests, on scope's CUDA server.
//!
//! Built only with the `cuda` and `runtime-tests` features. The device is
//! CUDA device 0. Without one, the binary prints `skipped: no cuda device
//! (…)` as its first test starts and ends successfully (it fails instead
//! when `SCOPE_REQUIRE` names cuda); `cargo xtask test` reports the row
//! skipped for no device without running it, and `cargo xtask bundle
//! --backend cuda` carries this binary to a machine that has one, where
//! every test must pass.

mod common;

runtime_tests!(cuda, server_cuda::Cuda, not_run: crate::not_run);

/// None: every test passed on an NVIDIA H200.
fn not_run(_test: &str) -> Option<&'static str> {
    None
}
