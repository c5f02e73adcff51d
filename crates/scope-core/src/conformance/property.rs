//! Random operation sequences against a per-word oracle, for any server.
//!
//! The conformance suite tests each rule with a sequence someone thought
//! of; this tests the sequences nobody did. Random allocations (some of
//! which fail), frees, host writes, launches of the suite's three kernels
//! over random ranges, device copies, reads, syncs, capture windows, replays
//! and graph destruction — with failures injected at every site that takes
//! one — run against a server, and beside it an oracle keeps, for every
//! word of every live buffer, whether it is *stale* (a failed or skipped
//! writer, a window that could not seal or was aborted, a failed replay or
//! destroy left it unwritten) and, where known, its value. After every
//! operation:
//!
//! - a `check` of a random range and of the whole of every live buffer
//!   fails exactly when one of its words is stale;
//! - the store holds no more failures than live claims (rule 7), and every
//!   failure's carrier count matches the buffers that claim it
//!   ([`Client::audit`]);
//!
//! and every host read returns the oracle's values wherever it knows them.
//! At the end, freeing everything empties the store and the allocator.
//!
//! # Why this shape
//!
//! The launches are the suite's own `fill`, `copy` and `add` — one write;
//! one read and one write; two reads and one write — over random buffers
//! and ranges, so every server runs the same sequences in its own kernel
//! language, and the oracle can compute what a clean launch writes. Ranges
//! are whole words (the contract's copy granularity) and launch bindings
//! start at multiples of the backend's binding alignment, so nothing the
//! test issues is invalid by accident; the few invalid requests it does
//! make (an overlapping copy within one buffer, a replay of a graph whose
//! buffer was freed) are checked to be refused as `InvalidArgument`.
//! Staleness is per word because every range is word-aligned: a per-byte
//! oracle would say the same thing four times.
//!
//! Faults planted at a host read are not device faults: a device fault
//! there claims whatever is in flight on the reading stream (rule 23),
//! which the oracle does not follow. They still check that a read fails
//! only after its range checks clean and it is not refused.
//!
//! A launch never binds one buffer for writing and for reading: wgpu
//! forbids that within one dispatch, so the outcome would depend on the
//! server, and an exact oracle is the point.
//!
//! Capture follows `docs/ERROR_MODEL.md`: work inside a window does not run
//! until replay (the oracle keeps the window's operations and applies them,
//! on current inputs, at each clean replay), host writes inside it replay
//! the bytes given at call time, and reads, syncs and replays on the
//! recording stream are refused.
//!
//! Windows open on stream 0. About a third of the work goes to a second
//! stream, windows or not, so buffers change hands between streams and the
//! server orders them (`Backend::order`); the values read back say whether
//! it did. During a window the oracle predicts every cross-capture refusal
//! (`docs/ERROR_MODEL.md`, "Cross-stream ordering is automatic") and
//! asserts it both ways: a use on stream 1 is refused, as `Error::Refused`
//! and changing nothing (no claim, no failure seen on either stream),
//! exactly when one of its buffers was last used by stream 0 and work
//! recorded in the open window used it; a buffer stream 0 used only before
//! the capture began is stream 1's to use. For that the oracle keeps, per
//! buffer, the stream that used it last — set by the allocation and by
//! every operation that reaches `Server::order` (not one refused, failed
//! by an injected fault or skipped on a claimed input; a host read only
//! once its range checks clean) — and, per window, the buffers its recorded
//! work used. Stream 1's work runs at once, on the buffers' current values,
//! while stream 0's waits for a replay; the window's buffers are stream 0's
//! alone until it ends, so the two never meet. Only stream 0 opens windows:
//! two recording streams (where even a buffer's pre-capture use on the
//! other is refused) are left to the conformance suite.
//!
//! # Invalid calls
//!
//! About one step in twenty is a call no correct runtime makes (`abuse.rs`:
//! ranges past the end, at `u64::MAX`, empty or reversed; freed and foreign
//! buffers; allocations of nothing or of everything; misaligned bindings;
//! grids past the device; an indirect count of `u32::MAX`; a capture
//! dropped without its end). Each must fail with its typed error, or end in
//! its defined outcome, and change nothing the oracle sees. Windows are
//! sometimes dropped rather than aborted, graphs dropped rather than
//! destroyed, and a failure hook that calls back into the client is
//! installed throughout: together, the contract fuzzer.
//!
//! # Reproducing a failure
//!
//! A failing step panics after printing the seed, the step and the tail of
//! the operation log. `SCOPE_PROPERTY_SEED=<seed>` reruns that seed alone;
//! `SCOPE_PROPERTY_STEPS=<n>` sets the steps per seed (for every server's
//! test in the process).

