//! What the Vulkan server reports of its optional features — `shaderFloat16`
//! with 16-bit storage, subgroup operations, `VK_EXT_shader_atomic_float`
//! — beside the kernels that use them, which run in the conformance suite
//! under the validation layer (`features_tests!`, in `conformance.rs`): the
//! layer checks every capability the SPIR-V declares against what the
//! device was opened with.

mod common;

/// The subgroup size range comes with subgroups, at the device's native
/// width, and lavapipe, which offers all three features (Mesa 22.3 and
/// later), gets all three: a regression guard, so that the suite's feature
/// kernels do not take their refusal branch there.
#[test]
fn reported_features_come_with_their_limits() {
    let Some(c) = common::validating_or_skip() else {
        return;
    };
    let launch = &c.limits().launch;
    let features = launch.features;
    println!(
        "{}: {features:?}, subgroup size {:?}",
        c.describe(),
        launch.subgroup_size
    );
    assert_eq!(launch.subgroup_size.is_some(), features.subgroups);
    if features.subgroups {
        assert_eq!(launch.subgroup_size, launch.native_width);
    }
    if c.describe().starts_with("llvmpipe") {
        assert!(
            features.f16 && features.subgroups && features.f32_atomic_add,
            "lavapipe offers f16, subgroups and f32 atomics: {features:?}"
        );
    }
}
