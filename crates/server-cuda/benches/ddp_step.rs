//! A data-parallel training step: the gradient all-reduced in buckets
//! while the backward pass still runs, on four schedules of the same
//! work.
//!
//! Each rank runs `layers` `fill` kernels (a layer's backward, writing its
//! gradient), last layer first; as each bucket of `layers / buckets`
//! layers is written, the bucket is all-reduced in place; then the
//! optimizer adds each bucket to its part of the weights (`accumulate`).
//! Each bucket is a buffer of its own, as DDP's are.
//!
//! 1. **raw**: the same kernels through cudarc and the same NCCL calls
//!    straight through the library, as PyTorch DDP schedules them: a
//!    communication stream ordered after each bucket by an event, the
//!    optimizer ordered after the last call by another. No scope.
//! 2. **scope**: `Client::launch` and `Rank::all_reduce`.
//! 3. **scope before**: the same, over `Group::over_device_draining`, the
//!    schedule rounds had before they ran on communication streams: the
//!    compute stream drained before every round, the call on it.
//! 4. **scope, joined alone**: the same, each rank joined alone
//!    (`Rank::join`), as ranks in separate processes: every round is
//!    decided by a ballot through NCCL.
//!
//! Reported per step: wall time of `steps` steps ended by one read, each
//! schedule's time over raw's, and the compute stream's drains per step
//! ([`Client::drains`], the read excluded). `tests/mock_ddp_step.rs` runs
//! it over the timed mock, where kernels and collectives take modelled
//! time; this `main` runs it on a GPU with one rank (a local all-reduce
//! overlapped with compute).
//!
//! Without a device it prints `skipped: no cuda device (...)` and exits 0
//! (1 under `SCOPE_REQUIRE=cuda`).

use std::ffi::c_void;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use scope_core::collective::device::DeviceCollectives;
use scope_core::collective::{Element, Group, Rank, Reduce};
use scope_core::{Binding, Client, Dispatch, Error, Kernel};
use scope_native::nccl::{NcclLibrary, NcclTable, RawComm, UniqueId};
use server_cuda::Cuda;

/// A layer's backward: its gradient, every word `value`.
const FILL: &str = r#"
struct FillArgs { unsigned int n; unsigned int value; };
extern "C" __global__ void fill(unsigned int* out, FillArgs a) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < a.n) out[i] = a.value;
}
"#;

/// The optimizer: the weights plus the reduced gradient.
const ACCUMULATE: &str = r#"
struct N { unsigned int n; };
extern "C" __global__ void accumulate(const unsigned int* by, unsigned int* acc, N p) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) acc[i] += by[i];
}
"#;

const BLOCK: u32 = 256;

/// The work of one run.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Layers of the backward pass; divisible by every bucket count.
    pub layers: usize,
    /// Gradient words per layer.
    pub words: u32,
    /// Steps timed together.
    pub steps: usize,
}

/// Which schedule runs the work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// cudarc and NCCL, no scope.
    Raw,
    /// Rounds on communication streams.
    Scope,
    /// Rounds that drain the compute stream first.
    ScopeBefore,
    /// Ranks joined alone, deciding by ballot.
    ScopeAlone,
}

impl Schedule {
    /// All four, in the order the table prints them.
    pub const ALL: [Schedule; 4] = [
        Schedule::Raw,
        Schedule::Scope,
        Schedule::ScopeBefore,
        Schedule::ScopeAlone,
    ];

    /// As the table names it.
    pub fn name(self) -> &'static str {
        match self {
            Schedule::Raw => "raw",
            Schedule::Scope => "scope",
            Schedule::ScopeBefore => "scope before",
            Schedule::ScopeAlone => "scope, joined alone",
        }
    }
}

/// One schedule's figures.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    /// Wall time per step.
    pub time: Duration,
    /// Compute-stream drains per step, the closing read excluded.
    pub drains: f64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct FillArgs {
    n: u32,
    value: u32,
}
// SAFETY: `#[repr(C)]`, two `u32`s, as the kernel's `FillArgs`.
unsafe impl DeviceRepr for FillArgs {}

