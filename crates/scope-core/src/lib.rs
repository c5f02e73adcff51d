//! The failure model every scope server shares.
//!
//! GPU work is asynchronous: the call that fails is rarely the call that
//! learns of it, and CUDA, HIP and Vulkan answer with device-wide "sticky"
//! errors. scope attaches a failure to the bytes the failed work was meant to
//! write, and lets it travel along the dataflow: work that reads those bytes
//! is skipped and its outputs inherit the failure, a host read returns the
//! root error and the chain of skipped kernels back to it, a rewrite heals
//! the bytes, and a captured graph that is missing work refuses to seal.
//! Everything else on the device keeps working. The rules are numbered in
//! `docs/ERROR_MODEL.md`; tests cite them by number.
//!
//! # Design decisions
//!
//! 1. **Failures belong to byte ranges, not to devices or calls.** A claim is
//!    a failure id over sorted, disjoint ranges of one allocation
//!    ([`Taint`]). A partial write stays honest, and two chains of work that
//!    share no buffer never see each other's failures.
//! 2. **Tainted unless proven written.** Work claims its write set before it
//!    runs and releases it only at a clean exit ([`ExecuteScope`]), so an
//!    early return, a panic or a lost submission leaves the bytes failing,
//!    never silently stale.
//! 3. **Skip, don't run, on a tainted input.** A launch whose input carries a
//!    failure does not run — garbage read as an index scatters into clean
//!    memory — and its outputs point at the *root* failure, so a read names
//!    the cause rather than the last symptom.
//! 4. **The store is bounded by what carries it.** A failure lives exactly as
//!    long as some allocation carries it ([`Failures`]); the success path
//!    mints into a one-slot nursery and touches no map and no heap.
//! 5. **Rules live once.** [`FailureStore`] carries every rule as a default
//!    method over "where does this buffer's taint live"; [`Server`] carries
//!    every piece of server logic over a [`Backend`] that only makes device
//!    calls. A GPU server crate is its device calls and nothing else.
//! 6. **The window, not the backend, decides whether a graph may seal.**
//!    [`CaptureWindow`] hears of every unit of work from the scope, so what
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
//!    handed, and only [`Server`], which validated them, calls it. Safe code
//!    reaches a device only through [`Client`].
//! 10. **The core is measured alone.** The [`null`] backend does nothing at
//!     once, so a bench over it is the core's own cost, and a test backend
//!     scripts one device behaviour on it instead of forwarding every call.
//!
//! # Features
//!
//! - `host`: the reference host server (module `host`).
//! - `fault-injection`: `Client::inject` and the fault plan.
//! - `conformance`: the generic conformance suite, module `conformance`
//!   (implies `fault-injection`).

mod backend;
mod capture;
mod client;
pub mod collective;
mod error;
mod failure;
mod fault;
mod handle;
mod hooks;
mod id;
pub mod kernel;
mod limits;
pub mod native;
pub mod null;
mod probe;
mod scope;
mod server;
mod store;
mod table;
mod taint;

#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "host")]
pub mod host;

pub use backend::{Access, Backend, Bound, BoundDispatch, Launch};
pub use capture::{CaptureState, CaptureWindow, RecordedRound, WindowEnd};
pub use client::{Client, WeakClient};
pub use error::{Chain, DeviceFault, Error, Hop, Result, UnwrittenBytes};
pub use failure::{FailureNode, Failures, MAX_SKIP_RECORDS, SkipRecord, Work, WorkKind};
pub use fault::{FaultPlan, Site};
pub use handle::{Binding, Buffer, Capture, Dispatch, Graph, Slice};
pub use id::{BufferId, BufferRange, ByteRange, FailureId, GraphId, StreamId};
pub use kernel::{Kernel, KernelId, KernelSource, Language, Unchecked};
pub use limits::{DeviceFeatures, DeviceLimits, LaunchLimits};
pub use probe::{DeviceKind, Probe, ProbedDevice, required};
pub use scope::{ExecuteScope, ScopedOutcome, WriteScoped, failed_writing};
pub use server::{COPY_ALIGNMENT, MAX_STREAMS, Server};
pub use store::{FailureStore, TaintSlot};
pub use table::BufferTable;
pub use taint::{Claim, Ranges, Taint};
