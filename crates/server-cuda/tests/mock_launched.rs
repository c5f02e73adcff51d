//! Four workers under `scope-launch`'s launcher, one process a rank, over
//! the mock driver and the mock NCCL's shared mode (`scope_test::launched`):
//! one call joins each, and a worker killed mid-training is left out,
//! started again, admitted and healed.

#[macro_use]
mod common;
#[path = "mock/harness.rs"]
mod harness;

use harness::mock;

cuda_suite!(LaunchedSuite, harness::mock_client(), None, (), {
    over_mock_nccl!(mock());
});

#[test]
fn four_launched_workers_join_with_one_call_and_sum() {
    scope_test::launched::four_launched_workers_join_with_one_call_and_sum(|| {
        mock();
    });
}

#[test]
fn a_killed_worker_is_left_out_then_admitted_and_healed() {
    scope_test::launched::a_killed_worker_is_left_out_then_admitted_and_healed(|| {
        mock();
    });
}

#[test]
fn two_workers_killed_at_once_are_left_out_then_admitted_and_healed() {
    scope_test::launched::two_workers_killed_at_once_are_left_out_then_admitted_and_healed(|| {
        mock();
    });
}

/// One worker of the launches above; does nothing when run by hand.
#[test]
#[ignore = "a worker process of this file's launches"]
fn worker() {
    scope_test::launched::worker::<LaunchedSuite>(|dir| mock().shared_nccl_id(dir));
}
