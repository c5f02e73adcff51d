//! Random operation sequences against a per-word oracle, for any server.
//!
//! The conformance suite tests each rule with a sequence someone thought of. This tests the
//! sequences nobody did. Random operations run against a server: allocations (some fail), frees,
//! host writes, and launches of the suite's three kernels over random ranges. Device copies, reads,
//! syncs, capture windows, replays and graph destruction run too. Failures are injected at every
//! site that takes one. Now and then the device is lost and recovered. Beside the server, an oracle
//! keeps every word of every live buffer. It knows whether the word is *stale*, and its value where
//! known. A failed or skipped writer leaves a word stale. So does a window that could not seal or
//! was aborted, and a failed replay or destroy. After every operation:
//!
//! - a `check` of a random range and of every live buffer fails exactly when a word is stale;
//! - the store holds no more failures than live claims (rule 7);
//! - every failure's carrier count matches the buffers that claim it ([`Client::audit`]);
//! - every host read returns the oracle's values wherever it knows them.
//!
//! At the end, freeing everything empties the store and the allocator.
//!
//! # Why this shape
//!
//! The launches are the suite's own `fill`, `copy` and `add` over random buffers and ranges. They
//! are one write; one read and one write; two reads and one write. So every server runs the same
//! sequences in its own kernel language. And the oracle can compute what a clean launch writes.
//! Ranges are whole words, the contract's copy granularity. Launch bindings start at multiples of
//! the backend's binding alignment. So nothing the test issues is invalid by accident. The few
//! invalid requests it makes are checked to be refused as `InvalidArgument`. They are an
//! overlapping copy within one buffer, and a replay of a graph whose buffer was freed. Staleness is
//! per word because every range is word-aligned. A per-byte oracle would say the same thing four
//! times.
//!
//! Faults planted at a host read are not device faults. A device fault there claims whatever is in
//! flight on the reading stream (rule 23), which the oracle does not follow. They still check that
//! a read fails only after its range checks clean and it is not refused.
//!
//! A launch never binds one buffer for writing and for reading. wgpu forbids that within one
//! dispatch, so the outcome would depend on the server. An exact oracle is the point.
//!
//! Capture follows `docs/ERROR_MODEL.md`. Work inside a window does not run until replay. The
//! oracle keeps the window's operations and applies them, on current inputs, at each clean replay.
//! Host writes inside a window replay the bytes given at call time. Reads, syncs and replays on the
//! recording stream are refused.
//!
//! Windows open on stream 0. About a third of the work goes to a second stream, windows or not. So
//! buffers change hands between streams and the server orders them (`Backend::order`). The values
//! read back say whether it did. During a window the oracle predicts every cross-capture refusal
//! and asserts it both ways. See `docs/ERROR_MODEL.md`, "Cross-stream ordering is automatic". A use
//! on stream 1 is refused exactly when one of its buffers was last used by stream 0 and the open
//! window used it. The refusal is `Error::Refused` and changes nothing: no claim, no failure seen
//! on either stream. A buffer stream 0 used only before the capture began is stream 1's to use.
//!
//! For that the oracle keeps, per buffer, the stream that used it last. The allocation sets it, and
//! so does every operation that reaches `Server::order`. An operation refused, failed by an
//! injected fault or skipped on a claimed input does not. A host read does once its range checks
//! clean. Per window, the oracle keeps the buffers its recorded work used. Stream 1's work runs at
//! once, on the buffers' current values, while stream 0's waits for a replay. The window's buffers
//! are stream 0's alone until it ends, so the two never meet. Only stream 0 opens windows. Two
//! recording streams are left to the conformance suite: there even a buffer's pre-capture use on
//! the other is refused.
//!
//! # Invalid calls
//!
//! About one step in twenty is a call no correct runtime makes (`abuse.rs`). Ranges go past the
//! end, sit at `u64::MAX`, or are empty or reversed. Buffers are freed or foreign. Allocations ask
//! for nothing or for everything. Bindings are misaligned, grids go past the device, and an
//! indirect count is `u32::MAX`. A capture is dropped without its end. Each must fail with its
//! typed error, or end in its defined outcome, and change nothing the oracle sees. Windows are
//! sometimes dropped rather than aborted, and graphs dropped rather than destroyed. A failure hook
//! that calls back into the client is installed throughout. Together, these make the contract
//! fuzzer.
//!
//! # Device losses
//!
//! About one step in 300 (`loss.rs`) loses the device through an injected sticky fault. It then
//! recovers it ([`Client::recover`], rules 51–53). Every word the device held is stale from then
//! until rewritten. So the steps after it check the loss's skips, inheritance and healing as for
//! any failure. Every graph recorded before refuses to replay and destroys cleanly, and an open
//! window is aborted. The counts `Recovered` reports are checked, with each stream's failures seen,
//! the hook and the limits. Some recoveries fail first: a fault reopening, or a loss while remaking
//! buffers. They leave the client poisoned until the next: calls fail fast, releases still release.
//! Where the suite's backend cannot reopen ([`Capability::Reopen`]), every recovery must be refused
//! with `Error::RestartRequired`. The run then releases everything, checks the store is empty, and
//! goes on with a fresh server.
//!
//! # Reproducing a failure
//!
//! A failing step panics after printing the seed, the step and the tail of the operation log.
//! `SCOPE_PROPERTY_SEED=<seed>` reruns that seed alone. `SCOPE_PROPERTY_STEPS=<n>` sets the steps
//! per seed, for every server's test in the process.

