//! Which scope servers can sit under a [`ScopeRuntime`](crate::ScopeRuntime), and how each
//! is opened.
//!
//! One small trait over [`scope_core::Backend`], so the adapter is written once. A server
//! joins by naming how to open it and how to find its devices. The rest
//! is the same on every server, because the contract is.

use scope_core::{Backend, BackendKind, Client, Probe, Result};
use scope_cube::Target;

use crate::device::ScopeDevice;
use crate::peers::Peers;

/// A scope server a cubecl runtime can run on.
pub trait CubeBackend: Backend + Sized {
    /// Its row of scope-core's table: its [`Backend::KIND`], which must be a server's.
    const SERVER: BackendKind = match <Self as Backend>::KIND.server() {
        Some(kind) => kind,
        None => panic!("a cubecl runtime runs on a server of the table"),
    };

    /// The runtime's name, as cubecl reports it ("scope-vulkan").
    const RUNTIME_NAME: &'static str;

    /// The language cubecl's kernels are compiled into for this server.
    fn target() -> Target {
        Target::for_kind(Self::SERVER)
    }

    /// Open a server on `device`.
    ///
    /// # Errors
    ///
    /// [`scope_core::Error::BackendUnavailable`] when there is no such device.
    fn open(device: &ScopeDevice) -> Result<Client<Self>>;

    /// The devices there are, without opening one; never panics.
    fn probe() -> Probe;

    /// How many devices [`open`](Self::open) numbers, without a logical split.
    fn device_count() -> u16;

    /// Whether `SCOPE_LOGICAL_DEVICES` splits this server's device ([`crate::logical_devices`]).
    const SPLITS: bool = true;

    /// The clients and groups this backend's servers share. Rust has no generic statics, so
    /// each impl keeps a typed table in a `static` of its own.
    fn peers() -> &'static Peers<Self>;
}

/// Which device wgpu and Vulkan open for `device`. Under a logical split, `None` (the
/// environment's device) or an error past `N`. Otherwise index `i` is the server's device `i`.
#[cfg(any(feature = "wgpu", feature = "vulkan"))]
fn logical_or_real(device: &ScopeDevice, backend: &'static str) -> Result<Option<usize>> {
    let Some(count) = crate::device::logical_devices() else {
        return Ok(Some(usize::from(device.index)));
    };
    if device.index < count {
        return Ok(None);
    }
    Err(scope_core::Error::BackendUnavailable {
        backend,
        reason: format!(
            "device {} does not exist: {}={count} splits the {backend} server's one device into \
             {count}",
            device.index,
            crate::device::LOGICAL_DEVICES_VAR,
        ),
    })
}

/// The environment's wgpu options, on one API: the one named, or else device 0's. What a
/// kernel may use differs between Vulkan and GL, so one runtime's devices share an API.
#[cfg(feature = "wgpu")]
fn one_api() -> Result<server_wgpu::Options> {
    let mut options = server_wgpu::Options::from_env()?;
    if options.api.is_none() {
        options.api = server_wgpu::first_api(&options);
    }
    Ok(options)
}

#[cfg(feature = "wgpu")]
impl CubeBackend for server_wgpu::Wgpu {
    /// A name starting with "wgpu" tells cubecl's tests WGSL may fold NaN and signed zero.
    const RUNTIME_NAME: &'static str = "wgpu<scope>";

    /// Adapter `index` of those the environment allows, or one new device per logical index.
    fn open(device: &ScopeDevice) -> Result<Client<Self>> {
        let options = server_wgpu::Options {
            index: logical_or_real(device, Self::NAME)?,
            ..one_api()?
        };
        server_wgpu::client_with(&options)
    }

    fn probe() -> Probe {
        server_wgpu::probe()
    }

    fn device_count() -> u16 {
        one_api().map_or(0, |options| {
            u16::try_from(server_wgpu::adapter_count(&options)).unwrap_or(u16::MAX)
        })
    }

    fn peers() -> &'static Peers<Self> {
        static PEERS: std::sync::LazyLock<Peers<server_wgpu::Wgpu>> =
            std::sync::LazyLock::new(Peers::default);
        &PEERS
    }
}

#[cfg(feature = "vulkan")]
impl CubeBackend for server_vulkan::Vulkan {
    const RUNTIME_NAME: &'static str = "scope-vulkan";

