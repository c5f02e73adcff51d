//! Rounds in flight over a device transport (rule 47): a round returns
//! once issued, drains no stream, and leaves every byte right however the
//! caller goes on — more rounds, frees, reads from another stream.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use super::collective::{
    DEFAULT_WAIT, PART, RANKS, a_new_group_over_its_devices_works, collective_error,
    every_rank_sums_its_ones, group,
};
use super::membership::lose_device;
use super::*;
use scope_core::Recovered;
use scope_core::collective::{CollectiveError, Element, Group, Rank, Reduce};

/// Rounds issued back to back without a read or a sync.
const ROUNDS: usize = 1_000;

/// Replays issued back to back without a read or a sync.
const REPLAYS: usize = 100;

/// Rounds each rank has issued when one rank's device is lost.
const IN_FLIGHT: usize = 8;

/// The rank whose device is lost.
const LOST: usize = 2;

/// A read of a round's output on a rank that kept its device: the round's
/// bytes, or a failure the round carries (a peer's fault, the deadline)
/// — never other bytes as clean (rule 47).
fn right_or_failed(rank: usize, k: usize, read: Result<Vec<u32>>, sum: u32) {
    match read {
        Ok(bytes) => assert_eq!(bytes, vec![sum; PART as usize], "rank {rank}'s round {k}"),
        Err(error) => assert!(
            matches!(error.root(), Error::Collective(_)),
            "rank {rank}'s round {k} fails as a round does: {error}"
        ),
    }
}

/// Every part of `group`'s rounds landed, as the watchdog saw it, within
/// a second of every output having been read.
fn every_part_lands<B: Backend>(group: &Group<B>) {
    let until = Instant::now() + Duration::from_secs(5);
    while group.rounds_in_flight() > 0 {
        assert!(
            Instant::now() < until,
            "{} parts still in flight after every output was read",
            group.rounds_in_flight()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A thousand rounds issued without a read or a sync drain no rank's
/// stream, hold no more memory than their buffers, and every output is
/// right at the end; the watchdog's list empties once they completed
/// (rule 47).
pub fn device_rounds_drain_no_stream<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    assert!(group.is_over_device(), "a behaviour of device transports");
    let ranks = RANKS as u32;
    let results = group.run(|rank| {
        let c = rank.client();
        let r = rank.index() as u32;
        let input = upload(c, &vec![r + 1; PART as usize]);
        let output = alloc(c, PART);
        let (drains, bytes) = (c.drains(), c.bytes_allocated());
        for _ in 0..ROUNDS {
            rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
                .unwrap();
        }
        let drained = c.drains() - drains;
        let grew = c.bytes_allocated().saturating_sub(bytes);
        (drained, grew, read_twice::<S>(c, &output).unwrap())
    });
    let sum = ranks * (ranks + 1) / 2;
    for (rank, (drained, grew, output)) in results.into_iter().enumerate() {
        assert_eq!(drained, 0, "rank {rank}'s stream was drained by a round");
        assert_eq!(grew, 0, "rank {rank} holds more memory after the rounds");
        assert_eq!(output, vec![sum; PART as usize], "rank {rank}'s output");
    }
    every_part_lands(&group);
}

/// A graph of rounds replayed a hundred times without a read or a sync
/// drains no rank's stream, and its outputs are right at the end; the
/// watchdog's list empties once the replays completed (rules 47, 50).
pub fn replays_drain_no_stream<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    assert!(group.is_over_device(), "a behaviour of device transports");
    let ranks = RANKS as u32;
    let results = group.run(|rank| {
        let c = rank.client();
        let g = super::recorded::record_sized(&rank, PART, RANKS);
        let r = rank.index() as u32;
        c.write(g.input.all(), &as_bytes(&vec![r + 1; PART as usize]))
            .unwrap();
        let drains = c.drains();
        for _ in 0..REPLAYS {
            rank.replay(&g.graph).unwrap();
        }
        let drained = c.drains() - drains;
        (
            drained,
            read_twice::<S>(c, &g.sum).unwrap(),
            read_twice::<S>(c, &g.gathered).unwrap(),
        )
    });
    let gathered: Vec<u32> = (1..=ranks)
        .flat_map(|r| std::iter::repeat_n(r, PART as usize))
        .collect();
    for (rank, (drained, sum, all)) in results.into_iter().enumerate() {
        assert_eq!(drained, 0, "rank {rank}'s stream was drained by a replay");
        let total = ranks * (ranks + 1) / 2;
        assert_eq!(sum, vec![total; PART as usize], "rank {rank}'s sum");
        assert_eq!(all, gathered, "rank {rank}'s gather");
    }
    every_part_lands(&group);
}

/// The caller frees a round's input, or its output, while the round may
/// be in flight, then allocates and writes a new buffer: the round's bytes
/// and the new buffer's are both right (rule 47).
pub fn freeing_a_rounds_buffers_in_flight_leaves_every_byte_right<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    let ranks = RANKS as u32;
    let results = group.run(|rank| {
        let c = rank.client();
        let r = rank.index() as u32;
        let input = upload(c, &vec![r + 1; PART as usize]);
        let output = alloc(c, PART);
        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
            .unwrap();
        c.free(&input).unwrap();
        let after_input = upload(c, &vec![7; PART as usize]);
        let reduced = read_twice::<S>(c, &output).unwrap();

        let input = upload(c, &vec![r + 1; PART as usize]);
        let output = alloc(c, PART);
        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Max)
            .unwrap();
        c.free(&output).unwrap();
        let after_output = upload(c, &vec![9; PART as usize]);
        (
            reduced,
            read_twice::<S>(c, &after_input).unwrap(),
            read_twice::<S>(c, &after_output).unwrap(),
            read_twice::<S>(c, &input).unwrap(),
        )
    });
    let sum = ranks * (ranks + 1) / 2;
    for (rank, (reduced, after_input, after_output, input)) in results.into_iter().enumerate() {
        assert_eq!(reduced, vec![sum; PART as usize], "rank {rank}'s round");
        assert_eq!(
            after_input,
            vec![7; PART as usize],
            "rank {rank}'s new buffer"
        );
        assert_eq!(
            after_output,
            vec![9; PART as usize],
            "rank {rank}'s new buffer"
        );
        assert_eq!(
            input,
            vec![rank as u32 + 1; PART as usize],
            "rank {rank}'s input is left as it was"
        );
    }
    every_part_lands(&group);
}

