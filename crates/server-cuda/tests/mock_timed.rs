//! The timed mock: kernels and collectives that take modelled time. Here
//! the `ddp_step` bench runs its four schedules side by side over four
//! ranks, and a round late past the deadline or faulted after issue is
//! failed by the watchdog, with the work issued after it that reads its
//! output.
//!
//! By default it runs at smoke scale, with modelled times near zero: the
//! bench's code runs and every weight is checked, and scope's schedule
//! must drain no stream. `SCOPE_MOCK_BENCH_FULL=1` prints the table:
//!
//! ```text
//! SCOPE_MOCK_BENCH_FULL=1 cargo test --release -p server-cuda --test mock_timed -- --nocapture
//! ```
//!
//! Sleeping workers cost no CPU, so wall time on a small machine measures
//! the modelled schedule, plus the host's own cost. One call's host time
//! is printed over 1, 2 and 4 ranks: past one rank per core, ranks wait
//! for a core, and the mock takes one lock for every call of every rank,
//! which raw NCCL's calls pay as well.

mod common;
#[path = "mock/harness.rs"]
mod harness;

// The bench's `main` is not called from here.
#[allow(dead_code)]
#[path = "../benches/ddp_step.rs"]
mod ddp_step;

use std::time::{Duration, Instant};

use common::{ADD, COPY, bytes, kernel};
use ddp_step::{Schedule, Shape};
use harness::mock;
use scope_core::collective::device::DeviceCollectives;
use scope_core::collective::remote::Liveness;
use scope_core::collective::{CollectiveError, Element, Group, Rank, Reduce};
use scope_core::{Binding, Client, Dispatch, Error};
use scope_test::inflight::{
    RoundThenWork, a_fault_on, a_round_in_flight_then_a_failed_issue, a_round_then_work_reading_it,
    fails_as_a_stalled_round, fails_as_an_injected_fault, the_earlier_round_reads_right,
};
use server_cuda::Cuda;

/// What the timed mock is told a step's work costs.
struct Model {
    name: &'static str,
    /// A layer's backward kernel.
    layer: Duration,
    /// The optimizer over the whole gradient.
    optimizer: Duration,
    /// A collective's fixed cost.
    latency: Duration,
    /// The link's bus bandwidth, for the bytes a real layer has.
    bandwidth: f64,
}

/// A layer's real gradient: 32 MiB, of which the mock moves 16 KiB, at a
/// bandwidth scaled by the same factor. Every call is scaled alike, so a
/// ballot of ranks joined alone (1 KiB a rank) is modelled as 2 MiB: about
/// 24 µs NVLink-class and 109 µs InfiniBand-class, where a real one takes
/// about the latency. The joined-alone figures carry that.
const STANDS_FOR: f64 = 2048.0;

const NVLINK: Model = Model {
    name: "NVLink-class (150 GB/s, 10 µs)",
    layer: Duration::from_millis(1),
    optimizer: Duration::from_millis(2),
    latency: Duration::from_micros(10),
    bandwidth: 150e9,
};

const INFINIBAND: Model = Model {
    name: "InfiniBand-class (25 GB/s, 25 µs)",
    layer: Duration::from_millis(1),
    optimizer: Duration::from_millis(2),
    latency: Duration::from_micros(25),
    bandwidth: 25e9,
};

/// `model` in the timed mock, for a step of `buckets` buckets: the
/// optimizer is one `accumulate` per bucket.
fn apply(model: &Model, buckets: u32) {
    let m = mock();
    m.timing(true);
    m.kernel_time("fill", model.layer);
    m.kernel_time("accumulate", model.optimizer / buckets);
    m.nccl_model(model.latency, model.bandwidth / STANDS_FOR);
}