#[repr(C)]
#[derive(Clone, Copy)]
struct N {
    n: u32,
}
// SAFETY: `#[repr(C)]`, one `u32`, as the kernel's `N`.
unsafe impl DeviceRepr for N {}

fn kernels() -> (Kernel, Kernel) {
    // SAFETY: both guard every access with `n`, and every launch here
    // passes its bindings' own length.
    unsafe {
        (
            Kernel::cuda("fill", FILL).block([BLOCK, 1, 1]),
            Kernel::cuda("accumulate", ACCUMULATE).block([BLOCK, 1, 1]),
        )
    }
}

/// What every rank's weights hold after `steps` steps over `ranks`.
fn expected(ranks: usize, steps: usize) -> u32 {
    let sum: usize = (1..=ranks).sum();
    (sum * steps) as u32
}

/// Run `schedule` over `clients` (one per rank, each its own device) with
/// the gradient in `buckets` buckets; panics if a weight comes out wrong.
pub fn step(schedule: Schedule, clients: &[Client<Cuda>], shape: Shape, buckets: usize) -> Step {
    assert!(
        shape.layers.is_multiple_of(buckets),
        "{buckets} buckets of {} layers",
        shape.layers
    );
    match schedule {
        Schedule::Raw => raw(clients, shape, buckets),
        Schedule::Scope | Schedule::ScopeBefore | Schedule::ScopeAlone => {
            scoped(schedule, clients, shape, buckets)
        }
    }
}

fn scoped(schedule: Schedule, clients: &[Client<Cuda>], shape: Shape, buckets: usize) -> Step {
    let deadline = Duration::from_secs(60);
    let start = Barrier::new(clients.len());
    let times = match schedule {
        Schedule::ScopeAlone => each_joined_alone(clients, deadline, |rank| {
            rank_step(&rank, shape, buckets, &start)
        }),
        _ => {
            let group = match schedule {
                Schedule::ScopeBefore => Group::over_device_draining(clients.to_vec(), deadline),
                _ => Group::over_device(clients.to_vec(), deadline),
            }
            .expect("a group over NCCL");
            group.run(|rank| rank_step(&rank, shape, buckets, &start))
        }
    };
    summarize(&times, shape.steps)
}

