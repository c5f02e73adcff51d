//! The server every backend shares.
//!
//! [`Server<B>`] is the whole of a scope server except the device calls: it
//! resolves and validates handles, runs every unit of work inside an
//! [`ExecuteScope`], keeps each stream's capture window and the graph table,
//! orders work across streams, remembers what is in flight so that a fault
//! surfacing late lands on the right bytes (rule 23), poisons the device on
//! a sticky fault (rule 36), retries an allocation that ran out once after
//! trimming the backend's caches (rule 37), and passes every device call
//! through the fault plan. A backend ([`Backend`]) is asked only to do
//! things on the device.
//!
//! It is reached through a [`Client`](crate::Client), which holds it behind
//! one lock.
//!
//! The impl is split along what each part decides:
//!
//! - `handles`: streams and buffers, and the validation of every range a
//!   call names — bad input is a typed error that changes nothing;
//! - `ordering`: poison, cross-capture refusals, cross-stream waits, the one
//!   issue body every unit of work shares, and the attribution of faults
//!   that surface later (in-flight sets, [`conclude`](Server::conclude));
//! - `capture`: capture windows and the graph table;
//! - `work`: the contract's operations on memory and kernels;
//! - `launch`: launches, the path measured for the core's own cost.

mod capture;
mod handles;
mod launch;
mod ordering;
mod recover;
mod work;

pub use recover::Recovered;
use recover::Waits;

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use crate::backend::{Backend, Bound, BoundDispatch, Launch};
use crate::capture::{CaptureState, CaptureWindow, RecordedRound, WindowEnd};
use crate::error::{Error, Result};
use crate::failure::{Work, WorkKind};
use crate::fault::Site;
use crate::handle::{Binding, Buffer, Capture, Dispatch, Dropped, Graph, Slice};
use crate::hooks::Hooks;
use crate::id::{BufferId, BufferRange, ByteRange, GraphId, IdHasher, ServerId, StreamId};
use crate::kernel::{Kernel, KernelId};
use crate::scope::{ExecuteScope, ScopedOutcome, WriteScoped, failed_writing};
use crate::store::FailureStore;
use crate::table::{BufferTable, Ledger, Memories};

/// Host copies move whole 4-byte words on every backend: Vulkan's and
/// wgpu's copy commands require it, so the contract does too, and a
/// runtime's misaligned copy fails the same way everywhere.
pub const COPY_ALIGNMENT: u64 = 4;

/// A buffer range resolved to the backend's memory, as a library call is
/// handed it.
pub(crate) type Resolved<'a, B> = (&'a <B as Backend>::Memory, std::ops::Range<u64>);

/// The most streams one server makes (see `Server::create_stream`).
pub const MAX_STREAMS: usize = 1024;

/// How many write ranges a stream remembers as in flight before the server
/// syncs it to bound the list.
const IN_FLIGHT_LIMIT: usize = 1 << 16;

/// What every launch is checked against that only changes when the device
/// opens (again): worked out then, not asked of the backend per launch.
pub(crate) struct LaunchRules {
    /// The backend's grid (`LaunchLimits::max_workgroups`): host-given
    /// counts past it are refused before any backend check.
    max_workgroups: [u32; 3],
    /// The binding alignment (`Backend::binding_alignment`).
    alignment: u64,
    /// `alignment - 1` where it is a power of two (Vulkan's is, by
    /// specification, and every API's so far), else 0: a mask spares a
    /// 64-bit division per binding, and one test covers the offset and
    /// the length in whole words.
    mask: u64,
    /// Whether the alignment is not a power of two, so that an offset
    /// needs the division after all.
    divide: bool,
}

impl LaunchRules {
    fn of<B: Backend>(backend: &B) -> Self {
        let alignment = backend.binding_alignment();
        let (mask, divide) = if alignment.is_power_of_two() {
            (alignment - 1, false)
        } else {
            (0, true)
        };
        Self {
            max_workgroups: backend.launch_limits().max_workgroups,
            alignment,
            mask,
            divide,
        }
    }
}

pub(crate) struct StreamState<S> {
    device: S,
    window: CaptureWindow,
    /// What work submitted since the last completed sync writes (rule 23).
    in_flight: InFlight,
    failures_seen: u64,
}

