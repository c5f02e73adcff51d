//! One process per device: a launcher that starts, watches and restarts a
//! group's workers, a coordinator behind one trait, and the worker's side.
//!
//! Multi-GPU training runs one process per device, started by a launcher.
//! This crate is that launcher for scope, and the few calls a worker makes
//! to it. Its decisions:
//!
//! 1. **A worker fails alone.** The launcher restarts the failed worker,
//!    not the job ([`launcher`]): its peers' processes, devices and bytes
//!    are kept, and what the lost rank made wrong is the failure model's to
//!    say.
//! 2. **Liveness is a lease.** A worker renews its lease a few times a
//!    window ([`Launched`]); a killed or stopped process drops out within
//!    one window with no deadline of anyone's, and a renewal that fails
//!    tells a worker its launcher is gone.
//! 3. **One coordinator trait, etcd's vocabulary** ([`Coordinator`]):
//!    leases, a create-if-absent for each decision, puts, gets and prefix
//!    lists. The launcher's embedded store ([`embedded`]) serves it on one
//!    machine with nothing to install, over a line protocol ([`wire`]); a
//!    real etcd ([`etcd`]) serves it across machines.
//! 4. **No async runtime, no framework.** Threads and blocking sockets,
//!    each wait bounded, so a worker links nothing the demo does not.
//! 5. **What both ends read is written once** ([`settings`]): the
//!    variables a launcher sets and a worker reads, and the job's keys.
//!
//! Layers, lowest first: `error` → `wire` → `store` → `embedded`, `remote`,
//! `etcd` → `connect` → `settings` → `worker` → `membership` → `group` →
//! `launcher`.

pub mod connect;
pub mod embedded;
pub mod error;
pub mod etcd;
pub mod group;
pub mod launcher;
pub mod membership;
pub mod remote;
pub mod settings;
pub mod store;
pub mod wire;
pub mod worker;

pub use error::{JobError, Result};
pub use group::{Joinable, Shareable};
pub use launcher::{Launcher, Outcome, Plan, Policy};
pub use settings::Settings;
pub use store::{Coordinator, Lease, Store};
pub use worker::{Epoch, EpochLiveness, Launched};
