//! Kernels: WGSL compiled to compute pipelines with a reflected layout.
//!
//! The core caches kernels by [`Kernel::id`], so [`compile`] runs once per
//! kernel. A WGSL error comes back from error scopes as [`Error::Compile`],
//! with naga's `line:column`. The module is then reflected for the bindings
//! of `@group(0)`, because the pipeline layout is built explicitly:
//!
//! - An explicit layout can give the *last* binding a dynamic offset. That
//!   binds a launch's scalar blob into the batch's shared arena without a
//!   bind group per launch (see [`crate::stream`]).
//! - Reflected minimum sizes and read-only flags let [`check`](crate::launch::check) refuse up
//!   front what wgpu would refuse at `finish`, long after the launch
//!   returned. The core calls it (`Backend::check_launch`) before the
//!   launch's scope opens, so such a launch claims nothing.
//!
//! Compiling needs only the device, so it stands below the launch, which
//! binds and checks against what this file reflected.

use std::borrow::Cow;
use std::sync::Arc;

use scope_core::{Error, Kernel, KernelSource};

use crate::device::Gpu;
use crate::error::{NAME, lost_first, message, out_of_memory, scoped};

/// One binding the shader declares.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    /// A uniform buffer rather than a storage buffer.
    pub(crate) uniform: bool,
    /// Declared `var<storage, read>` (or uniform).
    pub(crate) read_only: bool,
    /// The smallest binding the type allows (a runtime-sized array counts one).
    pub(crate) min_size: u64,
}

/// A compiled kernel.
pub struct Pipeline {
    pub(crate) id: u64,
    pub(crate) name: Arc<str>,
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: Option<wgpu::BindGroupLayout>,
    pub(crate) slots: Vec<Slot>,
    /// Whether the last binding takes a dynamic offset.
    pub(crate) dynamic: bool,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pipeline `{}` ({} bindings)",
            self.name,
            self.slots.len()
        )
    }
}

/// The bindings of `@group(0)` in `source`, by binding number.
fn reflect(source: &str) -> Result<Vec<Slot>, String> {
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    let mut slots: Vec<Option<Slot>> = Vec::new();
    for (_, var) in module.global_variables.iter() {
        let Some(binding) = &var.binding else {
            continue;
        };
        let name = var.name.as_deref().unwrap_or("?");
        if binding.group != 0 {
            return Err(format!(
                "`{name}` is at @group({}); the binding convention binds @group(0) only",
                binding.group
            ));
        }
        let (uniform, read_only) = match var.space {
            naga::AddressSpace::Storage { access } => {
                (false, !access.contains(naga::StorageAccess::STORE))
            }
            naga::AddressSpace::Uniform => (true, true),
            other => {
                return Err(format!(
                    "`{name}` (@binding({})) is in address space {other:?}; the binding convention binds buffers only",
                    binding.binding
                ));
            }
        };
        let min_size = module.types[var.ty]
            .inner
            .try_size(module.to_ctx())
            .ok_or_else(|| format!("`{name}` has a type too large to bind"))?;
        let index = binding.binding as usize;
        if index >= 64 {
            return Err(format!(
                "`{name}` is at @binding({index}); at most 64 bindings are supported"
            ));
        }
        if slots.len() <= index {
            slots.resize(index + 1, None);
        }
        slots[index] = Some(Slot {
            uniform,
            read_only,
            min_size: u64::from(min_size),
        });
    }
    slots
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            s.ok_or_else(|| format!("@binding({i}) is missing: bindings must be numbered 0..n"))
        })
        .collect()
}

