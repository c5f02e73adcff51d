//! Opening a lost device again ([`Backend::reopen`](scope_core::Backend::reopen)),
//! as far as HIP allows it.
//!
//! HIP's documentation does not say which faults end a process's use of
//! the device. CUDA's does, for the same codes HIP shares with it (an
//! illegal address, a launch failure, a device assert, a launch timeout:
//! "the process must be terminated and relaunched"), so this server follows
//! CUDA's rule: after those a reopen answers [`Error::RestartRequired`] and
//! touches nothing ([`PROCESS_FATAL`]). Every other loss may be reset.
//!
//! A reopen first destroys what this backend made — its streams and
//! events, pinned staging, pooled memory — on the device they were made
//! on, then asks the device whether it still works (a new stream,
//! synchronised).
//! A loss HIP never saw (one injected at a fault site) leaves it working:
//! new streams on it are the whole reopen. A device HIP reports broken is
//! reset with `hipDeviceReset`, which destroys every resource on the device
//! **for the whole process**; so a reset is refused, typed, while another
//! server of this process holds the device ([`scope_native::Holding`]).
//!
//! Untested on AMD hardware: the mock HIP runtime (`tests/mock/mock_hip.c`)
//! implements the reset and the sticky codes as described here.

use scope_core::{Error, Result};

use crate::device::{Hip, HipStream};
use crate::error::{BACKEND, Doing, HipError};
use crate::ffi::{HipErrorCode, code, code_name};
use crate::memory::{Pool, Staging};

/// The sticky codes HIP shares with CUDA after which CUDA's documentation
/// says the process must be terminated and relaunched.
pub const PROCESS_FATAL: [HipErrorCode; 4] = [
    code::ILLEGAL_ADDRESS,
    code::LAUNCH_FAILURE,
    code::ASSERT,
    code::LAUNCH_TIME_OUT,
];

/// HIP's process-fatal faults, as the reopen (and its tests) decide them.
const FATAL: scope_native::ProcessFatal = scope_native::ProcessFatal {
    backend: BACKEND,
    names: |name| PROCESS_FATAL.iter().any(|c| code_name(*c) == Some(name)),
    reason: "HIP follows CUDA's rule for this code, whose documentation says that after it the \
             process must be terminated and relaunched to use the device again",
};

impl Hip {
    /// [`Backend::reopen`](scope_core::Backend::reopen) for HIP: see the
    /// module's docs.
    pub(crate) fn reopen_device(
        &mut self,
        fault: &Error,
        streams: &mut [&mut HipStream],
    ) -> Result<()> {
        FATAL.refuse(fault)?;
        let _ = self.make_current();
        self.pool = Pool::default();
        self.staging = Staging::default();
        self.read_buffer = None;
        self.streams.clear();
        for stream in streams.iter_mut() {
            Hip::detach(stream)?;
        }
        self.make_current()?;
        if let Err(broken) = self.device_works() {
            FATAL.refuse(&broken)?;
            self.reset_device(&broken)?;
        }
        self.params = scope_native::ParamTable::new(&crate::launch::API_RULES);
        for stream in streams.iter_mut() {
            self.attach(stream)?;
        }
        tracing::info!(
            backend = BACKEND,
            device = self.info.ordinal,
            "the device is open again after {fault}"
        );
        Ok(())
    }

    /// `Ok` when the device still runs work: the loss was not HIP's.
    /// Otherwise HIP's error. A stream of its own is made and synchronised,
    /// never the device: `hipDeviceSynchronize` would wait for the streams
    /// of every other client of the device.
    fn device_works(&self) -> Result<()> {
        let probe = self
            .api
            .stream()
            .map_err(|e| e.into_error(Doing::Waiting(None)))?;
        probe
            .synchronize()
            .map_err(|e| e.into_error(Doing::Waiting(None)))
    }

    /// `hipDeviceReset`, unless another server of this process holds the
    /// device. No server can open the device while the reset runs
    /// ([`scope_native::Holding::alone`]).
    fn reset_device(&mut self, broken: &Error) -> Result<()> {
        let ordinal = self.info.ordinal;
        let reset = || {
            // SAFETY: no other server of this process holds the device or
            // can open it until this returns (`Holding::alone`), and this
            // one has destroyed every object it made on it (`detach`, the
            // pool, the staging and the read buffer above; the core gave
            // back every memory, kernel and graph before asking to
            // reopen).
            unsafe { self.api.device_reset() }
        };
        self.holding.reset_alone("a reset", broken, || {
            reset().map_err(|e: HipError| e.into_error(Doing::Other(None)))
        })?;
        tracing::warn!(
            backend = BACKEND,
            device = ordinal,
            "reset the device after {broken}"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scope_core::DeviceFault;

    fn fault(code: HipErrorCode) -> Error {
        HipError::new("hipStreamSynchronize", code).into_error(Doing::Waiting(None))
    }

    #[test]
    fn the_codes_cuda_calls_process_fatal_require_a_restart() {
        for code in PROCESS_FATAL {
            assert!(crate::error::is_sticky(code), "{code} is sticky");
            assert!(FATAL.ends_the_process(&fault(code)));
            assert!(matches!(
                FATAL.refuse(&fault(code)),
                Err(Error::RestartRequired { backend: "hip", .. })
            ));
        }
    }

    #[test]
    fn other_sticky_codes_and_other_backends_faults_may_be_reset() {
        for code in [code::ECC_NOT_CORRECTABLE, code::CONTEXT_IS_DESTROYED] {
            assert!(crate::error::is_sticky(code));
            assert!(!FATAL.ends_the_process(&fault(code)), "{code}");
        }
        let cuda = Error::Fault(DeviceFault {
            backend: "cuda",
            code: "hipErrorIllegalAddress".to_owned(),
            sticky: true,
            stream: None,
            detail: String::new(),
        });
        assert!(!FATAL.ends_the_process(&cuda));
    }
}
