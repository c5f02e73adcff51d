//! The shared conformance suite, run against the CUDA server with CUDA C++
//! kernels. Without a device every test prints `skipped: no cuda device`;
//! with `SCOPE_REQUIRE=cuda` that is a failure.

#[macro_use]
mod common;

// The whole of device memory as the oversized allocation: within the
// largest allocation the backend accepts, and more than the device can give
// (the context itself holds some).
cuda_suite!(CudaSuite, common::make(), server_cuda::total_memory(0).ok());

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
