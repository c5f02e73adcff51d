//! The shared conformance suite, run against the CUDA server with CUDA C++
//! kernels. Without a device every test prints `skipped: no cuda device`;
//! with `SCOPE_REQUIRE=cuda` that is a failure.

#[macro_use]
mod common;

// The whole of device memory as the oversized allocation: within the
// largest allocation the backend accepts, and more than the device can give
// (the context itself holds some).
// A loss the fault plan injects leaves the device healthy, so the server
// opens it again: the suite reopens, as the mock's does.
cuda_suite!(
    CudaSuite,
    common::make(),
    server_cuda::total_memory(0).ok(),
    (),
    {
        fn capabilities() -> &'static [scope_test::Capability] {
            &[scope_test::Capability::Reopen]
        }
    }
);

scope_test::conformance_tests!(CudaSuite);
