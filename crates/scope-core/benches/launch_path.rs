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
//! so a machine that slows down slows each of them alike, and each figure is
//! the median of its rounds.
//!
//! `SCOPE_BENCH_SMOKE=1` runs a few iterations, to prove the bench runs.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use scope_core::host::Host;
use scope_core::null::Null;
use scope_core::{
    Backend, Binding, BufferId, BufferRange, ByteRange, Client, Dispatch, ExecuteScope, Kernel,
    ScopedOutcome, StreamId, WriteScoped,
};

#[path = "common/store.rs"]
mod store;

use store::Store;

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
    let iterations: u32 = if smoke { 1_000 } else { 300_000 };
    let rounds = if smoke { 1 } else { 9 };

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
        scope.push(time(iterations, || {
            scope_cycle(&mut store, &name, black_box(&read), black_box(write))
        }));
        core.push(time(iterations, || null.launch()));
        null.settle();
        reference.push(time(iterations, || host.launch()));
        host.settle();
    }
    assert!(store.failures.is_empty(), "the success path holds nothing");
    let (scope, core, reference) = (median(scope), median(core), median(reference));
    println!("launch_path: one launch, 2 reads + 1 write, median of {rounds} rounds");
    println!("  scope cycle (ExecuteScope::launching, empty body): {scope:6.1} ns");
    println!(
        "  core on the null backend (Client::launch):        {core:6.1} ns = {:.2}x the scope cycle (target <= 2x)",
        core / scope
    );
    println!(
        "  reference host server (Client::launch):           {reference:6.1} ns = {:.2}x the scope cycle",
        reference / scope
    );
}
