//! The device a cubecl client names.
//!
//! cubecl keys each server by [`DeviceId`] *and* server type. So one id can be served by
//! several runtimes in one process, which lets the bench compare them on one adapter.

use cubecl_common::device::{Device, DeviceId};

/// The `index`-th device a scope server finds; for wgpu and Vulkan, 0 is the environment's.
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

/// The variable that splits one adapter into `N` logical devices, each its own scope server.
/// Tests run the collectives on it without several GPUs, like XLA's
/// `--xla_force_host_platform_device_count`.
pub const LOGICAL_DEVICES_VAR: &str = "SCOPE_LOGICAL_DEVICES";

static LOGICAL: std::sync::OnceLock<Option<u16>> = std::sync::OnceLock::new();

/// The logical device count, fixed when a device is first listed or opened. A later change
/// would name servers that never open. `None` means one device.
pub fn logical_devices() -> Option<u16> {
    *LOGICAL.get_or_init(|| {
        std::env::var(LOGICAL_DEVICES_VAR)
            .ok()
            .and_then(|n| n.trim().parse::<u16>().ok())
            .filter(|&n| n > 0)
    })
}

/// Split the adapter into `count` logical devices, as `SCOPE_LOGICAL_DEVICES` would, before
/// the count is first read.
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
