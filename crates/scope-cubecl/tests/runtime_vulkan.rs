//! cubecl-core's own runtime tests, on scope's raw Vulkan server.
//!
//! Built only with the `runtime-tests` feature. The device is the one
//! `SCOPE_VULKAN_DEVICE` chooses; CI runs this binary on lavapipe with the
//! validation layer on (`SCOPE_VULKAN_VALIDATION=1`). Kernels are cubecl's
//! WGSL through naga (`SCOPE_CUBECL_VULKAN=spirv` for cubecl's SPIR-V).

mod common;

use scope_cubecl::CubeBackend;
use server_vulkan::Vulkan;

runtime_tests!(vulkan, Vulkan, not_run: crate::not_run);

/// The tests that do not hold on this server, and why.
fn not_run(test: &str) -> Option<&'static str> {
    match test {
        "test_ieee_constant_folds" if Vulkan::target() == scope_cube::Target::Wgsl => Some(
            "the kernels are WGSL through naga, with WGSL's licence to fold NaN, infinity and \
             the sign of zero (naga folds NaN - NaN); cubecl relaxes this test only for a \
             runtime whose name starts with wgpu",
        ),
        _ => None,
    }
}
