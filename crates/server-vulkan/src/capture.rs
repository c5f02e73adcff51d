//! Capture: a window's work recorded once into a reusable command buffer.
//!
//! Vulkan needs no capture API: a `SIMULTANEOUS_USE` command buffer can be submitted again
//! while an earlier submission still runs. A window records into its own command pool, so the
//! graph outlives nothing it depends on. A replay queues that buffer into the stream's next
//! submission, with no re-recording and no descriptor sets.
//!
//! A host write inside a window keeps the bytes given at call time for every replay: inline
//! up to 64 KiB (`vkCmdUpdateBuffer`), else in a staging chunk the graph owns.
//!
//! Each replay in flight holds an `Arc` of the graph, so destroying one never frees a command
//! buffer the device may still run. Destroying waits for the latest submitted replay on each
//! stream (rule 35), so a replay's fault surfaces there and joins the graph's write set.

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
    /// Per stream, the timeline value that finishes its latest replay there.
    replays: Mutex<Stamp>,
}

impl GraphInner {
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
            tracing::error!("leaking a graph: a wait for the device gave up");
            std::mem::forget(std::mem::take(&mut self.chunks));
            return;
        }
        // SAFETY: the last reference is gone, so no replay is pending: each in-flight
        // submission holds a clone, and destroy waited for the rest. The device is not hung.
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

/// Destroy `graph` once its submitted replays are done (rule 35).
pub(crate) fn destroy(graph: VulkanGraph) -> Result<()> {
    let mut replays = std::mem::take(&mut *graph.0.replays.lock());
    // A replay whose batch failed was never submitted, and signals nothing.
    replays.retain(|(track, value)| *value <= track.submitted.load(Ordering::Acquire));
    let waited = wait_tracks(&graph.0.gpu, &replays);
    drop(graph);
    waited
}
