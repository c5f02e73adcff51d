//! Compiling a kernel: WGSL through naga to SPIR-V, SPIR-V to a compute pipeline, and the
//! layouts and pipeline cache behind them.
//!
//! **Why apart from launching.** The halves meet at one value, [`VulkanKernel`]: a pipeline,
//! its layout, and the [`Interface`] read from the module once, here. Compiling runs once per
//! kernel and owns every long-lived object; launching runs on every call and owns nothing.
//! A launch path that worked the shape out itself would sooner or later push descriptors a
//! layout lacks: undefined behaviour, not an error code.
//!
//! By convention binding *i* of set 0 is the *i*-th binding, then the scalar blob. A layout
//! is thus one number, shared by every kernel with that count. Layouts use pushed
//! descriptors, so there is no pool to size and no set to keep alive while a graph runs.
//! A layout past `maxPushDescriptors` is [`Error::Compile`]. Pipelines are cached by a hash of
//! the SPIR-V and entry point.
//!
//! **The device-address interface.** cubecl's SPIR-V reaches buffers through 64-bit device
//! addresses, in one push-constant block, or a uniform block when they do not fit. The server
//! recognises either from the words, so no new language or launch field is needed.
//! A device without `bufferDeviceAddress` and `vulkanMemoryModel` answers [`Error::Compile`].
//!
//! **What is checked, and what is the caller's promise.**
//!
//! - *WGSL* is validated by naga against this device's capabilities, and lowered with every
//!   index bounds-checked. With `robustBufferAccess`, a stray index touches only its own
//!   binding, never a neighbour in the pool's `VkBuffer`.
//! - *SPIR-V* cannot be vouched for: invalid SPIR-V is undefined behaviour, and device
//!   addresses escape `robustBufferAccess`. Building one is the caller's `unsafe` promise.
//!   The cheap checks remain: the magic number, the entry point, the binding convention.

use std::collections::HashMap;
use std::ffi::CString;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use ash::vk;
use scope_core::{Error, Kernel, KernelSource, LaunchLimits, Result};

use crate::device::Gpu;
use crate::error::{NAME, classify, fault};

/// How a kernel reaches its buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Interface {
    /// Storage buffers at set 0, bindings `0..n`, pushed as descriptors.
    Descriptors(u32),
    /// `count` 64-bit device addresses: in push constants, or a uniform table (`table`).
    Addresses { count: u32, table: bool },
}

/// A compiled kernel: what the core caches as `Backend::Kernel`.
#[derive(Clone, Debug)]
pub struct VulkanKernel {
    pub(crate) pipeline: vk::Pipeline,
    pub(crate) layout: vk::PipelineLayout,
    pub(crate) interface: Interface,
}

/// Layouts by binding count, pipelines by SPIR-V hash; all destroyed with the backend.
pub(crate) struct Pipelines {
    gpu: Arc<Gpu>,
    layouts: HashMap<u32, (vk::DescriptorSetLayout, vk::PipelineLayout)>,
    address_layouts: HashMap<u32, vk::PipelineLayout>,
    /// The layout of address-table kernels: one pushed uniform buffer.
    table_layout: Option<(vk::DescriptorSetLayout, vk::PipelineLayout)>,
    pipelines: HashMap<u64, VulkanKernel>,
    guard: Option<VulkanKernel>,
}

impl Drop for Pipelines {
    fn drop(&mut self) {
        if self.gpu.is_hung() {
            return;
        }
        let device = self.gpu.vk();
        // SAFETY: the backend is going and the device idle; no command buffer using these
        // will be submitted again.
        unsafe {
            let _ = device.device_wait_idle();
            for (_, kernel) in self.pipelines.drain() {
                device.destroy_pipeline(kernel.pipeline, None);
            }
            for (_, (set, layout)) in self.layouts.drain() {
                device.destroy_pipeline_layout(layout, None);
                device.destroy_descriptor_set_layout(set, None);
            }
            for (_, layout) in self.address_layouts.drain() {
                device.destroy_pipeline_layout(layout, None);
            }
            if let Some((set, layout)) = self.table_layout.take() {
                device.destroy_pipeline_layout(layout, None);
                device.destroy_descriptor_set_layout(set, None);
            }
        }
    }
}

