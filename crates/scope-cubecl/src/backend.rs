//! Which scope servers can sit under a [`ScopeRuntime`](crate::ScopeRuntime),
//! and how each is opened.
//!
//! One small trait over [`scope_core::Backend`] rather than a parameter per
//! server: the adapter is written once, generic over it. A server joins by
//! naming its row of [`BackendKind`] (which gives its language), how to
//! open it and how to find its devices. Everything else — failures,
//! ordering, memory — is already the same on every server, because the
//! contract is.

use scope_core::{Backend, BackendKind, Client, Probe, Result};
use scope_cube::Target;

use crate::device::ScopeDevice;

/// A scope server a cubecl runtime can run on.
pub trait CubeBackend: Backend + Sized {
    /// Its row of scope-core's table of backends.
    const KIND: BackendKind;

    /// The runtime's name, as cubecl reports it ("scope-vulkan").
    const RUNTIME_NAME: &'static str;

    /// The language cubecl's kernels are compiled into for this server:
    /// the table's, unless the server says otherwise.
    fn target() -> Target {
        Target::for_kind(Self::KIND)
    }

    /// Open a server on `device`.
    ///
    /// # Errors
    ///
    /// [`scope_core::Error::BackendUnavailable`] when there is no such device.
    fn open(device: &ScopeDevice) -> Result<Client<Self>>;

    /// The devices there are, without opening one; never panics.
    fn probe() -> Probe;

    /// How many devices [`open`](Self::open) numbers (without a logical
    /// split): every GPU for CUDA and HIP, every usable physical device
    /// for Vulkan, every usable adapter for wgpu.
    fn device_count() -> u16;

    /// Whether `SCOPE_LOGICAL_DEVICES` splits this server's one device into
    /// several ([`crate::logical_devices`]). CUDA and HIP number their real
    /// devices instead.
    const SPLITS: bool = true;
}

/// Which device wgpu and Vulkan open for `device`: under
/// `SCOPE_LOGICAL_DEVICES=N` ([`logical_devices`](crate::logical_devices))
/// indices `0..N` each open a server of their own on the one device the
/// environment chooses (`None`: that one), and another index does not
/// exist; without it, index `i` is the server's device `i` (device 0 being
/// the one the environment chooses).
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

/// The options wgpu's devices are numbered under: the environment's, on one
/// API — the one it names, or else the API of the adapter device 0 is.
/// Devices of one runtime share an API: what a kernel may use differs
/// between Vulkan and GL, and a group of a lavapipe-Vulkan and an
/// llvmpipe-GL device failed cubecl's
/// `test_a_group_without_the_first_device_gathers` with a WGSL validation
/// error on the GL device (why exactly was not pinned down).
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
    /// cubecl reads a name starting with "wgpu" as WGSL's float rules,
    /// which let the shader compiler fold NaN, infinity and the sign of
    /// zero (its IEEE test relaxes on it); scope's wgpu server runs WGSL.
    const RUNTIME_NAME: &'static str = "wgpu<scope>";
    const KIND: BackendKind = BackendKind::Wgpu;

    /// Adapter `index` of those `SCOPE_WGPU_BACKEND` and
    /// `SCOPE_WGPU_ADAPTER` allow (device 0: the one they choose) — or,
    /// under `SCOPE_LOGICAL_DEVICES`, a new wgpu device on that one adapter
    /// per index.
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
}

#[cfg(feature = "vulkan")]
impl CubeBackend for server_vulkan::Vulkan {
    const RUNTIME_NAME: &'static str = "scope-vulkan";
    const KIND: BackendKind = BackendKind::Vulkan;

    /// SPIR-V by device address (cubecl's own Vulkan path) when
    /// `SCOPE_CUBECL_VULKAN=spirv`; WGSL through naga otherwise.
    fn target() -> Target {
        match std::env::var("SCOPE_CUBECL_VULKAN").as_deref() {
            Ok("spirv") => Target::SpirV,
            _ => Target::Wgsl,
        }
    }

    /// Device `index` of the server's (device 0: the one
    /// `SCOPE_VULKAN_DEVICE` chooses), under the validation layer when
    /// `SCOPE_VULKAN_VALIDATION=1` — or, under `SCOPE_LOGICAL_DEVICES`, a
    /// new server on device 0 per index.
    fn open(device: &ScopeDevice) -> Result<Client<Self>> {
        match logical_or_real(device, Self::NAME)? {
            Some(index) => server_vulkan::client_on(index),
            None => server_vulkan::client(),
        }
    }

    fn device_count() -> u16 {
        u16::try_from(server_vulkan::device_count()).unwrap_or(u16::MAX)
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
    const KIND: BackendKind = BackendKind::Cuda;
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
}

#[cfg(feature = "hip")]
impl CubeBackend for server_hip::Hip {
    const RUNTIME_NAME: &'static str = "scope-hip";
    const KIND: BackendKind = BackendKind::Hip;
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
        assert_eq!(B::KIND, kind);
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
