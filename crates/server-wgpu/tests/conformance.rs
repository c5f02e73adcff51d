//! The conformance suite, once per software adapter: Vulkan (lavapipe) and
//! GL through EGL (llvmpipe). Each prints `skipped: no wgpu device (...)`
//! when its adapter is absent, and fails under `SCOPE_REQUIRE=wgpu`. The
//! recovery behaviours lose the device by an injected fault; `recover.rs`
//! loses it for real.

mod common;

mod vulkan {
    type Suite = super::common::WgpuSuite<super::common::Vulkan>;
    scope_test::conformance_tests!(Suite);
}

mod gl {
    type Suite = super::common::WgpuSuite<super::common::Gl>;
    scope_test::conformance_tests!(Suite);
}
