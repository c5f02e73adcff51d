//! What every runtime-test binary instantiates, once: one binary per
//! server (each monomorphises every test for its runtime), the same tests
//! in each.

/// cubecl-core's runtime tests for `$runtime`, in a module `$module`.
#[macro_export]
macro_rules! runtime_tests {
    ($module:ident, $runtime:ty) => {
        mod $module {
            pub type TestRuntime = $runtime;

            // The typed form: each element type's families in a module of
            // their own, as cubecl's runtimes instantiate them (the untyped
            // form puts minifloat's `mod e4m3` beside wgmma's glob import of
            // the type).
            cubecl_core::testgen_all!(f32: [f32], i32: [i32], u32: [u32]);
            // Every scope server resolves an indirect count on the device.
            cubecl_core::testgen_launch_dynamic_count!();

            #[test]
            fn capture_is_seen_by_every_client_of_its_stream() {
                cubecl_core::runtime_tests::capture_status::a_capture_is_seen_by_every_client_of_its_stream::<TestRuntime>();
            }

            #[test]
            fn prepared_capture_ends_at_stop_capture() {
                cubecl_core::runtime_tests::capture_status::a_prepared_capture_ends_at_stop_capture::<TestRuntime>();
            }
        }
    };
}
