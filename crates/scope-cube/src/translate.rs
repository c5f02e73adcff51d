//! A cubecl kernel definition, compiled into the language of one server.
//!
//! Translation runs once, before any launch, so it can be strict: what a launch relies on is
//! read here into the [`CubeKernel`]. Some cubecl passes `expect`, so translation runs under
//! `catch_unwind`: a kernel cubecl cannot compile is [`Error::Compile`], not a panic.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cubecl_core::CompilationError;
use cubecl_core::Compiler;
use cubecl_core::environment::backtrace::BackTrace;
use cubecl_core::ir::AddressType;
use cubecl_core::ir::attributes::BufferIOAttr;
use cubecl_core::ir::metadata::Info;
use cubecl_core::prelude::ExecutionMode;
use cubecl_core::prelude::KernelDefinition;
use cubecl_cpp::shared::CppCompiler;
use scope_core::{Access, Error, Kernel, KernelId, KernelSource, Result};

use crate::target::{Target, Translation};

/// A cubecl kernel translated for one target, with what a launch needs to pack.
#[derive(Clone, Debug)]
pub struct CubeKernel {
    pub(crate) kernel: Kernel,
    pub(crate) target: Target,
    pub(crate) io: Vec<BufferIOAttr>,
    pub(crate) info: Info,
    pub(crate) address_type: AddressType,
    pub(crate) shared_memory: usize,
    pub(crate) element_bytes: Vec<Option<u64>>,
}

impl CubeKernel {
    /// The scope kernel: source, entry point and block size.
    ///
    /// # Safety
    ///
    /// A launch other than [`launch`](Self::launch) must pass the blob [`pack`](Self::pack)
    /// made, whose buffer lengths the bounds checks read.
    pub unsafe fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// The scope kernel's id.
    pub fn id(&self) -> KernelId {
        self.kernel.id()
    }

    /// The scope kernel's name.
    pub fn name(&self) -> &Arc<str> {
        self.kernel.name()
    }

    /// The translated source.
    pub fn source(&self) -> &KernelSource {
        self.kernel.source()
    }

    /// The target it was translated for.
    pub fn target(&self) -> Target {
        self.target
    }

    /// How many buffers it takes.
    pub fn buffers(&self) -> usize {
        self.io.len()
    }

    /// The least access a launch must declare for buffer `index`; `Read` if untouched.
    pub fn access(&self, index: usize) -> Option<Access> {
        self.io.get(index).map(|io| io_access(*io))
    }

    /// The compiler's access for every buffer, by position.
    pub fn buffer_io(&self) -> &[BufferIOAttr] {
        &self.io
    }

    /// Bytes of workgroup memory declared, checked by [`launch`](Self::launch).
    pub fn shared_memory(&self) -> usize {
        self.shared_memory
    }

    /// Whether it takes an info struct, packed as the scalar blob.
    pub fn has_info(&self) -> bool {
        self.info.has_info()
    }

    /// Whether a launch binds tensor metadata as one more read-only buffer, after the kernel's.
    /// True for a CUDA or HIP kernel that reads shapes or strides, which would otherwise take
    /// the blob for a pointer ([`split_info`](Self::split_info)).
    pub fn binds_tensor_metadata(&self) -> bool {
        self.info.has_dynamic_meta && matches!(self.target, Target::Cuda | Target::Hip)
    }

    /// cubecl's info words split into the scalar blob and, where
    /// [`binds_tensor_metadata`](Self::binds_tensor_metadata), the metadata binding.
    pub fn split_info<'a>(
        &self,
        words: &'a [u64],
        dynamic_offset: usize,
    ) -> (&'a [u64], Option<&'a [u64]>) {
        if self.binds_tensor_metadata() {
            let (blob, metadata) = words.split_at(dynamic_offset.min(words.len()));
            (blob, Some(metadata))
        } else {
            (words, None)
        }
    }

    /// The scalars it takes, as (type, count) in info-struct order.
    pub fn scalars(&self) -> Vec<(String, usize)> {
        self.info
            .scalars
            .iter()
            .map(|s| (s.ty.to_string(), s.count))
            .collect()
    }
}