fn compile_error(kernel: &Kernel, log: impl Into<String>) -> Error {
    Error::Compile {
        backend: NAME,
        kernel: kernel.name().clone(),
        log: log.into(),
    }
}

/// How naga lowers WGSL: every index restricted to its array, buffers included.
const BOUNDS: naga::proc::BoundsCheckPolicies = naga::proc::BoundsCheckPolicies {
    index: naga::proc::BoundsCheckPolicy::Restrict,
    buffer: naga::proc::BoundsCheckPolicy::Restrict,
    image_load: naga::proc::BoundsCheckPolicy::Restrict,
    binding_array: naga::proc::BoundsCheckPolicy::Restrict,
};

/// The device's limits as `check_launch` and `compile` apply them. The binding count is
/// the least of the descriptor room and the address table's. Optional features are enabled
/// where offered (`device::Features`); every kernel runs at `subgroupSize` (SPIR-V 1.3).
pub(crate) fn launch_limits(gpu: &Gpu) -> LaunchLimits {
    let limits = &gpu.limits;
    let mut launch = LaunchLimits::default();
    launch.max_bindings = limits
        .max_bindings
        .min(u32::try_from(limits.max_uniform_range / 8).unwrap_or(u32::MAX));
    launch.max_binding_size = limits.max_storage_range;
    launch.max_scalar_bytes =
        u32::try_from(limits.max_storage_range / 16 * 16).unwrap_or(u32::MAX / 16 * 16);
    launch.max_workgroups = limits.max_groups;
    launch.max_workgroup_size = limits.max_workgroup_size;
    launch.max_invocations = limits.max_invocations;
    launch.max_workgroup_memory = limits.max_workgroup_memory;
    launch.subgroup_size = None;
    launch.native_width =
        (limits.subgroup_width > 0).then_some((limits.subgroup_width, limits.subgroup_width));
    launch.features.f64 = gpu
        .capabilities
        .contains(naga::valid::Capabilities::FLOAT64);
    launch.features.i64 = gpu
        .capabilities
        .contains(naga::valid::Capabilities::SHADER_INT64);
    launch.features.f16 = gpu.features.f16;
    launch.features.subgroups = gpu.features.subgroups;
    launch.features.f32_atomic_add = gpu.features.f32_atomics;
    if gpu.features.subgroups {
        launch.subgroup_size = launch.native_width;
    }
    launch
}

/// Refuse a WGSL kernel whose workgroup the device cannot run. naga knows no device limits,
/// and such a pipeline is undefined behaviour; wgpu checks the same.
fn check_workgroup(
    kernel: &Kernel,
    module: &naga::Module,
    info: &naga::valid::ModuleInfo,
    limits: &LaunchLimits,
) -> Result<()> {
    let Some((index, entry)) = module
        .entry_points
        .iter()
        .enumerate()
        .find(|(_, e)| e.name == kernel.entry_point())
    else {
        return Ok(());
    };
    let uses = info.get_entry_point(index);
    limits.workgroup_fits(entry.workgroup_size).map_err(|why| {
        compile_error(
            kernel,
            format!(
                "@workgroup_size: {why} (maxComputeWorkGroupSize, maxComputeWorkGroupInvocations)"
            ),
        )
    })?;
    let shared: u64 = module
        .global_variables
        .iter()
        .filter(|(handle, g)| g.space == naga::AddressSpace::WorkGroup && !uses[*handle].is_empty())
        .map(|(_, g)| u64::from(module.types[g.ty].inner.size(module.to_ctx())))
        .sum();
    if shared > u64::from(limits.max_workgroup_memory) {
        return Err(compile_error(
            kernel,
            format!(
                "{shared} bytes of workgroup memory is past the device's \
                 maxComputeSharedMemorySize of {}",
                limits.max_workgroup_memory
            ),
        ));
    }
    Ok(())
}

/// The SPIR-V version WGSL is lowered to: 1.3, the first with subgroup operations. Below 1.6
/// subgroups are exactly `subgroupSize` wide.
const SPIRV_VERSION: (u8, u8) = (1, 3);

