//! What the timed tests of one binary share: the lock on the mock's
//! timing, four mock devices, and rank 2's device kept busy before a round.

use std::time::Duration;

use scope_core::collective::{Group, Rank};
use scope_core::{Binding, Client, Dispatch};
use scope_test::inflight::{RoundThenWork, a_round_then_work_reading_it};
use server_cuda::Cuda;

use crate::common::{ADD, COPY, bytes, kernel};
use crate::harness::mock;

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
    mock().timing(true);
    mock().kernel_time("copy", Duration::from_secs(3));
    mock().nccl_model(Duration::from_micros(10), 0.0);
    let add = kernel("add", ADD);
    let outcomes = [false, true]
        .map(|replayed| {
            let group = Group::over_device(clients(), deadline).expect("a group");
            a_round_then_work_reading_it(&group, replayed, &add, rank_2_busy, after)
        })
        .into();
    mock().kernel_time("copy", Duration::ZERO);
    mock().timing(false);
    outcomes
}
