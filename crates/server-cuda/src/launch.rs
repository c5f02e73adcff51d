//! Kernels: a loaded module's function, and launches.
//!
//! **Compiling.** CUDA C++ goes through NVRTC (`nvrtc.rs`), PTX straight to the driver's JIT
//! (`module.rs`); this file finds the entry point and reads the kernel's parameters. A kernel not
//! in the module is [`Error::Compile`], asking whether it is `extern "C"`.
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

use std::ffi::CString;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{self, CUresult};
use scope_core::backend::{BoundDispatch, Launch};
use scope_core::{Error, Kernel, KernelSource, Result};
use scope_native::ApiRules;
use smallvec::SmallVec;

use crate::Cuda;
use crate::device::CudaStreamState;
use crate::error::{Doing, classify};
use crate::module::Module;
use crate::nvrtc::{compile_error, nvrtc_compile};
use crate::pool::CudaMemory;

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
        let module = Arc::new(Module::load(&self.ctx, kernel, &image, from_nvrtc)?);
        let entry = CString::new(kernel.entry_point())
            .map_err(|_| compile_error(kernel, "the entry point contains a NUL byte"))?;
        let mut function: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: `module` is loaded; `function` receives one handle.
        let found =
            unsafe { sys::cuModuleGetFunction(&mut function, module.raw(), entry.as_ptr()) };
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
