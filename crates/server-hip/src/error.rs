//! Classifying HIP's answers into the core's one error type.
//!
//! HIP mirrors CUDA's error model: a few codes poison the device (rule 36), the rest fail one
//! call, and out-of-memory is never sticky (rule 37). The sticky set is CUDA's, where HIP has
//! the codes; an AMD fault without one surfaces as an illegal address or a launch failure.
//! Only CUDA documents which faults end the process's use of the device; HIP follows it
//! ([`PROCESS_FATAL`]), and a recovery refuses those (rule 52). Every call site goes through
//! [`HipError::into_error`], saying what it was doing; a sticky or out-of-memory code wins.

use std::sync::Arc;

use scope_core::{BackendKind, DeviceFault, Error, FaultClass, StreamId};

use crate::ffi::{HipErrorCode, code, code_name};

/// The table's row for this server; its name is in every error.
pub(crate) const KIND: BackendKind = BackendKind::Hip;
pub const BACKEND: &str = KIND.name();

/// Sticky codes after which CUDA's documentation says to terminate and relaunch the process.
pub(crate) const PROCESS_FATAL: [HipErrorCode; 4] = [
    code::ILLEGAL_ADDRESS,
    code::LAUNCH_FAILURE,
    code::ASSERT,
    code::LAUNCH_TIME_OUT,
];

/// The other sticky codes: the device is unusable until it is reset.
pub(crate) const RESETTABLE: [HipErrorCode; 3] = [
    code::ECC_NOT_CORRECTABLE,
    code::CONTEXT_IS_DESTROYED,
    code::PRIOR_LAUNCH_FAILURE,
];

/// Why a [`PROCESS_FATAL`] code refuses a recovery.
pub(crate) const RESTART: &str = "HIP follows CUDA's rule for this code, whose documentation says that \
                       after it the process must be terminated and relaunched to use the \
                       device again";

/// How far `code` reaches.
pub(crate) fn class_of(code: HipErrorCode) -> FaultClass {
    scope_native::class_of(code, &PROCESS_FATAL, &RESETTABLE)
}

/// A failed HIP (or hiprtc) call: which entry point, and its code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HipError {
    /// The entry point: `hipMemcpyAsync`.
    pub call: &'static str,
    /// The `hipError_t` it returned.
    pub code: HipErrorCode,
    /// The runtime's own description, when it could be asked.
    pub message: Option<String>,
}

/// What a failing call was doing: its error when the code is neither sticky nor out-of-memory.
#[derive(Debug, Clone)]
pub enum Doing {
    /// Allocating `bytes` of device or pinned memory.
    Allocating(u64),
    /// Launching a kernel.
    Launching {
        /// The kernel.
        kernel: Arc<str>,
        /// The stream.
        stream: StreamId,
    },
    /// A host or device copy.
    Copying {
        /// Which copy, for a person.
        what: String,
        /// The stream.
        stream: StreamId,
    },
    /// Waiting for or ordering a stream's work: a device fault, blamed on the work in flight.
    Waiting(Option<StreamId>),
    /// Anything else: setting up a device, a stream, a capture.
    Other(Option<StreamId>),
}

/// Whether `code` says the device ran out of memory.
pub fn is_out_of_memory(code: HipErrorCode) -> bool {
    code == code::OUT_OF_MEMORY
}

impl HipError {
    /// A failure of `call` with `code`.
    pub fn new(call: &'static str, code: HipErrorCode) -> Self {
        Self {
            call,
            code,
            message: None,
        }
    }

    /// The code's name, from the header; the number when it has none.
    pub fn name(&self) -> String {
        code_name(self.code).map_or_else(|| format!("hipError_t({})", self.code), str::to_owned)
    }

    fn detail(&self) -> String {
        match &self.message {
            Some(m) if !m.is_empty() => format!("{} returned {}: {m}", self.call, self.name()),
            _ => format!("{} returned {}", self.call, self.name()),
        }
    }

    /// The core's error for this failure, made while `doing`.
    pub fn into_error(self, doing: Doing) -> Error {
        let stream = match &doing {
            Doing::Launching { stream, .. } | Doing::Copying { stream, .. } => Some(*stream),
            Doing::Waiting(s) | Doing::Other(s) => *s,
            Doing::Allocating(_) => None,
        };
        let class = class_of(self.code);
        if class.poisons() {
            return Error::Fault(DeviceFault {
                backend: BACKEND,
                code: self.name(),
                class,
                stream,
                detail: self.detail(),
            });
        }
        if is_out_of_memory(self.code) {
            let requested = match doing {
                Doing::Allocating(bytes) => bytes,
                _ => 0,
            };
            return Error::OutOfMemory {
                backend: BACKEND,
                requested,
                detail: self.detail(),
            };
        }
        match doing {
            Doing::Launching { kernel, stream } => Error::Launch {
                kernel,
                stream,
                detail: self.detail(),
            },
            Doing::Copying { what, stream } => Error::Copy {
                what,
                stream,
                detail: self.detail(),
            },
            Doing::Waiting(stream) => Error::Fault(DeviceFault {
                backend: BACKEND,
                code: self.name(),
                class,
                stream,
                detail: self.detail(),
            }),
            Doing::Allocating(bytes) => {
                Error::invalid("allocation", format!("{bytes} bytes: {}", self.detail()))
            }
            Doing::Other(_) => Error::refused(self.detail()),
        }
    }
}

impl std::fmt::Display for HipError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail())
    }
}

/// The result of one HIP call.
pub type HipResult<T> = std::result::Result<T, HipError>;

#[cfg(test)]
mod tests {
    use super::*;

