//! What the scope costs on the CUDA launch path, and what a graph saves.
//!
//! 1. **Launch overhead**: the same `add` kernel launched through the scope
//!    server (`Client::launch`: handle resolution, taint checks, the write
//!    scope, the backend's parameter marshalling) and through cudarc's own
//!    launch builder, on the same cudarc stream. Only issue time is timed:
//!    batches of 256 launches, each followed by an untimed sync, so the
//!    driver's queue never fills and the figure is host overhead, not GPU
//!    throughput. Target: scope ≤ 1.15 × raw.
//! 2. **Graph replay**: 64 launches captured into a CUDA graph and replayed,
//!    against the same 64 launched eagerly; end-to-end (issue + sync) time,
//!    reported as the saving per launch.
//!
//! Without a device (or without NVRTC) it prints `skipped: no cuda device
//! (...)` and exits 0 (1 under `SCOPE_REQUIRE=cuda`). With
//! `SCOPE_BENCH_SMOKE` set it runs a few iterations only. `tests/mock_bench.rs`
//! runs [`run`] at that scale against the mock driver, so the bench's own
//! code has run before a GPU minute is spent on it (its figures there mean
//! nothing).

use std::time::{Duration, Instant};

use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use scope_core::{Binding, Client, Dispatch, Error, Kernel};
use server_cuda::Cuda;

const ADD: &str = r#"
struct N { unsigned int n; };
extern "C" __global__ void add(const unsigned int* a, const unsigned int* b, unsigned int* out, N p) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) out[i] = a[i] + b[i];
}
"#;

const WORDS: u32 = 256;
const BATCH: usize = 256;

/// How many times each measurement repeats.
#[derive(Clone, Copy, Debug)]
pub struct Scale {
    /// Batches of `BATCH` launches per trial of the launch-overhead figure.
    pub batches: usize,
    /// Trials per figure; the median is reported.
    pub trials: usize,
    /// Eager rounds and replays per trial of the graph figure.
    pub rounds: usize,
}

impl Scale {
    /// What `cargo bench` measures.
    pub const FULL: Scale = Scale {
        batches: 40,
        trials: 7,
        rounds: 200,
    };
    /// Enough to run every line once or twice.
    pub const SMOKE: Scale = Scale {
        batches: 1,
        trials: 1,
        rounds: 2,
    };
}

#[repr(C)]
#[derive(Clone, Copy)]
struct N {
    n: u32,
}

// SAFETY: a plain `#[repr(C)]` struct of one `u32`, matching the kernel's
// `struct N`.
unsafe impl DeviceRepr for N {}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
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
    let Some(arch) = client.with_backend(|b| b.nvrtc_arch().map(str::to_owned)) else {
        println!(
            "skipped: no cuda device (a device is present but NVRTC is not; the bench compiles CUDA C++)"
        );
        if scope_test::required("cuda") {
            std::process::exit(1);
        }
        return;
    };
    println!("device: {}", client.describe());
    let scale = if std::env::var_os("SCOPE_BENCH_SMOKE").is_some() {
        Scale::SMOKE
    } else {
        Scale::FULL
    };
    run(&client, &arch, scale);
}

/// Both figures, printed, on `c` whose NVRTC targets `arch`.
pub fn run(c: &Client<Cuda>, arch: &str, scale: Scale) {
    launch_overhead(c, arch, scale);
    graph_replay(c, scale);
}

