//! Ordering, in-flight work and poison: the one order every unit of work
//! takes — refuse a use across a capture, wait for the streams that used its
//! buffers last, issue, conclude — and the attribution of faults that
//! surface later (rules 23, 36).

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

    /// Make `stream` wait for the last other stream that used each of
    /// `touched` ([`Books::order`]).
    pub(super) fn order(&mut self, stream: StreamId, touched: &[BufferId]) -> Result<()> {
        debug_assert!(
            self.refuse_recorded_elsewhere(stream, touched).is_ok(),
            "a cross-capture use must be refused before its scope opens"
        );
        let (mut books, device) = self.split();
        books.order(device.backend, stream, touched.iter().copied(), false)
    }

    /// Wait for `stream`'s work with the lock held: for the waits the core
    /// cannot give the lock up for (bounding an in-flight list).
    pub(super) fn sync_stream(&mut self, stream: StreamId) -> Result<()> {
        let index = self.stream_index(stream);
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

    /// Submit `stream`'s work and return what waiting for it needs, for the
    /// client to wait on with the lock released: one stream's long wait must
    /// not stall every other thread's calls.
    ///
    /// `site` is the fault-plan site the wait stands for, if any (a read
    /// consults its own site when it copies).
    pub(super) fn begin_wait(
        &mut self,
        stream: StreamId,
        site: Option<Site>,
    ) -> Result<PendingWait<B>> {
        let index = self.stream_index(stream);
        let mark = self.streams[index].in_flight.mark();
        let begun = site
            .map_or(Ok(()), |site| self.fault(site, Some(stream)))
            // SAFETY: a stream of this server's; every caller refused a
            // recording stream first (`refuse_if_recording`), and the
            // waiter is ended once, by `end_wait`.
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

    /// Settle a wait the client ran without the lock, whose outcome is
    /// `waited`: what it covered completed, or carries the fault that
    /// surfaced (rule 23). Work other threads submitted meanwhile stays in
    /// flight. The device may have been poisoned meanwhile; that is
    /// reported, since every later operation fails fast (rule 36).
    pub(crate) fn end_wait(&mut self, pending: PendingWait<B>, waited: Result<()>) -> Result<()> {
        let PendingWait {
            stream,
            waiter,
            mark,
            token: _token,
        } = pending;
        let index = self.stream_index(stream);
        // What the backend kept for the stream's next wait (a lost batch,
        // an error reported late) may belong to work submitted after the
        // mark, by another thread while this one waited: it lands on
        // everything in flight. What the wait itself surfaced lands on the
        // work it covered.
        if let Some(waiter) = waiter {
            // SAFETY: the waiter came from this stream's `begin_wait` or
            // `begin_read` (only they make a `PendingWait`), which is
            // consumed here, so it is ended once.
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

    /// A device call outside any scope failed with `error`: attribute it to
    /// what was in flight on `stream` before `mark` (rule 23), and poison on
    /// a sticky fault (rule 36).
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

    /// `error` befell what `stream` had in flight before `mark`: every
    /// write set submitted since its last completed sync, up to there,
    /// carries it now (rule 23).
    fn lose_in_flight(&mut self, stream: StreamId, error: &Error, mark: u64) {
        let index = self.stream_index(stream);
        let in_flight = self.streams[index].in_flight.take_to(mark);
        self.table.claim_failed(
            &in_flight,
            Work::new(WorkKind::Settle, stream),
            error.clone(),
        );
    }

    /// Poison the device with `fault`: every later operation fails fast, and
    /// every buffer written by work in flight on any stream carries it.
    pub(super) fn poison_with(&mut self, fault: &Error) {
        if self.poison.is_some() {
            return;
        }
        tracing::error!("device poisoned: {fault}");
        let fault = Arc::new(fault.clone());
        self.poison = Some(fault.clone());
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

    /// The end of a scope on `stream`, in the one order every unit of work
    /// takes after its scope settled:
    ///
    /// 1. a sticky fault poisons the device (rule 36);
    /// 2. any other device fault means the stream lost what it had
    ///    submitted, not only this work (a failed batch submit, say), so the
    ///    write sets in flight on it take the fault too (rule 23);
    /// 3. the in-flight list is bounded: past its limit the stream is synced,
    ///    and a fault that sync surfaces lands on what was in flight.
    ///
    /// Work that ran, with room left in flight, has nothing of these to
    /// do: that check is inlined into every caller, so the success path
    /// pays no call for the rest.
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
            // Attributed by `sync_stream` itself; the work concluded here
            // succeeded or failed on its own account.
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

    /// Make `stream` wait for the last other stream that used each of
    /// `touched`, then mark them used by `stream` (and, while `stream`
    /// records, used by its window). Callers have asked
    /// [`refuse_recorded_elsewhere`](Server::refuse_recorded_elsewhere)
    /// first, before opening their scope; nothing between changes a last
    /// user.
    ///
    /// The new last users are recorded only once every wait is set up: a
    /// failed wait leaves the buffers' last users as they were, so the next
    /// use still waits for the stream that really used them last.
    ///
    /// `mine` says the caller already knows that every buffer touched was
    /// last used on `stream` (a launch looks as it resolves its bindings),
    /// so this need not look again.
    #[inline]
    pub(super) fn order<B: Backend<Stream = S>>(
        &mut self,
        backend: &mut B,
        stream: StreamId,
        touched: impl Iterator<Item = BufferId> + Clone,
        mine: bool,
    ) -> Result<()> {
        let to = self.stream_index(stream);
        // The common case: every buffer was last used on this stream, and
        // nothing waits or changes hands.
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

    /// [`order`](Self::order) once some buffer was last used on another
    /// stream.
    #[inline(never)]
    fn order_across<B: Backend<Stream = S>>(
        &mut self,
        backend: &mut B,
        stream: StreamId,
        touched: impl Iterator<Item = BufferId> + Clone,
    ) -> Result<()> {
        let to = self.stream_index(stream);
        let mut waited: SmallVec<[usize; 4]> = SmallVec::new();
        // Buffers changing hands; the common case (all already this
        // stream's) leaves it empty and looks nothing up twice.
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
            // `first` may be capturing, if this buffer's last use on it came
            // before the capture began (the refusal above let it through):
            // every backend's `order` then waits for its work before the
            // capture, which is all of it that runs.
            if recording {
                // A recording stream cannot wait on work outside its graph;
                // finish that work on the host instead.
                // SAFETY: a stream of this server's, alive as long as it.
                unsafe { backend.sync(&mut first.device)? };
                first.in_flight.clear();
            } else {
                // SAFETY: two distinct streams of this server's (`from !=
                // to`, split by `two`), alive as long as it.
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

    /// Remember that submitted work on stream `index` writes `written`. Only
    /// remembers: bounding the list is [`conclude`](Server::conclude)'s,
    /// after the work's scope has settled, so that a fault the bounding
    /// sync surfaces is attributed after — not healed by — the clean exit.
    /// `index` is as [`stream_index`](Self::stream_index) gives it: the one
    /// caller has it already, and calls this only for work that was
    /// submitted, not recorded into a capture window (which runs nothing).
    #[inline(always)]
    pub(super) fn note_in_flight(&mut self, index: usize, written: &[BufferRange]) {
        let state = &mut self.streams[index];
        for w in written {
            state.in_flight.push(*w);
        }
    }
}

impl<'s, B: Backend> Device<'s, B> {
    /// `kernel` compiled, if the cache has it: the kernel launched last
    /// first (a loop launches one kernel over and over, and a hash lookup
    /// per launch cost a tenth of the core's part of it), then any.
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

    /// The body every unit of device work shares — a host write, a copy, a
    /// launch, a replay — in its one order: the fault plan, waits on the
    /// streams that used `touched` last, the device call, and the note that
    /// the call's write set is in flight. Written once, no path can skip a
    /// step or take them in another order.
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
        // Whether the stream records, asked once: neither the ordering nor
        // the device call changes it.
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
#[inline]
pub(super) fn refuse_recorded_elsewhere<S>(
    streams: &[StreamState<S>],
    ledger: &Ledger,
    stream: StreamId,
    touched: impl Iterator<Item = BufferId>,
) -> Result<()> {
    // The common case: nothing is capturing.
    if any_capturing(streams) {
        return refuse_recorded_while_capturing(streams, ledger, stream, touched);
    }
    Ok(())
}

/// Whether any stream's capture window is open (prepared or recording):
/// only then can a use be recorded elsewhere, or a stream record. The
/// launch path asks it once and skips both questions when it says no.
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