    const STICKY: [HipErrorCode; 7] = [
        code::ILLEGAL_ADDRESS,
        code::LAUNCH_FAILURE,
        code::ASSERT,
        code::LAUNCH_TIME_OUT,
        code::ECC_NOT_CORRECTABLE,
        code::CONTEXT_IS_DESTROYED,
        code::PRIOR_LAUNCH_FAILURE,
    ];

    fn is_sticky(code: HipErrorCode) -> bool {
        class_of(code).poisons()
    }

    fn every_site() -> Vec<Doing> {
        vec![
            Doing::Allocating(64),
            Doing::Launching {
                kernel: Arc::from("k"),
                stream: StreamId(1),
            },
            Doing::Copying {
                what: "write of buffer #1".into(),
                stream: StreamId(1),
            },
            Doing::Waiting(Some(StreamId(1))),
            Doing::Other(None),
        ]
    }

    #[test]
    fn every_sticky_code_is_a_sticky_fault_wherever_it_surfaces() {
        for code in STICKY {
            for doing in every_site() {
                let error = HipError::new("hipStreamSynchronize", code).into_error(doing.clone());
                assert!(error.is_sticky(), "{code} while {doing:?}: {error}");
                let Error::Fault(fault) = &error else {
                    unreachable!()
                };
                assert_eq!(fault.backend, BACKEND);
                assert_eq!(Some(fault.code.as_str()), code_name(code));
                assert!(fault.detail.contains("hipStreamSynchronize"), "{error}");
            }
        }
    }

    /// Rule 52: the codes CUDA calls process-fatal refuse a recovery; other sticky codes reset.
    #[test]
    fn the_codes_cuda_calls_process_fatal_require_a_restart() {
        for code in PROCESS_FATAL {
            assert!(is_sticky(code), "{code} is sticky");
            let error =
                HipError::new("hipStreamSynchronize", code).into_error(Doing::Waiting(None));
            assert!(error.is_process_fatal(), "{error}");
            assert!(matches!(
                error.refuse_process_fatal(BACKEND, RESTART),
                Err(Error::RestartRequired { backend: BACKEND, reason, .. })
                    if reason.contains("terminated and relaunched")
            ));
        }
        for code in RESETTABLE {
            let error = HipError::new("hipStreamSynchronize", code).into_error(Doing::Other(None));
            assert!(error.is_sticky() && !error.is_process_fatal(), "{error}");
        }
        assert_eq!(class_of(4242), FaultClass::Recoverable);
    }

    #[test]
    fn the_sticky_codes_have_the_header_values() {
        assert_eq!(STICKY, [700, 719, 710, 702, 214, 709, 53]);
    }

    #[test]
    fn out_of_memory_is_not_sticky_and_keeps_the_size() {
        let error =
            HipError::new("hipMalloc", code::OUT_OF_MEMORY).into_error(Doing::Allocating(1 << 40));
        assert!(!error.is_sticky());
        assert!(error.is_out_of_memory());
        assert!(
            matches!(error, Error::OutOfMemory { requested, backend: BACKEND, .. } if requested == 1 << 40)
        );
        for doing in every_site() {
            let error = HipError::new("hipMemcpyAsync", code::OUT_OF_MEMORY).into_error(doing);
            assert!(error.is_out_of_memory() && !error.is_sticky(), "{error}");
        }
    }

    #[test]
    fn other_codes_follow_the_call_site_and_never_poison() {
        let others = [
            code::INVALID_VALUE,
            code::INVALID_CONFIGURATION,
            code::LAUNCH_OUT_OF_RESOURCES,
            code::INVALID_HANDLE,
            code::ILLEGAL_STATE,
            code::NOT_SUPPORTED,
            code::STREAM_CAPTURE_INVALIDATED,
            code::UNKNOWN,
            code::RUNTIME_MEMORY,
            4242,
        ];
        for code in others {
            assert!(!is_sticky(code) && !is_out_of_memory(code));
            let launch =
                HipError::new("hipModuleLaunchKernel", code).into_error(Doing::Launching {
                    kernel: Arc::from("add"),
                    stream: StreamId(2),
                });
            assert!(
                matches!(&launch, Error::Launch { kernel, stream: StreamId(2), .. } if &**kernel == "add"),
                "{launch}"
            );
            let copy = HipError::new("hipMemcpyAsync", code).into_error(Doing::Copying {
                what: "copy".into(),
                stream: StreamId(0),
            });
            assert!(matches!(copy, Error::Copy { .. }), "{copy}");
            let wait = HipError::new("hipStreamSynchronize", code)
                .into_error(Doing::Waiting(Some(StreamId(3))));
            assert!(
                matches!(&wait, Error::Fault(f) if !f.class.poisons() && f.stream == Some(StreamId(3))),
                "{wait}"
            );
            let other = HipError::new("hipStreamBeginCapture", code).into_error(Doing::Other(None));
            assert!(other.is_refusal(), "{other}");
            for e in [launch, copy, wait, other] {
                assert!(!e.is_sticky() && !e.is_device_poisoned());
            }
        }
    }

    #[test]
    fn an_unnamed_code_still_reads_as_a_number() {
        let error = HipError::new("hipInit", 4242);
        assert_eq!(error.name(), "hipError_t(4242)");
        assert!(
            error
                .to_string()
                .contains("hipInit returned hipError_t(4242)")
        );
        let named = HipError {
            message: Some("an illegal memory access was encountered".into()),
            ..HipError::new("hipStreamSynchronize", code::ILLEGAL_ADDRESS)
        };
        assert!(
            named
                .to_string()
                .contains("hipErrorIllegalAddress: an illegal memory access"),
            "{named}"
        );
    }
}
