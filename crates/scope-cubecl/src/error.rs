//! scope's errors in cubecl's words, and cubecl's in scope's.
//!
//! Every call back to cubecl translates with [`to_server_error`]. A failure the adapter finds
//! becomes [`scope_core::Error::External`] holding the typed [`ServerError`] ([`external`]).
//! A read downstream then gets back the value cubecl made. Keeping the root typed keeps
//! `ServerError::is_refusal` true behind scope's chain of skipped kernels.

use cubecl_environment::backtrace::BackTrace;
use cubecl_runtime::compiler::CompilationError;
use cubecl_runtime::poison::DevicePoison;
use cubecl_runtime::server::{IoError, LaunchError, ServerError};
use scope_core::{Error, UnwrittenBytes};

/// Fails to compile the day `ServerError` stops being a valid [`Error::external`] payload.
const _: fn() = || {
    fn external_payload<E: std::error::Error + Send + Sync + 'static>() {}
    external_payload::<ServerError>();
};

/// A failure cubecl or the adapter found, as scope carries it.
pub(crate) fn external(error: ServerError) -> Error {
    Error::external(error)
}

/// A scope error as cubecl reports it.
pub(crate) fn to_server_error(error: &Error) -> ServerError {
    match error {
        Error::Unwritten(bytes) => several(std::slice::from_ref(&**bytes)),
        Error::SeveralUnwritten(all) => several(all),
        Error::External { error } => error
            .downcast_ref::<ServerError>()
            .cloned()
            .unwrap_or_else(|| generic(error.to_string())),
        Error::Compile { log, .. } => {
            ServerError::Launch(LaunchError::CompilationError(CompilationError::Generic {
                reason: log.clone(),
                backtrace: BackTrace::capture(),
            }))
        }
        Error::OutOfMemory { requested, .. } => ServerError::Io(IoError::OutOfMemory {
            size: *requested,
            backtrace: BackTrace::capture(),
        }),
        Error::DevicePoisoned { fault } => {
            ServerError::DevicePoisoned(DevicePoison::new(fault.to_string()))
        }
        Error::Fault(fault) if error.is_sticky() => {
            ServerError::DevicePoisoned(DevicePoison::new(fault.to_string()))
        }
        Error::Skipped { .. } => ServerError::Skipped,
        Error::NeverFinished { .. } => ServerError::TornDown,
        Error::Refused { .. } | Error::Unsealed { .. } => {
            ServerError::graph_state(error.to_string())
        }
        Error::InvalidArgument { .. } => ServerError::Validation {
            message: error.to_string(),
            backtrace: BackTrace::capture(),
        },
        _ => generic(error.to_string()),
    }
}

fn generic(reason: String) -> ServerError {
    ServerError::Generic {
        reason,
        backtrace: BackTrace::capture(),
    }
}

/// A read that met claimed bytes: cubecl's `Several` of `Unwritten`, roots translated.
fn several(all: &[UnwrittenBytes]) -> ServerError {
    ServerError::Several {
        errors: all.iter().map(unwritten).collect(),
        backtrace: BackTrace::capture(),
    }
}

fn unwritten(bytes: &UnwrittenBytes) -> ServerError {
    let mut chain: Vec<String> = bytes.chain.hops.iter().map(ToString::to_string).collect();
    if bytes.chain.dropped > 0 {
        chain.push(format!(
            "({} older skip records dropped)",
            bytes.chain.dropped
        ));
    }
    ServerError::Unwritten {
        failure: bytes.failure.get(),
        claimed: bytes.carriers,
        chain,
        root: Box::new(to_server_error(&bytes.root)),
        backtrace: BackTrace::capture(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cubecl_runtime::server::ResourceLimitError;

    #[test]
    fn a_refusal_kept_external_reads_back_typed() {
        let refusal = ServerError::Launch(LaunchError::TooManyResources(
            ResourceLimitError::SharedMemory {
                requested: 2,
                max: 1,
                backtrace: BackTrace::capture(),
            },
        ));
        let back = to_server_error(&external(refusal));
        assert!(back.is_refusal(), "{back}");
        assert!(matches!(
            back,
            ServerError::Launch(LaunchError::TooManyResources(
                ResourceLimitError::SharedMemory {
                    requested: 2,
                    max: 1,
                    ..
                }
            ))
        ));
    }

    #[test]
    fn scope_errors_map_onto_cubecls() {
        let oom = Error::OutOfMemory {
            backend: scope_core::BackendKind::Wgpu.name(),
            requested: 7,
            detail: String::new(),
        };
        assert!(matches!(
            to_server_error(&oom),
            ServerError::Io(IoError::OutOfMemory { size: 7, .. })
        ));
        assert!(matches!(
            to_server_error(&Error::invalid("binding 0", "too short")),
            ServerError::Validation { .. }
        ));
        let compile = Error::Compile {
            backend: scope_core::BackendKind::Wgpu.name(),
            kernel: "k".into(),
            log: "bad".into(),
        };
        assert!(to_server_error(&compile).is_refusal());
    }
}