mod abuse;

use std::collections::VecDeque;
use std::sync::Arc;

use super::{Suite, client_or_skip};
use crate::backend::Backend;
use crate::client::Client;
use crate::error::Error;
use crate::fault::{FaultPlan, Site};
use crate::handle::{Binding, Buffer, Capture, Dispatch, Graph};
use crate::id::{BufferId, StreamId};
use crate::kernel::Kernel;

/// The seeds every server's test runs: five, so that a sequence one seed
/// never reaches another may.
pub const SEEDS: [u64; 5] = [1, 7, 42, 1_000_003, 0x5eed_cafe];

/// Operations per seed in the test [`conformance_tests!`](crate::conformance_tests)
/// makes: 12,500 over [`SEEDS`], about two seconds on each server here.
pub const STEPS: usize = 2_500;

/// Run `steps` random operations for each of `seeds` (a fresh server each)
/// against `S`'s server, checking the oracle after every one.
///
/// `SCOPE_PROPERTY_SEED` replaces `seeds` with that one seed, and
/// `SCOPE_PROPERTY_STEPS` replaces `steps`. With no device here it prints
/// `skipped: no <backend> device` and returns (see
/// [`client_or_skip`]). Prints the operations run when it passes.
///
/// # Panics
///
/// When the server disagrees with the oracle, after printing the seed, the
/// step and the last operations.
pub fn random_sequences<S: Suite>(seeds: &[u64], steps: usize) {
    let steps = env_number("SCOPE_PROPERTY_STEPS").map_or(steps, |s| s as usize);
    let only = env_number("SCOPE_PROPERTY_SEED");
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
    }
    println!(
        "{}: {} operations over {} seeds; {} on stream 1 during a window, {} of them refused; \
         {} invalid",
        <S::Backend as Backend>::NAME,
        steps * seeds.len(),
        seeds.len(),
        tally.during_windows,
        tally.refused,
        tally.abused,
    );
}

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    let parsed = value.trim().parse().ok();
    assert!(parsed.is_some(), "{name}={value:?} is not a number");
    parsed
}

struct Rng(u64);

impl Rng {
    /// Seeded through splitmix64, so that every seed (even ones, zero)
    /// starts its own sequence.
    fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
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
    /// The stream whose work used it last (`Server::order`), as an index:
    /// 0 or 1. Allocation counts as a use.
    last_user: usize,
}

/// Bytes `start..end` of a buffer, by id: a recording or a graph outlives
/// positions in `bufs`.
type Range = (BufferId, u64, u64);

fn len(r: &Range) -> u64 {
    r.2 - r.1
}

/// An operation the oracle can apply to its values: what a window records
/// and a graph replays.
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
    /// Buffers that work recorded in it used (`CaptureWindow::touches`):
    /// every buffer of a write, copy or launch on the recording stream that
    /// got past its injected fault, skipped or not recorded aside.
    touched: Vec<BufferId>,
}

impl Window {
    /// As the core's window records clean work: reads first, those not
    /// written (as that exact range) earlier in it; de-duplicated.
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
}

struct World<S: Suite> {
    /// Stream 0, which opens every capture window.
    client: Client<S::Backend>,
    /// Stream 1, for about a third of the work, windows or not.
    other: Client<S::Backend>,
    /// A client of another server, whose buffers every call here must
    /// refuse ([`abuse`]).
    stranger: Client<S::Backend>,
    /// Whether this step's work goes to stream 1.
    on_other: bool,
    /// Whether this step's operation was expected to be refused: the step
    /// then checks that it changed nothing.
    refused: bool,
    tally: Tally,
    rng: Rng,
    /// Launch bindings start at multiples of this.
    align: u64,
    /// The largest buffer, in words: at least three binding offsets' worth,
    /// so launches land past the start of a buffer too.
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
        // A hook that calls back into the client on every failure: it must
        // neither deadlock nor change what the oracle sees.
        let weak = client.downgrade();
        client.on_failure(move |_, _| {
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
            rng: Rng::new(seed),
            align,
            max_words: (3 * align / 4 + 1).max(64),
            bufs: Vec::new(),
            window: None,
            graphs: Vec::new(),
            kernels: [S::fill(), S::copy(), S::add()],
        }
    }

