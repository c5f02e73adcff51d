//! cubecl-core's own runtime tests, on scope's raw Vulkan server.
//!
//! Built only with the `runtime-tests` feature. The device is the one
//! `SCOPE_VULKAN_DEVICE` chooses; CI runs this binary on lavapipe with the
//! validation layer on (`SCOPE_VULKAN_VALIDATION=1`). Kernels are cubecl's
//! SPIR-V, buffers reached by device address.

mod vulkan {
    pub type TestRuntime = scope_cubecl::ScopeRuntime<server_vulkan::Vulkan>;

    // The typed form: each element type's families in a module of their
    // own, as cubecl's runtimes instantiate them (the untyped form puts
    // minifloat's `mod e4m3` beside wgmma's glob import of the type).
    cubecl_core::testgen_all!(f32: [f32], i32: [i32], u32: [u32]);
    // Every scope server resolves an indirect count on the device.
    cubecl_core::testgen_launch_dynamic_count!();

    #[test]
    fn capture_is_seen_by_every_client_of_its_stream() {
        cubecl_core::runtime_tests::capture_status::a_capture_is_seen_by_every_client_of_its_stream::<
            TestRuntime,
        >();
    }

    #[test]
    fn prepared_capture_ends_at_stop_capture() {
        cubecl_core::runtime_tests::capture_status::a_prepared_capture_ends_at_stop_capture::<
            TestRuntime,
        >();
    }
}
