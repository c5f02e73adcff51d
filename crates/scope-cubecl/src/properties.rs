//! What cubecl is told about the device: the scope server's own limits.
//!
//! cubecl kernels specialise on these values, so they must be what the *scope server*
//! enforces ([`scope_core::Client::limits`]). A property that promised more would pick a
//! kernel the server then refuses; one that promised less only costs speed.

use cubecl_common::profile::TimingMethod;
use cubecl_core::ir::features::{AtomicUsage, Plane, TypeUsage};
use cubecl_core::ir::{
    DeviceIdentity, DeviceProperties, ElemType, FloatKind, HardwareProperties, IntKind,
    MemoryDeviceProperties, Type, UIntKind,
};
use scope_core::DeviceLimits;
use scope_cube::{Target, register_portable_types};

/// The device properties a server with `limits` offers cubecl.
pub(crate) fn device_properties(
    limits: &DeviceLimits,
    target: Target,
    runtime: &str,
    device: &str,
) -> DeviceProperties {
    let launch = &limits.launch;
    // The plane size is the device's own: kernel libraries size their cubes by it.
    let (plane_min, plane_max) = launch
        .subgroup_size
        .or(launch.native_width)
        .unwrap_or((target.plane_size(), target.plane_size()));
    let [gx, gy, gz] = launch.max_workgroups;
    let [dx, dy, dz] = launch.max_workgroup_size;
    let hardware = HardwareProperties {
        load_width: 128,
        vector_register_count: None,
        plane_size_min: plane_min,
        plane_size_max: plane_max,
        // One binding is the info struct.
        max_bindings: launch.max_bindings.saturating_sub(1),
        max_shared_memory_size: launch.max_workgroup_memory as usize,
        max_cube_count: (gx, gy, gz),
        max_units_per_cube: launch.max_invocations,
        max_cube_dim: (dx, dy, dz),
        num_streaming_multiprocessors: None,
        num_tensor_cores: None,
        min_tensor_cores_dim: None,
        num_cpu_cores: None,
        last_level_cache_size: None,
        max_vector_size: 4,
        cube_mma_reserved_shared_memory: 0,
    };
    let memory = MemoryDeviceProperties::new(
        limits.max_allocation.min(launch.max_binding_size),
        limits.binding_alignment,
    );
    let mut properties = DeviceProperties::new(
        Default::default(),
        memory,
        hardware,
        // No device timestamps; a failed window is never timed (rule 39).
        TimingMethod::System,
        DeviceIdentity {
            name: device.to_owned(),
            fingerprint: format!("{runtime}-{device}"),
            physical: None,
        },
    );
    register_portable_types(&mut properties);
    if target == Target::Wgsl {
        // cubecl's WGSL compiler converts these in software, four to a word.
        for ty in [FloatKind::E4M3, FloatKind::E5M2, FloatKind::UE8M0] {
            properties.register_type_usage(ElemType::Float(ty), TypeUsage::Conversion);
        }
    }
    // Every server language has all 32-bit integer atomics, in device and workgroup memory.
    let integer_atomics = AtomicUsage::LoadStore
        | AtomicUsage::Exchange
        | AtomicUsage::Add
        | AtomicUsage::MinMax
        | AtomicUsage::Bitwise
        | AtomicUsage::CompareExchange;
    for ty in [ElemType::Int(IntKind::I32), ElemType::UInt(UIntKind::U32)] {
        properties.register_atomic_type_usage(Type::atomic(ty), integer_atomics);
        properties.register_shared_atomic_type_usage(Type::atomic(ty), integer_atomics);
    }
    let features = &launch.features;
    if features.f16 {
        properties.register_type_usage(ElemType::Float(FloatKind::F16), TypeUsage::all());
    }
    if features.f32_atomic_add {
        // Device memory only: no server promises float atomics in workgroup memory.
        let f32_atomic = Type::atomic(ElemType::Float(FloatKind::F32));
        properties.register_atomic_type_usage(
            f32_atomic,
            AtomicUsage::LoadStore | AtomicUsage::Exchange | AtomicUsage::Add,
        );
    }
    if features.subgroups && plane_min >= CUBECL_PLANE_FLOOR {
        // Ops only: WGSL promises no plane barriers (`Plane::Sync`).
        properties.features.plane.insert(Plane::Ops);
    }
    properties
}

/// The narrowest plane offered cubecl's plane operations. cubecl's plane tests expect one
/// cube of 32 units to be one plane. On lavapipe's 8 lanes, 26 of them fail.
const CUBECL_PLANE_FLOOR: u32 = 32;
