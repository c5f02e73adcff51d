//! Real kernel libraries on scope's servers: cubek's matmul and reductions
//! through `ScopeRuntime`, checked against a CPU reference, and a fault
//! injected upstream of a matmul, read back through it.
//!
//! Tolerances: the matmul accumulates in f32 along `k`, so an element may
//! differ from the f64 reference by `1e-5 · k · max|a| · max|b|`; a sum or
//! mean by `1e-5` relative to the sum of magnitudes; a max or argmax not at
//! all.

#![cfg(any(
    feature = "wgpu",
    feature = "vulkan",
    feature = "cuda",
    feature = "hip"
))]

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use cubecl_core as cubecl;
use cubecl_core::prelude::*;
use cubecl_core::zspace::{Shape, Strides, Tiling};
use cubecl_environment::stream::StreamId;
use cubecl_runtime::client::Client;
use cubecl_runtime::runtime::Runtime;
use cubek_matmul::definition::MatmulElems;
use cubek_matmul::launch::launch_ref;
use cubek_matmul::multi_level;
use cubek_matmul::strategy::Strategy;
use cubek_reduce::components::instructions::ReduceOperationConfig;
use cubek_reduce::launch::{RoutineStrategy, VectorizationStrategy};
use cubek_reduce::routines::BlueprintStrategy;
use cubek_reduce::routines::unit::UnitStrategy;
use cubek_reduce::{ReduceDtypes, ReduceStrategy};
use cubek_std::InputBinding;
use scope_core::{Error, FaultPlan, Site};
use scope_cubecl::{CubeBackend, ScopeDevice, ScopeRuntime};

