//! The property test (`scope_core::conformance::property`) on the reference
//! host server, at full scale: 12,500 random operations over five seeds,
//! checked against the per-word oracle after every one. The GPU servers run
//! the same test, smaller, in their own test suites.
//!
//! A failure prints its seed, step and the operations before it;
//! `SCOPE_PROPERTY_SEED=<seed>` reruns that seed alone, and
//! `SCOPE_PROPERTY_STEPS` sets the steps per seed.

use scope_core::conformance::Suite;
use scope_core::host::{self, Host};
use scope_core::{Client, Kernel, Result};

/// The host kernels the conformance suite uses (`tests/conformance.rs`).
struct HostSuite;

impl Suite for HostSuite {
    type Backend = Host;

    fn client() -> Result<Client<Host>> {
        host::client()
    }

    fn fill() -> Kernel {
        Kernel::host("fill")
    }

    fn copy() -> Kernel {
        Kernel::host("copy")
    }

    fn add() -> Kernel {
        Kernel::host("add")
    }

    fn broken() -> Kernel {
        Kernel::host("no-such-kernel")
    }
}

#[test]
fn random_sequences_match_the_per_word_oracle() {
    scope_core::conformance::random_sequences::<HostSuite>(
        &scope_core::conformance::property::SEEDS,
        2_500,
    );
}
