//! Sealed graphs by cubecl id, each with the buffers only it keeps alive.
//!
//! `server/capture.rs` fills it; the server replays and destroys from it, never naming its
//! capture file. scope's windows keep no buffer alive, yet replays read launches' metadata.

use std::collections::HashMap;

use cubecl_runtime::id::GraphId;
use scope_core::{Buffer, Graph};

/// A sealed graph, and the buffers only it keeps alive.
pub(crate) struct Captured {
    pub(crate) graph: Graph,
    /// Tensor metadata every replay reads; dropped after the graph.
    _pinned: Vec<Buffer>,
}

/// One server's sealed graphs.
#[derive(Default)]
pub(crate) struct Graphs(HashMap<GraphId, Captured>);

impl Graphs {
    /// Keep `graph` and the metadata buffers its replays read, under a new id.
    pub(crate) fn insert(&mut self, graph: Graph, pinned: Vec<Buffer>) -> GraphId {
        let id = GraphId::new();
        self.0.insert(
            id,
            Captured {
                graph,
                _pinned: pinned,
            },
        );
        id
    }

    pub(crate) fn get(&self, id: &GraphId) -> Option<&Graph> {
        self.0.get(id).map(|captured| &captured.graph)
    }

    /// Take graph `id` out, its buffers with it, to destroy.
    pub(crate) fn remove(&mut self, id: &GraphId) -> Option<Captured> {
        self.0.remove(id)
    }
}
