//! What the server costs over raw Vulkan, and what capture saves.
//!
//! Run with `LP_NUM_THREADS=0 cargo bench -p server-vulkan` (lavapipe then
//! runs each dispatch inline, so the figures measure issue cost rather than
//! thread hand-off).
//!
//! 1. **Launch overhead.** 10,000 trivial launches (one workgroup of `fill`
//!    over 64 words) then one sync, through the server, against the same
//!    dispatches recorded with raw ash into one command buffer and
//!    submitted once, in the same process on the same device. The raw
//!    baseline does what a correct hand-written program must: it pushes the
//!    descriptors and puts a barrier between dispatches that write the same
//!    buffer. Target: server / raw ≤ 1.25.
//! 2. **Capture.** A 64-launch window replayed, against the same 64
//!    launches issued eagerly, per launch. Target: replay at least 3× faster.
//!
//!    Two figures: to completion (issue, then sync), and host issue time
//!    only. On lavapipe the device is the CPU, and executing a trivial
//!    dispatch with its barrier and pushed descriptors costs it about
//!    0.5 µs whoever recorded it; the eager server hides its issue cost
//!    behind that execution (batches are submitted while later launches are
//!    still being recorded), so to completion both paths are bound by the
//!    same execution and the ratio stays near 1. The host-time figure is
//!    what a replay saves, and what a real GPU, whose execution of such a
//!    dispatch is far cheaper, would see.
//!
//! Each figure is the median of several interleaved runs (best-of also
//! printed for the overhead); ratios are printed last. The machine's load
//! moves these figures a lot: run on an idle machine.

use std::time::{Duration, Instant};

use ash::vk;
use scope_core::{Binding, Client, Dispatch, Kernel};
use server_vulkan::{Config, Vulkan};

const FILL: &str = r#"
struct Params { n: u32, value: u32 }
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@group(0) @binding(1) var<storage, read> params: Params;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < params.n) { out[id.x] = params.value; }
}
"#;

const LAUNCHES: u32 = 10_000;
const WINDOW: u32 = 64;
const RUNS: usize = 9;

fn min(samples: &[Duration]) -> Duration {
    samples.iter().copied().min().unwrap_or_default()
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn scalars(n: u32, value: u32) -> Vec<u8> {
    [n, value].iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn server_launches(client: &Client<Vulkan>, kernel: &Kernel) -> Duration {
    let out = client.try_allocate(256).expect("allocate");
    client.sync().expect("sync");
    let start = Instant::now();
    for i in 0..LAUNCHES {
        client
            .launch(
                kernel,
                &[Binding::write(&out)],
                &scalars(64, i),
                Dispatch::linear(1),
            )
            .expect("launch");
    }
    client.sync().expect("sync");
    start.elapsed()
}

/// A buffer and memory made with raw ash, for the baseline.
struct RawBuffer {
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
}

fn raw_buffer(device: &ash::Device, size: u64, init: Option<&[u8]>) -> RawBuffer {
    let info = vk::BufferCreateInfo::default()
        .size(size)
        .usage(vk::BufferUsageFlags::STORAGE_BUFFER);
    // SAFETY: a valid create info on a live device.
    let buffer = unsafe { device.create_buffer(&info, None) }.expect("buffer");
    // SAFETY: the buffer was just made.
    let needs = unsafe { device.get_buffer_memory_requirements(buffer) };
    let type_index = needs.memory_type_bits.trailing_zeros();
    let alloc = vk::MemoryAllocateInfo::default()
        .allocation_size(needs.size)
        .memory_type_index(type_index);
    // SAFETY: valid allocate info; on lavapipe the one memory type is mappable.
    let memory = unsafe { device.allocate_memory(&alloc, None) }.expect("memory");
    // SAFETY: fresh memory bound at offset 0.
    unsafe { device.bind_buffer_memory(buffer, memory, 0) }.expect("bind");
    if let Some(bytes) = init {
        // SAFETY: mapping host-visible memory (lavapipe's only type) to fill
        // it before any use.
        unsafe {
            let ptr = device
                .map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())
                .expect("map");
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.cast::<u8>(), bytes.len());
            device.unmap_memory(memory);
        }
    }
    RawBuffer { buffer, memory }
}

