//! All-reduce over four logical devices, against the same reduction written
//! directly, and against a host `memcpy`.
//!
//! `cargo bench --workspace --all-features --bench all_reduce` (the bench
//! sets `LP_NUM_THREADS=0` and a private `XDG_RUNTIME_DIR` when unset;
//! `SCOPE_BENCH_SMOKE=1` runs a round of the smallest size only). Four
//! servers of the demo's backend — `SCOPE_BENCH_BACKEND`, or the one
//! `cargo xtask demo` picks: CUDA, HIP, a hardware Vulkan or wgpu device,
//! then wgpu on lavapipe — each holding `size` bytes of `f32` per rank, for
//! sizes of 1, 16 and 64 MiB:
//!
//! 1. **group**: `Rank::all_reduce(input, output, F32, Sum)` on every rank
//!    of a [`Group`], one thread a rank (`Group::run`), each rank then
//!    waiting for its stream (`Client::sync`), so the result is on every
//!    device when the clock stops.
//! 2. **direct**: the same reduction written directly, on one thread:
//!    `Client::read` of every rank's input, a sum on the host in rank
//!    order, `Client::write` of the sum to every rank's output, and a sync
//!    of every client. Target: group ≤ 1.2 × direct.
//! 3. **memcpy**: `copy_from_slice` of the same bytes (every rank's part,
//!    `4 × size`) from one host buffer into another: what the host's memory
//!    gives, against which the bytes/s of both are put.
//!
//! Where the time goes, for each: the direct version times its own
//! phases (reads, sum, writes and syncs); the group's phases happen inside
//! the collective, so its reads and its writes are timed alone, on one
//! thread a rank as the collective runs them, and the rest is the
//! rendezvous and the reduction, which the collective computes once, on
//! the last rank to arrive, while the others wait. A first row, 4 bytes a
//! rank, is the fixed cost of each.
//!
//! Measured on lavapipe with two cores (release, seven rounds): the group
//! took 0.64× the direct version's time at 1 MiB a rank, 0.61× at 16 MiB
//! and 0.67× at 64 MiB (target met), at 1.0–1.4 GB/s, 9–14 % of memcpy's.
//! Before the collective reduced rank by rank into one result every rank
//! shares (it went word by word across ranks, then copied the result once
//! a rank), the same bench gave 0.8–1.5× and 1.0–1.2×: the reduction alone
//! took 2.4–7× the direct part-by-part sum.
//!
//! Each figure is the median of several rounds after a warm-up. On a
//! software adapter the "device" memory is host memory, and each read and
//! write is a copy through a staging buffer that lavapipe performs on the
//! CPU: the ratios say how the two ways of writing the same collective
//! compare, not what a GPU interconnect would give.

use std::time::{Duration, Instant};

use scope_core::collective::{DEFAULT_DEADLINE, Element, Group, Reduce};
use std::hint::black_box;

use scope_core::{Backend, BackendKind, Buffer, Client, DeviceKind, Drivers, Probe, Result};
use tiny_runtime::backends::{self, OnClients};

/// Ranks: logical devices, a server each.
const RANKS: usize = 4;

/// Bytes each rank reduces.
const SIZES: [usize; 3] = [1 << 20, 16 << 20, 64 << 20];

fn smoke() -> bool {
    std::env::var("SCOPE_BENCH_SMOKE").is_ok_and(|v| v == "1")
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// `rounds` timed runs of `f` after one untimed one; their median.
fn time(rounds: usize, mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
    f()?;
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        f()?;
        samples.push(start.elapsed());
    }
    Ok(median(samples))
}

/// `a` and `b` timed in turn, `rounds` times each after one untimed run
/// of each, so that a change in the machine's load lands on both; their
/// medians.
fn time_pair(
    rounds: usize,
    mut a: impl FnMut() -> Result<()>,
    mut b: impl FnMut() -> Result<()>,
) -> Result<(Duration, Duration)> {
    a()?;
    b()?;
    let (mut sa, mut sb) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for _ in 0..rounds {
        let start = Instant::now();
        a()?;
        sa.push(start.elapsed());
        let start = Instant::now();
        b()?;
        sb.push(start.elapsed());
    }
    Ok((median(sa), median(sb)))
}

fn ms(d: Duration) -> String {
    format!("{:8.2} ms", d.as_secs_f64() * 1e3)
}

fn rate(bytes: usize, d: Duration) -> String {
    format!(
        "{:6.2} GB/s",
        bytes as f64 / d.as_secs_f64().max(1e-12) / 1e9
    )
}