/// The write sets a stream has submitted since its last completed wait, in
/// submission order, numbered from the stream's start so that a wait begun
/// at one point can settle exactly what it covered: other threads may submit
/// more on the stream while the wait runs without the lock.
#[derive(Default)]
struct InFlight {
    ranges: Vec<BufferRange>,
    /// How many ranges were settled before `ranges[0]`.
    settled: u64,
}

impl InFlight {
    fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Everything submitted so far: what a wait begun now covers.
    fn mark(&self) -> u64 {
        self.settled + self.ranges.len() as u64
    }

    /// Remember `w`, unless one of the last few ranges is the same (a loop
    /// that writes the same buffer over and over stays one entry).
    #[inline]
    fn push(&mut self, w: BufferRange) {
        if self.ranges.last() == Some(&w) {
            return;
        }
        let recent = self.ranges.len().saturating_sub(8);
        if !self.ranges[recent..].contains(&w) {
            self.ranges.push(w);
        }
    }

    /// Take the ranges submitted before `mark` (all of them for
    /// `u64::MAX`): they completed, or they carry a fault now. Ranges
    /// someone else settled in the meantime are not taken twice.
    fn take_to(&mut self, mark: u64) -> Vec<BufferRange> {
        let n = (mark.saturating_sub(self.settled)).min(self.ranges.len() as u64) as usize;
        self.settled += n as u64;
        self.ranges.drain(..n).collect()
    }

    /// Forget everything: the stream's work all completed.
    fn clear(&mut self) {
        self.settled += self.ranges.len() as u64;
        self.ranges.clear();
    }
}

/// A wait for a stream's work, begun under the server's lock
/// ([`Server::begin_wait`]), run by the client with the lock released
/// ([`PendingWait::wait`]) and settled under it again
/// ([`Server::end_wait`]).
pub(crate) struct PendingWait<B: Backend> {
    stream: StreamId,
    waiter: Option<B::Waiter>,
    /// The stream's in-flight mark when the wait began: what it covers.
    mark: u64,
    /// Counts the wait as in flight until it ends, however it ends.
    token: WaitToken,
}

/// One wait in flight with the lock released: while any is, the server's
/// device must stay as it is, since the waiter names its objects
/// (`Server::recover` waits for none to be left).
pub(crate) struct WaitToken(Option<Arc<Waits>>);

impl WaitToken {
    fn new(waits: &Arc<Waits>, waiting: bool) -> Self {
        if !waiting {
            return Self(None);
        }
        waits.begin();
        Self(Some(waits.clone()))
    }
}

impl Drop for WaitToken {
    fn drop(&mut self) {
        if let Some(waits) = &self.0 {
            waits.end();
        }
    }
}

impl<B: Backend> PendingWait<B> {
    /// Wait, with no lock held.
    pub(crate) fn wait(&self) -> Result<()> {
        match &self.waiter {
            // SAFETY: only `Server::begin_wait` and `begin_read` make a
            // `PendingWait`, from their backend's waiter; the client that
            // waits holds the server alive, and the waiter is ended only
            // when `end_wait` or `end_read` consumes this value.
            Some(waiter) => unsafe { B::wait(waiter) },
            None => Ok(()),
        }
    }

