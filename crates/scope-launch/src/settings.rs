//! What a launcher hands each worker, in one place for both ends.
//!
//! The launcher writes these variables and the worker reads them with the
//! same code, so the two cannot drift: a variable renamed on one side and
//! not the other does not compile. Keys in the coordinator are built here
//! too, under the job's own prefix, so two jobs sharing one etcd never read
//! each other's keys.

use std::time::Duration;

use crate::error::{JobError, Result};

/// The variable that holds the worker's rank.
pub const RANK: &str = "SCOPE_LAUNCH_RANK";
/// The group's size.
pub const RANKS: &str = "SCOPE_LAUNCH_RANKS";
/// The membership epoch the worker starts in.
pub const EPOCH: &str = "SCOPE_LAUNCH_EPOCH";
/// Where the coordinator is: `tcp://HOST:PORT` or `etcd://HOST:PORT`.
pub const COORDINATOR: &str = "SCOPE_LAUNCH_COORDINATOR";
/// The liveness window, in milliseconds.
pub const LIVENESS: &str = "SCOPE_LAUNCH_LIVENESS_MS";
/// How many times this rank was started before.
pub const RESTART: &str = "SCOPE_LAUNCH_RESTART";
/// The job's name: the prefix of every key it writes.
pub const JOB: &str = "SCOPE_LAUNCH_JOB";

/// The liveness window when none is given: a worker silent this long is
/// counted gone.
pub const DEFAULT_LIVENESS: Duration = Duration::from_secs(1);

/// One worker's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Its rank, below `ranks`.
    pub rank: usize,
    /// The group's size.
    pub ranks: usize,
    /// The membership epoch it starts in.
    pub epoch: u64,
    /// Where the coordinator is.
    pub coordinator: String,
    /// How long a worker may go without a heartbeat before it is counted gone.
    pub liveness: Duration,
    /// How many times this rank was started before.
    pub restart: u32,
    /// The job's name.
    pub job: String,
}

impl Settings {
    /// The variables a launcher sets for this worker.
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        vec![
            (RANK, self.rank.to_string()),
            (RANKS, self.ranks.to_string()),
            (EPOCH, self.epoch.to_string()),
            (COORDINATOR, self.coordinator.clone()),
            (LIVENESS, self.liveness.as_millis().to_string()),
            (RESTART, self.restart.to_string()),
            (JOB, self.job.clone()),
        ]
    }

    /// Reads the variables through `var`, checking each.
    pub fn read(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let text = |name: &'static str| {
            var(name).ok_or_else(|| {
                JobError::invalid(name, "not set: was this process started by scope-launch?")
            })
        };
        fn number<T: std::str::FromStr>(name: &'static str, text: String) -> Result<T> {
            text.trim()
                .parse()
                .map_err(|_| JobError::invalid(name, format!("`{text}` is not a number")))
        }
        let settings = Self {
            rank: number(RANK, text(RANK)?)?,
            ranks: number(RANKS, text(RANKS)?)?,
            epoch: number(EPOCH, text(EPOCH)?)?,
            coordinator: text(COORDINATOR)?,
            liveness: Duration::from_millis(match var(LIVENESS) {
                Some(ms) => number(LIVENESS, ms)?,
                None => DEFAULT_LIVENESS.as_millis() as u64,
            }),
            restart: match var(RESTART) {
                Some(n) => number(RESTART, n)?,
                None => 0,
            },
            job: text(JOB)?,
        };
        settings.check()?;
        Ok(settings)
    }

    /// Reads this process's environment.
    pub fn from_env() -> Result<Self> {
        Self::read(|name| std::env::var(name).ok())
    }

    fn check(&self) -> Result<()> {
        if self.ranks == 0 {
            return Err(JobError::invalid(RANKS, "a group of no ranks"));
        }
        if self.rank >= self.ranks {
            return Err(JobError::invalid(
                RANK,
                format!("rank {} in a group of {}", self.rank, self.ranks),
            ));
        }
        if self.liveness.is_zero() {
            return Err(JobError::invalid(LIVENESS, "a window of zero"));
        }
        if self.job.is_empty() || self.job.contains('/') {
            return Err(JobError::invalid(
                JOB,
                format!("`{}`: empty or with a `/`", self.job),
            ));
        }
        Ok(())
    }
}

/// The keys a job keeps in its coordinator.
pub mod keys {
    /// The group's size, as the launcher decided it.
    pub fn ranks(job: &str) -> String {
        format!("{job}/ranks")
    }
    /// The membership epoch the launcher started the job in.
    pub fn epoch(job: &str) -> String {
        format!("{job}/epoch")
    }
    /// Held by the launcher's lease while it lives.
    pub fn launcher(job: &str) -> String {
        format!("{job}/launcher")
    }
    /// Held by a live worker's lease: its process id.
    pub fn alive(job: &str, rank: usize) -> String {
        format!("{job}/alive/{rank}")
    }
    /// What a worker's [`alive`] key holds: its process id, and a number
    /// of its own, so two joins of one process never pass for one.
    pub fn holder(pid: u32) -> String {
        static JOINS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = JOINS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{pid}/{n}")
    }
    /// The process id a [`holder`] value names.
    pub fn holder_pid(value: &[u8]) -> String {
        let text = String::from_utf8_lossy(value);
        text.split('/').next().unwrap_or_default().to_owned()
    }
    /// Every rank's [`alive`] key starts so.
    pub fn alive_prefix(job: &str) -> String {
        format!("{job}/alive/")
    }
    /// Written by a worker that ends on purpose, before its lease goes.
    pub fn done(job: &str, rank: usize, pid: u32) -> String {
        format!("{job}/done/{rank}/{pid}")
    }
    /// The members of membership epoch `epoch`, decided once.
    pub fn members(job: &str, epoch: u64) -> String {
        format!("{job}/members/{epoch}")
    }
    /// Every epoch's [`members`] key starts so.
    pub fn members_prefix(job: &str) -> String {
        format!("{job}/members/")
    }
    /// The step after which epoch `epoch` changes to admit newcomers.
    pub fn admit(job: &str, epoch: u64) -> String {
        format!("{job}/admit/{epoch}")
    }
    /// What rank 0 shares with its peers in `epoch`.
    pub fn shared(job: &str, epoch: u64, name: &str) -> String {
        format!("{job}/shared/{epoch}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            rank: 2,
            ranks: 4,
            epoch: 0,
            coordinator: "tcp://127.0.0.1:1".into(),
            liveness: Duration::from_millis(250),
            restart: 1,
            job: "job-1".into(),
        }
    }

    #[test]
    fn what_a_launcher_writes_a_worker_reads() {
        let env = settings().to_env();
        let read =
            Settings::read(|name| env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone()));
        assert_eq!(read.unwrap(), settings());
    }

    #[test]
    fn a_wrong_start_is_refused_naming_the_variable() {
        let cases: [(&str, &str); 5] = [
            (RANK, "4"),
            (RANKS, "0"),
            (RANK, "two"),
            (LIVENESS, "0"),
            (JOB, "a/b"),
        ];
        for (name, value) in cases {
            let mut env = settings().to_env();
            env.iter_mut().find(|(k, _)| *k == name).unwrap().1 = value.into();
            let read =
                Settings::read(|n| env.iter().find(|(k, _)| *k == n).map(|(_, v)| v.clone()));
            assert!(
                matches!(read, Err(JobError::Invalid { what, .. }) if what == name || (name == RANKS && what == RANK)),
                "{name}={value}: {read:?}"
            );
        }
        let missing = Settings::read(|_| None).unwrap_err();
        assert!(missing.to_string().contains(RANK), "{missing}");
    }
}