pub(crate) fn io_access(io: BufferIOAttr) -> Access {
    match io {
        BufferIOAttr::ReadOnly | BufferIOAttr::Dead => Access::Read,
        BufferIOAttr::WriteOnly => Access::Write,
        BufferIOAttr::ReadWrite => Access::ReadWrite,
    }
}

/// The entry point without cubecl's `_<8 hex>` build hash, stable across builds.
fn display_name(entry: &str) -> &str {
    match entry.rsplit_once('_') {
        Some((base, hash))
            if !base.is_empty()
                && hash.len() == 8
                && hash.bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            base
        }
        _ => entry,
    }
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_owned())
}

enum Output {
    Text(String),
    Words(Vec<u32>),
}

/// What one compiler produced. `immediate` is the SPIR-V push-constant size, if any.
struct Compiled {
    output: Output,
    io: Vec<BufferIOAttr>,
    immediate: Option<usize>,
    shared_memory: usize,
}

/// Translate `kernel`, made with [`Target::settings`], into the language of `target`.
///
/// # Errors
///
/// [`Error::Compile`] when expansion or compiling fails, or the kernel reads tensor metadata.
pub fn translate(
    kernel: &(impl cubecl_core::CubeKernel + ?Sized),
    target: Target,
) -> Result<CubeKernel> {
    let type_name = kernel.name();
    let compile_error = |name: &str, log: String| Error::Compile {
        backend: target.kind().name(),
        kernel: Arc::from(name),
        log,
    };
    let definition = cubecl_core::define_kernel(kernel)
        .map_err(|e| compile_error(type_name, format!("cubecl could not expand it: {e}")))?;
    let name = display_name(&definition.settings.kernel_name).to_owned();
    if definition.settings.execution_mode != ExecutionMode::Checked {
        return Err(compile_error(
            &name,
            format!(
                "the kernel was defined in {:?} mode; scope-cube translates checked kernels \
                 only (see `translate_definition`)",
                definition.settings.execution_mode
            ),
        ));
    }
    if definition.info.has_dynamic_meta {
        return Err(compile_error(
            &name,
            "the kernel takes tensor metadata (shapes and strides); scope-cube packs buffers and \
             scalars only"
                .to_owned(),
        ));
    }
    // SAFETY: the definition is checked (refused above otherwise); that is all it requires.
    unsafe { translate_definition(definition, target, &Translation::default()) }
        .map_err(|e| compile_error(&name, e.to_string()))
}

