//! The worker's side: one call to join a launch, a heartbeat, and what rank
//! 0 shares with its peers.
//!
//! A worker is alive while its lease is. A thread renews it four times a
//! liveness window, so a process killed or stopped drops out within one
//! window, with no deadline of anyone's. The same thread learns when the
//! launcher is gone: a renewal that fails marks the launch lost. From then
//! on [`Launched::healthy`] answers [`JobError::CoordinatorLost`], and a
//! loop that checks it each step stops with a typed error.
//!
//! Each beat also lists each rank's lease holder: a group learns from it
//! that a peer is gone, with no call of its own ([`EpochLiveness`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::connect::connect;
use crate::error::{JobError, Result};
use crate::settings::{Settings, keys};
use crate::store::{Coordinator, Lease, wait_for};

/// A worker process of a launch, registered with its coordinator.
pub struct Launched {
    settings: Settings,
    coordinator: Arc<dyn Coordinator>,
    lease: Lease,
    heart: Arc<Heart>,
    beating: Option<JoinHandle<()>>,
    /// The epoch this worker is in and its members (see `membership`).
    pub(crate) epoch: Mutex<Epoch>,
}

/// One membership epoch: its number and its members, as launch ranks in
/// the order of their ranks in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Epoch {
    /// Its number.
    pub number: u64,
    /// The launch rank of each of its ranks.
    pub members: Vec<usize>,
    /// Whether this worker waits to be admitted to the next epoch: it was
    /// started again, and no epoch since holds it.
    pub waiting: bool,
}

/// What the heartbeat thread and the worker share: whether to stop, and
/// what ended the launch, if anything did.
#[derive(Default)]
struct Heart {
    stopping: AtomicBool,
    lost: Mutex<Option<JobError>>,
    wake: Condvar,
    /// Who held each launch rank's lease at the last beat: a process id.
    holders: Mutex<BTreeMap<usize, Vec<u8>>>,
}

/// An epoch's [`Liveness`](scope_core::collective::remote::Liveness): a member
/// is gone once the process that held its lease as the group formed no
/// longer does; read from the heartbeat's last listing.
pub struct EpochLiveness {
    heart: Arc<Heart>,
    /// Each group rank's launch rank and its holder as the group formed.
    members: Vec<(usize, Option<Vec<u8>>)>,
    coordinator: Arc<dyn Coordinator>,
    /// Where the ranks' leases are listed.
    alive: String,
}

impl scope_core::collective::remote::Liveness for EpochLiveness {
    fn gone_now(&self) -> Option<Vec<usize>> {
        if let Ok(holders) = listed(&*self.coordinator, &self.alive) {
            *self.heart.holders.lock() = holders;
        }
        self.gone()
    }

    fn gone(&self) -> Option<Vec<usize>> {
        let holders = self.heart.holders.lock();
        let gone: Vec<usize> = (self.members.iter().enumerate())
            .filter(|(_, (member, formed))| {
                formed.is_none() || holders.get(member) != formed.as_ref()
            })
            .map(|(rank, _)| rank)
            .collect();
        (!gone.is_empty()).then_some(gone)
    }
}

impl Launched {
    /// Joins the launch this process was started by, from its environment.
    pub fn from_env() -> Result<Self> {
        Self::with(Settings::from_env()?)
    }

