//! Capture: a window's work recorded once into a reusable command buffer.
//!
//! Vulkan needs no capture API: a command buffer recorded without
//! `ONE_TIME_SUBMIT` and with `SIMULTANEOUS_USE` can be submitted again and
//! again, even while an earlier submission of it is still running. So a
//! window opens a command buffer of its own (in a command pool of its own,
//! so the graph outlives nothing it depends on), the stream's launches,
//! copies and writes are recorded into it instead of the batch, and a
//! replay queues the same command buffer into the stream's next submission
//! — no re-recording, no descriptor sets (push descriptors live in the
//! command buffer), one `vkQueueSubmit` for many replays.
//!
//! **Host writes inside a window** (the rule every server keeps): a write is
//! recorded with a copy of the bytes given at call time, and every replay
//! writes those same bytes. Up to 64 KiB the bytes live inside the command
//! buffer (`vkCmdUpdateBuffer`); larger ones in a staging chunk the graph
//! owns. Scalar blobs are kept the same way. Nothing recorded runs until a
//! replay.
//!
//! A graph is held behind an `Arc`: each replay in flight holds a clone, so
//! destroying a graph never frees a command buffer the device may still run
//! — the last completed replay releases it. A replay is batched like any
//! other work, and the graph remembers, per stream, the timeline value that
//! will finish its latest replay there; the core flushes every stream
//! before it destroys a graph, and destroying waits for those values (rule
//! 35) — but not for a replay whose batch failed and was never submitted —
//! so a fault in a replay surfaces at the destroy and the core gives it to
//! the graph's write set. A wait that gives up marks the device hung, and
//! the graph is then leaked, not freed.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use ash::vk;
use parking_lot::Mutex;
use scope_core::Result;

use crate::device::Gpu;
use crate::error::{Site, classify};
use crate::memory::{Arena, Chunk, Stamp};
use crate::stream::{Encoder, OpenStream, Track, wait_tracks};

/// A window being recorded.
pub(crate) struct Recording {
    pool: vk::CommandPool,
    pub encoder: Encoder,
    pub arena: Arena,
    gpu: Arc<Gpu>,
}

impl Drop for Recording {
    fn drop(&mut self) {
        if self.pool != vk::CommandPool::null() {
            // SAFETY: a recording's command buffer was never submitted.
            unsafe { self.gpu.vk().destroy_command_pool(self.pool, None) };
        }
    }
}

/// A sealed graph's resources.
pub struct GraphInner {
    gpu: Arc<Gpu>,
    pool: vk::CommandPool,
    pub(crate) cmd: vk::CommandBuffer,
    chunks: Vec<Chunk>,
    commands: usize,
    /// Per stream it was replayed on, the timeline value that finishes its
    /// latest replay there.
    replays: Mutex<Stamp>,
}

impl GraphInner {
    /// A replay was submitted on `track`; it is done at `value`.
    pub(crate) fn replayed(&self, track: &Arc<Track>, value: u64) {
        let mut replays = self.replays.lock();
        match replays.iter_mut().find(|(t, _)| Arc::ptr_eq(t, track)) {
            Some((_, v)) => *v = (*v).max(value),
            None => replays.push((track.clone(), value)),
        }
    }
}

impl Drop for GraphInner {
    fn drop(&mut self) {
        if self.gpu.is_hung() {
            // A replay the device never finished may still run it.
            tracing::error!("leaking a graph: a wait for the device gave up");
            std::mem::forget(std::mem::take(&mut self.chunks));
            return;
        }
        // SAFETY: the last reference is gone, so no replay of it is pending
        // (each in-flight submission holds a clone, and destroy waited for
        // the replays it knew of); the device is not hung.
        unsafe { self.gpu.vk().destroy_command_pool(self.pool, None) };
    }
}

/// A captured graph: what the core holds as `Backend::Graph`.
pub struct VulkanGraph(pub(crate) Arc<GraphInner>);

impl VulkanGraph {
    /// How many commands (launches, copies, writes) it replays.
    pub fn commands(&self) -> usize {
        self.0.commands
    }
}

/// Start recording `stream`'s work into a new command buffer.
pub(crate) fn begin(stream: &mut OpenStream) -> Result<()> {
    let gpu = stream.gpu.clone();
    let device = gpu.vk();
    let info = vk::CommandPoolCreateInfo::default().queue_family_index(gpu.family);
    // SAFETY: valid create info on a live device.
    let pool = unsafe { device.create_command_pool(&info, None) }
        .map_err(|e| classify(e, Site::Create, "capture command pool", 0))?;
    let mut recording = Recording {
        pool,
        encoder: Encoder::new(vk::CommandBuffer::null()),
        arena: Arena::new(gpu.clone()),
        gpu: gpu.clone(),
    };
    let alloc = vk::CommandBufferAllocateInfo::default()
        .command_pool(pool)
        .level(vk::CommandBufferLevel::PRIMARY)
        .command_buffer_count(1);
    // SAFETY: the pool was just created and is used only here.
    let cmd = unsafe { device.allocate_command_buffers(&alloc) }
        .map_err(|e| classify(e, Site::Record, "capture command buffer", 0))?
        .first()
        .copied()
        .unwrap_or_default();
    let begin =
        vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::SIMULTANEOUS_USE);
    // SAFETY: a fresh command buffer in the initial state.
    unsafe { device.begin_command_buffer(cmd, &begin) }
        .map_err(|e| classify(e, Site::Record, "vkBeginCommandBuffer", 0))?;
    recording.encoder = Encoder::new(cmd);
    stream.recording = Some(recording);
    Ok(())
}

/// Seal the recording into a graph.
pub(crate) fn end(stream: &mut OpenStream) -> Result<VulkanGraph> {
    let Some(mut recording) = stream.recording.take() else {
        return Err(scope_core::Error::internal(
            "the stream was asked to end a capture it was not recording",
        ));
    };
    recording
        .encoder
        .finish(&recording.gpu)
        .map_err(|e| classify(e, Site::Record, "vkEndCommandBuffer", 0))?;
    let chunks = recording.arena.take();
    let pool = std::mem::replace(&mut recording.pool, vk::CommandPool::null());
    Ok(VulkanGraph(Arc::new(GraphInner {
        gpu: recording.gpu.clone(),
        pool,
        cmd: recording.encoder.cmd,
        chunks,
        commands: recording.encoder.commands,
        replays: Mutex::default(),
    })))
}

/// Throw the recording away.
pub(crate) fn abort(stream: &mut OpenStream) {
    stream.recording = None;
}

/// Submit a replay of `graph` on `stream`.
pub(crate) fn replay(stream: &mut OpenStream, graph: &VulkanGraph) -> Result<()> {
    stream.submit_graph(&graph.0)
}

/// Destroy `graph` once its replays in flight are done (rule 35). The
/// graph's own resources go with the last replay that holds them.
pub(crate) fn destroy(graph: VulkanGraph) -> Result<()> {
    let mut replays = std::mem::take(&mut *graph.0.replays.lock());
    // The core flushed every stream first; a replay whose batch was never
    // submitted (it failed) signals nothing to wait for.
    replays.retain(|(track, value)| *value <= track.submitted.load(Ordering::Acquire));
    let waited = wait_tracks(&graph.0.gpu, &replays);
    drop(graph);
    waited
}