    /// Ask `finished` about the waiter, with no lock held, until it says
    /// so or `until` passes: whether the work finished in time.
    pub(crate) fn finished_by(
        &self,
        until: std::time::Instant,
        finished: impl Fn(&B::Waiter) -> Result<bool>,
    ) -> Result<bool> {
        let Some(waiter) = &self.waiter else {
            return Ok(true);
        };
        loop {
            if finished(waiter)? {
                return Ok(true);
            }
            if std::time::Instant::now() >= until {
                return Ok(false);
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
}

struct GraphEntry<G> {
    /// `None` once the device it was recorded on was lost: it cannot
    /// replay, and is re-captured by the caller.
    graph: Option<G>,
    label: Arc<str>,
    written: Vec<BufferRange>,
    read: Vec<BufferRange>,
    /// What its indirect launches may write: claimed by a failed replay,
    /// healed by none.
    maybe_written: Vec<BufferRange>,
    /// The collective rounds it recorded: a graph with any is replayed only
    /// by its group's ranks together ([`Rank::replay`](crate::collective::Rank::replay)).
    rounds: Vec<crate::capture::RecordedRound>,
}

/// One device's server: the shared logic over a backend `B`.
pub struct Server<B: Backend> {
    backend: B,
    id: ServerId,
    table: BufferTable<B::Memory>,
    streams: Vec<StreamState<B::Stream>>,
    /// Streams lent out and given back ([`Server::lend_stream`]), idle,
    /// for the next loan before a new one is made.
    spare_streams: Vec<StreamId>,
    /// The compile cache: kernels by the index `kernel_index` gives their
    /// id, so a launch hashes its kernel's id once and not at each of its
    /// three uses (the cache check, the backend's check, the launch).
    kernels: Vec<B::Kernel>,
    kernel_index: HashMap<KernelId, usize, BuildHasherDefault<IdHasher>>,
    /// The kernel launched last and its index: a loop launches one kernel
    /// over and over, and a hash lookup per launch was a tenth of the
    /// core's cost of one.
    last_kernel: Option<(KernelId, usize)>,
    graphs: HashMap<GraphId, GraphEntry<B::Graph>>,
    next_graph: u64,
    poison: Option<Arc<Error>>,
    /// Waits in flight with the lock released ([`WaitToken`]).
    waits: Arc<Waits>,
    /// Whether the backend holds no device: a recovery gave the lost one
    /// up and could not open it again. The streams name nothing then, and
    /// nothing may be asked of them; the server stays poisoned.
    detached: bool,
    /// How many times the device was opened again.
    reopened: u64,
    /// Buffers whose memory a recovery gave up, to be made again once the
    /// device opens (kept across attempts that fail).
    to_remake: Vec<BufferId>,
    /// Graphs a recovery gave up, to be reported once the device opens
    /// (kept across attempts that fail, as `to_remake` is: a later attempt
    /// finds them already given up).
    graphs_lost: usize,
    /// What a launch is checked against, worked out when the device
    /// opens.
    rules: LaunchRules,
    write_sets: Vec<Vec<BufferRange>>,
    hooks: Arc<Hooks>,
    copy_label: Arc<str>,
    #[cfg(feature = "fault-injection")]
    faults: crate::fault::FaultPlan,
}

/// What a unit of work's scope settles, split from the rest of its server:
/// the failure books, the streams (their windows, in-flight lists and
/// failure counts, and the backend's stream objects), the pool of write
/// sets and the hook's queue.
///
/// Neither the memory nor the backend is in it. A launch resolves its
/// bindings to the backend's memory once, before its scope opens, so that
/// the backend's check refuses a launch no device could run before
/// anything is claimed; the same list is what the backend then launches.
/// The list borrows the memory, and the scope borrows these books mutably
/// in between: were they one table, the launch would build the list twice,
/// once on each side of the scope.
pub(crate) struct Books<'s, S> {
    pub(crate) id: ServerId,
    pub(crate) ledger: &'s mut Ledger,
    pub(crate) streams: &'s mut [StreamState<S>],
    write_sets: &'s mut Vec<Vec<BufferRange>>,
    hooks: &'s Hooks,
}

impl<S> WriteScoped for Books<'_, S> {
    type Store = Ledger;

    fn store(&mut self) -> &mut Ledger {
        self.ledger
    }

    fn on_failure(&mut self, stream: StreamId, error: &Error) {
        if let Some(state) = self.streams.get_mut(stream.0 as usize) {
            state.failures_seen += 1;
        }
        // Delivered by the client once the lock is released (see `hooks`).
        self.hooks.queue(stream, error);
    }

    fn capturing(&mut self, stream: StreamId) -> Option<&mut CaptureWindow> {
        self.streams
            .get_mut(stream.0 as usize)
            .map(|s| &mut s.window)
            .filter(|w| w.is_recording())
    }

    fn write_set(&mut self) -> Vec<BufferRange> {
        self.write_sets.pop().unwrap_or_default()
    }

    fn recycle(&mut self, mut write_set: Vec<BufferRange>) {
        write_set.clear();
        if self.write_sets.len() < 8 {
            self.write_sets.push(write_set);
        }
    }
}

/// The rest of a server, as a unit of work's device call reaches it: the
/// backend, the memory, the compiled kernels, the graphs and the fault
/// plan ([`Books`] says why it is apart).
pub(crate) struct Device<'s, B: Backend> {
    pub(crate) backend: &'s mut B,
    pub(crate) memory: &'s Memories<B::Memory>,
    kernels: &'s [B::Kernel],
    kernel_index: &'s HashMap<KernelId, usize, BuildHasherDefault<IdHasher>>,
    last_kernel: &'s mut Option<(KernelId, usize)>,
    rules: &'s LaunchRules,
    graphs: &'s HashMap<GraphId, GraphEntry<B::Graph>>,
    #[cfg(feature = "fault-injection")]
    faults: &'s mut crate::fault::FaultPlan,
}

