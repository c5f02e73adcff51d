//! The collectives through NCCL on this machine's GPUs — the real library
//! on real devices: the behaviours at every group size
//! (`scope_test::sizes`), at one rank and at one rank per GPU
//! where there are several. One GPU is enough for the first: a one-rank
//! communicator still builds, runs every call, is captured into a CUDA
//! graph, ballots for ranks joined alone, and is aborted and made again.
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

scope_test::conformance_tests!(@every_group_size NcclSuite);
