//! The failure model every scope server shares.
//!
//! GPU work is asynchronous: the call that fails is rarely the call that
//! learns of it, and CUDA, HIP and Vulkan answer with device-wide "sticky"
//! errors. scope attaches a failure to the bytes the failed work was meant to
//! write, and lets it travel along the dataflow. Work that reads those bytes
//! is skipped, and its outputs inherit the failure. A host read returns the
//! root error and the chain of skipped kernels back to it. A rewrite heals
//! the bytes. A captured graph that is missing work refuses to seal.
//! Everything else on the device keeps working. The rules are numbered in
//! `docs/ERROR_MODEL.md`; tests cite them by number.
//!
//! # Design decisions
//!
//! 1. **Failures belong to byte ranges, not to devices or calls.** A claim is
//!    a failure id over sorted, disjoint ranges of one allocation
//!    (`Taint`, in `taint.rs`). A partial write stays honest, and two chains of work that
//!    share no buffer never see each other's failures.
//! 2. **Tainted unless proven written.** Work claims its write set before it
//!    runs and releases it only at a clean exit (`ExecuteScope`, in `scope.rs`), so an
//!    early return, a panic or a lost submission leaves the bytes failing,
//!    never silently stale.
//! 3. **Skip, don't run, on a tainted input.** A launch whose input carries a
//!    failure does not run — garbage read as an index scatters into clean
//!    memory — and its outputs point at the *root* failure, so a read names
//!    the cause rather than the last symptom.
//! 4. **The store is bounded by what carries it.** A failure lives exactly as
//!    long as some allocation carries it (`Failures`, in `failure.rs`); the success path
//!    mints into a one-slot nursery and touches no map and no heap.
//! 5. **Rules live once.** `FailureStore` (`store.rs`) carries every rule as a default
//!    method over "where does this buffer's taint live"; `Server<B>` (`server.rs`) carries
//!    every piece of server logic over a [`Backend`] that only makes device
//!    calls. A GPU server crate is its device calls and nothing else.
//! 6. **The window, not the backend, decides whether a graph may seal.**
//!    `CaptureWindow` (`capture.rs`) hears of every unit of work from the scope, so what
//!    is recorded and what is in the graph cannot disagree.
//! 7. **One error type, written for people.** [`Error`] names the kernel,
//!    buffer, stream and range, and classifies faults the same way on every
//!    backend: sticky faults poison, out-of-memory does not.
//! 8. **Failure on purpose, at the same call sites.** A [`FaultPlan`]
//!    (feature `fault-injection`) fails any device call of any server, so a
//!    backend with no device to fault is still tested on every path.
//! 9. **The device calls are an `unsafe` contract.** [`Backend`]'s methods
//!    that touch device memory or the backend's objects are `unsafe fn`s,
//!    as wgpu-hal's are: a backend trusts the offsets and objects it is
//!    handed, and only `Server<B>`, which validated them, calls it. Safe code
//!    reaches a device only through [`Client`].
//! 10. **The core is measured alone.** The [`null`] backend does nothing at
//!     once, so a bench over it is the core's own cost, and a test backend
//!     scripts one device behaviour on it instead of forwarding every call.
//! 11. **Modules form layers; errors sit at the bottom.** Lowest first:
//!     ids and kernels (`id`, `kernel`, `limits`, `few`); `error`; the
//!     failure model (`taint`, `failure`, `store`, `table`, `scope`,
//!     `capture`); what a server is built from (`backend`, `handle`,
//!     `hooks`, `fault`, `probe`, `null`); `server`; `client`;
//!     `collective`. A module names only its own layer or lower ones, so
//!     each layer reads, and tests, without those above it.
//!     `tests/layers.rs` keeps this.
//!
//! # Where things are
//!
//! - The root holds the runtime contract: [`Client`] and what it hands out
//!   and takes ([`Buffer`], [`Slice`], [`Binding`], [`Dispatch`],
//!   [`Capture`], [`Graph`], [`Kernel`]), the one [`Error`] and the reports
//!   inside it, the limits a server publishes, and [`Probe`].
//! - [`backend`] holds what a server author needs: the [`Backend`] trait
//!   and what its calls are handed.
//! - [`collective`] holds groups of devices; [`null`] the backend that
//!   does nothing, for measuring the core alone.
//! - The failure bookkeeping itself (the store, scopes, taint, capture
//!   windows, the generic server) is the crate's own: it is what every
//!   server gets, not what any caller drives.
//!
//! The conformance suite and the reference host server are in the
//! `scope-test` crate; the launch rules and NCCL loader the CUDA and HIP
//! servers share are in `scope-native`.
//!
//! # Start here
//!
//! A runtime gets a client from a server crate, and from then on sees only
//! the contract. Here the null backend stands in for a device:
//!
//! ```
//! use scope_core::{Binding, Client, Dispatch, Kernel};
//! use scope_core::null::Null;
//!
//! let client = Client::new(Null::new())?;
//! let kernel = Kernel::host("double");
//! let buffer = client.upload(&[1, 0, 0, 0, 2, 0, 0, 0])?;
//! client.launch(&kernel, &[Binding::read_write(&buffer)], &[], Dispatch::linear(1))?;
//! // A failure anywhere upstream of `buffer` would be reported here, with
//! // its root cause and the chain of skipped work back to it.
//! let bytes = client.read(&buffer)?;
//! assert_eq!(bytes.len(), 8);
//! # Ok::<(), scope_core::Error>(())
//! ```
//!
//! # Features
//!
//! - `fault-injection`: `Client::inject` and the fault plan.
//! - `internals`: the bookkeeping below the contract, for the crate's own
//!   benches (module `internals`); not a stable API.

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
pub use probe::{BackendKind, DeviceKind, Drivers, Probe, ProbedDevice, required};
pub use server::{COPY_ALIGNMENT, MAX_STREAMS, Recovered};

/// The bookkeeping below the contract, for the crate's own benches to
/// measure alone: the write scope over a bare store, the store's rules,
/// taint. Not a stable API, and not what a server implements (that is
/// [`Backend`]).
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
