//! A launched worker's group, joined through a device library.
//!
//! Over NCCL or RCCL the ranks of separate processes need one identity
//! (NCCL's unique id): rank 0 makes it, and every rank must hold the same
//! bytes before it joins (rule 49). The coordinator carries them, so a
//! program needs one call and no file or socket of its own.

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

/// The key a group's identity is shared under.
const IDENTITY: &str = "identity";

impl Launched {
    /// This worker's rank of its group over a device library, in its
    /// launch's epoch, on `client`. Rank 0 makes the identity with `make`
    /// (`B::identity` on real NCCL); the others wait for it. `deadline` bounds
    /// that wait, the join, and every round after (rule 49).
    ///
    /// # Errors
    ///
    /// [`JobError::TimedOut`] when rank 0 published no identity in time;
    /// [`JobError::Group`] for the library's refusal or peers that never
    /// joined; a lost coordinator.
    pub fn join<B>(
        &self,
        client: Client<B>,
        deadline: Duration,
        make: impl FnOnce() -> scope_core::Result<B::Identity>,
    ) -> Result<Rank<B>>
    where
        B: DeviceCollectives,
        B::Identity: Shareable,
    {
        let bytes = self.share(IDENTITY, deadline, || Ok(make()?.to_shared()))?;
        let identity = B::Identity::from_shared(&bytes).map_err(JobError::Group)?;
        Ok(Rank::join_epoch(
            client,
            &identity,
            self.rank(),
            self.ranks(),
            self.epoch(),
            deadline,
        )?)
    }
}
