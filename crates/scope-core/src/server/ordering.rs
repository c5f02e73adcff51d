//! Ordering, in-flight work and poison. Every unit of work refuses a use
//! across a capture, waits for its buffers' streams, issues, concludes.

use std::sync::Arc;

use smallvec::SmallVec;

use super::*;

impl<B: Backend> Server<B> {
    pub(super) fn check_poison(&self) -> Result<()> {
        match &self.poison {
            Some(fault) => Err(Error::DevicePoisoned {
                fault: fault.clone(),
            }),
            None => Ok(()),
        }
    }

    pub(super) fn refuse_if_recording(&self, stream: StreamId, what: &str) -> Result<()> {
        if self.streams[self.stream_index(stream)].window.state() != CaptureState::NoCapture {
            return Err(Error::refused(format!(
                "{what} on {stream} while it is capturing: the recorded work has not run"
            )));
        }
        Ok(())
    }

    #[inline]
    pub(super) fn refuse_recorded_elsewhere(
        &self,
        stream: StreamId,
        touched: &[BufferId],
    ) -> Result<()> {
        refuse_recorded_elsewhere(
            &self.streams,
            &self.table.ledger,
            stream,
            touched.iter().copied(),
        )
    }

    pub(super) fn order(&mut self, stream: StreamId, touched: &[BufferId]) -> Result<()> {
        debug_assert!(
            self.refuse_recorded_elsewhere(stream, touched).is_ok(),
            "a cross-capture use must be refused before its scope opens"
        );
        let (mut books, device) = self.split();
        books.order(device.backend, stream, touched.iter().copied(), false)
    }

    /// Wait for `stream`'s work where the core cannot give the lock up.
    pub(super) fn sync_stream(&mut self, stream: StreamId) -> Result<()> {
        let index = self.stream_index(stream);
        self.streams[index].drains += 1;
        let result = self
            .fault(Site::Sync, Some(stream))
            // SAFETY: a stream of this server's, alive as long as it.
            .and_then(|()| unsafe { self.backend.sync(&mut self.streams[index].device) });
        match result {
            Ok(()) => {
                self.streams[index].in_flight.clear();
                Ok(())
            }
            Err(error) => {
                self.settle(stream, &error, u64::MAX);
                Err(error)
            }
        }
    }

    /// Submit `stream`'s work for an unlocked wait; `site` is its fault-plan site.
    pub(super) fn begin_wait(
        &mut self,
        stream: StreamId,
        site: Option<Site>,
    ) -> Result<PendingWait<B>> {
        let index = self.stream_index(stream);
        let mark = self.streams[index].in_flight.mark();
        let begun = site
            .map_or(Ok(()), |site| self.fault(site, Some(stream)))
            // SAFETY: this server's stream; every caller refused a recording stream
            // first, and only `end_wait` ends the waiter.
            .and_then(|()| unsafe { self.backend.begin_wait(&mut self.streams[index].device) });
        match begun {
            Ok(waiter) => Ok(PendingWait {
                stream,
                token: WaitToken::new(&self.waits, waiter.is_some()),
                waiter,
                mark,
            }),
            Err(error) => {
                self.settle(stream, &error, u64::MAX);
                Err(error)
            }
        }
    }

    /// Settle an unlocked wait: what it covered completed or carries the
    /// fault (rule 23); poison that came meanwhile is reported (rule 36).
    pub(crate) fn end_wait(&mut self, pending: PendingWait<B>, waited: Result<()>) -> Result<()> {
        let PendingWait {
            stream,
            waiter,
            mark,
            token: _token,
        } = pending;
        let index = self.stream_index(stream);
        // A fault kept for the next wait may be later work's: it lands on all
        // in flight, the wait's own fault on what it covered.
        if let Some(waiter) = waiter {
            // SAFETY: the waiter came from this stream's `begin_wait` or
            // `begin_read`, and consuming the `PendingWait` ends it once.
            let ended = unsafe {
                self.backend
                    .end_wait(&mut self.streams[index].device, waiter)
            };
            if let Err(error) = ended {
                self.settle(stream, &error, u64::MAX);
                return Err(error);
            }
        }
        if let Err(error) = waited {
            self.settle(stream, &error, mark);
            return Err(error);
        }
        self.streams[index].in_flight.take_to(mark);
        self.check_poison()
    }

    /// A device call outside any scope failed: attribute `error` to what
    /// `stream` had in flight before `mark` (rule 23); poison if sticky.
    pub(super) fn settle(&mut self, stream: StreamId, error: &Error, mark: u64) {
        if !matches!(error, Error::Fault(_)) {
            return;
        }
        self.on_failure(stream, error);
        if error.is_sticky() {
            self.poison_with(error);
            return;
        }
        self.lose_in_flight(stream, error, mark);
    }

