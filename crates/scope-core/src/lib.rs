//! The failure model every scope server shares.
//!
//! GPU work is asynchronous, and CUDA, HIP and Vulkan answer with device-wide
//! "sticky" errors. scope attaches a failure to the bytes failed work was
//! meant to write. Work reading them is skipped, and its outputs inherit the
//! failure; a host read returns the root error and the chain to it; a rewrite
//! heals the bytes. `docs/ERROR_MODEL.md` numbers the rules.
//!
//! # Design decisions
//!
//! 1. **Failures belong to byte ranges** (`taint.rs`): a partial write
//!    stays honest, and chains that share no buffer never meet.
//! 2. **Tainted unless proven written** (`scope.rs`): an early return, a
//!    panic or a lost submission leaves the bytes failing, never stale.
//! 3. **Skip on a tainted input**: garbage read as an index scatters into
//!    clean memory. Outputs point at the *root* failure.
//! 4. **A failure lives as long as some allocation carries it**
//!    (`failure.rs`); the success path touches no map and no heap.
//! 5. **Rules live once**: in `FailureStore` (`store.rs`) and `Server<B>`
//!    (`server.rs`), over a [`Backend`] that only makes device calls.
//! 6. **The window decides whether a graph may seal** (`capture.rs`), so
//!    what is recorded and what is in the graph cannot disagree.
//! 7. **One error type, for people**: [`Error`] classes faults alike everywhere.
//! 8. **Failure on purpose**: a [`FaultPlan`] fails any device call, so a
//!    backend with no device to fault is still tested on every path.
//! 9. **The device calls are an `unsafe` contract**, as wgpu-hal's are:
//!    only `Server<B>`, which validated the arguments, calls [`Backend`].
//! 10. **The core is measured alone** over the [`null`] backend.
//! 11. **Modules form layers**, lowest first: `id`, `kernel`, `limits`,
//!     `few`; `error`; `taint`, `failure`, `store`, `table`, `scope`,
//!     `capture`; `backend`, `handle`, `hooks`, `fault`, `probe`, `null`;
//!     `server`; `client`; `collective`. `tests/layers.rs` keeps this.
//!
//! The root holds the runtime contract, [`Client`] and what it takes and
//! hands out; [`backend`], what a server author needs. The conformance suite
//! is in `scope-test`, the CUDA and HIP launch rules in `scope-native`.
//!
//! ```
//! use scope_core::{Binding, Client, Dispatch, Kernel};
//! use scope_core::null::Null;
//!
//! let client = Client::new(Null::new())?;
//! let kernel = Kernel::host("double");
//! let buffer = client.upload(&[1, 0, 0, 0, 2, 0, 0, 0])?;
//! client.launch(&kernel, &[Binding::read_write(&buffer)], &[], Dispatch::linear(1))?;
//! let bytes = client.read(&buffer)?;
//! assert_eq!(bytes.len(), 8);
//! # Ok::<(), scope_core::Error>(())
//! ```
//!
//! Features: `fault-injection` (`Client::inject`), `internals` (benches; unstable).

pub mod backend;
mod capture;
mod client;
pub mod collective;
mod error;
mod failure;
mod fault;
mod few;
mod handle;
mod hooks;
pub mod id;
pub mod kernel;
mod limits;
pub mod null;
mod probe;
mod scope;
mod server;
mod store;
mod table;
mod taint;

pub use backend::{Access, Backend};
pub use capture::CaptureState;
pub use client::{Client, RECOVER_PATIENCE, WeakClient};
pub use error::FaultClass;
pub use error::{Chain, DeviceFault, Error, Hop, Result, UnwrittenBytes};
pub use fault::{FaultPlan, Site};
pub use handle::{Binding, Buffer, Capture, Dispatch, Graph, Slice};
pub use id::{BufferId, BufferRange, ByteRange, FailureId, GraphId, StreamId};
pub use kernel::{Kernel, KernelId, KernelSource, Language, Unchecked};
pub use limits::{DeviceFeatures, DeviceLimits, LaunchLimits};
pub use probe::Kind;
pub use probe::{BackendKind, DeviceKind, Drivers, Probe, ProbedDevice, required};
pub use server::{COPY_ALIGNMENT, MAX_STREAMS, Recovered};

/// The bookkeeping below the contract, for benches; not a stable API.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals {
    pub use crate::capture::{CaptureWindow, RecordedRound, WindowEnd};
    pub use crate::failure::{FailureNode, Failures, MAX_SKIP_RECORDS, SkipRecord, Work, WorkKind};
    pub use crate::scope::{ExecuteScope, ScopedOutcome, WriteScoped, failed_writing};
    pub use crate::store::{FailureStore, TaintSlot};
    pub use crate::table::BufferTable;
    pub use crate::taint::{Claim, Ranges, Taint};
}
