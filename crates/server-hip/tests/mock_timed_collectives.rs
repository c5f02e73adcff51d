//! The collective behaviours again, over the mock runtime's and the mock
//! RCCL's timed mode: every kernel takes 200 µs and every collective
//! 50 µs plus its bytes at 1 GB/s. A round is then still in flight when
//! its caller goes on, which the plain mock, running work as it is
//! issued, never shows. The timing is the process's, so this binary holds
//! only timed tests.

#[macro_use]
mod common;

use std::time::Duration;

use common::mock_client;

/// Turn the timed mode on, once for the process.
fn timed() {
    static ON: std::sync::Once = std::sync::Once::new();
    ON.call_once(|| {
        let kernel = Duration::from_micros(200);
        common::timed(
            &[(c"fill", kernel), (c"copy", kernel), (c"add", kernel)],
            Duration::from_micros(50),
            1e9,
        );
    });
}

hip_suite!(TimedRcclSuite, mock_client(), None, {
    over_mock_rccl!(timed());
});

mod over_timed_rccl {
    scope_test::conformance_tests!(@collectives super::TimedRcclSuite);
}
