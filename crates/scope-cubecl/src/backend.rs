//! Which scope servers can sit under a [`ScopeRuntime`](crate::ScopeRuntime),
//! and how each is opened.
//!
//! One small trait over [`scope_core::Backend`] rather than a parameter per
//! server: the adapter is written once, generic over it, and a server joins
//! by saying how to open it, how to find its devices, and which cubecl
//! compiler speaks its language. Everything else — failures, ordering,
//! memory — is already the same on every server, because the contract is.

use scope_core::{Backend, Client, Probe, Result};
use scope_cube::Target;

use crate::device::ScopeDevice;

/// A scope server a cubecl runtime can run on.
pub trait CubeBackend: Backend + Sized {
    /// The runtime's name, as cubecl reports it ("scope-vulkan").
    const RUNTIME_NAME: &'static str;

    /// The language cubecl's kernels are compiled into for this server.
    fn target() -> Target;

    /// Open a server on `device`.
    ///
    /// # Errors
    ///
    /// [`scope_core::Error::BackendUnavailable`] when there is no such device.
    fn open(device: &ScopeDevice) -> Result<Client<Self>>;

    /// The devices there are, without opening one; never panics.
    fn probe() -> Probe;

    /// Whether `SCOPE_LOGICAL_DEVICES` splits this server's one device into
    /// several ([`crate::logical_devices`]). CUDA and HIP number their real
    /// devices instead.
    const SPLITS: bool = true;
}

/// wgpu and Vulkan open the one device their environment chooses, as index
/// 0: another index is a device that does not exist, not a second server
/// on the same one — unless `SCOPE_LOGICAL_DEVICES=N`
/// ([`logical_devices`](crate::logical_devices)) splits the adapter, when
/// indices `0..N` each open a server of their own on it.
#[cfg(any(feature = "wgpu", feature = "vulkan"))]
fn only_the_chosen_one(device: &ScopeDevice, backend: &'static str) -> Result<()> {
    let count = crate::device::logical_devices().unwrap_or(1);
    if device.index < count {
        return Ok(());
    }
    Err(scope_core::Error::BackendUnavailable {
        backend,
        reason: format!(
            "device {} does not exist: the {backend} server opens the one device its environment \
             chooses, as device 0, or {} devices on it under {}={count}",
            device.index,
            count,
            crate::device::LOGICAL_DEVICES_VAR,
        ),
    })
}

#[cfg(feature = "wgpu")]
impl CubeBackend for server_wgpu::Wgpu {
    /// cubecl reads a name starting with "wgpu" as WGSL's float rules,
    /// which let the shader compiler fold NaN, infinity and the sign of
    /// zero (its IEEE test relaxes on it); scope's wgpu server runs WGSL.
    const RUNTIME_NAME: &'static str = "wgpu<scope>";

    fn target() -> Target {
        Target::Wgsl
    }

    /// The adapter `SCOPE_WGPU_BACKEND` and `SCOPE_WGPU_ADAPTER` choose:
    /// device 0, the only one `enumerate_devices` lists — or, under
    /// `SCOPE_LOGICAL_DEVICES`, a new wgpu device on that adapter per index.
    fn open(device: &ScopeDevice) -> Result<Client<Self>> {
        only_the_chosen_one(device, Self::NAME)?;
        server_wgpu::client()
    }

    fn probe() -> Probe {
        server_wgpu::probe()
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

    /// The device `SCOPE_VULKAN_DEVICE` chooses, under the validation layer
    /// when `SCOPE_VULKAN_VALIDATION=1`: device 0, the only one
    /// `enumerate_devices` lists.
    fn open(device: &ScopeDevice) -> Result<Client<Self>> {
        only_the_chosen_one(device, Self::NAME)?;
        server_vulkan::client()
    }

    /// The devices `open` can open. With `SCOPE_VULKAN_VALIDATION=1` that
    /// is a device under the validation layer: where the layer is not
    /// installed there is none, so that tests promising validation skip
    /// rather than pass without it — unless CI or `SCOPE_REQUIRE` make the
    /// layer a requirement, where the device is listed and opening it is
    /// refused, naming the layer (`server_vulkan::Config::validation`).
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
}

#[cfg(feature = "cuda")]
impl CubeBackend for server_cuda::Cuda {
    const RUNTIME_NAME: &'static str = "scope-cuda";
    const SPLITS: bool = false;

    fn target() -> Target {
        Target::Cuda
    }

    fn open(device: &ScopeDevice) -> Result<Client<Self>> {
        server_cuda::client_on(usize::from(device.index))
    }

    fn probe() -> Probe {
        server_cuda::probe()
    }
}

#[cfg(feature = "hip")]
impl CubeBackend for server_hip::Hip {
    const RUNTIME_NAME: &'static str = "scope-hip";
    const SPLITS: bool = false;

    fn target() -> Target {
        Target::Hip
    }

    fn open(device: &ScopeDevice) -> Result<Client<Self>> {
        server_hip::client_on(usize::from(device.index))
    }

    fn probe() -> Probe {
        server_hip::probe()
    }
}