mod abuse;
mod checks;
mod loss;
mod oracle;
mod steps;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::kit::{self, Capability};
use super::{Suite, client_or_skip};
use scope_core::Client;
use scope_core::Error;
use scope_core::backend::Backend;
use scope_core::kernel::Kernel;
use scope_core::{Binding, Buffer, Capture, Dispatch, Graph};
use scope_core::{BufferId, StreamId};
use scope_core::{FaultPlan, Site};

/// The seeds every server's test runs: five, so that a sequence one seed never reaches another may.
pub const SEEDS: [u64; 5] = [1, 7, 42, 1_000_003, 0x5eed_cafe];

/// Operations per seed in the test [`conformance_tests!`](crate::conformance_tests) makes. 12,500
/// over [`SEEDS`], about two seconds on each server here.
pub const STEPS: usize = 2_500;

/// Run `steps` random operations for each of `seeds` against `S`'s server. Each seed gets a fresh
/// server, and the oracle is checked after every operation.
///
/// `SCOPE_PROPERTY_SEED` replaces `seeds` with that one seed, and `SCOPE_PROPERTY_STEPS` replaces
/// `steps`. With no device here it prints `skipped: no <backend> device` and returns (see
/// [`client_or_skip`]). Prints the operations run when it passes.
///
/// # Panics
///
/// When the server disagrees with the oracle, after printing the seed, the step and the last
/// operations.
pub fn random_sequences<S: Suite>(seeds: &[u64], steps: usize) {
    let steps = env_number("SCOPE_PROPERTY_STEPS").map_or(steps, |s| s as usize);
    let only = env_seed();
    let seeds: Vec<u64> = only.map_or_else(|| seeds.to_vec(), |seed| vec![seed]);
    let mut tally = Tally::default();
    for (i, &seed) in seeds.iter().enumerate() {
        assert!(!seeds[..i].contains(&seed), "seed {seed} given twice");
        let Some(client) = client_or_skip(S::client) else {
            return;
        };
        let t = run::<S>(client, seed, steps);
        tally.during_windows += t.during_windows;
        tally.refused += t.refused;
        tally.abused += t.abused;
        tally.lost += t.lost;
        tally.reopened += t.reopened;
        tally.failed_attempts += t.failed_attempts;
        tally.restarts += t.restarts;
    }
    // "invalid" stays last: `cargo xtask fuzz` reads the counts by place.
    println!(
        "{}: {} operations over {} seeds; {} on stream 1 during a window, {} of them refused; \
         {} devices lost and {} opened again ({} after a failed attempt, {} refused: restart \
         required); {} invalid",
        <S::Backend as Backend>::NAME,
        steps * seeds.len(),
        seeds.len(),
        tally.during_windows,
        tally.refused,
        tally.lost,
        tally.reopened,
        tally.failed_attempts,
        tally.restarts,
        tally.abused,
    );
}

/// The one seed `SCOPE_PROPERTY_SEED` names, for every random test here.
pub(super) fn env_seed() -> Option<u64> {
    env_number("SCOPE_PROPERTY_SEED")
}

pub(super) fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    let parsed = value.trim().parse().ok();
    assert!(parsed.is_some(), "{name}={value:?} is not a number");
    parsed
}

