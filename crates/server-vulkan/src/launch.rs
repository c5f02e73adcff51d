//! Kernels: WGSL through naga to SPIR-V, SPIR-V to a compute pipeline, and
//! the launch that records it.
//!
//! The binding convention (descriptor set 0, binding *i* = the *i*-th
//! binding, the scalar blob a read-only storage buffer at the next binding)
//! makes a kernel's layout a function of one number, how many storage
//! buffers set 0 declares. So the layout is derived from the module — from
//! naga's IR for WGSL, from the `Binding`/`DescriptorSet` decorations for
//! SPIR-V — and shared by every kernel with that count. Layouts are created
//! with the push-descriptor flag: a launch writes its buffer bindings into
//! the command buffer, so there is no descriptor pool to size, no set to
//! keep alive while a batch or a captured graph runs.
//!
//! The core caches compiled kernels by `Kernel::id()`; this module caches
//! pipelines by a hash of the final SPIR-V and entry point, so the same
//! module reached twice (two names, or a WGSL and a SPIR-V spelling that
//! compile alike) makes one pipeline.
//!
//! **The device-address interface.** SPIR-V may instead reach its buffers
//! through buffer device addresses: cubecl's compiler emits a module with
//! the `PhysicalStorageBuffer64` addressing model and one push-constant
//! block of 64-bit addresses, the buffers' in order and then the scalar
//! blob's. The module says so itself, so the server recognises it from the
//! words (no new kernel language or launch field) and fills that block with
//! the addresses of the launch's bindings (offset included) and of the blob,
//! staged as in the descriptor case. The buffers are still the launch's
//! bindings, with their access: the core's read and write sets, and so every
//! rule of the failure model, are the same as for a descriptor launch. Such
//! a module needs `bufferDeviceAddress` and `vulkanMemoryModel`; a device
//! without them answers with [`Error::Compile`], not a driver crash.
//!
//! A SPIR-V module whose entry points do not include the kernel's is a
//! compile error found here: handing the driver a missing entry point is
//! undefined behaviour, not an error code.
//!
//! A module the driver rejects — lavapipe answers garbage SPIR-V with
//! `VK_ERROR_UNKNOWN` from `vkCreateComputePipelines` — is
//! [`Error::Compile`] with the driver's code as its log; the core then
//! claims the launch's outputs with it.

use std::collections::HashMap;
use std::ffi::CString;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use ash::vk;
use scope_core::{BoundDispatch, Error, Kernel, KernelSource, Launch, Result};
use smallvec::SmallVec;

use crate::device::Gpu;
use crate::error::{NAME, classify, fault, launch_error};
use crate::memory::VulkanMemory;
use crate::stream::VulkanStream;

/// How a kernel reaches its buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Interface {
    /// Storage buffers at set 0, bindings `0..n`, pushed as descriptors.
    Descriptors(u32),
    /// `n` 64-bit buffer device addresses in a push-constant block.
    Addresses(u32),
}

/// A compiled kernel: what the core caches as `Backend::Kernel`.
#[derive(Clone, Debug)]
pub struct VulkanKernel {
    pipeline: vk::Pipeline,
    layout: vk::PipelineLayout,
    interface: Interface,
}

/// Layouts by binding count (and push-constant size), pipelines by SPIR-V
/// hash; all destroyed with the backend.
pub(crate) struct Pipelines {
    gpu: Arc<Gpu>,
    layouts: HashMap<u32, (vk::DescriptorSetLayout, vk::PipelineLayout)>,
    address_layouts: HashMap<u32, vk::PipelineLayout>,
    pipelines: HashMap<u64, VulkanKernel>,
}

