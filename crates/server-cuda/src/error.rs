//! `CUresult` → the core's typed [`Error`]: the one place CUDA's codes get a
//! meaning.
//!
//! The failure model needs three answers from every driver error, and CUDA
//! gives them by code alone, so classification is a pure function of the code
//! and of what was being done (which decides the variant a person reads):
//!
//! - **Does it poison?** CUDA declares a set of errors *sticky*: the context is
//!   corrupt and every later call in it fails the same way. Those become
//!   [`Error::Fault`] with `sticky: true`, and the core poisons the device
//!   (rule 36). The list is [`STICKY`]: the errors after which CUDA's
//!   documentation says "the process must be terminated and relaunched"
//!   (illegal address, launch failure, misaligned address, illegal
//!   instruction, hardware stack error, device assert, launch timeout,
//!   invalid PC, invalid address space: [`PROCESS_FATAL`](crate::PROCESS_FATAL),
//!   which a recovery refuses), and those that leave the context unusable
//!   until it is reset (ECC and NVLink uncorrectable, context destroyed).
//! - **Is it out-of-memory?** Never sticky (rule 37): [`Error::OutOfMemory`],
//!   so the core can trim the pool and retry.
//! - **Otherwise**, the variant names the operation: a rejected launch is
//!   [`Error::Launch`], a rejected copy [`Error::Copy`], a module the JIT
//!   refuses [`Error::Compile`]; anything reported by a wait or a capture is a
//!   non-sticky [`Error::Fault`] carrying the code, which the core attributes
//!   to the work in flight (rule 23) or wraps as the reason a graph did not
//!   seal (rule 33).
//!
//! Nothing here calls the driver unless it is loaded: the unit tests classify
//! every code on a machine with no `libcuda`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::sys::CUresult;
use scope_core::{DeviceFault, Error, StreamId};

/// The backend's name in every error.
pub(crate) const BACKEND: &str = "cuda";

/// Set once `cuInit` succeeded: from then on `cuGetErrorString` may be asked
/// for a description. Before that (and in unit tests) the code's name alone
/// is reported, because cudarc panics on a driver call with no library.
static DRIVER_LOADED: AtomicBool = AtomicBool::new(false);

pub(crate) fn mark_driver_loaded() {
    DRIVER_LOADED.store(true, Ordering::Release);
}

/// The codes CUDA declares sticky: after one, the context is unusable.
pub const STICKY: &[CUresult] = &[
    CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
    CUresult::CUDA_ERROR_LAUNCH_FAILED,
    CUresult::CUDA_ERROR_MISALIGNED_ADDRESS,
    CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION,
    CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR,
    CUresult::CUDA_ERROR_ECC_UNCORRECTABLE,
    CUresult::CUDA_ERROR_NVLINK_UNCORRECTABLE,
    CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED,
    CUresult::CUDA_ERROR_ASSERT,
    CUresult::CUDA_ERROR_LAUNCH_TIMEOUT,
    CUresult::CUDA_ERROR_INVALID_PC,
    CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE,
];

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

/// Whether CUDA declares `code` sticky.
pub fn is_sticky(code: CUresult) -> bool {
    STICKY.contains(&code)
}

