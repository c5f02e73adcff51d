//! Handles, resolved first, so bad input is a typed error changing nothing.

use super::*;

impl<B: Backend> Server<B> {
    pub(crate) fn resolve(
        &self,
        buffer: &Buffer,
        range: ByteRange,
        what: &str,
    ) -> Result<BufferRange> {
        self.resolve_with(buffer, range, &|| what.to_owned())
    }

    /// [`resolve`](Self::resolve), formatting the argument only on error.
    pub(super) fn resolve_with(
        &self,
        buffer: &Buffer,
        range: ByteRange,
        what: &dyn Fn() -> String,
    ) -> Result<BufferRange> {
        resolve(&self.table.ledger, self.id, buffer, range, what).map(|(r, _)| r)
    }

    pub(super) fn resolve_copy_range(&self, slice: Slice<'_>, what: &str) -> Result<BufferRange> {
        let r = self.resolve(slice.buffer, slice.range, what)?;
        if r.range.start % COPY_ALIGNMENT != 0 || r.range.len() % COPY_ALIGNMENT != 0 {
            return Err(Error::invalid(
                what,
                format!("{r}: host and device copies move whole {COPY_ALIGNMENT}-byte words"),
            ));
        }
        Ok(r)
    }

    pub(super) fn memory(&self, id: BufferId) -> Option<&B::Memory> {
        self.table.memory_of(id)
    }

    pub(super) fn require_memory(&self, r: BufferRange) -> Result<()> {
        match self.memory(r.buffer) {
            Some(_) => Ok(()),
            None => Err(self.table.ledger.unallocated_error(r.buffer)),
        }
    }

    /// A stream kept for good, as backends index by id; at most [`MAX_STREAMS`].
    pub(crate) fn create_stream(&mut self) -> Result<StreamId> {
        self.check_poison()?;
        if self.streams.len() >= MAX_STREAMS {
            return Err(Error::invalid(
                "stream",
                format!(
                    "a server has at most {MAX_STREAMS} streams, and they live as long as it \
                     does: reuse the clients you have"
                ),
            ));
        }
        let id = StreamId(self.streams.len() as u32);
        // SAFETY: `id` is the count of streams the backend created so far.
        let device = unsafe { self.backend.create_stream(id)? };
        self.streams.push(StreamState {
            device,
            window: CaptureWindow::new(),
            in_flight: InFlight::default(),
            failures_seen: 0,
            drains: 0,
        });
        Ok(id)
    }

    /// A reused stream for the core: re-formed groups never exhaust [`MAX_STREAMS`].
    pub(crate) fn lend_stream(&mut self) -> Result<StreamId> {
        self.check_poison()?;
        match self.spare_streams.pop() {
            Some(stream) => Ok(stream),
            None => self.create_stream(),
        }
    }

    /// `stream` back for the next loan; one with an open window stays spent.
    pub(crate) fn take_back_stream(&mut self, stream: StreamId) {
        let idle = self
            .streams
            .get(stream.0 as usize)
            .is_some_and(|s| s.window.state() == CaptureState::NoCapture);
        if idle && !self.spare_streams.contains(&stream) {
            self.spare_streams.push(stream);
        }
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
            // SAFETY: this server's stream; `size` is non-zero and within the
            // largest allocation (checked above).
            .and_then(|()| unsafe { self.backend.allocate(&mut self.streams[index].device, size) });
        if matches!(&result, Err(e) if e.is_out_of_memory()) {
            // Rule 37: reclaim what the pool caches and try once more.
            self.backend.trim();
            result = self
                .fault(Site::Allocate, Some(stream))
                // SAFETY: as for the first try.
                .and_then(|()| unsafe {
                    self.backend.allocate(&mut self.streams[index].device, size)
                });
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
                Ok(self.insert_failed(stream, size, error))
            }
        }
    }

    /// A buffer with no memory that carries `error` (rule 28).
    fn insert_failed(&mut self, stream: StreamId, size: u64, error: Error) -> BufferId {
        let record = self
            .table
            .failures()
            .mint_failed(Work::new(WorkKind::Allocate, stream), error);
        self.table.insert(size, None, Some(record), stream)
    }

    /// A buffer an adapter refused itself, carrying `error`.
    pub(crate) fn failed_allocation(
        &mut self,
        stream: StreamId,
        size: u64,
        error: Error,
    ) -> Result<BufferId> {
        self.check_poison()?;
        if size == 0 {
            return Err(Error::invalid("allocation size", "zero bytes"));
        }
        Ok(self.insert_failed(stream, size, error))
    }

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
            // SAFETY: removed from the table, so no later call names it; `replay`
            // refuses a graph whose buffers are not all live.
            unsafe { self.backend.free(memory) };
        }
    }
}

/// `buffer`'s `range` validated with one lookup; `what` names it on error.
#[inline]
pub(super) fn resolve<'l>(
    ledger: &'l Ledger,
    server: ServerId,
    buffer: &Buffer,
    range: ByteRange,
    what: &dyn Fn() -> String,
) -> Result<(BufferRange, &'l crate::table::Entry)> {
    if buffer.server() != server {
        return Err(Error::invalid(
            what(),
            format!("{} belongs to another server", buffer.id()),
        ));
    }
    let Some(entry) = ledger.get(buffer.id()) else {
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
    Ok((
        BufferRange {
            buffer: buffer.id(),
            range,
        },
        entry,
    ))
}
