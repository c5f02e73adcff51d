//! The whole launch path through the core, against the scope cycle it wraps,
//! side by side in one run.
//!
//! Three figures for one launch with 2 read bindings and 1 write binding:
//!
//! - **the scope cycle**: `ExecuteScope::launching` over a bare store with
//!   those reads and that write and an empty body — the skip check, mint,
//!   claim, release, prune — which every launch pays and nothing can make
//!   cheaper than;
//! - **the core over the null backend**: `Client::launch` on
//!   [`scope_core::null`], whose device calls do nothing — the lock, handle
//!   resolution, validation, the compile cache, the scope, the in-flight
//!   bookkeeping: the core's own cost, with no device in it;
//! - **the reference server**: the same launch on the host backend, which
//!   also copies each binding into a scratch vector and back.
//!
//! The target, on the 2-core development machine: the core's cost on the
//! null backend at most 2x the scope cycle. The rounds interleave the three,
//! so a machine that slows down slows each of them alike; each figure is the
//! median of its rounds, and each ratio the median of the rounds' own
//! ratios, which a machine that changes speed between rounds moves least.
//!
//! Beside each launch figure, the heap allocations one launch makes on the
//! success path, counted by the bench's global allocator (which counts and
//! forwards to the system's): the target is none.
//!
//! `SCOPE_BENCH_SMOKE=1` runs a few iterations, to prove the bench runs.
//! `SCOPE_BENCH_ONLY=scope|null|host` times one figure alone, for a
//! profiler (`valgrind --tool=callgrind`) to count that path and no other.
//! `SCOPE_BENCH_ITERATIONS=N` sets the calls a round times: a profiler run
//! at two counts gives, by difference, one call's instructions and nothing
//! of setup.
//!
//! Run it with `cargo bench -p scope-core --bench launch_path`.
//!
//! # What shaped the path
//!
//! The launch path's choices were each made for a cost this bench measured
//! (instructions per launch under callgrind, by the two-count difference
//! above, or perf samples on the null figure). The figures are the ones
//! measured when each choice was made; to re-measure one, undo the choice
//! and run this bench's null figure under the profiler at two counts.
//!
//! - `Client::lock` is inlined, with the release of dropped handles out of
//!   line: the call was 18 instructions of every launch.
//! - `Server::launch` is inlined into `Client::launch`: the call and its
//!   frame were 21 instructions of every launch.
//! - The kernel launched last is remembered: a compile-cache hash lookup
//!   per launch was a tenth of the core's cost of one.
//! - A launch reads its inputs' claims as it resolves its bindings, and
//!   enters its scope without looking again: the second lookup per input
//!   was a tenth of the cost.
//! - The body runs in the caller's own code, not a closure: the closure's
//!   captures, stored and loaded again, were near a twentieth of the cost.
//! - A running scope is never held in a `Result`: the enum laid an
//!   `Error`'s 4-byte fields over the write set's length, which was stored
//!   in two halves and read whole, a load the processor cannot forward.
//!   perf put a tenth of a launch's samples just after it.
//! - Memory lookups build their error lazily: an `Error` built and dropped
//!   on success cost more than the lookup.
//! - A claim is dropped with `pop`, not `clear`: `clear` stayed out of
//!   line, a call and thirty instructions to drop one claim.
//! - The binding lists are `Few`, not `Vec` or `smallvec`'s vector: the
//!   latter's bookkeeping per push cost more than the lookups it served.
//! - The binding alignment is a mask where it is a power of two, sparing a
//!   64-bit division per binding.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use scope_core::internals::{ExecuteScope, ScopedOutcome, WriteScoped};
use scope_core::null::Null;
use scope_core::{
    Backend, Binding, BufferId, BufferRange, ByteRange, Client, Dispatch, Kernel, StreamId,
};
use scope_test::host::Host;

#[path = "common/store.rs"]
mod store;

use store::Store;

