//! The soak: many threads, many launches, failures and captures, and the server's footprint sampled
//! as it goes.
//!
//! A server that is correct for a thousand operations can still grow without bound over a million.
//! A batch list only a sync trims, a failure record nobody releases, and a pool that never reuses
//! all do. So `soak` runs `threads` threads, each with two streams of its own. Each loops over a
//! chain of four buffers: `fill a`; `copy a → b`; `add a, b → c`. Now and then a capture of `fill
//! d` is replayed and dropped. One launch in a hundred is replaced by the suite's kernel that does
//! not compile. That is a real failure, with its skips downstream. Each thread keeps an oracle of
//! its buffers and checks its reads against it. Meanwhile the calling thread samples the process's
//! resident memory and the backend's `bytes_reserved`. It samples the store's `failures_held` and
//! `failure_claims` too.
//!
//! What must hold, and is asserted:
//!
//! - every read agrees with the oracle;
//! - the store holds at most three failures per thread at every sample;
//! - its books balance at the end (rule 7, [`Client::audit`]);
//! - nothing grows in the second half of the run past what the first half reached.
//!
//! Resident memory gets [`RSS_SLACK`] of allowance for allocator noise. It is checked from
//! [`RSS_CHECKED_FROM`] launches, where the run dwarfs its neighbours. `cargo test` runs it small.
//! `SCOPE_SOAK_LAUNCHES` sets the total, and `cargo xtask soak` runs a million and prints the
//! samples.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{Suite, WORDS, add, alloc, as_words, copy, fill, setup};
use scope_core::Client;
use scope_core::Error;
use scope_core::backend::Backend;
use scope_core::{Binding, Dispatch};

/// Resident memory the second half of a run may add over the first's peak. Allocator and driver
/// noise, not growth with the launch count.
pub const RSS_SLACK: u64 = 32 << 20;

/// The smallest run whose resident memory is checked.
pub const RSS_CHECKED_FROM: u64 = 100_000;

/// The launches `cargo test` runs when `SCOPE_SOAK_LAUNCHES` is unset.
pub const LAUNCHES: u64 = 6_000;

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct SoakConfig {
    /// Threads, each with two streams.
    pub threads: usize,
    /// Launches in all, across threads.
    pub launches: u64,
    /// One launch in this many is the kernel that does not compile.
    pub fail_one_in: u64,
    /// Each thread captures, replays and drops a graph once every this many rounds.
    pub capture_every: u64,
}

impl Default for SoakConfig {
    fn default() -> Self {
        Self {
            threads: 4,
            launches: std::env::var("SCOPE_SOAK_LAUNCHES")
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(LAUNCHES),
            fail_one_in: 100,
            capture_every: 64,
        }
    }
}

/// One sample of the server's footprint.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// Launches issued so far.
    pub launches: u64,
    /// Seconds since the start.
    pub secs: f64,
    /// The process's resident memory, where the platform says.
    pub rss: Option<u64>,
    /// [`Client::bytes_reserved`].
    pub bytes_reserved: u64,
    /// [`Client::failures_held`].
    pub failures_held: usize,
    /// [`Client::failure_claims`].
    pub failure_claims: usize,
}

impl std::fmt::Display for Sample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>9} launches {:>7.1} s  rss {:>9}  reserved {:>10} B  failures held {:>3}  claims {:>3}",
            self.launches,
            self.secs,
            self.rss
                .map_or_else(|| "?".to_owned(), |r| format!("{} KiB", r >> 10)),
            self.bytes_reserved,
            self.failures_held,
            self.failure_claims
        )
    }
}

/// The process's resident set, from `/proc/self/statm`.
fn rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn sample<B: Backend>(c: &Client<B>, launches: u64, start: Instant) -> Sample {
    Sample {
        launches,
        secs: start.elapsed().as_secs_f64(),
        rss: rss(),
        bytes_reserved: c.bytes_reserved(),
        failures_held: c.failures_held(),
        failure_claims: c.failure_claims(),
    }
}

/// What each word of a thread's buffer holds, or that a read must fail.
type Expect = Option<u32>;

fn check_read<B: Backend>(c: &Client<B>, buffer: &scope_core::Buffer, expect: Expect, what: &str) {
    match (c.read(buffer), expect) {
        (Ok(bytes), Some(value)) => {
            assert!(
                as_words(&bytes).iter().all(|&w| w == value),
                "{what}: expected {value}"
            );
        }
        (Err(error), None) => assert!(!error.unwritten().is_empty(), "{what}: {error}"),
        (got, expect) => panic!("{what}: expected {expect:?}, read {:?}", got.map(|_| ())),
    }
}