/// What a device call inside [`Device::issue`] may reach: the backend, the
/// issuing stream's device state, and the tables it looks memory and
/// graphs up in.
struct Issue<'a, B: Backend> {
    backend: &'a mut B,
    stream: &'a mut B::Stream,
    memory: &'a Memories<B::Memory>,
    graphs: &'a HashMap<GraphId, GraphEntry<B::Graph>>,
}

/// Ask the fault plan about a device call.
#[inline(always)]
fn consult(
    #[cfg(feature = "fault-injection")] faults: &mut crate::fault::FaultPlan,
    site: Site,
    stream: Option<StreamId>,
) -> Result<()> {
    #[cfg(feature = "fault-injection")]
    if let Some(error) = faults.check(site, stream) {
        return Err(injected(site, stream, error));
    }
    let _ = (site, stream);
    Ok(())
}

/// An injected failure, logged: out of line, so that the event's
/// formatting takes no room in the frame of every unit of work that asks
/// the plan.
#[cfg(feature = "fault-injection")]
#[cold]
#[inline(never)]
fn injected(site: Site, stream: Option<StreamId>, error: Error) -> Error {
    tracing::debug!(?site, ?stream, "injected: {error}");
    error
}

/// `len` zeroed bytes of host memory, or [`Error::OutOfMemory`] when the
/// host cannot give them: a read of any size must not abort the process.
pub(crate) fn host_vec(len: u64) -> Result<Vec<u8>> {
    let out_of_memory = |detail: String| Error::OutOfMemory {
        backend: "host",
        requested: len,
        detail,
    };
    let len = usize::try_from(len)
        .map_err(|_| out_of_memory("longer than the host's address space".to_owned()))?;
    let mut out = Vec::new();
    out.try_reserve_exact(len)
        .map_err(|e| out_of_memory(format!("no room for the bytes read: {e}")))?;
    out.resize(len, 0);
    Ok(out)
}

/// Split-borrow two distinct streams.
fn two<S>(streams: &mut [S], a: usize, b: usize) -> (&mut S, &mut S) {
    debug_assert_ne!(a, b);
    if a < b {
        let (left, right) = streams.split_at_mut(b);
        (&mut left[a], &mut right[0])
    } else {
        let (left, right) = streams.split_at_mut(a);
        (&mut right[0], &mut left[b])
    }
}

impl<B: Backend> Server<B> {
    pub(crate) fn new(mut backend: B, id: ServerId, hooks: Arc<Hooks>) -> Result<Self> {
        let rules = LaunchRules::of(&backend);
        // SAFETY: the backend's first stream, numbered 0.
        let first = unsafe { backend.create_stream(StreamId(0))? };
        Ok(Self {
            backend,
            id,
            table: BufferTable::new(),
            streams: vec![StreamState {
                device: first,
                window: CaptureWindow::new(),
                in_flight: InFlight::default(),
                failures_seen: 0,
            }],
            spare_streams: Vec::new(),
            kernels: Vec::new(),
            kernel_index: HashMap::default(),
            last_kernel: None,
            graphs: HashMap::new(),
            next_graph: 1,
            poison: None,
            waits: Arc::default(),
            detached: false,
            reopened: 0,
            to_remake: Vec::new(),
            graphs_lost: 0,
            rules,
            write_sets: Vec::new(),
            hooks,
            copy_label: Arc::from("copy"),
            #[cfg(feature = "fault-injection")]
            faults: crate::fault::FaultPlan::new(),
        })
    }

    pub(crate) fn backend(&self) -> &B {
        &self.backend
    }

    pub(crate) fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    pub(crate) fn with_memory<R>(
        &self,
        buffer: &Buffer,
        f: impl FnOnce(&B, &B::Memory) -> R,
    ) -> Result<R> {
        let r = self.resolve(buffer, ByteRange::new(0, buffer.size()), "buffer")?;
        self.require_memory(r)?;
        let memory = self.table.memory(r.buffer)?;
        Ok(f(&self.backend, memory))
    }

