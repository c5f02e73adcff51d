//! A sticky fault that surfaces after a round was issued (rule 47). In a
//! binary of its own: the mock's fault corrupts every context of the
//! process, as `mock_poison.rs` says.

mod common;
#[path = "mock/harness.rs"]
mod harness;

use std::sync::Barrier;
use std::time::{Duration, Instant};

use common::{bytes, fails_as_a_faulted_round, fault_after, filled};
use scope_core::collective::{Element, Group, Reduce};

/// Rank 2's producer faults after its round was issued: the round was
/// decided clean at submission, and no rank's read returns its bytes as
/// clean; every read fails within the deadline.
#[test]
fn a_fault_after_a_round_was_issued_reaches_every_rank() {
    harness::mock();
    let clients: Vec<_> = (0..4)
        .map(|rank| server_cuda::client_on(rank).expect("a mock device"))
        .collect();
    let group = Group::over_device(clients, Duration::from_secs(5)).expect("a group");
    // The mock's fault is the whole process's, and any thread's sync may
    // surface it: every rank makes its buffers before rank 2 plants it, so
    // that the first call a rank can learn it at is its round's (rule 36).
    let made = Barrier::new(4);
    let started = Instant::now();
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let input = filled(c, rank.index() as u32 + 1);
        let output = c.upload(&bytes(&[7; 256])).unwrap();
        made.wait();
        if rank.index() == 2 {
            fault_after(c, &input);
        }
        let called = rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
        (called, c.read(&output))
    });
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "every rank answered within the deadline: {:?}",
        started.elapsed()
    );
    for (rank, (_, read)) in outcomes.into_iter().enumerate() {
        fails_as_a_faulted_round(rank, read);
    }
}