/// A round's output read through another stream of the same server waits
/// for the round on the device and reads it right (rules 45, 47).
pub fn a_rounds_output_reads_right_from_another_stream<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    let results = group.run(|rank| {
        let c = rank.client();
        let r = rank.index() as u32;
        let input = upload(c, &vec![r + 1; PART as usize]);
        let output = alloc(c, PART);
        rank.all_gather(input.all(), alloc(c, PART * RANKS as u32).all())
            .unwrap();
        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Max)
            .unwrap();
        let other = c.new_stream().unwrap();
        read(&other, &output).unwrap()
    });
    for (rank, output) in results.into_iter().enumerate() {
        assert_eq!(output, vec![RANKS as u32; PART as usize], "rank {rank}");
    }
}

/// Rank 2's device is lost with rounds in flight on every rank, and it
/// recovers at once; its peers shrink meanwhile. A round its part had not
/// finished fails on every rank. No output reads wrong bytes as clean: the
/// peers' are the round's or fail as a round does, the lost rank's are lost
/// with its device. The survivors go on, then admit it back (rules 47, 51,
/// 54, 56).
pub fn a_rank_lost_with_rounds_in_flight_recovers_while_its_peers_shrink<S: Suite>() {
    // Short: a peer whose shrink starts after the lost rank recovered
    // waits for it until the deadline, then leaves it out (rule 54).
    let Some(group) = group::<S>(Duration::from_secs(3)) else {
        return;
    };
    assert!(group.is_over_device(), "a behaviour of device transports");
    let lost = Barrier::new(RANKS);
    let ranks = RANKS as u32;
    let sum = ranks * (ranks + 1) / 2;
    let results = group.run(|rank| {
        let c = rank.client();
        let r = rank.index() as u32;
        let input = upload(c, &vec![r + 1; PART as usize]);
        let outputs: Vec<Buffer> = (0..IN_FLIGHT).map(|_| alloc(c, PART)).collect();
        for output in &outputs {
            let called = rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
            if let Err(error) = called {
                // The loss may fail a round before a peer's part went out.
                assert!(
                    rank.index() != LOST && matches!(error, Error::Collective(_)),
                    "rank {}: {error}",
                    rank.index()
                );
            }
        }
        if rank.index() == LOST {
            lose_device::<S>(c);
            lost.wait();
            let recovered = c.recover();
            assert!(
                matches!(recovered, Ok(Recovered::Reopened { .. })),
                "the lost rank reopens with its rounds in flight: {recovered:?}"
            );
            for (k, output) in outputs.iter().enumerate() {
                let error = read_twice::<S>(c, output).expect_err("lost with the device");
                assert!(error.is_lost_with_device(), "round {k}: {error}");
            }
            return None;
        }
        lost.wait();
        let shrunk = rank.shrink().expect("the survivors go on");
        for (k, output) in outputs.iter().enumerate() {
            right_or_failed(rank.index(), k, read_twice::<S>(c, output), sum);
        }
        let ones = upload(c, &[1; PART as usize]);
        shrunk
            .all_reduce(ones.all(), ones.all(), Element::U32, Reduce::Sum)
            .unwrap();
        assert_eq!(read_twice::<S>(c, &ones).unwrap(), vec![3; PART as usize]);
        Some(shrunk)
    });
    let survivors: Vec<_> = results.into_iter().flatten().collect();
    assert_eq!(survivors.len(), RANKS - 1);
    let newcomer = group.rank(LOST).unwrap().client().clone();
    let admitted = survivors[0]
        .group()
        .run(|rank| rank.admit(std::slice::from_ref(&newcomer)).unwrap());
    every_rank_sums_its_ones::<S>(&admitted[0].group());
}