/// Rank `r`'s input: word `i` is `r + i mod 1000`, so every sum is exact.
fn part(rank: usize, words: usize) -> Vec<u8> {
    (0..words)
        .flat_map(|i| ((rank + i % 1000) as f32).to_le_bytes())
        .collect()
}

/// The direct reduction: read every part, sum in rank order, write the sum
/// to every output, wait for every client. Returns how long each phase
/// took: reads, sum, writes and syncs.
fn direct<B: Backend>(
    clients: &[Client<B>],
    inputs: &[Buffer],
    outputs: &[Buffer],
) -> Result<[Duration; 3]> {
    let start = Instant::now();
    let parts: Vec<Vec<u8>> = clients
        .iter()
        .zip(inputs)
        .map(|(client, input)| client.read(input))
        .collect::<Result<_>>()?;
    let read = start.elapsed();
    let sum = sum_parts(&parts);
    let bytes: Vec<u8> = sum.iter().flat_map(|v| v.to_le_bytes()).collect();
    let summed = start.elapsed();
    for (client, output) in clients.iter().zip(outputs) {
        client.write(output, &bytes)?;
    }
    for client in clients {
        client.sync()?;
    }
    Ok([read, summed - read, start.elapsed() - summed])
}

/// The direct version's sum of parts already on the host: part by part,
/// in rank order.
fn sum_parts(parts: &[Vec<u8>]) -> Vec<f32> {
    let mut sum: Vec<f32> = parts[0]
        .chunks_exact(4)
        .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect();
    for part in &parts[1..] {
        for (s, w) in sum.iter_mut().zip(part.chunks_exact(4)) {
            *s += f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        }
    }
    sum
}

struct Bench;

impl OnClients for Bench {
    type Output = Result<bool>;

    fn run<B: Backend>(self, clients: Vec<Client<B>>) -> Self::Output {
        let ranks = clients.len();
        let software = backends::probe(B::NAME).is_some_and(|p| {
            p.devices.iter().any(|d| {
                d.kind == DeviceKind::Software && clients[0].describe().starts_with(&d.name)
            })
        });
        println!(
            "all_reduce (Sum, F32) over {ranks} {} servers on {}{}",
            B::NAME,
            clients[0].describe(),
            if software {
                " — a software adapter: device memory is host memory"
            } else {
                ""
            }
        );
        let group = Group::new(clients.clone(), DEFAULT_DEADLINE)?;
        let (sizes, rounds): (Vec<usize>, usize) = if smoke() {
            (vec![4, SIZES[0]], 1)
        } else {
            ([4].into_iter().chain(SIZES).collect(), 7)
        };
        let mut met = true;
        for size in sizes {
            let words = size / 4;
            let inputs: Vec<Buffer> = clients
                .iter()
                .enumerate()
                .map(|(r, c)| c.upload(&part(r, words)))
                .collect::<Result<_>>()?;
            let outputs: Vec<Buffer> = clients
                .iter()
                .map(|c| c.allocate(size as u64))
                .collect::<Result<_>>()?;
            for c in &clients {
                c.sync()?;
            }

            let group_run = || -> Result<()> {
                group
                    .run(|rank| {
                        let r = rank.index();
                        rank.all_reduce(
                            inputs[r].all(),
                            outputs[r].all(),
                            Element::F32,
                            Reduce::Sum,
                        )?;
                        rank.client().sync()
                    })
                    .into_iter()
                    .collect()
            };
            // The group's result, checked once, on every rank.
            group_run()?;
            for (r, (c, out)) in clients.iter().zip(&outputs).enumerate() {
                let got = c.read(out)?;
                for i in [0, words / 2, words - 1] {
                    let want: f32 = (0..ranks).map(|k| (k + i % 1000) as f32).sum();
                    let v = f32::from_le_bytes([
                        got[4 * i],
                        got[4 * i + 1],
                        got[4 * i + 2],
                        got[4 * i + 3],
                    ]);
                    assert_eq!(v, want, "rank {r}, word {i}");
                }
            }
            let mut phases: Vec<[Duration; 3]> = Vec::new();
            let (t_group, t_direct) = time_pair(rounds, group_run, || {
                phases.push(direct(&clients, &inputs, &outputs)?);
                Ok(())
            })?;
            let phase = |i: usize| median(phases.iter().skip(1).map(|p| p[i]).collect());
            let (d_reads, d_sum, d_writes) = (phase(0), phase(1), phase(2));

            let all = ranks * size;
            if size == 4 {
                println!(
                    "\nfixed cost, 4 bytes a rank: group all_reduce {}, direct {}: {:.2}×",
                    ms(t_group).trim(),
                    ms(t_direct).trim(),
                    t_group.as_secs_f64() / t_direct.as_secs_f64().max(1e-12)
                );
                continue;
            }
            let source = vec![0x5au8; all];
            let mut sink = vec![0u8; all];
            let t_memcpy = time(rounds, || {
                sink.copy_from_slice(black_box(&source));
                black_box(&mut sink);
                Ok(())
            })?;

            // The group's reads alone and its writes alone, on one thread
            // a rank as the collective runs them.
            let t_reads = time(rounds, || {
                group
                    .run(|rank| rank.client().read(&inputs[rank.index()]).map(drop))
                    .into_iter()
                    .collect()
            })?;
            let sum = part(0, words);
            let t_writes = time(rounds, || {
                group
                    .run(|rank| {
                        rank.client().write(&outputs[rank.index()], &sum)?;
                        rank.client().sync()
                    })
                    .into_iter()
                    .collect()
            })?;

            let ratio = t_group.as_secs_f64() / t_direct.as_secs_f64().max(1e-12);
            let ok = ratio <= 1.2;
            met &= ok;
            let share = |part: Duration, of: Duration| {
                format!(
                    "{} ({:.0}%)",
                    ms(part).trim(),
                    100.0 * part.as_secs_f64() / of.as_secs_f64().max(1e-12)
                )
            };
            println!(
                "\n{} MiB a rank ({} MiB over {ranks} ranks)",
                size >> 20,
                all >> 20
            );
            println!(
                "  group all_reduce  {}  {}  ({:.3}× memcpy's bytes/s)",
                ms(t_group),
                rate(all, t_group),
                t_memcpy.as_secs_f64() / t_group.as_secs_f64().max(1e-12)
            );
            println!(
                "  direct            {}  {}  ({:.3}× memcpy's bytes/s)",
                ms(t_direct),
                rate(all, t_direct),
                t_memcpy.as_secs_f64() / t_direct.as_secs_f64().max(1e-12)
            );
            println!(
                "  host memcpy       {}  {}",
                ms(t_memcpy),
                rate(all, t_memcpy)
            );
            println!(
                "  ratio group / direct {ratio:.2}×  (target ≤ 1.2×: {})",
                if ok { "met" } else { "MISSED" }
            );
            println!(
                "  direct's phases:    reads {}, sum {}, writes and syncs {}",
                share(d_reads, t_direct),
                share(d_sum, t_direct),
                share(d_writes, t_direct)
            );
            println!(
                "  group's, timed alone: reads {}, writes and syncs {}; the rest, rendezvous and reduction, {}",
                share(t_reads, t_group),
                share(t_writes, t_group),
                share(t_group.saturating_sub(t_reads + t_writes), t_group)
            );
        }
        Ok(met)
    }
}

