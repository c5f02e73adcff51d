//! CUDA stream capture: windows become instantiated graphs.
//!
//! A window is `cuStreamBeginCapture` … `cuStreamEndCapture`, then `cuGraphInstantiateWithFlags`; a
//! replay is `cuGraphLaunch`. The core decides whether a window may seal; this module reports what
//! the driver refuses. An invalidated capture or a failed instantiation is
//! [`end_capture`](Cuda::end)'s error, and the core claims the window's outputs with it (rule 33).
//!
//! Capture is `RELAXED`: the server lock already serialises every call, and the stricter modes
//! forbid what a window does on other streams meanwhile (pool allocation, pinning host memory). An
//! event recorded just before capture is "the stream's work" while it records.
//!
//! A graph keeps its host writes' pinned copies and its kernels' modules. It remembers the streams
//! it was replayed on, and destroying it waits for them (rule 35). If a wait fails, the graph is
//! leaked rather than freed under a replay.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, result};
use scope_core::{Error, Result, StreamId};

use crate::Cuda;
use crate::device::{CudaStreamState, Recording};
use crate::error::{Doing, classify};
use crate::module::Module;
use crate::pool::CudaMemory;
use crate::staging::Pinned;

/// An instantiated graph: the core's [`Backend::Graph`](scope_core::Backend::Graph).
pub struct CudaGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    /// Pinned bytes of the window's host writes, read by every replay.
    _staging: Vec<Pinned>,
    memories: Vec<CudaMemory>,
    /// The launched kernels' modules, unloaded only after `Drop` destroyed the exec.
    _modules: Vec<Arc<Module>>,
    /// Bit `i` set: replayed on stream `i` (bit 63: on some stream ≥ 63).
    replayed_on: AtomicU64,
    ctx: Arc<CudaContext>,
}

// SAFETY: graph handles work on any thread with the context current; not `Sync`.
unsafe impl Send for CudaGraph {}

impl CudaGraph {
    /// The executable graph, for a raw-API baseline.
    pub fn raw_exec(&self) -> sys::CUgraphExec {
        self.exec
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: each handle is destroyed once; `destroy_graph` waited for replays first.
        unsafe {
            if !self.exec.is_null() {
                let _ = result::graph::exec_destroy(self.exec);
            }
            if !self.graph.is_null() {
                let _ = result::graph::destroy(self.graph);
            }
        }
    }
}

fn bit(index: u32) -> u64 {
    1 << index.min(63)
}

