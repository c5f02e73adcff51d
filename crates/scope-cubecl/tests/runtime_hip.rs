//! cubecl-core's own runtime tests, on scope's HIP server.
//!
//! Built only with the `hip` and `runtime-tests` features. The device is
//! HIP device 0. Without one, the binary prints `skipped: no hip device
//! (…)` as its first test starts and ends successfully (it fails instead
//! when `SCOPE_REQUIRE` names hip); `cargo xtask test` reports the row
//! skipped for no device without running it. The HIP toolchain row runs it
//! over server-hip's mock runtime, which executes no cubecl kernel, only to
//! collect the HIP C++ cubecl-cpp writes and compile it with the real
//! hiprtc (`crates/server-hip/tests/toolchain/harvest.rs`).

mod common;

runtime_tests!(hip, server_hip::Hip, not_run: crate::not_run);

/// None known: this binary has not yet run on a GPU.
fn not_run(_test: &str) -> Option<&'static str> {
    None
}
