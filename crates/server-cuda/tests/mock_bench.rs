//! The CUDA bench's own code, run once at smoke scale against the mock
//! driver: the raw-cudarc baseline (cudarc's allocator, module loader and
//! launch builder) and the scope path, the capture and the replays. Its
//! figures mean nothing here; what this buys is that a run on a GPU
//! measures, rather than finding a bug in the bench.
//!
//! `SCOPE_MOCK_BENCH_FULL=1` runs it at full scale instead: with a driver
//! that costs next to nothing, the difference between the two launch
//! figures (in a release build) is the server's own host-side cost per
//! launch — an estimate of overhead, never a CUDA measurement.

#[path = "mock/harness.rs"]
mod harness;

// The bench's `main` is not called from here.
#[allow(dead_code)]
#[path = "../benches/launch.rs"]
mod launch_bench;

use harness::{client, mock};

#[test]
fn the_bench_runs_on_the_mock_driver() {
    let c = client();
    let arch = c
        .with_backend(|b| b.nvrtc_arch().map(str::to_owned))
        .expect("the mock has NVRTC");
    let scale = if std::env::var_os("SCOPE_MOCK_BENCH_FULL").is_some() {
        launch_bench::Scale::FULL
    } else {
        launch_bench::Scale::SMOKE
    };
    launch_bench::run(&c, &arch, scale);
    mock().assert_clean();
}
