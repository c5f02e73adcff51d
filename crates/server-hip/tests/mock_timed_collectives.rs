//! The collective behaviours again, over the mock runtime's and the mock
//! RCCL's timed mode: every kernel takes 200 µs and every collective
//! 50 µs plus its bytes at 1 GB/s. A round is then still in flight when
//! its caller goes on, which the plain mock, running work as it is
//! issued, never shows. The timing is the process's, so this binary holds
//! only timed tests.

#[macro_use]
mod common;

use std::time::Duration;

use common::{mock_client, mock_library, mock_rccl, rccl_violations};
use scope_core::{Client, Result};
use server_hip::Hip;

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
    fn capabilities() -> &'static [scope_test::Capability] {
        &[
            scope_test::Capability::DeviceCollectives,
            scope_test::Capability::Reopen,
        ]
    }

    fn rank_client(rank: usize) -> Result<Client<Hip>> {
        timed();
        let path = vec![mock_library()];
        server_hip::client_from(&path, &path, rank)
    }

    fn group(
        clients: Vec<Client<Hip>>,
        deadline: Duration,
    ) -> Result<scope_core::collective::Group<Hip>> {
        timed();
        scope_core::collective::Group::over_device(clients, deadline)
    }

    fn finished() {
        let (count, last) = rccl_violations();
        assert_eq!(
            count, 0,
            "a call real RCCL refuses or mis-handles; the last: {last}"
        );
    }
});

mod over_timed_rccl {
    scope_test::conformance_tests!(@collectives super::TimedRcclSuite);
}
