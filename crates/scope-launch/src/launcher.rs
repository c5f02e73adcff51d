//! The launcher: N workers, one per device, watched and restarted.
//!
//! It is torchrun's agent cut to what scope needs, with one difference: a
//! worker that fails is restarted **alone**. Its peers keep their
//! processes, devices and bytes; what a lost rank made wrong is the
//! failure model's to say, not a restart's to erase.
//!
//! A worker fails two ways: its process ends (seen at once), or it stops
//! renewing its lease (seen within the liveness window; the launcher kills
//! it). A program that never joins through [`Launched`](crate::Launched)
//! is watched the first way only. Restarts come from one budget for the
//! job, each after a back-off that doubles for a rank that keeps failing.
//! Every event is printed with the time since start: the timeline.

use std::collections::HashSet;
use std::ffi::OsString;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::connect::connect;
use crate::embedded::Embedded;
use crate::error::{JobError, Result};
use crate::settings::{DEFAULT_LIVENESS, Settings, keys};
use crate::store::{Coordinator, Lease, Store};

/// When a failed worker is started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Restarts the whole job may spend; one more failure ends it.
    pub max_restarts: u32,
    /// The wait before a rank's first restart, doubled for each after.
    pub backoff: Duration,
    /// The longest wait before a restart.
    pub backoff_cap: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            max_restarts: 3,
            backoff: Duration::from_millis(100),
            backoff_cap: Duration::from_secs(10),
        }
    }
}

/// What to launch.
#[derive(Debug, Clone)]
pub struct Plan {
    /// How many workers: ranks `0..ranks`.
    pub ranks: usize,
    /// The program each worker runs.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Variables every worker gets beside its own environment and the
    /// launch's.
    pub env: Vec<(OsString, OsString)>,
    /// When to restart.
    pub policy: Policy,
    /// How long a worker may go without renewing its lease.
    pub liveness: Duration,
    /// A coordinator to use, or `None` for the launcher's own.
    pub coordinator: Option<String>,
    /// The membership epoch the job starts in.
    pub epoch: u64,
}

impl Plan {
    /// `ranks` workers of `program`, with the default policy and window.
    pub fn new(ranks: usize, program: impl Into<OsString>) -> Self {
        Self {
            ranks,
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            policy: Policy::default(),
            liveness: DEFAULT_LIVENESS,
            coordinator: None,
            epoch: 0,
        }
    }
}

/// How a launch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every worker ended successfully.
    Done {
        /// Restarts spent on the way.
        restarts: u32,
    },
    /// A failure found the restart budget spent; every worker was stopped.
    Spent {
        /// The rank that failed last.
        rank: usize,
        /// How it failed.
        why: String,
        /// Restarts spent before it.
        restarts: u32,
    },
    /// The launcher was asked to stop (`SIGINT`, `SIGTERM`); every worker
    /// was stopped.
    Interrupted,
}

/// Set by the launcher's signal handler; read by its loop.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn interrupted(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Routes `SIGINT` and `SIGTERM` to a flag the launch loop reads, so a
/// stopped launcher stops its workers instead of orphaning them.
pub fn stop_on_signals() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe, and lives as long as the program.
        unsafe { libc::signal(signal, interrupted as *const () as libc::sighandler_t) };
    }
}

/// Sends `signal` to process `pid`; an ended process is no error.
fn send(pid: u32, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: `kill` takes any pid and signal and reports misuse through its
    // return value; no memory is involved.
    unsafe { libc::kill(pid, signal) };
}

enum State {
    Running(Child),
    Waiting(Instant),
    Done,
}

struct Worker {
    rank: usize,
    starts: u32,
    state: State,
    /// Whether this start took its lease: only then is a missing lease a hang.
    joined: bool,
}

/// A launch in progress.
pub struct Launcher {
    plan: Plan,
    job: String,
    coordinator: Arc<dyn Coordinator>,
    address: String,
    _embedded: Option<Embedded>,
    workers: Vec<Worker>,
    restarts: u32,
    began: Instant,
    /// The launcher's own lease: its workers stop when it lapses, so a
    /// launcher that dies stops its job on an etcd that outlives it.
    lease: Lease,
    renewed: Instant,
}