    /// Ask the fault plan about a device call.
    #[inline]
    pub(super) fn fault(&mut self, site: Site, stream: Option<StreamId>) -> Result<()> {
        consult(
            #[cfg(feature = "fault-injection")]
            &mut self.faults,
            site,
            stream,
        )
    }

    /// The server split into what a scope settles and what the work it
    /// wraps runs on.
    pub(crate) fn split(&mut self) -> (Books<'_, B::Stream>, Device<'_, B>) {
        let Server {
            backend,
            id,
            table,
            streams,
            kernels,
            kernel_index,
            last_kernel,
            graphs,
            rules,
            write_sets,
            hooks,
            #[cfg(feature = "fault-injection")]
            faults,
            ..
        } = self;
        (
            Books {
                id: *id,
                ledger: &mut table.ledger,
                streams,
                write_sets,
                hooks,
            },
            Device {
                backend,
                memory: &table.memory,
                kernels,
                kernel_index,
                last_kernel,
                rules,
                graphs,
                #[cfg(feature = "fault-injection")]
                faults,
            },
        )
    }

    /// The books alone, for work that reaches no device (a failure claimed
    /// from outside, work that never started).
    pub(crate) fn books(&mut self) -> Books<'_, B::Stream> {
        self.split().0
    }

    /// A write set back to the pool ([`WriteScoped::recycle`]).
    pub(super) fn recycle_write_set(&mut self, written: Vec<BufferRange>) {
        self.books().recycle(written);
    }

    /// An empty write set from the pool ([`WriteScoped::write_set`]).
    pub(super) fn write_set(&mut self) -> Vec<BufferRange> {
        self.books().write_set()
    }

    /// Tell the stream's count and the hook of a failure
    /// ([`WriteScoped::on_failure`]).
    pub(super) fn on_failure(&mut self, stream: StreamId, error: &Error) {
        self.books().on_failure(stream, error);
    }

    #[cfg(feature = "fault-injection")]
    pub(crate) fn inject(&mut self, plan: crate::fault::FaultPlan) {
        self.faults = plan;
    }

    pub(super) fn stream_index(&self, stream: StreamId) -> usize {
        let index = stream.0 as usize;
        debug_assert!(index < self.streams.len());
        index.min(self.streams.len() - 1)
    }

    pub(crate) fn failures_seen(&self, stream: StreamId) -> u64 {
        self.streams[self.stream_index(stream)].failures_seen
    }

    /// Whether `id` names a live buffer of this server.
    pub(crate) fn holds(&self, id: BufferId) -> bool {
        self.table.ledger.is_live(id)
    }

    pub(crate) fn failures_held(&self) -> usize {
        self.table.ledger.failures_len()
    }

    #[cfg(feature = "fault-injection")]
    pub(crate) fn dump_failures(&self) -> String {
        self.table.ledger.dump()
    }

    pub(crate) fn failure_claims(&self) -> usize {
        self.table.ledger.claims()
    }

    #[cfg(feature = "fault-injection")]
    pub(crate) fn audit(&self) -> Result<(), String> {
        self.table.ledger.audit()
    }

    pub(crate) fn bytes_allocated(&self) -> u64 {
        self.table.ledger.bytes_allocated()
    }

    pub(crate) fn bytes_reserved(&self) -> u64 {
        self.backend.bytes_reserved()
    }

    pub(crate) fn poison(&self) -> Option<Arc<Error>> {
        self.poison.clone()
    }
}

impl<B: Backend> Drop for Server<B> {
    fn drop(&mut self) {
        // Wait for the device before handing memory back; a fault now has
        // nobody left to tell. A detached server's streams name no device.
        for state in self.streams.iter_mut().filter(|_| !self.detached) {
            if state.window.state() == CaptureState::Recording {
                // SAFETY: this server's stream, recording by its window.
                unsafe { self.backend.abort_capture(&mut state.device) };
            }
            // SAFETY: this server's stream, no longer recording.
            let _ = unsafe { self.backend.sync(&mut state.device) };
        }
        for (_, entry) in self.graphs.drain() {
            if let Some(graph) = entry.graph {
                // SAFETY: drained from the table, so named by no later call.
                let _ = unsafe { self.backend.destroy_graph(graph) };
            }
        }
        for id in self.table.ledger.ids() {
            if let Some(memory) = self.table.remove(id) {
                // SAFETY: removed from the table, so named by no later call;
                // every graph that recorded work on it is destroyed above.
                unsafe { self.backend.free(memory) };
            }
        }
    }
}
