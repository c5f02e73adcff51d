//! The scope-core conformance suite, run for real on this machine's Vulkan
//! device (lavapipe in CI) with the validation layer on: a validation
//! message anywhere fails the test that caused it.

mod common;

use scope_core::{Client, Kernel, Result};
use scope_test::{Capability, Suite};
use server_vulkan::Vulkan;

struct VulkanSuite;

impl Suite for VulkanSuite {
    type Backend = Vulkan;

    fn capabilities() -> &'static [Capability] {
        &[Capability::Reopen, Capability::Wgsl]
    }

    fn client() -> Result<Client<Vulkan>> {
        common::validating()
    }

    fn backend() -> Option<Result<Vulkan>> {
        Some(common::validating_backend())
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
        Kernel::wgsl(
            "broken",
            "@compute @workgroup_size(64) fn main() { let x: u32 = undefined_thing; }",
        )
    }

    // No `oversized`: the server's largest allocation is what the device
    // could ever give, and on lavapipe (host memory) a request within it is
    // met. Out-of-memory is tested with injected failures.
}

scope_test::conformance_tests!(VulkanSuite);
