//! The faults after which a vendor says the process must be restarted.
//!
//! CUDA's driver reference says that after an illegal address, a launch
//! failure and a few others, "to continue using CUDA, the process must be
//! terminated and relaunched"; HIP follows CUDA for the codes the two share.
//! A reopen refuses those with [`Error::RestartRequired`] and touches
//! nothing (rule 52): the work survives in a group that shrinks to its other
//! ranks and admits this one again from a new process. Each server names
//! its own codes; the decision, and the error, are here once, so the two
//! servers cannot come to answer the same fault differently.

use std::sync::Arc;

use scope_core::{Error, Result};

/// One backend's process-fatal faults: which codes, and why.
#[derive(Clone, Copy, Debug)]
pub struct ProcessFatal {
    /// The backend whose faults these are (`DeviceFault::backend`).
    pub backend: &'static str,
    /// Whether a code, by the name a `DeviceFault` carries, is one.
    pub names: fn(&str) -> bool,
    /// What the vendor's documentation says of them.
    pub reason: &'static str,
}

impl ProcessFatal {
    /// Whether `fault` is one: a fault of this backend whose code is.
    pub fn ends_the_process(&self, fault: &Error) -> bool {
        matches!(fault, Error::Fault(f) if f.backend == self.backend && (self.names)(&f.code))
    }

    /// [`Error::RestartRequired`] naming `fault` where it is one; `Ok`
    /// where the device may be opened again.
    ///
    /// # Errors
    ///
    /// As above.
    pub fn refuse(&self, fault: &Error) -> Result<()> {
        if !self.ends_the_process(fault) {
            return Ok(());
        }
        Err(Error::RestartRequired {
            backend: self.backend,
            fault: Arc::new(fault.clone()),
            reason: self.reason.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use scope_core::DeviceFault;

    use super::*;

    const FATAL: ProcessFatal = ProcessFatal {
        backend: "cuda",
        names: |name| name == "CUDA_ERROR_ILLEGAL_ADDRESS",
        reason: "the documentation says so",
    };

    fn fault(backend: &'static str, code: &str) -> Error {
        Error::Fault(DeviceFault {
            backend,
            code: code.to_owned(),
            sticky: true,
            stream: None,
            detail: String::new(),
        })
    }

    #[test]
    fn only_the_backends_own_named_faults_require_a_restart() {
        let fatal = fault("cuda", "CUDA_ERROR_ILLEGAL_ADDRESS");
        assert!(matches!(
            FATAL.refuse(&fatal),
            Err(Error::RestartRequired {
                backend: "cuda",
                ..
            })
        ));
        assert!(
            FATAL
                .refuse(&fault("cuda", "CUDA_ERROR_ECC_UNCORRECTABLE"))
                .is_ok()
        );
        assert!(
            FATAL
                .refuse(&fault("hip", "CUDA_ERROR_ILLEGAL_ADDRESS"))
                .is_ok()
        );
        assert!(FATAL.refuse(&Error::invalid("x", "y")).is_ok());
    }
}
