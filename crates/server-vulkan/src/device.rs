//! The instance, the chosen physical device, the logical device and its queue.
//!
//! Everything Vulkan hands out is owned by something that must be destroyed
//! before the device, and the core drops a server's parts in an order it
//! chooses (the backend before its streams). So the device lives in one
//! [`Gpu`] behind an `Arc`: every object that needs the device to destroy
//! itself holds a clone, and the device goes last whatever the order. The
//! instance and the chosen physical device live one level up, in an
//! [`Adapter`] every `Gpu` holds: a recovery (`Backend::reopen`) destroys
//! the device and everything made on it, and opens a new one on the same
//! adapter with [`Gpu::open`], the function that opened the first.
//!
//! The device is picked by kind — discrete, integrated, virtual, then CPU —
//! unless `SCOPE_VULKAN_DEVICE` names one by index (enumeration order) or by
//! a substring of its name. A device qualifies when it offers Vulkan 1.2,
//! timeline semaphores, `VK_KHR_push_descriptor` and a compute queue; the
//! first is what streams are built on (one counter per stream, waited on by
//! value), the second lets a launch write its descriptors into the command
//! buffer itself, so a recorded command buffer replays without any
//! descriptor set to keep alive or allocate.
//!
//! Which devices qualify, and their order, is `choice.rs`; the instance
//! and its validation layer are `instance.rs`; why instances and devices
//! are made and destroyed one at a time in the process, and every call is
//! made through [`Gpu::vk`], is `lifecycle.rs`; opening the chosen one,
//! and what it offers, is here.

use std::ffi::CStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ash::vk;
use scope_core::Result;

use crate::error::unavailable;

mod choice;
mod instance;
mod lifecycle;

pub use choice::device_count;
pub(crate) use choice::probe;
use choice::{candidates, choose, kind_name};
use instance::Instance;
pub use instance::{VALIDATION_LAYER_MISSING, validation_layer_installed, validation_required_by};
use lifecycle::one_at_a_time;
pub(crate) use lifecycle::{Guarded, calling};

/// The limits and memory facts the rest of the backend consults.
#[derive(Clone, Debug)]
pub(crate) struct Limits {
    pub min_storage_offset: u64,
    pub max_storage_range: u64,
    /// `minUniformBufferOffsetAlignment` and `maxUniformBufferRange`: where
    /// a device-address kernel's table of addresses may be staged, and how
    /// many addresses it may hold.
    pub min_uniform_offset: u64,
    pub max_uniform_range: u64,
    pub max_memory_allocation: u64,
    pub max_buffer_size: u64,
    pub max_groups: [u32; 3],
    /// `maxComputeWorkGroupSize`, `maxComputeWorkGroupInvocations` and
    /// `maxComputeSharedMemorySize`: what a kernel may declare. A pipeline
    /// past them is invalid usage, which Vulkan leaves undefined, so a WGSL
    /// kernel past them does not compile.
    pub max_workgroup_size: [u32; 3],
    pub max_invocations: u32,
    pub max_workgroup_memory: u32,
    /// `subgroupSize` (Vulkan 1.1): the lanes the device runs in lockstep;
    /// 0 where it does not say. A compute kernel of SPIR-V below 1.6 (the
    /// server emits 1.3) runs in subgroups of exactly this size.
    pub subgroup_width: u32,
    /// `subgroupSupportedStages` and `subgroupSupportedOperations`: where
    /// and which subgroup operations the device runs.
    pub subgroup_stages: vk::ShaderStageFlags,
    pub subgroup_operations: vk::SubgroupFeatureFlags,
    /// `maxPushConstantsSize`.
    pub max_push_constants: u32,
    /// How many storage buffers one kernel's layout may declare:
    /// `maxPushDescriptors` (every binding is pushed),
    /// `maxPerStageDescriptorStorageBuffers` and
    /// `maxDescriptorSetStorageBuffers`, whichever is least. A layout past
    /// any of them is invalid usage, which Vulkan leaves undefined.
    pub max_bindings: u32,
    /// The memory type pooled allocations come from, and its heap's size.
    pub device_type: u32,
    pub device_heap: u64,
    /// Whether that type can be mapped (unified memory, or lavapipe).
    pub device_mappable: bool,
    /// A host-visible, coherent type for staging and scalars.
    pub host_type: u32,
}

/// The instance and the physical device chosen on it: what outlives every
/// device the server opens, so that a recovery opens the same device again
/// (same physical device, same queue family, and from the same queries the
/// same features and extensions) and the validation layer's messages carry
/// over.
pub(crate) struct Adapter {
    pub instance: Instance,
    pub physical: vk::PhysicalDevice,
    pub props: vk::PhysicalDeviceProperties,
    pub name: String,
    /// The compute queue family.
    pub family: u32,
}

