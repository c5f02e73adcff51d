//! The collectives through NCCL on this machine's GPUs — the real library
//! on real devices: the behaviours at every group size
//! (`scope_test::sizes`), at one rank and at one rank per GPU
//! where there are several. One GPU is enough for the first: a one-rank
//! communicator still builds, runs every call, is captured into a CUDA
//! graph, ballots for ranks joined alone, and is aborted and made again;
//! and it shrinks to itself through `ncclCommShrink` where the library
//! has it (NCCL 2.27 and later), which the test says when it has not.
//!
//! Without a GPU every test prints `skipped: no cuda device (...)`; with a
//! GPU and no NCCL, `skipped: no nccl device (...)`, which
//! `SCOPE_REQUIRE=cuda` allows and `SCOPE_REQUIRE=nccl` makes a failure
//! (the CUDA bundle's `run.sh` requires NCCL where it finds the library).

#[macro_use]
mod common;

use scope_core::Client;
use server_cuda::Cuda;

// One rank per GPU, each a server of its own device, grouped over NCCL.
cuda_suite!(NcclSuite, Self::rank_client(0), None, (), {
    fn capabilities() -> &'static [scope_test::Capability] {
        &[scope_test::Capability::DeviceCollectives]
    }

    fn rank_client(rank: usize) -> scope_core::Result<Client<Cuda>> {
        let client = common::make_on(rank)?;
        server_cuda::load_nccl()?;
        Ok(client)
    }

    fn devices() -> usize {
        server_cuda::probe().devices.len()
    }

    fn group(
        clients: Vec<Client<Cuda>>,
        deadline: std::time::Duration,
    ) -> scope_core::Result<scope_core::collective::Group<Cuda>> {
        scope_core::collective::Group::over_device(clients, deadline)
    }
});

// The behaviours that take any group size: the others need four devices.
scope_test::sizes_tests!(NcclSuite);
scope_test::rounds_tests!(NcclSuite);

/// A one-rank group shrinks to itself through the library's
/// `ncclCommShrink` (nobody excluded) and computes on the new epoch.
/// Where the NCCL here has no `ncclCommShrink` the test says so and is
/// skipped.
#[test]
fn one_rank_shrinks_to_itself_through_ncclcommshrink() {
    use scope_core::collective::{Element, Group, Reduce};
    use scope_test::Suite;
    let Some(client) = scope_test::client_or_skip(|| NcclSuite::rank_client(0)) else {
        return;
    };
    if !server_cuda::nccl_can_shrink().unwrap() {
        println!("skipped: no ncclCommShrink in this NCCL (it came in 2.27)");
        return;
    }
    let group = Group::over_device(vec![client], std::time::Duration::from_secs(30)).unwrap();
    let sums = group.run(|rank| {
        let c = rank.client();
        let input = c.upload(&common::bytes(&[7; 16])).unwrap();
        let output = c.try_allocate(64).unwrap();
        let shrunk = rank.shrink().expect("one rank shrinks to itself");
        assert_eq!((shrunk.epoch(), shrunk.ranks()), (1, 1));
        shrunk
            .all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
            .unwrap();
        common::words(&c.read(&output).unwrap())
    });
    assert_eq!(sums, vec![vec![7; 16]]);
}
