//! Kernels: NVRTC and PTX to a loaded module, and launches.
//!
//! **Compiling.** CUDA C++ goes through NVRTC for `compute_XY`, where `XY`
//! is the device's compute capability clamped to the newest architecture
//! this NVRTC knows (`nvrtcGetSupportedArchs`), so a device newer than the
//! compiler still gets PTX it can JIT. PTX (ours or the caller's) is loaded
//! with `cuModuleLoadDataEx`, asking for the JIT's error log. A source
//! NVRTC rejects is [`Error::Compile`] with NVRTC's log; a PTX the JIT
//! rejects is [`Error::Compile`] with the JIT's, except a PTX of a newer ISA
//! version than the driver JITs (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`):
//! that is [`UnsupportedPtx`](crate::UnsupportedPtx), naming the driver's
//! version, the PTX's, the NVRTC that wrote it and the fix. The entry point is looked up
//! by name, so it must be `extern "C"`. The core caches compiled kernels by
//! [`Kernel::id`], so each source is compiled once per server.
//!
//! **Parameters**, per the binding convention: the bindings' device pointers
//! (advanced by the binding's offset), in order, then the scalar blob by value
//! when it is non-empty — the rules CUDA shares with HIP, in
//! [`scope_native`]. Where the driver has `cuFuncGetParamInfo` (12.4+)
//! the kernel's own parameter list is read at compile time and a launch whose
//! bindings or blob do not match it is refused before anything runs; without
//! it, the parameter array and the blob are padded with zeros to the most any
//! kernel can declare, so that a kernel declaring more parameters or a larger
//! struct reads zeros, never past the caller's bytes
//! ([`ParamTable`](scope_native::ParamTable)).
//!
//! **Graphs own their kernels.** A launch recorded into a capture keeps the
//! kernel's module (an `Arc`) in the recording, and the sealed
//! [`CudaGraph`](crate::CudaGraph) keeps it loaded for as long as it lives:
//! a kernel dropped meanwhile never leaves a graph replaying a function of
//! an unloaded module.
//!
//! **Indirect dispatch** reads the three counts back to the host (a DMA and a
//! stream sync: the launch waits for the stream's earlier work) and launches
//! with them; CUDA has no indirect launch. For the same reason it cannot be
//! captured: inside a window it is refused with [`Error::Launch`], which
//! dooms the window.

use std::ffi::{CString, c_char, c_void};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{self, CUresult};
use cudarc::nvrtc;
use scope_core::backend::{BoundDispatch, Launch};
use scope_core::{Error, Kernel, KernelSource, Result};
use scope_native::{ApiRules, c_chars};
use smallvec::SmallVec;

use crate::error::{BACKEND, Doing, classify};
use crate::{Cuda, CudaMemory, CudaStreamState};

/// The classic kernel parameter space. Without `cuFuncGetParamInfo` a
/// longer blob is refused.
const PARAM_SPACE: usize = 4096;

/// The most bytes of parameters any kernel can declare (32,764 since CUDA
/// 12.1 on Volta and later), rounded up.
const MAX_PARAM_BYTES: usize = 32 * 1024;

/// The most parameters any kernel can declare: each takes a byte at least.
const MAX_PARAMS: usize = MAX_PARAM_BYTES;

/// CUDA's numbers for the launch rules it shares with HIP
/// ([`scope_native`]), on a device of `capability`:
///
/// - Bindings: [`MAX_PARAMS`] parameters, the blob counted as one.
/// - Scalars: where the driver reports each kernel's parameters, the most
///   bytes any kernel can declare ([`MAX_PARAM_BYTES`]; the blob must also
///   match the kernel's own parameter); without that report, the classic
///   [`PARAM_SPACE`], which is all the padded launch passes.
/// - Grid: the device's, unbounded by the block (CUDA counts blocks, not
///   threads, per axis).
/// - 16-bit float arithmetic from compute capability 5.3, where
///   `cuda_fp16.h` and PTX's `.f16` instructions have it natively.
pub(crate) fn api_rules(capability: (i32, i32)) -> ApiRules {
    ApiRules {
        max_params: MAX_PARAMS,
        max_scalar_bytes: if has_param_info() {
            MAX_PARAM_BYTES
        } else {
            PARAM_SPACE
        },
        max_param_bytes: MAX_PARAM_BYTES,
        grid_threads_within_u32: false,
        f16: capability >= (5, 3),
    }
}

/// A loaded module, unloaded when the last kernel or graph holding it goes.
pub(crate) struct Module {
    raw: sys::CUmodule,
    ctx: Arc<cudarc::driver::CudaContext>,
}

