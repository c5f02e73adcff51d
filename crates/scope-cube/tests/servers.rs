//! The same cubecl kernels on every server present here, compared with a CPU
//! reference and with each other.
//!
//! - `mix` (integer hash: wrapping multiplies, xors, shifts) and the
//!   `fill → copy → add` chain must match the CPU **bit for bit**.
//! - `blend` (`alpha·x + sqrt|y| + exp(-x²)` in `f32`) must be within
//!   [`TOLERANCE`] of the CPU, relative to `max(1, |reference|)`: the
//!   servers' compilers may fuse the multiply-add and round `sqrt`/`exp`
//!   differently (Vulkan allows a few ULP for each), and the biggest
//!   difference seen is printed.
//!
//! A server with no device prints `skipped: no <backend> device (...)`; with
//! `SCOPE_REQUIRE=<backend>` it fails instead.

use scope_core::{Backend, Binding, Client, Dispatch, Result};
use scope_cube::kernels::{self, CUBE};
use scope_cube::{Args, Target};
use scope_test::client_or_skip;

/// `f32` outputs may differ from the CPU by this much, relative to
/// `max(1, |reference|)`.
const TOLERANCE: f32 = 1e-5;

/// Elements per kernel: not a multiple of the cube, so the tail guard runs.
const N: u32 = 10_007;

struct Inputs {
    words: Vec<u32>,
    x: Vec<f32>,
    y: Vec<f32>,
    seed: u32,
    alpha: f32,
}

fn inputs() -> Inputs {
    let mut state = 0x2545_f491_u32;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state
    };
    let words: Vec<u32> = (0..N).map(|_| next()).collect();
    let unit = |w: u32| (w >> 8) as f32 / (1u32 << 24) as f32;
    let x: Vec<f32> = (0..N).map(|_| unit(next()) * 6.0 - 3.0).collect();
    let y: Vec<f32> = (0..N).map(|_| unit(next()) * 200.0 - 100.0).collect();
    Inputs {
        words,
        x,
        y,
        seed: 0x9e37_79b9,
        alpha: 1.75,
    }
}

/// What every server computes.
#[derive(Debug, PartialEq)]
struct Outputs {
    mix: Vec<u32>,
    chain: Vec<u32>,
    blend: Vec<f32>,
}

fn cpu(inputs: &Inputs) -> Outputs {
    let mix = inputs
        .words
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            let mut h = (w ^ inputs.seed).wrapping_mul(2_654_435_761);
            h ^= h >> 15;
            h = h.wrapping_add((i as u32).wrapping_mul(40_503));
            h ^ (h << 7)
        })
        .collect();
    let chain = inputs.words.iter().map(|&w| w.wrapping_add(7)).collect();
    let blend = inputs
        .x
        .iter()
        .zip(&inputs.y)
        .map(|(&x, &y)| inputs.alpha * x + y.abs().sqrt() + (-(x * x)).exp())
        .collect();
    Outputs { mix, chain, blend }
}

fn bytes_of<T: Copy>(values: &[T], to: impl Fn(T) -> [u8; 4]) -> Vec<u8> {
    values.iter().flat_map(|&v| to(v)).collect()
}

fn u32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    u32s(bytes).into_iter().map(f32::from_bits).collect()
}

fn groups() -> Dispatch<'static> {
    Dispatch::linear(N.div_ceil(CUBE))
}

