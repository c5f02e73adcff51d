//! The conformance suite against the reference host server, and the
//! property test at full scale: 12,500 random operations over five seeds,
//! checked against the per-word oracle after every one. The GPU servers run
//! both in their own test suites.
//!
//! A property failure prints its seed, step and the operations before it;
//! `SCOPE_PROPERTY_SEED=<seed>` reruns that seed alone, and
//! `SCOPE_PROPERTY_STEPS` sets the steps per seed.

use scope_core::{Client, Kernel, Result};
use scope_test::host::{self, Host};
use scope_test::{Capability, Suite};

struct HostSuite;

impl Suite for HostSuite {
    type Backend = Host;

    fn capabilities() -> &'static [Capability] {
        &[Capability::Reopen]
    }

    fn client() -> Result<Client<Host>> {
        host::client()
    }

    fn backend() -> Option<Result<Host>> {
        Some(Ok(Host::new()))
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
        // All of the default 8 GiB: allowed, and never free while the test
        // holds other buffers.
        Some(8 << 30)
    }
}

scope_test::conformance_tests!(HostSuite);

/// The collective behaviours again, over the host's device transport
/// ([`host::Loopback`]): the path a CUDA group takes through NCCL — the
/// agreement before any byte moves, the library's call as device work, the
/// abort — on every machine.
mod over_device {
    use super::*;
    use scope_core::collective::Group;

    struct HostDeviceSuite;

    impl Suite for HostDeviceSuite {
        type Backend = Host;

        fn capabilities() -> &'static [Capability] {
            &[Capability::Reopen, Capability::DeviceCollectives]
        }

        fn client() -> Result<Client<Host>> {
            HostSuite::client()
        }
        fn fill() -> Kernel {
            HostSuite::fill()
        }
        fn copy() -> Kernel {
            HostSuite::copy()
        }
        fn add() -> Kernel {
            HostSuite::add()
        }
        fn broken() -> Kernel {
            HostSuite::broken()
        }
        fn group(clients: Vec<Client<Host>>, deadline: std::time::Duration) -> Result<Group<Host>> {
            Group::over_device(clients, deadline)
        }
        fn finished() {
            assert_eq!(
                host::Loopback::mismatches(),
                0,
                "ranks issued different calls into the transport"
            );
        }
    }

    scope_test::conformance_tests!(@collectives HostDeviceSuite);
}

/// The reference server built not to open a lost device again
/// ([`Host::cannot_reopen`]), as CUDA's and HIP's backends cannot: the
/// property test's losses are refused with `Error::RestartRequired`, and
/// the run goes on with a fresh server, as a restarted process would.
mod without_reopening {
    use super::*;

    struct HostCannotReopen;

    impl Suite for HostCannotReopen {
        type Backend = Host;

        fn client() -> Result<Client<Host>> {
            Client::new(Host::new().cannot_reopen())
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

    scope_test::recover_tests!(HostCannotReopen);
    scope_test::property_tests!(HostCannotReopen);
}
