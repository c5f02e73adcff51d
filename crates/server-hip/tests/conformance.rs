//! The conformance suite against the HIP server, with HIP C++ kernels.
//!
//! Without a HIP device (every machine this crate has been built on so
//! far) each test prints `skipped: no hip device (...)` and returns; with
//! `SCOPE_REQUIRE=hip` a missing device fails it.

#[macro_use]
mod common;

use server_hip::Hip;

// All of the device's memory as the oversized allocation: the largest the
// server accepts, which the device cannot provide because the runtime
// always holds some of it.
hip_suite!(
    HipSuite,
    server_hip::client(),
    Hip::open(0).ok().map(|hip| hip.info().total_memory)
);

scope_test::conformance_tests!(HipSuite);
