//! Launch overhead and capture replay, against raw wgpu in the same process.
//!
//! `cargo bench -p server-wgpu` (run with `LP_NUM_THREADS=0` on lavapipe /
//! llvmpipe; the bench sets it when unset). `SCOPE_WGPU_BACKEND` picks the
//! API; by default both Vulkan and GL are measured when present.
//!
//! 1. **Launch overhead**: 10,000 trivial launches then one sync through the
//!    server, against raw wgpu encoding the same dispatches (same WGSL, same
//!    layout, buffers of the same size and usages as the server's) in one
//!    encoder, one compute pass and one submit. Two shapes: every launch
//!    passes the same scalars (the server shares one arena slot and skips
//!    the redundant bind, as raw binds once), and every launch passes
//!    different scalars (a dynamic offset per dispatch on both sides).
//!    Target: server / raw ≤ 1.15.
//! 2. **Capture replay**: the same 64 launches issued eagerly then synced,
//!    against one replay of a graph captured from them, then synced.
//! 3. **Allocation**: a pooled allocate + free through the server against a
//!    raw `create_buffer` + drop, and the cost of one error-scope round trip
//!    (why a dispatch into an open pass does not push scopes).
//!
//! Each figure is the median of several timed rounds after a warm-up. A
//! ratio is the median of each round's own ratio: the server's loop and
//! raw wgpu's run back to back in every round, so a machine that speeds
//! up or slows down between rounds moves both halves of a round alike.
//!
//! `SCOPE_BENCH_ONLY=server-same|server-distinct|raw-same|raw-distinct`
//! runs that one loop of the launch overhead for a few seconds and prints
//! nothing else, for a sampling profiler (`perf record`) to see that path
//! alone; `SCOPE_BENCH_SECONDS` sets how long (5 by default). Under
//! `valgrind --tool=callgrind`, two runs of different lengths give one
//! launch's instructions by difference, over the rounds each printed.

use std::time::{Duration, Instant};

use scope_core::{Binding, Client, Dispatch, Kernel};
use server_wgpu::{Api, Options, Wgpu};

const LAUNCHES: u32 = 10_000;
const ROUNDS: usize = 15;
const WINDOW: u32 = 64;

const TRIVIAL: &str = "
struct Params { n: u32, value: u32 }
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@group(0) @binding(1) var<storage, read> params: Params;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < params.n) { out[id.x] = params.value; }
}
";

fn scalars(n: u32, value: u32) -> [u8; 8] {
    let mut b = [0; 8];
    b[..4].copy_from_slice(&n.to_le_bytes());
    b[4..].copy_from_slice(&value.to_le_bytes());
    b
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn per(d: Duration, n: u32) -> f64 {
    d.as_secs_f64() * 1e6 / f64::from(n)
}

/// Raw wgpu: the same shader with the same explicit layout, one encoder,
/// one pass, one submit.
struct Raw {
    device: wgpu::Device,
    queue: wgpu::Queue,
    pipeline: wgpu::ComputePipeline,
    group: wgpu::BindGroup,
    params: wgpu::Buffer,
    stride: u32,
}

impl Raw {
    fn new(c: &Client<Wgpu>) -> Self {
        c.with_backend(|b| {
            let (device, queue) = b.raw();
            let (device, queue) = (device.clone(), queue.clone());
            let stride = b.limits().min_storage_buffer_offset_alignment.max(8);
            let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("raw"),
                source: wgpu::ShaderSource::Wgsl(TRIVIAL.into()),
            });
            let storage = |binding, read_only, dynamic| wgpu::BindGroupLayoutEntry {
                binding,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only },
                    has_dynamic_offset: dynamic,
                    min_binding_size: None,
                },
                count: None,
            };
            let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: None,
                entries: &[storage(0, false, false), storage(1, true, true)],
            });
            let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: None,
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
            let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("raw"),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
            // The usages the server gives its buffers: every allocation's
            // (bound, copied both ways — a result is read back through a
            // copy — and read as dispatch counts) and the scalar arena's.
            // They are not free: on llvmpipe-GL a raw dispatch of this
            // kernel takes some 4% more instructions (callgrind) when its
            // output can be copied, so a baseline without them would charge
            // the server for buffers any runtime must be able to read back.
            let out = device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: 256,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST
                    | wgpu::BufferUsages::INDIRECT,
                mapped_at_creation: false,
            });
            let params = device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: u64::from(stride) * u64::from(LAUNCHES),
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::UNIFORM
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let mut image = vec![0u8; params.size() as usize];
            for i in 0..LAUNCHES as usize {
                let at = i * stride as usize;
                image[at..at + 8].copy_from_slice(&scalars(64, i as u32));
            }
            queue.write_buffer(&params, 0, &image);
            let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &layout,
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: out.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &params,
                            offset: 0,
                            size: std::num::NonZeroU64::new(8),
                        }),
                    },
                ],
            });
            Self {
                device,
                queue,
                pipeline,
                group,
                params,
                stride,
            }
        })
    }

    /// `LAUNCHES` dispatches in one encoder and pass, one submit, waited.
    fn run(&self, distinct: bool) -> Duration {
        let start = Instant::now();
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &self.group, &[0]);
            for i in 0..LAUNCHES {
                if distinct {
                    pass.set_bind_group(0, &self.group, &[i * self.stride]);
                }
                pass.dispatch_workgroups(1, 1, 1);
            }
        }
        let index = self.queue.submit([encoder.finish()]);
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            })
            .expect("poll");
        let _ = &self.params;
        start.elapsed()
    }
}

