//! Stream capture into HIP graphs, replay and destroy.
//!
//! The core decides whether a recording may seal; this file drives HIP's capture, relaxed so
//! other streams may sync and pinned memory may be made meanwhile. A capture starts with the
//! stream's pre-capture fence (`device.rs`). A [`HipGraph`] owns what its replays read and an
//! event per stream it ran on, so destroying it waits for replays in flight (rule 35).

use std::sync::Arc;

use parking_lot::Mutex;
use scope_core::{Error, Result, StreamId};

use crate::api::{Event, Graph, GraphExec, Module, Pinned};
use crate::device::{Hip, HipStream};
use crate::error::Doing;

/// A sealed, instantiated graph.
pub struct HipGraph {
    exec: GraphExec,
    _graph: Graph,
    /// Per stream it was replayed on, an event recorded after the latest replay there.
    replays: Mutex<Vec<(StreamId, Event)>>,
    // Dropped after the graph: recorded copies read these at every replay.
    _retained: Vec<Pinned>,
    // Dropped after the graph: recorded launches run their functions at every replay.
    _modules: Vec<Arc<Module>>,
}

impl std::fmt::Debug for HipGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HipGraph({:?}, {} retained buffers)",
            self.exec,
            self._retained.len()
        )
    }
}

impl Hip {
    pub(crate) fn begin_capture(&mut self, stream: &mut HipStream) -> Result<()> {
        let doing = || Doing::Other(Some(stream.id));
        if stream.is_capturing() {
            return Err(Error::internal(format!(
                "{} was asked to begin a capture while capturing",
                stream.id
            )));
        }
        let fence = self.api.event().map_err(|e| e.into_error(doing()))?;
        fence
            .record(stream.stream())
            .map_err(|e| e.into_error(doing()))?;
        stream
            .stream()
            .begin_capture()
            .map_err(|e| e.into_error(doing()))?;
        stream.retained.clear();
        stream.modules.clear();
        *stream.shared.pre_capture.lock() = Some(Arc::new(fence));
        Ok(())
    }

    pub(crate) fn end_capture(&mut self, stream: &mut HipStream) -> Result<HipGraph> {
        let doing = || Doing::Other(Some(stream.id));
        if stream.shared.pre_capture.lock().take().is_none() {
            return Err(Error::internal(format!(
                "{} was asked to end a capture it was not recording",
                stream.id
            )));
        }
        let retained = std::mem::take(&mut stream.retained);
        let modules = std::mem::take(&mut stream.modules);
        let graph = stream
            .stream()
            .end_capture()
            .map_err(|e| e.into_error(doing()))?;
        let exec = graph.instantiate().map_err(|e| e.into_error(doing()))?;
        Ok(HipGraph {
            exec,
            _graph: graph,
            replays: Mutex::new(Vec::new()),
            _retained: retained,
            _modules: modules,
        })
    }

    pub(crate) fn abort_capture(&mut self, stream: &mut HipStream) {
        if stream.shared.pre_capture.lock().take().is_some() {
            // The recording never ran, so its graph and retained bytes can go.
            if let Err(e) = stream.stream().end_capture() {
                tracing::debug!("ending an aborted capture on {}: {e}", stream.id);
            }
        }
        stream.retained.clear();
        stream.modules.clear();
    }

    /// [`Backend::replay`](scope_core::Backend::replay). Safety: `stream`, `graph` and all memory
    /// the graph recorded work on are this backend's and alive.
    pub(crate) unsafe fn replay(&mut self, stream: &mut HipStream, graph: &HipGraph) -> Result<()> {
        let doing = || Doing::Other(Some(stream.id));
        // SAFETY: `graph` owns its modules and copied bytes; the caller keeps its memory alive.
        unsafe { stream.stream().launch_graph(&graph.exec) }.map_err(|e| e.into_error(doing()))?;
        let mut replays = graph.replays.lock();
        let index = match replays.iter().position(|(id, _)| *id == stream.id) {
            Some(index) => index,
            None => {
                let event = self.api.event().map_err(|e| e.into_error(doing()))?;
                replays.push((stream.id, event));
                replays.len() - 1
            }
        };
        replays[index]
            .1
            .record(stream.stream())
            .map_err(|e| e.into_error(doing()))
    }

    pub(crate) fn destroy_graph(&mut self, graph: HipGraph) -> Result<()> {
        let failed = graph.replays.lock().iter().find_map(|(stream, event)| {
            event
                .synchronize()
                .err()
                .map(|e| e.into_error(Doing::Waiting(Some(*stream))))
        });
        if let Some(error) = failed {
            // A replay may still read the retained bytes: leaking is safe, freeing might not be.
            tracing::warn!("waiting for a graph's replays failed, leaking it: {error}");
            std::mem::forget(graph);
            return Err(error);
        }
        drop(graph);
        Ok(())
    }
}
