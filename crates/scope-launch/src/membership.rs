//! Membership across processes, decided through the coordinator.
//!
//! In one process a group changes by `Rank::shrink` and `Rank::admit`
//! (rules 54–56). Across processes each change is a new epoch joined from a
//! fresh identity (`Rank::join_epoch`), and someone must decide who is in
//! it. Here the coordinator decides, once per epoch: the first proposal for
//! epoch `e + 1` wins (a create-if-absent), and every member learns it.
//!
//! - A proposal keeps the current members whose lease is alive, in their
//!   order, and adds every live worker that is no member, last (rule 56).
//! - Survivors change after a round that failed ([`Launched::rejoin`]);
//!   a worker the launcher started again waits to be admitted
//!   ([`Launched::join`](crate::Launched::join)).
//! - Admission needs the members to change at one step. The first member
//!   to see a newcomer proposes "after the next step" ([`Launched::change_due`]).
//!   A member can be at most one step ahead when every step ends in a read
//!   of its round, so all of them meet that step.

use std::time::{Duration, Instant};

use crate::error::{JobError, Result};
use crate::settings::keys;
use crate::worker::{Epoch, Launched};

fn encode(members: &[usize]) -> Vec<u8> {
    members
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
        .into_bytes()
}

fn decode(bytes: &[u8]) -> Result<Vec<usize>> {
    let text = String::from_utf8_lossy(bytes);
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|m| {
            m.parse()
                .map_err(|_| JobError::Protocol(format!("members `{text}`")))
        })
        .collect()
}

impl Launched {
    /// The epoch this worker is in, its members and whether it waits.
    pub fn membership(&self) -> Epoch {
        self.epoch.lock().clone()
    }

    /// This worker's rank in its current epoch; `None` while it waits.
    pub fn rank_now(&self) -> Option<usize> {
        let epoch = self.epoch.lock();
        epoch.members.iter().position(|&m| m == self.rank())
    }

    /// The ranks of the current epoch that were not members of the one
    /// before: the ranks to heal (`Rank::heal`), the same on every member.
    pub fn newcomers(&self) -> Result<Vec<usize>> {
        let epoch = self.membership();
        if epoch.number == self.settings().epoch {
            return Ok(Vec::new());
        }
        let before = self.members_of(epoch.number - 1)?;
        Ok(epoch
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| !before.contains(m))
            .map(|(rank, _)| rank)
            .collect())
    }

    /// The members of the current epoch whose lease is gone: the launch
    /// ranks a round that stalled lost. Across processes the library cannot
    /// say which peer is missing (rule 49); the coordinator can.
    ///
    /// # Errors
    ///
    /// A lost coordinator.
    pub fn missing(&self) -> Result<Vec<usize>> {
        let alive = self.alive()?;
        let epoch = self.membership();
        Ok(epoch
            .members
            .into_iter()
            .filter(|m| !alive.contains(m))
            .collect())
    }

    fn members_of(&self, number: u64) -> Result<Vec<usize>> {
        if number == self.settings().epoch {
            return Ok((0..self.ranks()).collect());
        }
        let key = keys::members(&self.settings().job, number);
        match self.coordinator().get(&key)? {
            Some(members) => decode(&members),
            None => Err(JobError::invalid(
                "epoch",
                format!("epoch {number} was never decided"),
            )),
        }
    }

    /// Whether the group changes after this step: call it at the end of
    /// every step, after the step's read, with the step's number. `true`
    /// means call [`rejoin`](Self::rejoin) now, on every member.
    /// [`JobError::Invalid`] when this member is already past the agreed
    /// step: its loop does not end its steps in a read.
    pub fn change_due(&self, step: u64) -> Result<bool> {
        self.healthy()?;
        let epoch = self.membership();
        let key = keys::admit(&self.settings().job, epoch.number);
        let agreed = match self.coordinator().get(&key)? {
            Some(agreed) => agreed,
            None => {
                let alive = self.alive()?;
                if alive.iter().all(|r| epoch.members.contains(r)) {
                    return Ok(false);
                }
                let next = (step + 1).to_string();
                self.coordinator().create(&key, next.as_bytes(), None)?
            }
        };
        let agreed: u64 = String::from_utf8_lossy(&agreed)
            .parse()
            .map_err(|_| JobError::Protocol(format!("`{key}` holds no step")))?;
        match step.cmp(&agreed) {
            std::cmp::Ordering::Less => Ok(false),
            std::cmp::Ordering::Equal => Ok(true),
            std::cmp::Ordering::Greater => Err(JobError::invalid(
                "step",
                format!(
                    "step {step} is past {agreed}, where epoch {} was to change",
                    epoch.number
                ),
            )),
        }
    }

    /// Decides the next epoch, or learns what another member decided, and
    /// moves this worker into it; [`JobError::Invalid`] if it is left out.
    pub(crate) fn next_epoch(&self) -> Result<Epoch> {
        let current = self.membership();
        let alive = self.alive()?;
        let mut proposal: Vec<usize> = current
            .members
            .iter()
            .copied()
            .filter(|m| alive.contains(m))
            .collect();
        proposal.extend(alive.iter().filter(|r| !current.members.contains(r)));
        let number = current.number + 1;
        let key = keys::members(&self.settings().job, number);
        let decided = decode(&self.coordinator().create(&key, &encode(&proposal), None)?)?;
        if !decided.contains(&self.rank()) {
            return Err(JobError::invalid(
                "membership",
                format!(
                    "epoch {number} was decided without launch rank {}: {decided:?}",
                    self.rank()
                ),
            ));
        }
        let next = Epoch {
            number,
            members: decided,
            waiting: false,
        };
        *self.epoch.lock() = next.clone();
        Ok(next)
    }

    /// Waits, at most `within`, for an epoch that admits this worker
    /// started again, and moves it there.
    pub(crate) fn wait_for_admission(&self, within: Duration) -> Result<Epoch> {
        let began = Instant::now();
        let prefix = keys::members_prefix(&self.settings().job);
        loop {
            self.healthy()?;
            let mut admitted: Option<(u64, Vec<usize>)> = None;
            for (key, value) in self.coordinator().list(&prefix)? {
                let Ok(number) = key[prefix.len()..].parse::<u64>() else {
                    continue;
                };
                let members = decode(&value)?;
                if admitted.as_ref().is_none_or(|(n, _)| number > *n) {
                    admitted = Some((number, members));
                }
            }
            if let Some((number, members)) = admitted
                && members.contains(&self.rank())
            {
                let next = Epoch {
                    number,
                    members,
                    waiting: false,
                };
                *self.epoch.lock() = next.clone();
                return Ok(next);
            }
            if began.elapsed() >= within {
                return Err(JobError::TimedOut {
                    key: prefix,
                    waited: began.elapsed(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_read_back_as_written() {
        for members in [vec![], vec![3], vec![0, 1, 3, 2]] {
            assert_eq!(decode(&encode(&members)).unwrap(), members);
        }
        assert!(decode(b"1,x").is_err());
    }
}
