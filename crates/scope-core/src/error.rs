//! The one error type every server returns: a CUDA illegal address and a
//! Vulkan device loss are both a [`DeviceFault`] that poisons. Errors are
//! `Clone` because every read of a claimed buffer returns one.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::id::{BufferId, BufferRange, FailureId, GraphId, StreamId};

/// What went wrong with a unit of device work, or with a request for one.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A read, sync or export met bytes that carry one failure (rules 24–26).
    #[error("{0}")]
    Unwritten(Box<UnwrittenBytes>),

    /// A read met several distinct failures, each named once (rule 25).
    #[error("{}", several(.0))]
    SeveralUnwritten(Vec<UnwrittenBytes>),

    /// An input carried a failure, so the launch was skipped.
    #[error(
        "skipped `{kernel}` on {stream}: an input carries a failure; read an output for the cause"
    )]
    Skipped {
        /// The kernel that did not run.
        kernel: Arc<str>,
        /// The stream it was issued on.
        stream: StreamId,
    },

    /// Work claimed these bytes and never reached its end (rule 20).
    #[error("{work} never finished, so the bytes it was writing were never written")]
    NeverFinished {
        /// The work, for a person: "launch of `add` on stream 0".
        work: String,
    },

    /// The device could not provide the memory. Not sticky (rule 37).
    #[error("out of memory allocating {requested} bytes on {backend}: {detail}")]
    OutOfMemory {
        /// The backend.
        backend: &'static str,
        /// Bytes asked for.
        requested: u64,
        /// What the driver said.
        detail: String,
    },

    /// The kernel did not compile; `log` is the compiler's own message.
    #[error("kernel `{kernel}` failed to compile for {backend}:\n{log}")]
    Compile {
        /// The backend whose compiler refused it.
        backend: &'static str,
        /// The kernel.
        kernel: Arc<str>,
        /// The compiler's log (a WGSL error keeps its line and column).
        log: String,
    },

    /// The launch was rejected when it was issued.
    #[error("launch of `{kernel}` on {stream} failed: {detail}")]
    Launch {
        /// The kernel.
        kernel: Arc<str>,
        /// The stream.
        stream: StreamId,
        /// What the backend said.
        detail: String,
    },

    /// A host or device copy failed when it was issued.
    #[error("{what} on {stream} failed: {detail}")]
    Copy {
        /// Which copy: "write of buffer #3 (bytes 0..16)".
        what: String,
        /// The stream.
        stream: StreamId,
        /// What the backend said.
        detail: String,
    },

    /// The device reported a fault (rule 23, 36).
    #[error("{0}")]
    Fault(DeviceFault),

    /// The server declined the request; nothing on the device failed (rule 38).
    #[error("refused: {reason}")]
    Refused {
        /// Why.
        reason: String,
    },

    /// A sticky fault poisoned the device; later calls fail fast (rule 36).
    #[error("the device is poisoned by an earlier fault: {fault}")]
    DevicePoisoned {
        /// The original fault.
        fault: Arc<Error>,
    },

    /// Lost with a [recovered](crate::Client::recover) device; writes heal (rule 51).
    #[error("lost with the device, which was opened again: {fault}")]
    LostWithDevice {
        /// The fault that lost the device.
        fault: Arc<Error>,
    },

    /// Cannot reopen in this process; the client stays poisoned (rules 52, 55).
    #[error("{backend} cannot recover from {fault} in this process: {reason}")]
    RestartRequired {
        /// The backend.
        backend: &'static str,
        /// The fault that lost the device.
        fault: Arc<Error>,
        /// What the driver's documentation says.
        reason: String,
    },

    /// The buffer has no memory, and no recorded error says why (rule 28).
    #[error("{buffer} was never allocated")]
    NeverAllocated {
        /// The buffer.
        buffer: BufferId,
    },

    /// A capture window ended without a graph; its outputs carry this (rule 33).
    #[error("the recording on {stream} is missing work and cannot seal: {reason}")]
    Unsealed {
        /// The stream that opened the window.
        stream: StreamId,
        /// Why: the doom, the abandonment, or the driver's refusal.
        reason: Arc<Error>,
    },

    /// A replay of a captured graph failed.
    #[error("replay of {graph} on {stream} failed: {detail}")]
    Replay {
        /// The graph.
        graph: GraphId,
        /// The stream.
        stream: StreamId,
        /// Why.
        detail: String,
    },

    /// The caller passed something the contract does not allow.
    #[error("invalid {what}: {why}")]
    InvalidArgument {
        /// Which argument: "binding 2", "allocation size".
        what: String,
        /// What was wrong with it.
        why: String,
    },

    /// A failure from outside scope, typed for [`Error::external_root`].
    #[error("{error}")]
    External {
        /// The error, typed as its author made it.
        error: Arc<dyn std::error::Error + Send + Sync + 'static>,
    },

    /// A bug in scope; the work it interrupted carries it like any failure.
    #[error("internal error in scope, please report it: {detail}")]
    Internal {
        /// Which invariant broke.
        detail: String,
    },

    /// A collective did not deliver its result ([`crate::collective`]).
    #[error("{0}")]
    Collective(Box<CollectiveError>),

    /// The backend cannot run here: no driver, no library, no device.
    #[error("{backend} is unavailable: {reason}")]
    BackendUnavailable {
        /// The backend.
        backend: &'static str,
        /// Why, for a person deciding what to install.
        reason: String,
    },
}

