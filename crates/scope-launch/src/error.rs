//! What can go wrong between a worker, its launcher and their coordinator.
//!
//! One enum for the crate, as `scope_core::Error` is one for the core. A
//! worker's program matches on it: a lost coordinator ends the job, a bad
//! start is a launcher's bug, and a value never published is a peer's.

use std::time::Duration;

/// A launch, coordination or worker failure, naming what was wrong.
#[derive(Debug, Clone, thiserror::Error)]
pub enum JobError {
    /// The coordinator cannot be reached, or stopped answering: the
    /// launcher died, or every etcd member is gone. The job is over for
    /// this worker; its group's rounds stall at their deadline anyway.
    #[error("the coordinator at {at} is lost: {why}")]
    CoordinatorLost {
        /// Where the coordinator was.
        at: String,
        /// What the connection said.
        why: String,
    },
    /// The launcher's own lease lapsed: it died or stopped, while its
    /// coordinator (an etcd) lives on. The job is over for this worker.
    #[error("the launcher of job `{job}` is gone: its lease lapsed")]
    LauncherLost {
        /// The job.
        job: String,
    },
    /// This worker's lease ran out before it was renewed: the coordinator
    /// and its peers already count it gone.
    #[error("this worker's lease expired: its peers count it gone")]
    LeaseExpired,
    /// A value a peer owed was not published within the wait.
    #[error("`{key}` was not published within {waited:?}")]
    TimedOut {
        /// The key waited for.
        key: String,
        /// How long.
        waited: Duration,
    },
    /// A setting a worker or the launcher was given is wrong: a rank past
    /// the group, a group size or epoch other than the job's, a key the
    /// wire cannot carry.
    #[error("invalid {what}: {why}")]
    Invalid {
        /// What was wrong.
        what: &'static str,
        /// Why.
        why: String,
    },
    /// The coordinator answered something this side cannot read.
    #[error("the coordinator answered what this side cannot read: {0}")]
    Protocol(String),
    /// Joining the group through its library failed, as the core says.
    #[error("joining the group: {0}")]
    Group(#[from] scope_core::Error),
    /// Starting or watching a worker process failed.
    #[error("worker process: {0}")]
    Process(String),
}

/// The socket address `host_port` names, or the error naming it.
pub(crate) fn resolve(host_port: &str) -> Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    host_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| JobError::invalid("coordinator address", host_port))
}

impl JobError {
    pub(crate) fn lost(at: String, why: impl std::fmt::Display) -> Self {
        Self::CoordinatorLost {
            at,
            why: why.to_string(),
        }
    }

    pub(crate) fn invalid(what: &'static str, why: impl Into<String>) -> Self {
        Self::Invalid {
            what,
            why: why.into(),
        }
    }
}

/// This crate's result.
pub type Result<T> = std::result::Result<T, JobError>;