    fn index_of(&self, id: BufferId) -> Option<usize> {
        self.bufs.iter().position(|b| b.handle.id() == id)
    }

    /// Set `ranges` (of allocated, live buffers) to `word`.
    fn mark(&mut self, ranges: &[Range], word: Word) {
        for r in ranges {
            if let Some(i) = self.index_of(r.0)
                && self.bufs[i].allocated
            {
                self.bufs[i].words[words(r)].fill(word);
            }
        }
    }

    fn any_stale(&self, ranges: &[Range]) -> bool {
        ranges.iter().any(|r| {
            self.index_of(r.0)
                .is_some_and(|i| self.bufs[i].words[words(r)].iter().any(|w| w.stale))
        })
    }

    fn values(&self, r: &Range) -> Vec<Option<u32>> {
        match self.index_of(r.0) {
            Some(i) => self.bufs[i].words[words(r)]
                .iter()
                .map(|w| w.value)
                .collect(),
            None => vec![None; (len(r) / 4) as usize],
        }
    }

    fn set_values(&mut self, r: &Range, values: &[Option<u32>]) {
        if let Some(i) = self.index_of(r.0) {
            for (w, v) in self.bufs[i].words[words(r)].iter_mut().zip(values) {
                w.value = *v;
            }
        }
    }

    /// What `op` does to the values it writes, on the values there now.
    /// Staleness is the caller's business.
    fn apply(&mut self, op: &Op) {
        match op {
            Op::Write(dst, data) => {
                let v: Vec<_> = data.iter().map(|&d| Some(d)).collect();
                self.set_values(dst, &v);
            }
            Op::Copy(src, dst) => {
                let v = self.values(src);
                self.set_values(dst, &v);
            }
            Op::Fill(dst, value) => {
                self.set_values(dst, &vec![Some(*value); (len(dst) / 4) as usize]);
            }
            Op::Add(a, b, dst) => {
                let (a, b) = (self.values(a), self.values(b));
                let v: Vec<_> = a
                    .iter()
                    .zip(&b)
                    .map(|(a, b)| Some(a.as_ref()?.wrapping_add(*b.as_ref()?)))
                    .collect();
                self.set_values(dst, &v);
            }
        }
    }

    fn pick(&mut self) -> usize {
        self.rng.below(self.bufs.len() as u64) as usize
    }

    /// A random word-aligned, non-empty range of buffer `i`.
    fn range(&mut self, i: usize) -> Range {
        let words = self.bufs[i].words.len() as u64;
        let a = self.rng.below(words);
        let b = a + 1 + self.rng.below(words - a);
        (self.bufs[i].handle.id(), a * 4, b * 4)
    }

    /// A random binding offset of buffer `i`, leaving at least one word.
    fn binding_start(&mut self, i: usize) -> u64 {
        let size = self.bufs[i].handle.size();
        self.align * self.rng.below((size - 4) / self.align + 1)
    }

    /// `percent`, or a quarter of it inside a window, so that some windows
    /// seal and their graphs get replayed.
    fn failure_rate(&self, percent: u64) -> u64 {
        if self.records() { percent / 4 } else { percent }
    }

    fn recording(&self) -> bool {
        self.window.is_some()
    }

    /// This step's stream, as an index.
    fn stream(&self) -> usize {
        usize::from(self.on_other)
    }

    /// Whether this step's stream is recording: stream 0 with a window
    /// open (windows open on stream 0 only).
    fn records(&self) -> bool {
        self.recording() && !self.on_other
    }

    /// Whether stream `s` is recording.
    fn stream_records(&self, s: usize) -> bool {
        s == 0 && self.recording()
    }

