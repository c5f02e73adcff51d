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

/// Rank 2's producer faults once its round's input was written. The mock
/// runs a kernel when it is launched, so the fault surfaces at rank 2's
/// next wait — its ballot's, or its round's — and rank 2 fails with its
/// device's fault; its peers fail with `Stalled` within the deadline,
/// their groups broken.
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
    if r == 2 {
        fault_after(c, &input);
    }
    let output = c.upload(&bytes(&[7; 256])).unwrap();
    let began = Instant::now();
    let called = me.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
    let read = c.read(&output);
    assert!(
        began.elapsed() < deadline + Duration::from_secs(20),
        "rank {r} answered within the deadline: {:?}",
        began.elapsed()
    );
    let read = read.expect_err("no rank reads the round as clean");
    let learned = called.as_ref().err().unwrap_or(&read);
    if r == 2 {
        assert!(
            learned.is_sticky() || learned.is_device_poisoned(),
            "{learned}"
        );
        assert!(read.is_sticky() || read.is_device_poisoned(), "{read}");
    } else {
        for error in [learned, &read] {
            let Error::Collective(failed) = error.root() else {
                panic!("rank {r}: {error}");
            };
            assert!(
                matches!(**failed, CollectiveError::Stalled { .. }),
                "rank {r}: {error}"
            );
        }
        assert!(me.broken().is_some(), "rank {r}'s group is broken");
    }
}
