//! `CUresult` → the core's typed [`Error`]: the one place CUDA's codes get a meaning.
//!
//! Classification is a pure function of the code and of what was being done:
//!
//! - **How far does it reach?** [`class_of`], from CUDA's documentation: [`PROCESS_FATAL`] codes
//!   need a new process, [`RESETTABLE`] ones a context reset. Both poison the device (rule 36); a
//!   recovery refuses the first (rule 52).
//! - **Out of memory** is never sticky (rule 37): [`Error::OutOfMemory`], so the core can trim the
//!   pool and retry.
//! - **Otherwise** the variant names the operation: [`Error::Launch`], [`Error::Copy`],
//!   [`Error::Compile`]. A wait's or a capture's error is a recoverable [`Error::Fault`] carrying
//!   the code (rules 23, 33).
//!
//! Nothing here calls an unloaded driver: the unit tests run with no `libcuda`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::sys::CUresult;
use scope_core::{BackendKind, DeviceFault, Error, FaultClass, StreamId};

/// The table's row for this server; its name is in every error.
pub(crate) const KIND: BackendKind = BackendKind::Cuda;
pub(crate) const BACKEND: &str = KIND.name();

/// Set once `cuInit` succeeded. Before that, only the code's name is reported: cudarc would panic.
static DRIVER_LOADED: AtomicBool = AtomicBool::new(false);

pub(crate) fn mark_driver_loaded() {
    DRIVER_LOADED.store(true, Ordering::Release);
}

/// Sticky codes after which, CUDA documents, the process must be relaunched.
pub(crate) const PROCESS_FATAL: &[CUresult] = &[
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

/// The other sticky codes: the context is unusable until it is reset.
pub(crate) const RESETTABLE: &[CUresult] = &[
    CUresult::CUDA_ERROR_ECC_UNCORRECTABLE,
    CUresult::CUDA_ERROR_NVLINK_UNCORRECTABLE,
    CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED,
];

/// Why a [`PROCESS_FATAL`] code refuses a recovery.
pub(crate) const RESTART: &str = "CUDA's documentation says that after this error the process must be \
                       terminated and relaunched to use CUDA again";

/// How far `code` reaches, by CUDA's documentation.
pub(crate) fn class_of(code: CUresult) -> FaultClass {
    scope_native::class_of(code, PROCESS_FATAL, RESETTABLE)
}

/// Codes that mean a module or kernel image was refused: a compile error.
const REFUSED_IMAGE: &[CUresult] = &[
    CUresult::CUDA_ERROR_INVALID_PTX,
    CUresult::CUDA_ERROR_INVALID_IMAGE,
    CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU,
    CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
    CUresult::CUDA_ERROR_JIT_COMPILER_NOT_FOUND,
    CUresult::CUDA_ERROR_JIT_COMPILATION_DISABLED,
    CUresult::CUDA_ERROR_INVALID_SOURCE,
    CUresult::CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,
    CUresult::CUDA_ERROR_SHARED_OBJECT_INIT_FAILED,
];

/// Codes that mean there is no usable device here, at start-up.
const UNAVAILABLE: &[CUresult] = &[
    CUresult::CUDA_ERROR_NO_DEVICE,
    CUresult::CUDA_ERROR_INVALID_DEVICE,
    CUresult::CUDA_ERROR_NOT_INITIALIZED,
    CUresult::CUDA_ERROR_DEINITIALIZED,
    CUresult::CUDA_ERROR_STUB_LIBRARY,
    CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
    CUresult::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
    CUresult::CUDA_ERROR_SYSTEM_NOT_READY,
    CUresult::CUDA_ERROR_DEVICE_NOT_LICENSED,
    CUresult::CUDA_ERROR_DEVICE_UNAVAILABLE,
    CUresult::CUDA_ERROR_OPERATING_SYSTEM,
];

/// The driver's name for `code`: `CUDA_ERROR_ILLEGAL_ADDRESS`.
pub(crate) fn code_name(code: CUresult) -> String {
    format!("{code:?}")
}

/// The driver's description of `code`, when the driver is loaded.
fn description(code: CUresult) -> Option<String> {
    if !DRIVER_LOADED.load(Ordering::Acquire) {
        return None;
    }
    cudarc::driver::result::DriverError(code)
        .error_string()
        .ok()
        .map(|s| s.to_string_lossy().into_owned())
}

/// `NAME: description`, or the name alone.
pub(crate) fn explain(code: CUresult) -> String {
    match description(code) {
        Some(text) => format!("{}: {text}", code_name(code)),
        None => code_name(code),
    }
}

/// What was being done when the driver answered; decides the variant.
#[derive(Debug, Clone)]
pub(crate) enum Doing<'a> {
    /// Allocating `bytes` of device (or pinned host) memory.
    Allocate {
        /// Bytes asked for.
        bytes: u64,
    },
    /// Launching a kernel.
    Launch {
        kernel: &'a Arc<str>,
        stream: StreamId,
    },
    /// A host or device copy.
    Copy {
        /// Which copy, for a person.
        what: &'a str,
        stream: StreamId,
    },
    /// Loading a module or finding its entry point.
    Load {
        /// The kernel.
        kernel: &'a Arc<str>,
    },
    /// Waiting for a stream, an event or a replay.
    Wait {
        stream: Option<StreamId>,
        what: &'a str,
    },
    /// Stream capture, graph instantiation or replay.
    Capture {
        stream: StreamId,
        /// The step.
        what: &'a str,
    },
    /// Starting up: context, streams, the pool.
    Start {
        /// The step.
        what: &'a str,
    },
}