/// WGSL to SPIR-V, and how many bindings set 0 declares.
fn wgsl_to_spirv(
    kernel: &Kernel,
    source: &str,
    gpu: &Gpu,
    limits: &LaunchLimits,
) -> Result<(Vec<u32>, u32)> {
    let module = naga::front::wgsl::parse_str(source)
        .map_err(|e| compile_error(kernel, e.emit_to_string(source)))?;
    let mut validator =
        naga::valid::Validator::new(naga::valid::ValidationFlags::all(), gpu.capabilities);
    validator
        .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
        .subgroup_operations(gpu.subgroup_operations);
    let info = validator
        .validate(&module)
        .map_err(|e| compile_error(kernel, e.emit_to_string(source)))?;
    check_workgroup(kernel, &module, &info, limits)?;
    let mut bindings = 0;
    for (_, global) in module.global_variables.iter() {
        if let Some(binding) = &global.binding {
            let name = global.name.as_deref().unwrap_or("?");
            if binding.group != 0 {
                return Err(compile_error(
                    kernel,
                    format!(
                        "@group({}) is used; the binding convention puts every binding in @group(0)",
                        binding.group
                    ),
                ));
            }
            // Anything but a storage buffer would not match the pushed layout.
            let buffer = matches!(global.space, naga::AddressSpace::Storage { .. })
                && !matches!(
                    module.types[global.ty].inner,
                    naga::TypeInner::BindingArray { .. }
                );
            if !buffer {
                return Err(compile_error(
                    kernel,
                    format!(
                        "`{name}` (@binding({})) is not a `var<storage>` buffer; the Vulkan server \
                         binds storage buffers only",
                        binding.binding
                    ),
                ));
            }
            bindings = bindings.max(binding.binding + 1);
        }
    }
    let zero_initialize_workgroup_memory = if gpu.zero_init {
        naga::back::spv::ZeroInitializeWorkgroupMemoryMode::Native
    } else {
        naga::back::spv::ZeroInitializeWorkgroupMemoryMode::Polyfill
    };
    // A kernel vouched in bounds (`Kernel::vouch_in_bounds`) needs no checks.
    let bounds_check_policies = if kernel.vouched_in_bounds() {
        naga::proc::BoundsCheckPolicies::default()
    } else {
        BOUNDS
    };
    let options = naga::back::spv::Options {
        lang_version: SPIRV_VERSION,
        // Compute kernels have no stage I/O for `f16`, and lavapipe lacks
        // `storageInputOutput16`.
        use_storage_input_output_16: false,
        flags: naga::back::spv::WriterFlags::empty(),
        bounds_check_policies,
        zero_initialize_workgroup_memory,
        force_loop_bounding: !kernel.vouched_terminates(),
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: kernel.entry_point().to_owned(),
    };
    let words = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
        .map_err(|e| compile_error(kernel, format!("SPIR-V generation failed: {e}")))?;
    Ok((words, bindings))
}

