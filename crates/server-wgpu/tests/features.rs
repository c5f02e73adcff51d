//! What the wgpu server reports of its optional features — `f16`,
//! subgroups, `f32` atomics — is what its device was opened with; the
//! kernels that use them run in the conformance suite on each adapter
//! (`features_tests!`, in `conformance.rs`), and llvmpipe's GL, which offers
//! none of them, refuses each kernel as a compile error.

mod common;

use scope_core::Client;
use scope_test::client_or_skip;
use server_wgpu::{Api, OPTIONAL, Wgpu};

fn setup(api: Api) -> Option<Client<Wgpu>> {
    client_or_skip(|| common::client_on(api))
}

/// What the server reports is what the device was opened with, and the
/// subgroup size range comes with subgroups.
fn reported_features_are_the_devices(api: Api) {
    let Some(c) = setup(api) else { return };
    let device = c.with_backend(|b| b.raw().0.features());
    let launch = &c.limits().launch;
    let features = launch.features;
    assert_eq!(device & OPTIONAL, device, "only the optional features");
    assert_eq!(features.f16, device.contains(wgpu::Features::SHADER_F16));
    assert_eq!(
        features.subgroups,
        device.contains(wgpu::Features::SUBGROUP)
    );
    assert_eq!(
        features.f32_atomic_add,
        device.contains(wgpu::Features::SHADER_FLOAT32_ATOMIC)
    );
    assert_eq!(launch.subgroup_size.is_some(), features.subgroups);
    println!(
        "{}: {features:?}, subgroup size {:?}",
        c.describe(),
        launch.subgroup_size
    );
    // lavapipe offers all three (Mesa 22.3 and later): a regression guard,
    // so that the suite's feature kernels do not take their refusal branch
    // there.
    let info = c.with_backend(|b| b.adapter_info().clone());
    if info.backend == wgpu::Backend::Vulkan && info.name.starts_with("llvmpipe") {
        assert!(
            features.f16 && features.subgroups && features.f32_atomic_add,
            "lavapipe offers f16, subgroups and f32 atomics: {features:?}"
        );
    }
}

#[test]
fn reported_features_are_the_devices_on_vulkan() {
    reported_features_are_the_devices(Api::Vulkan);
}

#[test]
fn reported_features_are_the_devices_on_gl() {
    reported_features_are_the_devices(Api::Gl);
}