/// Every rank records rounds into a capture window, and rank 2's device
/// is lost before its window ends. Its window is aborted with the rounds
/// in it. Its peers' replays fail within the deadline, naming it missing,
/// their outputs claimed. A new group over the same devices works (rules
/// 42, 50, 53).
pub fn a_capture_holding_rounds_aborted_by_a_loss_fails_every_replay<S: Suite>() {
    let deadline = Duration::from_millis(500);
    let Some(group) = group::<S>(deadline) else {
        return;
    };
    assert!(group.is_over_device(), "a behaviour of device transports");
    let started = Instant::now();
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let input = upload(c, &[1; PART as usize]);
        let output = upload(c, &[5; PART as usize]);
        let window = c.begin_capture().unwrap();
        for _ in 0..IN_FLIGHT {
            rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
                .expect("recorded on every rank");
        }
        if rank.index() == LOST {
            lose_device::<S>(c);
            assert!(
                matches!(c.recover(), Ok(Recovered::Reopened { .. })),
                "the device opens again"
            );
            assert_eq!(c.capture_state(), CaptureState::NoCapture, "aborted");
            assert!(c.end_capture(window).is_err(), "no window left to end");
            let error = read_twice::<S>(c, &output).expect_err("lost with the device");
            assert!(error.is_lost_with_device(), "{error}");
            return None;
        }
        let graph = c.end_capture(window).expect("a peer's window seals");
        let replayed = rank.replay(&graph);
        let claim = read_twice::<S>(c, &output).expect_err("the replay's failure is claimed");
        Some((replayed, collective_error(claim.root()).clone()))
    });
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "bounded by the deadline: {:?}",
        started.elapsed()
    );
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let Some((replayed, claim)) = outcome else {
            assert_eq!(rank, LOST);
            continue;
        };
        let error = replayed.expect_err("rank 2 never replays");
        for reported in [collective_error(&error), &claim] {
            assert!(
                matches!(reported, CollectiveError::Missing { missing, .. } if missing.contains(&LOST))
                    || matches!(reported, CollectiveError::Broken { .. }),
                "rank {rank}: {reported}"
            );
        }
    }
    assert!(group.broken().is_some());
    a_new_group_over_its_devices_works::<S>(group);
}

/// What one rank reported of [`a_round_then_work_reading_it`]: its call,
/// the launch after it, and its reads of the round's output and the
/// launch's.
pub type RoundThenWork = (Result<()>, Result<()>, Result<Vec<u8>>, Result<Vec<u8>>);

