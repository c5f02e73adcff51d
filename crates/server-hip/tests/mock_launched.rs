//! Four workers under `scope-launch`'s launcher, one process a rank, over
//! the mock HIP runtime and the mock RCCL's shared mode
//! (`scope_test::launched`): one call joins each, and a worker killed
//! mid-training is left out, started again, admitted and healed.

#[macro_use]
mod common;

use common::mock_rccl;

hip_suite!(LaunchedSuite, common::mock_client(), None, {
    over_mock_rccl!(mock_rccl());
});

#[test]
fn four_launched_workers_join_with_one_call_and_sum() {
    scope_test::launched::four_launched_workers_join_with_one_call_and_sum(|| {
        mock_rccl();
    });
}

#[test]
fn a_killed_worker_is_left_out_then_admitted_and_healed() {
    scope_test::launched::a_killed_worker_is_left_out_then_admitted_and_healed(|| {
        mock_rccl();
    });
}

#[test]
fn two_workers_killed_at_once_are_left_out_then_admitted_and_healed() {
    scope_test::launched::two_workers_killed_at_once_are_left_out_then_admitted_and_healed(|| {
        mock_rccl();
    });
}

/// One worker of the launches above; does nothing when run by hand.
#[test]
#[ignore = "a worker process of this file's launches"]
fn worker() {
    scope_test::launched::worker::<LaunchedSuite>(common::shared_rccl_id);
}
