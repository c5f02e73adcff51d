//! The backends, listed once; xtask reads this `core`-only file by `#[path]`.

use core::fmt;

macro_rules! backends {
    ($($(#[$doc:meta])* $variant:ident,)*) => {
        /// A scope server: one `crates/server-*` crate.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum BackendKind {
            $($(#[$doc])* $variant,)*
        }

        impl BackendKind {
            /// Every backend, made from the enum's own list, in the demo's order.
            pub const ALL: &'static [BackendKind] = &[$(Self::$variant),*];
        }
    };
}

backends! {
    /// `server-cuda`: NVIDIA GPUs through the CUDA driver API.
    Cuda,
    /// `server-hip`: AMD GPUs through HIP.
    Hip,
    /// `server-vulkan`: any Vulkan 1.2 device, lavapipe included.
    Vulkan,
    /// `server-wgpu`: whatever API wgpu finds (Vulkan, GL, Metal, DX12).
    Wgpu,
}

/// The driver API a backend reaches its devices through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drivers {
    /// Its vendor's own API; a probe lists hardware only.
    Vendor,
    /// Vulkan drivers, lavapipe included.
    Vulkan,
    /// Any the platform has; the probe's detail starts with its name.
    Portable,
}

impl BackendKind {
    /// Its name: what its server prints, `--backend`, the matrix's rows.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Cuda => "cuda",
            Self::Hip => "hip",
            Self::Vulkan => "vulkan",
            Self::Wgpu => "wgpu",
        }
    }

    /// The backend called `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|kind| kind.name() == name)
    }

    /// Its server crate.
    pub const fn server_crate(self) -> &'static str {
        match self {
            Self::Cuda => "server-cuda",
            Self::Hip => "server-hip",
            Self::Vulkan => "server-vulkan",
            Self::Wgpu => "server-wgpu",
        }
    }

    /// The cargo feature that links its server into tiny-runtime, scope-cubecl.
    pub const fn feature(self) -> &'static str {
        self.name()
    }

    /// The driver API its devices are reached through.
    pub const fn drivers(self) -> Drivers {
        match self {
            Self::Cuda | Self::Hip => Drivers::Vendor,
            Self::Vulkan => Drivers::Vulkan,
            Self::Wgpu => Drivers::Portable,
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a `Backend` is, as wgpu-hal's `Api::VARIANT`; not `BackendKind`, whose rows are servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A server crate.
    Server(BackendKind),
    /// The reference host server of the test kit.
    Host,
    /// The core's null backend.
    Null,
}

impl Kind {
    /// The name it prints: its server's, `host` or `null`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Server(kind) => kind.name(),
            Self::Host => "host",
            Self::Null => "null",
        }
    }

    /// Its server, if it is one.
    pub const fn server(self) -> Option<BackendKind> {
        match self {
            Self::Server(kind) => Some(kind),
            Self::Host | Self::Null => None,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::{BackendKind, Kind};

    #[test]
    fn every_backend_is_listed_once_under_its_own_name() {
        for (i, &kind) in BackendKind::ALL.iter().enumerate() {
            assert!(!BackendKind::ALL[..i].contains(&kind), "{kind} twice");
            assert_eq!(BackendKind::from_name(kind.name()), Some(kind));
            let server = kind.server_crate().strip_prefix("server-");
            assert_eq!(server, Some(kind.name()));
            assert_eq!(Kind::Server(kind).name(), kind.name());
        }
        assert_eq!(BackendKind::from_name(Kind::Host.name()), None);
        assert_eq!(BackendKind::from_name(Kind::Null.name()), None);
        assert_eq!(BackendKind::from_name("Vulkan"), None);
    }
}