fn fault(code: CUresult, class: FaultClass, stream: Option<StreamId>, detail: String) -> Error {
    Error::Fault(DeviceFault {
        backend: BACKEND,
        code: code_name(code),
        class,
        stream,
        detail,
    })
}

/// The typed error for `code`, answered while `doing`.
pub(crate) fn classify(code: CUresult, doing: Doing<'_>) -> Error {
    let stream = match &doing {
        Doing::Launch { stream, .. }
        | Doing::Copy { stream, .. }
        | Doing::Capture { stream, .. } => Some(*stream),
        Doing::Wait { stream, .. } => *stream,
        Doing::Allocate { .. } | Doing::Load { .. } | Doing::Start { .. } => None,
    };
    let class = class_of(code);
    if class.poisons() {
        let detail = match &doing {
            Doing::Launch { kernel, .. } => format!("surfaced launching `{kernel}`"),
            Doing::Copy { what, .. } => format!("surfaced during {what}"),
            Doing::Wait { what, .. } => format!("surfaced waiting for {what}"),
            Doing::Capture { what, .. } => format!("surfaced during {what}"),
            Doing::Load { kernel } => format!("surfaced loading `{kernel}`"),
            Doing::Allocate { bytes } => format!("surfaced allocating {bytes} bytes"),
            Doing::Start { what } => format!("surfaced during {what}"),
        };
        return fault(code, class, stream, format!("{detail} ({})", explain(code)));
    }
    if code == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        let requested = match doing {
            Doing::Allocate { bytes } => bytes,
            _ => 0,
        };
        return Error::OutOfMemory {
            backend: BACKEND,
            requested,
            detail: explain(code),
        };
    }
    match doing {
        Doing::Start { what } if UNAVAILABLE.contains(&code) => Error::BackendUnavailable {
            backend: BACKEND,
            reason: format!("{what}: {}", explain(code)),
        },
        Doing::Load { kernel }
            if REFUSED_IMAGE.contains(&code) || code == CUresult::CUDA_ERROR_NOT_FOUND =>
        {
            Error::Compile {
                backend: BACKEND,
                kernel: kernel.clone(),
                log: explain(code),
            }
        }
        Doing::Launch { kernel, stream } => Error::Launch {
            kernel: kernel.clone(),
            stream,
            detail: explain(code),
        },
        Doing::Copy { what, stream } => Error::Copy {
            what: what.to_owned(),
            stream,
            detail: explain(code),
        },
        Doing::Wait { what, .. } => fault(
            code,
            class,
            stream,
            format!("waiting for {what}: {}", explain(code)),
        ),
        Doing::Capture { what, .. } => {
            fault(code, class, stream, format!("{what}: {}", explain(code)))
        }
        Doing::Load { kernel } => fault(
            code,
            class,
            None,
            format!("loading `{kernel}`: {}", explain(code)),
        ),
        Doing::Allocate { bytes } => fault(
            code,
            class,
            None,
            format!("allocating {bytes} bytes: {}", explain(code)),
        ),
        Doing::Start { what } => fault(code, class, None, format!("{what}: {}", explain(code))),
    }
}