// SAFETY: a module handle is usable from any thread with its context current.
unsafe impl Send for Module {}
// SAFETY: as above; it is only read after loading.
unsafe impl Sync for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: loaded once, unloaded once, after every kernel from it and
        // every graph that launches one (each holds the `Arc<Module>`) is
        // gone.
        if let Err(e) = unsafe { sys::cuModuleUnload(self.raw) }.result() {
            tracing::warn!("cuda: unloading a module: {e}");
        }
    }
}

/// A compiled kernel: the core's [`Backend::Kernel`](scope_core::Backend::Kernel).
pub struct CudaKernel {
    function: sys::CUfunction,
    /// Keeps `function` loaded; a recorded launch of it clones it into the
    /// graph.
    pub(crate) module: Arc<Module>,
    name: Arc<str>,
    block: [u32; 3],
    /// Dynamic shared memory each launch gets (`sharedMemBytes`).
    shared: u32,
    /// Byte size of each parameter, when the driver can tell.
    params: Option<Vec<usize>>,
}

// SAFETY: a function handle is usable from any thread with its context
// current; the module it lives in is kept loaded by `module`.
unsafe impl Send for CudaKernel {}

impl CudaKernel {
    /// The raw function handle, for a raw-API baseline.
    pub fn raw_function(&self) -> sys::CUfunction {
        self.function
    }

    /// The block size it launches with.
    pub fn block(&self) -> [u32; 3] {
        self.block
    }
}

fn compile_error(kernel: &Kernel, log: impl Into<String>) -> Error {
    Error::Compile {
        backend: BACKEND,
        kernel: kernel.name().clone(),
        log: log.into(),
    }
}

/// Whether the loaded driver exports `cuFuncGetParamInfo`; cudarc would
/// panic calling a symbol the library lacks.
fn has_param_info() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        // SAFETY: the driver library is loaded (a backend exists); looking a
        // symbol up calls nothing.
        unsafe {
            sys::culib()
                .get::<unsafe extern "C" fn()>(b"cuFuncGetParamInfo\0")
                .is_ok()
        }
    })
}

/// The `compute_XY` NVRTC should target for a device of `capability`.
pub(crate) fn nvrtc_arch(capability: (i32, i32)) -> Result<String> {
    let fail = |e: nvrtc::result::NvrtcError| Error::BackendUnavailable {
        backend: BACKEND,
        reason: format!("NVRTC could not list its architectures: {e}"),
    };
    let mut count = 0;
    // SAFETY: NVRTC is loaded (callers check presence); `count` is one int.
    unsafe { nvrtc::sys::nvrtcGetNumSupportedArchs(&mut count) }
        .result()
        .map_err(fail)?;
    let mut archs = vec![0i32; usize::try_from(count).unwrap_or(0)];
    if !archs.is_empty() {
        // SAFETY: `archs` holds the `count` ints NVRTC writes.
        unsafe { nvrtc::sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
            .result()
            .map_err(fail)?;
    }
    Ok(format!("compute_{}", pick_arch(capability, &archs)))
}

/// The newest of `supported` not newer than the device; the oldest if all
/// are newer (the JIT then says why it cannot load).
pub(crate) fn pick_arch(capability: (i32, i32), supported: &[i32]) -> i32 {
    let device = capability.0 * 10 + capability.1;
    supported
        .iter()
        .copied()
        .filter(|&a| a <= device)
        .max()
        .or_else(|| supported.iter().copied().min())
        .unwrap_or(device)
}

/// The version of the NVRTC the server compiles with (`nvrtcVersion`):
/// the PTX it writes is of that release's ISA
/// ([`CudaVersion::ptx_isa`](crate::CudaVersion::ptx_isa)), which only a
/// driver of that CUDA version or newer JITs.
///
/// # Errors
///
/// [`Error::BackendUnavailable`] when NVRTC cannot be loaded here or does
/// not answer.
pub fn nvrtc_version() -> Result<crate::CudaVersion> {
    if !crate::device::nvrtc_present() {
        return Err(Error::BackendUnavailable {
            backend: BACKEND,
            reason: "NVRTC (libnvrtc) was not found here".to_owned(),
        });
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (checked above); two ints for it to write.
    unsafe { nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| Error::BackendUnavailable {
            backend: BACKEND,
            reason: format!("nvrtcVersion: {e}"),
        })?;
    match (u32::try_from(major), u32::try_from(minor)) {
        (Ok(major), Ok(minor)) => Ok(crate::CudaVersion::new(major, minor)),
        _ => Err(Error::BackendUnavailable {
            backend: BACKEND,
            reason: format!("nvrtcVersion answered {major}.{minor}"),
        }),
    }
}

/// NVRTC program, destroyed on drop.
struct Program(nvrtc::sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created once by `create_program`, destroyed once here.
        let _ = unsafe { nvrtc::result::destroy_program(self.0) };
    }
}

/// The options the server gives NVRTC when it compiles for `arch`
/// (`compute_90`): the architecture and nothing else.
pub fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![format!("--gpu-architecture={arch}")]
}