/// Every rank of `group` issues one all-reduce of 64 words, as a call or as
/// a replay of a graph recording it. Then it launches `add` (bindings `[a,
/// b, out]`, scalars `[n]`) reading the round's output into a buffer written
/// just before the round: the optimizer reading the all-reduced gradient.
/// `before` runs on each rank, with its input, before the round; `after`
/// runs just after it. The CUDA and HIP timed mocks run it.
///
/// # Panics
///
/// When a step before the round fails.
pub fn a_round_then_work_reading_it<B: Backend>(
    group: &Group<B>,
    replayed: bool,
    add: &Kernel,
    before: impl Fn(&Rank<B>, &Buffer) + Sync,
    after: impl Fn(&Rank<B>) + Sync,
) -> Vec<RoundThenWork> {
    group.run(|rank| {
        let c = rank.client();
        let input = c.upload(&as_bytes(&[rank.index() as u32 + 1; 64])).unwrap();
        let output = c.try_allocate(256).unwrap();
        let graph = replayed.then(|| {
            let capture = c.begin_capture().unwrap();
            rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
                .expect("recorded on every rank");
            c.end_capture(capture).expect("a clean window seals")
        });
        // Written just before the round, so its range is the ledger's
        // latest when the round takes its mark.
        let dep = c.upload(&as_bytes(&[9; 64])).unwrap();
        before(&rank, &input);
        let called = match &graph {
            Some(graph) => rank.replay(graph),
            None => rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum),
        };
        after(&rank);
        let bindings = [
            Binding::read(&output),
            Binding::read(&output),
            Binding::write(&dep),
        ];
        let launched = c.launch(add, &bindings, &as_bytes(&[64]), Dispatch::linear(1));
        (called, launched, c.read(&output), c.read(&dep))
    })
}

/// What rank `rank` reported of a round that was late past the deadline:
/// its call and launch went out, and both reads fail as `Stalled` (rules
/// 23, 47, 50).
///
/// # Panics
///
/// When a report differs from that.
pub fn fails_as_a_stalled_round(rank: usize, (called, launched, output, dep): RoundThenWork) {
    called.unwrap_or_else(|e| panic!("rank {rank}: the round was issued: {e}"));
    launched.unwrap_or_else(|e| panic!("rank {rank}: a launch after the round: {e}"));
    for (what, read) in [("output", output), ("copy of it", dep)] {
        let error = read.expect_err(&format!("rank {rank}: its {what} reads as clean"));
        assert!(
            matches!(
                collective_error(error.root()),
                CollectiveError::Stalled { .. }
            ),
            "rank {rank}: {what}: {error}"
        );
    }
}

/// An `after` for [`a_round_then_work_reading_it`]: rank `faulted`'s next
/// device call takes an injected sticky fault, `ILLEGAL_ADDRESS`.
pub fn a_fault_on<B: Backend>(faulted: usize) -> impl Fn(&Rank<B>) + Sync + Copy {
    move |rank| {
        if rank.index() == faulted {
            let plan = FaultPlan::new().poison_at(1, "injected", "ILLEGAL_ADDRESS");
            rank.client().inject(plan);
        }
    }
}

/// What rank `rank` reported of a round whose rank `faulted` took an
/// injected sticky fault just after its part was issued.
///
/// The faulted rank's launch and reads fail with its own fault. Every other
/// rank's reads fail naming the faulted rank and its fault. Its call
/// returned `Ok` or that, and its launch ran or was skipped (rules 36, 47).
///
/// # Panics
///
/// When a report differs from that.
pub fn fails_as_an_injected_fault(
    rank: usize,
    faulted: usize,
    (called, launched, output, dep): RoundThenWork,
) {
    let names_the_fault = |what: &str, error: &Error| {
        let CollectiveError::IssueFailed {
            rank: named, cause, ..
        } = collective_error(error.root())
        else {
            panic!("rank {rank}: {what}: {error}");
        };
        assert_eq!(*named, faulted, "rank {rank}: {what}: {error}");
        assert!(
            cause.to_string().contains("ILLEGAL_ADDRESS"),
            "rank {rank}: {what}: {cause}"
        );
    };
    if rank == faulted {
        called.unwrap_or_else(|e| panic!("rank {rank}: issued before its fault: {e}"));
        let error = launched.expect_err("a launch on a faulted device");
        assert!(error.is_sticky(), "rank {rank}: {error}");
    } else {
        // Skipped where the watchdog claimed the round's output first.
        if let Err(error) = launched {
            assert!(
                matches!(error, Error::Skipped { .. }),
                "rank {rank}: a launch after the round: {error}"
            );
        }
        if let Err(error) = &called {
            names_the_fault("its call", error);
        }
    }
    for (what, read) in [("output", output), ("copy of it", dep)] {
        let error = read.expect_err(&format!("rank {rank}: its {what} reads as clean"));
        if rank == faulted {
            assert!(error.is_device_poisoned(), "rank {rank}: {what}: {error}");
        } else {
            names_the_fault(what, &error);
        }
    }
}