fn raw_launches(client: &Client<Vulkan>, kernel: &Kernel) -> Duration {
    let run = |backend: &mut Vulkan| {
        let (pipeline, layout) = backend.raw_kernel(kernel).expect("pipeline");
        let raw = backend.raw().expect("the device is open");
        let device = raw.device;
        let out = raw_buffer(device, 256, None);
        // Each dispatch gets its own scalars, as each server launch does.
        let blobs: Vec<u8> = (0..LAUNCHES)
            .flat_map(|i| {
                let mut blob = scalars(64, i);
                blob.resize(16, 0);
                blob
            })
            .collect();
        let params = raw_buffer(device, blobs.len() as u64, Some(&blobs));
        let pool_info = vk::CommandPoolCreateInfo::default().queue_family_index(raw.family);
        // SAFETY: plain object creation on a live device; everything made here
        // is destroyed below after the fence says the work is done.
        unsafe {
            let pool = device.create_command_pool(&pool_info, None).expect("pool");
            let cmd = device
                .allocate_command_buffers(
                    &vk::CommandBufferAllocateInfo::default()
                        .command_pool(pool)
                        .command_buffer_count(1),
                )
                .expect("cmd")[0];
            let fence = device
                .create_fence(&vk::FenceCreateInfo::default(), None)
                .expect("fence");
            let start = Instant::now();
            device
                .begin_command_buffer(
                    cmd,
                    &vk::CommandBufferBeginInfo::default()
                        .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
                )
                .expect("begin");
            device.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, pipeline);
            let barrier = vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::SHADER_WRITE)
                .dst_access_mask(vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE);
            for i in 0..LAUNCHES {
                if i > 0 {
                    device.cmd_pipeline_barrier(
                        cmd,
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                        vk::PipelineStageFlags::COMPUTE_SHADER,
                        vk::DependencyFlags::empty(),
                        &[barrier],
                        &[],
                        &[],
                    );
                }
                let infos = [
                    vk::DescriptorBufferInfo {
                        buffer: out.buffer,
                        offset: 0,
                        range: 256,
                    },
                    vk::DescriptorBufferInfo {
                        buffer: params.buffer,
                        offset: u64::from(i) * 16,
                        range: 16,
                    },
                ];
                let write = vk::WriteDescriptorSet::default()
                    .dst_binding(0)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(&infos);
                raw.push.cmd_push_descriptor_set(
                    cmd,
                    vk::PipelineBindPoint::COMPUTE,
                    layout,
                    0,
                    &[write],
                );
                device.cmd_dispatch(cmd, 1, 1, 1);
            }
            device.end_command_buffer(cmd).expect("end");
            let cmds = [cmd];
            let submit = vk::SubmitInfo::default().command_buffers(&cmds);
            device
                .queue_submit(raw.queue, &[submit], fence)
                .expect("submit");
            device
                .wait_for_fences(&[fence], true, u64::MAX)
                .expect("wait");
            let elapsed = start.elapsed();
            device.destroy_fence(fence, None);
            device.destroy_command_pool(pool, None);
            for b in [out, params] {
                device.destroy_buffer(b.buffer, None);
                device.free_memory(b.memory, None);
            }
            elapsed
        }
    };
    // SAFETY: `run` compiles a pipeline into the backend's own cache and
    // runs work only on objects it creates (and destroys) itself; no
    // stream, memory, kernel or graph the core tracks is touched.
    unsafe { client.with_backend_mut(run) }.expect("the bench holds no other backend borrow")
}

/// (host time to issue, time until the work completed).
fn eager_window(client: &Client<Vulkan>, kernel: &Kernel, rounds: u32) -> (Duration, Duration) {
    let out = client.try_allocate(256).expect("allocate");
    client.sync().expect("sync");
    let start = Instant::now();
    for r in 0..rounds {
        for i in 0..WINDOW {
            client
                .launch(
                    kernel,
                    &[Binding::write(&out)],
                    &scalars(64, r + i),
                    Dispatch::linear(1),
                )
                .expect("launch");
        }
    }
    let issued = start.elapsed();
    client.sync().expect("sync");
    (issued, start.elapsed())
}

/// (host time to issue, time until the work completed).
fn replayed_window(client: &Client<Vulkan>, kernel: &Kernel, rounds: u32) -> (Duration, Duration) {
    let out = client.try_allocate(256).expect("allocate");
    let capture = client.begin_capture().expect("capture");
    for i in 0..WINDOW {
        client
            .launch(
                kernel,
                &[Binding::write(&out)],
                &scalars(64, i),
                Dispatch::linear(1),
            )
            .expect("launch");
    }
    let graph = client.end_capture(capture).expect("seal");
    client.sync().expect("sync");
    let start = Instant::now();
    for _ in 0..rounds {
        client.replay(&graph).expect("replay");
    }
    let issued = start.elapsed();
    client.sync().expect("sync");
    let elapsed = start.elapsed();
    client.destroy_graph(&graph).expect("destroy");
    (issued, elapsed)
}

