//! A loaded module, unloaded when its last holder goes.
//!
//! A graph that recorded a launch holds the module's `Arc`, so a replay never runs an unloaded
//! function. Streams record it (`device.rs`), so it stands below them. PTX newer than the driver
//! is [`UnsupportedPtx`], naming both versions and the fix.

use std::ffi::{c_char, c_void};
use std::sync::Arc;

use cudarc::driver::CudaContext;
use cudarc::driver::sys::{self, CUresult};
use scope_core::{Error, Kernel, Result};
use scope_native::c_chars;

use crate::driver::cuda_driver_version;
use crate::error::{Doing, classify};
use crate::nvrtc::nvrtc_version;
use crate::ptx::{PtxIsa, UnsupportedPtx};

/// A loaded module, unloaded when the last kernel or graph holding it goes.
pub(crate) struct Module {
    raw: sys::CUmodule,
    ctx: Arc<CudaContext>,
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

impl Module {
    /// Load NUL-terminated PTX as a module, with the JIT's log on failure. PTX too new for the
    /// driver is [`UnsupportedPtx`].
    pub(crate) fn load(
        ctx: &Arc<CudaContext>,
        kernel: &Kernel,
        image: &[u8],
        from_nvrtc: bool,
    ) -> Result<Self> {
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
                ctx: ctx.clone(),
            }),
            Err(e) if e.0 == CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION => {
                // Name both versions and the fix, not the bare code.
                let text = std::str::from_utf8(image.strip_suffix(&[0]).unwrap_or(image));
                Err(Error::external(UnsupportedPtx {
                    kernel: kernel.name().clone(),
                    ptx_isa: text.ok().and_then(PtxIsa::of),
                    driver: cuda_driver_version().ok(),
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

    /// The driver's handle, valid while `self` lives.
    pub(crate) fn raw(&self) -> sys::CUmodule {
        self.raw
    }
}