/// A literal string operand: NUL-terminated UTF-8 packed little-endian.
fn literal_string(words: &[u32]) -> String {
    let bytes: Vec<u8> = words
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// How a SPIR-V module reaches its buffers, read from its instructions. A reading, not a
/// validation: garbage yields whatever it yields.
fn spirv_interface(kernel: &Kernel, words: &[u32]) -> Result<Interface> {
    const OP_ENTRY_POINT: u32 = 15;
    const OP_MEMORY_MODEL: u32 = 14;
    const OP_TYPE_STRUCT: u32 = 30;
    const OP_TYPE_POINTER: u32 = 32;
    const OP_VARIABLE: u32 = 59;
    const OP_DECORATE: u32 = 71;
    const BINDING: u32 = 33;
    const DESCRIPTOR_SET: u32 = 34;
    const PHYSICAL_STORAGE_BUFFER_64: u32 = 5348;
    const PUSH_CONSTANT: u32 = 9;
    const UNIFORM: u32 = 2;
    if words.len() < 5 || words[0] != 0x0723_0203 {
        return Err(compile_error(
            kernel,
            "not a SPIR-V module: the magic number is missing",
        ));
    }
    let mut sets: HashMap<u32, u32> = HashMap::new();
    let mut bindings: HashMap<u32, u32> = HashMap::new();
    let mut entries: Vec<String> = Vec::new();
    let mut physical = false;
    let mut pointers: HashMap<u32, u32> = HashMap::new();
    let mut structs: HashMap<u32, u32> = HashMap::new();
    let mut push_blocks: Vec<u32> = Vec::new();
    let mut uniforms: Vec<(u32, u32)> = Vec::new();
    let mut at = 5;
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        let opcode = words[at] & 0xffff;
        if count == 0 || at + count > words.len() {
            break;
        }
        let operands = &words[at + 1..at + count];
        match opcode {
            OP_DECORATE if operands.len() >= 3 => {
                let (target, decoration, value) = (operands[0], operands[1], operands[2]);
                match decoration {
                    BINDING => {
                        bindings.insert(target, value);
                    }
                    DESCRIPTOR_SET => {
                        sets.insert(target, value);
                    }
                    _ => {}
                }
            }
            OP_ENTRY_POINT if operands.len() >= 3 => entries.push(literal_string(&operands[2..])),
            OP_MEMORY_MODEL if !operands.is_empty() => {
                physical = operands[0] == PHYSICAL_STORAGE_BUFFER_64;
            }
            OP_TYPE_POINTER if operands.len() >= 3 => {
                pointers.insert(operands[0], operands[2]);
            }
            OP_TYPE_STRUCT if !operands.is_empty() => {
                structs.insert(operands[0], (operands.len() - 1) as u32);
            }
            OP_VARIABLE if operands.len() >= 3 && operands[2] == PUSH_CONSTANT => {
                push_blocks.push(operands[0]);
            }
            OP_VARIABLE if operands.len() >= 3 && operands[2] == UNIFORM => {
                uniforms.push((operands[1], operands[0]));
            }
            _ => {}
        }
        at += count;
    }
    if !entries.iter().any(|e| e == kernel.entry_point()) {
        return Err(compile_error(
            kernel,
            format!(
                "the module has no entry point `{}` (it has {entries:?})",
                kernel.entry_point()
            ),
        ));
    }
    let mut count = 0;
    for (target, binding) in &bindings {
        let set = sets.get(target).copied().unwrap_or(0);
        if set != 0 {
            return Err(compile_error(
                kernel,
                format!(
                    "descriptor set {set} is used; the binding convention puts every binding in set 0"
                ),
            ));
        }
        count = count.max(binding.saturating_add(1));
    }
    if !physical {
        return Ok(Interface::Descriptors(count));
    }
    // Addresses in one push-constant block with no descriptors, or one uniform at (0, 0).
    let members = |pointer: u32| {
        pointers
            .get(&pointer)
            .and_then(|pointee| structs.get(pointee))
            .copied()
    };
    let table = match (push_blocks.as_slice(), uniforms.as_slice()) {
        ([pointer], []) if count == 0 => members(*pointer).map(|count| (count, false)),
        ([], [(variable, pointer)])
            if bindings.len() == 1
                && bindings.get(variable) == Some(&0)
                && sets.get(variable).copied().unwrap_or(0) == 0 =>
        {
            members(*pointer).map(|count| (count, true))
        }
        _ => None,
    };
    match table {
        Some((count, table)) => Ok(Interface::Addresses { count, table }),
        None => Err(compile_error(
            kernel,
            "the module reaches buffers by device address, but neither through exactly one \
             push-constant block of addresses and no descriptors nor through one uniform block \
             of addresses at set 0, binding 0 and no other descriptor: the two interfaces the \
             server binds",
        )),
    }
}

impl VulkanKernel {
    /// The pipeline and its layout.
    pub(crate) fn raw(&self) -> (vk::Pipeline, vk::PipelineLayout) {
        (self.pipeline, self.layout)
    }
}

impl Pipelines {
    pub(crate) fn new(gpu: Arc<Gpu>) -> Self {
        Self {
            gpu,
            layouts: HashMap::new(),
            address_layouts: HashMap::new(),
            table_layout: None,
            pipelines: HashMap::new(),
            guard: None,
        }
    }