    /// Joins the launch `settings` describe: checks them against what the
    /// launcher recorded, takes the rank's lease and starts its heartbeat.
    ///
    /// # Errors
    ///
    /// [`JobError::Invalid`] for a group size or epoch other than the
    /// job's, or a rank another live process holds;
    /// [`JobError::CoordinatorLost`] when it cannot be reached.
    pub fn with(settings: Settings) -> Result<Self> {
        let coordinator = connect(&settings.coordinator, settings.liveness)?;
        let job = &settings.job;
        let recorded = |key: String, what: &'static str, mine: String| -> Result<()> {
            let held = coordinator
                .get(&key)?
                .map(|v| String::from_utf8_lossy(&v).into_owned());
            match held {
                Some(held) if held == mine => Ok(()),
                Some(held) => Err(JobError::invalid(
                    what,
                    format!("{mine} given to this worker, {held} recorded for job `{job}`"),
                )),
                None => Err(JobError::invalid(
                    what,
                    format!("no job `{job}` at {}", coordinator.at()),
                )),
            }
        };
        recorded(keys::ranks(job), "group size", settings.ranks.to_string())?;
        recorded(keys::epoch(job), "epoch", settings.epoch.to_string())?;
        let lease = coordinator.grant(settings.liveness)?;
        let holder_id = keys::holder(std::process::id());
        let holder = coordinator.create(
            &keys::alive(job, settings.rank),
            holder_id.as_bytes(),
            Some(lease),
        )?;
        if holder != holder_id.as_bytes() {
            let _ = coordinator.revoke(lease);
            return Err(JobError::invalid(
                "rank",
                format!(
                    "rank {} is held by live process {}",
                    settings.rank,
                    keys::holder_pid(&holder)
                ),
            ));
        }
        let heart = Arc::new(Heart::default());
        let beating = {
            let (coordinator, heart) = (coordinator.clone(), heart.clone());
            let every = settings.liveness / 4;
            let keys = (keys::launcher(job), keys::alive_prefix(job));
            std::thread::Builder::new()
                .name("scope-heartbeat".into())
                .spawn(move || beat(&*coordinator, (lease, &keys), every, &heart))
                .map_err(|e| JobError::Process(format!("the heartbeat thread: {e}")))?
        };
        let epoch = Mutex::new(Epoch {
            number: settings.epoch,
            members: (0..settings.ranks).collect(),
            waiting: settings.restart > 0,
        });
        Ok(Self {
            settings,
            coordinator,
            lease,
            heart,
            beating: Some(beating),
            epoch,
        })
    }

    /// This worker's launch rank: its rank as started, which stays its
    /// name across membership changes.
    pub fn rank(&self) -> usize {
        self.settings.rank
    }

    /// How many workers the job launched.
    pub fn ranks(&self) -> usize {
        self.settings.ranks
    }

    /// The membership epoch this worker is in now.
    pub fn epoch(&self) -> u64 {
        self.epoch.lock().number
    }

    /// How many times this rank was started before this process.
    pub fn restarts(&self) -> u32 {
        self.settings.restart
    }

    /// What this worker was started with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The coordinator, for what a program shares beyond this crate's keys.
    pub fn coordinator(&self) -> &Arc<dyn Coordinator> {
        &self.coordinator
    }

    /// `Ok` while the launch goes on; the error that ended it, once the
    /// heartbeat failed. Cheap: it reads what the heartbeat thread found.
    pub fn healthy(&self) -> Result<()> {
        match &*self.heart.lost.lock() {
            Some(lost) => Err(lost.clone()),
            None => Ok(()),
        }
    }

    /// The ranks whose lease is alive now, this one among them.
    pub fn alive(&self) -> Result<Vec<usize>> {
        let holders = listed(&*self.coordinator, &keys::alive_prefix(&self.settings.job))?;
        Ok(holders.into_keys().collect())
    }

    /// The liveness of a group of the current epoch, formed now: each
    /// member's lease holder, listed afresh, is the one it must keep.
    ///
    /// # Errors
    ///
    /// A lost coordinator.
    pub fn epoch_liveness(&self) -> Result<EpochLiveness> {
        let alive = keys::alive_prefix(&self.settings.job);
        let holders = listed(&*self.coordinator, &alive)?;
        let members = (self.membership().members.into_iter())
            .map(|m| (m, holders.get(&m).cloned()))
            .collect();
        *self.heart.holders.lock() = holders;
        Ok(EpochLiveness {
            heart: self.heart.clone(),
            members,
            coordinator: self.coordinator.clone(),
            alive,
        })
    }

    /// What rank 0 of the current epoch shares as `name`: it makes it with
    /// `make` and publishes it; every other rank waits for it at most
    /// `within`. The first value published stays, so a rank 0 started again
    /// in the same epoch hands out what its peers already hold.
    pub fn share(
        &self,
        name: &str,
        within: Duration,
        make: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        self.healthy()?;
        let (number, first) = {
            let epoch = self.epoch.lock();
            (epoch.number, epoch.members.first().copied())
        };
        let key = keys::shared(&self.settings.job, number, name);
        if first == Some(self.settings.rank) {
            if let Some(held) = self.coordinator.get(&key)? {
                return Ok(held);
            }
            self.coordinator.create(&key, &make()?, None)
        } else {
            wait_for(&*self.coordinator, &key, within)
        }
    }
}

