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
//! offsets, in order, then the scalar blob by value when it is non-empty.
//! The block is the kernel's [`block_size`](scope_core::Kernel::block_size).
//! HIP has no indirect launch: an indirect dispatch reads its three counts
//! back to the host first, which a capture cannot record, so inside a
//! capture it fails (and so dooms the window, rule 31).

use std::ffi::c_void;

use scope_core::{
    BoundDispatch, DeviceFeatures, Error, Kernel, KernelSource, Launch, LaunchLimits, Result,
};

use crate::api::Module;
use crate::device::{Hip, HipStream, LaunchGeometry};
use crate::error::{BACKEND, Doing};
use crate::ffi::RawFunction;
use crate::memory::HipMemory;

/// The most bytes of scalars a launch passes, and the zero padding behind them.
pub(crate) const PARAM_SLACK: usize = 4096;
/// Parameter slots in all: one per parameter the largest kernel argument
/// segment could declare (each takes a byte at least), so a kernel that
/// declares more than a launch passes finds a slot pointing at zeros for
/// every one, never the end of the array.
const PARAM_SLOTS: usize = PARAM_SLACK;

// `Hip::param_table` holds addresses as `usize` and is handed to HIP as an
// array of pointers.
const _: () = assert!(size_of::<usize>() == size_of::<*mut c_void>());

/// What one launch may ask for on a device of `geometry` whose largest
/// allocation is `max_allocation`: the one set of numbers both
/// [`Backend::launch_limits`](scope_core::Backend::launch_limits) reports
/// and [`check_launch`] enforces, kept in the backend so the two cannot
/// drift apart (a launch the report allows but the check refuses, or the
/// reverse, is what rule 38 forbids).
///
/// - Bindings: [`PARAM_SLOTS`] parameters, the blob counted as one.
/// - Scalars: [`PARAM_SLACK`] bytes, all the launch scratch passes.
/// - Grid: the device's `maxGridSize`, but no more along an axis than keeps
///   blocks times threads within `u32::MAX` for the largest block the
///   device allows: `hipModuleLaunchKernel` refuses a launch whose total
///   threads along any axis pass that (`hipErrorInvalidConfiguration`), so
///   reporting the device's `2^31 - 1` would promise launches HIP refuses
///   on the device. On a `1024`-thread axis that is `4,194,303` blocks.
/// - Block, threads, LDS, wavefront: the device's ([`LaunchGeometry`]).
/// - Features: what HIP C++ (hiprtc) gives every kernel on a ROCm 6 device:
///   `_Float16`/`__half`, 64-bit floats and integers, `atomicAdd` on
///   `float` (a native instruction from gfx90a, a compare-and-swap loop
///   before), and wavefront intrinsics (`__shfl`, `__ballot`) wherever the
///   runtime reports the wavefront's width.
pub(crate) fn launch_limits(geometry: &LaunchGeometry, max_allocation: u64) -> LaunchLimits {
    let grid = [0, 1, 2].map(|i| geometry.grid[i].min(u32::MAX / geometry.block[i].max(1)));
    let mut features = DeviceFeatures::default();
    features.f16 = true;
    features.f64 = true;
    features.i64 = true;
    features.f32_atomic_add = true;
    features.subgroups = geometry.wavefront.is_some();
    let mut limits = LaunchLimits::default();
    limits.max_bindings = PARAM_SLOTS as u32;
    limits.max_binding_size = max_allocation;
    limits.max_scalar_bytes = PARAM_SLACK as u32;
    limits.max_workgroups = grid;
    limits.max_workgroup_size = geometry.block;
    limits.max_invocations = geometry.threads;
    limits.max_workgroup_memory = geometry.shared_memory;
    limits.subgroup_size = geometry.wavefront.map(|w| (w, w));
    limits.features = features;
    limits
}

/// What [`Backend::check_launch`](scope_core::Backend::check_launch) holds a
/// HIP launch to before its scope opens — exactly `limits`, the backend's
/// [`launch_limits`]: a host-given grid inside the reported one, the
/// kernel's block inside the device's, a blob inside the bytes passed by
/// value, and no more parameters than the table has slots. Each refusal is
/// an invalid argument that claims nothing; HIP would otherwise fail the
/// launch inside its scope, claiming outputs of work that never could have
/// run.
pub(crate) fn check_launch(
    limits: &LaunchLimits,
    kernel: &HipKernel,
    launch: &Launch<'_, HipMemory>,
) -> Result<()> {
    let invalid = |why: String| Err(Error::invalid(format!("launch of `{}`", launch.name), why));
    limits
        .workgroup_fits(kernel.block)
        .or_else(|why| invalid(format!("the kernel's block: {why}")))?;
    let len = launch.scalars.len();
    if len > limits.max_scalar_bytes as usize {
        return invalid(format!(
            "a {len}-byte scalar blob is past the {} bytes of scalars this server passes by value",
            limits.max_scalar_bytes
        ));
    }
    let passed = launch.bindings.len() + usize::from(len > 0);
    if passed > limits.max_bindings as usize {
        return invalid(format!(
            "{passed} parameters is past the {} a kernel can take",
            limits.max_bindings
        ));
    }
    Ok(())
}

