//! What every runtime-test binary instantiates, once: one binary per
//! server (each monomorphises every test for its runtime), the same tests
//! in each.
//!
//! A test known not to hold on a backend is marked in its binary, with its
//! reason, by a `not_run` function the binary passes to
//! [`runtime_tests!`]: the test prints `not run: <reason>` and returns.
//! Only `binary_untyped` is instantiated test by test for this (the two
//! such tests are there); the other families come from cubecl's macros
//! whole.

#![allow(dead_code)]

use scope_cubecl::{CubeBackend, ScopeDevice, ScopeRuntime};

/// The running test does not run, for `why`: say so.
pub fn not_run(why: &str) {
    println!("not run: {why}");
}

/// The scope client of `B`'s default device, for a `not_run` condition
/// that asks the server which device it opened.
pub fn scope_client<B: CubeBackend>() -> scope_core::Client<B> {
    ScopeRuntime::<B>::scope_client(&ScopeDevice::default())
}

/// cubecl-core's runtime tests for `$runtime` (a `CubeBackend`), in a
/// module `$module`: what `cubecl_core::testgen_all!(f32: [f32], i32:
/// [i32], u32: [u32])` instantiates, test for test and under the same
/// names, except that `binary_untyped`'s tests are this macro's own, so
/// that `$not_run` (`fn(&str) -> Option<&'static str>`, given a test's
/// name) can mark one as not holding here, with the reason.
#[macro_export]
macro_rules! runtime_tests {
    ($module:ident, $backend:ty, not_run: $not_run:path) => {
        mod $module {
            pub type TestRuntime = ::scope_cubecl::ScopeRuntime<$backend>;

            use ::cubecl_core::__private::Runtime;

            // testgen_all!'s typed form: each element type's families in a
            // module of their own (the untyped form puts minifloat's
            // `mod e4m3` beside wgmma's glob import of the type).
            mod f32_ty {
                use super::*;

                #[allow(dead_code)]
                type FloatType = f32;
                #[allow(dead_code)]
                type IntType = i32;
                #[allow(dead_code)]
                type UintType = u32;

                ::cubecl_core::testgen_float!();
            }
            mod i32_ty {
                use super::*;

                #[allow(dead_code)]
                type FloatType = f32;
                #[allow(dead_code)]
                type IntType = i32;
                #[allow(dead_code)]
                type UintType = u32;

                ::cubecl_core::testgen_int!();
            }
            mod u32_ty {
                use super::*;

                #[allow(dead_code)]
                type FloatType = f32;
                #[allow(dead_code)]
                type IntType = i32;
                #[allow(dead_code)]
                type UintType = u32;

                ::cubecl_core::testgen_uint!();
            }

            // testgen_untyped!, family by family (cubecl-core
            // 0.12.0-pre.1, runtime_tests/mod.rs), binary_untyped below.
            ::cubecl_core::testgen_launch_untyped!();
            ::cubecl_core::testgen_cmma!();
            ::cubecl_core::testgen_cmma2!();
            ::cubecl_core::testgen_wgmma!();
            ::cubecl_core::testgen_numeric!();
            ::cubecl_core::testgen_bf16!();
            ::cubecl_core::testgen_file!();
            ::cubecl_core::testgen_read_lazy!();
            ::cubecl_core::testgen_metadata!();
            ::cubecl_core::testgen_topology!();
            ::cubecl_core::testgen_properties!();

            ::cubecl_core::testgen_sync_plane!();
            ::cubecl_core::testgen_tensor_indexing!();
            ::cubecl_core::testgen_debug!();
            ::cubecl_core::testgen_cluster!();

            ::cubecl_core::testgen_enums!();
            ::cubecl_core::testgen_harness!();
            ::cubecl_core::testgen_comparison!();

            ::cubecl_core::testgen_to_client!();
            ::cubecl_core::testgen_all_reduce!();
            ::cubecl_core::testgen_collectives!();

            ::cubecl_core::testgen_control_flow!();
            ::cubecl_core::testgen_stream_errors!();
            ::cubecl_core::testgen_allocation_mode!();
            ::cubecl_core::testgen_out_of_memory!();
            ::cubecl_core::testgen_compile!();

            // testgen_binary_untyped!'s seven tests, each first asking
            // `$not_run` whether it holds here.
            mod binary_untyped {
                use super::*;

                macro_rules! binary_test {
                    ($test:ident) => {
                        #[::cubecl_core::runtime_tests::test_log::test]
                        fn $test() {
                            let client = TestRuntime::client(&Default::default());
                            if let Some(why) = $not_run(stringify!($test)) {
                                $crate::common::not_run(why);
                                return;
                            }
                            ::cubecl_core::runtime_tests::binary::$test::<TestRuntime>(client);
                        }
                    };
                }

                binary_test!(test_mulhi);
                binary_test!(test_dp4a);
                binary_test!(test_powi_int);
                binary_test!(test_powi_negative_near_one);
                binary_test!(test_signed_remainder);
                binary_test!(test_self_div);
                binary_test!(test_ieee_constant_folds);
            }

            // Every scope server resolves an indirect count on the device.
            ::cubecl_core::testgen_launch_dynamic_count!();

            #[test]
            fn capture_is_seen_by_every_client_of_its_stream() {
                ::cubecl_core::runtime_tests::capture_status::a_capture_is_seen_by_every_client_of_its_stream::<TestRuntime>();
            }

            #[test]
            fn prepared_capture_ends_at_stop_capture() {
                ::cubecl_core::runtime_tests::capture_status::a_prepared_capture_ends_at_stop_capture::<TestRuntime>();
            }
        }
    };
}
