//! [`Server<B>`]: a whole scope server over a [`Backend`]'s device calls.
//! It runs work in an [`ExecuteScope`], attributes late faults (rule 23),
//! poisons (rule 36), retries an allocation after a trim (rule 37). `handles`
//! validates, `ordering` orders, `capture` keeps graphs, `work`, `launch` run.

mod capture;
mod handles;
mod launch;
mod ordering;
mod recover;
mod waits;
mod work;

pub use recover::Recovered;
use waits::{WaitToken, Waits};

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Host copies move whole 4-byte words, as Vulkan and wgpu require.
pub const COPY_ALIGNMENT: u64 = 4;

/// A buffer range resolved to the backend's memory, for a library call.
pub(crate) type Resolved<'a, B> = (&'a <B as Backend>::Memory, std::ops::Range<u64>);

/// The most streams one server makes (see `Server::create_stream`).
pub const MAX_STREAMS: usize = 1024;

/// Write ranges a stream remembers in flight before the server syncs it.
const IN_FLIGHT_LIMIT: usize = 1 << 16;

/// What every launch is checked against, worked out when the device opens.
pub(crate) struct LaunchRules {
    /// The backend's grid: host-given counts past it are refused first.
    max_workgroups: [u32; 3],
    alignment: u64,
    /// `alignment - 1` for a power of two, else 0: spares a division.
    mask: u64,
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
    /// Host waits for this stream's work; a collective adds none (rule 47).
    drains: u64,
}

/// Write sets since the last wait, numbered so a wait settles what it covered.
///
/// `push` folds a range into an equal one among the last few, but never
/// across a mark. A failed round claims what came after its mark, and a
/// wait settles what came before its own. A write folded across a mark is
/// missed by the one and settled by the other, so it reads as clean.
#[derive(Default)]
struct InFlight {
    ranges: Vec<BufferRange>,
    /// How many ranges were settled before `ranges[0]`.
    settled: u64,
    /// The latest mark: atomic for a shared look, relaxed under the lock.
    fence: AtomicU64,
}

impl InFlight {
    fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Everything submitted so far: what a wait begun now covers.
    fn mark(&self) -> u64 {
        let mark = self.settled + self.ranges.len() as u64;
        self.fence.fetch_max(mark, Ordering::Relaxed);
        mark
    }

    /// Remember `w`, unless one of the last few since the latest mark is `w`.
    #[inline]
    fn push(&mut self, w: BufferRange) {
        let fenced = self
            .fence
            .load(Ordering::Relaxed)
            .saturating_sub(self.settled);
        let floor = (fenced as usize).min(self.ranges.len());
        if self.ranges.len() > floor && self.ranges.last() == Some(&w) {
            return;
        }
        let recent = self.ranges.len().saturating_sub(8).max(floor);
        if !self.ranges[recent..].contains(&w) {
            self.ranges.push(w);
        }
    }

    fn take_to(&mut self, mark: u64) -> Vec<BufferRange> {
        let n = (mark.saturating_sub(self.settled)).min(self.ranges.len() as u64) as usize;
        self.settled += n as u64;
        self.ranges.drain(..n).collect()
    }

    fn since(&self, mark: u64) -> &[BufferRange] {
        let from = mark
            .saturating_sub(self.settled)
            .min(self.ranges.len() as u64);
        &self.ranges[from as usize..]
    }

    fn clear(&mut self) {
        self.settled += self.ranges.len() as u64;
        self.ranges.clear();
    }
}

/// A wait begun under the lock, run without it, and settled under it again.
pub(crate) struct PendingWait<B: Backend> {
    stream: StreamId,
    waiter: Option<B::Waiter>,
    /// The stream's in-flight mark when the wait began: what it covers.
    mark: u64,
    /// Counts the wait as in flight until it ends, however it ends.
    token: WaitToken,
}

