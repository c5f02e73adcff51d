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
use crate::client::{Binding, Buffer, Capture, Dispatch, Graph, Slice};
use crate::error::{Error, Result};
use crate::failure::{Work, WorkKind};
use crate::fault::Site;
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

type Hook = Box<dyn FnMut(StreamId, &Error) + Send>;

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
    hook: Option<Hook>,
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
        if let Some(hook) = &mut self.hook {
            hook(stream, error);
        }
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
    pub(crate) fn new(mut backend: B, id: ServerId) -> Result<Self> {
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
            hook: None,
            copy_label: Arc::from("copy"),
            #[cfg(feature = "fault-injection")]
            faults: crate::fault::FaultPlan::new(),
        })
    }

    pub(crate) fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    pub(crate) fn with_memory<R>(
        &mut self,
        buffer: &Buffer,
        f: impl FnOnce(&mut B, &B::Memory) -> R,
    ) -> Result<R> {
        let r = self.resolve(buffer, ByteRange::new(0, buffer.size()), "buffer")?;
        self.require_memory(r)?;
        let Server { backend, table, .. } = self;
        let memory = table.memory(r.buffer)?;
        Ok(f(backend, memory))
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
        for id in touched {
            self.streams[to].window.touch(id);
            let Some(entry) = self.table.get_mut(id) else {
                continue;
            };
            let from = entry.last_user.0 as usize;
            entry.last_user = stream;
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
        Ok(())
    }

    /// Remember that submitted work on `stream` writes `written`.
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
        if state.in_flight.len() >= IN_FLIGHT_LIMIT {
            let _ = self.sync_stream(stream);
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

    /// The end of a scope: poison on a sticky error, and into a `Result`.
    fn conclude<R>(&mut self, outcome: ScopedOutcome<R>) -> Result<R> {
        if let ScopedOutcome::Failed(error) = &outcome
            && error.is_sticky()
        {
            self.poison_with(error);
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
                server.fault(Site::Write, Some(stream))?;
                server.order(stream, [r.buffer])?;
                let index = server.stream_index(stream);
                let Server {
                    backend,
                    table,
                    streams,
                    ..
                } = server;
                let memory = table.memory(r.buffer)?;
                backend.write(&mut streams[index].device, memory, r.range.start, data)?;
                server.note_in_flight(stream, written);
                Ok(())
            });
        self.conclude(outcome)
    }

    /// A read into a new vector, sized only after the range is validated: a
    /// bogus range must be an error, not an allocation of its length.
    pub(crate) fn read_vec(&mut self, stream: StreamId, src: Slice<'_>) -> Result<Vec<u8>> {
        let r = self.resolve_copy_range(src, "read source")?;
        let len = usize::try_from(r.range.len())
            .map_err(|_| Error::invalid("read", "longer than the address space"))?;
        let mut out = vec![0; len];
        self.read(stream, src, &mut out)?;
        Ok(out)
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
        self.refuse_if_recording(stream, "a host read")?;
        self.table.check(&[r])?;
        self.require_memory(r)?;
        // Before the device call, so before its injected fault too.
        self.refuse_recorded_elsewhere(stream, &[r.buffer])?;
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
    pub(crate) fn peek(&mut self, stream: StreamId, src: Slice<'_>, out: &mut [u8]) -> Result<()> {
        let r = self.resolve_copy_range(src, "peek source")?;
        self.refuse_if_recording(stream, "a peek")?;
        self.require_memory(r)?;
        self.refuse_recorded_elsewhere(stream, &[r.buffer])?;
        self.device_read(stream, r, out)
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
                server.fault(Site::Copy, Some(stream))?;
                server.order(stream, [s.buffer, d.buffer])?;
                let index = server.stream_index(stream);
                let Server {
                    backend,
                    table,
                    streams,
                    ..
                } = server;
                let (src, dst) = (table.memory(s.buffer)?, table.memory(d.buffer)?);
                backend.copy(
                    &mut streams[index].device,
                    src,
                    s.range.start,
                    dst,
                    d.range.start,
                    s.range.len(),
                )?;
                server.note_in_flight(stream, written);
                Ok(())
            },
        );
        self.conclude(outcome)
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
        self.fault(Site::Compile, Some(stream))?;
        let compiled = self.backend.compile(kernel)?;
        self.kernels.insert(kernel.id(), compiled);
        Ok(())
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
        if !runs_nothing {
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
        let outcome = ExecuteScope::launching(self, &name, stream, &read, written).execute(
            |server, written| {
                if runs_nothing {
                    return Ok(());
                }
                server.fault(Site::Launch, Some(stream))?;
                server.order(stream, resolved.iter().map(|(r, _)| r.buffer))?;
                let index = server.stream_index(stream);
                {
                    let Server {
                        backend,
                        table,
                        streams,
                        kernels,
                        ..
                    } = server;
                    let mut bound: SmallVec<[Bound<'_, B::Memory>; 8]> = SmallVec::new();
                    for (r, access) in &resolved {
                        let memory = table.memory(r.buffer)?;
                        bound.push(Bound {
                            memory,
                            offset: r.range.start,
                            len: r.range.len(),
                            access: *access,
                        });
                    }
                    let dispatch = match groups {
                        Some(groups) => BoundDispatch::Groups(groups),
                        None => {
                            let last = bound
                                .pop()
                                .ok_or_else(|| Error::invalid("indirect dispatch", "missing"))?;
                            BoundDispatch::Indirect {
                                memory: last.memory,
                                offset: last.offset,
                            }
                        }
                    };
                    let compiled = kernels
                        .get(&id)
                        .ok_or_else(|| Error::refused("the compiled kernel was evicted"))?;
                    backend.launch(
                        &mut streams[index].device,
                        compiled,
                        &Launch {
                            name: &name,
                            bindings: &bound,
                            scalars,
                            dispatch,
                        },
                    )?;
                }
                server.note_in_flight(stream, written);
                Ok(())
            },
        );
        self.conclude(outcome)
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
        let mut ranges = Vec::with_capacity(slices.len());
        for (i, slice) in slices.iter().enumerate() {
            ranges.push(self.resolve(slice.buffer, slice.range, &format!("slice {i}"))?);
        }
        self.table.check(&ranges)
    }

    pub(crate) fn begin_capture(&mut self, stream: StreamId) -> Result<()> {
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
        state.window.start()
    }

    pub(crate) fn end_capture(&mut self, by: StreamId, capture: &Capture) -> Result<GraphId> {
        if capture.server != self.id {
            return Err(Error::invalid("capture", "it belongs to another server"));
        }
        let opened = capture.stream;
        let index = self.stream_index(opened);
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

    /// Throw a window away. Its clean work healed what it wrote when it was
    /// recorded, because recording is its submission (rule 23); withdrawn,
    /// that work will never run, so its write set is claimed again.
    pub(crate) fn abort_capture(&mut self, capture: &Capture) {
        if capture.server != self.id {
            return;
        }
        let index = self.stream_index(capture.stream);
        let state = &mut self.streams[index];
        let was = state.window.state();
        let written = state.window.abort();
        if was == CaptureState::Recording {
            self.backend.abort_capture(&mut state.device);
        }
        if !written.is_empty() {
            let error = Error::Unsealed {
                stream: capture.stream,
                reason: Arc::new(Error::refused(
                    "the capture was aborted, so its recorded work never runs",
                )),
            };
            self.table
                .claim_failed(&written, Work::new(WorkKind::Settle, capture.stream), error);
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
                server.fault(Site::Replay, Some(stream))?;
                server.order(stream, touched)?;
                let index = server.stream_index(stream);
                let Server {
                    backend,
                    streams,
                    graphs,
                    ..
                } = server;
                let entry = graphs
                    .get(&id)
                    .ok_or_else(|| Error::invalid("graph", "destroyed"))?;
                backend
                    .replay(&mut streams[index].device, &entry.graph)
                    .map_err(|e| match e {
                        e @ Error::Fault(_) => e,
                        other => Error::Replay {
                            graph: id,
                            stream,
                            detail: other.to_string(),
                        },
                    })?;
                server.note_in_flight(stream, written);
                Ok(())
            },
        );
        self.conclude(outcome)
    }

    pub(crate) fn destroy_graph(&mut self, graph: &Graph) -> Result<()> {
        self.graph_entry(graph)?;
        let Some(entry) = self.graphs.remove(&graph.id) else {
            return Err(Error::invalid("graph", "unknown"));
        };
        // The backend destroys the graph whatever the fault plan says: an
        // injected failure stands for one that waiting on the replays in
        // flight surfaced, not for skipping that wait (rule 35), which
        // would free a graph a replay may still be running.
        let injected = self.fault(Site::Destroy, None);
        let destroyed = self.backend.destroy_graph(entry.graph);
        if let (Err(_), Err(lost)) = (&injected, &destroyed) {
            tracing::warn!(graph = %graph.id, "destroying the graph also failed: {lost}");
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

    pub(crate) fn set_hook(&mut self, hook: Hook) {
        self.hook = Some(hook);
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