    /// Every write set `stream` submitted before `mark` carries `error` (rule 23).
    fn lose_in_flight(&mut self, stream: StreamId, error: &Error, mark: u64) {
        let index = self.stream_index(stream);
        let in_flight = self.streams[index].in_flight.take_to(mark);
        self.table.claim_failed(
            &in_flight,
            Work::new(WorkKind::Settle, stream),
            error.clone(),
        );
    }

    /// Poison the device: later calls fail fast, all work in flight carries it.
    pub(super) fn poison_with(&mut self, fault: &Error) {
        if self.poison.is_some() {
            return;
        }
        tracing::error!("device poisoned: {fault}");
        let fault = Arc::new(fault.clone());
        self.set_poison(Some(fault.clone()));
        let in_flight: Vec<BufferRange> = self
            .streams
            .iter_mut()
            .flat_map(|s| s.in_flight.take_to(u64::MAX))
            .collect();
        self.table.claim_failed(
            &in_flight,
            Work::new(WorkKind::Settle, StreamId(0)),
            Error::DevicePoisoned { fault },
        );
    }

    /// The one place the poison changes, since unlocked waits read it too.
    pub(super) fn set_poison(&mut self, poison: Option<Arc<Error>>) {
        self.waits.poisoned(poison.clone());
        self.poison = poison;
    }

    /// The end of a scope on `stream`, in one order:
    ///
    /// 1. a sticky fault poisons the device (rule 36);
    /// 2. another device fault lands on all the stream had in flight (rule 23);
    /// 3. past its limit the in-flight list is bounded by a sync.
    #[inline(always)]
    pub(super) fn conclude<R>(&mut self, stream: StreamId, outcome: ScopedOutcome<R>) -> Result<R> {
        let index = self.stream_index(stream);
        match outcome {
            ScopedOutcome::Executed(r) if self.streams[index].in_flight.len() < IN_FLIGHT_LIMIT => {
                Ok(r)
            }
            outcome => self.conclude_settling(stream, outcome),
        }
    }

    /// [`conclude`](Self::conclude) past its success path.
    #[inline(never)]
    fn conclude_settling<R>(&mut self, stream: StreamId, outcome: ScopedOutcome<R>) -> Result<R> {
        if let ScopedOutcome::Failed(error) = &outcome {
            if error.is_sticky() {
                self.poison_with(error);
            } else if matches!(error, Error::Fault(_)) {
                self.lose_in_flight(stream, error, u64::MAX);
            }
        }
        let index = self.stream_index(stream);
        if self.streams[index].in_flight.len() >= IN_FLIGHT_LIMIT {
            // `sync_stream` attributes its own fault.
            let _ = self.sync_stream(stream);
        }
        outcome.into_result()
    }
}

impl<S> Books<'_, S> {
    #[inline]
    pub(super) fn stream_index(&self, stream: StreamId) -> usize {
        let index = stream.0 as usize;
        debug_assert!(index < self.streams.len());
        index.min(self.streams.len() - 1)
    }

    /// Make `stream` wait for the last other user of each of `touched`, then
    /// mark them its own, only once every wait is set up, so a failed wait
    /// changes nothing. `mine`: all were last used on `stream`.
    #[inline]
    pub(super) fn order<B: Backend<Stream = S>>(
        &mut self,
        backend: &mut B,
        stream: StreamId,
        touched: impl Iterator<Item = BufferId> + Clone,
        mine: bool,
    ) -> Result<()> {
        let to = self.stream_index(stream);
        let mine = mine
            || touched
                .clone()
                .all(|id| self.ledger.get(id).is_none_or(|e| e.last_user == stream));
        if mine {
            let window = &mut self.streams[to].window;
            if window.is_recording() {
                for id in touched {
                    window.touch(id);
                }
            }
            return Ok(());
        }
        self.order_across(backend, stream, touched)
    }

    /// [`order`](Self::order) once some buffer was used on another stream.
    #[inline(never)]
    fn order_across<B: Backend<Stream = S>>(
        &mut self,
        backend: &mut B,
        stream: StreamId,
        touched: impl Iterator<Item = BufferId> + Clone,
    ) -> Result<()> {
        let to = self.stream_index(stream);
        let mut waited: SmallVec<[usize; 4]> = SmallVec::new();
        let mut moved: SmallVec<[BufferId; 8]> = SmallVec::new();
        for id in touched.clone() {
            let Some(entry) = self.ledger.get(id) else {
                continue;
            };
            let from = entry.last_user.0 as usize;
            if from == to {
                continue;
            }
            moved.push(id);
            if from >= self.streams.len() || waited.contains(&from) {
                continue;
            }
            waited.push(from);
            let recording = self.streams[to].window.state() != CaptureState::NoCapture;
            let (first, then) = two(self.streams, from, to);
            // `first` may capture, if this buffer's last use came before its
            // capture began: `order` then waits for that earlier work.
            if recording {
                // A recording stream cannot wait outside its graph: finish it here.
                // SAFETY: this server's stream, alive as long as it.
                unsafe { backend.sync(&mut first.device)? };
                first.in_flight.clear();
            } else {
                // SAFETY: two distinct streams of this server's, split by `two`.
                unsafe { backend.order(&mut first.device, &mut then.device)? };
            }
        }
        for id in moved {
            if let Some(entry) = self.ledger.get_mut(id) {
                entry.last_user = stream;
            }
        }
        let window = &mut self.streams[to].window;
        if window.is_recording() {
            for id in touched {
                window.touch(id);
            }
        }
        Ok(())
    }

    /// [`conclude`](Server::conclude) bounds the list: a clean exit heals no fault.
    #[inline(always)]
    pub(super) fn note_in_flight(&mut self, index: usize, written: &[BufferRange]) {
        let state = &mut self.streams[index];
        for w in written {
            state.in_flight.push(*w);
        }
    }
}

