//! The collective behaviours again, over the timed mock: every kernel
//! takes 200 µs and every collective 50 µs plus its bytes at 1 GB/s. A
//! round is then still in flight when its caller goes on, which the plain
//! mock, running work as it is issued, never shows. The mock's timing is
//! the process's, so this binary holds only timed tests.

#[macro_use]
mod common;
#[path = "mock/harness.rs"]
mod harness;

use std::time::Duration;

use harness::mock;

/// Turn the timed mode on, once for the process.
fn timed() {
    static ON: std::sync::Once = std::sync::Once::new();
    ON.call_once(|| {
        let m = mock();
        m.timing(true);
        for kind in ["fill", "copy", "add", "accumulate"] {
            m.kernel_time(kind, Duration::from_micros(200));
        }
        m.nccl_model(Duration::from_micros(50), 1e9);
    });
}

cuda_suite!(
    TimedNcclSuite,
    {
        timed();
        let client = harness::mock_client();
        mock().assert_clean();
        client
    },
    None,
    mock().assert_clean(),
    {
        over_mock_nccl!(timed());
    }
);

mod over_timed_nccl {
    scope_test::conformance_tests!(@collectives super::TimedNcclSuite);
}
