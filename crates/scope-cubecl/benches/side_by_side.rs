//! scope's servers as cubecl runtimes, side by side with cubecl-wgpu: same
//! process, same adapter (lavapipe through Vulkan unless
//! `SCOPE_WGPU_BACKEND` says otherwise), rounds interleaved so that drift
//! on the machine lands on every runtime alike.
//!
//! `cargo bench -p scope-cubecl` (`LP_NUM_THREADS=0` is set when unset).
//!
//! 1. **Launch overhead**: one `#[cube(launch)]` kernel launched 10,000
//!    times then synced, through `ScopeRuntime<Wgpu>`,
//!    `ScopeRuntime<Vulkan>` and `cubecl_wgpu::WgpuRuntime`; µs per launch
//!    and the ratio to cubecl-wgpu (target ≤ 0.5). All three pay the same
//!    cubecl client front (argument packing, the device handle); the fourth
//!    figure, scope's own `Client::launch` of the same kind of kernel
//!    without cubecl in front, shows how much of each is that front.
//!    Twice: over one workgroup (64 `u32`), the overhead itself, and over
//!    sixteen (1,024 `u32`). On a software adapter a launch's execution
//!    is the CPU's too, the same for every runtime, and at sixteen
//!    workgroups it is most of each figure (lavapipe's compiled shader
//!    took about 60% of the device thread's samples under `perf`).
//! 2. **Matmul**: cubek's unit matmul, f32, square sizes; ms per matmul
//!    and the ratio to cubecl-wgpu (target ≤ 1.1).
//!
//! Each figure is the median of the rounds after a warm-up.
//! `SCOPE_BENCH_SMOKE=1` runs a few iterations only.

use std::time::{Duration, Instant};

use cubecl_core as cubecl;
use cubecl_core::prelude::*;
use cubecl_core::zspace::{Shape, Strides, Tiling};
use cubecl_environment::future::block_on;
use cubecl_runtime::client::Client;
use cubecl_runtime::runtime::Runtime;
use cubecl_runtime::server::Handle;
use cubecl_wgpu::{WgpuBackend, WgpuDevice, WgpuDeviceKind, WgpuRuntime};
use cubek_matmul::definition::MatmulElems;
use cubek_matmul::launch::launch_ref;
use cubek_matmul::multi_level;
use cubek_matmul::strategy::Strategy;
use cubek_std::InputBinding;
use scope_core::Dispatch;
use scope_cube::{Args, Target};
use scope_cubecl::{ScopeDevice, ScopeRuntime};
use server_vulkan::Vulkan;
use server_wgpu::Wgpu;

const ELEMENTS: usize = 1024;
const CUBE: u32 = 64;
/// The launch-overhead kernel's sizes, in workgroups of `CUBE`.
const GROUPS: [u32; 2] = [1, 16];

/// `out[i] = value`: one buffer and one scalar, the smallest real launch.
#[cube(launch)]
fn fill(out: &mut [u32], value: u32) {
    if ABSOLUTE_POS < out.len() {
        out[ABSOLUTE_POS] = value;
    }
}

fn smoke() -> bool {
    std::env::var("SCOPE_BENCH_SMOKE").is_ok_and(|v| v == "1")
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// One runtime under test.
struct Subject {
    name: &'static str,
    client: Client,
    out: Handle,
}

impl Subject {
    fn new(name: &'static str, client: Client) -> Self {
        let out = client.empty(ELEMENTS * 4);
        Self { name, client, out }
    }

    /// `launches` launches over `groups` workgroups, then a sync.
    fn launches(&self, launches: u32, groups: u32) -> Duration {
        let elements = (groups * CUBE) as usize;
        let start = Instant::now();
        for _ in 0..launches {
            fill::launch(
                &self.client,
                CubeCount::Static(groups, 1, 1),
                CubeDim::new_1d(CUBE),
                // SAFETY: `out` holds `ELEMENTS` u32s, at least the length
                // given.
                unsafe { BufferArg::from_raw_parts(self.out.clone(), elements) },
                7u32,
            );
        }
        block_on(self.client.sync()).expect("sync");
        start.elapsed()
    }

    fn matmul(&self, size: usize, lhs: &Handle, rhs: &Handle) -> Duration {
        let f32_type = f32::elem_type_native();
        let binding = |handle: &Handle| TensorBinding {
            handle: handle.clone().binding(),
            shape: Shape::from(vec![size, size]),
            strides: Strides::from(vec![size, 1]),
            tiling: Tiling::UNTILED,
        };
        let out = self.client.empty(size * size * 4);
        let start = Instant::now();
        let mut elems = MatmulElems::from_single_dtype(f32_type);
        launch_ref(
            &Strategy::MultiLevel(multi_level::Strategy::SimpleUnit(Default::default())),
            &self.client,
            InputBinding::Normal(binding(lhs), f32_type),
            InputBinding::Normal(binding(rhs), f32_type),
            binding(&out),
            &mut elems,
        )
        .expect("matmul");
        block_on(self.client.sync_buffers([&out])).expect("matmul sync");
        start.elapsed()
    }
}

/// Scope's own launch of the same kind of kernel, without cubecl's client
/// in front: what is left of each figure when the front is taken away.
fn scope_alone(launches: u32, groups: u32) -> Duration {
    let scope = ScopeRuntime::<Wgpu>::scope_client(&ScopeDevice::default());
    let kernel = scope_cube::kernels::fill_kernel(Target::Wgsl).expect("translate");
    let elements = groups * scope_cube::kernels::CUBE;
    let out = scope.allocate(u64::from(elements) * 4).expect("allocate");
    let args = Args::new()
        .buffer::<u32>(out.all().write())
        .scalar(elements)
        .scalar(7u32);
    let dispatch = Dispatch::linear(groups);
    let start = Instant::now();
    for _ in 0..launches {
        kernel.launch(&scope, &args, dispatch).expect("launch");
    }
    scope.sync().expect("sync");
    start.elapsed()
}

/// The launch figures over `groups` workgroups, every runtime's rounds
/// interleaved.
fn launch_overhead(subjects: &[Subject], launches: u32, rounds: usize, groups: u32) {
    for subject in subjects {
        subject.launches(launches.min(200), groups);
    }
    scope_alone(launches.min(200), groups);
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); subjects.len() + 1];
    for _ in 0..rounds {
        for (i, subject) in subjects.iter().enumerate() {
            samples[i].push(subject.launches(launches, groups));
        }
        samples[subjects.len()].push(scope_alone(launches, groups));
    }
    let base = per_launch(median(samples[0].clone()), launches);
    let what = format!("{groups} workgroup{}", if groups == 1 { "" } else { "s" });
    for (i, subject) in subjects.iter().enumerate() {
        let us = per_launch(median(samples[i].clone()), launches);
        println!(
            "launch+sync, {what:<13} via {:<13} {us:>8.2} µs/launch  ({:.2}x cubecl-wgpu; target <= 0.5)",
            subject.name,
            us / base
        );
    }
    let alone = per_launch(median(samples[subjects.len()].clone()), launches);
    println!(
        "launch+sync, {what:<13} via scope Client::launch (no cubecl front) {alone:>8.2} µs/launch  \
         ({:.2}x cubecl-wgpu)",
        alone / base
    );
}