    /// Whether a use of `ids` on this step's stream is refused, as
    /// `Server::refuse_recorded_elsewhere` decides: a buffer whose last
    /// user is another stream that is recording, and either that window's
    /// recorded work used it or this stream records too.
    fn refused(&self, ids: &[BufferId]) -> bool {
        let to = self.stream();
        ids.iter().any(|&id| {
            let Some(i) = self.index_of(id) else {
                return false;
            };
            let from = self.bufs[i].last_user;
            if from == to || !self.stream_records(from) {
                return false;
            }
            let touched = self
                .window
                .as_ref()
                .is_some_and(|(_, w)| w.touched.contains(&id));
            touched || self.stream_records(to)
        })
    }

    /// Work on this step's stream reached `Server::order` with `ids`: they
    /// are its now, and its window's if it records.
    fn ordered(&mut self, ids: &[BufferId]) {
        let to = self.stream();
        if self.records()
            && let Some((_, window)) = &mut self.window
        {
            for id in ids {
                if !window.touched.contains(id) {
                    window.touched.push(*id);
                }
            }
        }
        for &id in ids {
            if let Some(i) = self.index_of(id) {
                self.bufs[i].last_user = to;
            }
        }
    }

    /// Check `result` against the oracle's refusal: refused exactly when
    /// it says so, as `Error::Refused` itself (a failure read back may
    /// carry a refusal as its root, which is not this).
    fn expect_refusal<T: std::fmt::Debug>(
        &mut self,
        refused: bool,
        result: &crate::Result<T>,
        what: &str,
    ) {
        let got = matches!(result, Err(Error::Refused { .. }));
        assert_eq!(
            got,
            refused,
            "{}: {what}",
            if refused {
                "the oracle expected a cross-capture refusal"
            } else {
                "the oracle expected no refusal"
            }
        );
        assert!(
            !refused || result.as_ref().is_err_and(Error::is_refusal),
            "{what}"
        );
        self.refused |= refused;
    }

    /// A failure on this step's stream dooms its window, if it records.
    fn doom(&mut self) {
        if self.records()
            && let Some((_, window)) = &mut self.window
        {
            window.doomed = true;
        }
    }

    /// Clean work on this step's stream: recorded if it records, applied
    /// to the values now if not.
    fn done(&mut self, reads: &[Range], writes: &[Range], op: Op) {
        if self.records()
            && let Some((_, window)) = &mut self.window
        {
            window.record(reads, writes, op);
        } else {
            self.apply(&op);
        }
    }

    /// The stream this step's work goes to.
    fn on(&self) -> &Client<S::Backend> {
        if self.on_other {
            &self.other
        } else {
            &self.client
        }
    }

    fn step(&mut self) -> String {
        self.on_other = self.rng.chance(30);
        self.refused = false;
        let before = (
            self.client.failures_seen(),
            self.other.failures_seen(),
            self.client.failure_claims(),
        );
        let live = self.bufs.len();
        let abused = live >= 3 && self.rng.chance(abuse::PERCENT);
        let roll = self.rng.below(100);
        let what = match roll {
            _ if abused => self.abuse(),
            _ if live < 3 || (roll < 10 && live < 24) => self.allocate(),
            0..=9 => self.free(),
            10..=27 => self.write(),
            28..=59 => self.launch(),
            60..=65 => self.copy(),
            66..=71 => self.read(),
            72..=73 => self.sync(),
            74..=81 => self.capture(),
            82..=95 => self.replay(),
            _ => self.destroy(),
        };
        if self.refused {
            let after = (
                self.client.failures_seen(),
                self.other.failures_seen(),
                self.client.failure_claims(),
            );
            assert_eq!(
                before, after,
                "a refusal changes nothing (failures seen on each stream, claims): {what}"
            );
        }
        self.tally.abused += usize::from(abused);
        if self.on_other && self.recording() && !abused {
            self.tally.during_windows += 1;
            self.tally.refused += usize::from(self.refused);
        }
        if self.on_other {
            format!("[stream 1] {what}")
        } else {
            what
        }
    }

