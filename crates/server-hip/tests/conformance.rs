//! The conformance suite against the HIP server, with HIP C++ kernels.
//!
//! Without a HIP device (every machine this crate has been built on so
//! far) each test prints `skipped: no hip device (...)` and returns; with
//! `SCOPE_REQUIRE=hip` a missing device fails it.

mod common;

use scope_core::conformance::Suite;
use scope_core::{Client, Kernel, Result};
use server_hip::Hip;

struct HipSuite;

impl Suite for HipSuite {
    type Backend = Hip;

    fn client() -> Result<Client<Hip>> {
        server_hip::client()
    }

    fn fill() -> Kernel {
        common::fill()
    }

    fn copy() -> Kernel {
        common::copy()
    }

    fn add() -> Kernel {
        common::add()
    }

    fn broken() -> Kernel {
        common::broken()
    }

    /// All of the device's memory: the largest allocation the server
    /// accepts, which the device cannot provide because the runtime always
    /// holds some of it.
    fn oversized() -> Option<u64> {
        Hip::open(0).ok().map(|hip| hip.info().total_memory)
    }
}

scope_core::conformance_tests!(HipSuite);

/// The property test (`scope_core::conformance::property`) on a real
/// device, at the same scale as on the mock: random sequences of
/// allocations, writes, launches, copies, reads and capture windows with
/// injected failures, against the per-word oracle. Without a device it
/// prints `skipped: no hip device`.
#[test]
fn random_sequences() {
    scope_core::conformance::random_sequences::<HipSuite>(
        &scope_core::conformance::property::SEEDS,
        2_500,
    );
}
