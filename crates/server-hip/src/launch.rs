//! Compiling HIP C++ with hiprtc, and launching.
//!
//! A kernel is compiled for exactly this device's architecture
//! (`--offload-arch=<gcnArchName>`, target features included, so an
//! `xnack-` device gets `xnack-` code), loaded as a module, and its entry
//! point looked up by its unmangled name: kernels are `extern "C"
//! __global__`. The core caches the result by the kernel's id, so a source
//! is compiled once per server.
//!
//! A launch follows the binding convention of `scope_core::kernel`: the
//! parameters are the bindings' device pointers, already advanced by their
//! offsets, in order, then the scalar blob by value when it is non-empty —
//! the rules HIP shares with CUDA, in [`scope_native`], with HIP's
//! numbers ([`api_rules`]).
//! The block is the kernel's [`block_size`](scope_core::Kernel::block_size).
//! HIP has no indirect launch: an indirect dispatch reads its three counts
//! back to the host first, which a capture cannot record, so inside a
//! capture it fails (and so dooms the window, rule 31).
//!
//! A kernel holds its module in an `Arc`, and a launch recorded into a
//! capture keeps a clone of it in the recording and then the
//! [`HipGraph`](crate::HipGraph), so a kernel dropped while the graph lives
//! never leaves it launching a function of an unloaded module.

use std::sync::Arc;

use scope_core::backend::{BoundDispatch, Launch};
use scope_core::{Error, Kernel, KernelSource, LaunchLimits, Result};
use scope_native::ApiRules;

use crate::api::Module;
use crate::device::{Hip, HipStream};
use crate::error::{BACKEND, Doing};
use crate::ffi::RawFunction;
use crate::memory::HipMemory;

/// The most bytes of scalars a launch passes, and of the zero padding behind
/// them: the largest kernel argument segment.
const PARAM_SLACK: usize = 4096;
/// Parameter slots in all: one per parameter the largest kernel argument
/// segment could declare (each takes a byte at least), so a kernel that
/// declares more than a launch passes finds a slot pointing at zeros for
/// every one, never the end of the array.
const PARAM_SLOTS: usize = PARAM_SLACK;

/// HIP's numbers for the launch rules it shares with CUDA
/// ([`scope_native`]):
///
/// - Bindings: [`PARAM_SLOTS`] parameters, the blob counted as one.
/// - Scalars: [`PARAM_SLACK`] bytes, all the padded launch passes, with as
///   many zeros behind.
/// - Grid: the device's `maxGridSize`, but no more along an axis than keeps
///   blocks times threads within `u32::MAX` for the largest block the
///   device allows: `hipModuleLaunchKernel` refuses a launch whose total
///   threads along any axis pass that (`hipErrorInvalidConfiguration`), so
///   reporting the device's `2^31 - 1` would promise launches HIP refuses
///   on the device.
/// - Features: HIP C++ (hiprtc) gives every kernel on a ROCm 6 device
///   `_Float16`/`__half`; `atomicAdd` on `float` is a native instruction
///   from gfx90a and a compare-and-swap loop before.
pub(crate) const API_RULES: ApiRules = ApiRules {
    max_params: PARAM_SLOTS,
    max_scalar_bytes: PARAM_SLACK,
    max_param_bytes: PARAM_SLACK,
    grid_threads_within_u32: true,
    f16: true,
};

/// What [`Backend::check_launch`](scope_core::Backend::check_launch) holds a
/// HIP launch to before its scope opens: the rules HIP shares with CUDA
/// ([`scope_native::check_launch`]) against `limits`, the backend's launch limits.
/// HIP cannot report a kernel's parameters, so the launch is padded instead
/// of matched.
pub(crate) fn check_launch(
    limits: &LaunchLimits,
    kernel: &HipKernel,
    launch: &Launch<'_, HipMemory>,
) -> Result<()> {
    scope_native::check_launch(limits, kernel.block, None, launch)
}