/// The parameter table a server keeps: [`PARAM_SLOTS`] addresses of the
/// zeroed back half of `scratch`, which the launch path overwrites at the
/// front and puts back after each launch.
pub(crate) fn param_table(scratch: &[u8]) -> Box<[usize]> {
    let zeros = scratch[PARAM_SLACK..].as_ptr() as usize;
    vec![zeros; PARAM_SLOTS].into_boxed_slice()
}

/// A compiled kernel: its module (kept loaded) and entry point.
pub struct HipKernel {
    function: RawFunction,
    block: [u32; 3],
    // Declared after `function`, which points into it.
    _module: Module,
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
        self.make_current()?;
        let code = self
            .api
            .compile(source, kernel.name(), &compile_options(&self.info.arch))
            .map_err(|f| {
                if f.out_of_memory() {
                    Error::OutOfMemory {
                        backend: BACKEND,
                        requested: 0,
                        detail: f.log,
                    }
                } else {
                    failed(f.log)
                }
            })?;
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
            _module: module,
        })
    }

    pub(crate) fn launch(
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
                self.read(stream, memory, *offset, &mut counts)?;
                let word = |i: usize| {
                    u32::from_le_bytes([
                        counts[i * 4],
                        counts[i * 4 + 1],
                        counts[i * 4 + 2],
                        counts[i * 4 + 3],
                    ])
                };
                [word(0), word(1), word(2)]
            }
        };
        if grid.contains(&0)
            || grid
                .iter()
                .zip(self.limits.max_workgroups)
                .any(|(count, max)| *count > max)
        {
            // A zero runs nothing; so does an indirect count past the
            // device's grid (host-given ones were refused before the
            // scope), as on every server.
            return Ok(());
        }
        let mut pointers: Vec<*mut c_void> = launch
            .bindings
            .iter()
            .map(|b| b.memory.block.at(b.offset))
            .collect();
        // HIP copies each parameter with the size the kernel declares, not
        // the size given. The blob is copied into the front of a zeroed
        // scratch buffer and the spare parameter slots point at its zeroed
        // back half, so a kernel whose signature does not match the launch
        // reads zeros, never past host memory: the mismatch becomes wrong
        // values on the device, not a host over-read.
        let len = launch.scalars.len();
        if len > PARAM_SLACK || pointers.len() + usize::from(len > 0) > PARAM_SLOTS {
            return Err(Error::internal(
                "a HIP launch past the parameter limits reached the device call",
            ));
        }
        let (blob, zeros) = self.param_scratch.split_at_mut(PARAM_SLACK);
        blob[..len].copy_from_slice(launch.scalars);
        let zeros = zeros.as_mut_ptr() as usize;
        let table = &mut self.param_table;
        for (slot, p) in table.iter_mut().zip(pointers.iter_mut()) {
            *slot = p as *mut *mut c_void as usize;
        }
        let mut used = pointers.len();
        if len > 0 {
            table[used] = blob.as_mut_ptr() as usize;
            used += 1;
        }
        // SAFETY: `usize` and `*mut c_void` have one size (asserted above)
        // and alignment, and `table` is borrowed exclusively for as long as
        // `params` lives.
        let params: &mut [*mut c_void] = unsafe {
            std::slice::from_raw_parts_mut(table.as_mut_ptr().cast::<*mut c_void>(), table.len())
        };
        // SAFETY: the kernel's module is loaded for as long as `kernel` (the
        // core keeps compiled kernels until the server drops, after its
        // graphs); `params` point at `pointers` and at the scratch buffer,
        // alive for the call, and hold a slot for every parameter any kernel
        // could declare, those past the launch's pointing at zeros at least
        // as long as any parameter — so a kernel whose signature does not
        // match the launch reads zeros, never past host memory — and HIP
        // copies the values before returning; each pointer is inside a live
        // allocation at the binding's offset (validated by the core).
        let launched = unsafe {
            stream
                .stream()
                .launch(kernel.function, grid, kernel.block, params)
        };
        // Restore the all-zero table and scratch for the next launch.
        self.param_table[..used].fill(zeros);
        blob[..len].fill(0);
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