    /// The kernel that bounds an indirect launch's counts, compiled on first use.
    pub(crate) fn guard(&mut self) -> Result<VulkanKernel> {
        if let Some(guard) = &self.guard {
            return Ok(guard.clone());
        }
        let [x, y, z] = self.gpu.limits.max_groups;
        let source = format!(
            "@group(0) @binding(0) var<storage, read> counts: array<u32>;
             @group(0) @binding(1) var<storage, read_write> checked: array<u32, 3>;
             @compute @workgroup_size(1)
             fn main() {{
                 let n = arrayLength(&counts);
                 let x = counts[n - 3u];
                 let y = counts[n - 2u];
                 let z = counts[n - 1u];
                 let fits = x <= {x}u && y <= {y}u && z <= {z}u;
                 checked[0] = select(0u, x, fits);
                 checked[1] = select(0u, y, fits);
                 checked[2] = select(0u, z, fits);
             }}"
        );
        let guard = self.compile(&Kernel::wgsl("scope indirect-count guard", source))?;
        self.guard = Some(guard.clone());
        Ok(guard)
    }

    fn layout(&mut self, bindings: u32) -> Result<(vk::DescriptorSetLayout, vk::PipelineLayout)> {
        if let Some(&layout) = self.layouts.get(&bindings) {
            return Ok(layout);
        }
        let layout = self.pushed_layout(vk::DescriptorType::STORAGE_BUFFER, bindings)?;
        self.layouts.insert(bindings, layout);
        Ok(layout)
    }

    fn table_layout(&mut self) -> Result<vk::PipelineLayout> {
        if let Some((_, layout)) = self.table_layout {
            return Ok(layout);
        }
        let layout = self.pushed_layout(vk::DescriptorType::UNIFORM_BUFFER, 1)?;
        self.table_layout = Some(layout);
        Ok(layout.1)
    }

