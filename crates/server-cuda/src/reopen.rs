//! Opening a lost device again ([`Backend::reopen`](scope_core::Backend::reopen)),
//! as far as CUDA allows it.
//!
//! NVIDIA documents two kinds of sticky error. After an illegal address, a
//! launch failure, a misaligned address, an illegal instruction, a hardware
//! stack error, a device assert, a launch timeout, an invalid PC or an
//! invalid address space, the driver API's reference says "To continue
//! using CUDA, the process must be terminated and relaunched" — of the
//! assert, that "the device cannot be used again", of the others that the
//! error "leaves the process in an inconsistent state and any further CUDA
//! work will return the same error" ([`PROCESS_FATAL`]). For those a
//! reopen answers [`Error::RestartRequired`] and touches nothing: the work
//! survives in a group that shrinks to its other ranks and admits this one
//! again from a new process (rules 52, 54–57). Every other loss may be
//! reset.
//!
//! A reopen first destroys what this backend made — its streams, their
//! events and pinned staging, the memory pool — on the context they were
//! made on, then asks the driver whether that context still works (a new
//! stream, synchronised). A loss the driver never saw (one injected at a
//! fault site, or a fault of the server's own) leaves it working: new
//! streams and a new pool on it are the whole reopen. A context the driver
//! reports broken is reset with `cuDevicePrimaryCtxReset`, which destroys
//! everything on the device's primary context **for the whole process**,
//! and retained again. A reset is therefore refused, typed, while another
//! server of this process holds the same device ([`scope_native::Holding`]): it would
//! destroy that client's memory under it.

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUresult};
use scope_core::{Error, Result};

use crate::Cuda;
use crate::device::{CudaStreamState, open_context};
use crate::error::{BACKEND, Doing, code_name, driver as driver_error};
use crate::launch;
use crate::memory::Pool;

/// The sticky errors after which CUDA's documentation says the process must
/// be terminated and relaunched: a reopen refuses them with
/// [`Error::RestartRequired`]. The other sticky codes
/// ([`STICKY`](crate::error::STICKY): ECC and NVLink uncorrectable, a
/// destroyed context) are reset.
pub const PROCESS_FATAL: &[CUresult] = &[
    CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
    CUresult::CUDA_ERROR_LAUNCH_TIMEOUT,
    CUresult::CUDA_ERROR_ASSERT,
    CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR,
    CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION,
    CUresult::CUDA_ERROR_MISALIGNED_ADDRESS,
    CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE,
    CUresult::CUDA_ERROR_INVALID_PC,
    CUresult::CUDA_ERROR_LAUNCH_FAILED,
];

/// CUDA's process-fatal faults, as the reopen (and its tests) decide them.
const FATAL: scope_native::ProcessFatal = scope_native::ProcessFatal {
    backend: BACKEND,
    names: |name| PROCESS_FATAL.iter().any(|code| code_name(*code) == name),
    reason: "CUDA's documentation says that after this error the process must be terminated \
             and relaunched to use CUDA again",
};

/// Whether CUDA's documentation says `code` ends the process's use of CUDA.
pub fn ends_the_process(code: CUresult) -> bool {
    PROCESS_FATAL.contains(&code)
}

impl Cuda {
    /// [`Backend::reopen`](scope_core::Backend::reopen) for CUDA: see the
    /// module's docs.
    pub(crate) fn reopen_device(
        &mut self,
        fault: &Error,
        streams: &mut [&mut CudaStreamState],
    ) -> Result<()> {
        FATAL.refuse(fault)?;
        self.give_up_device(streams)?;
        if let Err(broken) = self.context_works() {
            FATAL.refuse(&broken)?;
            self.reset_context(&broken)?;
        }
        self.pool = Pool::new(&self.ctx, self.info.ordinal)?;
        self.params = scope_native::ParamTable::new(&launch::api_rules(self.info.capability));
        for stream in streams.iter_mut() {
            let handles = self.stream_handles()?;
            self.streams.push(stream.attach(handles)?);
            self.capturing.push(false);
        }
        tracing::info!(
            backend = BACKEND,
            device = self.info.ordinal,
            "the device is open again after {fault}"
        );
        Ok(())
    }

