//! Logical streams: a command pool, a current command buffer and a timeline semaphore each,
//! over the device's one queue.
//!
//! **The mapping.** A scope stream is not a Vulkan queue, since lavapipe has only one. It is a
//! *timeline* on a shared queue:
//!
//! - Work is batched into the current command buffer, and submitted on a sync or read, at
//!   [`BATCH_LIMIT`] commands, or when another stream must wait for it. A submission signals
//!   the next timeline value, so "the stream's work up to here" is one number.
//! - Barriers order each command buffer after earlier submissions and each command after the
//!   last. A batch ends with a barrier to the host, for mapped reads.
//! - Between streams, [`OpenStream::order`] adds a wait on the first's value to the second's
//!   next submission. Streams that share no buffer never wait on each other.
//! - What a submission needs alive travels with it, recycled once the semaphore passes it.
//! - A failed submission is a device fault ([`Error::Fault`]) for the work in flight (rule 23),
//!   reported once. A flush for another stream's sake keeps it for the flushed stream.
//! - **Bounded in a loop that only launches.** Past [`MAX_BATCHES_IN_FLIGHT`] submissions the
//!   host waits for the oldest, so the device sets the pace, not the host's memory.
//! - **A recovery gives the stream new state in place.** The `OpenStream` is replaced; the
//!   `VulkanStream` and its id carry over.
//! - **Teardown never destroys what may still run.** On a hung device a stream leaks its pool,
//!   semaphore and holdings rather than free memory the device may use.
//!
//! Semaphores are `timeline.rs` and encoders `command.rs`: the pool and capture need them,
//! and must not need the stream. This file submits.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ash::vk;
use scope_core::{Error, Result};
use smallvec::SmallVec;

use crate::command::{Encoder, GraphInner, Recorder, Recording};
use crate::device::Gpu;
use crate::error::{Site, classify, closed};
use crate::memory::{Arena, Chunk};
use crate::timeline::{Track, wait_tracks};

/// Commands a batch holds before it is submitted unasked. On lavapipe, 256 overlaps issue and
/// execution best of 64–1024, and spreads a submission's fixed cost thin.
pub(crate) const BATCH_LIMIT: usize = 256;

/// Submissions of one stream in flight before the next waits for the oldest. Lavapipe gains
/// nothing past three; eight bound what a stream holds.
pub(crate) const MAX_BATCHES_IN_FLIGHT: usize = 8;

/// What a submission keeps alive until it completes.
pub(crate) enum Held {
    Commands(vk::CommandBuffer),
    Chunk(Chunk),
    Graph(Arc<GraphInner>),
}

/// A wait for a stream's submitted work, run without the server's lock.
pub struct StreamWait {
    gpu: Arc<Gpu>,
    track: Arc<Track>,
    value: u64,
}

impl StreamWait {
    /// Wait, bounded, for the value. `vkWaitSemaphores` may run while other threads submit.
    pub(crate) fn wait(&self) -> Result<()> {
        wait_tracks(&self.gpu, &[(self.track.clone(), self.value)])
    }
}

/// A logical stream. A recovery replaces its device state; the stream and its id carry over.
pub struct VulkanStream {
    id: scope_core::StreamId,
    /// Its state on the open device; `None` while the device is closed.
    state: Option<OpenStream>,
}

impl VulkanStream {
    pub(crate) fn new(gpu: &Arc<Gpu>, id: scope_core::StreamId) -> Result<Self> {
        Ok(Self {
            id,
            state: Some(OpenStream::new(gpu, id)?),
        })
    }

    pub(crate) fn state(&mut self) -> Result<&mut OpenStream> {
        self.state.as_mut().ok_or_else(closed)
    }

    pub(crate) fn track(&self) -> Result<&Arc<Track>> {
        self.state
            .as_ref()
            .map(|state| &state.track)
            .ok_or_else(closed)
    }

    /// Give up its device state; its semaphore goes once nothing else names it.
    pub(crate) fn close(&mut self) {
        self.state = None;
    }

    /// New state on `gpu`, not recording; returns its timeline.
    pub(crate) fn open_on(&mut self, gpu: &Arc<Gpu>) -> Result<Arc<Track>> {
        self.close();
        let state = self.state.insert(OpenStream::new(gpu, self.id)?);
        Ok(state.track.clone())
    }
}