/// The PTX NVRTC makes of `kernel`, a CUDA C++ kernel, for `arch`
/// (`compute_80`), exactly as the server compiles it when it loads the
/// kernel — the same options ([`nvrtc_options`]), program name and errors
/// — but with no driver or device: for checking kernels against the real
/// compiler ahead of a GPU run (`tests/toolchain.rs` does, and assembles
/// the PTX with `ptxas`).
///
/// # Errors
///
/// [`Error::BackendUnavailable`] when NVRTC cannot be loaded here;
/// [`Error::Compile`] with NVRTC's log when it refuses the source, or when
/// `kernel` is not CUDA C++.
pub fn nvrtc_ptx(kernel: &Kernel, arch: &str) -> Result<String> {
    let KernelSource::Cuda(source) = kernel.source() else {
        return Err(compile_error(
            kernel,
            format!(
                "NVRTC compiles CUDA C++, not {}",
                kernel.source().language()
            ),
        ));
    };
    if !crate::device::nvrtc_present() {
        return Err(Error::BackendUnavailable {
            backend: BACKEND,
            reason: "NVRTC (libnvrtc) was not found here".to_owned(),
        });
    }
    let mut ptx = nvrtc_compile(kernel, source, arch)?;
    ptx.pop(); // the NUL the driver needs
    String::from_utf8(ptx).map_err(|_| compile_error(kernel, "NVRTC's PTX is not UTF-8"))
}

/// CUDA C++ to NUL-terminated PTX.
fn nvrtc_compile(kernel: &Kernel, source: &str, arch: &str) -> Result<Vec<u8>> {
    let src = CString::new(source)
        .map_err(|_| compile_error(kernel, "the source contains a NUL byte"))?;
    let program = nvrtc::result::create_program(&src, Some(c"scope_kernel.cu"))
        .map(Program)
        .map_err(|e| compile_error(kernel, format!("nvrtcCreateProgram: {e}")))?;
    let options = nvrtc_options(arch);
    // SAFETY: `program` is live until the end of this function.
    let compiled = unsafe { nvrtc::result::compile_program(program.0, &options) };
    // SAFETY: as above.
    let log = unsafe { nvrtc::result::get_program_log(program.0) }
        .map(|chars| c_chars(&chars))
        .unwrap_or_default();
    if let Err(e) = compiled {
        return Err(compile_error(
            kernel,
            format!("{}\n(nvrtc: {e}, {})", log.trim_end(), options.join(" ")),
        ));
    }
    if !log.trim().is_empty() {
        tracing::debug!(kernel = %kernel.name(), "nvrtc: {log}");
    }
    // SAFETY: as above; the program compiled.
    let ptx = unsafe { nvrtc::result::get_ptx(program.0) }
        .map_err(|e| compile_error(kernel, format!("nvrtcGetPTX: {e}")))?;
    let mut bytes: Vec<u8> = ptx
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    bytes.push(0);
    Ok(bytes)
}

impl Cuda {
    pub(crate) fn compile_kernel(&mut self, kernel: &Kernel) -> Result<CudaKernel> {
        let (image, from_nvrtc): (Vec<u8>, bool) = match kernel.source() {
            KernelSource::Cuda(source) => {
                let Some(arch) = &self.nvrtc_arch else {
                    return Err(compile_error(
                        kernel,
                        "NVRTC (libnvrtc) was not found here; only PTX kernels can be loaded",
                    ));
                };
                (nvrtc_compile(kernel, source, arch)?, true)
            }
            KernelSource::Ptx(ptx) => (
                CString::new(ptx.as_bytes())
                    .map_err(|_| compile_error(kernel, "the PTX contains a NUL byte"))?
                    .into_bytes_with_nul(),
                false,
            ),
            other => {
                return Err(compile_error(
                    kernel,
                    format!("cuda takes CUDA C++ and PTX, not {}", other.language()),
                ));
            }
        };
        let block = kernel.block_size();
        if block.contains(&0) {
            return Err(Error::invalid(
                "block size",
                format!("{block:?} has a zero dimension"),
            ));
        }
        let shared = scope_native::dynamic_shared_memory(kernel, &self.limits)?;
        self.bind()?;
        let module = Arc::new(self.load_module(kernel, &image, from_nvrtc)?);
        let entry = CString::new(kernel.entry_point())
            .map_err(|_| compile_error(kernel, "the entry point contains a NUL byte"))?;
        let mut function: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: `module` is loaded; `function` receives one handle.
        let found = unsafe { sys::cuModuleGetFunction(&mut function, module.raw, entry.as_ptr()) };
        if found == CUresult::CUDA_ERROR_NOT_FOUND {
            return Err(compile_error(
                kernel,
                format!(
                    "no kernel named `{}` in the module (is it `extern \"C\" __global__`?)",
                    kernel.entry_point()
                ),
            ));
        }
        found.result().map_err(|e| {
            classify(
                e.0,
                Doing::Load {
                    kernel: kernel.name(),
                },
            )
        })?;
        let params = has_param_info().then(|| param_sizes(function));
        Ok(CudaKernel {
            function,
            module,
            name: kernel.name().clone(),
            block,
            shared,
            params,
        })
    }

