//! Data-parallel training that survives a lost device (rules 51, 54–57 of
//! `docs/ERROR_MODEL.md`).
//!
//! When a rank's device is lost, its step fails on every rank: no reduced
//! gradient is written and no rank updates (rule 41), so the weights stay as
//! they were. The rest is the runtime's choice, here the one torchft and ULFM make:
//!
//! 1. **The others go on** ([`DataParallel::shrink`]): the survivors shrink the
//!    group to themselves and train on the rows they hold.
//! 2. **The lost rank comes back** ([`DataParallel::readmit`]): its device opens
//!    again, it writes what only it knows, and the group admits it as last rank.
//! 3. **Its weights come from a peer**: a broadcast from rank 0 heals them, and
//!    the next step's kernels write every other buffer before it is read.

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

    /// Every member whose device is not lost shrinks the group to themselves
    /// (rule 54), waiting for no lost one. Returns the survivors in their old order.
    /// Fails with a survivor's shrink error, or [`Error::Internal`] when none survives.
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

    /// Bring replica `index` back (rules 51, 56, 57): recover its device, reload it,
    /// admit it as the last rank, and heal its weights with a broadcast from rank 0.
    /// Fails with [`Error::InvalidArgument`] for a replica it lacks or a member, with its
    /// recovery's `Error::RestartRequired` or `Error::Refused` (the group goes on
    /// without it), or on a failed write, admission or heal.
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