/// A one-workgroup launch then a read of its 256-byte output, one after
/// the other, `n` times: the latency a runtime that reads every result
/// sees. A read waits for the stream with the server's lock released, then
/// copies.
fn read_round_trips(client: &Client<Vulkan>, kernel: &Kernel, n: u32) -> Duration {
    let out = client.try_allocate(256).expect("allocate");
    let start = Instant::now();
    for i in 0..n {
        client
            .launch(
                kernel,
                &[Binding::write(&out)],
                &scalars(64, i),
                Dispatch::linear(1),
            )
            .expect("launch");
        std::hint::black_box(client.read(&out).expect("read"));
    }
    start.elapsed()
}

fn main() {
    let _ = std::fs::create_dir_all("/tmp/xdg");
    let client = match server_vulkan::client_with(Config::default()) {
        Ok(client) => client,
        Err(e) => {
            println!("skipped: no vulkan device ({e})");
            return;
        }
    };
    println!("device: {}", client.describe());
    let kernel = Kernel::wgsl("fill", FILL);
    client.compile(&kernel).expect("compile");
    // Warm up both paths (pipeline, pool blocks, arena chunks).
    server_launches(&client, &kernel);
    raw_launches(&client, &kernel);

    let mut server = Vec::new();
    let mut raw = Vec::new();
    for _ in 0..RUNS {
        server.push(server_launches(&client, &kernel));
        raw.push(raw_launches(&client, &kernel));
    }
    let per = |d: Duration, n: u32| d.as_secs_f64() * 1e6 / f64::from(n);
    let (server_min, raw_min) = (min(&server), min(&raw));
    let (server, raw) = (median(server), median(raw));
    println!(
        "launch overhead ({LAUNCHES} launches + sync): server {:.2} µs/launch (best {:.2}), raw ash {:.2} µs/launch (best {:.2})",
        per(server, LAUNCHES),
        per(server_min, LAUNCHES),
        per(raw, LAUNCHES),
        per(raw_min, LAUNCHES),
    );

    let rounds = 100;
    let launches = rounds * WINDOW;
    eager_window(&client, &kernel, 4);
    replayed_window(&client, &kernel, 4);
    let (mut eager, mut eager_issue, mut replay, mut replay_issue) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let (issue, total) = eager_window(&client, &kernel, rounds);
        eager.push(total);
        eager_issue.push(issue);
        let (issue, total) = replayed_window(&client, &kernel, rounds);
        replay.push(total);
        replay_issue.push(issue);
    }
    let (eager, replay) = (median(eager), median(replay));
    let (eager_issue, replay_issue) = (median(eager_issue), median(replay_issue));
    println!(
        "capture ({rounds} rounds of a {WINDOW}-launch window, to completion): eager {:.2} µs/launch, replayed {:.2} µs/launch",
        per(eager, launches),
        per(replay, launches)
    );
    println!(
        "capture, host issue time only: eager {:.3} µs/launch, replayed {:.3} µs/launch",
        per(eager_issue, launches),
        per(replay_issue, launches)
    );
    let trips = 500;
    read_round_trips(&client, &kernel, 10);
    let round_trips = median(
        (0..RUNS)
            .map(|_| read_round_trips(&client, &kernel, trips))
            .collect(),
    );
    println!(
        "read round trip (launch, then read 256 bytes): {:.1} µs",
        per(round_trips, trips)
    );
    let overhead = server.as_secs_f64() / raw.as_secs_f64();
    let overhead_best = server_min.as_secs_f64() / raw_min.as_secs_f64();
    let speedup = eager.as_secs_f64() / replay.as_secs_f64();
    let issue_speedup = eager_issue.as_secs_f64() / replay_issue.as_secs_f64();
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    println!(
        "RATIO launch overhead server/raw = {overhead:.3} median, {overhead_best:.3} best-of-{RUNS} (target <= 1.25: {})",
        verdict(overhead <= 1.25)
    );
    println!(
        "RATIO capture eager/replay per launch = {speedup:.2}x to completion (target >= 3: {}); {issue_speedup:.1}x in host issue time",
        verdict(speedup >= 3.0)
    );
}
