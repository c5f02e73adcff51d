//! The library's own shrink, over the mock NCCL.
//!
//! The mock counts shrinks per line of cliques, from the NCCL id the group
//! was made with, so groups other tests shrink at the same time add
//! nothing to the count this test reads.

#[macro_use]
mod common;
#[path = "mock/harness.rs"]
mod harness;

use common::{bytes, words};
use harness::mock;

/// Survivors of a rank that never came shrink through the library's own
/// `ncclCommShrink`: nobody issued the round the rank missed, so the
/// communicators are intact, and the three survivors' new communicator
/// keeps their connections, renumbered in order; the new epoch's sum is
/// over three ranks.
#[test]
fn survivors_of_a_missing_rank_shrink_through_nccls_own_shrink() {
    use scope_core::collective::{Element, Group, Reduce};
    mock();
    let clients: Vec<_> = (0..4).map(|d| server_cuda::client_on(d).unwrap()).collect();
    let group = Group::over_device(clients, std::time::Duration::from_millis(300)).unwrap();
    let root = mock().nccl_id_made_here();
    assert_ne!(root, 0, "the group's NCCL id was made on this thread");
    assert_eq!(mock().nccl_shrinks_from(root), 0);
    let means = group.run(|rank| {
        if rank.index() == 3 {
            return None;
        }
        let c = rank.client();
        let input = c.upload(&bytes(&[rank.index() as u32 + 1; 16])).unwrap();
        let output = c.try_allocate(64).unwrap();
        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
            .expect_err("rank 3 never comes");
        let shrunk = rank.shrink().unwrap();
        assert_eq!((shrunk.epoch(), shrunk.ranks()), (1, 3));
        shrunk
            .all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
            .unwrap();
        Some(words(&c.read(&output).unwrap()))
    });
    for mean in means.into_iter().take(3) {
        assert_eq!(mean.unwrap(), vec![1 + 2 + 3; 16]);
    }
    assert_eq!(
        mock().nccl_shrinks_from(root),
        3,
        "each survivor shrank this group's communicator"
    );
    mock().assert_clean();
}