impl Launcher {
    /// Sets up `plan`'s coordinator and records the job in it; starts no
    /// worker yet.
    pub fn new(plan: Plan) -> Result<Self> {
        if plan.ranks == 0 {
            return Err(JobError::invalid("-n", "a launch of no workers"));
        }
        if plan.liveness.is_zero() {
            return Err(JobError::invalid("--liveness", "a window of zero"));
        }
        let (coordinator, address, embedded) = match &plan.coordinator {
            None => {
                let embedded = Embedded::start(Arc::new(Store::new()))?;
                let store: Arc<dyn Coordinator> = embedded.store().clone();
                (store, embedded.address(), Some(embedded))
            }
            Some(address) => (connect(address, plan.liveness)?, address.clone(), None),
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let job = format!("job-{}-{nanos}", std::process::id());
        coordinator.put(&keys::ranks(&job), plan.ranks.to_string().as_bytes(), None)?;
        coordinator.put(&keys::epoch(&job), plan.epoch.to_string().as_bytes(), None)?;
        let lease = coordinator.grant(plan.liveness)?;
        let pid = std::process::id().to_string();
        coordinator.put(&keys::launcher(&job), pid.as_bytes(), Some(lease))?;
        let workers = (0..plan.ranks)
            .map(|rank| Worker {
                rank,
                starts: 0,
                state: State::Waiting(Instant::now()),
                joined: false,
            })
            .collect();
        Ok(Self {
            plan,
            job,
            coordinator,
            address,
            _embedded: embedded,
            workers,
            restarts: 0,
            began: Instant::now(),
            lease,
            renewed: Instant::now(),
        })
    }

    /// The address workers reach the coordinator at.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The job's name, the prefix of its keys.
    pub fn job(&self) -> &str {
        &self.job
    }

    fn say(&self, event: impl std::fmt::Display) {
        eprintln!(
            "scope-launch [{:>8.3} s] {event}",
            self.began.elapsed().as_secs_f64()
        );
    }

    fn start(&mut self, at: usize) -> Result<()> {
        let worker = &self.workers[at];
        let settings = Settings {
            rank: worker.rank,
            ranks: self.plan.ranks,
            epoch: self.plan.epoch,
            coordinator: self.address.clone(),
            liveness: self.plan.liveness,
            restart: worker.starts,
            job: self.job.clone(),
        };
        let child = Command::new(&self.plan.program)
            .args(&self.plan.args)
            .envs(self.plan.env.iter().map(|(k, v)| (k, v)))
            .envs(settings.to_env())
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| JobError::Process(format!("starting {:?}: {e}", self.plan.program)))?;
        let pid = child.id();
        let again = match worker.starts {
            0 => String::new(),
            n => format!(", restart {n}"),
        };
        self.say(format_args!(
            "rank {} started (pid {pid}{again})",
            worker.rank
        ));
        let worker = &mut self.workers[at];
        worker.starts += 1;
        worker.joined = false;
        worker.state = State::Running(child);
        Ok(())
    }

    /// Runs the job to its end.
    pub fn run(mut self) -> Result<Outcome> {
        let ran = self.watch();
        if let Err(lost) = &ran {
            // Workers learn a lost coordinator themselves within a window:
            // let them stop with that typed error before they are signalled.
            self.say(lost);
            self.stop_all(true);
        } else {
            self.stop_all(false);
        }
        let _ = self.coordinator.revoke(self.lease);
        if let Ok(Outcome::Spent {
            rank,
            why,
            restarts,
        }) = &ran
        {
            self.say(format_args!(
                "rank {rank} failed ({why}) with {restarts} of {} restarts spent: stopping the job",
                self.plan.policy.max_restarts
            ));
        }
        ran
    }

    fn watch(&mut self) -> Result<Outcome> {
        let tick =
            (self.plan.liveness / 8).clamp(Duration::from_millis(2), Duration::from_millis(20));
        loop {
            if INTERRUPTED.load(Ordering::SeqCst) {
                self.say("asked to stop");
                return Ok(Outcome::Interrupted);
            }
            if self.renewed.elapsed() >= self.plan.liveness / 4 {
                self.coordinator.keep_alive(self.lease)?;
                self.renewed = Instant::now();
            }
            let alive = self.alive()?;
            for at in 0..self.workers.len() {
                if let Some(why) = self.check(at, &alive)?
                    && let Some(spent) = self.failed(at, why)
                {
                    return Ok(spent);
                }
            }
            if self.workers.iter().all(|w| matches!(w.state, State::Done)) {
                self.say(format_args!(
                    "every rank finished, {} restarts spent",
                    self.restarts
                ));
                return Ok(Outcome::Done {
                    restarts: self.restarts,
                });
            }
            std::thread::sleep(tick);
        }
    }

    /// The pids whose lease is alive, and those that said they end on purpose.
    fn alive(&self) -> Result<(HashSet<String>, HashSet<String>)> {
        let held = self.coordinator.list(&keys::alive_prefix(&self.job))?;
        let done = self.coordinator.list(&format!("{}/done/", self.job))?;
        Ok((
            held.into_iter()
                .map(|(_, held)| keys::holder_pid(&held))
                .collect(),
            done.into_iter()
                .filter_map(|(key, _)| key.rsplit('/').next().map(str::to_owned))
                .collect(),
        ))
    }

