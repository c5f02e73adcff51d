//! What liveness costs a training step in steady state: a step with every
//! worker's heartbeat running, over the same step without, side by side in
//! one run.
//!
//! The step: four ranks of the reference host server in one process, over
//! its loopback device transport, each all-reducing `SIZE` bytes of `f32`
//! and reading the result, a thread a rank. With heartbeats, each rank is
//! also a `Launched` worker of an embedded coordinator in this process,
//! renewing its lease four times a window. The heartbeat's work (a thread's
//! wake and one request on loopback TCP) is the same as across processes;
//! the step is the host server's, which on a real device is slower, so the
//! ratio here is an upper bound on the heartbeat's share.
//!
//! Two windows: the default (1 s) and a tight one (100 ms, forty renewals
//! a second a worker). Each round runs every way once, interleaved; each
//! figure is the median of its rounds. `SCOPE_BENCH_SMOKE=1` runs one round.

use std::sync::Arc;
use std::time::{Duration, Instant};

use scope_core::Client;
use scope_core::collective::{Element, Group, Reduce};
use scope_launch::embedded::Embedded;
use scope_launch::settings::keys;
use scope_launch::{Coordinator, Launched, Settings, Store};
use scope_test::host::{Host, client};

const RANKS: usize = 4;
const SIZE: u64 = 1 << 20;
/// Steps a measurement: about two seconds, two windows of the default.
const STEPS: usize = 200;
const DEADLINE: Duration = Duration::from_secs(120);

fn smoke() -> bool {
    std::env::var("SCOPE_BENCH_SMOKE").is_ok_and(|v| v == "1")
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// `STEPS` steps of the group; the mean time a step.
fn steps(group: &Group<Host>) -> Duration {
    let count = if smoke() { 2 } else { STEPS };
    let began = Instant::now();
    group.run(|rank| {
        let c = rank.client();
        let input = c.upload(&vec![1u8; SIZE as usize]).expect("an input");
        let output = c.try_allocate(SIZE).expect("an output");
        for _ in 0..count {
            rank.all_reduce(input.all(), output.all(), Element::F32, Reduce::Sum)
                .expect("a round");
            c.read(&output).expect("the sum");
        }
    });
    began.elapsed() / count as u32
}

/// Four workers of an embedded coordinator, heartbeating with `window`.
fn workers(served: &Embedded, window: Duration) -> Vec<Launched> {
    let job = format!("bench-{}", window.as_millis());
    let store = served.store();
    store
        .put(&keys::ranks(&job), RANKS.to_string().as_bytes(), None)
        .unwrap();
    store.put(&keys::epoch(&job), b"0", None).unwrap();
    let lease = store.grant(Duration::from_secs(3600)).unwrap();
    store
        .put(&keys::launcher(&job), b"bench", Some(lease))
        .unwrap();
    (0..RANKS)
        .map(|rank| {
            Launched::with(Settings {
                rank,
                ranks: RANKS,
                epoch: 0,
                coordinator: served.address(),
                liveness: window,
                restart: 0,
                job: job.clone(),
            })
            .expect("a worker joins")
        })
        .collect()
}

fn main() {
    let clients: Vec<Client<Host>> = (0..RANKS)
        .map(|_| client().expect("a host client"))
        .collect();
    let group = Group::over_device(clients, DEADLINE).expect("a group");
    let served = Embedded::start(Arc::new(Store::new())).expect("a coordinator");
    let rounds = if smoke() { 1 } else { 11 };
    let windows = [Duration::from_secs(1), Duration::from_millis(100)];
    let mut without = Vec::new();
    let mut with: Vec<Vec<Duration>> = vec![Vec::new(); windows.len()];
    steps(&group); // warm: the first round allocates the mailbox
    for _ in 0..rounds {
        without.push(steps(&group));
        for (w, &window) in windows.iter().enumerate() {
            let beating = workers(&served, window);
            with[w].push(steps(&group));
            for worker in &beating {
                worker.healthy().expect("every heartbeat held");
            }
        }
    }
    let base = median(without);
    println!(
        "liveness: {RANKS} ranks, host server, loopback transport, {} MiB f32 all-reduce + read a step, {rounds} rounds, median",
        SIZE >> 20
    );
    println!(
        "  no heartbeat          {:>10.3} ms/step",
        base.as_secs_f64() * 1e3
    );
    for (w, window) in windows.iter().enumerate() {
        let step = median(with[w].clone());
        println!(
            "  heartbeat, {:>4} ms window {:>10.3} ms/step   ratio {:.3}×",
            window.as_millis(),
            step.as_secs_f64() * 1e3,
            step.as_secs_f64() / base.as_secs_f64()
        );
    }
}