/// Run every kernel on `client`, translated for `target`.
fn run<B: Backend>(client: &Client<B>, target: Target, inputs: &Inputs) -> Result<Outputs> {
    let bytes = u64::from(N) * 4;
    let words = client.upload(&bytes_of(&inputs.words, u32::to_le_bytes))?;

    let mixed = client.allocate(bytes)?;
    kernels::mix_kernel(target)?.launch(
        client,
        &Args::new()
            .slice::<u32>(&words)
            .slice::<u32>(&mixed)
            .scalar(inputs.seed)
            .scalar(N),
        groups(),
    )?;

    // fill → copy → add: `words + 7`, through three kernels and a buffer
    // each kernel reads that the one before wrote.
    let sevens = client.allocate(bytes)?;
    let copied = client.allocate(bytes)?;
    let chain = client.allocate(bytes)?;
    kernels::fill_kernel(target)?.launch(
        client,
        &Args::new()
            .buffer::<u32>(Binding::write(&sevens))
            .scalar(N)
            .scalar(7u32),
        groups(),
    )?;
    kernels::copy_kernel(target)?.launch(
        client,
        &Args::new()
            .buffer::<u32>(Binding::read(&sevens))
            .buffer::<u32>(Binding::write(&copied))
            .scalar(N),
        groups(),
    )?;
    kernels::add_kernel(target)?.launch(
        client,
        &Args::new()
            .slice::<u32>(&words)
            .slice::<u32>(&copied)
            .slice::<u32>(&chain)
            .scalar(N),
        groups(),
    )?;

    let x = client.upload(&bytes_of(&inputs.x, f32::to_le_bytes))?;
    let y = client.upload(&bytes_of(&inputs.y, f32::to_le_bytes))?;
    let blended = client.allocate(bytes)?;
    kernels::blend_kernel(target)?.launch(
        client,
        &Args::new()
            .slice::<f32>(&x)
            .slice::<f32>(&y)
            .slice::<f32>(&blended)
            .scalar(inputs.alpha)
            .scalar(N),
        groups(),
    )?;

    Ok(Outputs {
        mix: u32s(&client.read(&mixed)?),
        chain: u32s(&client.read(&chain)?),
        blend: f32s(&client.read(&blended)?),
    })
}

/// The largest difference between two float outputs, relative to
/// `max(1, |reference|)`, and where.
fn worst(reference: &[f32], other: &[f32]) -> (f32, usize) {
    reference
        .iter()
        .zip(other)
        .enumerate()
        .map(|(i, (&r, &o))| ((r - o).abs() / r.abs().max(1.0), i))
        .fold(
            (0.0, 0),
            |a, b| if b.0 > a.0 || b.0.is_nan() { b } else { a },
        )
}

fn assert_matches(name: &str, reference: &Outputs, got: &Outputs) {
    assert_eq!(got.mix.len(), reference.mix.len());
    if let Some(i) = (0..reference.mix.len()).find(|&i| reference.mix[i] != got.mix[i]) {
        panic!(
            "{name}: mix[{i}] = {:#010x}, expected {:#010x}",
            got.mix[i], reference.mix[i]
        );
    }
    if let Some(i) = (0..reference.chain.len()).find(|&i| reference.chain[i] != got.chain[i]) {
        panic!(
            "{name}: chain[{i}] = {}, expected {}",
            got.chain[i], reference.chain[i]
        );
    }
    let (error, at) = worst(&reference.blend, &got.blend);
    println!(
        "{name}: integer kernels bit-exact; blend within {error:.2e} (at {at}: {} vs {})",
        got.blend[at], reference.blend[at]
    );
    assert!(
        error <= TOLERANCE,
        "{name}: blend[{at}] = {}, expected {} (relative error {error:e} > {TOLERANCE:e})",
        got.blend[at],
        reference.blend[at]
    );
}

/// Every server present, by name, with its outputs.
fn all_present() -> Vec<(&'static str, Outputs)> {
    let inputs = inputs();
    let mut found = Vec::new();
    let _ = std::fs::create_dir_all("/tmp/xdg");
    if let Some(c) = client_or_skip(server_vulkan::client) {
        found.push(("vulkan spir-v", run(&c, Target::SpirV, &inputs).unwrap()));
        found.push(("vulkan wgsl", run(&c, Target::Wgsl, &inputs).unwrap()));
    }
    for api in [server_wgpu::Api::Vulkan, server_wgpu::Api::Gl] {
        let make = || server_wgpu::client_with(&server_wgpu::Options::api(api));
        if let Some(c) = client_or_skip(make) {
            let name = match api {
                server_wgpu::Api::Gl => "wgpu gl",
                _ => "wgpu vulkan",
            };
            found.push((name, run(&c, Target::Wgsl, &inputs).unwrap()));
        }
    }
    if let Some(c) = client_or_skip(server_cuda::client) {
        found.push(("cuda", run(&c, Target::Cuda, &inputs).unwrap()));
    }
    if let Some(c) = client_or_skip(server_hip::client) {
        found.push(("hip", run(&c, Target::Hip, &inputs).unwrap()));
    }
    found
}