/// What one rank reported of [`a_round_in_flight_then_a_failed_issue`]: the
/// second call, and its reads of the first round's output and the second's.
pub type EarlierRoundThenFailure = (Result<()>, Result<Vec<u8>>, Result<Vec<u8>>);

/// Every rank of `group` issues an all-reduce of 64 words, `busy` run on
/// each rank before its input is written (a device busy past the call),
/// then a second all-reduce whose call fails on rank 0 (an injected
/// library failure). The second round's failure aborts the communicators
/// while the first is still in flight; an abort ends what it finds
/// unfinished, as NCCL's kernels return, and the CUDA and HIP timed mocks
/// then leave scribbled bytes. They run it.
///
/// # Panics
///
/// When a step before the second call fails.
pub fn a_round_in_flight_then_a_failed_issue<B: Backend>(
    group: &Group<B>,
    busy: impl Fn(&Rank<B>, &Buffer) + Sync,
) -> Vec<EarlierRoundThenFailure> {
    group.run(|rank| {
        let c = rank.client();
        let words = [rank.index() as u32 + 1; 64];
        let first_input = c.upload(&as_bytes(&words)).unwrap();
        busy(&rank, &first_input);
        let first = c.try_allocate(256).unwrap();
        rank.all_reduce(first_input.all(), first.all(), Element::U32, Reduce::Sum)
            .expect("the first round is issued");
        let second_input = c.upload(&as_bytes(&words)).unwrap();
        let second = c.try_allocate(256).unwrap();
        if rank.index() == 0 {
            let failure = injected("the second round's call");
            c.inject(FaultPlan::new().fail(Site::Collective, 1, failure));
        }
        let called = rank.all_reduce(second_input.all(), second.all(), Element::U32, Reduce::Sum);
        c.inject(FaultPlan::new());
        (called, c.read(&first), c.read(&second))
    })
}

/// What rank `rank` reported of [`a_round_in_flight_then_a_failed_issue`].
/// The first round was issued by every rank and nothing failed it: it reads
/// its sum on every rank, never bytes an abort left, clean or not. The
/// second fails on every rank, naming rank 0 (rules 47, 49).
///
/// # Panics
///
/// When a report differs from that.
pub fn the_earlier_round_reads_right(
    rank: usize,
    (called, first, second): EarlierRoundThenFailure,
) {
    let sum = as_bytes(&[10u32; 64]);
    match first {
        Ok(bytes) => assert_eq!(bytes, sum, "rank {rank}'s first round"),
        Err(error) => panic!("rank {rank}'s first round, which nothing failed: {error}"),
    }
    if rank == 0 {
        called.expect_err("rank 0's call takes the injected failure");
    }
    let error = second.expect_err(&format!("rank {rank}: the failed round reads as clean"));
    let CollectiveError::IssueFailed { rank: named, .. } = collective_error(error.root()) else {
        panic!("rank {rank}: the failed round: {error}");
    };
    assert_eq!(*named, 0, "rank {rank}: the failed round: {error}");
}

/// The behaviours of rounds in flight: one `#[test]` each for `$suite`.
#[macro_export]
macro_rules! inflight_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, inflight::device_rounds_drain_no_stream, DeviceCollectives }
        $crate::behaviour! { $suite, inflight::replays_drain_no_stream, DeviceCollectives }
        $crate::behaviour! { $suite, inflight::freeing_a_rounds_buffers_in_flight_leaves_every_byte_right, DeviceCollectives }
        $crate::behaviour! { $suite, inflight::a_rounds_output_reads_right_from_another_stream, DeviceCollectives }
        $crate::behaviour! { $suite, inflight::a_rank_lost_with_rounds_in_flight_recovers_while_its_peers_shrink, DeviceCollectives, Reopen }
        $crate::behaviour! { $suite, inflight::a_capture_holding_rounds_aborted_by_a_loss_fails_every_replay, DeviceCollectives, Reopen }
    };
}