/// The backend `cargo xtask demo` would pick: a vendor's (CUDA, HIP) or a
/// hardware device, in the table's order, then wgpu, then Vulkan.
fn backend() -> Option<String> {
    if let Ok(name) = std::env::var("SCOPE_BENCH_BACKEND") {
        return Some(name);
    }
    let rank = |kind: BackendKind| {
        let probe = backends::probe(kind.name()).filter(Probe::has_device)?;
        let hardware = probe.devices.iter().any(|d| d.kind == DeviceKind::Hardware);
        Some(match kind.drivers() {
            Drivers::Vendor => 0,
            _ if hardware => 0,
            Drivers::Portable => 1,
            Drivers::Vulkan => 2,
        })
    };
    BackendKind::ALL
        .iter()
        .enumerate()
        .filter_map(|(order, &kind)| Some(((rank(kind)?, order), kind)))
        .min()
        .map(|(_, kind)| kind.name().to_owned())
}

fn main() {
    // SAFETY: the first statements of `main`, before any other thread
    // exists, so nothing reads the environment concurrently.
    unsafe {
        if std::env::var_os("LP_NUM_THREADS").is_none() {
            std::env::set_var("LP_NUM_THREADS", "0");
        }
        if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
            let dir = std::env::temp_dir().join(format!("scope-bench-{}", std::process::id()));
            let _ = std::fs::create_dir_all(&dir);
            std::env::set_var("XDG_RUNTIME_DIR", dir);
        }
    }
    let Some(backend) = backend() else {
        println!("skipped: no device for any linked backend");
        return;
    };
    match backends::with_clients(&backend, RANKS, Bench) {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => println!("\nthe group missed its target (≤ 1.2× direct) at some size"),
        Ok(Err(error)) | Err(error) => {
            eprintln!("all_reduce bench: {error}");
            std::process::exit(1);
        }
    }
}
