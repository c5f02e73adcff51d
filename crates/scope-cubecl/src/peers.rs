//! What one backend's servers in a process share: each device's scope client, and the groups
//! over them.
//!
//! cubecl's registry gives no way back from a device id to its server. Yet a collective or a
//! transfer needs its peers' clients. So each server registers its client here as it opens.
//! Each group is made once, by the first member to ask, and shared. Two members holding two
//! groups would never meet.
//!
//! Rust has no generic statics, so each `CubeBackend` impl owns a typed table
//! (`CubeBackend::peers`), with no map keyed by type and downcast.

use std::collections::HashMap;
use std::sync::Arc;

use cubecl_common::device::DeviceId;
use parking_lot::Mutex;
use scope_core::collective::{DEFAULT_DEADLINE, Group};
use scope_core::{Backend, Client, Error};

/// Why no group could be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PeerError {
    /// A member's server never opened here, so there is no client for its rank.
    #[error("device {0:?} was never opened, so it has no client to take a rank in a group")]
    NeverOpened(DeviceId),
    /// A transfer from a device to itself: scope pairs two ranks, and a device is one.
    #[error("a transfer from {0:?} to itself: scope's point-to-point pairs two devices")]
    ToItself(DeviceId),
    /// scope refused the group.
    #[error(transparent)]
    Group(#[from] Error),
}

/// A collective group as every member's server shares it.
pub(crate) struct Joined<B: Backend> {
    pub(crate) group: Group<B>,
    /// The first failed part's error. Every member saw it, so every member refuses later parts.
    pub(crate) broken: Mutex<Option<Error>>,
}

/// The clients and groups of backend `B`'s servers in this process.
pub struct Peers<B: Backend> {
    opened: Mutex<HashMap<DeviceId, Client<B>>>,
    /// Collective groups, by their members in cubecl's order.
    groups: Mutex<HashMap<Vec<DeviceId>, Arc<Joined<B>>>>,
    /// Two-rank groups for transfers, by (sender, receiver); the sender is rank 0.
    pairs: Mutex<HashMap<(DeviceId, DeviceId), Group<B>>>,
}

impl<B: Backend> Default for Peers<B> {
    fn default() -> Self {
        Self {
            opened: Mutex::new(HashMap::new()),
            groups: Mutex::new(HashMap::new()),
            pairs: Mutex::new(HashMap::new()),
        }
    }
}

impl<B: Backend> Peers<B> {
    /// Record `device`'s scope client (stream 0).
    pub(crate) fn register(&self, device: DeviceId, client: Client<B>) {
        self.opened.lock().insert(device, client);
    }

    /// `device`'s scope client, once its server opened.
    pub(crate) fn opened(&self, device: DeviceId) -> Option<Client<B>> {
        self.opened.lock().get(&device).cloned()
    }

    fn clients(&self, devices: &[DeviceId]) -> Result<Vec<Client<B>>, PeerError> {
        let opened = self.opened.lock();
        devices
            .iter()
            .map(|id| opened.get(id).cloned().ok_or(PeerError::NeverOpened(*id)))
            .collect()
    }

    /// The collective group over `devices`, made on its first use by any member.
    pub(crate) fn group(&self, devices: &[DeviceId]) -> Result<Arc<Joined<B>>, PeerError> {
        let mut groups = self.groups.lock();
        if let Some(joined) = groups.get(devices) {
            return Ok(joined.clone());
        }
        let group = Group::new(self.clients(devices)?, DEFAULT_DEADLINE)?;
        let joined = Arc::new(Joined {
            group,
            broken: Mutex::new(None),
        });
        groups.insert(devices.to_vec(), joined.clone());
        Ok(joined)
    }

    /// The group `from` sends to `to` through, made on first use by either end.
    pub(crate) fn pair(&self, from: DeviceId, to: DeviceId) -> Result<Group<B>, PeerError> {
        if from == to {
            return Err(PeerError::ToItself(from));
        }
        let mut pairs = self.pairs.lock();
        if let Some(pair) = pairs.get(&(from, to)) {
            return Ok(pair.clone());
        }
        let pair = Group::new(self.clients(&[from, to])?, DEFAULT_DEADLINE)?;
        pairs.insert((from, to), pair.clone());
        Ok(pair)
    }
}
