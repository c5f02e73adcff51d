//! A capture window: one stream's work that becomes a graph. A graph missing
//! a failed launch would replay "successfully", writing garbage forever, so
//! the window decides whether a recording may seal (rules 29–33). It keeps
//! the doom and what clean work wrote: an unsealable window claims those.

use std::collections::HashSet;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::id::{BufferId, BufferRange, StreamId};

/// Where a stream's capture stands (rule 29).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CaptureState {
    /// Not capturing.
    #[default]
    NoCapture,
    /// Asked to capture: earlier work is flushed, recording not yet begun.
    Prepared,
    /// Recording: work on the stream goes into the graph and does not run.
    Recording,
}

/// How a window ended.
#[derive(Debug)]
pub enum WindowEnd {
    /// Clean: the backend may seal a graph with these write and read sets.
    Sealable {
        /// What the recorded work writes.
        written: Vec<BufferRange>,
        /// What it reads that it did not write first.
        read: Vec<BufferRange>,
        /// What recorded indirect launches may write: claimed by a failed replay.
        maybe_written: Vec<BufferRange>,
        /// The collective rounds recorded, replayed by the group's ranks together.
        rounds: Vec<RecordedRound>,
    },
    /// It cannot seal (rule 33): the caller claims these with the error.
    Unsealable(Vec<BufferRange>, Error),
}

/// A collective round recorded into a window; a replay is a round too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecordedRound {
    /// The group, numbered uniquely in the process.
    pub group: u64,
    /// The round, counted from 0 in that group.
    pub round: u64,
}

/// One stream's capture window.
#[derive(Debug, Default)]
pub struct CaptureWindow {
    state: CaptureState,
    opened_by: Option<StreamId>,
    written: Vec<BufferRange>,
    seen: HashSet<BufferRange>,
    read: Vec<BufferRange>,
    seen_read: HashSet<BufferRange>,
    /// Buffers the recorded work used: refused on other streams meanwhile.
    touched: HashSet<BufferId>,
    maybe_written: Vec<BufferRange>,
    rounds: Vec<RecordedRound>,
    doom: Option<Error>,
    /// Counts `prepare`s, so a handle on an ended window cannot end a later one.
    epoch: u64,
}

impl CaptureWindow {
    /// A window in [`CaptureState::NoCapture`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Where it stands.
    pub fn state(&self) -> CaptureState {
        self.state
    }

    /// Whether work on the stream is being recorded now.
    pub fn is_recording(&self) -> bool {
        self.state == CaptureState::Recording
    }

    /// Which of the stream's windows this is, or was last.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The stream that opened it, while one has.
    #[cfg(any(test, feature = "internals"))]
    pub fn opened_by(&self) -> Option<StreamId> {
        self.opened_by
    }

    /// The doom, if work inside the window failed or was skipped.
    #[cfg(any(test, feature = "internals"))]
    pub fn doom(&self) -> Option<&Error> {
        self.doom.as_ref()
    }

    /// What clean work inside the window wrote, de-duplicated.
    #[cfg(any(test, feature = "internals"))]
    pub fn written(&self) -> &[BufferRange] {
        &self.written
    }

    /// What clean work read before writing it: the graph's inputs.
    #[cfg(any(test, feature = "internals"))]
    pub fn read(&self) -> &[BufferRange] {
        &self.read
    }

    /// Whether work recorded in the window used buffer `id`.
    pub fn touches(&self, id: BufferId) -> bool {
        self.touched.contains(&id)
    }

    /// Recorded work uses buffer `id`; outside a window, nothing.
    pub fn touch(&mut self, id: BufferId) {
        if self.is_recording() {
            self.touched.insert(id);
        }
    }

    fn reset(&mut self) {
        self.written.clear();
        self.seen.clear();
        self.read.clear();
        self.seen_read.clear();
        self.touched.clear();
        self.maybe_written.clear();
        self.rounds.clear();
        self.doom = None;
    }

    fn step(&mut self, from: CaptureState, to: CaptureState, what: &str) -> Result<()> {
        if self.state != from {
            return Err(Error::refused(format!(
                "cannot {what} a capture that is {:?}; it must be {from:?}",
                self.state
            )));
        }
        self.state = to;
        Ok(())
    }

