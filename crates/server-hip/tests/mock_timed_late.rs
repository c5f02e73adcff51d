//! A round that fails in flight, over the mock runtime's and the mock
//! RCCL's timed mode: rank 2's device is busy past the deadline before its
//! part can start, so every rank's call returns once issued and the
//! watchdog fails the round at the deadline, or at a fault injected after
//! a part was issued. The timing is the process's, so this binary holds
//! only these tests, one at a time.

mod common;

use std::time::Duration;

use common::{add, copy, mock_library, scalars};
use scope_core::collective::{CollectiveError, Element, Group, Reduce};
use scope_core::{Binding, Dispatch, Error, FaultPlan};

/// The mocks' timing is the process's: one test at a time sets it.
static TIMED: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Work issued after a round that reads the round's output and writes a
/// buffer written just before the call — the optimizer reading the
/// all-reduced gradient — carries the round's failure when the round
/// fails in flight, for a call and for a replay: the in-flight ledger
/// claims every write issued after the round, however recently its range
/// was written before it (rules 23, 47, 50).
#[test]
fn work_after_a_round_that_fails_in_flight_carries_its_failure() {
    let _timed = TIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    common::timed(
        &[(c"copy", Duration::from_secs(3))],
        Duration::from_micros(10),
        0.0,
    );
    let path = vec![mock_library()];
    for replayed in [false, true] {
        let clients = (0..4)
            .map(|d| server_hip::client_from(&path, &path, d).expect("a mock device"))
            .collect();
        let group = Group::over_device(clients, Duration::from_millis(300)).expect("a group");
        let outcomes = group.run(|rank| {
            let c = rank.client();
            let input = c.upload(&scalars(&[rank.index() as u32 + 1; 64])).unwrap();
            let output = c.try_allocate(256).unwrap();
            let graph = replayed.then(|| {
                let capture = c.begin_capture().unwrap();
                rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
                    .expect("recorded on every rank");
                c.end_capture(capture).expect("a clean window seals")
            });
            // Written just before the round, so its range is the ledger's
            // latest when the round takes its mark.
            let dep = c.upload(&scalars(&[9; 64])).unwrap();
            if rank.index() == 2 {
                let busy = c.try_allocate(256).unwrap();
                c.launch(
                    &copy(),
                    &[Binding::read(&busy), Binding::write(&input)],
                    &scalars(&[0]),
                    Dispatch::linear(1),
                )
                .unwrap();
            }
            let called = match &graph {
                Some(graph) => rank.replay(graph),
                None => rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum),
            };
            c.launch(
                &add(),
                &[
                    Binding::read(&output),
                    Binding::read(&output),
                    Binding::write(&dep),
                ],
                &scalars(&[64]),
                Dispatch::linear(1),
            )
            .expect("a launch after the round");
            (called, c.read(&output), c.read(&dep))
        });
        for (rank, (called, output, dep)) in outcomes.into_iter().enumerate() {
            called.unwrap_or_else(|e| panic!("rank {rank}: the round was issued: {e}"));
            for (what, read) in [("output", output), ("copy of it", dep)] {
                let error = read.expect_err(&format!(
                    "rank {rank} (replayed: {replayed}): its {what} reads as clean"
                ));
                let Error::Collective(failed) = error.root() else {
                    panic!("rank {rank}: {what}: {error}");
                };
                assert!(
                    matches!(**failed, CollectiveError::Stalled { .. }),
                    "rank {rank}: {what}: {error}"
                );
            }
        }
    }
    common::timed(&[(c"copy", Duration::ZERO)], Duration::from_micros(10), 0.0);
    let (count, last) = common::rccl_violations();
    assert_eq!(count, 0, "a call real RCCL refuses; the last: {last}");
}

/// Rank 1's device takes a sticky fault, by fault injection, just after its
/// part of a round was issued, for a call and for a replay. Rank 2's device
/// is busy for 3 s first, so the round cannot have finished; the deadline
/// is past that. A faulted device finishes nothing, as a real one does: the
/// round fails on every rank naming rank 1's fault, and no output or work
/// after it reads as clean (rules 36, 47, 50).
#[test]
fn a_fault_injected_after_a_part_was_issued_fails_its_round() {
    let _timed = TIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    common::timed(
        &[(c"copy", Duration::from_secs(3))],
        Duration::from_micros(10),
        0.0,
    );
    let path = vec![mock_library()];
    for replayed in [false, true] {
        let clients = (0..4)
            .map(|d| server_hip::client_from(&path, &path, d).expect("a mock device"))
            .collect();
        let group = Group::over_device(clients, Duration::from_secs(5)).expect("a group");
        let outcomes = group.run(|rank| {
            let c = rank.client();
            let input = c.upload(&scalars(&[rank.index() as u32 + 1; 64])).unwrap();
            let output = c.try_allocate(256).unwrap();
            let graph = replayed.then(|| {
                let capture = c.begin_capture().unwrap();
                rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
                    .expect("recorded on every rank");
                c.end_capture(capture).expect("a clean window seals")
            });
            let dep = c.upload(&scalars(&[9; 64])).unwrap();
            if rank.index() == 2 {
                let busy = c.try_allocate(256).unwrap();
                c.launch(
                    &copy(),
                    &[Binding::read(&busy), Binding::write(&input)],
                    &scalars(&[0]),
                    Dispatch::linear(1),
                )
                .unwrap();
            }
            let called = match &graph {
                Some(graph) => rank.replay(graph),
                None => rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum),
            };
            if rank.index() == 1 {
                c.inject(FaultPlan::new().poison_at(1, "injected", "ILLEGAL_ADDRESS"));
            }
            let launched = c.launch(
                &add(),
                &[
                    Binding::read(&output),
                    Binding::read(&output),
                    Binding::write(&dep),
                ],
                &scalars(&[64]),
                Dispatch::linear(1),
            );
            (called, launched, c.read(&output), c.read(&dep))
        });
        for (rank, (called, launched, output, dep)) in outcomes.into_iter().enumerate() {
            let reads = [("output", output), ("copy of it", dep)];
            scope_test::inflight::fails_as_an_injected_fault(rank, 1, (called, launched), reads);
        }
    }
    common::timed(&[(c"copy", Duration::ZERO)], Duration::from_micros(10), 0.0);
}