/// The system allocator, counting the allocations made through it.
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call forwards to `System` with the caller's own arguments,
// so `System`'s guarantees are this allocator's; the count is a relaxed
// atomic, which allocates nothing and never unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's promises for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's promises for `alloc_zeroed`, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's promises for `realloc`, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's promises for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Heap allocations per call of `f`, over `calls` calls after one warm-up
/// call (which may fill a pool the rest reuse).
fn allocations_per(calls: u32, mut f: impl FnMut()) -> f64 {
    f();
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..calls {
        f();
    }
    (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / f64::from(calls)
}

/// The scope a launch opens: 2 reads, 1 write, an empty body.
fn scope_cycle(store: &mut Store, name: &Arc<str>, read: &[BufferRange], write: BufferRange) {
    let mut written = store.write_set();
    written.push(write);
    let outcome = ExecuteScope::launching(store, name, StreamId(0), read, written)
        .execute(|_, written| Ok(black_box(written.len())));
    match outcome {
        ScopedOutcome::Executed(n) => {
            black_box(n);
        }
        _ => unreachable!("clean inputs and an empty body succeed"),
    }
}

/// A client whose launch `kernel` takes two inputs and one output, ready
/// to launch: compiled, inputs written.
struct Launching<B: Backend> {
    client: Client<B>,
    kernel: Kernel,
    buffers: [scope_core::Buffer; 3],
}

impl<B: Backend> Launching<B> {
    fn new(client: Client<B>, kernel: Kernel) -> Self {
        let a = client.upload(&[1; 16]).expect("upload");
        let b = client.upload(&[2; 16]).expect("upload");
        let out = client.allocate(16).expect("allocate");
        client.compile(&kernel).expect("compile");
        Self {
            client,
            kernel,
            buffers: [a, b, out],
        }
    }

    fn launch(&self) {
        let [a, b, out] = &self.buffers;
        let bindings = [Binding::read(a), Binding::read(b), Binding::write(out)];
        self.client
            .launch(&self.kernel, &bindings, &[], Dispatch::linear(1))
            .expect("launch");
    }

    fn settle(&self) {
        self.client.sync().expect("sync");
        assert_eq!(self.client.failures_held(), 0);
    }
}

/// Nanoseconds per call of `f`, timed over `iterations` calls.
fn time(iterations: u32, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..iterations {
        f();
    }
    start.elapsed().as_nanos() as f64 / f64::from(iterations)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let smoke = std::env::var_os("SCOPE_BENCH_SMOKE").is_some();
    let only = std::env::var("SCOPE_BENCH_ONLY").ok();
    let runs = |figure: &str| only.as_deref().is_none_or(|only| only == figure);
    let iterations: u32 = std::env::var("SCOPE_BENCH_ITERATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(if smoke { 1_000 } else { 300_000 });
    let rounds = if smoke { 1 } else { 15 };

    let mut store = Store::new(3);
    let name: Arc<str> = Arc::from("noop");
    let at = |slot| BufferRange {
        buffer: BufferId::from_parts(slot, 0),
        range: ByteRange::new(0, 16),
    };
    let read = [at(0), at(1)];
    let write = at(2);

    let null = Launching::new(
        Client::new(Null::new()).expect("null client"),
        Kernel::host("noop"),
    );
    let mut host = Host::new();
    host.register("noop", |_| Ok(()));
    let host = Launching::new(
        Client::new(host).expect("host client"),
        Kernel::host("noop"),
    );

    let (mut scope, mut core, mut reference) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        if runs("scope") {
            scope.push(time(iterations, || {
                scope_cycle(&mut store, &name, black_box(&read), black_box(write))
            }));
        }
        if runs("null") {
            core.push(time(iterations, || null.launch()));
            null.settle();
        }
        if runs("host") {
            reference.push(time(iterations, || host.launch()));
            host.settle();
        }
    }
    assert!(store.failures.is_empty(), "the success path holds nothing");
    if only.is_some() {
        println!("launch_path: {only:?} alone, for a profiler");
        return;
    }
    let null_allocations = allocations_per(1_000, || null.launch());
    null.settle();
    let host_allocations = allocations_per(1_000, || host.launch());
    host.settle();
    let ratio = |figure: &[f64]| median(figure.iter().zip(&scope).map(|(f, s)| f / s).collect());
    let (core_ratio, reference_ratio) = (ratio(&core), ratio(&reference));
    let (scope, core, reference) = (median(scope), median(core), median(reference));
    println!("launch_path: one launch, 2 reads + 1 write, median of {rounds} rounds");
    println!("  scope cycle (ExecuteScope::launching, empty body): {scope:6.1} ns");
    println!(
        "  core on the null backend (Client::launch):        {core:6.1} ns = {core_ratio:.2}x the scope cycle (target <= 2x), {null_allocations} heap allocations a launch (target 0)",
    );
    println!(
        "  reference host server (Client::launch):           {reference:6.1} ns = {reference_ratio:.2}x the scope cycle, {host_allocations} heap allocations a launch",
    );
}