#[test]
fn every_schedule_computes_the_same_weights_and_scope_drains_nothing() {
    let _timed = TIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let clients = clients();
    apply(
        &Model {
            name: "smoke",
            layer: Duration::from_micros(20),
            optimizer: Duration::from_micros(20),
            latency: Duration::from_micros(1),
            bandwidth: 0.0,
        },
        1,
    );
    let shape = Shape {
        layers: 8,
        words: 256,
        steps: 2,
    };
    for buckets in [1, 8] {
        for schedule in Schedule::ALL {
            let step = ddp_step::step(schedule, &clients, shape, buckets);
            match schedule {
                Schedule::Scope | Schedule::ScopeAlone => {
                    assert_eq!(step.drains, 0.0, "{}, B = {buckets}", schedule.name());
                }
                Schedule::ScopeBefore => assert!(step.drains >= buckets as f64, "B = {buckets}"),
                Schedule::Raw => {}
            }
        }
    }
    mock().timing(false);
    mock().assert_clean();
}

#[test]
fn the_table() {
    if std::env::var_os("SCOPE_MOCK_BENCH_FULL").is_none() {
        println!("not exercised: SCOPE_MOCK_BENCH_FULL=1 prints the table");
        return;
    }
    let _timed = TIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let clients = clients();
    let shape = Shape {
        layers: 32,
        words: 4096,
        steps: 5,
    };
    println!(
        "ddp_step over the timed mock: 4 ranks, {} layers, {} steps per figure; \
         each layer's 16 KiB gradient stands for {} MiB",
        shape.layers,
        shape.steps,
        (STANDS_FOR * 16.0 / 1024.0) as u64
    );
    for model in [&NVLINK, &INFINIBAND] {
        apply(model, 1);
        println!(
            "{}: layer {:?}, optimizer {:?}",
            model.name, model.layer, model.optimizer
        );
        for buckets in [1, 8, 32] {
            apply(model, buckets as u32);
            ddp_step::table_row(&clients, shape, buckets);
        }
        for ranks in [1, 2, 4] {
            let clients = &clients[..ranks];
            for (bytes, stands_for) in [(4u64, 4.0), (8192, 16.0 * 1024.0 * 1024.0)] {
                let host = ddp_step::call_time(clients, bytes, 20, false);
                let alone = ddp_step::call_time(clients, bytes, 20, true);
                let raw = ddp_step::raw_call_time(clients, bytes, 20);
                let device = model.latency.as_secs_f64() + stands_for / model.bandwidth;
                let us = |d: Duration| d.as_secs_f64() * 1e6;
                println!(
                    "  one all_reduce of {} over {ranks} rank(s): scope {:.1} µs ({:.3}× its round \
                     of {:.1} µs modelled, {:.2}× raw); joined alone {:.1} µs ({:.3}×); \
                     raw ncclAllReduce {:.1} µs ({:.3}×)",
                    if bytes == 4 { "4 B" } else { "16 MiB" },
                    us(host),
                    host.as_secs_f64() / device,
                    device * 1e6,
                    host.as_secs_f64() / raw.as_secs_f64(),
                    us(alone),
                    alone.as_secs_f64() / device,
                    us(raw),
                    raw.as_secs_f64() / device,
                );
            }
        }
    }
    mock().timing(false);
    mock().assert_clean();
}

/// Rank 2's device is busy past the deadline before its part of a round
/// can start: the round was decided clean and issued, every call returned,
/// and the watchdog fails the round on every rank at the deadline, with
/// `Stalled`, before the abort lets a read through; the group is broken
/// (rules 42, 47).
#[test]
fn a_round_late_past_the_deadline_fails_every_rank() {
    let _timed = TIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    rank_2_busy_for(Duration::from_secs(3));
    a_late_round_fails_every_rank_at_its_deadline();
    timing_off();
}

/// A group dropped while rank 2's part of its round waits 3 s waits for
/// the round on the dropping thread, and the watchdog's one thread, which
/// never drops a group (a server's sync, a communicator's destroy), keeps
/// the next group's deadline.
#[test]
fn a_group_dropped_in_flight_never_delays_another_groups_deadline() {
    let _timed = TIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    rank_2_busy_for(Duration::from_secs(3));
    let group = Group::over_device(clients(), Duration::from_secs(30)).expect("a group");
    a_round_with_rank_2_busy(&group);
    drop(group);
    a_late_round_fails_every_rank_at_its_deadline();
    timing_off();
}