impl<'s, B: Backend> Device<'s, B> {
    /// `kernel` compiled, if cached: the kernel launched last first, then any.
    #[inline]
    pub(super) fn cached(&mut self, kernel: &Kernel) -> Option<&'s B::Kernel> {
        let id = kernel.id();
        let index = match *self.last_kernel {
            Some((last, index)) if last == id => index,
            _ => {
                let index = *self.kernel_index.get(&id)?;
                *self.last_kernel = Some((id, index));
                index
            }
        };
        self.kernels.get(index)
    }

    /// The body every unit of device work shares, written once so no path
    /// skips a step: fault plan, waits, the device call, the note in flight.
    #[inline(always)]
    pub(super) fn issue(
        &mut self,
        books: &mut Books<'_, B::Stream>,
        site: Site,
        stream: StreamId,
        (touched, mine): (&(impl Iterator<Item = BufferId> + Clone), bool),
        written: &[BufferRange],
        call: impl FnOnce(Issue<'_, B>) -> Result<()>,
    ) -> Result<()> {
        consult(
            #[cfg(feature = "fault-injection")]
            self.faults,
            site,
            Some(stream),
        )?;
        let index = books.stream_index(stream);
        // Whether the stream records, asked once: nothing here changes it.
        let recording = books.streams[index].window.is_recording();
        if recording || !mine {
            books.order(self.backend, stream, touched.clone(), mine)?;
        }
        call(Issue {
            backend: self.backend,
            stream: &mut books.streams[index].device,
            memory: self.memory,
            graphs: self.graphs,
        })?;
        if !recording {
            books.note_in_flight(index, written);
        }
        Ok(())
    }
}

/// Refuse a buffer last used in another stream's open window, which runs at
/// replay, unless that use preceded the capture and `stream` does not record.
/// Asked before the scope opens, so a refusal claims nothing (rule 38).
#[inline]
pub(super) fn refuse_recorded_elsewhere<S>(
    streams: &[StreamState<S>],
    ledger: &Ledger,
    stream: StreamId,
    touched: impl Iterator<Item = BufferId>,
) -> Result<()> {
    if any_capturing(streams) {
        return refuse_recorded_while_capturing(streams, ledger, stream, touched);
    }
    Ok(())
}

/// Whether any capture window is open, so launches skip capture questions.
#[inline]
pub(super) fn any_capturing<S>(streams: &[StreamState<S>]) -> bool {
    streams
        .iter()
        .any(|s| s.window.state() != CaptureState::NoCapture)
}

/// [`refuse_recorded_elsewhere`] once some stream is capturing.
#[inline(never)]
pub(super) fn refuse_recorded_while_capturing<S>(
    streams: &[StreamState<S>],
    ledger: &Ledger,
    stream: StreamId,
    touched: impl Iterator<Item = BufferId>,
) -> Result<()> {
    let to = (stream.0 as usize).min(streams.len() - 1);
    let to_records = streams[to].window.state() != CaptureState::NoCapture;
    for id in touched {
        let Some(entry) = ledger.get(id) else {
            continue;
        };
        let from = entry.last_user.0 as usize;
        if from == to || from >= streams.len() {
            continue;
        }
        let window = &streams[from].window;
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
