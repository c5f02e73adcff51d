//! Kernels: NVRTC and PTX to a loaded module, and launches.
//!
//! **Compiling.** NVRTC targets the device's `compute_XY`, clamped to the newest it knows, so a
//! newer device still gets PTX it can JIT. A refused source or PTX is [`Error::Compile`] with the
//! compiler's or the JIT's log. PTX newer than the driver is
//! [`UnsupportedPtx`](crate::UnsupportedPtx), naming the versions and the fix.
//!
//! **Parameters** follow the rules shared with HIP ([`scope_native`]). Where the driver has
//! `cuFuncGetParamInfo` (12.4+), a launch that does not match the kernel's list is refused before
//! it runs. Without it, arguments are padded with zeros to the most a kernel can declare, so none
//! reads past the caller's bytes ([`ParamTable`](scope_native::ParamTable)).
//!
//! **Graphs own their kernels.** A captured launch's module is kept loaded by the
//! [`CudaGraph`](crate::CudaGraph): a replay never runs an unloaded function.
//!
//! **Indirect dispatch** reads the counts back to the host: CUDA has no indirect launch. Inside a
//! capture window it is [`Error::Launch`], which dooms the window.

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

/// The classic kernel parameter space: the blob's limit without `cuFuncGetParamInfo`.
const PARAM_SPACE: usize = 4096;

/// The most parameter bytes any kernel can declare (32,764 since CUDA 12.1), rounded up.
const MAX_PARAM_BYTES: usize = 32 * 1024;

/// The most parameters any kernel can declare: each takes a byte at least.
const MAX_PARAMS: usize = MAX_PARAM_BYTES;

/// CUDA's numbers for the launch rules shared with HIP ([`scope_native`]):
/// - Bindings: [`MAX_PARAMS`], the blob counted as one.
/// - Scalars: [`MAX_PARAM_BYTES`] where the driver reports parameters, else [`PARAM_SPACE`].
/// - Grid: the device's, since CUDA counts blocks, not threads, per axis.
/// - `f16` from compute capability 5.3, where it is native.
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
        // SAFETY: unloaded once, after every kernel and graph holding the `Arc<Module>`.
        if let Err(e) = unsafe { sys::cuModuleUnload(self.raw) }.result() {
            tracing::warn!("cuda: unloading a module: {e}");
        }
    }
}

/// A compiled kernel: the core's [`Backend::Kernel`](scope_core::Backend::Kernel).
pub struct CudaKernel {
    function: sys::CUfunction,
    /// Keeps `function` loaded; a recorded launch clones it into the graph.
    pub(crate) module: Arc<Module>,
    name: Arc<str>,
    block: [u32; 3],
    /// Dynamic shared memory each launch gets (`sharedMemBytes`).
    shared: u32,
    /// Byte size of each parameter, when the driver can tell.
    params: Option<Vec<usize>>,
}

// SAFETY: a function handle works on any thread; `module` keeps it loaded.
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

/// Whether the driver exports `cuFuncGetParamInfo`: cudarc panics on a missing symbol.
fn has_param_info() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        // SAFETY: the driver is loaded (a backend exists); a lookup calls nothing.
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

/// The newest of `supported` not newer than the device; else the oldest, for the JIT to refuse.
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

/// The NVRTC version the server compiles with (`nvrtcVersion`). Its PTX needs a driver that new
/// ([`CudaVersion::ptx_isa`](crate::CudaVersion::ptx_isa)).
///
/// # Errors
///
/// [`Error::BackendUnavailable`] when NVRTC is missing or silent.
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

struct Program(nvrtc::sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created once by `create_program`, destroyed once here.
        let _ = unsafe { nvrtc::result::destroy_program(self.0) };
    }
}

/// The options the server gives NVRTC for `arch` (`compute_90`): the architecture alone.
pub fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![format!("--gpu-architecture={arch}")]
}

/// The PTX NVRTC makes of CUDA C++ `kernel` for `arch`, exactly as the server would, with no driver
/// or device: for checking kernels ahead of a GPU run.
///
/// # Errors
///
/// [`Error::BackendUnavailable`] without NVRTC; [`Error::Compile`] with NVRTC's log, or when
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

    /// Load NUL-terminated PTX as a module, with the JIT's log on failure. PTX too new for the
    /// driver is [`UnsupportedPtx`](crate::UnsupportedPtx).
    fn load_module(&self, kernel: &Kernel, image: &[u8], from_nvrtc: bool) -> Result<Module> {
        let mut log = vec![0 as c_char; 16 * 1024];
        let mut options = [
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut values: [*mut c_void; 2] =
            [log.as_mut_ptr().cast::<c_void>(), log.len() as *mut c_void];
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `image` is NUL-terminated; two options, two values; the log outlives the call.
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
                // Name both versions and the fix, not the bare code.
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

    /// [`Backend::launch`](scope_core::Backend::launch), under its safety contract: all it names is
    /// this backend's and alive, each range (an indirect dispatch's 12 bytes too) lies inside its
    /// memory, counts fit the grid, and
    /// [`Backend::check_launch`](scope_core::Backend::check_launch) accepted it.
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
                // SAFETY: the 12 bytes lie in live `memory` (contract); `stream` is not recording.
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
                // SAFETY: `kernel` and any recording hold the module, so `function` is loaded.
                // `args` has a pointer per declared parameter (checked where `exact`, else padded),
                // each to enough live bytes. Bindings lie in live memory (`Backend::launch`);
                // `shared` fits the block's limit (checked at compile).
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

/// What [`Backend::check_launch`](scope_core::Backend::check_launch) holds a launch to:
/// [`scope_native::check_launch`], and the kernel's own parameters where known.
pub(crate) fn check_launch(
    limits: &scope_core::LaunchLimits,
    kernel: &CudaKernel,
    launch: &Launch<'_, CudaMemory>,
) -> Result<()> {
    scope_native::check_launch(limits, kernel.block, kernel.params.as_deref(), launch)
}

fn param_sizes(function: sys::CUfunction) -> Vec<usize> {
    let mut sizes = Vec::new();
    for index in 0..1024 {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `function` is loaded; past the last parameter the driver answers an error.
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
        // NVRTC 12.2 knows nothing past sm_90: a newer device gets compute_90.
        let nvrtc_12_2 = [50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90];
        assert_eq!(pick_arch((8, 0), &nvrtc_12_2), 80);
        assert_eq!(pick_arch((9, 0), &nvrtc_12_2), 90);
        assert_eq!(pick_arch((10, 0), &nvrtc_12_2), 90);
        let nvrtc_13 = [75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121];
        assert_eq!(pick_arch((9, 0), &nvrtc_13), 90);
        assert_eq!(pick_arch((8, 9), &nvrtc_13), 89);
        assert_eq!(pick_arch((13, 0), &nvrtc_13), 121);
        // A device older than every arch gets the oldest, for the JIT to refuse.
        assert_eq!(pick_arch((6, 1), &nvrtc_13), 75);
        assert_eq!(pick_arch((9, 0), &[]), 90);
    }
}