    fn allocate(&mut self) -> String {
        let size = 4 * (1 + self.rng.below(self.max_words));
        let fail = self.rng.chance(8);
        if fail {
            // Twice: the server trims its caches and retries once (rule 37).
            let oom = || Error::OutOfMemory {
                backend: "injected",
                requested: size,
                detail: "injected".into(),
            };
            self.client
                .inject(FaultPlan::new().fail(Site::Allocate, 1, oom()).fail(
                    Site::Allocate,
                    2,
                    oom(),
                ));
        }
        let handle = self.on().allocate(size).expect("allocate");
        self.client.inject(FaultPlan::new());
        // Fresh memory holds no failure: its bytes are unspecified but not
        // claimed (nothing was meant to write them yet).
        let id = handle.id();
        self.bufs.push(Buf {
            handle,
            words: vec![if fail { STALE } else { UNKNOWN }; (size / 4) as usize],
            allocated: !fail,
            // Failed or not, the allocating stream is its first user.
            last_user: self.stream(),
        });
        format!("allocate {id}: {size} bytes (fails: {fail})")
    }

    fn free(&mut self) -> String {
        let i = self.pick();
        let buf = self.bufs.swap_remove(i);
        let id = buf.handle.id();
        let explicit = self.rng.chance(50);
        if explicit {
            self.client.free(&buf.handle).expect("free");
        }
        drop(buf);
        format!("free {id} (explicit: {explicit})")
    }

    fn write(&mut self) -> String {
        let i = self.pick();
        // Whole buffers often: healing has to keep up with failures spreading
        // through skips, or most of the state ends up stale.
        let r = if self.rng.chance(30) {
            (self.bufs[i].handle.id(), 0, self.bufs[i].handle.size())
        } else {
            self.range(i)
        };
        let data: Arc<[u32]> = (0..len(&r) / 4).map(|_| self.rng.next() as u32).collect();
        let fail = self.rng.chance(self.failure_rate(5));
        if fail {
            self.client
                .inject(FaultPlan::new().fail(Site::Write, 1, injected("write")));
        }
        let result = self
            .on()
            .write(self.bufs[i].handle.slice(r.1..r.2), &as_bytes(&data));
        self.client.inject(FaultPlan::new());
        let what = format!("write {r:?} (fails: {fail}) -> {result:?}");
        if !self.bufs[i].allocated {
            // No memory to write is found before any refusal.
            assert!(result.is_err(), "a write to an unallocated buffer fails");
            self.expect_refusal(false, &result, &what);
            return what;
        }
        let refused = self.refused(&[r.0]);
        self.expect_refusal(refused, &result, &what);
        if refused {
            return what;
        }
        assert_eq!(result.is_err(), fail, "{what}");
        if fail {
            self.mark(&[r], STALE);
            self.doom();
            return what;
        }
        self.ordered(&[r.0]);
        // Healed by the write: its values are known once it ran (at once,
        // or at each replay of the window that records it).
        self.mark(&[r], UNKNOWN);
        self.done(&[], &[r], Op::Write(r, data));
        what
    }

