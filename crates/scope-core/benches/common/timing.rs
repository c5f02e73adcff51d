//! What the collective benches share: the smoke switch and the median.

use std::time::Duration;

/// `SCOPE_BENCH_SMOKE=1`: a round of the smallest size, to prove a bench runs.
pub fn smoke() -> bool {
    std::env::var("SCOPE_BENCH_SMOKE").is_ok_and(|v| v == "1")
}

/// The middle sample: one slow round, the machine's, moves it least.
pub fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}
