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