impl Cuda {
    pub(crate) fn begin(&mut self, stream: &mut CudaStreamState) -> Result<()> {
        self.bind()?;
        let id = stream.id();
        let fail = |code| {
            classify(
                code,
                Doing::Capture {
                    stream: id,
                    what: "beginning a capture",
                },
            )
        };
        stream
            .shared
            .pre_capture
            .record(&stream.shared.cu)
            .map_err(|e| fail(e.0))?;
        // SAFETY: `stream` owns the live stream; the driver refuses a second capture.
        unsafe {
            result::stream::begin_capture(
                stream.shared.cu.cu_stream(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        }
        .map_err(|e| fail(e.0))?;
        self.capturing[stream.shared.index as usize] = true;
        stream.recording = Some(Recording::default());
        Ok(())
    }

    /// Stop capturing on the driver's side; the graph, if it produced one.
    fn stop(
        &mut self,
        stream: &mut CudaStreamState,
    ) -> (Option<Recording>, Result<sys::CUgraph, CUresult>) {
        let index = stream.shared.index;
        let recording = stream.recording.take();
        let was = std::mem::replace(&mut self.capturing[index as usize], false);
        let graph = if was {
            let mut graph: sys::CUgraph = std::ptr::null_mut();
            // SAFETY: the stream captures (begun here); ending it yields a graph or an error.
            let code = unsafe { sys::cuStreamEndCapture(stream.shared.cu.cu_stream(), &mut graph) };
            code.result().map(|()| graph).map_err(|e| e.0)
        } else {
            Ok(std::ptr::null_mut())
        };
        self.release_deferred(index);
        (recording, graph)
    }

    pub(crate) fn end(&mut self, stream: &mut CudaStreamState) -> Result<CudaGraph> {
        self.bind()?;
        let id = stream.id();
        let fail = |code, what| classify(code, Doing::Capture { stream: id, what });
        let (recording, graph) = self.stop(stream);
        let graph = graph.map_err(|code| fail(code, "ending the capture"))?;
        if graph.is_null() {
            return Err(Error::internal(format!(
                "{id} was asked to end a capture it was not recording"
            )));
        }
        let Some(recording) = recording else {
            return Err(Error::internal(format!(
                "{id} ended a capture with no recording kept"
            )));
        };
        // SAFETY: `graph` is the valid graph the capture produced.
        let exec =
            match unsafe { result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) } {
                Ok(exec) => exec,
                Err(e) => {
                    // SAFETY: the graph is ours and is destroyed once.
                    let _ = unsafe { result::graph::destroy(graph) };
                    return Err(fail(e.0, "instantiating the captured graph"));
                }
            };
        let mut memories = recording.memories;
        memories.sort_by_key(CudaMemory::device_ptr);
        memories.dedup_by_key(|m| m.device_ptr());
        Ok(CudaGraph {
            graph,
            exec,
            _staging: recording.staging,
            memories,
            _modules: recording.modules,
            replayed_on: AtomicU64::new(0),
            ctx: self.ctx.clone(),
        })
    }

    pub(crate) fn abort(&mut self, stream: &mut CudaStreamState) {
        if self.bind().is_err() {
            return;
        }
        let (_, graph) = self.stop(stream);
        if let Ok(graph) = graph
            && !graph.is_null()
        {
            // SAFETY: the graph the aborted capture produced, destroyed once.
            let _ = unsafe { result::graph::destroy(graph) };
        }
    }

    /// [`Backend::replay`](scope_core::Backend::replay), under its safety contract: `stream`,
    /// `graph` and the memory it recorded work on are this backend's and alive.
    pub(crate) unsafe fn replay_graph(
        &mut self,
        stream: &mut CudaStreamState,
        graph: &CudaGraph,
    ) -> Result<()> {
        self.bind()?;
        let id = stream.id();
        // SAFETY: `graph` holds the exec, modules and pinned bytes; its memory is alive (contract).
        unsafe { result::graph::launch(graph.exec, stream.shared.cu.cu_stream()) }.map_err(
            |e| {
                classify(
                    e.0,
                    Doing::Capture {
                        stream: id,
                        what: "replaying the graph",
                    },
                )
            },
        )?;
        graph
            .replayed_on
            .fetch_or(bit(stream.shared.index), Ordering::Relaxed);
        for memory in &graph.memories {
            memory.used_by(stream.shared.index);
        }
        Ok(())
    }

    pub(crate) fn destroy(&mut self, graph: CudaGraph) -> Result<()> {
        self.bind()?;
        let replayed = graph.replayed_on.load(Ordering::Relaxed);
        // Wait on every replaying stream, even past a failure; report the first.
        let mut first_failure = None;
        for index in 0..self.streams.len() as u32 {
            if replayed & bit(index) == 0 {
                continue;
            }
            if let Err(e) = self.finish_on_host(index) {
                let e = match e {
                    Error::Fault(mut fault) => {
                        fault.detail = format!(
                            "{} (waiting for replays before destroying a graph)",
                            fault.detail
                        );
                        fault.stream = Some(StreamId(index));
                        Error::Fault(fault)
                    }
                    other => other,
                };
                tracing::warn!("cuda: destroying a graph: {e}");
                first_failure.get_or_insert(e);
            }
        }
        match first_failure {
            None => {
                drop(graph);
                Ok(())
            }
            Some(error) => {
                // A replay whose wait failed may still read the pinned bytes: leak, don't free.
                std::mem::forget(graph);
                Err(error)
            }
        }
    }
}