/// Each rank's lease holder, by the keys under `prefix`.
fn listed(coordinator: &dyn Coordinator, prefix: &str) -> Result<BTreeMap<usize, Vec<u8>>> {
    Ok(coordinator
        .list(prefix)?
        .into_iter()
        .filter_map(|(key, holder)| Some((key[prefix.len()..].parse().ok()?, holder)))
        .collect())
}

/// Renews `lease` every `every`, checks the launcher's key is still held
/// and lists the ranks' holders, until told to stop or until any fails,
/// which it records.
fn beat(
    coordinator: &dyn Coordinator,
    (lease, (launcher, alive)): (Lease, &(String, String)),
    every: Duration,
    heart: &Heart,
) {
    loop {
        {
            let mut lost = heart.lost.lock();
            if !heart.stopping.load(Ordering::SeqCst) {
                heart.wake.wait_for(&mut lost, every);
            }
            if heart.stopping.load(Ordering::SeqCst) {
                return;
            }
        }
        let checked = coordinator
            .keep_alive(lease)
            .and_then(|()| match coordinator.get(launcher)? {
                Some(_) => Ok(()),
                None => Err(JobError::LauncherLost {
                    job: launcher.trim_end_matches("/launcher").to_owned(),
                }),
            })
            .and_then(|()| listed(coordinator, alive));
        match checked {
            Ok(holders) => *heart.holders.lock() = holders,
            Err(error) => {
                tracing::warn!(%error, "the launch is lost");
                *heart.lost.lock() = Some(error);
                return;
            }
        }
    }
}

impl Drop for Launched {
    /// Says this worker ends on purpose, so its launcher does not take the
    /// lapse of its lease for a hang, then gives the lease back.
    fn drop(&mut self) {
        {
            // Under the lock the thread waits on, so it cannot miss the
            // wake between its check and its wait.
            let _held = self.heart.lost.lock();
            self.heart.stopping.store(true, Ordering::SeqCst);
        }
        self.heart.wake.notify_all();
        if let Some(beating) = self.beating.take() {
            let _ = beating.join();
        }
        if self.healthy().is_ok() {
            let done = keys::done(&self.settings.job, self.settings.rank, std::process::id());
            let _ = self.coordinator.put(&done, b"", None);
            let _ = self.coordinator.revoke(self.lease);
        }
    }
}

#[cfg(test)]
mod tests {
    use scope_core::collective::remote::Liveness;

    use super::*;
    use crate::store::Store;

    /// Launch ranks 0, 1 and 3 form a group (ranks 0, 1, 2); rank 2 is no member.
    #[test]
    fn a_member_is_gone_once_its_forming_process_no_longer_holds_its_lease() {
        let store: Arc<dyn Coordinator> = Arc::new(Store::new());
        let hold = |rank: usize, holder: &str| {
            store
                .put(&keys::alive("job", rank), holder.as_bytes(), None)
                .unwrap();
        };
        for (rank, holder) in [(0, "10/0"), (1, "11/0"), (2, "12/0"), (3, "13/0")] {
            hold(rank, holder);
        }
        let formed = |holder: &str| Some(holder.as_bytes().to_vec());
        let liveness = EpochLiveness {
            heart: Arc::new(Heart::default()),
            members: vec![
                (0, formed("10/0")),
                (1, formed("11/0")),
                (3, formed("13/0")),
            ],
            coordinator: store.clone(),
            alive: keys::alive_prefix("job"),
        };
        assert_eq!(liveness.gone_now(), None, "every member holds its lease");
        store.delete(&keys::alive("job", 2)).unwrap();
        assert_eq!(liveness.gone_now(), None, "a worker that is no member");
        store.delete(&keys::alive("job", 1)).unwrap();
        assert_eq!(liveness.gone(), None, "the last listing, before the loss");
        assert_eq!(liveness.gone_now(), Some(vec![1]), "a lease let go");
        hold(1, "21/0");
        assert_eq!(
            liveness.gone_now(),
            Some(vec![1]),
            "started again: not the member"
        );
        store.delete(&keys::alive("job", 3)).unwrap();
        assert_eq!(
            liveness.gone_now(),
            Some(vec![1, 2]),
            "group ranks, not launch ranks"
        );
    }
}