impl Adapter {
    /// The instance and the physical device `config` and the environment
    /// ask for.
    pub(crate) fn open(config: &Config) -> Result<Arc<Adapter>> {
        // On an error below, dropping `instance` destroys it.
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

    /// The device, for a person.
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
    /// The instance and physical device it was opened on.
    pub adapter: Arc<Adapter>,
    /// The device's entry points: called through [`Gpu::vk`], which holds
    /// the lifecycle lock's read side while the layer is loaded
    /// (`lifecycle.rs`).
    device: ash::Device,
    /// `VK_KHR_push_descriptor`'s entry points, through [`Gpu::push`].
    push_descriptor: ash::khr::push_descriptor::Device,
    pub queue: vk::Queue,
    pub family: u32,
    pub limits: Limits,
    pub bda: bool,
    /// Whether `vulkanMemoryModel` is enabled: with `bda`, what SPIR-V that
    /// reaches buffers by device address (cubecl's) needs.
    pub memory_model: bool,
    /// Whether `robustBufferAccess` is enabled: a descriptor access past
    /// its binding's range then stays inside it (reads give zeros or values
    /// of the binding, writes are dropped or land inside it), whatever the
    /// module does.
    pub robust: bool,
    /// What naga may emit for this device: the optional shader
    /// capabilities whose device features are enabled.
    pub capabilities: naga::valid::Capabilities,
    /// The subgroup operations naga may emit, in compute kernels: the
    /// device's, where subgroups are enabled ([`Features::subgroups`]);
    /// none otherwise.
    pub subgroup_operations: naga::valid::SubgroupOperationSet,
    /// The optional features enabled on the device.
    pub features: Features,
    /// Whether `shaderZeroInitializeWorkgroupMemory` (Vulkan 1.3) is
    /// enabled: WGSL's zero-initialised workgroup memory is then the
    /// driver's, instead of naga's polyfill — a store loop and a barrier at
    /// the top of every kernel, which lavapipe (Mesa 22.3) runs into a hang
    /// on cubecl's tiled matmul.
    pub zero_init: bool,
    /// Set when a wait for the device timed out or failed for a reason
    /// other than device loss: work may still be running that nobody can
    /// wait for any more. Teardown then leaks what that work may use
    /// instead of destroying it (and does not wait again, unboundedly, in
    /// `vkDeviceWaitIdle`). A lost device runs nothing, so loss does not
    /// set it.
    pub hung: AtomicBool,
    /// How long one host wait may take before it gives up: 120 s, or
    /// `SCOPE_VULKAN_WAIT_TIMEOUT_MS`.
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
            // The instance must outlive the device it made, which is never
            // destroyed now: a reference that is never dropped keeps it.
            std::mem::forget(self.adapter.clone());
            return;
        }
        // SAFETY: the last `Arc<Gpu>` is going, so every object created
        // from the device (each holds a clone) is already destroyed.
        // Nothing is hung, so the wait is for work that finishes (a lost
        // device answers at once). The instance goes after, with the last
        // `Arc<Adapter>`.
        let _ = unsafe { self.vk().device_wait_idle() };
        // SAFETY: as above; the wait is over.
        one_at_a_time(|| unsafe { self.device.destroy_device(None) });
    }
}

/// How to open the device.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Enable `VK_LAYER_KHRONOS_validation` and collect what it says (see
    /// `Vulkan::validation_messages`). Where the layer is not installed the
    /// device opens without it (`Vulkan::validating` says so) — except
    /// under CI (`CI=true`) or when `SCOPE_REQUIRE` names vulkan, where
    /// asking for it makes it a requirement and opening is
    /// [`Error::Refused`](scope_core::Error::Refused), naming the layer and
    /// its package ([`VALIDATION_LAYER_MISSING`]): a test that promises
    /// validation must not pass there without it.
    pub validation: bool,
    /// Panic when the backend is dropped with validation messages
    /// collected and unread. For tests: it turns a message anywhere in a
    /// test into a failure of that test.
    pub fail_on_validation: bool,
    /// Treat device memory as not host-visible even when it is, so reads
    /// and writes take the staging path a discrete GPU takes. For tests on
    /// unified-memory devices (lavapipe).
    pub force_staging: bool,
    /// Which device to open, numbered `0..`[`device_count`]: device 0 is
    /// the one `SCOPE_VULKAN_DEVICE` names, or else the best by kind
    /// (hardware first), then every other usable device by kind. `None`
    /// is device 0.
    pub device: Option<usize>,
}

