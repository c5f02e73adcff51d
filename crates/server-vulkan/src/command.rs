//! Command buffers: the encoder, a capture window's recording, and the sealed graph.
//!
//! The stream records into them and submits graphs; `capture.rs` drives the stream. So they
//! live below both. A window's pool is its own, so a graph outlives nothing it depends on.

use std::sync::Arc;

use ash::vk;
use parking_lot::Mutex;
use scope_core::Result;

use crate::device::Gpu;
use crate::error::{Site, classify};
use crate::memory::{Arena, Chunk};
use crate::timeline::{Stamp, Track};

/// Where commands go: a batch's command buffer or a graph's.
pub(crate) struct Encoder {
    pub cmd: vk::CommandBuffer,
    /// A command since the last barrier wrote memory, or the buffer is fresh.
    pub needs_barrier: bool,
    pub bound: vk::Pipeline,
    pub commands: usize,
}

impl Encoder {
    pub(crate) fn new(cmd: vk::CommandBuffer) -> Self {
        Self {
            cmd,
            needs_barrier: true,
            bound: vk::Pipeline::null(),
            commands: 0,
        }
    }

    pub(crate) fn barrier(&mut self, gpu: &Gpu) {
        if !self.needs_barrier {
            return;
        }
        let barrier = vk::MemoryBarrier::default()
            .src_access_mask(
                vk::AccessFlags::SHADER_WRITE
                    | vk::AccessFlags::TRANSFER_WRITE
                    | vk::AccessFlags::HOST_WRITE,
            )
            .dst_access_mask(
                vk::AccessFlags::SHADER_READ
                    | vk::AccessFlags::SHADER_WRITE
                    | vk::AccessFlags::TRANSFER_READ
                    | vk::AccessFlags::TRANSFER_WRITE
                    | vk::AccessFlags::INDIRECT_COMMAND_READ,
            );
        // SAFETY: `cmd` is recording: encoders exist only between begin and end.
        unsafe {
            gpu.vk().cmd_pipeline_barrier(
                self.cmd,
                vk::PipelineStageFlags::COMPUTE_SHADER
                    | vk::PipelineStageFlags::TRANSFER
                    | vk::PipelineStageFlags::HOST,
                vk::PipelineStageFlags::COMPUTE_SHADER
                    | vk::PipelineStageFlags::TRANSFER
                    | vk::PipelineStageFlags::DRAW_INDIRECT,
                vk::DependencyFlags::empty(),
                &[barrier],
                &[],
                &[],
            );
        }
        self.needs_barrier = false;
    }

    pub(crate) fn bind(&mut self, gpu: &Gpu, pipeline: vk::Pipeline) {
        if self.bound != pipeline {
            // SAFETY: `cmd` is recording; pipelines outlive every command buffer recorded.
            unsafe {
                gpu.vk()
                    .cmd_bind_pipeline(self.cmd, vk::PipelineBindPoint::COMPUTE, pipeline)
            };
            self.bound = pipeline;
        }
    }

    /// Make everything recorded visible to the host, and end the buffer.
    pub(crate) fn finish(&mut self, gpu: &Gpu) -> std::result::Result<(), vk::Result> {
        let barrier = vk::MemoryBarrier::default()
            .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
            .dst_access_mask(vk::AccessFlags::HOST_READ);
        // SAFETY: `cmd` is recording; ending it is the last use here.
        unsafe {
            gpu.vk().cmd_pipeline_barrier(
                self.cmd,
                vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER,
                vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &[barrier],
                &[],
                &[],
            );
            gpu.vk().end_command_buffer(self.cmd)
        }
    }
}

/// What one command is recorded with: the encoder, the arena for staged bytes, the device.
pub(crate) struct Recorder<'a> {
    pub encoder: &'a mut Encoder,
    pub arena: &'a mut Arena,
    pub gpu: &'a Gpu,
}

/// A window being recorded.
pub(crate) struct Recording {
    pool: vk::CommandPool,
    pub encoder: Encoder,
    pub arena: Arena,
    gpu: Arc<Gpu>,
}

impl Recording {
    /// A new command buffer in a pool of its own, begun for `SIMULTANEOUS_USE`.
    pub(crate) fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        let device = gpu.vk();
        let info = vk::CommandPoolCreateInfo::default().queue_family_index(gpu.family);
        // SAFETY: valid create info on a live device.
        let pool = unsafe { device.create_command_pool(&info, None) }
            .map_err(|e| classify(e, Site::Create, "capture command pool", 0))?;
        // Made before the buffer, so a failure below destroys the pool with it.
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
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::SIMULTANEOUS_USE);
        // SAFETY: a fresh command buffer in the initial state.
        unsafe { device.begin_command_buffer(cmd, &begin) }
            .map_err(|e| classify(e, Site::Record, "vkBeginCommandBuffer", 0))?;
        recording.encoder = Encoder::new(cmd);
        Ok(recording)
    }

    /// End the buffer and hand it, its pool and its staged bytes to a graph.
    pub(crate) fn seal(mut self) -> Result<GraphInner> {
        self.encoder
            .finish(&self.gpu)
            .map_err(|e| classify(e, Site::Record, "vkEndCommandBuffer", 0))?;
        let chunks = self.arena.take();
        let pool = std::mem::replace(&mut self.pool, vk::CommandPool::null());
        Ok(GraphInner {
            gpu: self.gpu.clone(),
            pool,
            cmd: self.encoder.cmd,
            chunks,
            commands: self.encoder.commands,
            replays: Mutex::default(),
        })
    }
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
    pub(crate) gpu: Arc<Gpu>,
    pool: vk::CommandPool,
    pub(crate) cmd: vk::CommandBuffer,
    chunks: Vec<Chunk>,
    pub(crate) commands: usize,
    /// Per stream, the timeline value that finishes its latest replay there.
    pub(crate) replays: Mutex<Stamp>,
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