impl Drop for Pipelines {
    fn drop(&mut self) {
        let device = &self.gpu.device;
        // SAFETY: the backend is going; the device is idle (the pool waited)
        // and no command buffer that uses these will be submitted again.
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

/// WGSL to SPIR-V, and how many bindings set 0 declares.
fn wgsl_to_spirv(kernel: &Kernel, source: &str) -> Result<(Vec<u32>, u32)> {
    let module = naga::front::wgsl::parse_str(source)
        .map_err(|e| compile_error(kernel, e.emit_to_string(source)))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| compile_error(kernel, e.emit_to_string(source)))?;
    let mut bindings = 0;
    for (_, global) in module.global_variables.iter() {
        if let Some(binding) = &global.binding {
            if binding.group != 0 {
                return Err(compile_error(
                    kernel,
                    format!(
                        "@group({}) is used; the binding convention puts every binding in @group(0)",
                        binding.group
                    ),
                ));
            }
            bindings = bindings.max(binding.binding + 1);
        }
    }
    let options = naga::back::spv::Options {
        flags: naga::back::spv::WriterFlags::empty(),
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

/// How a SPIR-V module reaches its buffers, read from its instructions:
/// the `Binding`/`DescriptorSet` decorations, or the addressing model and
/// push-constant block of the device-address interface. Garbage yields
/// whatever it yields; the driver judges the module itself.
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
            _ => {}
        }
        at += count;
    }
    if !entries.is_empty() && !entries.iter().any(|e| e == kernel.entry_point()) {
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
    // The device-address interface: one push-constant block, a struct of
    // 64-bit addresses, and no descriptors.
    let members = match push_blocks.as_slice() {
        [block] => pointers
            .get(block)
            .and_then(|pointee| structs.get(pointee))
            .copied(),
        _ => None,
    };
    match members {
        Some(members) if count == 0 => Ok(Interface::Addresses(members)),
        _ => Err(compile_error(
            kernel,
            "the module reaches buffers by device address, but not through exactly one \
             push-constant block of addresses and no descriptors, the only such interface the \
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
            pipelines: HashMap::new(),
        }
    }

    fn layout(&mut self, bindings: u32) -> Result<(vk::DescriptorSetLayout, vk::PipelineLayout)> {
        if let Some(&layout) = self.layouts.get(&bindings) {
            return Ok(layout);
        }
        let device = &self.gpu.device;
        let entries: Vec<_> = (0..bindings)
            .map(|i| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(i)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
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
        self.layouts.insert(bindings, (set, layout));
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
        // SAFETY: valid create info on a live device; the range is within
        // `maxPushConstantsSize` (checked by the caller).
        let layout = unsafe { self.gpu.device.create_pipeline_layout(&info, None) }
            .map_err(|e| classify(e, crate::error::Site::Create, "pipeline layout", 0))?;
        self.address_layouts.insert(addresses, layout);
        Ok(layout)
    }

    /// Compile `kernel` to a pipeline, or find the one its module made.
    pub(crate) fn compile(&mut self, kernel: &Kernel) -> Result<VulkanKernel> {
        let (words, interface) = match kernel.source() {
            KernelSource::Wgsl(source) => {
                let (words, bindings) = wgsl_to_spirv(kernel, source)?;
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
            Interface::Descriptors(bindings) => self.layout(bindings)?.1,
            Interface::Addresses(addresses) => {
                if !(self.gpu.bda && self.gpu.memory_model) {
                    return Err(compile_error(
                        kernel,
                        format!(
                            "the module reaches buffers by device address, which needs \
                             bufferDeviceAddress and vulkanMemoryModel; {} lacks {}",
                            self.gpu.name,
                            match (self.gpu.bda, self.gpu.memory_model) {
                                (false, false) => "both",
                                (false, true) => "bufferDeviceAddress",
                                _ => "vulkanMemoryModel",
                            }
                        ),
                    ));
                }
                let bytes = u64::from(addresses) * 8;
                if bytes > u64::from(self.gpu.limits.max_push_constants) {
                    return Err(compile_error(
                        kernel,
                        format!(
                            "{addresses} addresses need {bytes} bytes of push constants; the \
                             device offers {}",
                            self.gpu.limits.max_push_constants
                        ),
                    ));
                }
                self.address_layout(addresses)?
            }
        };
        let device = &self.gpu.device;
        let info = vk::ShaderModuleCreateInfo::default().code(&words);
        // SAFETY: `words` is a whole number of 32-bit words; the driver
        // judges their meaning and answers with an error code.
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

/// Record `launch` of `kernel` on `stream`.
pub(crate) fn launch(
    stream: &mut VulkanStream,
    kernel: &VulkanKernel,
    launch: &Launch<'_, VulkanMemory>,
) -> Result<()> {
    let given = launch.bindings.len() as u32 + u32::from(!launch.scalars.is_empty());
    match kernel.interface {
        Interface::Descriptors(bindings) if given != bindings => {
            return Err(launch_error(
                launch.name,
                stream.id,
                format!(
                    "the kernel declares {bindings} storage buffers in set 0; the launch binds {given} (bindings, then the scalar blob)"
                ),
            ));
        }
        Interface::Addresses(addresses) if given != addresses => {
            return Err(launch_error(
                launch.name,
                stream.id,
                format!(
                    "the kernel takes {addresses} buffer addresses; the launch binds {given} (bindings, then the scalar blob)"
                ),
            ));
        }
        _ => {}
    }
    let limits = &stream.gpu.limits;
    let (min_offset, max_range, max_groups) = (
        limits.min_storage_offset,
        limits.max_storage_range,
        limits.max_groups,
    );
    if let Some(b) = launch.bindings.iter().find(|b| b.len > max_range) {
        return Err(launch_error(
            launch.name,
            stream.id,
            format!(
                "a binding of {} bytes is past the device's maxStorageBufferRange of {max_range}",
                b.len
            ),
        ));
    }
    if let BoundDispatch::Groups(groups) = &launch.dispatch
        && groups.iter().zip(&max_groups).any(|(g, m)| g > m)
    {
        return Err(launch_error(
            launch.name,
            stream.id,
            format!("{groups:?} workgroups is past the device's limit of {max_groups:?}"),
        ));
    }
    if let Interface::Addresses(_) = kernel.interface {
        return launch_by_address(stream, kernel, launch);
    }
    let (encoder, arena, gpu) = stream.encoder()?;
    let mut infos: SmallVec<[vk::DescriptorBufferInfo; 8]> = launch
        .bindings
        .iter()
        .map(|b| vk::DescriptorBufferInfo {
            buffer: b.memory.buffer,
            offset: b.memory.offset + b.offset,
            range: b.len,
        })
        .collect();
    if !launch.scalars.is_empty() {
        let padded = (launch.scalars.len() as u64).div_ceil(16) * 16;
        let staged = arena.push(launch.scalars, padded, min_offset)?;
        infos.push(vk::DescriptorBufferInfo {
            buffer: staged.buffer,
            offset: staged.offset,
            range: padded,
        });
    }
    encoder.barrier(gpu);
    let cmd = encoder.cmd;
    if encoder.bound != kernel.pipeline {
        // SAFETY: `cmd` is recording; the pipeline is live for the backend's
        // life.
        unsafe {
            gpu.device
                .cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, kernel.pipeline)
        };
        encoder.bound = kernel.pipeline;
    }
    if !infos.is_empty() {
        let write = vk::WriteDescriptorSet::default()
            .dst_binding(0)
            .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
            .buffer_info(&infos);
        // SAFETY: the layout was made with the push-descriptor flag and has
        // exactly `infos.len()` storage-buffer bindings, each one array
        // element, filled consecutively from binding 0; every range lies in
        // a live buffer at an aligned offset (core-checked bindings, arena
        // scalars at `min_offset`).
        unsafe {
            gpu.push.cmd_push_descriptor_set(
                cmd,
                vk::PipelineBindPoint::COMPUTE,
                kernel.layout,
                0,
                &[write],
            )
        };
    }
    dispatch(gpu, cmd, &launch.dispatch);
    encoder.needs_barrier = true;
    encoder.commands += 1;
    stream.recorded()
}

/// Record the dispatch on `cmd`, which is recording with a compute
/// pipeline bound and every binding it reads pushed.
fn dispatch(gpu: &Gpu, cmd: vk::CommandBuffer, dispatch: &BoundDispatch<'_, VulkanMemory>) {
    match dispatch {
        // SAFETY: the caller's promise; counts are within the device's
        // limits (checked in `launch`).
        BoundDispatch::Groups([x, y, z]) => unsafe { gpu.device.cmd_dispatch(cmd, *x, *y, *z) },
        // SAFETY: as above; the counts are 12 aligned bytes of a buffer with
        // indirect usage (core-checked).
        BoundDispatch::Indirect { memory, offset } => unsafe {
            gpu.device
                .cmd_dispatch_indirect(cmd, memory.buffer, memory.offset + offset)
        },
    }
}

/// Record a launch of a device-address kernel: the addresses of the
/// bindings and of the staged scalar blob, in that order, as push
/// constants.
fn launch_by_address(
    stream: &mut VulkanStream,
    kernel: &VulkanKernel,
    launch: &Launch<'_, VulkanMemory>,
) -> Result<()> {
    let min_offset = stream.gpu.limits.min_storage_offset;
    let id = stream.id;
    let (encoder, arena, gpu) = stream.encoder()?;
    let mut addresses: SmallVec<[u64; 16]> = launch
        .bindings
        .iter()
        .map(|b| b.memory.device_address() + b.offset)
        .collect();
    if !launch.scalars.is_empty() {
        let padded = (launch.scalars.len() as u64).div_ceil(16) * 16;
        let staged = arena.push(launch.scalars, padded, min_offset.max(16))?;
        addresses.push(staged.address);
    }
    if addresses.contains(&0) {
        return Err(launch_error(
            launch.name,
            id,
            "a binding has no device address (bufferDeviceAddress is off)".to_owned(),
        ));
    }
    let bytes: SmallVec<[u8; 128]> = addresses.iter().flat_map(|a| a.to_le_bytes()).collect();
    encoder.barrier(gpu);
    let cmd = encoder.cmd;
    if encoder.bound != kernel.pipeline {
        // SAFETY: `cmd` is recording; the pipeline is live for the backend's
        // life.
        unsafe {
            gpu.device
                .cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, kernel.pipeline)
        };
        encoder.bound = kernel.pipeline;
    }
    // SAFETY: the layout has one compute push-constant range of exactly
    // `bytes.len()` bytes (the interface's address count, checked against
    // the launch above); every address is of a live buffer range the core
    // checked, or of arena memory that travels with the submission.
    unsafe {
        gpu.device
            .cmd_push_constants(cmd, kernel.layout, vk::ShaderStageFlags::COMPUTE, 0, &bytes)
    };
    dispatch(gpu, cmd, &launch.dispatch);
    encoder.needs_barrier = true;
    encoder.commands += 1;
    stream.recorded()
}