/// A fault the device or driver reported.
#[derive(Debug, Clone)]
pub struct DeviceFault {
    /// The backend.
    pub backend: &'static str,
    /// The driver's name for it: `VK_ERROR_DEVICE_LOST`.
    pub code: String,
    /// How far it reaches, decided by the backend from its own code.
    pub class: FaultClass,
    /// The stream it surfaced on, when there was one.
    pub stream: Option<StreamId>,
    /// What was being done when it surfaced.
    pub detail: String,
}

/// How far a fault reaches, decided once by the backend: the core poisons
/// (rule 36) and refuses recovery (rule 52) by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultClass {
    /// It fails the work it surfaced on; the device goes on.
    Recoverable,
    /// The device is unusable until opened again: it poisons.
    Sticky,
    /// It poisons; the vendor demands a restart ([why](crate::Backend::RESTART)).
    ProcessFatal,
}

impl FaultClass {
    /// Whether it poisons the device: sticky or process-fatal.
    pub fn poisons(self) -> bool {
        !matches!(self, FaultClass::Recoverable)
    }
}

impl fmt::Display for DeviceFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} device fault {}", self.backend, self.code)?;
        if let Some(stream) = self.stream {
            write!(f, " on {stream}")?;
        }
        if self.class.poisons() {
            f.write_str(" (sticky)")?;
        }
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

/// One failure met by a read, with its root and chain.
#[derive(Debug, Clone)]
pub struct UnwrittenBytes {
    /// The bytes the caller asked for that the failure claims part of.
    pub read: BufferRange,
    /// The failure.
    pub failure: FailureId,
    /// How many allocations the failure still claims.
    pub carriers: u32,
    /// What first went wrong.
    pub root: Arc<Error>,
    /// The skipped work between the bytes read and the root.
    pub chain: Chain,
}

impl fmt::Display for UnwrittenBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} was never written: {} (held by {} allocation{})",
            self.read,
            self.failure,
            self.carriers,
            if self.carriers == 1 { "" } else { "s" }
        )?;
        write!(f, "{}", self.chain)?;
        write!(f, "\n  root cause: {}", self.root)
    }
}

/// The skipped kernels from the bytes read to the root (rule 26).
#[derive(Debug, Clone, Default)]
pub struct Chain {
    /// The hops, starting at the buffer read.
    pub hops: Vec<Hop>,
    /// Skip records dropped past the newest 16.
    pub dropped: u64,
}

impl fmt::Display for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for hop in &self.hops {
            write!(f, "\n  {hop}")?;
        }
        if self.dropped > 0 {
            write!(
                f,
                "\n  ({} older skip record{} dropped)",
                self.dropped,
                if self.dropped == 1 { "" } else { "s" }
            )?;
        }
        Ok(())
    }
}

/// One skipped launch on the way back to a root failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// The kernel that did not run.
    pub kernel: Arc<str>,
    /// The stream it was issued on.
    pub stream: StreamId,
    /// The input that stopped it.
    pub needed: BufferRange,
    /// The output of it that the previous hop (or the read) reached.
    pub wrote: BufferRange,
}

impl fmt::Display for Hop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "skipped `{}` on {} (it would have written {}): it needed {}, which carried the failure",
            self.kernel, self.stream, self.wrote, self.needed
        )
    }
}

