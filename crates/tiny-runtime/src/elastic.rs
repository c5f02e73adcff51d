//! Data-parallel training that survives a lost device (rules 51, 54–57 of
//! `docs/ERROR_MODEL.md`).
//!
//! When a rank's device is lost, its step fails on every rank — its
//! gradient cannot be read, so no rank's all-reduced gradient is written
//! and no rank updates (rule 41) — and the weights stay as they were,
//! everywhere. What is left is the runtime's choice, and this is the one
//! torchft and MPI's ULFM make:
//!
//! 1. **The others go on** ([`DataParallel::shrink`]): every member whose
//!    device is not lost shrinks the group to themselves, and trains on. A
//!    mean over the survivors is a mean over their rows: the step is the
//!    step on the batch they hold.
//! 2. **The lost rank comes back** ([`DataParallel::readmit`]): its device
//!    opens again (`Client::recover`), every byte it held reading as lost
//!    with the device; it writes again what only it knows — its shard, its
//!    constants — and the group admits it as its last rank.
//! 3. **Its weights come from a peer** (the same call): a broadcast from
//!    rank 0 writes, and heals, its current weights, so it takes part in
//!    the next step as clean. Every other buffer it holds is written by
//!    that step's kernels before any reads it.

use std::time::{Duration, Instant};

use scope_core::{Error, Recovered, Result};

use crate::data_parallel::DataParallel;
use scope_core::Backend;

/// What bringing a replica back did, and how long each part took.
#[derive(Debug)]
pub struct Readmission {
    /// What its recovery answered.
    pub recovered: Recovered,
    /// Opening its device again, every allocation made anew.
    pub recover: Duration,
    /// The members agreeing to admit it, a new epoch.
    pub admit: Duration,
    /// Broadcasting rank 0's weights into its.
    pub heal: Duration,
}

impl<B: Backend> DataParallel<B> {
    /// The group's membership epoch: 0 as made, one more per change.
    pub fn epoch(&self) -> u64 {
        self.group.epoch()
    }

    /// Every member whose device is not lost shrinks the group to
    /// themselves (rule 54); the lost ones are not waited for. The new
    /// members, by rank: the survivors in their old order.
    ///
    /// # Errors
    ///
    /// A survivor's shrink: a group superseded already, a survivor that did
    /// not come within the deadline; [`Error::Internal`] when no member
    /// survives.
    pub fn shrink(&mut self) -> Result<Vec<usize>> {
        let shrunk = self.group.run(|rank| {
            let replica = self.members[rank.index()];
            let lost = self.replica(replica).runtime().client().poison().is_some();
            (!lost).then(|| rank.shrink().map(|r| (replica, r)))
        });
        let mut survivors = Vec::new();
        let mut group = None;
        for outcome in shrunk.into_iter().flatten() {
            let (replica, rank) = outcome?;
            group.get_or_insert_with(|| rank.group());
            survivors.push(replica);
        }
        self.group = group.ok_or_else(|| Error::internal("no member of the group survived"))?;
        self.members = survivors;
        Ok(self.members.clone())
    }

    /// Bring replica `index` back (rules 51, 56, 57): open its lost device
    /// again, write its shard and constants again, admit it as the group's
    /// last rank, and heal its current weights with a broadcast from rank
    /// 0.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a replica the runtime does not have
    /// or that is a member already; its recovery's (`Error::RestartRequired`
    /// where the driver says the process must restart, `Error::Refused`
    /// where a reset would destroy another client's memory on the same
    /// device: the group goes on without it); a write; the members'
    /// admission or the heal.
    pub fn readmit(&mut self, index: usize) -> Result<Readmission> {
        self.ensure_replica("readmit", index)?;
        if self.members.contains(&index) {
            return Err(Error::invalid(
                "readmit",
                format!("replica {index} is a member of the group already"),
            ));
        }
        let client = self.replica(index).runtime().client().clone();
        let start = Instant::now();
        let recovered = client.recover()?;
        self.replica(index).reload()?;
        let recover = start.elapsed();

        let start = Instant::now();
        let admitted = self
            .group
            .run(|rank| rank.admit(std::slice::from_ref(&client)));
        let admitted = admitted.into_iter().collect::<Result<Vec<_>>>()?;
        self.group = admitted
            .first()
            .map(|rank| rank.group())
            .ok_or_else(|| Error::internal("a group of no members admitted"))?;
        self.members.push(index);
        let admit = start.elapsed();

        let start = Instant::now();
        let healed = self.group.run(|rank| {
            let replica = self.replica(self.members[rank.index()]);
            rank.heal(0, &[replica.current_weights().flat.slice()])
        });
        healed.into_iter().collect::<Result<()>>()?;
        Ok(Readmission {
            recovered,
            recover,
            admit,
            heal: start.elapsed(),
        })
    }
}