fn launch_overhead(c: &Client<Cuda>, arch: &str, scale: Scale) {
    // SAFETY: `ADD` guards every access with `n`, and every launch here
    // passes the bindings' own length.
    let kernel = unsafe { Kernel::cuda("add", ADD) }.block([64, 1, 1]);
    let a = c.upload(&vec![1u8; WORDS as usize * 4]).expect("upload");
    let b = c.upload(&vec![2u8; WORDS as usize * 4]).expect("upload");
    let out = c.try_allocate(u64::from(WORDS) * 4).expect("allocate");
    let scalars = WORDS.to_le_bytes();
    let groups = Dispatch::linear(WORDS.div_ceil(64));
    c.compile(&kernel).expect("compile");

    // The baseline: cudarc's launch builder on the same stream, the same
    // source compiled the same way, its own buffers of the same size.
    let (ctx, stream) = c.with_backend(|cuda| {
        (
            cuda.context().clone(),
            cuda.raw_stream(0).expect("stream 0"),
        )
    });
    let ptx = compile_ptx_with_opts(
        ADD,
        CompileOptions {
            options: vec![format!("--gpu-architecture={arch}")],
            ..Default::default()
        },
    )
    .expect("nvrtc");
    let function: CudaFunction = ctx
        .load_module(ptx)
        .expect("module")
        .load_function("add")
        .expect("function");
    let ra = stream.alloc_zeros::<u32>(WORDS as usize).expect("alloc");
    let rb = stream.alloc_zeros::<u32>(WORDS as usize).expect("alloc");
    let mut rout = stream.alloc_zeros::<u32>(WORDS as usize).expect("alloc");
    let config = LaunchConfig {
        grid_dim: (WORDS.div_ceil(64), 1, 1),
        block_dim: (64, 1, 1),
        shared_mem_bytes: 0,
    };
    let n = N { n: WORDS };

    let scope_batch = || {
        let start = Instant::now();
        for _ in 0..BATCH {
            c.launch(
                &kernel,
                &[Binding::read(&a), Binding::read(&b), Binding::write(&out)],
                &scalars,
                groups,
            )
            .expect("launch");
        }
        let issued = start.elapsed();
        c.sync().expect("sync");
        issued
    };
    let mut raw_batch = || {
        let start = Instant::now();
        for _ in 0..BATCH {
            let mut builder = stream.launch_builder(&function);
            builder.arg(&ra).arg(&rb).arg(&mut rout).arg(&n);
            // SAFETY: the arguments match `add`'s signature: three device
            // buffers of WORDS u32s and the `N` struct; the grid covers
            // exactly WORDS threads, each bounds-checked by the kernel.
            unsafe { builder.launch(config) }.expect("raw launch");
        }
        let issued = start.elapsed();
        stream.synchronize().expect("sync");
        issued
    };
    // Warm up both paths.
    for _ in 0..4 {
        scope_batch();
        raw_batch();
    }
    let (mut scope, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..scale.trials {
        let mut s = Duration::ZERO;
        let mut r = Duration::ZERO;
        for _ in 0..scale.batches {
            s += scope_batch();
            r += raw_batch();
        }
        let launches = (BATCH * scale.batches) as f64;
        scope.push(micros(s) / launches);
        raw.push(micros(r) / launches);
    }
    let (s, r) = (median(scope), median(raw));
    println!(
        "launch overhead: scope {s:.3} µs/launch, raw cudarc {r:.3} µs/launch, ratio {:.3} (target ≤ 1.15) over {} trials of {} launches",
        s / r,
        scale.trials,
        BATCH * scale.batches
    );
}

fn graph_replay(c: &Client<Cuda>, scale: Scale) {
    const NODES: usize = 64;
    // SAFETY: `ADD` guards every access with `n`, and every launch here
    // passes the bindings' own length.
    let kernel = unsafe { Kernel::cuda("add", ADD) }.block([64, 1, 1]);
    let a = c.upload(&vec![1u8; WORDS as usize * 4]).expect("upload");
    let b = c.upload(&vec![2u8; WORDS as usize * 4]).expect("upload");
    let out = c.try_allocate(u64::from(WORDS) * 4).expect("allocate");
    let scalars = WORDS.to_le_bytes();
    let groups = Dispatch::linear(WORDS.div_ceil(64));
    let issue = || {
        for _ in 0..NODES {
            c.launch(
                &kernel,
                &[Binding::read(&a), Binding::read(&b), Binding::write(&out)],
                &scalars,
                groups,
            )
            .expect("launch");
        }
    };
    issue();
    c.sync().expect("sync");
    let capture = c.begin_capture().expect("begin capture");
    issue();
    let graph = c.end_capture(capture).expect("end capture");
    c.replay(&graph).expect("replay");
    c.sync().expect("sync");
    let (mut eager, mut replayed) = (Vec::new(), Vec::new());
    for _ in 0..scale.trials {
        let start = Instant::now();
        for _ in 0..scale.rounds {
            issue();
            c.sync().expect("sync");
        }
        eager.push(micros(start.elapsed()) / scale.rounds as f64);
        let start = Instant::now();
        for _ in 0..scale.rounds {
            c.replay(&graph).expect("replay");
            c.sync().expect("sync");
        }
        replayed.push(micros(start.elapsed()) / scale.rounds as f64);
    }
    let (e, g) = (median(eager), median(replayed));
    println!(
        "graph replay: {NODES} eager launches + sync {e:.1} µs, one {NODES}-node replay + sync {g:.1} µs, saving {:.2} µs per launch ({:.2}× faster)",
        (e - g) / NODES as f64,
        e / g
    );
    c.destroy_graph(&graph).expect("destroy");
}