    fn launch(&mut self) -> String {
        let shape = match self.rng.below(100) {
            0..=39 => Shape::Fill,
            40..=74 => Shape::Copy,
            _ => Shape::Add,
        };
        let out = self.pick();
        let n_inputs = match shape {
            Shape::Fill => 0,
            Shape::Copy => 1,
            Shape::Add => 2,
        };
        // Inputs never share a buffer with the output (see the module docs).
        let mut inputs = Vec::new();
        while inputs.len() < n_inputs {
            let i = self.pick();
            if i != out {
                inputs.push(i);
            }
        }
        let starts: Vec<u64> = std::iter::once(out)
            .chain(inputs.iter().copied())
            .map(|i| self.binding_start(i))
            .collect();
        let room = std::iter::once(out)
            .chain(inputs.iter().copied())
            .zip(&starts)
            .map(|(i, s)| (self.bufs[i].handle.size() - s) / 4)
            .min()
            .unwrap_or(1);
        let n = 1 + self.rng.below(room);
        let range_of = |i: usize, start: u64| (self.bufs[i].handle.id(), start, start + 4 * n);
        let w = range_of(out, starts[0]);
        let reads: Vec<Range> = inputs
            .iter()
            .zip(&starts[1..])
            .map(|(&i, &s)| range_of(i, s))
            .collect();
        let value = self.rng.next() as u32;
        let (kernel, op, values) = match shape {
            Shape::Fill => (&self.kernels[0], Op::Fill(w, value), vec![n as u32, value]),
            Shape::Copy => (&self.kernels[1], Op::Copy(reads[0], w), vec![n as u32]),
            Shape::Add => (
                &self.kernels[2],
                Op::Add(reads[0], reads[1], w),
                vec![n as u32],
            ),
        };
        let fail = self.rng.chance(self.failure_rate(12));
        if fail {
            self.client
                .inject(FaultPlan::new().fail(Site::Launch, 1, injected("launch")));
        }
        let buffer = |r: &Range| &self.bufs[self.index_of(r.0).expect("live")].handle;
        let bindings: Vec<Binding<'_>> = reads
            .iter()
            .map(|r| buffer(r).slice(r.1..r.2).read())
            .chain(std::iter::once(buffer(&w).slice(w.1..w.2).write()))
            .collect();
        let blob = S::scalar_blob(kernel, &bindings, &values);
        let result = self.on().launch(
            kernel,
            &bindings,
            &blob,
            Dispatch::linear((n as u32).div_ceil(64)),
        );
        drop(bindings);
        self.client.inject(FaultPlan::new());
        let unallocated_out = !self.bufs[out].allocated;
        let skipped = !unallocated_out && self.any_stale(&reads);
        let clean = !unallocated_out && !skipped && !fail;
        let what =
            format!("launch {shape:?} reads {reads:?} writes {w:?} (fails: {fail}) -> {result:?}");
        // Refused before anything else: an output without memory, an input
        // carrying a failure.
        let ids: Vec<BufferId> = reads.iter().chain([&w]).map(|r| r.0).collect();
        let refused = self.refused(&ids);
        self.expect_refusal(refused, &result, &what);
        if refused {
            return what;
        }
        match (&result, clean) {
            (Ok(()), true) => {}
            (Err(Error::Skipped { .. }), false) if skipped => {}
            (Err(e), false) if !skipped && !matches!(e, Error::Skipped { .. }) => {}
            _ => panic!("expected clean={clean} skipped={skipped}: {what}"),
        }
        if unallocated_out {
            // Never started: nothing to claim, but a window is missing it.
            self.doom();
            return what;
        }
        if !clean {
            // Skipped or failed before `order`: no buffer changes hands.
            self.mark(&[w], STALE);
            self.doom();
            return what;
        }
        self.ordered(&ids);
        self.mark(&[w], UNKNOWN);
        self.done(&reads, &[w], op);
        what
    }

    fn copy(&mut self) -> String {
        let i = self.pick();
        // Within one buffer often: the contract allows it when the ranges
        // do not overlap, and not every API does (wgpu refuses it).
        let j = if self.rng.chance(25) { i } else { self.pick() };
        let s = self.range(i);
        let n = len(&s).min(self.bufs[j].handle.size());
        let s = (s.0, s.1, s.1 + n);
        let start = 4 * self.rng.below((self.bufs[j].handle.size() - n) / 4 + 1);
        let d = (self.bufs[j].handle.id(), start, start + n);
        let fail = self.rng.chance(self.failure_rate(8));
        if fail {
            self.client
                .inject(FaultPlan::new().fail(Site::Copy, 1, injected("copy")));
        }
        let result = self.on().copy(
            self.bufs[i].handle.slice(s.1..s.2),
            self.bufs[j].handle.slice(d.1..d.2),
        );
        self.client.inject(FaultPlan::new());
        let what = format!("copy {s:?} -> {d:?} (fails: {fail}) -> {result:?}");
        if overlap(&s, &d) {
            assert!(
                matches!(result, Err(Error::InvalidArgument { .. })),
                "an overlapping copy is invalid: {what}"
            );
            return what;
        }
        if !self.bufs[j].allocated {
            // No memory to write is found before any refusal.
            assert!(result.is_err(), "{what}");
            self.expect_refusal(false, &result, &what);
            return what;
        }
        let refused = self.refused(&[s.0, d.0]);
        self.expect_refusal(refused, &result, &what);
        if refused {
            return what;
        }
        let skipped = self.any_stale(&[s]);
        let clean = !skipped && !fail;
        assert_eq!(result.is_ok(), clean, "{what}");
        assert_eq!(
            matches!(result, Err(Error::Skipped { .. })),
            skipped,
            "{what}"
        );
        if !clean {
            self.mark(&[d], STALE);
            self.doom();
            return what;
        }
        self.ordered(&[s.0, d.0]);
        self.mark(&[d], UNKNOWN);
        self.done(&[s], &[d], Op::Copy(s, d));
        what
    }

