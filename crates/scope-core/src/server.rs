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

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::backend::{Access, Backend, Bound, BoundDispatch, Launch};
use crate::capture::{CaptureState, CaptureWindow, WindowEnd};
use crate::client::{Binding, Buffer, Capture, Dispatch, Dropped, Graph, Slice};
use crate::error::{Error, Result};
use crate::failure::{Work, WorkKind};
use crate::fault::Site;
use crate::hooks::Hooks;
use crate::id::{BufferId, BufferRange, ByteRange, GraphId, IdHasher, ServerId, StreamId};
use crate::kernel::{Kernel, KernelId};
use crate::scope::{ExecuteScope, ScopedOutcome, WriteScoped, failed_writing};
use crate::store::FailureStore;
use crate::table::BufferTable;

/// Host copies move whole 4-byte words on every backend: Vulkan's and
/// wgpu's copy commands require it, so the contract does too, and a
/// runtime's misaligned copy fails the same way everywhere.
pub const COPY_ALIGNMENT: u64 = 4;

/// How many write ranges a stream remembers as in flight before the server
/// syncs it to bound the list.
const IN_FLIGHT_LIMIT: usize = 1 << 16;

struct StreamState<S> {
    device: S,
    window: CaptureWindow,
    /// What work submitted since the last completed sync writes (rule 23).
    in_flight: Vec<BufferRange>,
    failures_seen: u64,
}

struct GraphEntry<G> {
    graph: G,
    label: Arc<str>,
    written: Vec<BufferRange>,
    read: Vec<BufferRange>,
}

/// One device's server: the shared logic over a backend `B`.
pub struct Server<B: Backend> {
    backend: B,
    id: ServerId,
    table: BufferTable<B::Memory>,
    streams: Vec<StreamState<B::Stream>>,
    kernels: HashMap<KernelId, B::Kernel, BuildHasherDefault<IdHasher>>,
    graphs: HashMap<GraphId, GraphEntry<B::Graph>>,
    next_graph: u64,
    poison: Option<Arc<Error>>,
    write_sets: Vec<Vec<BufferRange>>,
    hooks: Arc<Hooks>,
    copy_label: Arc<str>,
    #[cfg(feature = "fault-injection")]
    faults: crate::fault::FaultPlan,
}

impl<B: Backend> WriteScoped for Server<B> {
    type Store = BufferTable<B::Memory>;

