//! A sticky fault that surfaces after a round between ranks joined alone
//! was issued (rules 47, 49): the round runs on a communication stream,
//! watched by the process's watchdog, not waited for by the call. In a
//! binary of its own: the mock's fault corrupts every context of the
//! process, as `mock_poison.rs` says.

mod common;
#[path = "mock/harness.rs"]
mod harness;

use std::sync::Barrier;
use std::time::{Duration, Instant};

use common::{bytes, fails_as_a_faulted_round, fault_after, filled};
use scope_core::collective::device::DeviceCollectives;
use scope_core::collective::{Element, Rank, Reduce};
use server_cuda::Cuda;

/// Rank 2's producer faults after the ballot decided its round clean and
/// the round was issued: no rank's read returns the round's bytes as
/// clean, and every rank answers within the deadline.
#[test]
fn a_fault_after_a_round_of_ranks_joined_alone_was_issued_reaches_every_rank() {
    harness::mock();
    let identity = <Cuda as DeviceCollectives>::identity().expect("the mock NCCL");
    let deadline = Duration::from_secs(5);
    // The mock's fault is the whole process's, and any thread's sync may
    // surface it: every rank joins and makes its buffers before rank 2
    // plants it, so that the first call a rank can learn it at is its
    // round's (rule 36).
    let made = Barrier::new(4);
    let started = Instant::now();
    let outcomes: Vec<_> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..4)
            .map(|r| {
                let (identity, made) = (&identity, &made);
                scope.spawn(move || {
                    let client = server_cuda::client_on(r).expect("a mock device");
                    let rank = Rank::join(client, identity, r, 4, deadline).expect("a rank");
                    let c = rank.client();
                    let input = filled(c, r as u32 + 1);
                    let output = c.upload(&bytes(&[7; 256])).unwrap();
                    made.wait();
                    if r == 2 {
                        fault_after(c, &input);
                    }
                    let called =
                        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
                    (called, c.read(&output))
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("rank"))
            .collect()
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
