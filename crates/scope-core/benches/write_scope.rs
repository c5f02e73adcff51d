//! The success-path cycle of a write scope.
//!
//! Two figures for N = 1, 2, 4 buffers claimed over bytes 0..4096:
//!
//! - the **store cycle**, the least every write pays: mint a provisional
//!   failure, claim N buffers, release them, prune (`enter_write` +
//!   `exit_write`);
//! - the **whole `ExecuteScope`** around an empty body: the same cycle plus
//!   the pooled write set, the capture-window check and the outcome.
//!
//! Each prints ns/launch and heap allocations/launch (a counting global
//! allocator). Targets on the 2-core development machine, for the store
//! cycle: 0 allocations; at most 20, 35 and 60 ns for N = 1, 2, 4.
//!
//! `SCOPE_BENCH_SMOKE=1` runs a few iterations, to prove the bench runs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use scope_core::internals::{
    ExecuteScope, FailureStore, ScopedOutcome, Work, WorkKind, WriteScoped,
};
use scope_core::{BufferId, BufferRange, ByteRange, StreamId};

#[path = "common/store.rs"]
mod store;

use store::Store;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which
        // is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above, i.e. from the system
        // allocator, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `dealloc`, and `new_size` is the caller's to check.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn cycle(store: &mut Store, targets: &[BufferRange]) {
    let mut written = store.write_set();
    for target in targets {
        written.push(*target);
    }
    let outcome = ExecuteScope::over(store, Work::new(WorkKind::Launch, StreamId(0)), written)
        .execute(|_, written| Ok(black_box(written.len())));
    match outcome {
        ScopedOutcome::Executed(n) => {
            black_box(n);
        }
        _ => unreachable!("an empty body succeeds"),
    }
}

/// The store-level cycle alone, the least every write pays: mint, claim,
/// release, prune, with no scope, pool or body around it.
fn store_cycle(store: &mut Store, targets: &[BufferRange]) {
    let provisional = store.enter_write(targets, Work::new(WorkKind::Launch, StreamId(0)), None);
    store.exit_write(black_box(provisional), targets, None);
}

/// Best ns per call over `rounds` of `iterations`, and allocations per call.
fn measure(iterations: u64, rounds: u32, mut f: impl FnMut()) -> (f64, f64) {
    for _ in 0..1_000 {
        f();
    }
    let mut best = f64::INFINITY;
    let mut allocations = 0;
    for _ in 0..rounds {
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        let start = Instant::now();
        for _ in 0..iterations {
            f();
        }
        best = best.min(start.elapsed().as_nanos() as f64 / iterations as f64);
        allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    }
    (best, allocations as f64 / iterations as f64)
}

fn main() {
    let smoke = std::env::var_os("SCOPE_BENCH_SMOKE").is_some();
    let iterations: u64 = if smoke { 1_000 } else { 2_000_000 };
    let rounds = if smoke { 1 } else { 7 };
    println!("write_scope: the success-path cycle (mint, claim N x 0..4096, release, prune)");
    for n in [1usize, 2, 4] {
        let mut store = Store::new(n);
        let targets: Vec<BufferRange> = (0..n)
            .map(|i| BufferRange {
                buffer: BufferId::from_parts(i as u32, 0),
                range: ByteRange::new(0, 4096),
            })
            .collect();
        let targets = &targets[..];
        let (scope_ns, scope_allocs) =
            measure(iterations, rounds, || cycle(&mut store, black_box(targets)));
        assert!(
            store.failures.is_empty(),
            "the success path leaves nothing held"
        );
        let (store_ns, store_allocs) = measure(iterations, rounds, || {
            store_cycle(&mut store, black_box(targets))
        });
        assert!(
            store.failures.is_empty(),
            "the success path leaves nothing held"
        );
        let target = [20.0, 35.0, 60.0][n.trailing_zeros() as usize];
        println!(
            "  N={n}: store cycle {store_ns:5.1} ns/launch (target <= {target:.0}), \
             {store_allocs:.3} allocations/launch; whole ExecuteScope {scope_ns:5.1} ns/launch, \
             {scope_allocs:.3} allocations/launch"
        );
    }
}