/// One thread's loop: `rounds` rounds of three launches on two streams.
fn worker<S: Suite>(
    c: &Client<S::Backend>,
    rounds: u64,
    seed: u64,
    config: &SoakConfig,
    issued: &AtomicU64,
) {
    let streams = [c.new_stream().unwrap(), c.new_stream().unwrap()];
    let (a, b, out, d) = (
        alloc(&streams[0], WORDS),
        alloc(&streams[0], WORDS),
        alloc(&streams[0], WORDS),
        alloc(&streams[0], WORDS),
    );
    let broken = S::broken();
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut expect_out: Expect = None;
    for round in 0..rounds {
        let s = &streams[(round % 2) as usize];
        let value = (round as u32).wrapping_mul(2_654_435_761);
        let fails = next() % config.fail_one_in == 0;
        let filled = if fails {
            let blob = S::scalar_blob(&broken, &[Binding::write(&a)], &[WORDS, value]);
            s.launch(
                &broken,
                &[Binding::write(&a)],
                &blob,
                Dispatch::linear(WORDS.div_ceil(64)),
            )
        } else {
            fill::<S>(s, &a, value)
        };
        assert_eq!(filled.is_err(), fails, "round {round}: {filled:?}");
        let copied = copy::<S>(s, &a, &b);
        let added = add::<S>(s, &a, &b, &out);
        if fails {
            assert!(matches!(copied, Err(Error::Skipped { .. })), "{copied:?}");
            assert!(matches!(added, Err(Error::Skipped { .. })), "{added:?}");
            expect_out = None;
        } else {
            copied.unwrap();
            added.unwrap();
            expect_out = Some(value.wrapping_mul(2));
        }
        issued.fetch_add(3, Ordering::Relaxed);
        if round % 16 == 15 {
            check_read(s, &out, expect_out, &format!("round {round}"));
        }
        if round % config.capture_every == config.capture_every - 1 {
            let recorder = &streams[0];
            let capture = recorder.begin_capture().unwrap();
            fill::<S>(recorder, &d, value ^ 1).unwrap();
            let graph = recorder.end_capture(capture).unwrap();
            recorder.replay(&graph).unwrap();
            issued.fetch_add(1, Ordering::Relaxed);
            check_read(
                recorder,
                &d,
                Some(value ^ 1),
                &format!("replay in round {round}"),
            );
            if next() % 2 == 0 {
                recorder.destroy_graph(&graph).unwrap();
            }
        }
    }
    check_read(&streams[0], &out, expect_out, "the end");
}

/// Run the soak on a fresh server of `S`, returning the samples; `None` with no device here.
///
/// # Panics
///
/// When a read disagrees with a thread's oracle, or the server's footprint grows over the run. See
/// the module docs.
pub fn soak<S: Suite>(config: &SoakConfig) -> Option<Vec<Sample>> {
    let c = setup::<S>()?;
    let start = Instant::now();
    let issued = AtomicU64::new(0);
    let done = AtomicBool::new(false);
    let rounds = config.launches / 3 / config.threads.max(1) as u64;
    let mut samples = vec![sample(&c, 0, start)];
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..config.threads)
            .map(|t| {
                let c = c.clone();
                let issued = &issued;
                scope.spawn(move || worker::<S>(&c, rounds, 0x9e37 + t as u64, config, issued))
            })
            .collect();
        let sampler = scope.spawn(|| {
            let mut taken = Vec::new();
            let mut last = 0;
            while !done.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(20));
                let now = issued.load(Ordering::Relaxed);
                if now >= last + config.launches / 20 {
                    last = now;
                    // The counters are read one call at a time while the workers run, so held and
                    // claims need not be one moment's. Rule 7 is audited at the end instead.
                    let s = sample(&c, now, start);
                    assert!(
                        s.failures_held <= 3 * config.threads,
                        "failures pile up at {now} launches: {s}"
                    );
                    taken.push(s);
                }
            }
            taken
        });
        let mut panicked = None;
        for w in workers {
            if let Err(panic) = w.join() {
                panicked.get_or_insert(panic);
            }
        }
        done.store(true, Ordering::Release);
        samples.extend(sampler.join().expect("the sampler"));
        if let Some(panic) = panicked {
            std::panic::resume_unwind(panic);
        }
    });
    c.sync().unwrap();
    samples.push(sample(&c, issued.load(Ordering::Relaxed), start));
    let half = samples.len() / 2;
    let (first, second) = samples.split_at(half.max(1));
    let peak = |s: &[Sample], f: &dyn Fn(&Sample) -> u64| s.iter().map(f).max().unwrap_or(0);
    let reserved = |s: &Sample| s.bytes_reserved;
    assert!(
        peak(second, &reserved) <= peak(first, &reserved).max(1 << 20) * 2,
        "bytes reserved grows: {} then {}",
        peak(first, &reserved),
        peak(second, &reserved)
    );
    // Resident memory is the process's. Only a run large enough to dwarf what other tests allocate
    // meanwhile says anything about this server (`cargo xtask soak` runs it alone).
    if config.launches >= RSS_CHECKED_FROM && samples.len() >= 8 {
        let resident = |s: &Sample| s.rss.unwrap_or(0);
        assert!(
            peak(second, &resident) <= peak(first, &resident) + RSS_SLACK,
            "resident memory grows: {} KiB then {} KiB",
            peak(first, &resident) >> 10,
            peak(second, &resident) >> 10
        );
    }
    c.audit().unwrap();
    Some(samples)
}

/// The soak at CI's scale (`SCOPE_SOAK_LAUNCHES` changes it), as a `#[test]` of `$suite`.
#[macro_export]
macro_rules! soak_tests {
    ($suite:ty) => {
        /// Many threads, failures and captures, and nothing grows.
        #[test]
        fn soak() {
            let config = $crate::soak::SoakConfig::default();
            if let Some(samples) = $crate::soak::soak::<$suite>(&config) {
                for sample in samples {
                    println!("soak: {sample}");
                }
            }
            <$suite as $crate::Suite>::finished();
        }
    };
}