/// A client of `B`'s device, or `None` after saying why (and a panic when
/// `SCOPE_REQUIRE` names the backend).
fn client<B: CubeBackend>(name: &str) -> Option<Client> {
    if ScopeRuntime::<B>::enumerate_all_devices().is_empty() {
        assert!(
            !scope_core::required(name),
            "SCOPE_REQUIRE names {name}, and there is no {name} device"
        );
        println!("skipped: no {name} device");
        return None;
    }
    Some(ScopeRuntime::<B>::client(&ScopeDevice::default()))
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(2_654_435_761).max(1);
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn row_major(shape: &[usize]) -> Strides {
    let mut strides = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    Strides::from(strides)
}

fn tensor(handle: &cubecl_runtime::server::Handle, shape: &[usize]) -> TensorBinding {
    TensorBinding {
        handle: handle.clone().binding(),
        shape: Shape::from(shape.to_vec()),
        strides: row_major(shape),
        tiling: Tiling::UNTILED,
    }
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn bytes_of(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The unit routine: what runs on a device without matrix instructions,
/// named so the routine under test does not depend on detection.
fn unit_matmul() -> Strategy {
    Strategy::MultiLevel(multi_level::Strategy::SimpleUnit(Default::default()))
}

/// Launch `lhs · rhs` (`m×k` by `k×n`) into a new output; its handle.
fn matmul(
    client: &Client,
    lhs: &cubecl_runtime::server::Handle,
    rhs: &cubecl_runtime::server::Handle,
    [m, k, n]: [usize; 3],
) -> cubecl_runtime::server::Handle {
    let f32_type = f32::elem_type_native();
    let out = client.empty(m * n * 4);
    let mut elems = MatmulElems::from_single_dtype(f32_type);
    launch_ref(
        &unit_matmul(),
        client,
        InputBinding::Normal(tensor(lhs, &[m, k]), f32_type),
        InputBinding::Normal(tensor(rhs, &[k, n]), f32_type),
        tensor(&out, &[m, n]),
        &mut elems,
    )
    .expect("the unit matmul runs on every scope server");
    out
}

fn check_matmul(client: &Client, [m, k, n]: [usize; 3]) {
    let a = values(m * k, 1 + m as u32);
    let b = values(k * n, 2 + n as u32);
    let lhs = client.create_from_slice(&bytes_of(&a));
    let rhs = client.create_from_slice(&bytes_of(&b));
    let out = matmul(client, &lhs, &rhs, [m, k, n]);
    let actual = floats(
        &client
            .read_one(out)
            .expect("the matmul's output reads back"),
    );
    let tolerance = 1e-5 * k as f64;
    let mut worst = 0.0f64;
    for i in 0..m {
        for j in 0..n {
            let expected: f64 = (0..k)
                .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                .sum();
            let error = (f64::from(actual[i * n + j]) - expected).abs();
            worst = worst.max(error);
            assert!(
                error <= tolerance,
                "{m}x{k}x{n}: out[{i}][{j}] = {}, expected {expected} (tolerance {tolerance})",
                actual[i * n + j]
            );
        }
    }
    println!(
        "matmul {m}x{k}x{n}: largest difference from f64 {worst:.2e} (tolerance {tolerance:.1e})"
    );
}

fn reduce(
    client: &Client,
    input: &[f32],
    shape: [usize; 3],
    axis: usize,
    op: ReduceOperationConfig,
) -> Vec<u8> {
    let f32_type = f32::elem_type_native();
    let mut out_shape = shape;
    out_shape[axis] = 1;
    let out_len: usize = out_shape.iter().product();
    let handle = client.create_from_slice(&bytes_of(input));
    let out = client.empty(out_len * 4);
    let output_type = match op {
        ReduceOperationConfig::ArgMax | ReduceOperationConfig::ArgMin => u32::elem_type_native(),
        _ => f32_type,
    };
    let strategy = ReduceStrategy {
        routine: RoutineStrategy::Unit(BlueprintStrategy::Inferred(UnitStrategy)),
        vectorization: VectorizationStrategy {
            parallel_output_vectorization: false,
        },
        autotune_level: Default::default(),
    };
    cubek_reduce::reduce(
        client,
        tensor(&handle, &shape),
        tensor(&out, &out_shape),
        axis,
        strategy,
        op,
        ReduceDtypes {
            input: f32_type,
            output: output_type,
            accumulation: f32_type,
        },
    )
    .expect("the unit reduction runs on every scope server");
    client
        .read_one(out)
        .expect("the reduction's output reads back")
        .to_vec()
}

/// Every lane `(i, j)` of `shape` with `axis` reduced, as (output index,
/// the input indices it reduces).
fn lanes(shape: [usize; 3], axis: usize) -> Vec<Vec<usize>> {
    let mut out_shape = shape;
    out_shape[axis] = 1;
    let mut lanes = Vec::new();
    for a in 0..out_shape[0] {
        for b in 0..out_shape[1] {
            for c in 0..out_shape[2] {
                let lane = (0..shape[axis])
                    .map(|r| {
                        let mut at = [a, b, c];
                        at[axis] = r;
                        (at[0] * shape[1] + at[1]) * shape[2] + at[2]
                    })
                    .collect();
                lanes.push(lane);
            }
        }
    }
    lanes
}

fn check_reductions(client: &Client) {
    let shape = [6, 17, 33];
    let input = values(shape.iter().product(), 7);
    for axis in 0..3 {
        let sums = floats(&reduce(
            client,
            &input,
            shape,
            axis,
            ReduceOperationConfig::Sum,
        ));
        let means = floats(&reduce(
            client,
            &input,
            shape,
            axis,
            ReduceOperationConfig::Mean,
        ));
        let maxes = floats(&reduce(
            client,
            &input,
            shape,
            axis,
            ReduceOperationConfig::Max,
        ));
        let argmax = reduce(client, &input, shape, axis, ReduceOperationConfig::ArgMax);
        // The largest difference from f64, as a share of its tolerance.
        let (mut worst_sum, mut worst_mean) = (0f64, 0f64);
        for (o, lane) in lanes(shape, axis).iter().enumerate() {
            let sum: f64 = lane.iter().map(|&i| f64::from(input[i])).sum();
            let magnitude: f64 = lane.iter().map(|&i| f64::from(input[i]).abs()).sum();
            let tolerance = 1e-5 * magnitude.max(1.0);
            let sum_error = (f64::from(sums[o]) - sum).abs();
            assert!(sum_error <= tolerance, "sum, axis {axis}, lane {o}");
            let mean = sum / lane.len() as f64;
            let mean_tolerance = tolerance / lane.len() as f64;
            let mean_error = (f64::from(means[o]) - mean).abs();
            assert!(mean_error <= mean_tolerance, "mean, axis {axis}, lane {o}");
            worst_sum = worst_sum.max(sum_error / tolerance);
            worst_mean = worst_mean.max(mean_error / mean_tolerance);
            let max = lane.iter().map(|&i| input[i]).fold(f32::MIN, f32::max);
            assert_eq!(maxes[o], max, "max, axis {axis}, lane {o}");
            let at = u32::from_le_bytes(argmax[o * 4..o * 4 + 4].try_into().unwrap()) as usize;
            assert_eq!(input[lane[at]], max, "argmax, axis {axis}, lane {o}");
        }
        println!(
            "reduce {shape:?} along axis {axis}: sum within {:.3} and mean within {:.3} of \
             their tolerance; max and argmax exact",
            worst_sum, worst_mean
        );
    }
}

/// `out[i] = value`, the work the fault lands on.
#[cube(launch)]
fn fill(out: &mut [f32], value: f32) {
    if ABSOLUTE_POS < out.len() {
        out[ABSOLUTE_POS] = value;
    }
}

/// A launch fails at the device call site; the matmul reading what it
/// would have written is skipped; the read of the matmul's output names the
/// injected fault as its root and the skipped matmul in its chain; and a
/// matmul on fresh inputs then runs — the device kept working.
fn check_fault_through_matmul<B: CubeBackend>(client: &Client) {
    let [m, k, n] = [32, 16, 8];
    // cubecl stream 0 folds onto scope's stream 0, whose client the
    // runtime hands out, so the fault plan can name the stream.
    StreamId { value: 0 }.executes(|| {
        let scope = ScopeRuntime::<B>::scope_client(&ScopeDevice::default());
        let lhs = client.empty(m * k * 4);
        let rhs = client.create_from_slice(&bytes_of(&values(k * n, 3)));
        let injected = Error::Launch {
            kernel: "fill".into(),
            stream: scope.stream(),
            detail: "injected: the device lost the launch".to_owned(),
        };
        scope.inject(FaultPlan::new().fail_on(Site::Launch, scope.stream(), 1, injected));
        fill::launch(
            client,
            CubeCount::Static((m * k).div_ceil(64) as u32, 1, 1),
            CubeDim::new_1d(64),
            // SAFETY: `lhs` holds `m * k` f32s, the length the kernel is told.
            unsafe { BufferArg::from_raw_parts(lhs.clone(), m * k) },
            1.0f32,
        );
        let out = matmul(client, &lhs, &rhs, [m, k, n]);
        let error = client.read_one(out).expect_err("the matmul never ran");
        let text = error.to_string();
        println!("the read of the matmul's output:\n{text}");
        assert!(
            text.contains("injected: the device lost the launch"),
            "{text}"
        );
        assert!(
            text.contains("skipped `"),
            "the chain names the skipped matmul: {text}"
        );
        match &error {
            cubecl_runtime::server::ServerError::Several { errors, .. } => match &errors[0] {
                cubecl_runtime::server::ServerError::Unwritten { chain, .. } => {
                    assert!(!chain.is_empty(), "a chain of skipped kernels: {text}")
                }
                other => panic!("expected the bytes to be unwritten: {other}"),
            },
            other => panic!("expected a read of claimed bytes: {other}"),
        }
        scope.inject(FaultPlan::new());
    });
    check_matmul(client, [m, k, n]);
}

/// Held for writing while a fault plan is installed, for reading by every
/// other test. The plan names a scope stream, and cubecl folds its streams
/// onto scope's, so a test running beside the fault on another thread can
/// be handed the same stream and take the injected fault in place of the
/// `fill` it was meant for — failing both tests.
static FAULT_WINDOW: RwLock<()> = RwLock::new(());

fn beside_faults() -> RwLockReadGuard<'static, ()> {
    FAULT_WINDOW.read().unwrap_or_else(PoisonError::into_inner)
}

fn alone() -> RwLockWriteGuard<'static, ()> {
    FAULT_WINDOW.write().unwrap_or_else(PoisonError::into_inner)
}

macro_rules! on_server {
    ($module:ident, $feature:literal, $backend:ty, $name:literal) => {
        #[cfg(feature = $feature)]
        mod $module {
            use super::*;

            #[test]
            fn matmul_agrees_with_the_cpu() {
                let _beside = beside_faults();
                let Some(client) = client::<$backend>($name) else {
                    return;
                };
                for shape in [[64, 64, 64], [128, 96, 80], [100, 37, 53]] {
                    check_matmul(&client, shape);
                }
            }

            #[test]
            fn reductions_agree_with_the_cpu() {
                let _beside = beside_faults();
                let Some(client) = client::<$backend>($name) else {
                    return;
                };
                check_reductions(&client);
            }

            #[test]
            fn a_fault_upstream_of_a_matmul_is_read_through_it() {
                let _alone = alone();
                let Some(client) = client::<$backend>($name) else {
                    return;
                };
                check_fault_through_matmul::<$backend>(&client);
            }
        }
    };
}

on_server!(wgpu, "wgpu", server_wgpu::Wgpu, "wgpu");
on_server!(vulkan, "vulkan", server_vulkan::Vulkan, "vulkan");
on_server!(cuda, "cuda", server_cuda::Cuda, "cuda");
on_server!(hip, "hip", server_hip::Hip, "hip");