    fn read(&mut self) -> String {
        let i = self.pick();
        let r = self.range(i);
        // Not a device fault: one would claim what is in flight on the
        // stream (rule 23), which the oracle does not follow.
        let fail = self.rng.chance(5);
        if fail {
            self.client
                .inject(FaultPlan::new().fail(Site::Read, 1, injected("read")));
        }
        let result = self.on().read(self.bufs[i].handle.slice(r.1..r.2));
        self.client.inject(FaultPlan::new());
        let what = format!("read {r:?} (fails: {fail}) -> {}", summary(&result));
        if self.records() {
            assert!(
                result.as_ref().is_err_and(Error::is_refusal),
                "a read on a recording stream is refused: {what}"
            );
            return what;
        }
        // The range is checked first: a claimed one returns its failure.
        let stale = self.any_stale(&[r]);
        let refused = !stale && self.refused(&[r.0]);
        self.expect_refusal(refused, &result, &what);
        if refused {
            return what;
        }
        match result {
            // Failed before `order`: no buffer changes hands.
            Err(e) if !stale && fail => assert!(
                matches!(&e, Error::Launch { detail, .. } if detail == "injected at read"),
                "{what}"
            ),
            Err(e) => assert!(stale, "read {r:?} of unclaimed bytes failed: {e}"),
            Ok(bytes) => {
                assert!(!stale && !fail, "read {r:?} succeeded: {what}");
                self.ordered(&[r.0]);
                for (k, (got, want)) in as_words(&bytes).iter().zip(self.values(&r)).enumerate() {
                    if let Some(want) = want {
                        assert_eq!(
                            *got,
                            want,
                            "word {k} of read {r:?} (byte {})",
                            r.1 + 4 * k as u64
                        );
                    }
                }
            }
        }
        what
    }

    fn sync(&mut self) -> String {
        let i = self.pick();
        let r = self.range(i);
        let named = self.rng.chance(50);
        let result = if named {
            self.on()
                .sync_buffers(&[self.bufs[i].handle.slice(r.1..r.2)])
        } else {
            self.on().sync()
        };
        let what = if named {
            format!("sync {r:?} -> {result:?}")
        } else {
            format!("sync -> {result:?}")
        };
        // The named buffers are checked first, then the stream's state.
        let named = named && self.any_stale(&[r]);
        match &result {
            Err(e) if named => assert!(!e.unwritten().is_empty(), "{what}"),
            Err(e) if self.records() => assert!(e.is_refusal(), "{what}"),
            Err(_) => panic!("a sync of unclaimed bytes failed: {what}"),
            Ok(()) => assert!(!named && !self.records(), "{what}"),
        }
        what
    }

    fn capture(&mut self) -> String {
        // Windows open and close on stream 0 only.
        self.on_other = false;
        match self.window.take() {
            None => {
                let capture = self.client.begin_capture().expect("begin");
                self.window = Some((capture, Window::default()));
                "begin capture".into()
            }
            Some((capture, window)) if self.rng.chance(15) => {
                // Dropped rather than aborted, a third of the time: the
                // same, at the next call.
                let dropped = self.rng.chance(33);
                if dropped {
                    drop(capture);
                } else {
                    self.client.abort_capture(capture).unwrap();
                }
                self.mark(&window.written, STALE);
                format!(
                    "abort capture (dropped: {dropped}, recorded {:?})",
                    window.written
                )
            }
            Some((capture, window)) => {
                let fail = !window.doomed && self.rng.chance(10);
                if fail {
                    self.client
                        .inject(FaultPlan::new().fail(Site::Seal, 1, injected("seal")));
                }
                let result = self.client.end_capture(capture);
                self.client.inject(FaultPlan::new());
                let what = format!(
                    "end capture (doomed: {}, seal fails: {fail}, recorded {:?}) -> {result:?}",
                    window.doomed, window.written
                );
                if window.doomed || fail {
                    assert!(matches!(result, Err(Error::Unsealed { .. })), "{what}");
                    self.mark(&window.written, STALE);
                } else {
                    let graph = result.unwrap_or_else(|e| panic!("a clean window seals: {e}"));
                    self.graphs.push(GraphModel {
                        graph,
                        written: window.written,
                        reads: window.reads,
                        ops: window.ops,
                    });
                }
                what
            }
        }
    }

