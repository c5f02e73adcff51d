//! The conformance suite against the reference host server.

use scope_core::conformance::Suite;
use scope_core::host::{self, Host};
use scope_core::{Client, Kernel, Result};

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

    fn oversized() -> Option<u64> {
        Some(64 << 30)
    }
}

scope_core::conformance_tests!(HostSuite);