/// Compile an expanded definition for `target`: the half of [`translate`] a runtime needs.
/// In [`ExecutionMode::Checked`], every index is clamped first (`checks.rs`). Its WGSL is not
/// vouched ([`Kernel::vouch_in_bounds`]), so WGSL servers keep their checks.
///
/// # Errors
///
/// cubecl's typed [`CompilationError`]; a panic or wrong output is `Generic`.
///
/// # Safety
///
/// Outside checked mode, every launch indexes only inside its bindings and arrays, and ends
/// every loop ([`Kernel::vouch_in_bounds`], [`Kernel::vouch_terminates`]).
pub unsafe fn translate_definition(
    definition: KernelDefinition,
    target: Target,
    translation: &Translation,
) -> std::result::Result<CubeKernel, CompilationError> {
    let entry = definition.settings.kernel_name.clone();
    let name = display_name(&entry).to_owned();
    let mode = definition.settings.execution_mode;
    let info = definition.info.clone();
    let address_type = definition.settings.address_type;
    let cube = definition.settings.cube_dim;
    let generic = |reason: String| CompilationError::Generic {
        reason,
        backtrace: BackTrace::capture(),
    };
    let mut element_bytes = Vec::new();
    let compiled = catch_unwind(AssertUnwindSafe(
        || -> std::result::Result<Compiled, CompilationError> {
            element_bytes = crate::checks::buffer_element_bytes(&definition);
            if mode == ExecutionMode::Checked {
                crate::checks::clamp_indices(&definition).map_err(generic)?;
            }
            match target {
                Target::Cuda => {
                    let repr = CppCompiler::<cubecl_cpp::target::Cuda>::default()
                        .compile(definition, &target.cpp_options())?;
                    let io = CppCompiler::<cubecl_cpp::target::Cuda>::buffer_io(&repr);
                    Ok(Compiled {
                        shared_memory: repr.shared_memory_size,
                        output: Output::Text(repr.to_string()),
                        io: io.unwrap_or_default(),
                        immediate: None,
                    })
                }
                Target::Hip => {
                    let repr = CppCompiler::<cubecl_cpp::target::Hip>::default()
                        .compile(definition, &target.cpp_options())?;
                    let io = CppCompiler::<cubecl_cpp::target::Hip>::buffer_io(&repr);
                    Ok(Compiled {
                        shared_memory: repr.shared_memory_size,
                        output: Output::Text(repr.to_string()),
                        io: io.unwrap_or_default(),
                        immediate: None,
                    })
                }
                Target::Wgsl => {
                    let repr = cubecl_wgpu::WgslCompiler
                        .compile(definition, &target.wgpu_options(translation))?;
                    Ok(Compiled {
                        shared_memory: repr.shared_memory_size,
                        io: repr.io.clone(),
                        output: Output::Text(repr.to_string()),
                        immediate: None,
                    })
                }
                Target::SpirV => {
                    let repr = cubecl_spirv::SpirvCompiler
                        .compile(definition, &target.wgpu_options(translation))?;
                    Ok(Compiled {
                        io: repr.io.clone().unwrap_or_default(),
                        immediate: repr.immediate_size,
                        shared_memory: repr.shared_size,
                        output: Output::Words(repr.assembled_module),
                    })
                }
            }
        },
    ))
    .map_err(|payload| {
        generic(format!(
            "the cubecl compiler panicked: {}",
            panic_text(&*payload)
        ))
    })??;
    let Compiled {
        output,
        io,
        immediate,
        shared_memory,
    } = compiled;
    let block = [cube.x, cube.y, cube.z];
    let shared_bytes = u32::try_from(shared_memory).map_err(|_| {
        generic(format!(
            "`{name}` asks for {shared_memory} bytes of shared memory"
        ))
    })?;
    // SAFETY (for the kernels below): cubecl's output for `target`. In checked mode every
    // buffer index is clamped to the info struct's length, which `CubeKernel::pack` sets to
    // the binding's own; every array index to the array. Otherwise the caller promised it.
    let checked = mode == ExecutionMode::Checked;
    let kernel = match (target, output) {
        (Target::Cuda, Output::Text(source)) => {
            // SAFETY: see above; cubecl puts every shared array in `shared_memory` bytes.
            unsafe { Kernel::cuda(name.as_str(), source).dynamic_shared_memory(shared_bytes) }
                .entry(entry)
                .block(block)
        }
        (Target::Hip, Output::Text(source)) => {
            // SAFETY: as for CUDA.
            unsafe { Kernel::hip(name.as_str(), source).dynamic_shared_memory(shared_bytes) }
                .entry(entry)
                .block(block)
        }
        (Target::Wgsl, Output::Text(source)) => {
            let kernel = Kernel::wgsl(name.as_str(), source).entry(entry);
            if checked {
                // No vouch: the clamps rest on this crate's reading of cubecl's IR.
                kernel
            } else {
                // SAFETY: the caller promised in-bounds access and ending loops (`# Safety`).
                unsafe { kernel.vouch_in_bounds().vouch_terminates() }
            }
        }
        (Target::SpirV, Output::Words(words)) => {
            // Too many addresses for push constants go in a uniform table (set 0, binding 0).
            tracing::trace!(kernel = %name, push_constants = ?immediate, "SPIR-V addresses");
            // SAFETY: see above.
            unsafe { Kernel::spirv(name.as_str(), words) }.entry(entry)
        }
        (target, _) => {
            return Err(generic(format!(
                "the {target:?} compiler produced the wrong kind of output"
            )));
        }
    };
    tracing::debug!(kernel = %name, ?target, buffers = io.len(), "translated");
    Ok(CubeKernel {
        kernel,
        target,
        io,
        info,
        address_type,
        shared_memory,
        element_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::display_name;

    #[test]
    fn the_build_hash_is_dropped_from_the_name() {
        assert_eq!(display_name("fill_115b64b4"), "fill");
        assert_eq!(display_name("fill_u32_115b64b4"), "fill_u32");
        assert_eq!(display_name("fill_u32"), "fill_u32");
        assert_eq!(display_name("fill_1234567g"), "fill_1234567g");
        assert_eq!(display_name("_115b64b4"), "_115b64b4");
    }
}