    /// Destroy everything this backend made on the lost context, on that
    /// context: deferred frees, the pool, every stream's driver objects.
    /// Errors are the lost device's and change nothing.
    fn give_up_device(&mut self, streams: &mut [&mut CudaStreamState]) -> Result<()> {
        let _ = self.bind();
        for (index, memory) in std::mem::take(&mut self.deferred) {
            // SAFETY: `deferred` holds only memory `Backend::free` was given,
            // whose contract is that nothing names it again; taken out of
            // the list, it is released here once.
            unsafe { self.release(Some(index), memory) };
        }
        self.pool.destroy();
        self.streams.clear();
        self.capturing.clear();
        for stream in streams.iter_mut() {
            stream.detach()?;
        }
        Ok(())
    }

    /// `Ok` when the context still runs work: the loss was not the
    /// driver's. Otherwise the driver's error. A stream of its own is made
    /// and synchronised, never the context: `cuCtxSynchronize` would wait
    /// for (and fail on) the streams of every other client of the device,
    /// which share its primary context.
    fn context_works(&self) -> Result<()> {
        self.bind()?;
        let probe = |what| move |e| driver_error(e, Doing::Wait { stream: None, what });
        let stream = self
            .ctx
            .new_stream()
            .map_err(probe("a new stream, after the loss"))?;
        stream
            .synchronize()
            .map_err(probe("a new stream, after the loss"))
    }

    /// Reset the device's primary context and retain it again, unless
    /// another server of this process holds the device. No server can
    /// open the device while the reset runs ([`scope_native::Holding::alone`]).
    fn reset_context(&mut self, broken: &Error) -> Result<()> {
        let ordinal = self.info.ordinal;
        let device =
            i32::try_from(ordinal).map_err(|_| Error::invalid("device ordinal", "too large"))?;
        let reset = || -> Result<_> {
            let start = |what| move |e| driver_error(e, Doing::Start { what });
            let device = result::device::get(device).map_err(start("cuDeviceGet"))?;
            // SAFETY: `device` is a valid device handle just returned by
            // the driver; no other server of this process holds the device
            // or can open it until this returns (`Holding::alone`), and
            // this one has destroyed every object it made on the context
            // (`give_up_device`); the old context handle is retained, and
            // released only after the new retain below, which CUDA
            // documents as safe after a reset.
            unsafe { sys::cuDevicePrimaryCtxReset_v2(device) }
                .result()
                .map_err(start("cuDevicePrimaryCtxReset"))?;
            open_context(ordinal)
        };
        self.ctx = self
            .holding
            .reset_alone("a reset of its primary context", broken, reset)?;
        tracing::warn!(
            backend = BACKEND,
            device = ordinal,
            "reset the primary context after {broken}"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scope_core::DeviceFault;

    fn fault(code: CUresult) -> Error {
        Error::Fault(DeviceFault {
            backend: BACKEND,
            code: code_name(code),
            sticky: true,
            stream: None,
            detail: String::new(),
        })
    }

    #[test]
    fn the_documented_process_fatal_codes_require_a_restart() {
        for code in PROCESS_FATAL {
            assert!(crate::error::is_sticky(*code), "{code:?} is sticky");
            assert!(
                matches!(
                    FATAL.refuse(&fault(*code)),
                    Err(Error::RestartRequired { .. })
                ),
                "{code:?}"
            );
            assert!(FATAL.ends_the_process(&fault(*code)));
        }
    }

    #[test]
    fn the_other_sticky_codes_and_other_backends_faults_may_be_reset() {
        for code in crate::error::STICKY {
            if !PROCESS_FATAL.contains(code) {
                assert!(!FATAL.ends_the_process(&fault(*code)), "{code:?}");
            }
        }
        let Error::Fault(mut other) = fault(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS) else {
            unreachable!()
        };
        other.backend = "hip";
        assert!(!FATAL.ends_the_process(&Error::Fault(other)));
    }
}