/// The random tests' generator: the property test's, and the collectives' rounds (`rounds.rs`).
pub(super) struct Rng(u64);

impl Rng {
    /// Seeded through splitmix64, so that every seed (even ones, zero) starts its own sequence.
    pub(super) fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self((z ^ (z >> 31)) | 1)
    }

    pub(super) fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub(super) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What the oracle knows of one word.
#[derive(Clone, Copy, Debug)]
struct Word {
    /// A read of it must fail.
    stale: bool,
    /// What a read returns, when known.
    value: Option<u32>,
}

const UNKNOWN: Word = Word {
    stale: false,
    value: None,
};

const STALE: Word = Word {
    stale: true,
    value: None,
};

struct Buf {
    handle: Buffer,
    words: Vec<Word>,
    allocated: bool,
    /// The stream whose work used it last (`Server::order`), as an index: 0 or 1. Allocation counts
    /// as a use.
    last_user: usize,
}

/// Bytes `start..end` of a buffer, by id: a recording or a graph outlives positions in `bufs`.
type Range = (BufferId, u64, u64);

fn len(r: &Range) -> u64 {
    r.2 - r.1
}

/// An operation the oracle can apply to its values. A window records it, and a graph replays it.
#[derive(Clone, Debug)]
enum Op {
    Write(Range, Arc<[u32]>),
    Copy(Range, Range),
    Fill(Range, u32),
    Add(Range, Range, Range),
}

#[derive(Default)]
struct Window {
    doomed: bool,
    written: Vec<Range>,
    reads: Vec<Range>,
    ops: Vec<Op>,
    /// Buffers that work recorded in it used (`CaptureWindow::touches`). That is every buffer of a
    /// write, copy or launch on the recording stream that got past its injected fault. Skipped or
    /// not recorded does not matter.
    touched: Vec<BufferId>,
}

impl Window {
    /// As the core's window records clean work: reads first, those not written (as that exact
    /// range) earlier in it. De-duplicated.
    fn record(&mut self, reads: &[Range], writes: &[Range], op: Op) {
        for r in reads {
            if !self.written.contains(r) && !self.reads.contains(r) {
                self.reads.push(*r);
            }
        }
        for w in writes {
            if !self.written.contains(w) {
                self.written.push(*w);
            }
        }
        self.ops.push(op);
    }
}

struct GraphModel {
    graph: Graph,
    /// Recorded on a device that was lost since. A replay is refused, claiming nothing, and a
    /// destroy succeeds (rule 53).
    lost: bool,
    written: Vec<Range>,
    reads: Vec<Range>,
    ops: Vec<Op>,
}

/// The three kernel shapes a launch picks from.
#[derive(Clone, Copy, Debug)]
enum Shape {
    Fill,
    Copy,
    Add,
}

/// What a run did on stream 1 while stream 0 recorded.
#[derive(Clone, Copy, Default)]
struct Tally {
    /// Operations on stream 1 during a window.
    during_windows: usize,
    /// Of those, how many the oracle expected refused (and were).
    refused: usize,
    /// Invalid operations (`abuse`), each refused with its typed error.
    abused: usize,
    /// Devices lost (`loss`).
    lost: usize,
    /// Of those, how many opened again.
    reopened: usize,
    /// Recoveries that failed before one opened the device. A fault reopened it, or the device was
    /// lost again while remaking buffers.
    failed_attempts: usize,
    /// Losses on a backend that cannot reopen: recovery refused, a fresh server.
    restarts: usize,
}

struct World<S: Suite> {
    /// Stream 0, which opens every capture window.
    client: Client<S::Backend>,
    /// Stream 1, for about a third of the work, windows or not.
    other: Client<S::Backend>,
    /// A client of another server, whose buffers every call here must refuse ([`abuse`]).
    stranger: Client<S::Backend>,
    /// Whether this step's work goes to stream 1.
    on_other: bool,
    /// Whether this step's operation was expected to be refused. The step then checks that it
    /// changed nothing.
    refused: bool,
    tally: Tally,
    rng: Rng,
    /// How many failures the hook has heard: a recovery keeps the hook.
    heard: Arc<AtomicUsize>,
    /// Whether the backend opens a lost device again ([`Capability::Reopen`]).
    reopens: bool,
    /// Launch bindings start at multiples of this.
    align: u64,
    /// The largest buffer, in words. At least three binding offsets' worth, so launches land past
    /// the start of a buffer too.
    max_words: u64,
    bufs: Vec<Buf>,
    window: Option<(Capture, Window)>,
    graphs: Vec<GraphModel>,
    kernels: [Kernel; 3],
}