/// The driver's name for `code`: `CUDA_ERROR_ILLEGAL_ADDRESS`.
pub fn code_name(code: CUresult) -> String {
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
pub enum Doing<'a> {
    /// Allocating `bytes` of device (or pinned host) memory.
    Allocate {
        /// Bytes asked for.
        bytes: u64,
    },
    /// Launching a kernel.
    Launch {
        /// Its name.
        kernel: &'a Arc<str>,
        /// The stream.
        stream: StreamId,
    },
    /// A host or device copy.
    Copy {
        /// Which copy, for a person.
        what: &'a str,
        /// The stream.
        stream: StreamId,
    },
    /// Loading a module or finding its entry point.
    Load {
        /// The kernel.
        kernel: &'a Arc<str>,
    },
    /// Waiting for a stream, an event or a replay.
    Wait {
        /// The stream, when there is one.
        stream: Option<StreamId>,
        /// What was waited for.
        what: &'a str,
    },
    /// Stream capture, graph instantiation or replay.
    Capture {
        /// The stream.
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

fn fault(code: CUresult, sticky: bool, stream: Option<StreamId>, detail: String) -> Error {
    Error::Fault(DeviceFault {
        backend: BACKEND,
        code: code_name(code),
        sticky,
        stream,
        detail,
    })
}

/// The typed error for `code`, answered while `doing`.
pub fn classify(code: CUresult, doing: Doing<'_>) -> Error {
    let stream = match &doing {
        Doing::Launch { stream, .. }
        | Doing::Copy { stream, .. }
        | Doing::Capture { stream, .. } => Some(*stream),
        Doing::Wait { stream, .. } => *stream,
        Doing::Allocate { .. } | Doing::Load { .. } | Doing::Start { .. } => None,
    };
    if is_sticky(code) {
        let detail = match &doing {
            Doing::Launch { kernel, .. } => format!("surfaced launching `{kernel}`"),
            Doing::Copy { what, .. } => format!("surfaced during {what}"),
            Doing::Wait { what, .. } => format!("surfaced waiting for {what}"),
            Doing::Capture { what, .. } => format!("surfaced during {what}"),
            Doing::Load { kernel } => format!("surfaced loading `{kernel}`"),
            Doing::Allocate { bytes } => format!("surfaced allocating {bytes} bytes"),
            Doing::Start { what } => format!("surfaced during {what}"),
        };
        return fault(code, true, stream, format!("{detail} ({})", explain(code)));
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
            false,
            stream,
            format!("waiting for {what}: {}", explain(code)),
        ),
        Doing::Capture { what, .. } => {
            fault(code, false, stream, format!("{what}: {}", explain(code)))
        }
        Doing::Load { kernel } => fault(
            code,
            false,
            None,
            format!("loading `{kernel}`: {}", explain(code)),
        ),
        Doing::Allocate { bytes } => fault(
            code,
            false,
            None,
            format!("allocating {bytes} bytes: {}", explain(code)),
        ),
        Doing::Start { what } => fault(code, false, None, format!("{what}: {}", explain(code))),
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
        for &code in STICKY {
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
                assert_eq!(fault.backend, "cuda");
                assert!(!error.is_out_of_memory());
            }
        }
    }

    #[test]
    fn the_sticky_list_is_the_one_cuda_documents() {
        let names: Vec<String> = STICKY.iter().map(|&c| code_name(c)).collect();
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

    #[test]
    fn out_of_memory_is_not_sticky_and_keeps_the_request() {
        let error = classify(
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            Doing::Allocate { bytes: 1 << 40 },
        );
        assert!(!error.is_sticky());
        assert!(error.is_out_of_memory());
        assert!(
            matches!(error, Error::OutOfMemory { requested, backend: "cuda", .. } if requested == 1 << 40),
            "{error:?}"
        );
        // Out-of-memory at launch (a kernel's resources) is still not sticky.
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
                matches!(&error, Error::Compile { log, backend: "cuda", .. } if log.contains(&code_name(code))),
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
                    assert!(!fault.sticky);
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
            matches!(&error, Error::Fault(f) if !f.sticky && f.code == "CUDA_ERROR_UNKNOWN"),
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
                        backend: "cuda",
                        ..
                    }
                ),
                "{error:?}"
            );
        }
    }

    #[test]
    fn classification_never_calls_the_driver_before_it_is_loaded() {
        // On a machine with no libcuda this would panic inside cudarc if the
        // description were asked for; the name alone is reported.
        if !DRIVER_LOADED.load(Ordering::Acquire) {
            assert_eq!(explain(CUresult::CUDA_ERROR_ASSERT), "CUDA_ERROR_ASSERT");
        }
    }
}