    fn store(&mut self) -> &mut Self::Store {
        &mut self.table
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

/// What a device call inside [`Server::issue`] may reach: the backend, the
/// issuing stream's device state, and the tables it looks memory, kernels
/// and graphs up in.
struct Issue<'a, B: Backend> {
    backend: &'a mut B,
    stream: &'a mut B::Stream,
    table: &'a BufferTable<B::Memory>,
    kernels: &'a HashMap<KernelId, B::Kernel, BuildHasherDefault<IdHasher>>,
    graphs: &'a HashMap<GraphId, GraphEntry<B::Graph>>,
}

/// `len` zeroed bytes of host memory, or [`Error::OutOfMemory`] when the
/// host cannot give them: a read of any size must not abort the process.
fn host_vec(len: u64) -> Result<Vec<u8>> {
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
        let first = backend.create_stream(StreamId(0))?;
        Ok(Self {
            backend,
            id,
            table: BufferTable::new(),
            streams: vec![StreamState {
                device: first,
                window: CaptureWindow::new(),
                in_flight: Vec::new(),
                failures_seen: 0,
            }],
            kernels: HashMap::default(),
            graphs: HashMap::new(),
            next_graph: 1,
            poison: None,
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
    fn fault(&mut self, site: Site, stream: Option<StreamId>) -> Result<()> {
        #[cfg(feature = "fault-injection")]
        if let Some(error) = self.faults.check(site, stream) {
            tracing::debug!(?site, ?stream, "injected: {error}");
            return Err(error);
        }
        let _ = (site, stream);
        Ok(())
    }

    #[cfg(feature = "fault-injection")]
    pub(crate) fn inject(&mut self, plan: crate::fault::FaultPlan) {
        self.faults = plan;
    }

    fn check_poison(&self) -> Result<()> {
        match &self.poison {
            Some(fault) => Err(Error::DevicePoisoned {
                fault: fault.clone(),
            }),
            None => Ok(()),
        }
    }

    fn stream_index(&self, stream: StreamId) -> usize {
        let index = stream.0 as usize;
        debug_assert!(index < self.streams.len());
        index.min(self.streams.len() - 1)
    }

    fn refuse_if_recording(&self, stream: StreamId, what: &str) -> Result<()> {
        if self.streams[self.stream_index(stream)].window.state() != CaptureState::NoCapture {
            return Err(Error::refused(format!(
                "{what} on {stream} while it is capturing: the recorded work has not run"
            )));
        }
        Ok(())
    }

    // ----- handles -----------------------------------------------------

    /// Resolve `slice` of `buffer` to a validated range of a live buffer.
    pub(crate) fn resolve(
        &self,
        buffer: &Buffer,
        range: ByteRange,
        what: &str,
    ) -> Result<BufferRange> {
        self.resolve_with(buffer, range, &|| what.to_owned())
    }

    /// [`resolve`](Self::resolve), naming the argument only on error: a
    /// launch must not format a string per binding on the success path.
    fn resolve_with(
        &self,
        buffer: &Buffer,
        range: ByteRange,
        what: &dyn Fn() -> String,
    ) -> Result<BufferRange> {
        if buffer.server() != self.id {
            return Err(Error::invalid(
                what(),
                format!("{} belongs to another server", buffer.id()),
            ));
        }
        let Some(entry) = self.table.get(buffer.id()) else {
            return Err(Error::invalid(what(), format!("{} was freed", buffer.id())));
        };
        if range.end < range.start {
            return Err(Error::invalid(
                what(),
                format!(
                    "range {}..{} of {} is reversed",
                    range.start,
                    range.end,
                    buffer.id()
                ),
            ));
        }
        if range.is_empty() {
            return Err(Error::invalid(
                what(),
                format!("empty range of {}", buffer.id()),
            ));
        }
        if range.end > entry.size {
            return Err(Error::invalid(
                what(),
                format!(
                    "{range} runs past the end of {}, which holds {} bytes",
                    buffer.id(),
                    entry.size
                ),
            ));
        }
        Ok(BufferRange {
            buffer: buffer.id(),
            range,
        })
    }

    fn resolve_copy_range(&self, slice: Slice<'_>, what: &str) -> Result<BufferRange> {
        let r = self.resolve(slice.buffer, slice.range, what)?;
        if r.range.start % COPY_ALIGNMENT != 0 || r.range.len() % COPY_ALIGNMENT != 0 {
            return Err(Error::invalid(
                what,
                format!("{r}: host and device copies move whole {COPY_ALIGNMENT}-byte words"),
            ));
        }
        Ok(r)
    }

    fn memory(&self, id: BufferId) -> Option<&B::Memory> {
        self.table.memory(id).ok()
    }

    /// The error an operation on a buffer without memory gets.
    fn require_memory(&self, r: BufferRange) -> Result<()> {
        match self.memory(r.buffer) {
            Some(_) => Ok(()),
            None => Err(self.table.unallocated_error(r.buffer)),
        }
    }

    // ----- ordering and late faults -------------------------------------

    /// Refuse, changing nothing, a use on `stream` of a buffer whose last
    /// use was recorded in another stream's open window: that work runs only
    /// at replay, so nothing can be ordered after it. A buffer the capturing
    /// stream used only before its capture began is not refused — `stream`
    /// is ordered after that earlier work — unless `stream` records too (a
    /// capture cannot wait on another capturing stream's work).
    ///
    /// Each call of the contract asks this before its scope opens, so a
    /// refusal is the caller's error, not a device failure (rule 38): it
    /// claims nothing, fires no hook, and a retry is refused the same way
    /// until the capture ends.
    fn refuse_recorded_elsewhere(&self, stream: StreamId, touched: &[BufferId]) -> Result<()> {
        // The common case, and the launch path's: nothing is capturing.
        if self
            .streams
            .iter()
            .all(|s| s.window.state() == CaptureState::NoCapture)
        {
            return Ok(());
        }
        let to = self.stream_index(stream);
        let to_records = self.streams[to].window.state() != CaptureState::NoCapture;
        for &id in touched {
            let Some(entry) = self.table.get(id) else {
                continue;
            };
            let from = entry.last_user.0 as usize;
            if from == to || from >= self.streams.len() {
                continue;
            }
            let window = &self.streams[from].window;
            if window.state() == CaptureState::NoCapture {
                continue;
            }
            let other = StreamId(from as u32);
            if window.touches(id) {
                return Err(Error::refused(format!(
                    "{id} was last used by work recorded on {other}, which has not run; \
                     use it from {stream} after that capture ends"
                )));
            }
            if to_records {
                return Err(Error::refused(format!(
                    "{id} was last used on {other}, which is capturing, and {stream} is \
                     capturing too: one capture cannot wait for another's stream; use it \
                     after one of them ends"
                )));
            }
        }
        Ok(())
    }

    /// Make `stream` wait for the last other stream that used each of
    /// `touched`, then mark them used by `stream` (and, while `stream`
    /// records, used by its window). Callers have asked
    /// [`refuse_recorded_elsewhere`](Self::refuse_recorded_elsewhere) first,
    /// before opening their scope; nothing between changes a last user.
    ///
    /// The new last users are recorded only once every wait is set up: a
    /// failed wait leaves the buffers' last users as they were, so the next
    /// use still waits for the stream that really used them last.
    fn order(
        &mut self,
        stream: StreamId,
        touched: impl IntoIterator<Item = BufferId>,
    ) -> Result<()> {
        let to = self.stream_index(stream);
        let touched: SmallVec<[BufferId; 8]> = touched.into_iter().collect();
        debug_assert!(
            self.refuse_recorded_elsewhere(stream, &touched).is_ok(),
            "a cross-capture use must be refused before its scope opens"
        );
        let mut waited: SmallVec<[usize; 4]> = SmallVec::new();
        for &id in &touched {
            let Some(entry) = self.table.get(id) else {
                continue;
            };
            let from = entry.last_user.0 as usize;
            if from == to || from >= self.streams.len() || waited.contains(&from) {
                continue;
            }
            waited.push(from);
            let recording = self.streams[to].window.state() != CaptureState::NoCapture;
            let (first, then) = two(&mut self.streams, from, to);
            // `first` may be capturing, if this buffer's last use on it came
            // before the capture began (the refusal above let it through):
            // every backend's `order` then waits for its work before the
            // capture, which is all of it that runs.
            if recording {
                // A recording stream cannot wait on work outside its graph;
                // finish that work on the host instead.
                self.backend.sync(&mut first.device)?;
                first.in_flight.clear();
            } else {
                self.backend.order(&mut first.device, &mut then.device)?;
            }
        }
        for id in touched {
            self.streams[to].window.touch(id);
            if let Some(entry) = self.table.get_mut(id) {
                entry.last_user = stream;
            }
        }
        Ok(())
    }

    /// The body every unit of device work shares — a host write, a copy, a
    /// launch, a replay — in its one order: the fault plan, waits on the
    /// streams that used `touched` last, the device call, and the note that
    /// the call's write set is in flight. Written once, no path can skip a
    /// step or take them in another order.
    fn issue(
        &mut self,
        site: Site,
        stream: StreamId,
        touched: impl IntoIterator<Item = BufferId>,
        written: &[BufferRange],
        call: impl FnOnce(Issue<'_, B>) -> Result<()>,
    ) -> Result<()> {
        self.fault(site, Some(stream))?;
        self.order(stream, touched)?;
        let index = self.stream_index(stream);
        let Server {
            backend,
            table,
            streams,
            kernels,
            graphs,
            ..
        } = self;
        call(Issue {
            backend,
            stream: &mut streams[index].device,
            table,
            kernels,
            graphs,
        })?;
        self.note_in_flight(stream, written);
        Ok(())
    }

    /// Remember that submitted work on `stream` writes `written`. Only
    /// remembers: bounding the list is [`conclude`](Self::conclude)'s, after
    /// the work's scope has settled, so that a fault the bounding sync
    /// surfaces is attributed after — not healed by — the clean exit.
    fn note_in_flight(&mut self, stream: StreamId, written: &[BufferRange]) {
        let index = self.stream_index(stream);
        let state = &mut self.streams[index];
        if state.window.is_recording() {
            return;
        }
        for w in written {
            let recent = state.in_flight.len().saturating_sub(8);
            if !state.in_flight[recent..].contains(w) {
                state.in_flight.push(*w);
            }
        }
    }

    fn sync_stream(&mut self, stream: StreamId) -> Result<()> {
        let index = self.stream_index(stream);
        let result = self
            .fault(Site::Sync, Some(stream))
            .and_then(|()| self.backend.sync(&mut self.streams[index].device));
        match result {
            Ok(()) => {
                self.streams[index].in_flight.clear();
                Ok(())
            }
            Err(error) => {
                self.settle(stream, &error);
                Err(error)
            }
        }
    }

    /// A device call outside any scope failed with `error`: attribute it to
    /// what is in flight on `stream` (rule 23), and poison on a sticky fault
    /// (rule 36).
    fn settle(&mut self, stream: StreamId, error: &Error) {
        if !matches!(error, Error::Fault(_)) {
            return;
        }
        self.on_failure(stream, error);
        if error.is_sticky() {
            self.poison_with(error);
            return;
        }
        let index = self.stream_index(stream);
        let in_flight = std::mem::take(&mut self.streams[index].in_flight);
        self.table.claim_failed(
            &in_flight,
            Work::new(WorkKind::Settle, stream),
            error.clone(),
        );
    }

    /// Poison the device with `fault`: every later operation fails fast, and
    /// every buffer written by work in flight on any stream carries it.
    fn poison_with(&mut self, fault: &Error) {
        if self.poison.is_some() {
            return;
        }
        tracing::error!("device poisoned: {fault}");
        let fault = Arc::new(fault.clone());
        self.poison = Some(fault.clone());
        let in_flight: Vec<BufferRange> = self
            .streams
            .iter_mut()
            .flat_map(|s| std::mem::take(&mut s.in_flight))
            .collect();
        self.table.claim_failed(
            &in_flight,
            Work::new(WorkKind::Settle, StreamId(0)),
            Error::DevicePoisoned { fault },
        );
    }

    /// The end of a scope on `stream`, in the one order every unit of work
    /// takes after its scope settled:
    ///
    /// 1. a sticky fault poisons the device (rule 36);
    /// 2. any other device fault means the stream lost what it had
    ///    submitted, not only this work (a failed batch submit, say), so the
    ///    write sets in flight on it take the fault too (rule 23);
    /// 3. the in-flight list is bounded: past its limit the stream is synced,
    ///    and a fault that sync surfaces lands on what was in flight.
    fn conclude<R>(&mut self, stream: StreamId, outcome: ScopedOutcome<R>) -> Result<R> {
        if let ScopedOutcome::Failed(error) = &outcome {
            if error.is_sticky() {
                self.poison_with(error);
            } else if matches!(error, Error::Fault(_)) {
                let index = self.stream_index(stream);
                let in_flight = std::mem::take(&mut self.streams[index].in_flight);
                self.table.claim_failed(
                    &in_flight,
                    Work::new(WorkKind::Settle, stream),
                    error.clone(),
                );
            }
        }
        let index = self.stream_index(stream);
        if self.streams[index].in_flight.len() >= IN_FLIGHT_LIMIT {
            // Attributed by `sync_stream` itself; the work concluded here
            // succeeded or failed on its own account.
            let _ = self.sync_stream(stream);
        }
        outcome.into_result()
    }

    // ----- the contract ------------------------------------------------

    pub(crate) fn create_stream(&mut self) -> Result<StreamId> {
        self.check_poison()?;
        let id = StreamId(
            u32::try_from(self.streams.len()).map_err(|_| Error::refused("too many streams"))?,
        );
        let device = self.backend.create_stream(id)?;
        self.streams.push(StreamState {
            device,
            window: CaptureWindow::new(),
            in_flight: Vec::new(),
            failures_seen: 0,
        });
        Ok(id)
    }

    pub(crate) fn allocate(
        &mut self,
        stream: StreamId,
        size: u64,
        keep_failed: bool,
    ) -> Result<BufferId> {
        self.check_poison()?;
        if size == 0 {
            return Err(Error::invalid("allocation size", "zero bytes"));
        }
        let max = self.backend.max_allocation();
        if size > max {
            return Err(Error::invalid(
                "allocation size",
                format!(
                    "{size} bytes is past {}'s largest allocation of {max} bytes",
                    B::NAME
                ),
            ));
        }
        let index = self.stream_index(stream);
        let mut result = self
            .fault(Site::Allocate, Some(stream))
            .and_then(|()| self.backend.allocate(&mut self.streams[index].device, size));
        if matches!(&result, Err(e) if e.is_out_of_memory()) {
            // Rule 37: reclaim what the pool caches and try once more.
            self.backend.trim();
            result = self
                .fault(Site::Allocate, Some(stream))
                .and_then(|()| self.backend.allocate(&mut self.streams[index].device, size));
        }
        match result {
            Ok(memory) => Ok(self.table.insert(size, Some(memory), None, stream)),
            Err(error) => {
                if error.is_sticky() {
                    self.poison_with(&error);
                    return Err(error);
                }
                if !keep_failed {
                    return Err(error);
                }
                tracing::warn!(%stream, "allocation of {size} bytes failed: {error}");
                let record = self
                    .table
                    .failures()
                    .mint_failed(Work::new(WorkKind::Allocate, stream), error);
                let id = self.table.insert(size, None, Some(record), stream);
                Ok(id)
            }
        }
    }

    /// Release what a dropped handle named (see `client::Dropped`).
    pub(crate) fn release(&mut self, dropped: Dropped) {
        match dropped {
            Dropped::Buffer(id) => self.free(id),
            Dropped::Capture { stream, epoch } => {
                let index = stream.0 as usize;
                if index < self.streams.len()
                    && self.streams[index].window.epoch() == epoch
                    && self.streams[index].window.state() == CaptureState::Recording
                {
                    tracing::warn!(%stream, "a capture was dropped without being ended: aborted");
                    self.abort_window(stream);
                }
            }
            Dropped::Graph(id) => {
                if self.graphs.contains_key(&id)
                    && let Err(error) = self.destroy_graph_id(id)
                {
                    tracing::warn!(graph = %id, "destroying a dropped graph failed: {error}");
                }
            }
        }
    }

    pub(crate) fn free(&mut self, id: BufferId) {
        if let Some(memory) = self.table.remove(id) {
            self.backend.free(memory);
        }
    }

    pub(crate) fn write(&mut self, stream: StreamId, dst: Slice<'_>, data: &[u8]) -> Result<()> {
        self.check_poison()?;
        let r = self.resolve_copy_range(dst, "write destination")?;
        if data.len() as u64 != r.range.len() {
            return Err(Error::invalid(
                "write",
                format!("{} bytes given for {r}", data.len()),
            ));
        }
        self.require_memory(r)?;
        self.refuse_recorded_elsewhere(stream, &[r.buffer])?;
        let mut written = self.write_set();
        written.push(r);
        let outcome = ExecuteScope::over(self, Work::new(WorkKind::Write, stream), written)
            .execute(|server, written| {
                server.issue(Site::Write, stream, [r.buffer], written, |d| {
                    let memory = d.table.memory(r.buffer)?;
                    d.backend.write(d.stream, memory, r.range.start, data)
                })
            });
        self.conclude(stream, outcome)
    }

    /// A read into a new vector, sized only after everything a read checks
    /// has passed (rule 24: a read tests its ranges first and does nothing
    /// else): a bogus range, or a failed buffer of any size, must be an error,
    /// not an allocation of its length. The allocation itself is fallible:
    /// room the host cannot give is [`Error::OutOfMemory`], never an abort.
    pub(crate) fn read_vec(&mut self, stream: StreamId, src: Slice<'_>) -> Result<Vec<u8>> {
        let r = self.check_read(stream, src)?;
        let mut out = host_vec(r.range.len())?;
        self.read_checked(stream, r, &mut out)?;
        Ok(out)
    }

    /// What every read checks before it touches the device or the host's
    /// memory: poison, the range, recording, the claims, memory, and a use
    /// across a capture.
    fn check_read(&mut self, stream: StreamId, src: Slice<'_>) -> Result<BufferRange> {
        self.check_poison()?;
        let r = self.resolve_copy_range(src, "read source")?;
        self.refuse_if_recording(stream, "a host read")?;
        self.table.check(&[r])?;
        self.require_memory(r)?;
        // Before the device call, so before its injected fault too.
        self.refuse_recorded_elsewhere(stream, &[r.buffer])?;
        Ok(r)
    }

    pub(crate) fn read(&mut self, stream: StreamId, src: Slice<'_>, out: &mut [u8]) -> Result<()> {
        self.check_poison()?;
        let r = self.resolve_copy_range(src, "read source")?;
        if out.len() as u64 != r.range.len() {
            return Err(Error::invalid(
                "read",
                format!("{} bytes of room for {r}", out.len()),
            ));
        }
        let r = self.check_read(stream, src)?;
        self.read_checked(stream, r, out)
    }

    fn read_checked(&mut self, stream: StreamId, r: BufferRange, out: &mut [u8]) -> Result<()> {
        let result = self
            .fault(Site::Read, Some(stream))
            .and_then(|()| self.device_read(stream, r, out));
        match result {
            Ok(()) => {
                let index = self.stream_index(stream);
                self.streams[index].in_flight.clear();
                Ok(())
            }
            Err(error) => {
                self.settle(stream, &error);
                Err(error)
            }
        }
    }

    #[cfg(feature = "fault-injection")]
    pub(crate) fn peek_vec(&mut self, stream: StreamId, src: Slice<'_>) -> Result<Vec<u8>> {
        let r = self.resolve_copy_range(src, "peek source")?;
        self.refuse_if_recording(stream, "a peek")?;
        self.require_memory(r)?;
        self.refuse_recorded_elsewhere(stream, &[r.buffer])?;
        let mut out = host_vec(r.range.len())?;
        self.device_read(stream, r, &mut out)?;
        Ok(out)
    }

    /// Read `r` on the device, after ordering `stream` behind its last user
    /// (the caller has refused a cross-capture use).
    fn device_read(&mut self, stream: StreamId, r: BufferRange, out: &mut [u8]) -> Result<()> {
        self.order(stream, [r.buffer])?;
        let index = self.stream_index(stream);
        let Server {
            backend,
            table,
            streams,
            ..
        } = self;
        backend.read(
            &mut streams[index].device,
            table.memory(r.buffer)?,
            r.range.start,
            out,
        )
    }

    pub(crate) fn copy(&mut self, stream: StreamId, src: Slice<'_>, dst: Slice<'_>) -> Result<()> {
        self.check_poison()?;
        let s = self.resolve_copy_range(src, "copy source")?;
        let d = self.resolve_copy_range(dst, "copy destination")?;
        if s.range.len() != d.range.len() {
            return Err(Error::invalid(
                "copy",
                format!("source {s} and destination {d} differ in length"),
            ));
        }
        if s.buffer == d.buffer && s.range.intersects(d.range) {
            return Err(Error::invalid("copy", format!("{s} and {d} overlap")));
        }
        self.require_memory(d)?;
        self.refuse_recorded_elsewhere(stream, &[s.buffer, d.buffer])?;
        let mut written = self.write_set();
        written.push(d);
        let label = self.copy_label.clone();
        let read = [s];
        let outcome = ExecuteScope::launching(self, &label, stream, &read, written).execute(
            |server, written| {
                server.issue(Site::Copy, stream, [s.buffer, d.buffer], written, |dev| {
                    let (src, dst) = (dev.table.memory(s.buffer)?, dev.table.memory(d.buffer)?);
                    dev.backend.copy(
                        dev.stream,
                        src,
                        s.range.start,
                        dst,
                        d.range.start,
                        s.range.len(),
                    )
                })
            },
        );
        self.conclude(stream, outcome)
    }

    pub(crate) fn compile(&mut self, stream: StreamId, kernel: &Kernel) -> Result<()> {
        self.check_poison()?;
        self.ensure_compiled(stream, kernel)
    }

    fn ensure_compiled(&mut self, stream: StreamId, kernel: &Kernel) -> Result<()> {
        if self.kernels.contains_key(&kernel.id()) {
            return Ok(());
        }
        let language = kernel.source().language();
        if !self.backend.accepts(language) {
            return Err(Error::Compile {
                backend: B::NAME,
                kernel: kernel.name().clone(),
                log: format!("{} does not take {language} kernels", B::NAME),
            });
        }
        let compiled = self
            .fault(Site::Compile, Some(stream))
            .and_then(|()| self.backend.compile(kernel));
        match compiled {
            Ok(compiled) => {
                self.kernels.insert(kernel.id(), compiled);
                Ok(())
            }
            Err(error) => {
                // A driver that faults while loading a module is as
                // poisoned as one that faults running it (rule 36).
                if error.is_sticky() {
                    self.poison_with(&error);
                }
                Err(error)
            }
        }
    }

    pub(crate) fn launch(
        &mut self,
        stream: StreamId,
        kernel: &Kernel,
        bindings: &[Binding<'_>],
        scalars: &[u8],
        dispatch: Dispatch<'_>,
    ) -> Result<()> {
        self.check_poison()?;
        let alignment = self.backend.binding_alignment();
        let mut resolved: SmallVec<[(BufferRange, Access); 8]> = SmallVec::new();
        let mut read: SmallVec<[BufferRange; 8]> = SmallVec::new();
        for (i, binding) in bindings.iter().enumerate() {
            let what = || format!("binding {i} of `{}`", kernel.name());
            let r = self.resolve_with(binding.slice.buffer, binding.slice.range, &what)?;
            if r.range.start % alignment != 0 {
                return Err(Error::invalid(
                    what(),
                    format!("offset {} is not a multiple of {alignment}", r.range.start),
                ));
            }
            if r.range.len() % 4 != 0 {
                return Err(Error::invalid(
                    what(),
                    format!("{} is not whole 4-byte words", r.range),
                ));
            }
            if binding.access.reads() {
                read.push(r);
            }
            resolved.push((r, binding.access));
        }
        let groups = match dispatch {
            Dispatch::Groups(groups) => Some(groups),
            Dispatch::Indirect(slice) => {
                let r = self.resolve(slice.buffer, slice.range, "indirect dispatch")?;
                if r.range.len() != 12 || r.range.start % 4 != 0 {
                    return Err(Error::invalid(
                        "indirect dispatch",
                        format!("{r} must be three aligned u32 counts (12 bytes)"),
                    ));
                }
                read.push(r);
                resolved.push((r, Access::Read));
                None
            }
        };
        let touched: SmallVec<[BufferId; 8]> = resolved.iter().map(|(r, _)| r.buffer).collect();
        self.refuse_recorded_elsewhere(stream, &touched)?;
        let runs_nothing = groups.is_some_and(|g| g.contains(&0));
        let mut written = self.write_set();
        if groups.is_none() {
            // An indirect launch's counts are on the device: the core cannot
            // know, when the launch concludes, whether it wrote anything (a
            // zero count, or one past the device's limit, runs nothing). So
            // it heals nothing: bytes that carried a failure keep it, and
            // only bytes that were clean are in its write set — clean
            // whether it ran or not, and claimed if it fails.
            for (r, _) in resolved.iter().filter(|(_, a)| a.writes()) {
                self.table.unclaimed(*r, &mut written);
            }
        } else if !runs_nothing {
            written.extend(resolved.iter().filter(|(_, a)| a.writes()).map(|(r, _)| *r));
        }
        let name = kernel.name().clone();
        // Work that never started: a buffer with no memory to write, a
        // kernel that does not compile (rule 21).
        if let Some(&(unallocated, _)) = resolved
            .iter()
            .find(|(r, a)| a.writes() && self.memory(r.buffer).is_none())
        {
            let error = self.table.unallocated_error(unallocated.buffer);
            written.retain(|w| w.buffer != unallocated.buffer);
            return Err(failed_writing(
                self,
                Work::new(WorkKind::Launch, stream),
                written,
                error,
            ));
        }
        if let Err(error) = self.ensure_compiled(stream, kernel) {
            return Err(failed_writing(
                self,
                Work::new(WorkKind::Launch, stream),
                written,
                error,
            ));
        }
        let id = kernel.id();
        self.check_launch(id, &name, &resolved, scalars, groups)?;
        let outcome = ExecuteScope::launching(self, &name, stream, &read, written).execute(
            |server, written| {
                if runs_nothing {
                    return Ok(());
                }
                let touched = resolved.iter().map(|(r, _)| r.buffer);
                server.issue(Site::Launch, stream, touched, written, |d| {
                    let mut bound: SmallVec<[Bound<'_, B::Memory>; 8]> = SmallVec::new();
                    for (r, access) in &resolved {
                        bound.push(Bound {
                            memory: d.table.memory(r.buffer)?,
                            offset: r.range.start,
                            len: r.range.len(),
                            access: *access,
                        });
                    }
                    let dispatch = match groups {
                        Some(groups) => BoundDispatch::Groups(groups),
                        None => {
                            let last = bound.pop().ok_or_else(|| {
                                Error::internal("an indirect launch lost its counts binding")
                            })?;
                            BoundDispatch::Indirect {
                                memory: last.memory,
                                offset: last.offset,
                            }
                        }
                    };
                    let compiled = d.kernels.get(&id).ok_or_else(|| {
                        Error::internal("a compiled kernel is missing from the cache")
                    })?;
                    d.backend.launch(
                        d.stream,
                        compiled,
                        &Launch {
                            name: &name,
                            bindings: &bound,
                            scalars,
                            dispatch,
                        },
                    )
                })
            },
        );
        self.conclude(stream, outcome)
    }

    /// The backend's own limits, checked before the launch's scope opens so
    /// that a launch no device could run is refused like any other bad
    /// argument ([`Backend::check_launch`]). A binding without memory is left
    /// to the scope, which skips or claims it.
    fn check_launch(
        &self,
        id: KernelId,
        name: &str,
        resolved: &[(BufferRange, Access)],
        scalars: &[u8],
        groups: Option<[u32; 3]>,
    ) -> Result<()> {
        let Some(compiled) = self.kernels.get(&id) else {
            return Ok(());
        };
        let mut bound: SmallVec<[Bound<'_, B::Memory>; 8]> = SmallVec::new();
        for (r, access) in resolved {
            let Some(memory) = self.memory(r.buffer) else {
                return Ok(());
            };
            bound.push(Bound {
                memory,
                offset: r.range.start,
                len: r.range.len(),
                access: *access,
            });
        }
        let dispatch = match groups {
            Some(groups) => BoundDispatch::Groups(groups),
            None => match bound.pop() {
                Some(last) => BoundDispatch::Indirect {
                    memory: last.memory,
                    offset: last.offset,
                },
                None => return Ok(()),
            },
        };
        self.backend.check_launch(
            compiled,
            &Launch {
                name,
                bindings: &bound,
                scalars,
                dispatch,
            },
        )
    }

    pub(crate) fn sync(&mut self, stream: StreamId, buffers: &[Slice<'_>]) -> Result<()> {
        self.check_poison()?;
        if !buffers.is_empty() {
            self.check(buffers)?;
        }
        self.refuse_if_recording(stream, "a sync")?;
        self.sync_stream(stream)
    }

    pub(crate) fn check(&mut self, slices: &[Slice<'_>]) -> Result<()> {
        self.check_poison()?;
        let mut ranges = Vec::with_capacity(slices.len());
        for (i, slice) in slices.iter().enumerate() {
            ranges.push(self.resolve(slice.buffer, slice.range, &format!("slice {i}"))?);
        }
        self.table.check(&ranges)
    }

    /// Whether `capture` was opened on this server.
    pub(crate) fn owns(&self, capture: &Capture) -> bool {
        capture.server == self.id
    }

    /// The stream's open window that `capture` names, or why it names none.
    fn open_window(&self, capture: &Capture) -> Result<usize> {
        if !self.owns(capture) {
            return Err(Error::invalid(
                "capture",
                format!("{capture:?} belongs to another server"),
            ));
        }
        let index = capture.stream.0 as usize;
        match self.streams.get(index) {
            Some(state)
                if state.window.epoch() == capture.epoch
                    && state.window.state() == CaptureState::Recording =>
            {
                Ok(index)
            }
            _ => Err(Error::invalid(
                "capture",
                format!("{capture:?} has already ended"),
            )),
        }
    }

    /// Open a window on `stream`; its epoch names it for the `Capture`.
    pub(crate) fn begin_capture(&mut self, stream: StreamId) -> Result<u64> {
        self.check_poison()?;
        let index = self.stream_index(stream);
        self.streams[index].window.prepare(stream)?;
        let state = &mut self.streams[index];
        let started = self
            .backend
            .flush(&mut state.device)
            .and_then(|()| self.backend.begin_capture(&mut state.device));
        if let Err(error) = started {
            state.window.abort();
            return Err(error);
        }
        state.window.start()?;
        Ok(state.window.epoch())
    }

    pub(crate) fn end_capture(&mut self, by: StreamId, capture: &Capture) -> Result<GraphId> {
        let index = self.open_window(capture)?;
        let opened = capture.stream;
        if let Err(poisoned) = self.check_poison() {
            // Rule 36: nothing seals on a poisoned device; the window is
            // thrown away so the stream does not stay recording.
            self.abort_window(opened);
            return Err(poisoned);
        }
        let end = self.streams[index].window.end(by)?;
        match end {
            WindowEnd::Sealable { written, read } => {
                let sealed = self
                    .fault(Site::Seal, Some(opened))
                    .and_then(|()| self.backend.end_capture(&mut self.streams[index].device));
                match sealed {
                    Ok(graph) => {
                        let id = GraphId(self.next_graph);
                        self.next_graph += 1;
                        self.graphs.insert(
                            id,
                            GraphEntry {
                                graph,
                                label: Arc::from(format!("replay of {id}")),
                                written,
                                read,
                            },
                        );
                        Ok(id)
                    }
                    Err(reason) => {
                        self.backend.abort_capture(&mut self.streams[index].device);
                        let error = Error::Unsealed {
                            stream: opened,
                            reason: Arc::new(reason),
                        };
                        Err(self.unsealed(opened, &written, error))
                    }
                }
            }
            WindowEnd::Unsealable(written, error) => {
                self.backend.abort_capture(&mut self.streams[index].device);
                Err(self.unsealed(opened, &written, error))
            }
        }
    }

    fn unsealed(&mut self, stream: StreamId, written: &[BufferRange], error: Error) -> Error {
        tracing::warn!(%stream, "capture cannot seal: {error}");
        self.table
            .claim_failed(written, Work::new(WorkKind::Settle, stream), error.clone());
        self.on_failure(stream, &error);
        if let Error::Unsealed { reason, .. } = &error
            && reason.is_sticky()
        {
            self.poison_with(reason);
        }
        error
    }

    /// Throw the window `capture` names away (see [`abort_window`](Self::abort_window)).
    pub(crate) fn abort_capture(&mut self, capture: &Capture) -> Result<()> {
        self.open_window(capture)?;
        self.abort_window(capture.stream);
        Ok(())
    }

    /// Throw `stream`'s window away. Its clean work healed what it wrote when
    /// it was recorded, because recording is its submission (rule 23);
    /// withdrawn, that work will never run, so its write set is claimed
    /// again. Allowed on a poisoned device: it issues no work.
    fn abort_window(&mut self, stream: StreamId) {
        let index = self.stream_index(stream);
        let state = &mut self.streams[index];
        let was = state.window.state();
        let written = state.window.abort();
        if was == CaptureState::Recording {
            self.backend.abort_capture(&mut state.device);
        }
        if !written.is_empty() {
            let error = Error::Unsealed {
                stream,
                reason: Arc::new(Error::refused(
                    "the capture was aborted, so its recorded work never runs",
                )),
            };
            self.table
                .claim_failed(&written, Work::new(WorkKind::Settle, stream), error);
        }
    }

    pub(crate) fn capture_state(&self, stream: StreamId) -> CaptureState {
        self.streams[self.stream_index(stream)].window.state()
    }

    fn graph_entry(&self, graph: &Graph) -> Result<&GraphEntry<B::Graph>> {
        if graph.server != self.id {
            return Err(Error::invalid(
                "graph",
                format!("{} belongs to another server", graph.id),
            ));
        }
        self.graphs
            .get(&graph.id)
            .ok_or_else(|| Error::invalid("graph", format!("{} is unknown or destroyed", graph.id)))
    }

    pub(crate) fn replay(&mut self, stream: StreamId, graph: &Graph) -> Result<()> {
        self.check_poison()?;
        self.refuse_if_recording(stream, "a replay")?;
        let entry = self.graph_entry(graph)?;
        if let Some(gone) = entry
            .written
            .iter()
            .chain(&entry.read)
            .find(|r| !self.table.is_live(r.buffer))
        {
            return Err(Error::invalid(
                "graph",
                format!("{} uses {}, which was freed", graph.id, gone.buffer),
            ));
        }
        let label = entry.label.clone();
        let read = entry.read.clone();
        let graph_written = entry.written.clone();
        let mut written = self.write_set();
        written.extend_from_slice(&graph_written);
        let touched: SmallVec<[BufferId; 8]> =
            written.iter().chain(&read).map(|r| r.buffer).collect();
        self.refuse_recorded_elsewhere(stream, &touched)?;
        let id = graph.id;
        let outcome = ExecuteScope::launching(self, &label, stream, &read, written).execute(
            |server, written| {
                server.issue(Site::Replay, stream, touched, written, |d| {
                    let entry = d.graphs.get(&id).ok_or_else(|| {
                        Error::internal("a graph left the table inside its own replay")
                    })?;
                    d.backend
                        .replay(d.stream, &entry.graph)
                        .map_err(|e| match e {
                            e @ Error::Fault(_) => e,
                            other => Error::Replay {
                                graph: id,
                                stream,
                                detail: other.to_string(),
                            },
                        })
                })
            },
        );
        self.conclude(stream, outcome)
    }

    pub(crate) fn destroy_graph(&mut self, graph: &Graph) -> Result<()> {
        self.graph_entry(graph)?;
        self.destroy_graph_id(graph.id)
    }

    /// Destroy a graph in the table. Allowed on a poisoned device — it
    /// releases rather than issues, and the waits it makes fail fast there —
    /// so a runtime can still tear down.
    fn destroy_graph_id(&mut self, id: GraphId) -> Result<()> {
        let Some(entry) = self.graphs.remove(&id) else {
            return Err(Error::invalid(
                "graph",
                format!("{id} is unknown or destroyed"),
            ));
        };
        // The backend destroys the graph whatever the fault plan says: an
        // injected failure stands for one that waiting on the replays in
        // flight surfaced, not for skipping that wait (rule 35), which
        // would free a graph a replay may still be running.
        let injected = self.fault(Site::Destroy, None);
        let destroyed = self.backend.destroy_graph(entry.graph);
        if let (Err(_), Err(lost)) = (&injected, &destroyed) {
            tracing::warn!(graph = %id, "destroying the graph also failed: {lost}");
        }
        let result = injected.and(destroyed);
        if let Err(error) = result {
            self.table.claim_failed(
                &entry.written,
                Work::new(WorkKind::Replay, StreamId(0)),
                error.clone(),
            );
            if error.is_sticky() {
                self.poison_with(&error);
            }
            return Err(error);
        }
        Ok(())
    }

    pub(crate) fn failures_seen(&self, stream: StreamId) -> u64 {
        self.streams[self.stream_index(stream)].failures_seen
    }

    pub(crate) fn failures_held(&self) -> usize {
        self.table.failures_len()
    }

    #[cfg(feature = "fault-injection")]
    pub(crate) fn dump_failures(&self) -> String {
        self.table.dump()
    }

    pub(crate) fn failure_claims(&self) -> usize {
        self.table.claims()
    }

    #[cfg(feature = "fault-injection")]
    pub(crate) fn audit(&self) -> Result<(), String> {
        self.table.audit()
    }

    pub(crate) fn bytes_allocated(&self) -> u64 {
        self.table.bytes_allocated()
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
        // nobody left to tell.
        for state in &mut self.streams {
            if state.window.state() == CaptureState::Recording {
                self.backend.abort_capture(&mut state.device);
            }
            let _ = self.backend.sync(&mut state.device);
        }
        for (_, entry) in self.graphs.drain() {
            let _ = self.backend.destroy_graph(entry.graph);
        }
        for id in self.table.ids() {
            if let Some(memory) = self.table.remove(id) {
                self.backend.free(memory);
            }
        }
    }
}