/// `f` of rank `i` joined alone on `clients[i]`, each on a thread of its
/// own, as ranks in separate processes join.
fn each_joined_alone<R: Send>(
    clients: &[Client<Cuda>],
    deadline: Duration,
    f: impl Fn(Rank<Cuda>) -> R + Sync,
) -> Vec<R> {
    let identity = <Cuda as DeviceCollectives>::identity().expect("an NCCL id");
    let ranks = clients.len();
    let (f, identity) = (&f, &identity);
    std::thread::scope(|scope| {
        let threads: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(i, client)| {
                scope.spawn(move || {
                    let rank = Rank::join(client.clone(), identity, i, ranks, deadline)
                        .expect("every rank joins");
                    f(rank)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("rank"))
            .collect()
    })
}

/// One rank's timed steps: its time, and its compute stream's drains.
fn rank_step(rank: &Rank<Cuda>, shape: Shape, buckets: usize, start: &Barrier) -> (Duration, u64) {
    let (fill, accumulate) = kernels();
    let ranks = rank.ranks();
    let per_bucket = shape.layers / buckets;
    let layer_bytes = u64::from(shape.words) * 4;
    {
        let c = rank.client();
        let words = shape.words * shape.layers as u32;
        let bucket_words = shape.words * per_bucket as u32;
        // A buffer per bucket, as DDP's buckets are: the server orders
        // streams per buffer, so a bucket still being reduced never holds
        // back the backward pass writing the next one.
        let grads: Vec<_> = (0..buckets)
            .map(|_| {
                c.try_allocate(u64::from(bucket_words) * 4)
                    .expect("gradient")
            })
            .collect();
        let weights = c.upload(&vec![0u8; words as usize * 4]).expect("weights");
        let value = rank.index() as u32 + 1;
        let scalars: Vec<u8> = [shape.words, value]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let bucket_bytes = u64::from(bucket_words) * 4;
        let one_step = || {
            for b in (0..buckets).rev() {
                for l in (0..per_bucket).rev() {
                    let layer =
                        grads[b].slice(layer_bytes * l as u64..layer_bytes * (l as u64 + 1));
                    c.launch(
                        &fill,
                        &[layer.write()],
                        &scalars,
                        Dispatch::linear(shape.words.div_ceil(BLOCK)),
                    )
                    .expect("backward");
                }
                rank.all_reduce(grads[b].all(), grads[b].all(), Element::U32, Reduce::Sum)
                    .expect("all-reduce");
            }
            for (b, grad) in grads.iter().enumerate() {
                let part = weights.slice(bucket_bytes * b as u64..bucket_bytes * (b as u64 + 1));
                c.launch(
                    &accumulate,
                    &[Binding::read(grad), part.read_write()],
                    &bucket_words.to_le_bytes(),
                    Dispatch::linear(bucket_words.div_ceil(BLOCK)),
                )
                .expect("optimizer");
            }
        };
        // One step untimed: compiles, allocates, warms the pools.
        one_step();
        c.read(&weights).expect("read");
        c.write(&weights, &vec![0u8; words as usize * 4])
            .expect("weights");
        start.wait();
        let drains = c.drains();
        let began = Instant::now();
        for _ in 0..shape.steps {
            one_step();
        }
        let drained = c.drains() - drains;
        let read = c.read(&weights).expect("read");
        let time = began.elapsed();
        let got = words_of(&read);
        let want = expected(ranks, shape.steps);
        assert!(
            got.iter().all(|&w| w == want),
            "rank {}: weights {:?}.., not {}",
            rank.index(),
            &got[..4],
            expected(ranks, shape.steps)
        );
        (time, drained)
    }
}

/// Little-endian words, converted after the clock stopped.
fn words_of(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

/// The slowest rank's time per step, and the ranks' mean drains per step.
fn summarize(times: &[(Duration, u64)], steps: usize) -> Step {
    let slowest = times.iter().map(|(t, _)| *t).max().unwrap_or_default();
    let drains = times.iter().map(|(_, d)| *d as f64).sum::<f64>() / times.len() as f64;
    Step {
        time: slowest / steps as u32,
        drains: drains / steps as f64,
    }
}

/// NCCL for the raw schedule, opened under both its names as the server
/// opens it (cudarc's loader never tries `libnccl.so.2`).
fn nccl() -> NcclTable {
    static NCCL: std::sync::OnceLock<Result<NcclLibrary, String>> = std::sync::OnceLock::new();
    let names = ["libnccl.so".to_owned(), "libnccl.so.2".to_owned()];
    // SAFETY: both names are NCCL's.
    let loaded = NCCL.get_or_init(|| unsafe { NcclLibrary::open_first("nccl", &names) });
    NcclLibrary::table_of("nccl", loaded).expect("NCCL for the raw schedule")
}

/// A new `ncclUniqueId`.
fn unique_id(table: &NcclTable) -> UniqueId {
    let mut id = UniqueId([0; 128]);
    // SAFETY: `id` is a writable `ncclUniqueId`.
    let made = unsafe { (table.get_unique_id)(&mut id) };
    assert_eq!(made, 0, "ncclGetUniqueId");
    id
}

/// Rank `rank` of `ranks` joins `id`'s communicator on `client`'s device,
/// bound to this thread, with cudarc's event tracking off: the raw
/// schedules order their buffers by their own events, as a runtime does.
fn join_raw(
    table: &NcclTable,
    client: &Client<Cuda>,
    id: &UniqueId,
    (rank, ranks): (usize, usize),
) -> (Arc<CudaContext>, RawComm) {
    let ctx: Arc<CudaContext> = client.with_backend(|cuda| cuda.context().clone());
    ctx.bind_to_thread().expect("bind");
    // SAFETY: every buffer of a raw schedule is ordered by its events.
    unsafe { ctx.disable_event_tracking() };
    let mut comm: RawComm = std::ptr::null_mut();
    // SAFETY: a blocking init (no config) of this rank, once, on its own
    // thread and device.
    let joined = unsafe {
        (table.comm_init_rank_config)(
            &mut comm,
            ranks as i32,
            *id,
            rank as i32,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(joined, 0, "ncclCommInitRankConfig");
    (ctx, comm)
}

/// `ncclUint32`, `ncclSum`.
const NCCL_UINT32: i32 = 3;
const NCCL_SUM: i32 = 0;

fn raw(clients: &[Client<Cuda>], shape: Shape, buckets: usize) -> Step {
    let ranks = clients.len();
    let table = nccl();
    let id = unique_id(&table);
    let arch = clients[0]
        .with_backend(|b| b.nvrtc_arch().map(str::to_owned))
        .expect("NVRTC");
    let compile = |source: &str| {
        compile_ptx_with_opts(
            source,
            CompileOptions {
                options: vec![format!("--gpu-architecture={arch}")],
                ..Default::default()
            },
        )
        .expect("nvrtc")
    };
    let (fill_ptx, accumulate_ptx) = (compile(FILL), compile(ACCUMULATE));
    let per_bucket = shape.layers / buckets;
    let words = shape.words as usize * shape.layers;
    let start = Barrier::new(ranks);
    let times: Vec<(Duration, u64)> = std::thread::scope(|scope| {
        let threads: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(rank, client)| {
                let (id, start) = (&id, &start);
                let (fill_ptx, accumulate_ptx) = (fill_ptx.clone(), accumulate_ptx.clone());
                scope.spawn(move || {
                    let (ctx, comm) = join_raw(&table, client, id, (rank, ranks));
                    let compute = ctx.new_stream().expect("stream");
                    let comm_stream = ctx.new_stream().expect("stream");
                    let fill: CudaFunction = ctx
                        .load_module(fill_ptx)
                        .and_then(|m| m.load_function("fill"))
                        .expect("fill");
                    let accumulate: CudaFunction = ctx
                        .load_module(accumulate_ptx)
                        .and_then(|m| m.load_function("accumulate"))
                        .expect("accumulate");
                    let layer_words = shape.words as usize;
                    let bucket_words = layer_words * per_bucket;
                    let mut grads: Vec<CudaSlice<u32>> = (0..buckets)
                        .map(|_| compute.alloc_zeros::<u32>(bucket_words).expect("gradient"))
                        .collect();
                    let mut weights = compute.alloc_zeros::<u32>(words).expect("weights");
                    let config = |n: usize| LaunchConfig {
                        grid_dim: ((n as u32).div_ceil(BLOCK), 1, 1),
                        block_dim: (BLOCK, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    let args = FillArgs {
                        n: shape.words,
                        value: rank as u32 + 1,
                    };
                    let part = N {
                        n: bucket_words as u32,
                    };
                    let one_step = |grads: &mut [CudaSlice<u32>], weights: &mut CudaSlice<u32>| {
                        for b in (0..buckets).rev() {
                            for l in (0..per_bucket).rev() {
                                let mut out =
                                    grads[b].slice_mut(l * layer_words..(l + 1) * layer_words);
                                let mut launch = compute.launch_builder(&fill);
                                launch.arg(&mut out).arg(&args);
                                // SAFETY: `fill`'s signature; the grid covers the
                                // layer's words, each bounds-checked.
                                unsafe { launch.launch(config(layer_words)) }.expect("backward");
                            }
                            let ready = compute.record_event(None).expect("event");
                            comm_stream.wait(&ready).expect("wait");
                            let (bucket, _) =
                                cudarc::driver::DevicePtr::device_ptr(&grads[b], &comm_stream);
                            // SAFETY: the bucket is live on this device; the
                            // stream waits for the bucket's writers.
                            let called = unsafe {
                                (table.all_reduce)(
                                    bucket as *const c_void,
                                    bucket as *mut c_void,
                                    bucket_words,
                                    NCCL_UINT32,
                                    NCCL_SUM,
                                    comm,
                                    comm_stream.cu_stream().cast(),
                                )
                            };
                            assert_eq!(called, 0, "ncclAllReduce");
                        }
                        let reduced = comm_stream.record_event(None).expect("event");
                        compute.wait(&reduced).expect("wait");
                        for (b, grad) in grads.iter().enumerate() {
                            let mut into =
                                weights.slice_mut(b * bucket_words..(b + 1) * bucket_words);
                            let mut launch = compute.launch_builder(&accumulate);
                            launch.arg(grad).arg(&mut into).arg(&part);
                            // SAFETY: `accumulate`'s signature over one bucket.
                            unsafe { launch.launch(config(bucket_words)) }.expect("optimizer");
                        }
                    };
                    one_step(&mut grads, &mut weights);
                    compute.synchronize().expect("sync");
                    compute.memset_zeros(&mut weights).expect("zero");
                    start.wait();
                    let began = Instant::now();
                    for _ in 0..shape.steps {
                        one_step(&mut grads, &mut weights);
                    }
                    // The mock copies to pageable memory without waiting,
                    // where CUDA would wait: the sync waits for the step.
                    compute.synchronize().expect("sync");
                    let got = compute.clone_dtoh(&weights).expect("read");
                    let time = began.elapsed();
                    let want = expected(ranks, shape.steps);
                    assert!(
                        got.iter().all(|&w| w == want),
                        "raw rank {rank}: weights {:?}..",
                        &got[..4]
                    );
                    // SAFETY: this rank's communicator, idle after the sync.
                    unsafe { (table.comm_destroy)(comm) };
                    (time, 0)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("rank"))
            .collect()
    });
    summarize(&times, shape.steps)
}

/// The host time of one `all_reduce` of `bytes` with every rank arriving
/// together: the median over `trials` of the slowest rank's call; ranks
/// joined alone (`alone`) or in one group.
pub fn call_time(clients: &[Client<Cuda>], bytes: u64, trials: usize, alone: bool) -> Duration {
    let deadline = Duration::from_secs(60);
    let start = Together::new(clients.len());
    let calls = |rank: Rank<Cuda>| {
        let c = rank.client();
        let data = c.upload(&vec![1u8; bytes as usize]).expect("upload");
        let mut times = Vec::with_capacity(trials);
        for _ in 0..=trials {
            c.sync().expect("sync");
            start.wait();
            let began = Instant::now();
            rank.all_reduce(data.all(), data.all(), Element::U32, Reduce::Max)
                .expect("all-reduce");
            times.push(began.elapsed());
        }
        c.sync().expect("sync");
        times.remove(0);
        times
    };
    let per_rank = if alone {
        each_joined_alone(clients, deadline, calls)
    } else {
        let group = Group::over_device(clients.to_vec(), deadline).expect("group");
        group.run(calls)
    };
    median_of_slowest(&per_rank, trials)
}

/// [`call_time`] for the raw `ncclAllReduce` on a communication stream.
pub fn raw_call_time(clients: &[Client<Cuda>], bytes: u64, trials: usize) -> Duration {
    let ranks = clients.len();
    let table = nccl();
    let id = unique_id(&table);
    let start = Together::new(ranks);
    let words = (bytes / 4).max(1) as usize;
    let per_rank: Vec<Vec<Duration>> = std::thread::scope(|scope| {
        let threads: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(rank, client)| {
                let (table, id, start) = (&table, &id, &start);
                scope.spawn(move || {
                    let (ctx, comm) = join_raw(table, client, id, (rank, ranks));
                    let comm_stream = ctx.new_stream().expect("stream");
                    let data = comm_stream.alloc_zeros::<u32>(words).expect("data");
                    let (at, _) = cudarc::driver::DevicePtr::device_ptr(&data, &comm_stream);
                    let mut times = Vec::with_capacity(trials + 1);
                    for _ in 0..=trials {
                        comm_stream.synchronize().expect("sync");
                        start.wait();
                        let began = Instant::now();
                        // SAFETY: `data` is live on this device, used only on
                        // this stream.
                        let called = unsafe {
                            (table.all_reduce)(
                                at as *const c_void,
                                at as *mut c_void,
                                words,
                                NCCL_UINT32,
                                NCCL_SUM,
                                comm,
                                comm_stream.cu_stream().cast(),
                            )
                        };
                        times.push(began.elapsed());
                        assert_eq!(called, 0, "ncclAllReduce");
                    }
                    comm_stream.synchronize().expect("sync");
                    drop(data);
                    // SAFETY: this rank's communicator, idle after the sync.
                    unsafe { (table.comm_destroy)(comm) };
                    times.remove(0);
                    times
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("rank"))
            .collect()
    });
    median_of_slowest(&per_rank, trials)
}

/// A barrier whose ranks leave together: each spins (yielding) on the
/// count, where [`Barrier`] wakes its sleepers one by one, tens of
/// microseconds apart, which a meeting of ranks would time as its own.
struct Together {
    ranks: usize,
    arrived: std::sync::atomic::AtomicUsize,
}

impl Together {
    fn new(ranks: usize) -> Self {
        Self {
            ranks,
            arrived: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Wait until every rank arrived at this trial's start.
    fn wait(&self) {
        use std::sync::atomic::Ordering;
        let trial = self.arrived.fetch_add(1, Ordering::AcqRel) / self.ranks;
        while self.arrived.load(Ordering::Acquire) < (trial + 1) * self.ranks {
            std::thread::yield_now();
        }
    }
}

/// The median over `trials` of the slowest rank's time.
fn median_of_slowest(per_rank: &[Vec<Duration>], trials: usize) -> Duration {
    let mut slowest: Vec<Duration> = (0..trials)
        .map(|t| {
            per_rank
                .iter()
                .map(|times| times[t])
                .max()
                .unwrap_or_default()
        })
        .collect();
    slowest.sort();
    slowest[slowest.len() / 2]
}

fn main() {
    let client = match server_cuda::client() {
        Ok(client) => client,
        Err(Error::BackendUnavailable { reason, .. }) => {
            println!("skipped: no cuda device ({reason})");
            if scope_test::required("cuda") {
                eprintln!("SCOPE_REQUIRE names cuda: a missing device is a failure");
                std::process::exit(1);
            }
            return;
        }
        Err(other) => {
            eprintln!("cuda is present but failed to start: {other}");
            std::process::exit(1);
        }
    };
    if let Err(why) = server_cuda::load_nccl() {
        println!("skipped: no NCCL ({why})");
        return;
    }
    println!("device: {}", client.describe());
    let smoke = std::env::var_os("SCOPE_BENCH_SMOKE").is_some();
    // One rank: a local all-reduce (a copy on the device) overlapped with
    // kernels that each write 64 MiB.
    let shape = Shape {
        layers: 32,
        words: if smoke { 1 << 10 } else { 16 << 20 },
        steps: if smoke { 1 } else { 10 },
    };
    let clients = [client];
    println!(
        "ddp_step on one rank: {} layers of {} MiB, {} steps per figure",
        shape.layers,
        (u64::from(shape.words) * 4) >> 20,
        shape.steps
    );
    for buckets in [1, 8, 32] {
        table_row(&clients, shape, buckets);
    }
}

/// One row: every schedule at `buckets`, side by side.
pub fn table_row(clients: &[Client<Cuda>], shape: Shape, buckets: usize) {
    let steps: Vec<(Schedule, Step)> = Schedule::ALL
        .iter()
        .map(|&s| (s, step(s, clients, shape, buckets)))
        .collect();
    let raw = steps[0].1.time.as_secs_f64();
    let cells: Vec<String> = steps
        .iter()
        .map(|(s, step)| {
            format!(
                "{} {:.2} ms ({:.3}× raw, {:.1} drains/step)",
                s.name(),
                step.time.as_secs_f64() * 1e3,
                step.time.as_secs_f64() / raw,
                step.drains
            )
        })
        .collect();
    println!("  B = {buckets:>2}: {}", cells.join("; "));
}
