//! A cubecl kernel definition, compiled into the language of one server.
//!
//! Translation happens once per kernel and target, ahead of any launch, so it
//! can afford to be strict: everything the launch path will rely on — the
//! entry point, the per-buffer access the compiler proved, the info layout —
//! is read here from the definition and the compiler's output and kept in the
//! [`CubeKernel`]. A launch then only packs values.
//!
//! cubecl's compilers report unsupported input with a typed error, but some
//! of their passes still `expect` on what they consider impossible. A
//! translation runs under `catch_unwind` so that a kernel cubecl cannot
//! compile is [`Error::Compile`], never a panic in the caller.

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

/// A cubecl kernel translated for one target: the scope [`Kernel`] and what
/// a launch needs to pack its arguments.
#[derive(Clone, Debug)]
pub struct CubeKernel {
    pub(crate) kernel: Kernel,
    pub(crate) target: Target,
    /// The compiler's answer for each buffer, by position.
    pub(crate) io: Vec<BufferIOAttr>,
    /// The info struct's layout (scalars by type, buffer lengths).
    pub(crate) info: Info,
    pub(crate) address_type: AddressType,
    /// Bytes of workgroup (shared) memory the compiled kernel declares.
    pub(crate) shared_memory: usize,
    /// Bytes of one element of each buffer, by position, as the kernel
    /// declares it (a vector counts as one element): the unit of the
    /// lengths its bounds checks read.
    pub(crate) element_bytes: Vec<Option<u64>>,
}

impl CubeKernel {
    /// The scope kernel: source, entry point and block size.
    ///
    /// # Safety
    ///
    /// Every launch of it (or of a clone) that [`launch`](Self::launch)
    /// does not make passes the scalar blob [`pack`](Self::pack) made for
    /// the same arguments. The kernel's bounds checks read each buffer's
    /// length from that blob, so a blob naming more elements than a binding
    /// holds lets a CUDA, HIP or SPIR-V kernel write past it (WGSL from a
    /// checked definition stays inside its bindings regardless: it is not
    /// vouched in bounds, so the server checks it too).
    pub unsafe fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// The scope kernel's id, to tell which cube kernel a `Kernel` is.
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

    /// How the kernel uses buffer `index`, by the compiler's own analysis:
    /// the access a launch must declare at least. A buffer the kernel never
    /// touches is `Read`, the answer that claims nothing.
    pub fn access(&self, index: usize) -> Option<Access> {
        self.io.get(index).map(|io| io_access(*io))
    }

    /// The compiler's answer for every buffer, by position: what a runtime
    /// that binds the kernel itself stages its read and write sets from.
    pub fn buffer_io(&self) -> &[BufferIOAttr] {
        &self.io
    }

    /// Bytes of workgroup (shared) memory the compiled kernel declares:
    /// what [`launch`](Self::launch) holds against the device's
    /// `max_workgroup_memory` before anything runs.
    pub fn shared_memory(&self) -> usize {
        self.shared_memory
    }

    /// Whether it takes an info struct (scalars, buffer lengths), packed as
    /// the scalar blob. Without one, a launch passes no blob.
    pub fn has_info(&self) -> bool {
        self.info.has_info()
    }

    /// Whether a launch binds cubecl's tensor metadata (shapes and strides)
    /// as one more read-only buffer, after the kernel's own.
    ///
    /// So it is for a C++ (CUDA, HIP) kernel that reads shapes or strides:
    /// compiled with `grid_constants`, its parameters are the buffers, then
    /// a pointer to the dynamic metadata, then the info struct by value —
    /// exactly a scope launch whose last binding is the metadata and whose
    /// blob is the info struct without it ([`split_info`](Self::split_info)).
    /// A WGSL or SPIR-V kernel reads the metadata from the info itself, so
    /// the whole info is its blob. Launched with the metadata missing, a
    /// C++ kernel would take the blob for a pointer: the driver's parameter
    /// check refuses that where it can, and nothing can where it cannot.
    pub fn binds_tensor_metadata(&self) -> bool {
        self.info.has_dynamic_meta && matches!(self.target, Target::Cuda | Target::Hip)
    }

    /// cubecl's info words (`MetadataBindingInfo::data`, with its
    /// `dynamic_metadata_offset`) as this kernel's launch takes them: the
    /// scalar blob, and, where [`binds_tensor_metadata`](Self::binds_tensor_metadata),
    /// the words of the metadata binding. An offset past the end is read as
    /// the end (no dynamic part).
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

