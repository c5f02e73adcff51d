//! Graph capture: cubecl's captures as scope's windows.
//!
//! A capture is a scope window on the stream's client, with cubecl's published capture phase
//! beside it (`streams.rs`). Sealing hands the graph, and the metadata buffers the window's
//! launches pinned, to the server's graph table (`graphs.rs`), which replays and destroys them.

use cubecl_environment::stream::StreamId;
use cubecl_runtime::id::GraphId;
use cubecl_runtime::server::ServerError;

use super::ScopeServer;
use crate::backend::CubeBackend;
use crate::error::to_server_error;

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
        Ok(self.graphs.insert(graph, pinned))
    }
}
