//! The shared conformance suite, run against the CUDA server with CUDA C++
//! kernels. Without a device every test prints `skipped: no cuda device`;
//! with `SCOPE_REQUIRE=cuda` that is a failure.

mod common;

use scope_core::conformance::Suite;
use scope_core::{Client, Kernel, Result};
use server_cuda::Cuda;

struct CudaSuite;

impl Suite for CudaSuite {
    type Backend = Cuda;

    fn client() -> Result<Client<Cuda>> {
        common::make()
    }

    fn fill() -> Kernel {
        common::kernel("fill", common::FILL)
    }

    fn copy() -> Kernel {
        common::kernel("copy", common::COPY)
    }

    fn add() -> Kernel {
        common::kernel("add", common::ADD)
    }

    fn broken() -> Kernel {
        common::kernel(
            "broken",
            r#"extern "C" __global__ void broken(unsigned int* out) { out[0] = this_is_not_declared; }"#,
        )
    }

    fn oversized() -> Option<u64> {
        // The whole of device memory: within the largest allocation the
        // backend accepts, and more than the device can give (the context
        // itself holds some).
        server_cuda::total_memory(0).ok()
    }
}

scope_core::conformance_tests!(CudaSuite);

/// The property test (`scope_core::conformance::property`) on a real
/// device, at the same scale as on the mock: random sequences of
/// allocations, writes, launches, copies, reads and capture windows with
/// injected failures, against the per-word oracle. Without a device it
/// prints `skipped: no cuda device`.
#[test]
fn random_sequences() {
    scope_core::conformance::random_sequences::<CudaSuite>(
        &scope_core::conformance::property::SEEDS,
        2_500,
    );
}