    /// One look at worker `at`: `Some(why)` if it just failed.
    fn check(
        &mut self,
        at: usize,
        (alive, done): &(HashSet<String>, HashSet<String>),
    ) -> Result<Option<String>> {
        let worker = &mut self.workers[at];
        match &mut worker.state {
            State::Done => Ok(None),
            State::Waiting(until) => {
                if Instant::now() >= *until {
                    self.start(at)?;
                }
                Ok(None)
            }
            State::Running(child) => {
                let pid = child.id();
                let status = child
                    .try_wait()
                    .map_err(|e| JobError::Process(format!("watching pid {pid}: {e}")))?;
                if let Some(status) = status {
                    return self.ended(at, pid, status);
                }
                let pid_text = pid.to_string();
                if alive.contains(&pid_text) {
                    worker.joined = true;
                    return Ok(None);
                }
                if !worker.joined || done.contains(&pid_text) {
                    return Ok(None);
                }
                // Joined, lease lapsed, process still there: stopped or stuck.
                let _ = child.kill();
                let _ = child.wait();
                let rank = worker.rank;
                self.forget(rank, pid)?;
                Ok(Some(format!(
                    "pid {pid} renewed no lease for {:?}: killed",
                    self.plan.liveness
                )))
            }
        }
    }

    /// Frees `rank`'s lease key held by `pid`, which is gone: a process
    /// that ends without giving its lease back (killed, or `exit` past its
    /// drops) would hold the rank for a window, and its restart be refused.
    fn forget(&self, rank: usize, pid: u32) -> Result<()> {
        let key = keys::alive(&self.job, rank);
        if self
            .coordinator
            .get(&key)?
            .is_some_and(|held| keys::holder_pid(&held) == pid.to_string())
        {
            self.coordinator.delete(&key)?;
        }
        Ok(())
    }

    fn ended(&mut self, at: usize, pid: u32, status: ExitStatus) -> Result<Option<String>> {
        let rank = self.workers[at].rank;
        self.forget(rank, pid)?;
        if status.success() {
            self.say(format_args!("rank {rank} finished (pid {pid})"));
            self.workers[at].state = State::Done;
            return Ok(None);
        }
        Ok(Some(format!("pid {pid} {}", describe(status))))
    }

    /// Counts a failure of worker `at`; `Some` when the budget is spent.
    fn failed(&mut self, at: usize, why: String) -> Option<Outcome> {
        let rank = self.workers[at].rank;
        if self.restarts >= self.plan.policy.max_restarts {
            self.workers[at].state = State::Done;
            return Some(Outcome::Spent {
                rank,
                why,
                restarts: self.restarts,
            });
        }
        self.restarts += 1;
        let policy = self.plan.policy;
        let doublings = self.workers[at].starts.saturating_sub(1).min(16);
        let wait = policy
            .backoff
            .saturating_mul(1 << doublings)
            .min(policy.backoff_cap);
        self.say(format_args!(
            "rank {rank} failed ({why}); restart {} of {} in {wait:?}",
            self.restarts, policy.max_restarts
        ));
        self.workers[at].state = State::Waiting(Instant::now() + wait);
        None
    }

    /// Stops every running worker: `SIGTERM`, then `SIGKILL` for any still
    /// there one liveness window later. With `grace_first`, a window for
    /// them to end on their own comes before the `SIGTERM`.
    fn stop_all(&mut self, grace_first: bool) {
        let mut running: Vec<(usize, Child)> = Vec::new();
        for w in &mut self.workers {
            if let State::Running(child) = std::mem::replace(&mut w.state, State::Done) {
                running.push((w.rank, child));
            }
        }
        let window = self.plan.liveness;
        let wait_for_all = |running: &mut [(usize, Child)]| {
            let until = Instant::now() + window;
            while Instant::now() < until
                && running
                    .iter_mut()
                    .any(|(_, c)| matches!(c.try_wait(), Ok(None)))
            {
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        if grace_first {
            wait_for_all(&mut running);
        }
        for (_, child) in &mut running {
            if matches!(child.try_wait(), Ok(None)) {
                send(child.id(), libc::SIGTERM);
            }
        }
        wait_for_all(&mut running);
        for (rank, mut child) in running {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
            }
            let status = child.wait().map_or_else(|e| e.to_string(), describe);
            self.say(format_args!(
                "rank {rank} stopped (pid {}, {status})",
                child.id()
            ));
        }
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        _ => status.to_string(),
    }
}