fn server_run(
    c: &Client<Wgpu>,
    kernel: &Kernel,
    out: &scope_core::Buffer,
    distinct: bool,
) -> Duration {
    let start = Instant::now();
    for i in 0..LAUNCHES {
        let value = if distinct { i } else { 7 };
        c.launch(
            kernel,
            &[Binding::write(out)],
            &scalars(64, value),
            Dispatch::linear(1),
        )
        .expect("launch");
    }
    c.sync().expect("sync");
    start.elapsed()
}

fn launch_overhead(c: &Client<Wgpu>) {
    let kernel = Kernel::wgsl("trivial", TRIVIAL);
    let out = c.allocate(256).expect("allocate");
    let raw = Raw::new(c);
    for distinct in [false, true] {
        // Warm up both paths (pipelines, bind groups, arenas, lavapipe's JIT).
        server_run(c, &kernel, &out, distinct);
        raw.run(distinct);
        let mut server = Vec::new();
        let mut baseline = Vec::new();
        for _ in 0..ROUNDS {
            server.push(server_run(c, &kernel, &out, distinct));
            baseline.push(raw.run(distinct));
        }
        let mut ratios: Vec<f64> = server
            .iter()
            .zip(&baseline)
            .map(|(s, r)| s.as_secs_f64() / r.as_secs_f64())
            .collect();
        ratios.sort_by(f64::total_cmp);
        let (s, r) = (median(server), median(baseline));
        println!(
            "  launch overhead ({} scalars): server {:.3} µs/launch, raw wgpu {:.3} µs/dispatch, server/raw = {:.3}",
            if distinct { "distinct" } else { "same" },
            per(s, LAUNCHES),
            per(r, LAUNCHES),
            ratios[ratios.len() / 2]
        );
    }
}

fn capture_replay(c: &Client<Wgpu>) {
    let kernel = Kernel::wgsl("trivial", TRIVIAL);
    let out = c.allocate(256).expect("allocate");
    let eager = || {
        let start = Instant::now();
        for i in 0..WINDOW {
            c.launch(
                &kernel,
                &[Binding::write(&out)],
                &scalars(64, i),
                Dispatch::linear(1),
            )
            .expect("launch");
        }
        c.sync().expect("sync");
        start.elapsed()
    };
    let capture = c.begin_capture().expect("capture");
    for i in 0..WINDOW {
        c.launch(
            &kernel,
            &[Binding::write(&out)],
            &scalars(64, i),
            Dispatch::linear(1),
        )
        .expect("launch");
    }
    let graph = c.end_capture(capture).expect("seal");
    let replay = || {
        let start = Instant::now();
        c.replay(&graph).expect("replay");
        c.sync().expect("sync");
        start.elapsed()
    };
    for _ in 0..20 {
        eager();
        replay();
    }
    let mut e = Vec::new();
    let mut r = Vec::new();
    for _ in 0..200 {
        e.push(eager());
        r.push(replay());
    }
    let (e, r) = (median(e), median(r));
    println!(
        "  capture: {WINDOW} launches eager {:.1} µs, one replay {:.1} µs (sync included), replay/eager = {:.3}",
        e.as_secs_f64() * 1e6,
        r.as_secs_f64() * 1e6,
        r.as_secs_f64() / e.as_secs_f64()
    );
    c.destroy_graph(&graph).expect("destroy");
}