/// A compiled kernel: its module (kept loaded) and entry point.
pub struct HipKernel {
    function: RawFunction,
    block: [u32; 3],
    /// Dynamic shared memory each launch gets (`sharedMemBytes`).
    shared: u32,
    /// Keeps `function` loaded; a recorded launch of it clones it into the
    /// graph.
    module: Arc<Module>,
}

// SAFETY: a function handle is a process-wide HIP handle, usable from any
// thread while its module is loaded, which the module field guarantees.
unsafe impl Send for HipKernel {}

impl std::fmt::Debug for HipKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HipKernel({:p}, block {:?})", self.function, self.block)
    }
}

/// The hiprtc options for a device of architecture `arch`: only the
/// target, since hiprtc already optimises by default. An empty `arch` (a
/// runtime that did not report one) leaves the choice to hiprtc.
pub fn compile_options(arch: &str) -> Vec<String> {
    if arch.is_empty() {
        Vec::new()
    } else {
        vec![format!("--offload-arch={arch}")]
    }
}

/// The code object hiprtc makes of `kernel`, a HIP C++ kernel, for `arch`
/// (`gfx90a`), exactly as the server compiles it when it loads the kernel —
/// the same options ([`compile_options`]), program name and errors — with
/// hiprtc from the first of `rtc` that loads (hiprtc's own library, or a
/// runtime that carries it, as ROCm 5's `libamdhip64.so.5` does), and no
/// runtime or device: for checking kernels against the real compiler ahead
/// of a run on AMD hardware (`tests/toolchain.rs` does).
///
/// # Errors
///
/// [`Error::BackendUnavailable`] when no hiprtc loads from `rtc`;
/// [`Error::Compile`] with hiprtc's log when it refuses the source, or when
/// `kernel` is not HIP C++; [`Error::OutOfMemory`] when hiprtc runs out.
pub fn hiprtc_code(rtc: &[String], kernel: &Kernel, arch: &str) -> Result<Vec<u8>> {
    let KernelSource::Hip(source) = kernel.source() else {
        return Err(Error::Compile {
            backend: BACKEND,
            kernel: kernel.name().clone(),
            log: format!(
                "hiprtc compiles HIP C++, not {}",
                kernel.source().language()
            ),
        });
    };
    let table = crate::loader::Api::rtc_from(rtc).map_err(|e| Error::BackendUnavailable {
        backend: BACKEND,
        reason: e.to_string(),
    })?;
    table
        .compile(source, kernel.name(), &compile_options(arch))
        .map_err(|f| rtc_error(kernel, f))
}

/// A hiprtc failure as the core's error.
fn rtc_error(kernel: &Kernel, failure: crate::api::RtcFailure) -> Error {
    if failure.out_of_memory() {
        Error::OutOfMemory {
            backend: BACKEND,
            requested: 0,
            detail: failure.log,
        }
    } else {
        Error::Compile {
            backend: BACKEND,
            kernel: kernel.name().clone(),
            log: failure.log,
        }
    }
}

impl Hip {
    pub(crate) fn compile(&mut self, kernel: &Kernel) -> Result<HipKernel> {
        let failed = |log: String| Error::Compile {
            backend: BACKEND,
            kernel: kernel.name().clone(),
            log,
        };
        let KernelSource::Hip(source) = kernel.source() else {
            return Err(failed(format!(
                "the HIP server compiles HIP C++, not {}",
                kernel.source().language()
            )));
        };
        let block = kernel.block_size();
        if block.contains(&0) {
            return Err(failed(format!("block {block:?} has a zero dimension")));
        }
        let shared = scope_native::dynamic_shared_memory(kernel, &self.limits)?;
        self.make_current()?;
        let code = self
            .api
            .compile(source, kernel.name(), &compile_options(&self.info.arch))
            .map_err(|f| rtc_error(kernel, f))?;
        let module =
            self.api
                .load_module(&code)
                .map_err(|e| match e.into_error(Doing::Other(None)) {
                    sticky @ Error::Fault(_) => sticky,
                    other => failed(format!("loading the code object: {other}")),
                })?;
        let function = module.function(kernel.entry_point()).map_err(|e| {
            failed(format!(
                "no kernel `{}` in the compiled module (declare it `extern \"C\" __global__`): {e}",
                kernel.entry_point()
            ))
        })?;
        Ok(HipKernel {
            function,
            block,
            shared,
            module: Arc::new(module),
        })
    }

