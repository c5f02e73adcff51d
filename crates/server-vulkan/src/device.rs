//! The instance, the chosen physical device, the logical device and its queue.
//!
//! The core drops a server's parts in an order it chooses, yet everything Vulkan hands out
//! must go before the device. So the device lives in one [`Gpu`] behind an `Arc`, and every
//! object needing it to destroy itself holds a clone. The instance and physical device live
//! in an [`Adapter`], so a recovery opens a new device with [`Gpu::open`] on the same one.
//!
//! A device qualifies with Vulkan 1.2, timeline semaphores, `VK_KHR_push_descriptor` and a
//! compute queue. Timelines carry the streams; pushed descriptors let a recorded buffer replay
//! with no descriptor set to keep alive. Choice is `choice.rs`, the instance `instance.rs`,
//! the caller's [`Config`] `config.rs`, and the lock behind [`Gpu::vk`] `lifecycle.rs`. The
//! children name each other and never this file, which gathers them into the device.

use std::ffi::CStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ash::vk;
use scope_core::Result;

use crate::error::unavailable;

mod choice;
mod config;
mod instance;
mod lifecycle;

pub use choice::device_count;
pub(crate) use choice::probe;
use choice::{candidates, choose, kind_name};
pub use config::Config;
use instance::Instance;
pub use instance::{VALIDATION_LAYER_MISSING, validation_layer_installed, validation_required_by};
use lifecycle::one_at_a_time;
pub(crate) use lifecycle::{Guarded, calling};

/// The limits and memory facts the rest of the backend consults.
#[derive(Clone, Debug)]
pub(crate) struct Limits {
    pub min_storage_offset: u64,
    pub max_storage_range: u64,
    /// Where a device-address kernel's table of addresses may be staged, and its size.
    pub min_uniform_offset: u64,
    pub max_uniform_range: u64,
    pub max_memory_allocation: u64,
    pub max_buffer_size: u64,
    pub max_groups: [u32; 3],
    /// What a kernel may declare; a pipeline past them is undefined, so it does not compile.
    pub max_workgroup_size: [u32; 3],
    pub max_invocations: u32,
    pub max_workgroup_memory: u32,
    /// `subgroupSize`, 0 where unknown; SPIR-V below 1.6 runs in subgroups of this size.
    pub subgroup_width: u32,
    /// Where and which subgroup operations the device runs.
    pub subgroup_stages: vk::ShaderStageFlags,
    pub subgroup_operations: vk::SubgroupFeatureFlags,
    pub max_push_constants: u32,
    /// The least of `maxPushDescriptors` and the per-stage and per-set storage buffer limits.
    pub max_bindings: u32,
    /// The memory type pooled allocations come from, and its heap's size.
    pub device_type: u32,
    pub device_heap: u64,
    /// Whether that type can be mapped (unified memory, or lavapipe).
    pub device_mappable: bool,
    pub host_type: u32,
}

/// The instance and the chosen physical device: what a recovery opens the same device on.
pub(crate) struct Adapter {
    pub instance: Instance,
    pub physical: vk::PhysicalDevice,
    pub props: vk::PhysicalDeviceProperties,
    pub name: String,
    pub family: u32,
}

impl Adapter {
    /// The instance and the physical device `config` and the environment ask for.
    pub(crate) fn open(config: &Config) -> Result<Arc<Adapter>> {
        let instance = Instance::open(config)?;
        let all = candidates(&instance.raw);
        let (index, family) = choose(&instance.raw, &all, config.device)?;
        let chosen = &all[index];
        Ok(Arc::new(Adapter {
            physical: chosen.physical,
            props: chosen.props,
            name: chosen.name.clone(),
            family,
            instance,
        }))
    }

    pub(crate) fn describe(&self) -> String {
        let api = self.props.api_version;
        format!(
            "{} ({}, Vulkan {}.{}.{})",
            self.name,
            kind_name(self.props.device_type),
            vk::api_version_major(api),
            vk::api_version_minor(api),
            vk::api_version_patch(api)
        )
    }
}

