//! How to open the device. The instance reads it as well as the device, so it sits below
//! both, and the instance never names the module that owns it.

/// How to open the device.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Enable `VK_LAYER_KHRONOS_validation` and collect what it says. Where the layer is
    /// missing the device opens without it, except where CI requires it: then opening is
    /// [`Error::Refused`](scope_core::Error::Refused)
    /// ([`VALIDATION_LAYER_MISSING`](super::instance::VALIDATION_LAYER_MISSING)).
    pub validation: bool,
    /// Panic when the backend drops with validation messages unread. For tests.
    pub fail_on_validation: bool,
    /// Treat device memory as not host-visible, taking a discrete GPU's staging path. For tests.
    pub force_staging: bool,
    /// Which device to open, of `0..`[`device_count`](super::choice::device_count); `None` is device 0,
    /// the best by kind.
    pub device: Option<usize>,
}
