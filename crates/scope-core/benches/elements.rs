//! What a 16-bit gradient saves a collective, side by side in one run, on
//! the reference server: four host servers as four ranks, an all-reduce
//! (sum) of the same number of gradient values in `bf16` and in `f32`, at
//! 1 MiB and 16 MiB of `f32` a rank.
//!
//! - **host staging** (`Group::new`) and the **loopback** device transport
//!   (`Group::over_device`): both move bytes on the host, so the ratio says
//!   what half the bytes saves in scope's own work, not what NCCL on a GPU
//!   would; the target is `bf16` at ≤ 0.6× `f32`'s time.
//! - **the combine alone**: host staging's arithmetic (`Call::outputs`) over
//!   four ranks' values, per element type, against a plain `f32` sum of the
//!   same bytes on one core.
//!
//! Each round runs every case once, interleaved; each figure is the median.
//! `SCOPE_BENCH_SMOKE=1` runs one small round, to prove the bench runs.

#[path = "common/timing.rs"]
mod timing;

use std::time::{Duration, Instant};

use scope_core::collective::{Call, Element, Group, Reduce};
use scope_test::host::client;
use timing::{median, smoke};

const RANKS: usize = 4;
const DEADLINE: Duration = Duration::from_secs(120);

/// One all-reduce of `values` values in `element` on every rank of `group`,
/// each output synced: from the first rank's start to the last rank's end.
fn all_reduce(group: &Group<scope_test::host::Host>, element: Element, values: usize) -> Duration {
    let bytes = values * element.size() as usize;
    let spans = group.run(|rank| {
        let c = rank.client();
        let input = c.upload(&vec![0x3c; bytes]).expect("upload");
        let output = c.allocate(bytes as u64).expect("allocate");
        c.sync().expect("sync");
        let start = Instant::now();
        rank.all_reduce(input.all(), output.all(), element, Reduce::Sum)
            .expect("a clean all-reduce");
        c.sync().expect("sync");
        (start, Instant::now())
    });
    let first = spans.iter().map(|s| s.0).min().expect("ranks");
    let last = spans.iter().map(|s| s.1).max().expect("ranks");
    last - first
}

fn transports(sizes: &[usize], rounds: usize) {
    println!("| transport | f32 a rank | f32 | bf16 | bf16 / f32 |");
    println!("|---|---|---|---|---|");
    for (name, device) in [("host staging", false), ("loopback", true)] {
        let clients = || {
            (0..RANKS)
                .map(|_| client().expect("a host server"))
                .collect()
        };
        let group = if device {
            Group::over_device(clients(), DEADLINE)
        } else {
            Group::new(clients(), DEADLINE)
        }
        .expect("a group");
        for &size in sizes {
            let values = size / 4;
            let (mut f32s, mut bf16s) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                f32s.push(all_reduce(&group, Element::F32, values));
                bf16s.push(all_reduce(&group, Element::BF16, values));
            }
            let (f, b) = (median(f32s), median(bf16s));
            println!(
                "| {name} | {} KiB | {f:.2?} | {b:.2?} | {:.2}× |",
                size / 1024,
                b.as_secs_f64() / f.as_secs_f64()
            );
        }
    }
}

/// A plain `f32` sum of four ranks' `bytes` into one, on one core.
fn plain_sum(inputs: &[Vec<u8>]) -> Vec<f32> {
    let words = |v: &Vec<u8>| -> Vec<f32> {
        v.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let mut acc = words(&inputs[0]);
    for input in &inputs[1..] {
        for (a, c) in acc.iter_mut().zip(input.chunks_exact(4)) {
            *a += f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
    }
    acc
}

fn combine(size: usize, rounds: usize) {
    // Every odd byte 0x3c: each float's top byte, so no value is subnormal
    // (whose arithmetic x86 runs in microcode) in any type.
    let inputs: Vec<Vec<u8>> = (0..RANKS)
        .map(|r| {
            (0..size)
                .map(|i| {
                    if i % 2 == 1 {
                        0x3c
                    } else {
                        (i * 7 + r * 13) as u8
                    }
                })
                .collect()
        })
        .collect();
    let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let mut plain = Vec::new();
    let mut typed: Vec<Vec<Duration>> = vec![Vec::new(); Element::ALL.len()];
    for _ in 0..rounds {
        let start = Instant::now();
        std::hint::black_box(plain_sum(&inputs));
        plain.push(start.elapsed());
        for (i, element) in Element::ALL.into_iter().enumerate() {
            let call = Call::AllReduce {
                element,
                op: Reduce::Sum,
            };
            let start = Instant::now();
            std::hint::black_box(call.outputs(&views));
            typed[i].push(start.elapsed());
        }
    }
    let rate = |d: Duration| (RANKS * size) as f64 / d.as_secs_f64() / 1e9;
    let plain = median(plain);
    println!(
        "\ncombine of {RANKS} × {} KiB: plain f32 sum {:.2} GB/s read",
        size / 1024,
        rate(plain)
    );
    println!("| element | GB/s read | time / plain sum |");
    println!("|---|---|---|");
    for (element, samples) in Element::ALL.into_iter().zip(typed) {
        let d = median(samples);
        println!(
            "| {} | {:.2} | {:.2}× |",
            element.name(),
            rate(d),
            d.as_secs_f64() / plain.as_secs_f64()
        );
    }
}

fn main() {
    let (sizes, rounds): (&[usize], usize) = if smoke() {
        (&[64 * 1024], 1)
    } else {
        (&[1 << 20, 16 << 20], 15)
    };
    transports(sizes, rounds);
    combine(*sizes.last().unwrap_or(&4096), rounds);
}