/// The device and everything created with it that lives as long as it.
pub(crate) struct Gpu {
    pub adapter: Arc<Adapter>,
    /// Called through [`Gpu::vk`], which takes the lifecycle lock (`lifecycle.rs`).
    device: ash::Device,
    push_descriptor: ash::khr::push_descriptor::Device,
    pub queue: vk::Queue,
    pub family: u32,
    pub limits: Limits,
    pub bda: bool,
    /// `vulkanMemoryModel`: with `bda`, what cubecl's device-address SPIR-V needs.
    pub memory_model: bool,
    /// `robustBufferAccess`: a descriptor access past its binding stays inside it.
    pub robust: bool,
    /// The shader capabilities naga may emit for this device.
    pub capabilities: naga::valid::Capabilities,
    /// The subgroup operations naga may emit; none without [`Features::subgroups`].
    pub subgroup_operations: naga::valid::SubgroupOperationSet,
    pub features: Features,
    /// `shaderZeroInitializeWorkgroupMemory`: the driver zeroes workgroup memory, not naga's
    /// polyfill, which hangs lavapipe (Mesa 22.3) on cubecl's tiled matmul.
    pub zero_init: bool,
    /// Set when a wait timed out or failed but for loss: work may still run. Teardown then
    /// leaks what it may use instead of destroying it.
    pub hung: AtomicBool,
    /// How long one host wait may take: 120 s, or `SCOPE_VULKAN_WAIT_TIMEOUT_MS`.
    pub wait_timeout_ns: u64,
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if self.is_hung() {
            tracing::error!(
                device = %self.adapter.name,
                "work on the device never finished; leaking the device rather than destroying \
                 it under running work"
            );
            // The instance must outlive the device, which is never destroyed now.
            std::mem::forget(self.adapter.clone());
            return;
        }
        // SAFETY: the last `Arc<Gpu>` is going, so every object made from the device is gone.
        // Nothing is hung, so the wait ends. The instance goes after, with the `Adapter`.
        let _ = unsafe { self.vk().device_wait_idle() };
        // SAFETY: as above; the wait is over.
        one_at_a_time(|| unsafe { self.device.destroy_device(None) });
    }
}

/// The optional features enabled where offered, reported in `launch_limits`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Features {
    /// `f16` in kernels, with 16-bit storage so it can live in a buffer.
    pub f16: bool,
    /// Subgroup operations in compute kernels, as Vulkan 1.1 reports them; SPIR-V 1.3.
    pub subgroups: bool,
    /// Atomic load, store, exchange and add of `f32` (`VK_EXT_shader_atomic_float`).
    pub f32_atomics: bool,
}

/// The subgroup operations [`Features::subgroups`] needs: what cubecl's plane operations assume.
const SUBGROUP_OPERATIONS: vk::SubgroupFeatureFlags = vk::SubgroupFeatureFlags::from_raw(
    vk::SubgroupFeatureFlags::BASIC.as_raw()
        | vk::SubgroupFeatureFlags::VOTE.as_raw()
        | vk::SubgroupFeatureFlags::ARITHMETIC.as_raw()
        | vk::SubgroupFeatureFlags::BALLOT.as_raw()
        | vk::SubgroupFeatureFlags::SHUFFLE.as_raw()
        | vk::SubgroupFeatureFlags::SHUFFLE_RELATIVE.as_raw(),
);

fn naga_subgroup_operations(
    offered: vk::SubgroupFeatureFlags,
) -> naga::valid::SubgroupOperationSet {
    use naga::valid::SubgroupOperationSet as S;
    let mut set = S::empty();
    for (vk_flag, naga_flag) in [
        (vk::SubgroupFeatureFlags::BASIC, S::BASIC),
        (vk::SubgroupFeatureFlags::VOTE, S::VOTE),
        (vk::SubgroupFeatureFlags::ARITHMETIC, S::ARITHMETIC),
        (vk::SubgroupFeatureFlags::BALLOT, S::BALLOT),
        (vk::SubgroupFeatureFlags::SHUFFLE, S::SHUFFLE),
        (
            vk::SubgroupFeatureFlags::SHUFFLE_RELATIVE,
            S::SHUFFLE_RELATIVE,
        ),
        (vk::SubgroupFeatureFlags::QUAD, S::QUAD_FRAGMENT_COMPUTE),
    ] {
        set.set(naga_flag, offered.contains(vk_flag));
    }
    set
}