    /// NoCapture → Prepared, clearing any earlier recording (rule 30).
    ///
    /// # Errors
    ///
    /// A refusal, changing nothing, from any other state.
    pub fn prepare(&mut self, stream: StreamId) -> Result<()> {
        self.step(CaptureState::NoCapture, CaptureState::Prepared, "prepare")?;
        self.reset();
        self.epoch = self.epoch.wrapping_add(1);
        self.opened_by = Some(stream);
        Ok(())
    }

    /// Prepared → Recording.
    ///
    /// # Errors
    ///
    /// A refusal, changing nothing, from any other state.
    pub fn start(&mut self) -> Result<()> {
        self.step(CaptureState::Prepared, CaptureState::Recording, "start")
    }

    /// Recording → NoCapture: whether it may seal (rule 33). Another
    /// stream's end abandons it.
    ///
    /// # Errors
    ///
    /// A refusal, changing nothing, when not recording.
    pub fn end(&mut self, stream: StreamId) -> Result<WindowEnd> {
        self.step(CaptureState::Recording, CaptureState::NoCapture, "end")?;
        let opened_by = self.opened_by.take().unwrap_or(stream);
        let written = std::mem::take(&mut self.written);
        let read = std::mem::take(&mut self.read);
        let maybe_written = std::mem::take(&mut self.maybe_written);
        let rounds = std::mem::take(&mut self.rounds);
        self.seen.clear();
        self.seen_read.clear();
        self.touched.clear();
        let doom = self.doom.take();
        let reason = if opened_by != stream {
            Some(Error::refused(format!(
                "the window opened on {opened_by} was ended by {stream}, which abandons it"
            )))
        } else {
            doom
        };
        Ok(match reason {
            None => WindowEnd::Sealable {
                written,
                read,
                maybe_written,
                rounds,
            },
            Some(reason) => WindowEnd::Unsealable(
                written,
                Error::Unsealed {
                    stream: opened_by,
                    reason: Arc::new(reason),
                },
            ),
        })
    }

    /// Back to NoCapture (rules 29, 30), returning what the recorded work wrote.
    pub fn abort(&mut self) -> Vec<BufferRange> {
        self.state = CaptureState::NoCapture;
        self.opened_by = None;
        let written = std::mem::take(&mut self.written);
        self.reset();
        written
    }

    /// Work inside failed or was skipped; the first doom wins (rule 31).
    pub fn fail(&mut self, error: &Error) {
        if self.is_recording() && self.doom.is_none() {
            self.doom = Some(error.clone());
        }
    }

    /// A clean indirect launch, its maybe-writes kept apart.
    pub fn record_maybe(&mut self, written: &[BufferRange], read: &[BufferRange]) {
        if !self.is_recording() {
            return;
        }
        self.record(&[], read);
        for w in written {
            if !self.maybe_written.contains(w) {
                self.maybe_written.push(*w);
            }
        }
    }

    /// A collective round was recorded; outside a window, nothing.
    pub fn record_round(&mut self, round: RecordedRound) {
        if self.is_recording() {
            self.rounds.push(round);
        }
    }

