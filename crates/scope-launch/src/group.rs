//! A launched worker's group, joined through a device library.
//!
//! Over NCCL or RCCL the ranks of separate processes need one identity
//! (NCCL's unique id): rank 0 makes it, and every rank must hold the same
//! bytes before it joins (rule 49). The coordinator carries them, so a
//! program needs one call and no file or socket of its own.

use std::sync::Arc;
use std::time::Duration;

use scope_core::Client;
use scope_core::collective::Rank;
use scope_core::collective::device::DeviceCollectives;

use crate::error::{JobError, Result};
use crate::worker::Launched;

/// An identity that crosses processes as bytes.
pub trait Shareable: Sized {
    /// Its bytes.
    fn to_shared(&self) -> Vec<u8>;
    /// It again, from [`to_shared`](Self::to_shared)'s bytes; an
    /// `InvalidArgument` for bytes that are not one.
    fn from_shared(bytes: &[u8]) -> scope_core::Result<Self>;
}

impl Shareable for scope_native::nccl::UniqueId {
    fn to_shared(&self) -> Vec<u8> {
        self.to_bytes().to_vec()
    }

    fn from_shared(bytes: &[u8]) -> scope_core::Result<Self> {
        Self::from_bytes(bytes)
    }
}

/// A backend whose groups a launched worker can join: its identity
/// crosses processes as bytes.
pub trait Joinable: DeviceCollectives<Identity: Shareable> {}

impl<B: DeviceCollectives<Identity: Shareable>> Joinable for B {}

/// The key a group's identity is shared under.
const IDENTITY: &str = "identity";

/// How long a worker started again waits for its peers to admit it: they
/// do at the end of a step, so this bounds a step, not a round.
pub const ADMISSION: Duration = Duration::from_secs(300);

impl Launched {
    /// This worker's rank of its group over a device library, on `client`.
    /// A worker started again first waits, at most [`ADMISSION`], to be
    /// admitted. Rank 0 of the epoch makes the identity with `make`; the
    /// others wait for it. `deadline` bounds that wait, the join and every
    /// round after (rule 49); a member whose process is gone fails it sooner,
    /// as `Missing` naming it ([`Launched::epoch_liveness`]).
    ///
    /// # Errors
    ///
    /// [`JobError::TimedOut`], [`JobError::Group`], a lost coordinator.
    pub fn join<B: Joinable>(
        &self,
        client: Client<B>,
        deadline: Duration,
        make: impl FnOnce() -> scope_core::Result<B::Identity>,
    ) -> Result<Rank<B>> {
        if self.membership().waiting {
            self.wait_for_admission(ADMISSION)?;
        }
        self.join_current(client, deadline, make)
    }

    /// This worker's rank of the next epoch, on every member after a round
    /// failed for a lost peer, or when [`change_due`](Self::change_due)
    /// says so. Heal [`newcomers`](Self::newcomers) after. A member decided
    /// in that never joins fails the join: call it again.
    ///
    /// # Errors
    ///
    /// [`JobError::Invalid`] when the epoch left this worker out; as
    /// [`join`](Self::join).
    pub fn rejoin<B: Joinable>(
        &self,
        client: Client<B>,
        deadline: Duration,
        make: impl FnOnce() -> scope_core::Result<B::Identity>,
    ) -> Result<Rank<B>> {
        self.next_epoch()?;
        self.join_current(client, deadline, make)
    }

    fn join_current<B: Joinable>(
        &self,
        client: Client<B>,
        deadline: Duration,
        make: impl FnOnce() -> scope_core::Result<B::Identity>,
    ) -> Result<Rank<B>> {
        let epoch = self.membership();
        let rank = self
            .rank_now()
            .ok_or_else(|| JobError::invalid("membership", "this worker is in no epoch"))?;
        let bytes = self.share(IDENTITY, deadline, || Ok(make()?.to_shared()))?;
        let identity = B::Identity::from_shared(&bytes).map_err(JobError::Group)?;
        let group = Rank::join_epoch(
            client,
            &identity,
            rank,
            epoch.members.len(),
            epoch.number,
            deadline,
        )?;
        group.watch_liveness(Arc::new(self.epoch_liveness()?))?;
        Ok(group)
    }
}