fn injected(site: &str) -> Error {
    Error::Launch {
        kernel: Arc::from("property"),
        stream: StreamId(0),
        detail: format!("injected at {site}"),
    }
}

fn as_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn as_words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn words(r: &Range) -> std::ops::Range<usize> {
    (r.1 / 4) as usize..(r.2 / 4) as usize
}

fn overlap(a: &Range, b: &Range) -> bool {
    a.0 == b.0 && a.1 < b.2 && b.1 < a.2
}

impl<S: Suite> World<S> {
    fn new(client: Client<S::Backend>, seed: u64) -> Self {
        let align = client.with_backend(|b| b.binding_alignment()).max(4);
        let other = client.new_stream().expect("a second stream");
        let stranger = S::client().expect("a second server");
        // A hook that calls back into the client on every failure. It must neither deadlock nor
        // change what the oracle sees.
        let weak = client.downgrade();
        let heard = Arc::new(AtomicUsize::new(0));
        let hook = heard.clone();
        client.on_failure(move |_, _| {
            hook.fetch_add(1, Ordering::Relaxed);
            if let Some(c) = weak.upgrade() {
                assert!(c.failures_held() <= c.failure_claims());
            }
        });
        Self {
            client,
            other,
            stranger,
            on_other: false,
            refused: false,
            tally: Tally::default(),
            heard,
            rng: Rng::new(seed),
            reopens: kit::has::<S>(Capability::Reopen),
            align,
            max_words: (3 * align / 4 + 1).max(64),
            bufs: Vec::new(),
            window: None,
            graphs: Vec::new(),
            kernels: [S::fill(), S::copy(), S::add()],
        }
    }
}

fn summary(result: &scope_core::Result<Vec<u8>>) -> String {
    match result {
        Ok(bytes) => format!("Ok({} bytes)", bytes.len()),
        Err(e) => format!("Err({e})"),
    }
}

/// How many operations the log keeps for a failure report.
const LOG_TAIL: usize = 32;

fn run<S: Suite>(client: Client<S::Backend>, seed: u64, steps: usize) -> Tally {
    let mut world = World::<S>::new(client, seed);
    let mut log: VecDeque<String> = VecDeque::with_capacity(LOG_TAIL + 1);
    for step in 0..steps {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let what = world.step();
            world.verify();
            what
        }));
        match outcome {
            Ok(what) => {
                log.push_back(format!("{step}: {what}"));
                if log.len() > LOG_TAIL {
                    log.pop_front();
                }
            }
            Err(panic) => {
                eprintln!(
                    "property failure on {}: seed {seed}, step {step} of {steps}; \
                     rerun with SCOPE_PROPERTY_SEED={seed} SCOPE_PROPERTY_STEPS={}",
                    <S::Backend as Backend>::NAME,
                    step + 1
                );
                eprintln!(
                    "the last {} operations before it:\n  {}",
                    log.len(),
                    Vec::from(log).join("\n  ")
                );
                std::panic::resume_unwind(panic);
            }
        }
    }
    if let Some((capture, _)) = world.window.take() {
        world.client.abort_capture(capture).unwrap();
    }
    for model in std::mem::take(&mut world.graphs) {
        let _ = world.client.destroy_graph(&model.graph);
    }
    world.bufs.clear();
    assert_eq!(
        world.client.failures_held(),
        0,
        "seed {seed}: freeing everything empties the store\n{}",
        world.client.dump_failures()
    );
    assert_eq!(
        world.client.bytes_allocated(),
        0,
        "seed {seed}: freeing everything frees every byte"
    );
    world.tally
}

/// The property test at CI's scale, as a `#[test]` of `$suite`. `SCOPE_PROPERTY_SEED` and
/// `SCOPE_PROPERTY_STEPS` change it.
#[macro_export]
macro_rules! property_tests {
    ($suite:ty) => {
        #[test]
        fn random_sequences() {
            $crate::random_sequences::<$suite>(&$crate::property::SEEDS, $crate::property::STEPS);
            <$suite as $crate::Suite>::finished();
        }
    };
}