/// A group dropped once its round returned fails the round at its
/// deadline: a read of its output, through a client kept past the group,
/// learns `Stalled`, and never waits on the late rank.
#[test]
fn a_round_of_a_dropped_group_still_fails_at_its_deadline() {
    let _timed = TIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    rank_2_busy_for(Duration::from_secs(3));
    let group = Group::over_device(clients(), Duration::from_millis(300)).expect("a group");
    let kept = a_round_with_rank_2_busy(&group);
    drop(group);
    for (rank, (c, output)) in kept.into_iter().enumerate() {
        let error = c
            .read(&output)
            .expect_err("no rank reads a round its dropped group never finished");
        let Error::Collective(failed) = error.root() else {
            panic!("rank {rank}: {error}");
        };
        assert!(
            matches!(**failed, CollectiveError::Stalled { .. }),
            "rank {rank}: {error}"
        );
    }
    timing_off();
}

/// An all-reduce issued on every rank, rank 2's input written after its
/// busy copy: each rank's client and output, to keep past the group.
fn a_round_with_rank_2_busy(group: &Group<Cuda>) -> Vec<(Client<Cuda>, scope_core::Buffer)> {
    group.run(|rank| {
        let c = rank.client();
        let input = c.upload(&bytes(&[1; 64])).unwrap();
        rank_2_busy(&rank, &input);
        let output = c.try_allocate(256).unwrap();
        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
            .expect("the round was issued");
        (c.clone(), output)
    })
}

/// Model rank 2's busy copy as `busy`, and rounds as near instant.
fn rank_2_busy_for(busy: Duration) {
    mock().timing(true);
    mock().kernel_time("copy", busy);
    mock().nccl_model(Duration::from_micros(10), 0.0);
}

fn timing_off() {
    mock().kernel_time("copy", Duration::ZERO);
    mock().timing(false);
}

/// A round over fresh clients with a deadline of 300 ms, rank 2 busy past
/// it, fails on every rank with `Stalled`, every rank but 2 by 2 s.
fn a_late_round_fails_every_rank_at_its_deadline() {
    let deadline = Duration::from_millis(300);
    let group = Group::over_device(clients(), deadline).expect("a group");
    let started = Instant::now();
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let input = c.upload(&bytes(&[rank.index() as u32 + 1; 64])).unwrap();
        if rank.index() == 2 {
            busy_before(c, &input);
        }
        let output = c.try_allocate(256).unwrap();
        let called = rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
        let read = c.read(&output);
        (called, read, started.elapsed())
    });
    for (rank, (called, read, at)) in outcomes.into_iter().enumerate() {
        called.unwrap_or_else(|e| panic!("rank {rank}: the round was issued: {e}"));
        let error = read.expect_err("no rank reads a round a late peer never joined");
        let Error::Collective(failed) = error.root() else {
            panic!("rank {rank}: {error}");
        };
        assert!(
            matches!(**failed, CollectiveError::Stalled { .. }),
            "rank {rank}: {error}"
        );
        if rank != 2 {
            assert!(
                at < Duration::from_secs(2),
                "rank {rank} waited for the late rank's work: {at:?}"
            );
        }
    }
    assert!(
        group.broken().is_some(),
        "a round failed in flight breaks the group"
    );
}

/// Work issued after a round that reads the round's output and writes a
/// buffer written just before the call — the optimizer reading the
/// all-reduced gradient — carries the round's failure when the round
/// fails in flight, for a call and for a replay: the in-flight ledger
/// claims every write issued after the round, however recently its range
/// was written before it (rules 23, 47, 50). Rank 2's device is busy past
/// the deadline, as above.
#[test]
fn work_after_a_round_that_fails_in_flight_carries_its_failure() {
    for outcomes in with_rank_2_busy(Duration::from_millis(300), |_| {}) {
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            fails_as_a_stalled_round(rank, outcome);
        }
    }
}

