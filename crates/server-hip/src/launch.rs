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

use scope_core::{BoundDispatch, Error, Kernel, KernelSource, Launch, Result};

use crate::api::Module;
use crate::device::{Hip, HipStream};
use crate::error::{BACKEND, Doing};
use crate::ffi::RawFunction;
use crate::memory::HipMemory;

/// The most bytes of scalars a launch passes, and the zero padding behind them.
pub(crate) const PARAM_SLACK: usize = 4096;
/// Parameter slots past the convention's, each pointing at zeros.
const SPARE_PARAMS: usize = 16;

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
        if grid.contains(&0) {
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
        if len > PARAM_SLACK {
            return Err(Error::Launch {
                kernel: launch.name.into(),
                stream: stream.id,
                detail: format!(
                    "a {len}-byte scalar blob is past the {PARAM_SLACK} bytes of scalars this server passes by value"
                ),
            });
        }
        let (blob, zeros) = self.param_scratch.split_at_mut(PARAM_SLACK);
        blob[..len].copy_from_slice(launch.scalars);
        let mut params: Vec<*mut c_void> = pointers
            .iter_mut()
            .map(|p| (p as *mut *mut c_void).cast())
            .collect();
        if len > 0 {
            params.push(blob.as_mut_ptr().cast());
        }
        params.extend(std::iter::repeat_n(
            zeros.as_mut_ptr().cast::<c_void>(),
            SPARE_PARAMS,
        ));
        // SAFETY: the kernel's module is loaded for as long as `kernel` (the
        // core keeps compiled kernels until the server drops, after its
        // graphs); `params` point at `pointers` and at the scratch buffer,
        // alive for the call and padded against a mismatched signature, and
        // HIP copies the values before returning; each pointer is inside a
        // live allocation at the binding's offset (validated by the core).
        // That the kernel's signature matches the binding convention is the
        // caller's contract with its kernel source.
        let launched = unsafe {
            stream
                .stream()
                .launch(kernel.function, grid, kernel.block, &mut params)
        };
        // Restore the all-zero scratch for the next launch.
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
