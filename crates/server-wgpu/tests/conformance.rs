//! The conformance suite, once per software adapter: Vulkan (lavapipe) and
//! GL through EGL (llvmpipe). Each prints `skipped: no wgpu device (...)`
//! when its adapter is absent, and fails under `SCOPE_REQUIRE=wgpu`.

mod common;

mod vulkan {
    type Suite = super::common::WgpuSuite<super::common::Vulkan>;
    scope_core::conformance_tests!(Suite);
}

mod gl {
    type Suite = super::common::WgpuSuite<super::common::Gl>;
    scope_core::conformance_tests!(Suite);
}

/// The property test (`scope_core::conformance::property`) once per
/// adapter: random sequences of allocations, writes, launches, copies,
/// reads and capture windows with injected failures, against the per-word
/// oracle. Sized for CI on the software adapters; `SCOPE_PROPERTY_STEPS`
/// and `SCOPE_PROPERTY_SEED` change it.
mod property {
    use super::common::{Gl, Vulkan, WgpuSuite};
    use scope_core::conformance::property::SEEDS;

    #[test]
    fn random_sequences_on_vulkan() {
        scope_core::conformance::random_sequences::<WgpuSuite<Vulkan>>(&SEEDS, 2_500);
    }

    #[test]
    fn random_sequences_on_gl() {
        scope_core::conformance::random_sequences::<WgpuSuite<Gl>>(&SEEDS, 2_500);
    }
}