    /// A pipeline layout of one push-descriptor set of `bindings` descriptors of `kind`.
    fn pushed_layout(
        &self,
        kind: vk::DescriptorType,
        bindings: u32,
    ) -> Result<(vk::DescriptorSetLayout, vk::PipelineLayout)> {
        let device = self.gpu.vk();
        let entries: Vec<_> = (0..bindings)
            .map(|i| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(i)
                    .descriptor_type(kind)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let info = vk::DescriptorSetLayoutCreateInfo::default()
            .flags(vk::DescriptorSetLayoutCreateFlags::PUSH_DESCRIPTOR_KHR)
            .bindings(&entries);
        let what = |e| classify(e, crate::error::Site::Create, "pipeline layout", 0);
        // SAFETY: valid create info on a live device.
        let set = unsafe { device.create_descriptor_set_layout(&info, None) }.map_err(what)?;
        let sets = [set];
        let info = vk::PipelineLayoutCreateInfo::default().set_layouts(&sets);
        // SAFETY: as above; `set` is live.
        let layout = match unsafe { device.create_pipeline_layout(&info, None) } {
            Ok(layout) => layout,
            Err(e) => {
                // SAFETY: unused.
                unsafe { device.destroy_descriptor_set_layout(set, None) };
                return Err(what(e));
            }
        };
        Ok((set, layout))
    }

    /// The layout of kernels that take `addresses` push-constant addresses.
    fn address_layout(&mut self, addresses: u32) -> Result<vk::PipelineLayout> {
        if let Some(&layout) = self.address_layouts.get(&addresses) {
            return Ok(layout);
        }
        let ranges = [vk::PushConstantRange::default()
            .stage_flags(vk::ShaderStageFlags::COMPUTE)
            .offset(0)
            .size(addresses * 8)];
        let info = vk::PipelineLayoutCreateInfo::default().push_constant_ranges(&ranges);
        // SAFETY: valid create info on a live device; the caller checked the range.
        let layout = unsafe { self.gpu.vk().create_pipeline_layout(&info, None) }
            .map_err(|e| classify(e, crate::error::Site::Create, "pipeline layout", 0))?;
        self.address_layouts.insert(addresses, layout);
        Ok(layout)
    }

    /// Compile `kernel` to a pipeline, or find the one its module made.
    pub(crate) fn compile(&mut self, kernel: &Kernel) -> Result<VulkanKernel> {
        let (words, interface) = match kernel.source() {
            KernelSource::Wgsl(source) => {
                let (words, bindings) =
                    wgsl_to_spirv(kernel, source, &self.gpu, &launch_limits(&self.gpu))?;
                (words, Interface::Descriptors(bindings))
            }
            KernelSource::SpirV(words) => (words.to_vec(), spirv_interface(kernel, words)?),
            other => {
                return Err(compile_error(
                    kernel,
                    format!(
                        "the Vulkan server takes WGSL and SPIR-V, not {}",
                        other.language()
                    ),
                ));
            }
        };
        let mut hasher = DefaultHasher::new();
        words.hash(&mut hasher);
        kernel.entry_point().hash(&mut hasher);
        let key = hasher.finish();
        if let Some(found) = self.pipelines.get(&key) {
            return Ok(found.clone());
        }
        let entry = CString::new(kernel.entry_point())
            .map_err(|_| compile_error(kernel, "the entry point name contains a NUL byte"))?;
        let layout = match interface {
            Interface::Descriptors(bindings) => {
                let max = self.gpu.limits.max_bindings;
                if bindings > max {
                    return Err(compile_error(
                        kernel,
                        format!(
                            "the kernel declares {bindings} storage buffers (bindings and scalar \
                             blob); {} pushes at most {max} (maxPushDescriptors and the \
                             storage-buffer limits)",
                            self.gpu.adapter.name
                        ),
                    ));
                }
                self.layout(bindings)?.1
            }
            Interface::Addresses {
                count: addresses,
                table,
            } => {
                if !(self.gpu.bda && self.gpu.memory_model) {
                    return Err(compile_error(
                        kernel,
                        format!(
                            "the module reaches buffers by device address, which needs \
                             bufferDeviceAddress and vulkanMemoryModel; {} lacks {}",
                            self.gpu.adapter.name,
                            match (self.gpu.bda, self.gpu.memory_model) {
                                (false, false) => "both",
                                (false, true) => "bufferDeviceAddress",
                                _ => "vulkanMemoryModel",
                            }
                        ),
                    ));
                }
                let bytes = u64::from(addresses) * 8;
                let (room, limit) = if table {
                    (self.gpu.limits.max_uniform_range, "maxUniformBufferRange")
                } else {
                    (
                        u64::from(self.gpu.limits.max_push_constants),
                        "maxPushConstantsSize",
                    )
                };
                if bytes > room {
                    return Err(compile_error(
                        kernel,
                        format!(
                            "{addresses} addresses need {bytes} bytes; the device's {limit} is \
                             {room}"
                        ),
                    ));
                }
                if table {
                    self.table_layout()?
                } else {
                    self.address_layout(addresses)?
                }
            }
        };
        let device = self.gpu.vk();
        let info = vk::ShaderModuleCreateInfo::default().code(&words);
        // SAFETY: `words` is whole 32-bit words after the SPIR-V magic. Validity is naga's
        // for WGSL, and the caller's `unsafe` promise for SPIR-V.
        let module = unsafe { device.create_shader_module(&info, None) }.map_err(|e| {
            compile_error(kernel, format!("the driver rejected the module: VK_{e:?}"))
        })?;
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(&entry);
        let info = vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(layout);
        // SAFETY: the module and layout are live; `entry` outlives the call.
        let created =
            unsafe { device.create_compute_pipelines(vk::PipelineCache::null(), &[info], None) };
        // SAFETY: a module may be destroyed once pipelines are created from it.
        unsafe { device.destroy_shader_module(module, None) };
        let pipeline = match created {
            Ok(pipelines) => pipelines.first().copied().unwrap_or_default(),
            Err((partial, code)) => {
                for p in partial.into_iter().filter(|p| *p != vk::Pipeline::null()) {
                    // SAFETY: never used.
                    unsafe { device.destroy_pipeline(p, None) };
                }
                if code == vk::Result::ERROR_DEVICE_LOST {
                    return Err(fault(code, format!("compiling `{}`", kernel.name())));
                }
                return Err(compile_error(
                    kernel,
                    format!(
                        "the driver rejected the module: vkCreateComputePipelines returned VK_{code:?}"
                    ),
                ));
            }
        };
        let compiled = VulkanKernel {
            pipeline,
            layout,
            interface,
        };
        self.pipelines.insert(key, compiled.clone());
        Ok(compiled)
    }
}
