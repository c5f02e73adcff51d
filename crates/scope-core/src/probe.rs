//! What a server finds on this machine, for `cargo xtask matrix`. A probe
//! never panics: a missing driver is an answer, not a crash.

use std::fmt;

mod kind;

pub use kind::{BackendKind, Drivers, Kind};

/// Whether `SCOPE_REQUIRE` (a comma-separated list, or `all`) names `backend`,
/// so a missing device fails rather than skips; every test crate asks this.
pub fn required(backend: &str) -> bool {
    std::env::var("SCOPE_REQUIRE").is_ok_and(|v| names(&v, backend))
}

fn names(value: &str, backend: &str) -> bool {
    value
        .split(',')
        .map(str::trim)
        .any(|b| b.eq_ignore_ascii_case(backend) || b.eq_ignore_ascii_case("all"))
}

#[cfg(test)]
mod tests {
    use super::names;

    #[test]
    fn scope_require_is_a_list_or_all_in_any_case() {
        assert!(names("vulkan", "vulkan"));
        assert!(names("wgpu, Vulkan", "vulkan"));
        assert!(names("all", "cuda"));
        assert!(names("ALL", "hip"));
        assert!(!names("", "vulkan"));
        assert!(!names("vulkan-gl", "vulkan"));
        assert!(!names("wgpu", "vulkan"));
    }
}

/// Whether a device is real hardware or a software implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// A GPU.
    Hardware,
    /// A CPU implementation (lavapipe, llvmpipe, the host server).
    Software,
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Hardware => "hardware",
            DeviceKind::Software => "software",
        })
    }
}

/// One device a probe found.
#[derive(Clone, Debug)]
pub struct ProbedDevice {
    /// Its name.
    pub name: String,
    /// Hardware or software.
    pub kind: DeviceKind,
    /// Anything else worth a column: compute capability, API, driver.
    pub detail: String,
}

/// What one backend found.
#[derive(Clone, Debug)]
pub struct Probe {
    /// The backend.
    pub backend: &'static str,
    /// The devices found; empty when none.
    pub devices: Vec<ProbedDevice>,
    /// Why there are none, when there are none.
    pub why_not: Option<String>,
}

impl Probe {
    /// A probe that found `devices`.
    pub fn found(backend: &'static str, devices: Vec<ProbedDevice>) -> Self {
        let why_not = devices.is_empty().then(|| "no device found".to_owned());
        Self {
            backend,
            devices,
            why_not,
        }
    }

    /// A probe that found nothing, and why.
    pub fn none(backend: &'static str, why: impl Into<String>) -> Self {
        Self {
            backend,
            devices: Vec::new(),
            why_not: Some(why.into()),
        }
    }

    /// Whether any device was found.
    pub fn has_device(&self) -> bool {
        !self.devices.is_empty()
    }
}
