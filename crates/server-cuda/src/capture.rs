//! CUDA stream capture: windows become instantiated graphs.
//!
//! A window is `cuStreamBeginCapture` … `cuStreamEndCapture` on the stream's
//! cudarc stream, then `cuGraphInstantiateWithFlags`; a replay is
//! `cuGraphLaunch`. The core decides whether a window may seal (a doomed
//! window is aborted, never ended); this module reports only what the driver
//! refuses: an invalidated capture (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`,
//! for instance after an illegal call while capturing) or a failed
//! instantiation comes back from [`end_capture`](Cuda::end) as the error, and
//! the core claims the window's outputs with it (rule 33).
//!
//! Capture runs in `RELAXED` mode: the server lock already serialises every
//! call, and the stricter modes would forbid what a window legitimately does
//! on *other* streams meanwhile — allocating from the pool and synchronising
//! its allocation stream, pinning host memory for a host write.
//!
//! Just before capture begins an event is recorded on the stream; while it
//! records, that event is "the stream's work", for another stream that must
//! wait for it and for destroying a graph replayed there.
//!
//! A graph keeps the pinned copies of its host writes (replays read them)
//! and the modules of the kernels it launches loaded (a kernel dropped
//! while the graph lives must not leave it launching a function of an
//! unloaded module), and remembers the streams it was replayed on;
//! destroying it first waits
//! for those streams, so no replay in flight loses its graph (rule 35); if a
//! wait fails, the graph is leaked rather than freed under a replay.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, result};
use scope_core::{Error, Result, StreamId};

use crate::device::Recording;
use crate::error::{Doing, classify};
use crate::launch::Module;
use crate::memory::Pinned;
use crate::{Cuda, CudaMemory, CudaStreamState};

/// An instantiated graph: the core's [`Backend::Graph`](scope_core::Backend::Graph).
pub struct CudaGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    /// Pinned bytes of the window's host writes, read by every replay.
    _staging: Vec<Pinned>,
    /// What the window's work touches.
    memories: Vec<CudaMemory>,
    /// The modules of the kernels the window launched: loaded while the
    /// graph lives, unloaded (if nothing else holds them) only after `Drop`
    /// destroyed the exec.
    _modules: Vec<Arc<Module>>,
    /// Bit `i` set: replayed on stream `i` (bit 63: on some stream ≥ 63).
    replayed_on: AtomicU64,
    ctx: Arc<CudaContext>,
}

// SAFETY: graph handles may be used from any thread with the context current
// as long as calls on one graph are serialised, which they are: a graph that
// is `Send` but not `Sync` is reached by one thread at a time.
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
        // SAFETY: each handle was created once and is destroyed once, here;
        // `destroy_graph` waited for the replays in flight first.
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
        // SAFETY: the stream is live: `stream` owns it. (A stream already
        // capturing is no hazard: the driver refuses it with an error.)
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
            // SAFETY: the stream is capturing (we began it); ending it hands
            // back the graph, or an error that also ends the capture.
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

    /// [`Backend::replay`](scope_core::Backend::replay).
    ///
    /// # Safety
    ///
    /// The contract of `Backend::replay`: `stream` and `graph` are this
    /// backend's and alive, and every memory the graph recorded work on is
    /// alive.
    pub(crate) unsafe fn replay_graph(
        &mut self,
        stream: &mut CudaStreamState,
        graph: &CudaGraph,
    ) -> Result<()> {
        self.bind()?;
        let id = stream.id();
        // SAFETY: the exec is live (`graph` owns it) and every kernel it
        // launches is loaded (`graph` holds their modules); the pinned bytes
        // its copies read are `graph`'s too. The contract of
        // `Backend::replay`: every memory the graph recorded work on is
        // alive, and so is `stream`.
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
        // Wait on every stream it was replayed on, even after one wait
        // fails, so no other stream's replay is left running on a graph
        // this call gave up on. The first failure is the one reported.
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
                // A replay whose wait failed may still be reading the
                // graph's pinned bytes; leaking it is safe where freeing
                // them might not be (as server-hip does).
                std::mem::forget(graph);
                Err(error)
            }
        }
    }
}
