//! The collective behaviours again, over the mock runtime's and the mock
//! RCCL's timed mode: every kernel takes 200 µs and every collective
//! 50 µs plus its bytes at 1 GB/s. A round is then still in flight when
//! its caller goes on, which the plain mock, running work as it is
//! issued, never shows. The timing is the process's, so this binary holds
//! only timed tests.

#[macro_use]
mod common;

use common::{mock_client, mock_library, mock_rccl};

/// Turn the timed mode on, once for the process.
fn timed() {
    static ON: std::sync::Once = std::sync::Once::new();
    ON.call_once(|| {
        let rccl = mock_rccl();
        // SAFETY: the mock runtime, loaded by `mock_rccl` already; opening
        // it again only takes a reference, leaked so it is never unloaded.
        let hip = Box::leak(Box::new(
            unsafe { libloading::Library::new(mock_library()) }.expect("the mock runtime"),
        ));
        // SAFETY: the hooks are declared in the mocks with these
        // signatures, and set values under their locks.
        unsafe {
            let timing = hip
                .get::<unsafe extern "C" fn(i32)>(b"scope_mock_timing\0")
                .expect("the mock's hook");
            let kernel_time = hip
                .get::<unsafe extern "C" fn(*const std::ffi::c_char, u64)>(
                    b"scope_mock_kernel_time\0",
                )
                .expect("the mock's hook");
            let model = rccl
                .get::<unsafe extern "C" fn(u64, f64)>(b"scope_mock_nccl_model\0")
                .expect("the mock's hook");
            timing(1);
            for kind in [c"fill", c"copy", c"add"] {
                kernel_time(kind.as_ptr(), 200_000);
            }
            model(50_000, 1e9);
        }
    });
}

hip_suite!(TimedRcclSuite, mock_client(), None, {
    over_mock_rccl!(timed());
});

mod over_timed_rccl {
    scope_test::conformance_tests!(@collectives super::TimedRcclSuite);
}