    fn replay(&mut self) -> String {
        if self.graphs.is_empty() {
            // Nothing to replay yet: work towards a graph instead.
            return self.capture();
        }
        let g = self.rng.below(self.graphs.len() as u64) as usize;
        let fail = self.rng.chance(20);
        if fail {
            self.client
                .inject(FaultPlan::new().fail(Site::Replay, 1, injected("replay")));
        }
        let result = self.on().replay(&self.graphs[g].graph);
        self.client.inject(FaultPlan::new());
        let what = format!(
            "replay {:?} (fails: {fail}) -> {result:?}",
            self.graphs[g].graph.id()
        );
        if self.records() {
            assert!(result.is_err_and(|e| e.is_refusal()), "{what}");
            return what;
        }
        let model = &self.graphs[g];
        let gone = model
            .written
            .iter()
            .chain(&model.reads)
            .any(|r| self.index_of(r.0).is_none());
        if gone {
            assert!(
                matches!(result, Err(Error::InvalidArgument { .. })),
                "a graph with a freed buffer: {what}"
            );
            return what;
        }
        let ids: Vec<BufferId> = model
            .written
            .iter()
            .chain(&model.reads)
            .map(|r| r.0)
            .collect();
        let skipped = self.any_stale(&model.reads);
        let written = model.written.clone();
        let ops = model.ops.clone();
        let refused = self.refused(&ids);
        self.expect_refusal(refused, &result, &what);
        if refused {
            return what;
        }
        let clean = !skipped && !fail;
        assert_eq!(result.is_ok(), clean, "skipped: {skipped}: {what}");
        if !clean {
            self.mark(&written, STALE);
            return what;
        }
        self.ordered(&ids);
        self.mark(&written, UNKNOWN);
        for op in &ops {
            self.apply(op);
        }
        what
    }

    fn destroy(&mut self) -> String {
        if self.graphs.is_empty() {
            return "destroy: none".into();
        }
        let g = self.rng.below(self.graphs.len() as u64) as usize;
        let model = self.graphs.swap_remove(g);
        if self.rng.chance(25) {
            // Its last handle dropped: destroyed at the next call, failing
            // nothing.
            let id = model.graph.id();
            drop(model);
            return format!("drop {id:?}");
        }
        let fail = self.rng.chance(30);
        if fail {
            self.client
                .inject(FaultPlan::new().fail(Site::Destroy, 1, injected("destroy")));
        }
        let result = self.client.destroy_graph(&model.graph);
        self.client.inject(FaultPlan::new());
        let what = format!(
            "destroy {:?} (fails: {fail}) -> {result:?}",
            model.graph.id()
        );
        assert_eq!(result.is_err(), fail, "{what}");
        if fail {
            self.mark(&model.written, STALE);
        }
        assert!(
            matches!(
                self.client.replay(&model.graph),
                Err(Error::InvalidArgument { .. }) | Err(Error::Refused { .. })
            ),
            "a destroyed graph is gone: {what}"
        );
        what
    }

    /// After every step: checks agree with the oracle, and rule 7 holds.
    fn verify(&mut self) {
        for i in 0..self.bufs.len() {
            let r = self.range(i);
            let whole = (r.0, 0, self.bufs[i].handle.size());
            for range in [r, whole] {
                let got = self
                    .client
                    .check(&[self.bufs[i].handle.slice(range.1..range.2)]);
                assert_eq!(
                    got.is_err(),
                    self.any_stale(&[range]),
                    "check {range:?}: {got:?}"
                );
            }
        }
        let held = self.client.failures_held();
        let claims = self.client.failure_claims();
        assert!(
            held <= claims,
            "rule 7: {held} failures held by {claims} claims\n{}",
            self.client.dump_failures()
        );
        if let Err(books) = self.client.audit() {
            panic!(
                "the store's books: {books}\n{}",
                self.client.dump_failures()
            );
        }
    }
}

fn summary(result: &crate::Result<Vec<u8>>) -> String {
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