/// The optional features the device was opened with: each enabled where
/// the device offers it, and reported in `launch_limits`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Features {
    /// `f16` in kernels: `shaderFloat16`, with `storageBuffer16BitAccess`
    /// and `uniformAndStorageBuffer16BitAccess` so that it can live in a
    /// buffer (what wgpu asks for `SHADER_F16`).
    pub f16: bool,
    /// Subgroup operations in compute kernels: the device runs subgroups
    /// in the compute stage with the basic, vote, arithmetic, ballot,
    /// shuffle and relative-shuffle operations (Vulkan 1.1's subgroup
    /// properties; nothing to enable, but the SPIR-V must be 1.3).
    pub subgroups: bool,
    /// Atomic load, store, exchange and add of `f32` in storage buffers:
    /// `VK_EXT_shader_atomic_float`'s `shaderBufferFloat32Atomics` and
    /// `shaderBufferFloat32AtomicAdd`.
    pub f32_atomics: bool,
}

/// The subgroup operations [`Features::subgroups`] needs: what a subgroup
/// kernel (WGSL's, cubecl's plane operations) takes for granted.
const SUBGROUP_OPERATIONS: vk::SubgroupFeatureFlags = vk::SubgroupFeatureFlags::from_raw(
    vk::SubgroupFeatureFlags::BASIC.as_raw()
        | vk::SubgroupFeatureFlags::VOTE.as_raw()
        | vk::SubgroupFeatureFlags::ARITHMETIC.as_raw()
        | vk::SubgroupFeatureFlags::BALLOT.as_raw()
        | vk::SubgroupFeatureFlags::SHUFFLE.as_raw()
        | vk::SubgroupFeatureFlags::SHUFFLE_RELATIVE.as_raw(),
);

/// naga's name for each subgroup operation the device offers.
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
    /// Open a device on `adapter`'s physical device, with every feature
    /// and extension the server uses that it offers: what `Vulkan::new`
    /// opens, and what a recovery opens again once it gave the lost one
    /// up. The limits and features are asked anew each time.
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
        // The 1.3 structure only where instance and device both speak 1.3;
        // an extension's only where the device offers the extension.
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

    /// The device's entry points, for one call (or a few in a row: keep
    /// the value no longer than the statement that calls, and never across
    /// a device's creation or destruction). While the validation layer is
    /// loaded it holds the lifecycle lock's read side, so no instance or
    /// device is made or destroyed during the call (`lifecycle.rs`).
    pub(crate) fn vk(&self) -> Guarded<'_, ash::Device> {
        Guarded::new(&self.device)
    }

    /// `VK_KHR_push_descriptor`'s entry points, as [`Gpu::vk`].
    pub(crate) fn push(&self) -> Guarded<'_, ash::khr::push_descriptor::Device> {
        Guarded::new(&self.push_descriptor)
    }

    /// The entry points with no lock held, for the bench's raw baseline
    /// only ([`Vulkan::raw`](crate::Vulkan::raw)), which runs without the
    /// layer.
    pub(crate) fn unguarded(&self) -> (&ash::Device, &ash::khr::push_descriptor::Device) {
        (&self.device, &self.push_descriptor)
    }

    /// Whether a wait gave up on work that may still be running (see
    /// [`Gpu::hung`]).
    pub(crate) fn is_hung(&self) -> bool {
        self.hung.load(Ordering::Acquire)
    }

    /// Remember that a wait gave up on running work.
    pub(crate) fn mark_hung(&self) {
        if !self.hung.swap(true, Ordering::AcqRel) {
            tracing::error!(
                device = %self.adapter.name,
                "a wait for the device gave up; what that work uses will be leaked at teardown"
            );
        }
    }
}

/// `vkCreateDevice` on `physical` as `info` says; a refusal is the backend
/// unavailable, naming the device.
fn create_device(
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
    info: &vk::DeviceCreateInfo<'_>,
    name: &str,
) -> Result<ash::Device> {
    // SAFETY: `info` and what it points at outlive the call; the physical
    // device was enumerated on `instance`, which is alive.
    one_at_a_time(|| unsafe { instance.create_device(physical, info, None) })
        .map_err(|e| unavailable(format!("vkCreateDevice on {name} failed: {e}")))
}

/// The wait timeout `SCOPE_VULKAN_WAIT_TIMEOUT_MS` asks for (at least
/// 1 ms), or the default.
fn wait_timeout_ns() -> u64 {
    std::env::var("SCOPE_VULKAN_WAIT_TIMEOUT_MS")
        .ok()
        .and_then(|ms| ms.trim().parse::<u64>().ok())
        .map_or(crate::stream::WAIT_TIMEOUT_NS, |ms| {
            ms.max(1).saturating_mul(1_000_000)
        })
}
