//! The device a cubecl client names.
//!
//! cubecl identifies a device by a [`DeviceId`] of two small numbers and
//! keys each runtime's server by that id *and* the server's type, so one id
//! can be served by `ScopeRuntime<Wgpu>`, `ScopeRuntime<Vulkan>` and
//! cubecl's own wgpu runtime in one process — which is how the
//! side-by-side bench compares them on one adapter.

use cubecl_common::device::{Device, DeviceId};

/// A device of one scope server: the `index`-th it finds (for wgpu and
/// Vulkan, index 0 is the one the server's environment variables choose).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ScopeDevice {
    /// Which device of the server's kind.
    pub index: u16,
}

impl Device for ScopeDevice {
    fn from_id(device_id: DeviceId) -> Self {
        Self {
            index: device_id.index_id,
        }
    }

    fn to_id(&self) -> DeviceId {
        DeviceId::new(0, self.index)
    }
}

/// The environment variable that splits one adapter into several logical
/// devices: `SCOPE_LOGICAL_DEVICES=N` makes the runtime list devices
/// `0..N` of type 0, each opening a scope server of its own — its own
/// device object, queue and memory — on the adapter the server's
/// environment chooses. For testing what needs several devices (the
/// collectives, `to_client`) without several GPUs, as XLA's
/// `--xla_force_host_platform_device_count` does.
pub const LOGICAL_DEVICES_VAR: &str = "SCOPE_LOGICAL_DEVICES";

static LOGICAL: std::sync::OnceLock<Option<u16>> = std::sync::OnceLock::new();

/// How many logical devices the adapter is split into: `SCOPE_LOGICAL_DEVICES`
/// as read the first time any device is listed or opened (a count that
/// changed under cubecl's registry would name servers that never open), or
/// what [`split_into_logical_devices`] set before that; `None` when unset,
/// empty, zero or not a number — today's one device.
pub fn logical_devices() -> Option<u16> {
    *LOGICAL.get_or_init(|| {
        std::env::var(LOGICAL_DEVICES_VAR)
            .ok()
            .and_then(|n| n.trim().parse::<u16>().ok())
            .filter(|&n| n > 0)
    })
}

/// Split the adapter into `count` logical devices, as
/// `SCOPE_LOGICAL_DEVICES=count` would, without touching the environment.
/// Only before the count is first read (by listing or opening a device):
/// afterwards servers are open under the count already decided.
///
/// # Errors
///
/// The count already decided, when it is not `count`.
pub fn split_into_logical_devices(count: u16) -> Result<(), Option<u16>> {
    let wanted = Some(count).filter(|&n| n > 0);
    let decided = *LOGICAL.get_or_init(|| wanted);
    if decided == wanted {
        Ok(())
    } else {
        Err(decided)
    }
}