impl<B: Backend> PendingWait<B> {
    pub(crate) fn wait(&self) -> Result<()> {
        match &self.waiter {
            // SAFETY: a waiter from this backend's `begin_wait` or `begin_read`;
            // the client keeps the server alive; only consuming this ends the waiter.
            Some(waiter) => unsafe { B::wait(waiter) },
            None => Ok(()),
        }
    }

    /// Poll `finished` unlocked until it says so or `until` passes. Work not
    /// finished on a device that faulted never will: the fault is the answer.
    pub(crate) fn finished_by(
        &self,
        until: std::time::Instant,
        finished: impl Fn(&B::Waiter) -> Result<bool>,
    ) -> Result<bool> {
        let Some(waiter) = &self.waiter else {
            return Ok(true);
        };
        let began = std::time::Instant::now();
        loop {
            if finished(waiter)? {
                return Ok(true);
            }
            if let Some(fault) = self.token.device_fault() {
                return Err(Error::DevicePoisoned { fault });
            }
            let now = std::time::Instant::now();
            if now >= until {
                return Ok(false);
            }
            let waited = now - began;
            if waited < POLL_SPIN {
                std::thread::yield_now();
            } else {
                std::thread::sleep((waited / 4).min(POLL_SLEEP_MOST));
            }
        }
    }
}

/// A bounded wait polls back to back this long (a ballot's time), then
/// sleeps a quarter of its wait so far, at most [`POLL_SLEEP_MOST`].
const POLL_SPIN: std::time::Duration = std::time::Duration::from_micros(100);
const POLL_SLEEP_MOST: std::time::Duration = std::time::Duration::from_micros(100);

struct GraphEntry<G> {
    /// `None` once its device was lost: the caller re-captures it.
    graph: Option<G>,
    label: Arc<str>,
    written: Vec<BufferRange>,
    read: Vec<BufferRange>,
    maybe_written: Vec<BufferRange>,
    /// Its collective rounds: a graph with any replays only with its group.
    rounds: Vec<crate::capture::RecordedRound>,
}

/// One device's server: the shared logic over a backend `B`.
pub struct Server<B: Backend> {
    backend: B,
    id: ServerId,
    table: BufferTable<B::Memory>,
    streams: Vec<StreamState<B::Stream>>,
    /// Streams lent and given back, idle, for the next loan.
    spare_streams: Vec<StreamId>,
    /// The compile cache, indexed so a launch hashes its kernel's id once.
    kernels: Vec<B::Kernel>,
    kernel_index: HashMap<KernelId, usize, BuildHasherDefault<IdHasher>>,
    /// The kernel launched last, so a loop skips the cache lookup.
    last_kernel: Option<(KernelId, usize)>,
    graphs: HashMap<GraphId, GraphEntry<B::Graph>>,
    next_graph: u64,
    poison: Option<Arc<Error>>,
    /// Waits in flight with the lock released ([`WaitToken`]).
    waits: Arc<Waits>,
    /// A recovery could not reopen the device; the server stays poisoned.
    detached: bool,
    reopened: u64,
    /// Buffers a recovery gave up, to remake once the device opens.
    to_remake: Vec<BufferId>,
    /// Graphs a recovery gave up, reported once the device opens.
    graphs_lost: usize,
    rules: LaunchRules,
    write_sets: Vec<Vec<BufferRange>>,
    hooks: Arc<Hooks>,
    copy_label: Arc<str>,
    #[cfg(feature = "fault-injection")]
    faults: crate::fault::FaultPlan,
}

/// What a scope settles: all but the memory and backend, which a launch borrows.
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
        // Delivered by the client once the lock is released.
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

/// The rest of a server, as a device call reaches it.
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

/// What a device call inside [`Device::issue`] may reach.
struct Issue<'a, B: Backend> {
    backend: &'a mut B,
    stream: &'a mut B::Stream,
    memory: &'a Memories<B::Memory>,
    graphs: &'a HashMap<GraphId, GraphEntry<B::Graph>>,
}

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