/// Each server against the CPU, then every pair against each other: the
/// integer outputs equal, the float outputs within twice the tolerance.
#[test]
fn every_server_computes_the_same() {
    let reference = cpu(&inputs());
    let found = all_present();
    for (name, outputs) in &found {
        assert_matches(name, &reference, outputs);
    }
    for (i, (a, left)) in found.iter().enumerate() {
        for (b, right) in &found[i + 1..] {
            assert_eq!(left.mix, right.mix, "{a} and {b} disagree on mix");
            assert_eq!(left.chain, right.chain, "{a} and {b} disagree on the chain");
            let (error, at) = worst(&left.blend, &right.blend);
            assert!(
                error <= 2.0 * TOLERANCE,
                "{a} and {b} disagree on blend[{at}]: {} vs {}",
                left.blend[at],
                right.blend[at]
            );
        }
    }
    println!(
        "servers compared: {:?}",
        found.iter().map(|(n, _)| *n).collect::<Vec<_>>()
    );
}

/// The Vulkan server runs cubecl's SPIR-V by device address: with the
/// validation layer on (any message fails the test) and memory staged as on
/// a discrete GPU.
#[test]
fn vulkan_device_addresses_under_validation() {
    let _ = std::fs::create_dir_all("/tmp/xdg");
    let make = || {
        server_vulkan::client_with(server_vulkan::Config {
            validation: true,
            fail_on_validation: true,
            force_staging: true,
            ..Default::default()
        })
    };
    let Some(c) = client_or_skip(make) else {
        return;
    };
    let inputs = inputs();
    let got = run(&c, Target::SpirV, &inputs).unwrap();
    assert_matches("vulkan spir-v (validated)", &cpu(&inputs), &got);
}

/// A kernel with more buffers than 128 bytes of push constants hold
/// addresses for (twenty-one and the info struct): cubecl's SPIR-V passes
/// them in a uniform table at set 0, binding 0, which the Vulkan server
/// stages and binds — under the validation layer, with memory staged as on
/// a discrete GPU — and the sum matches the CPU.
#[test]
fn vulkan_binds_a_kernel_wider_than_push_constants() {
    let _ = std::fs::create_dir_all("/tmp/xdg");
    let make = || {
        server_vulkan::client_with(server_vulkan::Config {
            validation: true,
            fail_on_validation: true,
            force_staging: true,
            ..Default::default()
        })
    };
    let Some(c) = client_or_skip(make) else {
        return;
    };
    let n = 1000u32;
    let inputs: Vec<Vec<u32>> = (0..20u32)
        .map(|k| (0..n).map(|i| i.wrapping_mul(k + 1) ^ (k << 20)).collect())
        .collect();
    let buffers: Vec<_> = inputs
        .iter()
        .map(|words| c.upload(&bytes_of(words, u32::to_le_bytes)).unwrap())
        .collect();
    let out = c.allocate(u64::from(n) * 4).unwrap();
    let kernel = kernels::wide_sum_kernel(Target::SpirV).unwrap();
    let args = buffers
        .iter()
        .fold(Args::new(), |args, buffer| args.slice::<u32>(buffer))
        .slice::<u32>(&out)
        .scalar(n);
    kernel
        .launch(&c, &args, Dispatch::linear(n.div_ceil(CUBE)))
        .unwrap();
    let expected: Vec<u32> = (0..n as usize)
        .map(|i| {
            inputs
                .iter()
                .fold(0u32, |sum, words| sum.wrapping_add(words[i]))
        })
        .collect();
    assert_eq!(u32s(&c.read(&out).unwrap()), expected);
}