    /// Clean work wrote `written` and read `read` (rules 31, 32).
    pub fn record(&mut self, written: &[BufferRange], read: &[BufferRange]) {
        if !self.is_recording() {
            return;
        }
        // Reads first: a binding read and written is an input of the graph.
        for r in read {
            if !self.seen.contains(r) && self.seen_read.insert(*r) {
                self.read.push(*r);
            }
        }
        for w in written {
            if self.seen.insert(*w) {
                self.written.push(*w);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::{BufferId, ByteRange};

    fn w(slot: u32) -> BufferRange {
        BufferRange {
            buffer: BufferId::from_parts(slot, 0),
            range: ByteRange::new(0, 8),
        }
    }

    #[test]
    fn each_step_only_from_its_predecessor() {
        // Rule 29.
        let s = StreamId(0);
        let mut window = CaptureWindow::new();
        assert!(window.start().unwrap_err().is_refusal());
        assert!(window.end(s).unwrap_err().is_refusal());
        assert_eq!(window.state(), CaptureState::NoCapture);
        window.prepare(s).unwrap();
        assert!(window.prepare(s).unwrap_err().is_refusal());
        assert!(window.end(s).unwrap_err().is_refusal());
        assert_eq!(window.state(), CaptureState::Prepared);
        window.start().unwrap();
        assert!(window.start().is_err());
        assert_eq!(window.state(), CaptureState::Recording);
        assert!(
            matches!(window.end(s).unwrap(), WindowEnd::Sealable { written, .. } if written.is_empty())
        );
        assert_eq!(window.state(), CaptureState::NoCapture);
        window.prepare(s).unwrap();
        window.abort();
        assert_eq!(window.state(), CaptureState::NoCapture);
    }

    /// A window's rounds reach its end in order; an abort drops them (rule 50).
    #[test]
    fn recorded_rounds_reach_the_end_of_the_window() {
        let s = StreamId(0);
        let round = |round| RecordedRound { group: 7, round };
        let mut window = CaptureWindow::new();
        window.record_round(round(0));
        window.prepare(s).unwrap();
        window.start().unwrap();
        window.record_round(round(1));
        window.abort();
        window.prepare(s).unwrap();
        window.start().unwrap();
        window.record_round(round(2));
        window.record_round(round(3));
        match window.end(s).unwrap() {
            WindowEnd::Sealable { rounds, .. } => assert_eq!(rounds, vec![round(2), round(3)]),
            WindowEnd::Unsealable(_, error) => panic!("{error}"),
        }
    }

    #[test]
    fn starting_and_aborting_clear_the_recording() {
        // Rule 30.
        let s = StreamId(0);
        let mut window = CaptureWindow::new();
        window.prepare(s).unwrap();
        window.start().unwrap();
        window.record(&[w(1)], &[]);
        window.fail(&Error::refused("x"));
        assert_eq!(window.abort(), vec![w(1)]);
        assert!(window.doom().is_none() && window.written().is_empty());
        window.prepare(s).unwrap();
        window.start().unwrap();
        assert!(window.written().is_empty());
        assert!(matches!(window.end(s).unwrap(), WindowEnd::Sealable { .. }));
    }

    #[test]
    fn the_first_doom_wins_and_only_inside_a_window() {
        // Rule 31.
        let s = StreamId(0);
        let mut window = CaptureWindow::new();
        window.fail(&Error::refused("outside"));
        window.record(&[w(1)], &[]);
        assert!(window.doom().is_none() && window.written().is_empty());
        window.prepare(s).unwrap();
        window.start().unwrap();
        window.fail(&Error::refused("first"));
        window.fail(&Error::refused("second"));
        match window.end(s).unwrap() {
            WindowEnd::Unsealable(_, error) => assert!(error.to_string().contains("first")),
            other => panic!("sealed a doomed window: {other:?}"),
        }
    }

    #[test]
    fn recording_is_deduplicated_per_buffer_and_range() {
        // Rule 32.
        let s = StreamId(0);
        let mut window = CaptureWindow::new();
        window.prepare(s).unwrap();
        window.start().unwrap();
        window.record(&[w(1), w(2)], &[w(5)]);
        window.record(&[w(1)], &[w(2), w(5)]);
        assert_eq!(window.written(), &[w(1), w(2)]);
        assert_eq!(
            window.read(),
            &[w(5)],
            "w(2) was written inside before it was read"
        );
    }

    #[test]
    fn a_window_ended_by_another_stream_is_abandoned() {
        // Rule 33.
        let mut window = CaptureWindow::new();
        window.prepare(StreamId(0)).unwrap();
        window.start().unwrap();
        window.record(&[w(3)], &[]);
        match window.end(StreamId(1)).unwrap() {
            WindowEnd::Unsealable(written, error) => {
                assert_eq!(written, vec![w(3)]);
                assert!(matches!(error, Error::Unsealed { .. }));
                assert!(error.to_string().contains("abandons"));
            }
            other => panic!("sealed an abandoned window: {other:?}"),
        }
    }
}