    /// Load `image` (NUL-terminated PTX; written by NVRTC when
    /// `from_nvrtc`) as a module, with the JIT's log on failure, and a PTX
    /// too new for the driver as [`UnsupportedPtx`](crate::UnsupportedPtx).
    fn load_module(&self, kernel: &Kernel, image: &[u8], from_nvrtc: bool) -> Result<Module> {
        let mut log = vec![0 as c_char; 16 * 1024];
        let mut options = [
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut values: [*mut c_void; 2] =
            [log.as_mut_ptr().cast::<c_void>(), log.len() as *mut c_void];
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `image` is NUL-terminated PTX; the option arrays have two
        // entries each; the log buffer holds the size passed and outlives
        // the call.
        let loaded = unsafe {
            sys::cuModuleLoadDataEx(
                &mut raw,
                image.as_ptr().cast::<c_void>(),
                2,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        match loaded.result() {
            Ok(()) => Ok(Module {
                raw,
                ctx: self.ctx.clone(),
            }),
            Err(e) if e.0 == CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION => {
                // The PTX is newer than the driver: name both versions and
                // the fix rather than the bare code.
                let text = std::str::from_utf8(image.strip_suffix(&[0]).unwrap_or(image));
                Err(Error::external(crate::UnsupportedPtx {
                    kernel: kernel.name().clone(),
                    ptx_isa: text.ok().and_then(crate::PtxIsa::of),
                    driver: crate::device::cuda_driver_version().ok(),
                    nvrtc: if from_nvrtc {
                        nvrtc_version().ok()
                    } else {
                        None
                    },
                    log: c_chars(&log).trim_end().to_owned(),
                }))
            }
            Err(e) => match classify(
                e.0,
                Doing::Load {
                    kernel: kernel.name(),
                },
            ) {
                Error::Compile {
                    backend,
                    kernel,
                    log: code,
                } => Err(Error::Compile {
                    backend,
                    kernel,
                    log: format!("{}\n({code})", c_chars(&log).trim_end()),
                }),
                other => Err(other),
            },
        }
    }

    /// [`Backend::launch`](scope_core::Backend::launch).
    ///
    /// # Safety
    ///
    /// The contract of `Backend::launch`: `stream`, `kernel` and every
    /// memory in `launch` are this backend's and alive; every binding's
    /// range lies inside its memory, and an indirect dispatch's 12 bytes
    /// inside theirs; host-given counts are within the grid, and
    /// [`Backend::check_launch`](scope_core::Backend::check_launch)
    /// accepted this launch for this kernel.
    pub(crate) unsafe fn launch_kernel(
        &mut self,
        stream: &mut CudaStreamState,
        kernel: &CudaKernel,
        launch: &Launch<'_, CudaMemory>,
    ) -> Result<()> {
        self.bind()?;
        let id = stream.id();
        let name = &kernel.name;
        let refuse = |detail: String| Error::Launch {
            kernel: name.clone(),
            stream: id,
            detail,
        };
        let groups = match &launch.dispatch {
            BoundDispatch::Groups(groups) => *groups,
            BoundDispatch::Indirect { memory, offset } => {
                if stream.recording.is_some() {
                    return Err(refuse(
                        "indirect dispatch cannot be captured on CUDA: the counts are read back to the host when the launch is issued"
                            .to_owned(),
                    ));
                }
                let mut counts = [0u8; 12];
                // SAFETY: the contract of `Backend::launch`: the indirect
                // dispatch's 12 bytes at `offset` lie inside `memory`, which
                // is this backend's and alive, as is `stream`, which is not
                // recording (checked above).
                unsafe { self.read_bytes(stream, memory, *offset, &mut counts)? };
                scope_native::indirect_counts(counts)
            }
        };
        if !scope_native::runs_anything(groups, &self.limits) {
            return Ok(());
        }
        let pointers: SmallVec<[u64; 8]> = launch
            .bindings
            .iter()
            .map(|b| b.memory.device_ptr() + b.offset)
            .collect();
        if let Some(recording) = &mut stream.recording {
            recording.keep_module(&kernel.module);
        }
        let [bx, by, bz] = kernel.block;
        let shared = kernel.shared;
        let cu_stream = stream.shared.cu.cu_stream();
        let exact = kernel.params.is_some();
        let launched = self
            .params
            .launch(&pointers, launch.scalars, exact, |args| {
                // SAFETY: `function` is loaded while `kernel` lives (it holds
                // the module), and a recording that captures this launch holds
                // the module too (kept just above), so a replay never meets an
                // unloaded one; `args` holds a pointer for every parameter the
                // kernel declares — checked against its own list where the
                // driver can tell (`exact`), and otherwise padded to the most any
                // kernel can declare — each pointing at as many readable bytes
                // as that parameter can be long, alive until the call returns
                // (the driver copies parameters at launch). The device pointers
                // lie inside their allocations: the contract of `Backend::launch`
                // puts every binding's range inside its live memory. `shared`
                // is what the kernel declared it uses (`Kernel::
                // dynamic_shared_memory`), within the block's limit (checked
                // at compile).
                unsafe {
                    sys::cuLaunchKernel(
                        kernel.function,
                        groups[0],
                        groups[1],
                        groups[2],
                        bx,
                        by,
                        bz,
                        shared,
                        cu_stream,
                        args.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                }
            })?;
        launched.result().map_err(|e| {
            classify(
                e.0,
                Doing::Launch {
                    kernel: name,
                    stream: id,
                },
            )
        })?;
        for binding in launch.bindings {
            stream.touch(binding.memory);
        }
        if let BoundDispatch::Indirect { memory, .. } = &launch.dispatch {
            stream.touch(memory);
        }
        Ok(())
    }
}

/// What [`Backend::check_launch`](scope_core::Backend::check_launch) holds a
/// CUDA launch to before its scope opens: the rules CUDA shares with HIP
/// ([`scope_native::check_launch`]) against `limits`, the backend's launch
/// limits, and — where the driver reports the kernel's parameters — the
/// kernel's own parameter list.
pub(crate) fn check_launch(
    limits: &scope_core::LaunchLimits,
    kernel: &CudaKernel,
    launch: &Launch<'_, CudaMemory>,
) -> Result<()> {
    scope_native::check_launch(limits, kernel.block, kernel.params.as_deref(), launch)
}

/// The byte size of each of `function`'s parameters.
fn param_sizes(function: sys::CUfunction) -> Vec<usize> {
    let mut sizes = Vec::new();
    for index in 0..1024 {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `function` is loaded; the driver answers INVALID_VALUE past
        // the last parameter, which ends the loop.
        let answer = unsafe { sys::cuFuncGetParamInfo(function, index, &mut offset, &mut size) };
        if answer != CUresult::CUDA_SUCCESS {
            break;
        }
        sizes.push(size);
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::pick_arch;

    #[test]
    fn the_arch_is_the_newest_the_compiler_knows_not_newer_than_the_device() {
        // NVRTC 12.2 (the bundle's) knows nothing past sm_90: a newer
        // device gets compute_90, which its driver JITs.
        let nvrtc_12_2 = [50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90];
        assert_eq!(pick_arch((8, 0), &nvrtc_12_2), 80);
        assert_eq!(pick_arch((9, 0), &nvrtc_12_2), 90);
        assert_eq!(pick_arch((10, 0), &nvrtc_12_2), 90);
        let nvrtc_13 = [75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121];
        assert_eq!(pick_arch((9, 0), &nvrtc_13), 90);
        assert_eq!(pick_arch((8, 9), &nvrtc_13), 89);
        // A device newer than the compiler gets the newest PTX, for the JIT.
        assert_eq!(pick_arch((13, 0), &nvrtc_13), 121);
        // A device older than every arch gets the oldest; the JIT refuses it
        // with a message rather than the compiler guessing.
        assert_eq!(pick_arch((6, 1), &nvrtc_13), 75);
        assert_eq!(pick_arch((9, 0), &[]), 90);
    }
}