/// Rank 1's device takes a sticky fault, by fault injection, just after its
/// part of a round was issued, for a call and for a replay. Rank 2's device
/// is busy for 3 s first, so the round cannot have finished; the deadline
/// is past that. A faulted device finishes nothing, as a real one does: the
/// round fails on every rank naming rank 1's fault, and no output or work
/// after it reads as clean (rules 36, 47, 50).
#[test]
fn a_fault_injected_after_a_part_was_issued_fails_its_round() {
    for outcomes in with_rank_2_busy(Duration::from_secs(5), a_fault_on(1)) {
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            fails_as_an_injected_fault(rank, 1, outcome);
        }
    }
}

/// Rank 2's device is busy for 500 ms before its part of a first round can
/// start, when rank 0's call of a second round fails. The abort that
/// releases the second round's peers would end the first round's parts
/// unfinished and leave their outputs scribbled: it waits for them, so the
/// first round reads its sum on every rank (rules 47, 49).
#[test]
fn a_failed_issue_never_ends_an_earlier_round_in_flight() {
    let _timed = TIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    rank_2_busy_for(Duration::from_millis(500));
    let group = Group::over_device(clients(), Duration::from_secs(10)).expect("a group");
    let outcomes = a_round_in_flight_then_a_failed_issue(&group, rank_2_busy);
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        the_earlier_round_reads_right(rank, outcome);
    }
    timing_off();
}