/// An injected failure, logged out of line to keep callers' frames small.
#[cfg(feature = "fault-injection")]
#[cold]
#[inline(never)]
fn injected(site: Site, stream: Option<StreamId>, error: Error) -> Error {
    tracing::debug!(?site, ?stream, "injected: {error}");
    error
}

/// `len` zeroed host bytes, or [`Error::OutOfMemory`] rather than an abort.
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
                drains: 0,
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

    #[inline]
    pub(super) fn fault(&mut self, site: Site, stream: Option<StreamId>) -> Result<()> {
        consult(
            #[cfg(feature = "fault-injection")]
            &mut self.faults,
            site,
            stream,
        )
    }

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

    /// The books alone, for work that reaches no device.
    pub(crate) fn books(&mut self) -> Books<'_, B::Stream> {
        self.split().0
    }

    pub(super) fn recycle_write_set(&mut self, written: Vec<BufferRange>) {
        self.books().recycle(written);
    }

    pub(super) fn write_set(&mut self) -> Vec<BufferRange> {
        self.books().write_set()
    }

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

    pub(crate) fn drains(&self, stream: StreamId) -> u64 {
        self.streams[self.stream_index(stream)].drains
    }

    pub(crate) fn in_flight_mark(&self, stream: StreamId) -> u64 {
        self.streams[self.stream_index(stream)].in_flight.mark()
    }

    /// The write sets in flight from `mark` on carry `error` (rule 23).
    pub(crate) fn fail_in_flight_since(&mut self, stream: StreamId, mark: u64, error: Error) {
        let index = self.stream_index(stream);
        let since = self.streams[index].in_flight.since(mark).to_vec();
        self.table
            .claim_failed(&since, Work::new(WorkKind::Settle, stream), error);
    }

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
        // Wait for the device before freeing; a fault now has nobody to tell.
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
                // SAFETY: removed from the table, so named by no later call; every graph
                // that recorded work on it is destroyed above.
                unsafe { self.backend.free(memory) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::InFlight;
    use crate::id::{BufferId, BufferRange, ByteRange};

    fn range(slot: u32) -> BufferRange {
        BufferRange {
            buffer: BufferId::from_parts(slot, 1),
            range: ByteRange::new(0, 64),
        }
    }

    /// A failed round claims a write after its mark into a range just before it.
    #[test]
    fn a_write_after_a_mark_is_claimed_however_recently_its_range_was_written() {
        let mut in_flight = InFlight::default();
        let (dep, other) = (range(1), range(2));
        in_flight.push(dep);
        in_flight.push(other);
        let mark = in_flight.mark();
        in_flight.push(dep);
        assert_eq!(in_flight.since(mark), &[dep]);
        in_flight.push(dep);
        in_flight.push(dep);
        assert_eq!(in_flight.since(mark), &[dep]);
    }

    /// A wait settles what it covered, never a write issued after it began.
    #[test]
    fn a_wait_never_settles_a_write_issued_after_it_began() {
        let mut in_flight = InFlight::default();
        let dep = range(1);
        in_flight.push(dep);
        let waited = in_flight.mark();
        in_flight.push(dep);
        assert_eq!(in_flight.take_to(waited), vec![dep]);
        assert_eq!(in_flight.since(waited), &[dep], "still in flight");
        assert_eq!(in_flight.take_to(u64::MAX), vec![dep]);
        assert_eq!(in_flight.len(), 0);
    }

    /// A launch loop into one range keeps the list at one entry.
    #[test]
    fn repeated_writes_between_marks_fold() {
        let mut in_flight = InFlight::default();
        for _ in 0..1000 {
            in_flight.push(range(1));
            in_flight.push(range(2));
        }
        assert_eq!(in_flight.len(), 2);
        let _ = in_flight.mark();
        for _ in 0..1000 {
            in_flight.push(range(1));
        }
        assert_eq!(in_flight.len(), 3);
    }
}
