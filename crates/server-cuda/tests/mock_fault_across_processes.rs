//! A sticky fault in one process after its round's input was written, the
//! ranks in four processes of this binary (the mock NCCL's shared mode):
//! the faulted rank learns from its device, and its peers, in other
//! processes, by the deadline; no rank reads the round's bytes as clean
//! (rules 42, 47, 49). In a binary of its own: the mock's fault corrupts
//! every context of a process.

#[macro_use]
mod common;
#[path = "mock/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use common::{bytes, fault_after, filled, words};
use harness::mock;
use scope_core::Error;
use scope_core::collective::{CollectiveError, Element, Reduce};

cuda_suite!(FaultSuite, harness::mock_client(), None, (), {
    over_mock_nccl!(mock());
});

/// Rank 2's producer faults once its round's input was written. The fault
/// surfaces at whichever of rank 2's calls looks next — an upload, its
/// ballot's wait, its round's, its sync — and every later one fails with
/// it too; no rank reads the round as clean, and its peers fail with
/// `Stalled` within the deadline, their groups broken.
#[test]
fn a_fault_in_one_process_stalls_its_peers_within_the_deadline() {
    scope_test::across::ranks_in_separate_processes::<FaultSuite>("rank", |dir| {
        mock().shared_nccl_id(dir)
    });
}

/// One rank of the test above, run only by it.
#[test]
#[ignore = "a child process of a_fault_in_one_process_stalls_its_peers_within_the_deadline"]
fn rank() {
    let deadline = Duration::from_secs(5);
    let Some((me, _)) = scope_test::across::joined_as_a_child::<FaultSuite>(deadline) else {
        return;
    };
    let c = me.client();
    let r = me.index() as u32;
    let input = filled(c, r + 1);
    // A clean round first: every process works.
    let clean = c.try_allocate(1024).unwrap();
    me.all_reduce(input.all(), clean.all(), Element::U32, Reduce::Sum)
        .expect("a clean round");
    assert_eq!(words(&c.read(&clean).unwrap()), vec![10; 256]);
    // A sticky fault is its context's: a watchdog's poll of a part it has
    // not yet seen land fails that part with it, and rank 2's abort then
    // fails the same round on every peer still watching it. So rank 2
    // plants its fault only once every rank has read the clean round: a
    // second round is decided only when every rank has posted its ballot,
    // which each does after its read, and rank 2's call returns only once
    // it is decided. That round is not read; it may fail with the fault.
    let between = c.try_allocate(1024).unwrap();
    me.all_reduce(input.all(), between.all(), Element::U32, Reduce::Sum)
        .expect("every rank read the clean round");
    if r == 2 {
        fault_after(c, &input);
    }
    // The mock's fault waits for a sync to surface it, and any thread of
    // the process may sync first (a watchdog's poll of the clean round's
    // part, say); from then on every call fails with it (rule 36). So rank
    // 2 may learn its fault at this upload as well as at its ballot, its
    // round or its read. An upload that learns it fails as the device's
    // fault, and rank 2 goes on with `clean` as its output, so that its
    // round and its read are held to the fault too.
    let uploaded = c.upload(&bytes(&[7; 256]));
    if let Err(learned) = &uploaded {
        assert_eq!(r, 2, "only the faulted rank's upload fails: {learned}");
        assert!(is_its_own_fault(learned), "{learned}");
    }
    let output = uploaded.as_ref().unwrap_or(&clean);
    let began = Instant::now();
    let called = me.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
    let read = c.read(output);
    assert!(
        began.elapsed() < deadline + Duration::from_secs(20),
        "rank {r} answered within the deadline: {:?}",
        began.elapsed()
    );
    let read = read.expect_err("no rank reads the round as clean");
    let learned = called.as_ref().err().unwrap_or(&read);
    if r == 2 {
        // Its call and read answer its device's fault, or the round's
        // failure as its peers see it where the communicator's failure
        // reached rank 2's ballot or part before the fault surfaced (a
        // read of a failed output needs no wait on the device). Its next
        // wait on the device learns the fault itself (rule 36).
        for error in [learned, &read] {
            assert!(
                is_its_own_fault(error) || is_the_rounds_failure(error),
                "{error}"
            );
        }
        let synced = c.sync().expect_err("rank 2's device is faulted");
        assert!(
            synced.is_sticky() || synced.is_device_poisoned(),
            "{synced}"
        );
    } else {
        for error in [learned, &read] {
            assert!(is_stalled(error), "rank {r}: {error}");
        }
        assert!(me.broken().is_some(), "rank {r}'s group is broken");
    }
}

/// Whether `error` is rank 2's own device fault: the fault, the poison it
/// left (rule 36), or its group broken by a round whose part on rank 2's
/// device failed with it (rule 47). The watchdog polls rank 2's parts in
/// flight, and a sticky fault is its context's, so a poll of a part not
/// yet seen to land may be the call that surfaces it.
fn is_its_own_fault(error: &Error) -> bool {
    error.is_sticky()
        || error.is_device_poisoned()
        || matches!(
            round_failure(error),
            Some(CollectiveError::IssueFailed { rank: 2, cause, .. })
                if cause.is_sticky() || cause.is_device_poisoned()
        )
}

/// Whether `error` is the round's failure as a rank of the group sees it:
/// stalled across processes (rule 49), a rank's call failed after the
/// ranks agreed (rule 47), or the group broken by either.
fn is_the_rounds_failure(error: &Error) -> bool {
    matches!(
        round_failure(error),
        Some(CollectiveError::Stalled { .. } | CollectiveError::IssueFailed { .. })
    )
}

/// Whether `error` is a round stalled across processes (rule 49), or the
/// group it broke: the round between may be the one that stalls first.
fn is_stalled(error: &Error) -> bool {
    matches!(round_failure(error), Some(CollectiveError::Stalled { .. }))
}

/// The collective failure at `error`'s root, looking through the break it
/// caused.
fn round_failure(error: &Error) -> Option<&CollectiveError> {
    let Error::Collective(failed) = error.root() else {
        return None;
    };
    Some(match &**failed {
        CollectiveError::Broken { cause } => cause,
        other => other,
    })
}