/// A stream's state on an open device.
pub(crate) struct OpenStream {
    pub(crate) id: scope_core::StreamId,
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) track: Arc<Track>,
    pool: vk::CommandPool,
    free_cmds: Vec<vk::CommandBuffer>,
    current: Option<Encoder>,
    pending: Vec<vk::CommandBuffer>,
    held: Vec<Held>,
    waits: SmallVec<[(Arc<Track>, u64); 2]>,
    submitted: u64,
    in_flight: VecDeque<(u64, Vec<Held>)>,
    pub(crate) arena: Arena,
    deferred: Option<Error>,
    pub(crate) recording: Option<Recording>,
}

impl OpenStream {
    fn new(gpu: &Arc<Gpu>, id: scope_core::StreamId) -> Result<Self> {
        let device = gpu.vk();
        let track = Track::new(gpu)?;
        let info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(gpu.family)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: valid create info on a live device.
        let pool = unsafe { device.create_command_pool(&info, None) }
            .map_err(|e| classify(e, Site::Create, "command pool", 0))?;
        Ok(Self {
            id,
            gpu: gpu.clone(),
            track,
            pool,
            free_cmds: Vec::new(),
            current: None,
            pending: Vec::new(),
            held: Vec::new(),
            waits: SmallVec::new(),
            submitted: 0,
            in_flight: VecDeque::new(),
            arena: Arena::new(gpu.clone()),
            deferred: None,
            recording: None,
        })
    }

