//! A round that fails in flight, over the mock runtime's and the mock
//! RCCL's timed mode: rank 2's device is busy past the deadline before its
//! part can start, so every rank's call returns once issued and the
//! watchdog fails the round at the deadline, or at a fault injected after
//! a part was issued. The timing is the process's, so this binary holds
//! only these tests, one at a time.

mod common;

use std::time::Duration;

use common::{add, copy, mock_library, scalars};
use scope_core::collective::{Group, Rank};
use scope_core::{Binding, Buffer, Client, Dispatch};
use scope_test::inflight::{
    a_fault_on, a_round_in_flight_then_a_failed_issue, a_round_then_work_reading_it,
    fails_as_a_stalled_round, fails_as_an_injected_fault, the_earlier_round_reads_right,
};
use server_hip::Hip;

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
    let _timed = timed_copy_of(Duration::from_secs(3));
    for replayed in [false, true] {
        let group = Group::over_device(clients(), Duration::from_millis(300)).expect("a group");
        let outcomes = a_round_then_work_reading_it(&group, replayed, &add(), rank_2_busy, |_| {});
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            fails_as_a_stalled_round(rank, outcome);
        }
    }
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
    let _timed = timed_copy_of(Duration::from_secs(3));
    for replayed in [false, true] {
        let group = Group::over_device(clients(), Duration::from_secs(5)).expect("a group");
        let outcomes =
            a_round_then_work_reading_it(&group, replayed, &add(), rank_2_busy, a_fault_on(1));
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
    let _timed = timed_copy_of(Duration::from_millis(500));
    let group = Group::over_device(clients(), Duration::from_secs(10)).expect("a group");
    let outcomes = a_round_in_flight_then_a_failed_issue(&group, rank_2_busy);
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        the_earlier_round_reads_right(rank, outcome);
    }
}

/// The mocks' timing with a copy kernel taking `copy`, held until the
/// guard drops, which sets it back to zero: one test at a time.
fn timed_copy_of(copy: Duration) -> impl Drop {
    struct Untimed(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);
    impl Drop for Untimed {
        fn drop(&mut self) {
            common::timed(&[(c"copy", Duration::ZERO)], Duration::from_micros(10), 0.0);
        }
    }
    let guard = TIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    common::timed(&[(c"copy", copy)], Duration::from_micros(10), 0.0);
    Untimed(guard)
}

/// Four mock devices.
fn clients() -> Vec<Client<Hip>> {
    let path = vec![mock_library()];
    (0..4)
        .map(|d| server_hip::client_from(&path, &path, d).expect("a mock device"))
        .collect()
}

/// Rank 2's device busy for the copy kernel's modelled time before its
/// input is written: its part of a round on the input starts after that.
fn rank_2_busy(rank: &Rank<Hip>, input: &Buffer) {
    if rank.index() == 2 {
        let c = rank.client();
        let busy = c.try_allocate(256).unwrap();
        c.launch(
            &copy(),
            &[Binding::read(&busy), Binding::write(input)],
            &scalars(&[0]),
            Dispatch::linear(1),
        )
        .unwrap();
    }
}