/// Compile `kernel` to a compute pipeline with id `id`.
pub(crate) fn compile(gpu: &Gpu, kernel: &Kernel, id: u64) -> Result<Arc<Pipeline>, Error> {
    gpu.sink.check_lost()?;
    let fail = |log: String| Error::Compile {
        backend: NAME,
        kernel: kernel.name().clone(),
        log,
    };
    let KernelSource::Wgsl(source) = kernel.source() else {
        return Err(fail(format!(
            "wgpu takes WGSL kernels; this one is {}",
            kernel.source().language()
        )));
    };
    let device = &gpu.device;
    let descriptor = wgpu::ShaderModuleDescriptor {
        label: Some(kernel.name()),
        source: wgpu::ShaderSource::Wgsl(Cow::Borrowed(source)),
    };
    let (module, error) = scoped(device, || {
        if kernel.vouched_in_bounds() || kernel.vouched_terminates() {
            let checks = wgpu::ShaderRuntimeChecks {
                bounds_checks: !kernel.vouched_in_bounds(),
                force_loop_bounding: !kernel.vouched_terminates(),
                ..wgpu::ShaderRuntimeChecks::checked()
            };
            // SAFETY: each check dropped was vouched for by the unsafe
            // `Kernel::vouch_in_bounds` (accesses stay in bounds) or
            // `Kernel::vouch_terminates` (every loop ends).
            unsafe { device.create_shader_module_trusted(descriptor, checks) }
        } else {
            device.create_shader_module(descriptor)
        }
    });
    if let Some(error) = error {
        lost_first(device, &gpu.sink)?;
        return Err(out_of_memory(&error, 0).unwrap_or_else(|| fail(message(&error))));
    }
    let slots = reflect(source).map_err(fail)?;
    let limits = &gpu.limits;
    let last = slots.len().checked_sub(1);
    let dynamic = slots.last().is_some_and(|slot| {
        if slot.uniform {
            limits.max_dynamic_uniform_buffers_per_pipeline_layout > 0
        } else {
            limits.max_dynamic_storage_buffers_per_pipeline_layout > 0
        }
    });
    let entries: Vec<wgpu::BindGroupLayoutEntry> = slots
        .iter()
        .enumerate()
        .map(|(i, slot)| wgpu::BindGroupLayoutEntry {
            binding: i as u32,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: if slot.uniform {
                    wgpu::BufferBindingType::Uniform
                } else {
                    wgpu::BufferBindingType::Storage {
                        read_only: slot.read_only,
                    }
                },
                has_dynamic_offset: Some(i) == last && dynamic,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    let label = Some(&**kernel.name());
    let ((layout, pipeline), error) = scoped(device, || {
        let layout = (!entries.is_empty()).then(|| {
            device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label,
                entries: &entries,
            })
        });
        let groups = [layout.as_ref()];
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label,
            bind_group_layouts: if layout.is_some() { &groups } else { &[] },
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label,
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some(kernel.entry_point()),
            compilation_options: wgpu::PipelineCompilationOptions::default(),
            cache: None,
        });
        (layout, pipeline)
    });
    if let Some(error) = error {
        lost_first(device, &gpu.sink)?;
        return Err(out_of_memory(&error, 0).unwrap_or_else(|| fail(message(&error))));
    }
    tracing::debug!(kernel = %kernel.name(), bindings = slots.len(), "compiled");
    Ok(Arc::new(Pipeline {
        id,
        name: kernel.name().clone(),
        pipeline,
        layout,
        slots,
        dynamic,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflection_reads_access_and_sizes() {
        let slots = reflect(
            "@group(0) @binding(0) var<storage, read> a: array<u32>;
             @group(0) @binding(1) var<storage, read_write> b: array<u32, 8>;
             struct P { n: u32, v: u32 }
             @group(0) @binding(2) var<storage, read> p: P;
             @compute @workgroup_size(1) fn main() { b[0] = a[0] + p.n; }",
        )
        .expect("valid");
        assert_eq!(slots.len(), 3);
        assert!(slots[0].read_only && !slots[1].read_only);
        assert_eq!(
            (slots[0].min_size, slots[1].min_size, slots[2].min_size),
            (4, 32, 8)
        );
    }

    #[test]
    fn reflection_refuses_gaps_and_other_groups() {
        let gap = reflect(
            "@group(0) @binding(1) var<storage, read_write> b: array<u32>; @compute @workgroup_size(1) fn main() { b[0] = 1u; }",
        );
        assert!(gap.unwrap_err().contains("@binding(0) is missing"));
        let group = reflect(
            "@group(1) @binding(0) var<storage, read_write> b: array<u32>; @compute @workgroup_size(1) fn main() { b[0] = 1u; }",
        );
        assert!(group.unwrap_err().contains("@group(1)"));
    }
}
