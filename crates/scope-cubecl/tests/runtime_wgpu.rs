//! cubecl-core's own runtime tests, on scope's wgpu server.
//!
//! Built only with the `runtime-tests` feature. The device is the one
//! `SCOPE_WGPU_BACKEND`/`SCOPE_WGPU_ADAPTER` choose; CI runs this binary on
//! lavapipe (Vulkan) and on llvmpipe (GL).

mod common;

use server_wgpu::Wgpu;

runtime_tests!(wgpu, Wgpu, not_run: crate::not_run);

/// The tests that do not hold on the device opened, and why.
fn not_run(test: &str) -> Option<&'static str> {
    match test {
        "test_signed_remainder" if on_gl() => Some(
            "on GL, WGSL becomes GLSL, whose % is undefined for negative operands: -7 % 3 reads \
             back 0 where WGSL says -1 (cubecl-wgpu fails it the same way on llvmpipe)",
        ),
        _ => None,
    }
}

/// Whether the server opened its device through GL.
fn on_gl() -> bool {
    common::scope_client::<Wgpu>()
        .with_backend(|gpu| format!("{:?}", gpu.adapter_info().backend) == "Gl")
}
