//! The collectives through RCCL on this machine's AMD GPUs — the real
//! library on real devices: the behaviours at every group size
//! (`scope_test::sizes`), at one rank and at one rank per GPU
//! where there are several. Never run on AMD hardware.
//!
//! Without a HIP device every test prints `skipped: no hip device (...)`;
//! with a device and no RCCL, `skipped: no rccl device (...)`, which
//! `SCOPE_REQUIRE=hip` allows and `SCOPE_REQUIRE=rccl` makes a failure.

#[macro_use]
mod common;

use scope_core::Client;
use server_hip::Hip;

// One rank per GPU, each a server of its own device, grouped over RCCL.
hip_suite!(RcclSuite, Self::rank_client(0), None, {
    fn capabilities() -> &'static [scope_test::Capability] {
        &[scope_test::Capability::DeviceCollectives]
    }

    fn rank_client(rank: usize) -> scope_core::Result<Client<Hip>> {
        let client = server_hip::client_on(rank)?;
        server_hip::load_rccl()?;
        Ok(client)
    }

    fn devices() -> usize {
        server_hip::probe().devices.len()
    }

    fn group(
        clients: Vec<Client<Hip>>,
        deadline: std::time::Duration,
    ) -> scope_core::Result<scope_core::collective::Group<Hip>> {
        scope_core::collective::Group::over_device(clients, deadline)
    }
});

// The behaviours that take any group size: the others need four devices.
scope_test::sizes_tests!(RcclSuite);
scope_test::rounds_tests!(RcclSuite);
