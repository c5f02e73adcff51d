//! Compiling HIP C++ with hiprtc, and launching.
//!
//! A kernel is compiled for the device's exact `gcnArchName`, target features included (an
//! `xnack-` device gets `xnack-` code), and found by its unmangled `extern "C"` name; the core
//! caches it, so a source compiles once per server. A launch passes the bindings' device
//! pointers, then any scalar blob: the rules HIP shares with CUDA ([`scope_native`]). HIP has
//! no indirect launch: an indirect dispatch reads its counts back first, which a capture
//! cannot record, so there it fails (dooming the window, rule 31). A recorded launch keeps its
//! module's `Arc` in the [`HipGraph`](crate::HipGraph), so no graph runs an unloaded module.

use std::sync::Arc;

use scope_core::backend::{BoundDispatch, Launch};
use scope_core::{Error, Kernel, KernelSource, LaunchLimits, Result};

use crate::api::Module;
use crate::device::{Hip, HipStream};
use crate::error::{BACKEND, Doing};
use crate::ffi::RawFunction;
use crate::memory::HipMemory;

/// What [`Backend::check_launch`](scope_core::Backend::check_launch) holds a HIP launch to:
/// [`scope_native::check_launch`], padding the parameters HIP cannot report, not matching them.
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
    /// Keeps `function` loaded; a recorded launch clones it into the graph.
    module: Arc<Module>,
}

// SAFETY: a function handle is process-wide, usable while its module (a field) is loaded.
unsafe impl Send for HipKernel {}

impl std::fmt::Debug for HipKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HipKernel({:p}, block {:?})", self.function, self.block)
    }
}

/// The hiprtc options for `arch`: just the target (an empty one leaves it to hiprtc).
pub fn compile_options(arch: &str) -> Vec<String> {
    if arch.is_empty() {
        Vec::new()
    } else {
        vec![format!("--offload-arch={arch}")]
    }
}

/// The code object hiprtc makes of HIP C++ `kernel` for `arch` (`gfx90a`), as the server would
/// ([`compile_options`]), with hiprtc from the first of `rtc` that loads and no device: how
/// `tests/toolchain.rs` checks kernels. [`Error::BackendUnavailable`] without hiprtc,
/// [`Error::Compile`] with its log, or [`Error::OutOfMemory`].
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

    /// [`Backend::launch`](scope_core::Backend::launch). Safety, its contract: `stream`,
    /// `kernel` and all memory are this backend's and alive, every range inside its memory, and
    /// `Backend::check_launch` accepted the launch.
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
                // SAFETY: `Backend::launch`'s contract: the 12 bytes at `offset` lie inside
                // `memory`; it and `stream` are this backend's and alive.
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
            // SAFETY: `Backend::launch`'s contract: each binding's offset lies in its block.
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
                // SAFETY: `kernel` holds its module, and a capture's graph a clone (kept
                // above). `params` is the padded table: a slot for any parameter a kernel could
                // declare, each with enough bytes behind, so a mismatched kernel reads zeros;
                // HIP copies them. Device pointers lie in live allocations (`Backend::launch`'s
                // contract); `shared` is what the kernel declared, within the limit.
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
