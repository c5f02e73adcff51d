//! cubecl-core's own runtime tests, on scope's wgpu server.
//!
//! Built only with the `runtime-tests` feature. The device is the one
//! `SCOPE_WGPU_BACKEND`/`SCOPE_WGPU_ADAPTER` choose; CI runs this binary on
//! lavapipe (Vulkan) and on llvmpipe (GL).

mod common;

runtime_tests!(wgpu, scope_cubecl::ScopeRuntime<server_wgpu::Wgpu>);
