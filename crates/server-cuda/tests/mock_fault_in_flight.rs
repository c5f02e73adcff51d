//! A sticky fault that surfaces after a round was issued (rule 47). In a
//! binary of its own: the mock's fault corrupts every context of the
//! process, as `mock_poison.rs` says.

mod common;
#[path = "mock/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use common::{FILL, WILD, bytes, kernel, words};
use scope_core::collective::{Element, Group, Reduce};
use scope_core::{Binding, Dispatch};

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
    let started = Instant::now();
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let input = c.try_allocate(1024).unwrap();
        c.launch(
            &kernel("fill", FILL),
            &[Binding::write(&input)],
            &bytes(&[256, rank.index() as u32 + 1]),
            Dispatch::linear(4),
        )
        .unwrap();
        if rank.index() == 2 {
            c.launch(
                &kernel("wild", WILD),
                &[Binding::read_write(&input)],
                &[],
                Dispatch::linear(1),
            )
            .unwrap();
        }
        let output = c.upload(&bytes(&[7; 256])).unwrap();
        let called = rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
        (called, c.read(&output).map(|b| words(&b)))
    });
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "every rank answered within the deadline: {:?}",
        started.elapsed()
    );
    for (rank, (called, read)) in outcomes.into_iter().enumerate() {
        let read = read.expect_err("no rank reads the round's bytes as clean");
        assert!(
            read.is_sticky()
                || read.is_device_poisoned()
                || matches!(read.root(), scope_core::Error::Collective(_)),
            "rank {rank}: {read} (the call answered {called:?})"
        );
    }
}
