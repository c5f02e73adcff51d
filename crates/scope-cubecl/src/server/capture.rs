//! Graph capture: cubecl's captures as scope's windows, and the buffers only graphs keep.

use cubecl_environment::stream::StreamId;
use cubecl_runtime::id::GraphId;
use cubecl_runtime::server::ServerError;

use super::ScopeServer;
use crate::backend::CubeBackend;
use crate::error::to_server_error;

/// A sealed graph, and the buffers only it keeps alive.
pub(super) struct Captured {
    pub(super) graph: scope_core::Graph,
    /// Tensor metadata every replay reads ([`Slot::pinned`]); scope's windows keep no buffer.
    ///
    /// [`Slot::pinned`]: crate::streams::Slot::pinned
    _pinned: Vec<scope_core::Buffer>,
}

impl<B: CubeBackend> ScopeServer<B> {
    /// cubecl's `Server::begin_capture`: a scope window on the stream.
    pub(super) fn begin_window(&mut self, stream_id: StreamId) -> Result<(), ServerError> {
        let slot = self.streams.slot(stream_id)?;
        slot.phase.begin()?;
        match slot.client.begin_capture() {
            Ok(window) => {
                slot.window = Some(window);
                slot.pinned.clear();
                Ok(())
            }
            Err(e) => {
                slot.phase.abort();
                Err(to_server_error(&e))
            }
        }
    }

    /// cubecl's `Server::end_capture`: the window sealed, or unwound if abandoned or unbegun.
    pub(super) fn end_window(&mut self, stream_id: StreamId) -> Result<GraphId, ServerError> {
        let slot = self.streams.slot(stream_id)?;
        let end = match slot.phase.end(stream_id) {
            Ok(end) => end,
            Err(error) => {
                // A capture prepared but never begun still holds the stream: unwind it.
                if slot.phase.is_active() {
                    slot.phase.abort();
                }
                return Err(error);
            }
        };
        let window = slot
            .window
            .take()
            .ok_or_else(|| ServerError::graph_state("end_capture: no scope window is open"))?;
        let pinned = std::mem::take(&mut slot.pinned);
        if end.is_abandoned() {
            let _ = slot.client.abort_capture(window);
            return Err(end.abandoned_error(stream_id, None));
        }
        let graph = slot
            .client
            .end_capture(window)
            .map_err(|e| to_server_error(&e))?;
        let id = GraphId::new();
        self.graphs.insert(
            id,
            Captured {
                graph,
                _pinned: pinned,
            },
        );
        Ok(id)
    }
}