fn several(entries: &[UnwrittenBytes]) -> String {
    let mut out = format!("{} distinct failures claim the bytes read:", entries.len());
    for (i, entry) in entries.iter().enumerate() {
        out.push_str(&format!("\n[{}] {entry}", i + 1));
    }
    out
}

impl Error {
    /// An invalid argument, named.
    pub fn invalid(what: impl Into<String>, why: impl Into<String>) -> Self {
        Self::InvalidArgument {
            what: what.into(),
            why: why.into(),
        }
    }

    /// A failure from outside scope, kept typed (see [`Error::External`]).
    pub fn external(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::External {
            error: Arc::new(error),
        }
    }

    /// The first root of type `E` made with [`Error::external`].
    pub fn external_root<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            Error::External { error } => error.downcast_ref::<E>(),
            Error::Unwritten(_) | Error::SeveralUnwritten(_) => self
                .unwritten()
                .iter()
                .find_map(|entry| entry.root.external_root()),
            Error::Unsealed { reason, .. } => reason.external_root(),
            Error::DevicePoisoned { fault } | Error::LostWithDevice { fault } => {
                fault.external_root()
            }
            _ => None,
        }
    }

    /// A broken invariant of scope's own (see [`Error::Internal`]).
    pub fn internal(detail: impl Into<String>) -> Self {
        Self::Internal {
            detail: detail.into(),
        }
    }

    /// A refusal with its reason.
    pub fn refused(reason: impl Into<String>) -> Self {
        Self::Refused {
            reason: reason.into(),
        }
    }

    /// Whether this error or a root it carries is poison (rule 36).
    pub fn is_device_poisoned(&self) -> bool {
        self.any_root(&|e| matches!(e, Error::DevicePoisoned { .. }))
    }

    /// Whether this error or a root it carries is lost memory (rule 51).
    pub fn is_lost_with_device(&self) -> bool {
        self.any_root(&|e| matches!(e, Error::LostWithDevice { .. }))
    }

    /// Whether this error or a root it carries is a refusal (rule 38).
    pub fn is_refusal(&self) -> bool {
        self.any_root(&|e| matches!(e, Error::Refused { .. }))
    }

    /// Whether this error or a root it carries is out-of-memory.
    pub fn is_out_of_memory(&self) -> bool {
        self.any_root(&|e| matches!(e, Error::OutOfMemory { .. }))
    }

    /// Whether this is a fault that poisons ([`FaultClass::poisons`]).
    pub fn is_sticky(&self) -> bool {
        matches!(self, Error::Fault(fault) if fault.class.poisons())
    }

    /// Whether this is a [`FaultClass::ProcessFatal`] fault.
    pub fn is_process_fatal(&self) -> bool {
        matches!(self, Error::Fault(fault) if fault.class == FaultClass::ProcessFatal)
    }

    /// [`Error::RestartRequired`] for `fault` on `backend`, for `reason`.
    pub fn restart_required(
        backend: &'static str,
        fault: &Error,
        reason: impl Into<String>,
    ) -> Self {
        Self::RestartRequired {
            backend,
            fault: Arc::new(fault.clone()),
            reason: reason.into(),
        }
    }

    /// Refuse a process-fatal fault before anything reopens the device.
    ///
    /// # Errors
    ///
    /// [`Error::RestartRequired`] when `self` is process-fatal.
    pub fn refuse_process_fatal(&self, backend: &'static str, reason: &str) -> Result<()> {
        if self.is_process_fatal() {
            return Err(Self::restart_required(backend, self, reason));
        }
        Ok(())
    }

    /// The failures a read report names, in order; else empty.
    pub fn unwritten(&self) -> &[UnwrittenBytes] {
        match self {
            Error::Unwritten(one) => std::slice::from_ref(one),
            Error::SeveralUnwritten(many) => many,
            _ => &[],
        }
    }

    /// The root error of the first failure a read report names, or `self`.
    pub fn root(&self) -> &Error {
        match self.unwritten().first() {
            Some(entry) => entry.root.root(),
            None => self,
        }
    }

    fn any_root(&self, test: &dyn Fn(&Error) -> bool) -> bool {
        if test(self) {
            return true;
        }
        match self {
            Error::Unwritten(_) | Error::SeveralUnwritten(_) => {
                self.unwritten().iter().any(|e| e.root.any_root(test))
            }
            Error::Unsealed { reason, .. } => reason.any_root(test),
            Error::DevicePoisoned { fault } => fault.any_root(test),
            Error::LostWithDevice { fault } => fault.any_root(test),
            _ => false,
        }
    }
}

