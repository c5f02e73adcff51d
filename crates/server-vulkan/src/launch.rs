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

/// A compiled kernel: what the core caches as `Backend::Kernel`.
#[derive(Clone, Debug)]
pub struct VulkanKernel {
    pipeline: vk::Pipeline,
    layout: vk::PipelineLayout,
    bindings: u32,
}

/// Layouts by binding count, pipelines by SPIR-V hash; all destroyed with
/// the backend.
pub(crate) struct Pipelines {
    gpu: Arc<Gpu>,
    layouts: HashMap<u32, (vk::DescriptorSetLayout, vk::PipelineLayout)>,
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

/// How many bindings descriptor set 0 of a SPIR-V module declares, read from
/// its decorations. Garbage yields whatever it yields; the driver judges
/// the module itself.
fn spirv_bindings(kernel: &Kernel, words: &[u32]) -> Result<u32> {
    const OP_DECORATE: u32 = 71;
    const BINDING: u32 = 33;
    const DESCRIPTOR_SET: u32 = 34;
    if words.len() < 5 || words[0] != 0x0723_0203 {
        return Err(compile_error(
            kernel,
            "not a SPIR-V module: the magic number is missing",
        ));
    }
    let mut sets: HashMap<u32, u32> = HashMap::new();
    let mut bindings: HashMap<u32, u32> = HashMap::new();
    let mut at = 5;
    while at < words.len() {
        let count = (words[at] >> 16) as usize;
        let opcode = words[at] & 0xffff;
        if count == 0 || at + count > words.len() {
            break;
        }
        if opcode == OP_DECORATE && count >= 4 {
            let (target, decoration, value) = (words[at + 1], words[at + 2], words[at + 3]);
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
        at += count;
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
    Ok(count)
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

    /// Compile `kernel` to a pipeline, or find the one its module made.
    pub(crate) fn compile(&mut self, kernel: &Kernel) -> Result<VulkanKernel> {
        let (words, bindings) = match kernel.source() {
            KernelSource::Wgsl(source) => wgsl_to_spirv(kernel, source)?,
            KernelSource::SpirV(words) => (words.to_vec(), spirv_bindings(kernel, words)?),
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
        let (_, layout) = self.layout(bindings)?;
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
            bindings,
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
    if given != kernel.bindings {
        return Err(launch_error(
            launch.name,
            stream.id,
            format!(
                "the kernel declares {} storage buffers in set 0; the launch binds {given} (bindings, then the scalar blob)",
                kernel.bindings
            ),
        ));
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
    match &launch.dispatch {
        // SAFETY: `cmd` is recording with a compute pipeline bound and every
        // binding pushed; counts are within the device's limits.
        BoundDispatch::Groups([x, y, z]) => unsafe { gpu.device.cmd_dispatch(cmd, *x, *y, *z) },
        // SAFETY: as above; the counts are 12 aligned bytes of a buffer with
        // indirect usage (core-checked).
        BoundDispatch::Indirect { memory, offset } => unsafe {
            gpu.device
                .cmd_dispatch_indirect(cmd, memory.buffer, memory.offset + offset)
        },
    }
    encoder.needs_barrier = true;
    encoder.commands += 1;
    stream.recorded()
}