/// [`classify`] for a cudarc [`DriverError`](cudarc::driver::DriverError).
pub(crate) fn driver(error: cudarc::driver::DriverError, doing: Doing<'_>) -> Error {
    classify(error.0, doing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel() -> Arc<str> {
        Arc::from("add")
    }

    #[test]
    fn every_sticky_code_is_a_sticky_fault_wherever_it_surfaces() {
        let name = kernel();
        for &code in PROCESS_FATAL.iter().chain(RESETTABLE) {
            let doings = [
                Doing::Launch {
                    kernel: &name,
                    stream: StreamId(1),
                },
                Doing::Wait {
                    stream: Some(StreamId(1)),
                    what: "stream 1",
                },
                Doing::Copy {
                    what: "read",
                    stream: StreamId(1),
                },
                Doing::Capture {
                    stream: StreamId(1),
                    what: "replay",
                },
                Doing::Allocate { bytes: 4 },
                Doing::Load { kernel: &name },
            ];
            for doing in doings {
                let error = classify(code, doing.clone());
                assert!(error.is_sticky(), "{code:?} while {doing:?} gave {error:?}");
                let Error::Fault(fault) = &error else {
                    panic!("{code:?} gave {error:?}")
                };
                assert_eq!(fault.code, code_name(code));
                assert_eq!(fault.class, class_of(code));
                assert_eq!(fault.backend, BACKEND);
                assert!(!error.is_out_of_memory());
            }
        }
    }

    #[test]
    fn the_sticky_list_is_the_one_cuda_documents() {
        let names: Vec<String> = PROCESS_FATAL
            .iter()
            .chain(RESETTABLE)
            .map(|&c| code_name(c))
            .collect();
        for expected in [
            "CUDA_ERROR_ILLEGAL_ADDRESS",
            "CUDA_ERROR_LAUNCH_FAILED",
            "CUDA_ERROR_MISALIGNED_ADDRESS",
            "CUDA_ERROR_ILLEGAL_INSTRUCTION",
            "CUDA_ERROR_HARDWARE_STACK_ERROR",
            "CUDA_ERROR_ECC_UNCORRECTABLE",
            "CUDA_ERROR_CONTEXT_IS_DESTROYED",
            "CUDA_ERROR_ASSERT",
            "CUDA_ERROR_LAUNCH_TIMEOUT",
            "CUDA_ERROR_INVALID_PC",
            "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} missing from {names:?}"
            );
        }
    }

    /// Rule 52: the class is the code's own; process-fatal codes refuse a recovery.
    #[test]
    fn the_class_is_the_codes_own() {
        let name = kernel();
        for &code in PROCESS_FATAL {
            let error = classify(code, Doing::Load { kernel: &name });
            assert!(error.is_process_fatal(), "{code:?}: {error}");
            let refused = error.refuse_process_fatal(BACKEND, RESTART).unwrap_err();
            assert!(
                matches!(&refused, Error::RestartRequired { backend: BACKEND, reason, .. }
                    if reason.contains("terminated and relaunched")),
                "{refused}"
            );
        }
        for &code in RESETTABLE {
            let error = classify(code, Doing::Allocate { bytes: 4 });
            assert!(error.is_sticky() && !error.is_process_fatal(), "{code:?}");
            assert!(error.refuse_process_fatal(BACKEND, RESTART).is_ok());
        }
        // A code no list names is recoverable whatever its name says.
        assert_eq!(
            class_of(CUresult::CUDA_ERROR_ILLEGAL_STATE),
            FaultClass::Recoverable
        );
    }

    #[test]
    fn out_of_memory_is_not_sticky_and_keeps_the_request() {
        let error = classify(
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            Doing::Allocate { bytes: 1 << 40 },
        );
        assert!(!error.is_sticky());
        assert!(error.is_out_of_memory());
        assert!(
            matches!(error, Error::OutOfMemory { requested, backend: BACKEND, .. } if requested == 1 << 40),
            "{error:?}"
        );
        let name = kernel();
        let at_launch = classify(
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            Doing::Launch {
                kernel: &name,
                stream: StreamId(0),
            },
        );
        assert!(at_launch.is_out_of_memory() && !at_launch.is_sticky());
    }

    #[test]
    fn a_rejected_launch_is_a_launch_error_naming_kernel_and_code() {
        let name = kernel();
        let error = classify(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            Doing::Launch {
                kernel: &name,
                stream: StreamId(2),
            },
        );
        match &error {
            Error::Launch {
                kernel,
                stream,
                detail,
            } => {
                assert_eq!(&**kernel, "add");
                assert_eq!(*stream, StreamId(2));
                assert!(detail.contains("CUDA_ERROR_INVALID_VALUE"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
        assert!(!error.is_sticky());
        let resources = classify(
            CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            Doing::Launch {
                kernel: &name,
                stream: StreamId(0),
            },
        );
        assert!(matches!(resources, Error::Launch { .. }), "{resources:?}");
    }

    #[test]
    fn a_rejected_copy_is_a_copy_error() {
        let error = classify(
            CUresult::CUDA_ERROR_INVALID_VALUE,
            Doing::Copy {
                what: "write of 16 bytes",
                stream: StreamId(0),
            },
        );
        assert!(
            matches!(&error, Error::Copy { what, .. } if what == "write of 16 bytes"),
            "{error:?}"
        );
    }

    #[test]
    fn a_refused_module_is_a_compile_error_with_the_code() {
        let name = kernel();
        for code in [
            CUresult::CUDA_ERROR_INVALID_PTX,
            CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
            CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU,
            CUresult::CUDA_ERROR_NOT_FOUND,
        ] {
            let error = classify(code, Doing::Load { kernel: &name });
            assert!(
                matches!(&error, Error::Compile { log, backend: BACKEND, .. } if log.contains(&code_name(code))),
                "{error:?}"
            );
        }
    }

    #[test]
    fn capture_errors_are_non_sticky_faults_carrying_the_code() {
        for code in [
            CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            CUresult::CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
            CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        ] {
            let error = classify(
                code,
                Doing::Capture {
                    stream: StreamId(3),
                    what: "end of capture",
                },
            );
            match &error {
                Error::Fault(fault) => {
                    assert_eq!(fault.class, FaultClass::Recoverable);
                    assert_eq!(fault.code, code_name(code));
                    assert_eq!(fault.stream, Some(StreamId(3)));
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_non_sticky_error_at_a_wait_is_a_non_sticky_fault() {
        let error = classify(
            CUresult::CUDA_ERROR_UNKNOWN,
            Doing::Wait {
                stream: Some(StreamId(0)),
                what: "stream 0",
            },
        );
        assert!(
            matches!(&error, Error::Fault(f) if !f.class.poisons() && f.code == "CUDA_ERROR_UNKNOWN"),
            "{error:?}"
        );
    }

    #[test]
    fn no_device_at_start_up_is_backend_unavailable() {
        for code in [
            CUresult::CUDA_ERROR_NO_DEVICE,
            CUresult::CUDA_ERROR_STUB_LIBRARY,
            CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
        ] {
            let error = classify(code, Doing::Start { what: "cuInit" });
            assert!(
                matches!(
                    error,
                    Error::BackendUnavailable {
                        backend: BACKEND,
                        ..
                    }
                ),
                "{error:?}"
            );
        }
    }

    #[test]
    fn classification_never_calls_the_driver_before_it_is_loaded() {
        // Without libcuda, asking for the description would panic inside cudarc.
        if !DRIVER_LOADED.load(Ordering::Acquire) {
            assert_eq!(explain(CUresult::CUDA_ERROR_ASSERT), "CUDA_ERROR_ASSERT");
        }
    }
}