/// The result every fallible call of the contract returns.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a collective did not deliver ([`Error::Collective`]), kept below its makers.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveError {
    /// A rank's input carried a failure; every output carries it (rule 41).
    #[error(
        "{collective} #{round}: rank {rank}'s input could not be read, so no rank's output was written: {cause}"
    )]
    InputFailed {
        /// The collective.
        collective: &'static str,
        /// Which collective of the group, counted from 0.
        round: u64,
        /// The lowest rank whose input failed.
        rank: usize,
        /// What its read answered: the root cause and the chain.
        cause: Error,
    },
    /// Ranks did not join by the deadline; the group breaks (rules 42, 43).
    #[error(
        "{collective} #{round}: rank(s) {missing:?} did not join within {deadline:?}; the group is broken"
    )]
    Missing {
        /// The collective.
        collective: &'static str,
        /// Which collective of the group.
        round: u64,
        /// The ranks that never arrived.
        missing: Vec<usize>,
        /// How long the waiting ranks waited.
        deadline: Duration,
    },
    /// Wrong arguments or disagreeing ranks, claiming nothing (rule 44).
    #[error("{collective} #{round}: refused: rank {rank} {why}")]
    Refused {
        /// The collective.
        collective: &'static str,
        /// Which collective of the group.
        round: u64,
        /// The rank the refusal is about.
        rank: usize,
        /// What was wrong.
        why: String,
    },
    /// A copy from another device met a failure there (rule 46).
    #[error("copied from {from}, whose bytes could not be read: {cause}")]
    SourceFailed {
        /// The device copied from, as its client describes it.
        from: String,
        /// What the read there answered: the root cause and the chain.
        cause: Error,
    },
    /// A library call failed after agreement; the group breaks (rules 42, 43).
    #[error(
        "{collective} #{round}: rank {rank}'s device call failed after the ranks agreed, so no rank's output is trusted; the group is broken: {cause}"
    )]
    IssueFailed {
        /// The collective.
        collective: &'static str,
        /// Which collective of the group.
        round: u64,
        /// The lowest rank whose call failed.
        rank: usize,
        /// What the call answered.
        cause: Error,
    },
    /// Unfinished across processes, no peer named: group broken (rules 42, 43, 49).
    #[error(
        "{collective} #{round}: not every rank completed it (a peer in another process is missing, stuck or failed, and the library cannot say which; this rank waited at most {deadline:?}); the group is broken"
    )]
    Stalled {
        /// The collective.
        collective: &'static str,
        /// Which collective of the group.
        round: u64,
        /// How long this rank waited.
        deadline: Duration,
    },
    /// The transport's library (NCCL, RCCL) answered an error of its own.
    #[error("{library} `{call}` failed: {detail}")]
    Library {
        /// Which library ("nccl", "rccl").
        library: &'static str,
        /// The entry point.
        call: &'static str,
        /// Its result code and what the library says it means.
        detail: String,
    },
    /// The group lost a rank; survivors go on by
    /// [`Rank::shrink`](crate::collective::Rank::shrink) (rules 43, 54).
    #[error("the group is broken ({cause}); shrink it to its survivors, or make a new group")]
    Broken {
        /// What broke it.
        cause: Arc<CollectiveError>,
    },
    /// A call through a superseded membership epoch, claiming nothing (rule 55).
    #[error("called through membership epoch {epoch}, which epoch {current} superseded{}", stale_advice(*left_out, *current))]
    Stale {
        /// The epoch the call came through.
        epoch: u64,
        /// The epoch that superseded it.
        current: u64,
        /// Whether the new epoch left this rank out.
        left_out: bool,
    },
}

/// What a [`CollectiveError::Stale`] tells the caller to do.
fn stale_advice(left_out: bool, current: u64) -> String {
    if left_out {
        format!(" without this rank: it is no member of epoch {current}; the group must admit it")
    } else {
        format!(": call through this rank's handle of epoch {current}, which the change returned")
    }
}

impl From<CollectiveError> for Error {
    fn from(error: CollectiveError) -> Self {
        Error::Collective(Box::new(error))
    }
}