    /// [`Backend::launch`](scope_core::Backend::launch).
    ///
    /// # Safety
    ///
    /// The contract of `Backend::launch`: `stream`, `kernel` and every
    /// memory in `launch` are this backend's and alive; every binding's
    /// range lies inside its memory, and an indirect dispatch's 12 bytes
    /// inside theirs; [`Backend::check_launch`](scope_core::Backend::check_launch)
    /// accepted this launch for this kernel.
    pub(crate) unsafe fn launch(
        &mut self,
        stream: &mut HipStream,
        kernel: &HipKernel,
        launch: &Launch<'_, HipMemory>,
    ) -> Result<()> {
        let id = stream.id;
        let doing = || Doing::Launching {
            kernel: launch.name.into(),
            stream: id,
        };
        let grid = match &launch.dispatch {
            BoundDispatch::Groups(groups) => *groups,
            BoundDispatch::Indirect { memory, offset } => {
                if stream.is_capturing() {
                    return Err(Error::Launch {
                        kernel: launch.name.into(),
                        stream: stream.id,
                        detail: "HIP has no indirect launch, and reading the counts back cannot be recorded into a HIP graph"
                            .to_owned(),
                    });
                }
                let mut counts = [0u8; 12];
                // SAFETY: the contract of `Backend::launch`: the indirect
                // dispatch's 12 bytes at `offset` lie inside `memory`, which
                // is this backend's and alive, as is `stream`.
                unsafe { self.read(stream, memory, *offset, &mut counts)? };
                scope_native::indirect_counts(counts)
            }
        };
        if !scope_native::runs_anything(grid, &self.limits) {
            return Ok(());
        }
        let pointers: Vec<u64> = launch
            .bindings
            .iter()
            // SAFETY: the contract of `Backend::launch`: every binding's
            // range, and so its offset, lies inside its memory's block.
            .map(|b| unsafe { b.memory.block.at(b.offset) } as u64)
            .collect();
        if stream.is_capturing() {
            stream.keep_module(&kernel.module);
        }
        let function = kernel.function;
        let block = kernel.block;
        let shared = kernel.shared;
        let hip = stream.stream();
        let launched = self
            .params
            .launch(&pointers, launch.scalars, false, |params| {
                // SAFETY: the kernel's module is loaded while `kernel` lives (it
                // holds an `Arc` of it), and a recording that captures this
                // launch holds a clone (kept just above), which its graph keeps
                // until it is destroyed; `params` come from the padded table: a
                // slot for every parameter any kernel could declare, each
                // pointing into one block alive for the call with as many bytes
                // behind it as any parameter is long — so a kernel whose
                // signature does not match the launch reads zeros, never past
                // host memory — and HIP copies the values before returning.
                // Each device pointer is inside a live allocation at the
                // binding's offset: the contract of `Backend::launch`. `shared`
                // is what the kernel declared, within the block's limit.
                unsafe { hip.launch(function, grid, block, shared, params) }
            })?;
        launched.map_err(|e| e.into_error(doing()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_target_the_device_arch_with_its_features() {
        assert_eq!(
            compile_options("gfx90a:sramecc+:xnack-"),
            ["--offload-arch=gfx90a:sramecc+:xnack-"]
        );
        assert!(compile_options("").is_empty());
    }
}