fn per_launch(d: Duration, launches: u32) -> f64 {
    d.as_secs_f64() * 1e6 / f64::from(launches)
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

fn main() {
    if std::env::var_os("LP_NUM_THREADS").is_none() {
        // SAFETY: nothing else runs yet: no thread reads the environment.
        unsafe { std::env::set_var("LP_NUM_THREADS", "0") };
    }
    if std::env::var_os("SCOPE_WGPU_BACKEND").is_none() {
        // SAFETY: as above.
        unsafe { std::env::set_var("SCOPE_WGPU_BACKEND", "vulkan") };
    }
    let gl = std::env::var("SCOPE_WGPU_BACKEND").is_ok_and(|b| b == "gl");
    let api = if gl {
        WgpuBackend::Gl
    } else {
        WgpuBackend::Vulkan
    };
    let device = ScopeDevice::default();
    if ScopeRuntime::<Wgpu>::enumerate_all_devices().is_empty() {
        println!("skipped: no wgpu device");
        return;
    }
    let mut subjects = vec![Subject::new(
        "cubecl-wgpu",
        <WgpuRuntime as Runtime>::client(&WgpuDevice::new(WgpuDeviceKind::Cpu).on(api)),
    )];
    subjects.push(Subject::new(
        "scope wgpu",
        ScopeRuntime::<Wgpu>::client(&device),
    ));
    if !gl && !ScopeRuntime::<Vulkan>::enumerate_all_devices().is_empty() {
        subjects.push(Subject::new(
            "scope vulkan",
            ScopeRuntime::<Vulkan>::client(&device),
        ));
    }
    let (launches, rounds, sizes): (u32, usize, &[usize]) = if smoke() {
        (50, 1, &[32])
    } else {
        (10_000, 9, &[256, 512])
    };
    println!(
        "machine: load average {} at start, LP_NUM_THREADS={}, adapter: {}",
        load(),
        std::env::var("LP_NUM_THREADS").unwrap_or_default(),
        subjects[0].client.properties().identity.name
    );

    // 1. Launch overhead.
    for groups in GROUPS {
        launch_overhead(&subjects, launches, rounds, groups);
    }

    // 2. Matmul.
    for &size in sizes {
        let values: Vec<u8> = (0..size * size)
            .flat_map(|i| ((i % 17) as f32 / 17.0).to_le_bytes())
            .collect();
        let inputs: Vec<(Handle, Handle)> = subjects
            .iter()
            .map(|s| {
                (
                    s.client.create_from_slice(&values),
                    s.client.create_from_slice(&values),
                )
            })
            .collect();
        for (subject, (lhs, rhs)) in subjects.iter().zip(&inputs) {
            subject.matmul(size, lhs, rhs);
        }
        let mut times: Vec<Vec<Duration>> = vec![Vec::new(); subjects.len()];
        for _ in 0..rounds {
            for (i, (subject, (lhs, rhs))) in subjects.iter().zip(&inputs).enumerate() {
                times[i].push(subject.matmul(size, lhs, rhs));
            }
        }
        let base = median(times[0].clone()).as_secs_f64();
        for (i, subject) in subjects.iter().enumerate() {
            let t = median(times[i].clone()).as_secs_f64();
            println!(
                "matmul {size}x{size} f32 via {:<13} {:>8.2} ms  ({:.2}x cubecl-wgpu; target <= 1.1)",
                subject.name,
                t * 1e3,
                t / base
            );
        }
    }
    println!("machine: load average {} at end", load());
}