fn memory_facts(
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
    props: &vk::PhysicalDeviceProperties,
    api: u32,
    config: &Config,
) -> Result<Limits> {
    let mut m3 = vk::PhysicalDeviceMaintenance3Properties::default();
    let mut m4 = vk::PhysicalDeviceMaintenance4Properties::default();
    let mut push = vk::PhysicalDevicePushDescriptorPropertiesKHR::default();
    let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
    let mut props2 = vk::PhysicalDeviceProperties2::default()
        .push_next(&mut m3)
        .push_next(&mut push)
        .push_next(&mut subgroup);
    if api >= vk::API_VERSION_1_3 && props.api_version >= vk::API_VERSION_1_3 {
        props2 = props2.push_next(&mut m4);
    }
    // SAFETY: the chained structs live across the call.
    unsafe { Guarded::new(instance).get_physical_device_properties2(physical, &mut props2) };
    // SAFETY: a plain query.
    let memory = unsafe { Guarded::new(instance).get_physical_device_memory_properties(physical) };
    let types = &memory.memory_types[..memory.memory_type_count as usize];
    let flags = |i: usize| types[i].property_flags;
    let local = vk::MemoryPropertyFlags::DEVICE_LOCAL;
    let host = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
    let device_type = (0..types.len())
        .find(|&i| flags(i).contains(local | host))
        .or_else(|| (0..types.len()).find(|&i| flags(i).contains(local)))
        .or_else(|| (0..types.len()).find(|&i| flags(i).contains(host)))
        .ok_or_else(|| unavailable("no usable memory type"))?;
    let host_type = (0..types.len())
        .find(|&i| flags(i).contains(host))
        .ok_or_else(|| unavailable("no host-visible, coherent memory type"))?;
    let heap = memory.memory_heaps[types[device_type].heap_index as usize].size;
    let max_buffer = if m4.max_buffer_size > 0 {
        m4.max_buffer_size
    } else {
        u64::MAX
    };
    Ok(Limits {
        min_storage_offset: props.limits.min_storage_buffer_offset_alignment.max(4),
        max_storage_range: u64::from(props.limits.max_storage_buffer_range),
        min_uniform_offset: props.limits.min_uniform_buffer_offset_alignment.max(16),
        max_uniform_range: u64::from(props.limits.max_uniform_buffer_range),
        max_memory_allocation: m3.max_memory_allocation_size.max(1),
        max_buffer_size: max_buffer,
        max_groups: props.limits.max_compute_work_group_count,
        max_workgroup_size: props.limits.max_compute_work_group_size,
        max_invocations: props.limits.max_compute_work_group_invocations,
        subgroup_width: subgroup.subgroup_size,
        subgroup_stages: subgroup.supported_stages,
        subgroup_operations: subgroup.supported_operations,
        max_workgroup_memory: props.limits.max_compute_shared_memory_size,
        max_push_constants: props.limits.max_push_constants_size,
        max_bindings: push
            .max_push_descriptors
            .min(props.limits.max_per_stage_descriptor_storage_buffers)
            .min(props.limits.max_descriptor_set_storage_buffers),
        device_type: device_type as u32,
        device_heap: heap,
        device_mappable: flags(device_type).contains(host) && !config.force_staging,
        host_type: host_type as u32,
    })
}

