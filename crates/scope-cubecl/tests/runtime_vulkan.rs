//! cubecl-core's own runtime tests, on scope's raw Vulkan server.
//!
//! Built only with the `runtime-tests` feature. The device is the one
//! `SCOPE_VULKAN_DEVICE` chooses; CI runs this binary on lavapipe with the
//! validation layer on (`SCOPE_VULKAN_VALIDATION=1`). Kernels are cubecl's
//! WGSL through naga (`SCOPE_CUBECL_VULKAN=spirv` for cubecl's SPIR-V).

mod common;

runtime_tests!(vulkan, scope_cubecl::ScopeRuntime<server_vulkan::Vulkan>);
