//! A fault injected on rank 1 just after its part of a round was issued,
//! over the timed mock, with rank 2's device busy for 3 s first. In a
//! binary of its own: a `mock_timed` run with it beside the late-round
//! test failed that test's timing now and then (its rank 0 waited for
//! rank 2's work), a cause not yet found.

mod common;
#[path = "mock/harness.rs"]
mod harness;
#[path = "mock/timed.rs"]
mod timed;

use std::time::Duration;

use scope_test::inflight::{a_fault_on, fails_as_an_injected_fault};
use timed::with_rank_2_busy;

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
