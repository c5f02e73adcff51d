//! Capture windows and the graph table (rules 29–35).

use std::sync::Arc;

use smallvec::SmallVec;

use super::*;

impl<B: Backend> Server<B> {
    pub(crate) fn owns(&self, capture: &Capture) -> bool {
        capture.server == self.id
    }

    /// The stream's open window that `capture` names, or why it names none.
    pub(super) fn open_window(&self, capture: &Capture) -> Result<usize> {
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
        // SAFETY: this server's stream, not recording: `prepare` refuses otherwise.
        let started = unsafe { self.backend.flush(&mut state.device) }
            // SAFETY: as above.
            .and_then(|()| unsafe { self.backend.begin_capture(&mut state.device) });
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
            // Rule 36: nothing seals on a poisoned device; the window is thrown away.
            self.abort_window(opened);
            return Err(poisoned);
        }
        let end = self.streams[index].window.end(by)?;
        match end {
            WindowEnd::Sealable {
                written,
                read,
                maybe_written,
                rounds,
            } => {
                let sealed = self
                    .fault(Site::Seal, Some(opened))
                    // SAFETY: this server's stream, recording since `begin_capture`
                    // succeeded; `replay` refuses a graph whose buffers were freed.
                    .and_then(|()| unsafe {
                        self.backend.end_capture(&mut self.streams[index].device)
                    });
                match sealed {
                    Ok(graph) => {
                        let id = GraphId(self.next_graph);
                        self.next_graph += 1;
                        self.graphs.insert(
                            id,
                            GraphEntry {
                                graph: Some(graph),
                                label: Arc::from(format!("replay of {id}")),
                                written,
                                read,
                                maybe_written,
                                rounds,
                            },
                        );
                        Ok(id)
                    }
                    Err(reason) => {
                        // SAFETY: the stream whose `end_capture` just failed.
                        unsafe { self.backend.abort_capture(&mut self.streams[index].device) };
                        let error = Error::Unsealed {
                            stream: opened,
                            reason: Arc::new(reason),
                        };
                        Err(self.unsealed(opened, &written, error))
                    }
                }
            }
            WindowEnd::Unsealable(written, error) => {
                // SAFETY: this server's stream, recording until `end` above.
                unsafe { self.backend.abort_capture(&mut self.streams[index].device) };
                Err(self.unsealed(opened, &written, error))
            }
        }
    }

    pub(super) fn unsealed(
        &mut self,
        stream: StreamId,
        written: &[BufferRange],
        error: Error,
    ) -> Error {
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

    pub(crate) fn abort_capture(&mut self, capture: &Capture) -> Result<()> {
        self.open_window(capture)?;
        self.abort_window(capture.stream);
        Ok(())
    }

    /// Discard `stream`'s window, claiming its unrun writes; allowed when poisoned.
    pub(super) fn abort_window(&mut self, stream: StreamId) {
        let index = self.stream_index(stream);
        let state = &mut self.streams[index];
        let was = state.window.state();
        let written = state.window.abort();
        if was == CaptureState::Recording {
            // SAFETY: this server's stream, recording by its window.
            unsafe { self.backend.abort_capture(&mut state.device) };
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

    pub(super) fn graph_entry(&self, graph: &Graph) -> Result<&GraphEntry<B::Graph>> {
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

    /// Replay `graph` on `stream`; one with collectives only as a round.
    pub(crate) fn replay(
        &mut self,
        stream: StreamId,
        graph: &Graph,
        group: Option<u64>,
    ) -> Result<()> {
        self.check_poison()?;
        self.refuse_if_recording(stream, "a replay")?;
        let entry = self.graph_entry(graph)?;
        match (entry.rounds.first(), group) {
            (Some(_), None) => {
                return Err(Error::refused(format!(
                    "{} recorded collectives, so its group's ranks replay it together \
                     (Rank::replay); replayed alone they would wait for peers that are not",
                    graph.id
                )));
            }
            (Some(first), Some(group)) if first.group != group => {
                return Err(Error::invalid(
                    "graph",
                    format!("{} recorded another group's collectives", graph.id),
                ));
            }
            _ => {}
        }
        self.refuse_freed(graph, entry)?;
        if entry.graph.is_none() {
            return Err(Error::refused(format!(
                "{} was recorded on a device that was lost and opened again: nothing of it is \
                 left to replay; capture the work again",
                graph.id
            )));
        }
        let label = entry.label.clone();
        let read = entry.read.clone();
        let graph_written = entry.written.clone();
        let maybe_written = entry.maybe_written.clone();
        let mut written = self.write_set();
        written.extend_from_slice(&graph_written);
        for r in &maybe_written {
            self.table.ledger.unclaimed(*r, &mut written);
        }
        let touched: SmallVec<[BufferId; 8]> = written
            .iter()
            .chain(&read)
            .chain(&maybe_written)
            .map(|r| r.buffer)
            .collect();
        self.refuse_recorded_elsewhere(stream, &touched)?;
        let id = graph.id;
        let (mut books, mut device) = self.split();
        let outcome = ExecuteScope::launching(&mut books, &label, stream, &read, written).execute(
            |books, written| {
                device.issue(
                    books,
                    Site::Replay,
                    stream,
                    (&touched.iter().copied(), false),
                    written,
                    |d| {
                        let graph = d.graphs.get(&id).and_then(|e| e.graph.as_ref());
                        let graph = graph.ok_or_else(|| {
                            Error::internal("a graph left the table inside its own replay")
                        })?;
                        // SAFETY: this server's graph and stream, not recording, and every
                        // buffer the graph uses is live (checked above).
                        unsafe { d.backend.replay(d.stream, graph) }.map_err(|e| match e {
                            e @ Error::Fault(_) => e,
                            other => Error::Replay {
                                graph: id,
                                stream,
                                detail: other.to_string(),
                            },
                        })
                    },
                )
            },
        );
        self.conclude(stream, outcome)
    }

    fn refuse_freed(&self, graph: &Graph, entry: &GraphEntry<B::Graph>) -> Result<()> {
        let buffers = entry.written.iter().chain(&entry.read);
        match buffers
            .chain(&entry.maybe_written)
            .find(|r| !self.table.ledger.is_live(r.buffer))
        {
            Some(gone) => Err(Error::invalid(
                "graph",
                format!("{} uses {}, which was freed", graph.id, gone.buffer),
            )),
            None => Ok(()),
        }
    }

    pub(crate) fn graph_rounds(&self, graph: &Graph) -> Result<Vec<RecordedRound>> {
        Ok(self.graph_entry(graph)?.rounds.clone())
    }

    /// Whether `graph`'s inputs are readable now, or why it cannot replay.
    pub(crate) fn check_graph(&mut self, graph: &Graph) -> Result<()> {
        self.check_poison()?;
        let entry = self.graph_entry(graph)?;
        self.refuse_freed(graph, entry)?;
        let read = entry.read.clone();
        self.table.check(&read)
    }

    /// Claim what a replay of `graph` would write with `error` (rule 21).
    pub(crate) fn fail_graph(
        &mut self,
        stream: StreamId,
        graph: &Graph,
        error: Error,
    ) -> Result<()> {
        self.check_poison()?;
        let entry = self.graph_entry(graph)?;
        let claimed: Vec<BufferRange> = entry
            .written
            .iter()
            .chain(&entry.maybe_written)
            .copied()
            .collect();
        let mut written = self.write_set();
        written.extend(claimed);
        written.retain(|r| self.table.ledger.is_live(r.buffer));
        failed_writing(
            &mut self.books(),
            Work::new(WorkKind::Replay, stream),
            written,
            error,
        );
        Ok(())
    }

    pub(crate) fn destroy_graph(&mut self, graph: &Graph) -> Result<()> {
        self.graph_entry(graph)?;
        self.destroy_graph_id(graph.id)
    }

    /// Destroy a graph; allowed on a poisoned device, for teardown.
    pub(super) fn destroy_graph_id(&mut self, id: GraphId) -> Result<()> {
        let Some(entry) = self.graphs.remove(&id) else {
            return Err(Error::invalid(
                "graph",
                format!("{id} is unknown or destroyed"),
            ));
        };
        // Every replay is submitted before the backend waits for them (rule 35).
        self.flush_streams();
        // Destroy anyway: an injected failure stands for the wait's (rule 35).
        let injected = self.fault(Site::Destroy, None);
        let Some(graph) = entry.graph else {
            // Recorded on a device that was lost: nothing of it is left.
            return Ok(());
        };
        // SAFETY: removed from the table above, so no later call names it.
        let destroyed = unsafe { self.backend.destroy_graph(graph) };
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

    /// Submit every non-recording stream's batch; a failure lands in flight (rule 23).
    pub(super) fn flush_streams(&mut self) {
        for index in 0..self.streams.len() {
            if self.streams[index].window.is_recording() {
                continue;
            }
            // SAFETY: this server's stream, not recording (above).
            if let Err(error) = unsafe { self.backend.flush(&mut self.streams[index].device) } {
                self.settle(StreamId(index as u32), &error, u64::MAX);
            }
        }
    }
}
