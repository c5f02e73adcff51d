//! Capture windows and the graphs they seal.

use crate::backend::Backend;
use crate::capture::CaptureState;
use crate::error::{Error, Result};
use crate::handle::{Capture, Graph};

use super::Client;

impl<B: Backend> Client<B> {
    /// Open a capture window, aborted when the [`Capture`] drops.
    ///
    /// # Errors
    ///
    /// The stream already captures; poison; the backend's refusal.
    pub fn begin_capture(&self) -> Result<Capture> {
        let epoch = self.call(|server| server.begin_capture(self.stream))?;
        Ok(Capture::open(
            self.stream,
            self.shared.id,
            epoch,
            self.shared.queue.clone(),
        ))
    }

    /// Close `capture` and seal its graph.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a foreign or ended capture;
    /// [`Error::Unsealed`], which the outputs carry (rule 33).
    pub fn end_capture(&self, mut capture: Capture) -> Result<Graph> {
        let id = self.call(|server| {
            let id = server.end_capture(self.stream, &capture);
            if server.owns(&capture) {
                capture.disarm();
            }
            id
        })?;
        Ok(Graph::new(id, self.shared.id, self.shared.queue.clone()))
    }

    /// Throw `capture` away. Its work never runs, so its outputs are claimed.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a foreign or ended capture.
    pub fn abort_capture(&self, mut capture: Capture) -> Result<()> {
        self.call(|server| {
            let aborted = server.abort_capture(&capture);
            if server.owns(&capture) {
                capture.disarm();
            }
            aborted
        })
    }

    /// Where this stream's capture stands.
    pub fn capture_state(&self) -> CaptureState {
        self.look(false, |server| server.capture_state(self.stream))
    }

    /// Replay `graph` on this stream (rule 34).
    ///
    /// # Errors
    ///
    /// An unknown graph; [`Error::Skipped`]; the device's failure, which the
    /// outputs carry; a graph with collectives
    /// ([`Rank::replay`](crate::collective::Rank::replay)).
    pub fn replay(&self, graph: &Graph) -> Result<()> {
        self.call(|server| server.replay(self.stream, graph, None))
    }

    pub(crate) fn replay_in_group(&self, graph: &Graph, group: u64) -> Result<()> {
        self.call(|server| server.replay(self.stream, graph, Some(group)))
    }

    pub(crate) fn graph_rounds(&self, graph: &Graph) -> Result<Vec<crate::capture::RecordedRound>> {
        self.call(|server| server.graph_rounds(graph))
    }

    pub(crate) fn check_graph(&self, graph: &Graph) -> Result<()> {
        self.call(|server| server.check_graph(graph))
    }

    pub(crate) fn fail_graph(&self, graph: &Graph, error: Error) -> Result<()> {
        self.call(|server| server.fail_graph(self.stream, graph, error))
    }

    /// Destroy `graph`, after its replays in flight (rule 35).
    ///
    /// # Errors
    ///
    /// An unknown graph; the failure of that wait, which the outputs carry.
    pub fn destroy_graph(&self, graph: &Graph) -> Result<()> {
        self.call(|server| server.destroy_graph(graph))
    }
}

#[cfg(test)]
mod tests {
    use crate::handle::Capture;
    use crate::null::Null;
    use crate::{CaptureState, Client, Error};

    /// Ending or aborting an ended window changes nothing (rule 29).
    #[test]
    fn a_capture_of_a_window_that_ended_is_refused() {
        let c = Client::new(Null::new()).unwrap();
        let capture = c.begin_capture().unwrap();
        let graph = c.end_capture(capture).unwrap();
        let stray = Capture::stale(c.stream(), c.shared.id);
        assert!(matches!(
            c.end_capture(stray).unwrap_err(),
            Error::InvalidArgument { .. }
        ));
        let again = c.begin_capture().unwrap();
        let stray = Capture::stale(c.stream(), c.shared.id);
        assert!(matches!(
            c.abort_capture(stray).unwrap_err(),
            Error::InvalidArgument { .. }
        ));
        assert_eq!(c.capture_state(), CaptureState::Recording);
        c.end_capture(again).unwrap();
        c.replay(&graph).unwrap();
    }
}