    /// The scalars it takes, as (type, count) in the order the info struct
    /// holds them (grouped by type).
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

/// The name people see: the entry point without cubecl's `_<8 hex>` build
/// hash, so reports stay stable across builds.
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

/// What a compiler produced, before it becomes a [`Kernel`].
enum Output {
    Text(String),
    Words(Vec<u32>),
}

/// What one compiler produced: the source, each buffer's access, the size
/// of the SPIR-V push-constant block (`None` for a uniform address table,
/// or another target), and the workgroup memory declared.
struct Compiled {
    output: Output,
    io: Vec<BufferIOAttr>,
    immediate: Option<usize>,
    shared_memory: usize,
}

/// Translate `kernel` (a definition made with [`Target::settings`] and
/// [`Target::device_properties`] of the same target) into the language of
/// `target`. `kernel` may be a trait object (`&dyn CubeKernel`), as a
/// runtime's launcher holds it.
///
/// # Errors
///
/// [`Error::Compile`] when the kernel's expansion panics, the cubecl
/// compiler refuses or panics, or the kernel needs an argument model the
/// scope convention cannot express (tensor metadata).
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
    // What makes the result safe to launch is the bounds checks a checked
    // definition gets (`translate_definition`); an unchecked one has none.
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
    // `Args` packs buffers and scalars; a runtime that packs cubecl's whole
    // info struct itself (dynamic metadata included) uses `translate_definition`.
    if definition.info.has_dynamic_meta {
        return Err(compile_error(
            &name,
            "the kernel takes tensor metadata (shapes and strides); scope-cube packs buffers and \
             scalars only"
                .to_owned(),
        ));
    }
    // SAFETY: the definition is in checked mode (refused above otherwise),
    // which `translate_definition` asks nothing more of: it clamps every
    // index itself, and vouches for nothing.
    unsafe { translate_definition(definition, target, &Translation::default()) }
        .map_err(|e| compile_error(&name, e.to_string()))
}

/// Compile an expanded cubecl kernel definition into the language of
/// `target` — the half of [`translate`] a cubecl runtime needs, since its
/// launcher has already expanded the kernel (and built the info struct,
/// tensor metadata included, which the caller then packs whole as the
/// scalar blob).
///
/// # Errors
///
/// cubecl's own [`CompilationError`], typed, so that a runtime can tell a
/// refusal from a failure: the compiler's error as it gave it, and a
/// compiler panic or an output of the wrong kind as
/// [`CompilationError::Generic`].
///
/// # What is checked
///
/// A definition in [`ExecutionMode::Checked`] gets its bounds checks here,
/// before the compiler sees it: every index into a buffer, a workgroup
/// (shared) array or a local array is clamped to that array (see
/// `checks.rs` for why cubecl's own checked mode cannot be relied on: in
/// 0.12.0-pre.1 it clamps no index at all, and it never meant to clamp a
/// workgroup array's). A kernel with an index no check can bound is
/// refused. Its WGSL is still not vouched for
/// ([`Kernel::vouch_in_bounds`]): what the servers check (naga's bounds
/// checks, wgpu's) stays on, so a gap in cubecl's IR this crate has not
/// seen cannot reach a neighbouring buffer through a WGSL server, and its
/// loops stay bounded too.
///
/// # Safety
///
/// A definition in [`ExecutionMode::Checked`] needs nothing more. A
/// definition in any other mode gets no checks, so the caller promises what
/// cubecl's `launch_unchecked` promises: every launch of the translated
/// kernel indexes only inside the bindings it is given and the workgroup
/// and local arrays it declares, and ends every loop. The result is vouched
/// for accordingly ([`Kernel::vouch_in_bounds`],
/// [`Kernel::vouch_terminates`]), so a WGSL server drops its own checks.
pub unsafe fn translate_definition(
    definition: KernelDefinition,
    target: Target,
    translation: &Translation,
) -> std::result::Result<CubeKernel, CompilationError> {
    // Read before compiling: the compilers consume the definition, and the
    // entry point carries a hash of this build's kernel id.
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
    // SAFETY (for the kernels below): the module is cubecl's own compiler
    // output for `target`. From a definition in `ExecutionMode::Checked`
    // (what `translate` requires, `Target::settings`), every index into a
    // buffer was clamped above (`checks::clamp_indices`) to the length the
    // launch's info struct gives for that buffer, and `CubeKernel::pack`
    // puts each binding's own length there; every index into a workgroup
    // or local array, to the array's length. So a launch of it touches only
    // the bindings it is given and its own arrays. From any other mode,
    // that is this function's caller's promise (its `# Safety`).
    let checked = mode == ExecutionMode::Checked;
    let kernel = match (target, output) {
        (Target::Cuda, Output::Text(source)) => {
            // SAFETY: see above.
            // SAFETY: see above; cubecl gathers every shared array into
            // one dynamic buffer of `shared_memory` bytes.
            unsafe { Kernel::cuda(name.as_str(), source).dynamic_shared_memory(shared_bytes) }
                .entry(entry)
                .block(block)
        }
        (Target::Hip, Output::Text(source)) => {
            // SAFETY: see above.
            // SAFETY: as for CUDA.
            unsafe { Kernel::hip(name.as_str(), source).dynamic_shared_memory(shared_bytes) }
                .entry(entry)
                .block(block)
        }
        (Target::Wgsl, Output::Text(source)) => {
            let kernel = Kernel::wgsl(name.as_str(), source).entry(entry);
            if checked {
                // No vouch: the server keeps its bounds checks and its loop
                // bound. The clamps above are this crate's reading of
                // cubecl's IR, and cubecl's own checked mode has already
                // been found to check nothing (`checks.rs`); a vouch rests
                // on them alone only where nothing else can check — the
                // other languages. Nothing promised the loops end either.
                kernel
            } else {
                // SAFETY: outside checked mode, the caller promised that
                // every access stays inside the bindings and arrays it
                // indexes, and that every loop ends (this function's
                // `# Safety`): what the two checks would enforce.
                unsafe { kernel.vouch_in_bounds().vouch_terminates() }
            }
        }
        (Target::SpirV, Output::Words(words)) => {
            // Addresses that fit in push constants go there (`immediate`
            // is their size); more go in a uniform table at set 0, binding
            // 0, which the Vulkan server binds too.
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