    fn command_buffer(&mut self) -> Result<vk::CommandBuffer> {
        if let Some(cmd) = self.free_cmds.pop() {
            return Ok(cmd);
        }
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(self.pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(1);
        // SAFETY: the pool is this stream's, used only under the server's lock.
        let cmds = unsafe { self.gpu.vk().allocate_command_buffers(&info) }
            .map_err(|e| classify(e, Site::Record, "vkAllocateCommandBuffers", 0))?;
        cmds.first()
            .copied()
            .ok_or_else(|| Error::internal("the stream has no command buffer to record into"))
    }

    /// Where the next command goes (the graph while capturing), and its arena.
    pub(crate) fn encoder(&mut self) -> Result<(&mut Encoder, &mut Arena, &Gpu)> {
        if self.recording.is_some() {
            let Some(recording) = self.recording.as_mut() else {
                return Err(Error::internal(
                    "the recording left the stream while in use",
                ));
            };
            return Ok((&mut recording.encoder, &mut recording.arena, &self.gpu));
        }
        if self.current.is_none() {
            let cmd = self.command_buffer()?;
            let begin = vk::CommandBufferBeginInfo::default()
                .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
            // SAFETY: `cmd` is fresh or its submission completed; the pool allows reset.
            if let Err(e) = unsafe { self.gpu.vk().begin_command_buffer(cmd, &begin) } {
                self.free_cmds.push(cmd);
                return Err(classify(e, Site::Record, "vkBeginCommandBuffer", 0));
            }
            self.current = Some(Encoder::new(cmd));
            self.track
                .covering
                .store(self.submitted + 1, Ordering::Release);
        }
        let Some(encoder) = self.current.as_mut() else {
            return Err(Error::internal("the stream has no current command buffer"));
        };
        Ok((encoder, &mut self.arena, &self.gpu))
    }

    /// Record one command with `body`: a barrier first, then the mark that it may have
    /// written, its count, and a full batch's submission. Every launch, copy and write comes
    /// here, since a step missed on one path is a data race. The mark is set even on failure.
    pub(crate) fn record<R>(
        &mut self,
        body: impl FnOnce(&mut Recorder<'_>) -> Result<R>,
    ) -> Result<R> {
        let (encoder, arena, gpu) = self.encoder()?;
        encoder.barrier(gpu);
        let mut recorder = Recorder {
            encoder,
            arena,
            gpu,
        };
        let result = body(&mut recorder);
        recorder.encoder.needs_barrier = true;
        let value = result?;
        recorder.encoder.commands += 1;
        self.recorded()?;
        Ok(value)
    }

    fn recorded(&mut self) -> Result<()> {
        if self.recording.is_some() {
            return Ok(());
        }
        let full = self
            .current
            .as_ref()
            .is_some_and(|e| e.commands >= BATCH_LIMIT)
            || self.pending.len() >= 64;
        if full { self.flush() } else { Ok(()) }
    }

    /// End the current batch and queue it. A failure loses the batch, a fault like a failed
    /// submission.
    fn close_current(&mut self) -> Result<()> {
        if let Some(mut encoder) = self.current.take() {
            self.held.push(Held::Commands(encoder.cmd));
            encoder
                .finish(&self.gpu)
                .map_err(|e| classify(e, Site::Submit, "vkEndCommandBuffer", 0))?;
            self.pending.push(encoder.cmd);
        }
        Ok(())
    }

    /// Queue a replay of `graph` in the next submission, and tell the graph its value.
    /// The core flushes every stream before destroying a graph (rule 35).
    pub(crate) fn submit_graph(&mut self, graph: &Arc<GraphInner>) -> Result<()> {
        if let Err(e) = self.close_current() {
            self.abandon_pending();
            return Err(e);
        }
        self.pending.push(graph.cmd);
        self.held.push(Held::Graph(graph.clone()));
        let value = self.submitted + 1;
        self.track.covering.store(value, Ordering::Release);
        graph.replayed(&self.track, value);
        if self.pending.len() >= 64 {
            self.flush()
        } else {
            Ok(())
        }
    }

    pub(crate) fn flush(&mut self) -> Result<()> {
        if let Err(e) = self.close_current() {
            self.abandon_pending();
            return Err(e);
        }
        self.submit()
    }

    /// Submit the ended command buffers and waits, then recycle and throttle.
    fn submit(&mut self) -> Result<()> {
        if self.pending.is_empty() && self.waits.is_empty() {
            return Ok(());
        }
        let value = self.submitted + 1;
        let wait_semaphores: SmallVec<[vk::Semaphore; 2]> =
            self.waits.iter().map(|(t, _)| t.semaphore).collect();
        let wait_values: SmallVec<[u64; 2]> = self.waits.iter().map(|(_, v)| *v).collect();
        let stages: SmallVec<[vk::PipelineStageFlags; 2]> = self
            .waits
            .iter()
            .map(|_| vk::PipelineStageFlags::ALL_COMMANDS)
            .collect();
        let signal = [self.track.semaphore];
        let signal_values = [value];
        let mut timeline = vk::TimelineSemaphoreSubmitInfo::default()
            .wait_semaphore_values(&wait_values)
            .signal_semaphore_values(&signal_values);
        let submit = vk::SubmitInfo::default()
            .wait_semaphores(&wait_semaphores)
            .wait_dst_stage_mask(&stages)
            .command_buffers(&self.pending)
            .signal_semaphores(&signal)
            .push_next(&mut timeline);
        // SAFETY: every command buffer is executable, the semaphores live timelines, and the
        // queue is used only under the server's lock.
        let result = unsafe {
            self.gpu
                .vk()
                .queue_submit(self.gpu.queue, &[submit], vk::Fence::null())
        };
        match result {
            Ok(()) => {
                self.submitted = value;
                self.track.covering.store(value, Ordering::Release);
                self.track.submitted.store(value, Ordering::Release);
                self.pending.clear();
                self.waits.clear();
                let mut held = std::mem::take(&mut self.held);
                held.extend(self.arena.take().into_iter().map(Held::Chunk));
                self.in_flight.push_back((value, held));
                self.track.in_flight.fetch_add(1, Ordering::Relaxed);
                self.reclaim();
                self.throttle()
            }
            Err(code) => {
                self.abandon_pending();
                let error = classify(code, Site::Submit, "vkQueueSubmit", 0);
                Err(error)
            }
        }
    }

    fn abandon_pending(&mut self) {
        self.pending.clear();
        self.waits.clear();
        for held in std::mem::take(&mut self.held) {
            if let Held::Commands(cmd) = held {
                // SAFETY: never submitted, so not pending; the pool allows a single reset.
                let _ = unsafe {
                    self.gpu
                        .vk()
                        .reset_command_buffer(cmd, vk::CommandBufferResetFlags::empty())
                };
                self.free_cmds.push(cmd);
            }
        }
        for chunk in self.arena.take() {
            self.arena.recycle(chunk);
        }
        self.track.covering.store(self.submitted, Ordering::Release);
    }

    /// Keep `error` for the stream's next sync or read.
    fn defer(&mut self, error: Error) -> Error {
        if self.deferred.is_none() {
            self.deferred = Some(error.clone());
        }
        error
    }

    /// Recycle what completed submissions held, without waiting.
    pub(crate) fn reclaim(&mut self) {
        while let Some((value, _)) = self.in_flight.front() {
            if !self.track.reached(*value) {
                break;
            }
            let Some((_, held)) = self.in_flight.pop_front() else {
                break;
            };
            self.track.in_flight.fetch_sub(1, Ordering::Relaxed);
            for item in held {
                match item {
                    Held::Commands(cmd) => self.free_cmds.push(cmd),
                    Held::Chunk(chunk) => self.arena.recycle(chunk),
                    Held::Graph(graph) => drop(graph),
                }
            }
        }
    }

    /// Past [`MAX_BATCHES_IN_FLIGHT`] running, wait for the oldest (rule 23 on failure).
    fn throttle(&mut self) -> Result<()> {
        while self.in_flight.len() > MAX_BATCHES_IN_FLIGHT {
            let Some(&(oldest, _)) = self.in_flight.front() else {
                break;
            };
            self.wait_for(oldest)?;
            self.reclaim();
        }
        Ok(())
    }

    pub(crate) fn wait_submitted(&mut self) -> Result<()> {
        self.wait_for(self.submitted)
    }

    /// Wait, bounded, until the semaphore reaches `value`.
    fn wait_for(&mut self, value: u64) -> Result<()> {
        if value == 0 || self.track.reached(value) {
            return Ok(());
        }
        self.wait_semaphore(value)
    }

    fn wait_semaphore(&self, value: u64) -> Result<()> {
        wait_tracks(&self.gpu, &[(self.track.clone(), value)])
    }

    /// Submit everything batched, and say what waiting for it takes (`None` if done).
    /// A deferred failure comes first. The waiter holds the semaphore by `Arc`, and a
    /// timeline only counts up, so work submitted meanwhile cannot be mistaken for it.
    pub(crate) fn begin_wait(&mut self) -> Result<Option<StreamWait>> {
        let flushed = self.flush();
        if let Some(deferred) = self.deferred.take() {
            return Err(deferred);
        }
        flushed?;
        let value = self.submitted;
        if value == 0 || self.track.reached(value) {
            return Ok(None);
        }
        Ok(Some(StreamWait {
            gpu: self.gpu.clone(),
            track: self.track.clone(),
            value,
        }))
    }

    /// Make `then`'s later work wait for `first`'s earlier work.
    ///
    /// A failure flushing `first` is returned, and kept for `first`'s next sync: its batch
    /// was lost.
    pub(crate) fn order(first: &mut OpenStream, then: &mut OpenStream) -> Result<()> {
        if let Err(e) = first.flush() {
            return Err(first.defer(e));
        }
        let value = first.submitted;
        if value == 0 || first.track.reached(value) {
            return Ok(());
        }
        match then
            .waits
            .iter_mut()
            .find(|(t, _)| Arc::ptr_eq(t, &first.track))
        {
            Some((_, v)) => *v = (*v).max(value),
            None => then.waits.push((first.track.clone(), value)),
        }
        Ok(())
    }

    pub(crate) fn take_deferred(&mut self) -> Option<Error> {
        self.deferred.take()
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.recording = None;
        if !self.gpu.is_hung() {
            let _ = self.flush();
            let _ = self.wait_submitted();
        }
        if self.gpu.is_hung() {
            // Submitted work may still run on what the pool and submissions hold: leak them.
            tracing::error!(
                stream = %self.id,
                submissions = self.in_flight.len(),
                "the stream's work did not finish; leaking its command pool and staging"
            );
            std::mem::forget(std::mem::take(&mut self.in_flight));
            std::mem::forget(std::mem::take(&mut self.held));
            std::mem::forget(std::mem::replace(
                &mut self.arena,
                Arena::new(self.gpu.clone()),
            ));
            return;
        }
        self.in_flight.clear();
        self.track.in_flight.store(0, Ordering::Relaxed);
        // SAFETY: the stream's work is complete, or the device is lost and nothing runs.
        unsafe { self.gpu.vk().destroy_command_pool(self.pool, None) };
    }
}