/// Ranks joined alone: a round waits on the device for a producer busy
/// for seconds, and the next call's ballot, on a communicator of its own,
/// does not wait behind it — the mock runs one communicator's kernels in
/// issue order, as NCCL does, so a ballot on the rounds' communicator
/// would. Both rounds compute right (rules 47, 49).
#[test]
fn a_ballot_never_waits_behind_a_round_in_flight() {
    let _timed = TIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let clients = clients();
    mock().timing(true);
    mock().kernel_time("copy", Duration::from_secs(2));
    mock().nccl_model(Duration::from_micros(10), 0.0);
    let identity = <Cuda as DeviceCollectives>::identity().expect("the mock NCCL");
    let deadline = Duration::from_secs(30);
    let outcomes: Vec<_> = std::thread::scope(|scope| {
        let threads: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(r, client)| {
                let identity = &identity;
                scope.spawn(move || {
                    let rank = Rank::join(client, identity, r, 4, deadline).expect("a rank");
                    let c = rank.client();
                    let value = r as u32 + 1;
                    let source = c.upload(&bytes(&[value; 64])).unwrap();
                    let slow = c.try_allocate(256).unwrap();
                    let quick = c.upload(&bytes(&[10 * value; 64])).unwrap();
                    c.launch(
                        &kernel("copy", COPY),
                        &[Binding::read(&source), Binding::write(&slow)],
                        &bytes(&[64]),
                        Dispatch::linear(1),
                    )
                    .unwrap();
                    rank.all_reduce(slow.all(), slow.all(), Element::U32, Reduce::Sum)
                        .expect("the first round");
                    let began = Instant::now();
                    rank.all_reduce(quick.all(), quick.all(), Element::U32, Reduce::Sum)
                        .expect("the second round");
                    let second = began.elapsed();
                    (second, c.read(&slow), c.read(&quick))
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("rank"))
            .collect()
    });
    for (rank, (second, slow, quick)) in outcomes.into_iter().enumerate() {
        assert!(
            second < Duration::from_secs(1),
            "rank {rank}'s second call waited for the first round: {second:?}"
        );
        assert_eq!(slow.unwrap(), bytes(&[10; 64]), "rank {rank}'s first round");
        assert_eq!(
            quick.unwrap(),
            bytes(&[100; 64]),
            "rank {rank}'s second round"
        );
    }
    mock().kernel_time("copy", Duration::ZERO);
    mock().timing(false);
    mock().assert_clean();
}

/// A liveness that says rank 2 is gone once told to.
struct Told(std::sync::atomic::AtomicBool);

impl Liveness for Told {
    fn gone(&self) -> Option<Vec<usize>> {
        self.0
            .load(std::sync::atomic::Ordering::SeqCst)
            .then(|| vec![2])
    }
}

/// Ranks joined alone, as in separate processes. Rank 2's device is busy
/// for 3 s before its part of a round can start; rank 0's part is in
/// flight when its liveness reports rank 2 gone. Its watchdog fails the
/// round at once as `Missing` naming rank 2, not `Stalled` at the 30 s
/// deadline, and its output does not read as clean (rule 49). Only rank
/// 0 reads: in one process the mock NCCL ends every rank's part of a
/// clique at one rank's abort, which NCCL across processes does not.
#[test]
fn a_round_in_flight_fails_naming_the_rank_its_liveness_reports_gone() {
    let _timed = TIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let clients = clients();
    rank_2_busy_for(Duration::from_secs(3));
    let identity = <Cuda as DeviceCollectives>::identity().expect("the mock NCCL");
    let told = std::sync::Arc::new(Told(false.into()));
    let read = std::thread::scope(|scope| {
        let threads: Vec<_> = (clients.into_iter().enumerate())
            .map(|(r, client)| {
                let (identity, told) = (&identity, told.clone());
                scope.spawn(move || {
                    let deadline = Duration::from_secs(30);
                    let rank = Rank::join(client, identity, r, 4, deadline).expect("a rank");
                    let c = rank.client();
                    let input = c.upload(&bytes(&[r as u32 + 1; 64])).unwrap();
                    rank_2_busy(&rank, &input);
                    let output = c.try_allocate(256).unwrap();
                    if r == 0 {
                        rank.watch_liveness(told.clone())
                            .expect("the first liveness");
                    }
                    let called =
                        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
                    // A peer still polling its ballot may meet rank 0's abort.
                    (r == 0).then(|| {
                        called.expect("rank 0's round is issued");
                        told.0.store(true, std::sync::atomic::Ordering::SeqCst);
                        c.read(&output)
                    })
                })
            })
            .collect();
        let mut reads = threads.into_iter().map(|t| t.join().expect("rank"));
        reads.next().flatten().expect("rank 0 reads")
    });
    let error = read.expect_err("no output of a round a gone rank held reads clean");
    let Error::Collective(failed) = error.root() else {
        panic!("{error}");
    };
    let CollectiveError::Missing { missing, .. } = &**failed else {
        panic!("{error}");
    };
    assert_eq!(missing, &[2], "{error}");
    timing_off();
}

/// The mock's timing is the process's: one test at a time sets it.
pub static TIMED: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Four mock devices, one client each.
pub fn clients() -> Vec<Client<Cuda>> {
    mock();
    (0..4)
        .map(|rank| server_cuda::client_on(rank).expect("a mock device"))
        .collect()
}

/// Keep `c`'s stream busy for the copy kernel's modelled time before
/// `input` is written: a part of a round on `input` starts only after it.
pub fn busy_before(c: &Client<Cuda>, input: &scope_core::Buffer) {
    let busy = c.try_allocate(256).unwrap();
    c.launch(
        &kernel("copy", COPY),
        &[Binding::read(&busy), Binding::write(input)],
        &bytes(&[0]),
        Dispatch::linear(1),
    )
    .unwrap();
}

/// [`busy_before`] on rank 2 only.
pub fn rank_2_busy(rank: &Rank<Cuda>, input: &scope_core::Buffer) {
    if rank.index() == 2 {
        busy_before(rank.client(), input);
    }
}

/// [`a_round_then_work_reading_it`] as a call, then as a replay, over a
/// group with `deadline`, rank 2's device busy for 3 s before the round.
pub fn with_rank_2_busy(
    deadline: Duration,
    after: impl Fn(&Rank<Cuda>) + Sync + Copy,
) -> Vec<Vec<RoundThenWork>> {
    let _timed = TIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    rank_2_busy_for(Duration::from_secs(3));
    let add = kernel("add", ADD);
    let outcomes = [false, true]
        .map(|replayed| {
            let group = Group::over_device(clients(), deadline).expect("a group");
            a_round_then_work_reading_it(&group, replayed, &add, rank_2_busy, after)
        })
        .into();
    timing_off();
    outcomes
}