fn allocation(c: &Client<Wgpu>) {
    const N: u32 = 2000;
    let size = 64 << 10;
    drop(c.allocate(size).expect("allocate"));
    let start = Instant::now();
    for _ in 0..N {
        drop(c.allocate(size).expect("allocate"));
    }
    let pooled = start.elapsed();
    let (raw, scope) = c.with_backend(|b| {
        let (device, _) = b.raw();
        let start = Instant::now();
        for _ in 0..N {
            drop(device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }));
        }
        let raw = start.elapsed();
        let start = Instant::now();
        for _ in 0..N {
            let guards = [
                device.push_error_scope(wgpu::ErrorFilter::OutOfMemory),
                device.push_error_scope(wgpu::ErrorFilter::Internal),
                device.push_error_scope(wgpu::ErrorFilter::Validation),
            ];
            for guard in guards.into_iter().rev() {
                drop(pollster::block_on(guard.pop()));
            }
        }
        (raw, start.elapsed())
    });
    println!(
        "  allocation of 64 KiB: pooled allocate+free {:.3} µs, raw create_buffer+drop {:.3} µs; \
         three error scopes pushed and popped {:.3} µs",
        per(pooled, N),
        per(raw, N),
        per(scope, N)
    );
}

/// A one-workgroup launch then a read of its 256-byte output, one after
/// the other: the latency a runtime that reads every result sees. A read
/// waits for the stream with the server's lock released, then copies.
fn read_round_trip(c: &Client<Wgpu>) {
    const N: u32 = 500;
    let kernel = Kernel::wgsl("trivial", TRIVIAL);
    let out = c.allocate(256).expect("allocate");
    let once = |i: u32| {
        c.launch(
            &kernel,
            &[Binding::write(&out)],
            &scalars(64, i),
            Dispatch::linear(1),
        )
        .expect("launch");
        c.read(&out).expect("read")
    };
    once(0);
    let mut samples = Vec::new();
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for i in 0..N {
            std::hint::black_box(once(i));
        }
        samples.push(start.elapsed());
    }
    println!(
        "  read round trip (launch, then read 256 bytes): {:.1} µs",
        per(median(samples), N)
    );
}

/// One loop of the launch overhead, alone, for a profiler: about `seconds`
/// of it.
fn only(c: &Client<Wgpu>, which: &str, seconds: f64) {
    let kernel = Kernel::wgsl("trivial", TRIVIAL);
    let out = c.allocate(256).expect("allocate");
    let raw = Raw::new(c);
    let distinct = which.ends_with("distinct");
    let start = Instant::now();
    let mut rounds = 0;
    while start.elapsed().as_secs_f64() < seconds {
        if which.starts_with("server") {
            server_run(c, &kernel, &out, distinct);
        } else {
            raw.run(distinct);
        }
        rounds += 1;
    }
    println!("  {which}: {rounds} rounds of {LAUNCHES} launches");
}

fn main() {
    if std::env::var_os("LP_NUM_THREADS").is_none() {
        // SAFETY: the first statement of `main`, before any other thread
        // exists, so nothing reads the environment concurrently.
        unsafe { std::env::set_var("LP_NUM_THREADS", "0") };
    }
    let apis: Vec<Api> = match Options::from_env() {
        Ok(Options { api: Some(api), .. }) => vec![api],
        _ => vec![Api::Vulkan, Api::Gl],
    };
    for api in apis {
        let options = Options {
            api: Some(api),
            ..Options::from_env().unwrap_or_default()
        };
        let c = match server_wgpu::client_with(&options) {
            Ok(c) => c,
            Err(e) => {
                println!("{}: skipped ({e})", api.name());
                continue;
            }
        };
        println!(
            "{} ({}), batch limit {}:",
            api.name(),
            c.describe(),
            server_wgpu::BATCH_LIMIT
        );
        if let Ok(which) = std::env::var("SCOPE_BENCH_ONLY") {
            let seconds = std::env::var("SCOPE_BENCH_SECONDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(5.0);
            only(&c, &which, seconds);
            continue;
        }
        launch_overhead(&c);
        capture_replay(&c);
        allocation(&c);
        read_round_trip(&c);
    }
}