    /// SPIR-V by device address (cubecl's own Vulkan path) when
    /// `SCOPE_CUBECL_VULKAN=spirv`; WGSL through naga otherwise.
    fn target() -> Target {
        match std::env::var("SCOPE_CUBECL_VULKAN").as_deref() {
            Ok("spirv") => Target::SpirV,
            _ => Target::Wgsl,
        }
    }

    /// Device `index` of the server's, or one new server on device 0 per logical index.
    fn open(device: &ScopeDevice) -> Result<Client<Self>> {
        match logical_or_real(device, Self::NAME)? {
            Some(index) => server_vulkan::client_on(index),
            None => server_vulkan::client(),
        }
    }

    fn device_count() -> u16 {
        u16::try_from(server_vulkan::device_count()).unwrap_or(u16::MAX)
    }

    /// The devices `open` can open. Asked for validation without the layer, there is none, so
    /// tests promising validation skip. Where the layer is required, opening is refused.
    fn probe() -> Probe {
        let probe = server_vulkan::probe();
        if probe.has_device()
            && server_vulkan::validation_from_env()
            && server_vulkan::validation_required_by().is_none()
            && !server_vulkan::validation_layer_installed()
        {
            return Probe::none(Self::NAME, server_vulkan::VALIDATION_LAYER_MISSING);
        }
        probe
    }

    fn peers() -> &'static Peers<Self> {
        static PEERS: std::sync::LazyLock<Peers<server_vulkan::Vulkan>> =
            std::sync::LazyLock::new(Peers::default);
        &PEERS
    }
}

#[cfg(feature = "cuda")]
impl CubeBackend for server_cuda::Cuda {
    const RUNTIME_NAME: &'static str = "scope-cuda";
    const SPLITS: bool = false;

    fn open(device: &ScopeDevice) -> Result<Client<Self>> {
        server_cuda::client_on(usize::from(device.index))
    }

    fn probe() -> Probe {
        server_cuda::probe()
    }

    fn device_count() -> u16 {
        u16::try_from(server_cuda::probe().devices.len()).unwrap_or(u16::MAX)
    }

    fn peers() -> &'static Peers<Self> {
        static PEERS: std::sync::LazyLock<Peers<server_cuda::Cuda>> =
            std::sync::LazyLock::new(Peers::default);
        &PEERS
    }
}

#[cfg(feature = "hip")]
impl CubeBackend for server_hip::Hip {
    const RUNTIME_NAME: &'static str = "scope-hip";
    const SPLITS: bool = false;

    fn open(device: &ScopeDevice) -> Result<Client<Self>> {
        server_hip::client_on(usize::from(device.index))
    }

    fn probe() -> Probe {
        server_hip::probe()
    }

    fn device_count() -> u16 {
        u16::try_from(server_hip::probe().devices.len()).unwrap_or(u16::MAX)
    }

    fn peers() -> &'static Peers<Self> {
        static PEERS: std::sync::LazyLock<Peers<server_hip::Hip>> =
            std::sync::LazyLock::new(Peers::default);
        &PEERS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg_attr(
        not(any(
            feature = "cuda",
            feature = "hip",
            feature = "vulkan",
            feature = "wgpu"
        )),
        allow(dead_code)
    )]
    fn agrees<B: CubeBackend>(kind: BackendKind) {
        assert_eq!(B::SERVER, kind);
        assert_eq!(B::NAME, kind.name());
    }

    /// A backend added to the table does not build here until it has an arm.
    #[test]
    fn each_linked_server_is_its_row_of_the_table() {
        for &kind in BackendKind::ALL {
            match kind {
                BackendKind::Cuda => {
                    #[cfg(feature = "cuda")]
                    agrees::<server_cuda::Cuda>(kind);
                }
                BackendKind::Hip => {
                    #[cfg(feature = "hip")]
                    agrees::<server_hip::Hip>(kind);
                }
                BackendKind::Vulkan => {
                    #[cfg(feature = "vulkan")]
                    agrees::<server_vulkan::Vulkan>(kind);
                }
                BackendKind::Wgpu => {
                    #[cfg(feature = "wgpu")]
                    agrees::<server_wgpu::Wgpu>(kind);
                }
            }
        }
    }
}