impl Gpu {
    /// Open a device on `adapter` with every feature and extension used that it offers.
    /// `Vulkan::new` and a recovery both open it here, asking the limits anew.
    pub(crate) fn open(adapter: &Arc<Adapter>, config: &Config) -> Result<Arc<Gpu>> {
        let instance = &adapter.instance.raw;
        let api = adapter.instance.api;
        let physical = adapter.physical;
        let props = &adapter.props;
        let family = adapter.family;
        let limits = memory_facts(instance, physical, props, api, config)?;
        // SAFETY: a plain query on a physical device of a live instance.
        let extensions = unsafe {
            Guarded::new(instance)
                .enumerate_device_extension_properties(physical)
                .unwrap_or_default()
        };
        let offers = |name: &CStr| {
            extensions
                .iter()
                .any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == name))
        };
        let atomic_float_offered = offers(ash::ext::shader_atomic_float::NAME);
        let mut supported11 = vk::PhysicalDeviceVulkan11Features::default();
        let mut supported = vk::PhysicalDeviceVulkan12Features::default();
        let mut supported13 = vk::PhysicalDeviceVulkan13Features::default();
        let mut supported_atomic_float = vk::PhysicalDeviceShaderAtomicFloatFeaturesEXT::default();
        // The 1.3 structure only where both speak 1.3; an extension's only where offered.
        let v13 = api >= vk::API_VERSION_1_3 && props.api_version >= vk::API_VERSION_1_3;
        let mut features = vk::PhysicalDeviceFeatures2::default()
            .push_next(&mut supported11)
            .push_next(&mut supported);
        if v13 {
            features = features.push_next(&mut supported13);
        }
        if atomic_float_offered {
            features = features.push_next(&mut supported_atomic_float);
        }
        // SAFETY: the chained structs live across the call.
        unsafe { Guarded::new(instance).get_physical_device_features2(physical, &mut features) };
        let core = features.features;
        let enabled = Features {
            f16: supported.shader_float16 == vk::TRUE
                && supported11.storage_buffer16_bit_access == vk::TRUE
                && supported11.uniform_and_storage_buffer16_bit_access == vk::TRUE,
            subgroups: limits
                .subgroup_stages
                .contains(vk::ShaderStageFlags::COMPUTE)
                && limits.subgroup_operations.contains(SUBGROUP_OPERATIONS)
                && limits.subgroup_width > 0,
            f32_atomics: atomic_float_offered
                && supported_atomic_float.shader_buffer_float32_atomics == vk::TRUE
                && supported_atomic_float.shader_buffer_float32_atomic_add == vk::TRUE,
        };
        let mut enable11 = vk::PhysicalDeviceVulkan11Features::default()
            .storage_buffer16_bit_access(enabled.f16)
            .uniform_and_storage_buffer16_bit_access(enabled.f16);
        let mut enable_atomic_float = vk::PhysicalDeviceShaderAtomicFloatFeaturesEXT::default()
            .shader_buffer_float32_atomics(true)
            .shader_buffer_float32_atomic_add(true);
        let zero_init = v13 && supported13.shader_zero_initialize_workgroup_memory == vk::TRUE;
        let mut enable13 = vk::PhysicalDeviceVulkan13Features::default()
            .shader_zero_initialize_workgroup_memory(zero_init);
        let bda = supported.buffer_device_address == vk::TRUE;
        let memory_model = supported.vulkan_memory_model == vk::TRUE;
        let device_scope = memory_model && supported.vulkan_memory_model_device_scope == vk::TRUE;
        let mut enable = vk::PhysicalDeviceVulkan12Features::default()
            .timeline_semaphore(true)
            .buffer_device_address(bda)
            .vulkan_memory_model(memory_model)
            .vulkan_memory_model_device_scope(device_scope)
            .shader_float16(enabled.f16);
        let robust = core.robust_buffer_access == vk::TRUE;
        let core_enable = vk::PhysicalDeviceFeatures::default()
            .robust_buffer_access(robust)
            .shader_float64(core.shader_float64 == vk::TRUE)
            .shader_int64(core.shader_int64 == vk::TRUE)
            .shader_int16(core.shader_int16 == vk::TRUE);
        let mut capabilities = naga::valid::Capabilities::empty();
        capabilities.set(
            naga::valid::Capabilities::FLOAT64,
            core_enable.shader_float64 == vk::TRUE,
        );
        capabilities.set(
            naga::valid::Capabilities::SHADER_INT64,
            core_enable.shader_int64 == vk::TRUE,
        );
        capabilities.set(
            naga::valid::Capabilities::SHADER_INT16,
            core_enable.shader_int16 == vk::TRUE,
        );
        capabilities.set(naga::valid::Capabilities::SHADER_FLOAT16, enabled.f16);
        capabilities.set(
            naga::valid::Capabilities::SUBGROUP | naga::valid::Capabilities::SUBGROUP_BARRIER,
            enabled.subgroups,
        );
        capabilities.set(
            naga::valid::Capabilities::SHADER_FLOAT32_ATOMIC,
            enabled.f32_atomics,
        );
        let subgroup_operations = if enabled.subgroups {
            naga_subgroup_operations(limits.subgroup_operations)
        } else {
            naga::valid::SubgroupOperationSet::empty()
        };
        let priorities = [1.0_f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(family)
            .queue_priorities(&priorities)];
        let mut extensions = vec![ash::khr::push_descriptor::NAME.as_ptr()];
        if enabled.f32_atomics {
            extensions.push(ash::ext::shader_atomic_float::NAME.as_ptr());
        }
        let mut info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_extension_names(&extensions)
            .enabled_features(&core_enable)
            .push_next(&mut enable11)
            .push_next(&mut enable);
        if v13 {
            info = info.push_next(&mut enable13);
        }
        if enabled.f32_atomics {
            info = info.push_next(&mut enable_atomic_float);
        }
        let device = create_device(instance, physical, &info, &adapter.name)?;
        // SAFETY: the family was created with one queue.
        let queue = unsafe { Guarded::new(&device).get_device_queue(family, 0) };
        let push_descriptor = {
            let _calling = calling();
            ash::khr::push_descriptor::Device::new(instance, &device)
        };
        tracing::info!(device = %adapter.name, validation = adapter.instance.validation, bda, memory_model, robust, zero_init, features = ?enabled, "vulkan device open");
        Ok(Arc::new(Gpu {
            adapter: adapter.clone(),
            device,
            push_descriptor,
            queue,
            family,
            limits,
            bda,
            memory_model,
            robust,
            capabilities,
            subgroup_operations,
            features: enabled,
            zero_init,
            hung: AtomicBool::new(false),
            wait_timeout_ns: wait_timeout_ns(),
        }))
    }

    /// The device's entry points for one statement, holding the lifecycle lock's read side.
    pub(crate) fn vk(&self) -> Guarded<'_, ash::Device> {
        Guarded::new(&self.device)
    }

    /// `VK_KHR_push_descriptor`'s entry points, as [`Gpu::vk`].
    pub(crate) fn push(&self) -> Guarded<'_, ash::khr::push_descriptor::Device> {
        Guarded::new(&self.push_descriptor)
    }

    /// The entry points with no lock, for the bench's baseline only
    /// ([`Vulkan::raw`](crate::Vulkan::raw)).
    pub(crate) fn unguarded(&self) -> (&ash::Device, &ash::khr::push_descriptor::Device) {
        (&self.device, &self.push_descriptor)
    }

    /// Whether a wait gave up on work that may still be running.
    pub(crate) fn is_hung(&self) -> bool {
        self.hung.load(Ordering::Acquire)
    }

    pub(crate) fn mark_hung(&self) {
        if !self.hung.swap(true, Ordering::AcqRel) {
            tracing::error!(
                device = %self.adapter.name,
                "a wait for the device gave up; what that work uses will be leaked at teardown"
            );
        }
    }
}

/// `vkCreateDevice` on `physical`; a refusal is the backend unavailable.
fn create_device(
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
    info: &vk::DeviceCreateInfo<'_>,
    name: &str,
) -> Result<ash::Device> {
    // SAFETY: `info` outlives the call; `physical` belongs to the live `instance`.
    one_at_a_time(|| unsafe { instance.create_device(physical, info, None) })
        .map_err(|e| unavailable(format!("vkCreateDevice on {name} failed: {e}")))
}

/// How long a host wait may take before it is a fault, unless configured.
const WAIT_TIMEOUT_NS: u64 = 120_000_000_000;

fn wait_timeout_ns() -> u64 {
    std::env::var("SCOPE_VULKAN_WAIT_TIMEOUT_MS")
        .ok()
        .and_then(|ms| ms.trim().parse::<u64>().ok())
        .map_or(WAIT_TIMEOUT_NS, |ms| ms.max(1).saturating_mul(1_000_000))
}
