//! Which language a server takes, and the device cubecl is told it compiles for.
//!
//! A definition is specialised for one target. Its properties are plain (32-bit addressing,
//! `u32`, `i32`, `f32`, `bool`): what the servers promise on every device.

use std::sync::Arc;

use cubecl_core::ir::features::{Features, TypeUsage};
use cubecl_core::ir::{
    DeviceIdentity, DeviceProperties, ElemType, FloatKind, HardwareProperties, IntKind,
    MemoryDeviceProperties, UIntKind, VectorSize,
};
use cubecl_core::prelude::{AddressType, CubeDim, ExecutionMode, KernelSettings, TargetProperties};
use cubecl_core::profile::TimingMethod;
use cubecl_core::{VulkanCompilationOptions, WgpuCompilationOptions};
use scope_core::{Backend, BackendKind, DeviceLimits, Language};

/// The language a kernel is translated into, one per kind of server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// CUDA C++, for `server-cuda` (NVRTC).
    Cuda,
    /// HIP C++, for `server-hip` (hiprtc); wavefronts of 64.
    Hip,
    /// SPIR-V with buffer device addresses, for `server-vulkan`.
    SpirV,
    /// WGSL, for `server-wgpu` (and `server-vulkan` through naga).
    Wgsl,
}

/// Register the types every server computes with on every device, for every use.
pub fn register_portable_types(properties: &mut DeviceProperties) {
    properties.register_address_type(AddressType::U32);
    for ty in [
        ElemType::Index,
        ElemType::UInt(UIntKind::U32),
        ElemType::Int(IntKind::I32),
        ElemType::Float(FloatKind::F32),
        ElemType::Float(FloatKind::Flex32),
        ElemType::Bool,
    ] {
        properties.register_type_usage(ty, TypeUsage::all());
    }
}

/// Push-constant bytes for buffer addresses: the Vulkan minimum, so every device takes it.
pub(crate) const PUSH_CONSTANT_BYTES: usize = 128;

impl Target {
    /// Every target.
    pub const ALL: [Target; 4] = [Target::Cuda, Target::Hip, Target::SpirV, Target::Wgsl];

    /// The language a server of `kind` takes by default.
    pub const fn for_kind(kind: BackendKind) -> Target {
        match kind {
            BackendKind::Cuda => Target::Cuda,
            BackendKind::Hip => Target::Hip,
            BackendKind::Vulkan => Target::SpirV,
            BackendKind::Wgpu => Target::Wgsl,
        }
    }

    /// The target for backend `B`, by its [`Backend::KIND`]; `None` for the host server.
    pub const fn of<B: Backend>() -> Option<Target> {
        match B::KIND.server() {
            Some(kind) => Some(Self::for_kind(kind)),
            None => None,
        }
    }

    /// The scope language of the source it produces.
    pub fn language(self) -> Language {
        match self {
            Target::Cuda => Language::Cuda,
            Target::Hip => Language::Hip,
            Target::SpirV => Language::SpirV,
            Target::Wgsl => Language::Wgsl,
        }
    }

    /// The backend that takes this language, named in errors.
    pub const fn kind(self) -> BackendKind {
        match self {
            Target::Cuda => BackendKind::Cuda,
            Target::Hip => BackendKind::Hip,
            Target::SpirV => BackendKind::Vulkan,
            Target::Wgsl => BackendKind::Wgpu,
        }
    }

    /// The plane (warp, wavefront, subgroup) size kernels are specialised for.
    pub fn plane_size(self) -> u32 {
        match self {
            Target::Hip => 64,
            _ => 32,
        }
    }

    /// Settings for a bounds-checked, 32-bit definition with cubes of `cube_dim`.
    pub fn settings(self, cube_dim: [u32; 3]) -> KernelSettings {
        let [x, y, z] = cube_dim;
        KernelSettings::new(
            *CubeDim::new_3d(x, y, z),
            ExecutionMode::Checked,
            AddressType::U32,
        )
    }

    /// The device a definition for this target is expanded against.
    pub fn device_properties(self) -> Arc<DeviceProperties> {
        let plane = self.plane_size();
        let hardware = HardwareProperties {
            load_width: 128,
            vector_register_count: None,
            plane_size_min: plane,
            plane_size_max: plane,
            max_bindings: 32,
            max_shared_memory_size: 16 << 10,
            max_cube_count: (
                u32::from(u16::MAX),
                u32::from(u16::MAX),
                u32::from(u16::MAX),
            ),
            max_units_per_cube: 256,
            max_cube_dim: (256, 256, 64),
            num_streaming_multiprocessors: None,
            num_tensor_cores: None,
            min_tensor_cores_dim: None,
            num_cpu_cores: None,
            last_level_cache_size: None,
            max_vector_size: VectorSize::MAX,
            cube_mma_reserved_shared_memory: 0,
        };
        let mut properties = DeviceProperties::new(
            Features::default(),
            MemoryDeviceProperties::new(u64::MAX, 256),
            hardware,
            TimingMethod::Device,
            DeviceIdentity {
                name: format!("scope {self:?}"),
                fingerprint: format!("scope-cube {self:?}"),
                physical: None,
            },
        );
        register_portable_types(&mut properties);
        Arc::new(properties)
    }

    /// The target-specific compile-time properties (none that scope uses).
    pub fn target_properties(self) -> Arc<TargetProperties> {
        Arc::new(TargetProperties::default())
    }

    /// Options for the WGSL and SPIR-V compilers.
    pub(crate) fn wgpu_options(self, translation: &Translation) -> WgpuCompilationOptions {
        WgpuCompilationOptions {
            supports_u64: translation.supports_u64,
            supports_vulkan_compiler: self == Target::SpirV,
            supports_msl_compiler: false,
            vulkan: VulkanCompilationOptions {
                // The server needs Vulkan 1.2, whose SPIR-V is 1.5.
                max_spirv_version: (1, 5),
                max_vector_size: translation.max_vector_size,
                push_constant_size: translation.push_constant_bytes,
                ..Default::default()
            },
        }
    }

    /// C++ compiler options: `grid_constants` passes the info struct by value, as the blob.
    pub(crate) fn cpp_options(self) -> cubecl_cpp::shared::CompilationOptions {
        let mut options = cubecl_cpp::shared::CompilationOptions {
            warp_size: self.plane_size() as usize,
            ..Default::default()
        };
        options.supports_features.grid_constants = true;
        options
    }
}

/// Compile options from the server's [`DeviceLimits`], so a kernel uses only what it enabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Translation {
    /// Whether the kernel may use 64-bit integers (WGSL, SPIR-V).
    pub supports_u64: bool,
    /// The widest vector the compilers may emit.
    pub max_vector_size: usize,
    /// Push-constant bytes for SPIR-V buffer addresses; more go in a uniform table.
    pub push_constant_bytes: usize,
}

impl Default for Translation {
    /// What every device takes: no 64-bit integers, vectors of four, 128 push-constant bytes.
    fn default() -> Self {
        Self {
            supports_u64: false,
            max_vector_size: 4,
            push_constant_bytes: PUSH_CONSTANT_BYTES,
        }
    }
}

impl Translation {
    /// The options a server's device takes, from its reported limits.
    pub fn for_device(limits: &DeviceLimits) -> Self {
        Self {
            supports_u64: limits.launch.features.i64,
            ..Self::default()
        }
    }
}
