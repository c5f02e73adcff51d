//! Logical streams: a command pool, a current command buffer and a timeline
//! semaphore each, over the device's one queue.
//!
//! **The mapping.** A scope stream is not a Vulkan queue — lavapipe has one,
//! most GPUs one or two compute queues — but a *timeline* on a shared
//! queue:
//!
//! - Work is recorded into the stream's current command buffer and
//!   submitted in a batch: when the stream syncs or is read, when
//!   [`BATCH_LIMIT`] commands are waiting, or when another stream must wait
//!   for it. A submission signals the stream's timeline semaphore with the
//!   next value, so "the stream's work up to here" is one number.
//! - Within a stream, each command buffer opens with a global memory barrier
//!   (ordering it after everything submitted earlier to the queue) and puts
//!   one between consecutive commands, so the stream's work is ordered as
//!   issued. Each batch ends with a barrier to the host, so a host wait on
//!   the semaphore makes the writes visible to a mapped read.
//! - Between streams, [`OpenStream::order`] (the core's `Backend::order`)
//!   submits the first stream's pending batch and adds a wait on its
//!   semaphore value to the second stream's next submission. Streams that
//!   share no buffer never wait on each other.
//! - Everything a submission needs kept alive — its command buffers, the
//!   arena chunks holding its scalars and staged bytes, the graphs it
//!   replays — travels with it in the stream's in-flight list and is
//!   recycled once the semaphore passes its value.
//! - A submission that fails means its batch never ran. It is a device
//!   fault ([`Error::Fault`], sticky only for device loss) returned by the
//!   call that flushed, and the core gives it to all the work in flight on
//!   the stream (rule 23). Once: a later sync does not report it again,
//!   since by then the stream's in-flight work is later work that ran. The
//!   exception is a flush for another stream's sake
//!   ([`OpenStream::order`]), whose failure is kept for the flushed
//!   stream's next sync or read, as the core attributes an error to the
//!   stream that returned it.
//! - **Bounded in a loop that only launches.** Each submission polls the
//!   oldest ones without waiting and recycles what completed (command
//!   buffers, staging chunks, replayed graphs). When more than
//!   [`MAX_BATCHES_IN_FLIGHT`] are still running the host waits for the
//!   oldest: the device, not the host's memory, sets the pace, so a loop of
//!   launches with no sync holds a fixed number of batches however long it
//!   runs.
//! - **A recovery gives the stream new state in place.** Its device state
//!   (everything above) is an `OpenStream`; a recovery drops it — after the
//!   bounded wait for its submissions — and makes a new one on the device
//!   opened again, while the `VulkanStream` the core holds, and its id,
//!   carry over. Between a recovery that failed and the next, a stream has
//!   no device state at all.
//! - **Teardown never destroys what may still run.** A wait that gives up
//!   (times out, or fails for a reason other than device loss) marks the
//!   device hung; a stream dropped then, or whose own final wait gives up,
//!   leaks its command pool, its semaphore and what its submissions hold,
//!   with an error in the log, rather than free memory the device may still
//!   use.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use ash::vk;
use scope_core::{Error, Result};
use smallvec::SmallVec;

use crate::capture::{GraphInner, Recording};
use crate::device::Gpu;
use crate::error::{Site, classify, fault};
use crate::memory::{Arena, Chunk};

/// Commands a batch holds before it is submitted without being asked.
/// Small enough that the device starts on a long run of launches while the
/// host is still recording the rest (on lavapipe, 256 overlaps issue and
/// execution best of 64–1024), large enough that a submission's fixed cost
/// is spread thin.
pub(crate) const BATCH_LIMIT: usize = 256;

/// How long a host wait may take before it is a fault, unless
/// `SCOPE_VULKAN_WAIT_TIMEOUT_MS` says otherwise (`Gpu::wait_timeout_ns`).
pub(crate) const WAIT_TIMEOUT_NS: u64 = 120_000_000_000;

/// Submissions of one stream that may run at once before the next waits
/// for the oldest. Eight batches of up to [`BATCH_LIMIT`] commands keep a
/// device busy while the host records (lavapipe gains nothing past three),
/// and bound what a stream holds: eight batches' command buffers and
/// staging chunks.
pub(crate) const MAX_BATCHES_IN_FLIGHT: usize = 8;

/// One stream's timeline, shared with the pool so freed memory can wait
/// for it.
pub(crate) struct Track {
    gpu: Arc<Gpu>,
    pub semaphore: vk::Semaphore,
    /// The value that will cover everything recorded on the stream so far.
    pub covering: AtomicU64,
    /// The value the stream's last accepted submission signals: a value
    /// past it belongs to work not submitted yet, or abandoned with a
    /// failed batch, which nothing may wait for.
    pub submitted: AtomicU64,
    /// The last value the semaphore was seen to reach.
    completed: AtomicU64,
    /// Submissions whose holdings were not recycled yet.
    pub in_flight: AtomicUsize,
}

impl Track {
    /// Whether the semaphore has reached `value`, asking the device only
    /// when the cached answer is not enough.
    pub(crate) fn reached(&self, value: u64) -> bool {
        self.reached_cached(value) || self.refresh() >= value
    }

    /// Whether the semaphore was last seen at or past `value`.
    pub(crate) fn reached_cached(&self, value: u64) -> bool {
        self.completed.load(Ordering::Acquire) >= value
    }

    /// Ask the device where the semaphore is now. A lost device answers 0,
    /// which keeps what waits on it waiting rather than reused early.
    pub(crate) fn refresh(&self) -> u64 {
        // SAFETY: the semaphore is a live timeline semaphore of this device.
        let now = unsafe { self.gpu.vk().get_semaphore_counter_value(self.semaphore) }.unwrap_or(0);
        self.completed.fetch_max(now, Ordering::AcqRel).max(now)
    }
}

impl Drop for Track {
    fn drop(&mut self) {
        if self.gpu.is_hung() {
            // A submission may still signal it.
            return;
        }
        // SAFETY: the stream that signalled it is gone and its work was
        // waited for (the device is not hung), so no pending submission
        // signals or waits on it.
        unsafe { self.gpu.vk().destroy_semaphore(self.semaphore, None) };
    }
}

/// What a submission keeps alive until it completes.
pub(crate) enum Held {
    /// A batch command buffer, to be reused.
    Commands(vk::CommandBuffer),
    /// Staging memory, to be recycled.
    Chunk(Chunk),
    /// A replayed graph, released after its last replay.
    Graph(Arc<GraphInner>),
}

/// Where commands go: a batch's command buffer or a graph's.
pub(crate) struct Encoder {
    pub cmd: vk::CommandBuffer,
    /// A command since the last barrier wrote memory (or the buffer is
    /// fresh and must be ordered after earlier submissions).
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

    /// Order the next command after the earlier ones, if they wrote.
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
        // SAFETY: `cmd` is in the recording state (encoders exist only
        // between begin and end).
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

    /// Bind `pipeline` for the next dispatch unless it is bound already.
    pub(crate) fn bind(&mut self, gpu: &Gpu, pipeline: vk::Pipeline) {
        if self.bound != pipeline {
            // SAFETY: `cmd` is recording; pipelines live as long as the
            // backend, which outlives every command buffer it records.
            unsafe {
                gpu.vk()
                    .cmd_bind_pipeline(self.cmd, vk::PipelineBindPoint::COMPUTE, pipeline)
            };
            self.bound = pipeline;
        }
    }

    /// Make everything recorded visible to the host, and end the buffer.
    /// The caller classifies a failure: for a batch it loses every command
    /// in it, for a graph it refuses the seal.
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

/// What one command is recorded with: the encoder (a batch's command
/// buffer or a graph's), the arena its staged bytes go to, and the device.
pub(crate) struct Recorder<'a> {
    pub encoder: &'a mut Encoder,
    pub arena: &'a mut Arena,
    pub gpu: &'a Gpu,
}

/// Wait on the host until every track reaches its value, for at most
/// the device's wait timeout ([`WAIT_TIMEOUT_NS`] unless configured); each
/// value must be one a submission signals. A
/// wait that gives up on running work marks the device hung.
pub(crate) fn wait_tracks(gpu: &Gpu, waits: &[(Arc<Track>, u64)]) -> Result<()> {
    let (semaphores, values): (SmallVec<[vk::Semaphore; 2]>, SmallVec<[u64; 2]>) = waits
        .iter()
        .filter(|(track, value)| !track.reached(*value))
        .map(|(track, value)| (track.semaphore, *value))
        .unzip();
    if semaphores.is_empty() {
        return Ok(());
    }
    let info = vk::SemaphoreWaitInfo::default()
        .semaphores(&semaphores)
        .values(&values);
    let timeout = gpu.wait_timeout_ns;
    // SAFETY: live timeline semaphores, each with a value a submission
    // signals (the callers pass submitted values only).
    let result = match unsafe { gpu.vk().wait_semaphores(&info, timeout) } {
        Ok(()) => Ok(()),
        Err(vk::Result::TIMEOUT) => Err(fault(
            vk::Result::TIMEOUT,
            format!(
                "the work waited for did not finish within {} ms",
                timeout / 1_000_000
            ),
        )),
        Err(code) => Err(classify(code, Site::Wait, "vkWaitSemaphores", 0)),
    };
    if let Err(Error::Fault(fault)) = &result
        && !fault.class.poisons()
    {
        gpu.mark_hung();
    }
    result
}

/// A wait for a stream's submitted work, run without the server's lock:
/// what `Backend::Waiter` is for this server.
pub struct StreamWait {
    gpu: Arc<Gpu>,
    track: Arc<Track>,
    value: u64,
}

impl StreamWait {
    /// Wait until the stream's semaphore reaches the value, for at most
    /// the device's wait timeout. `vkWaitSemaphores` synchronises nothing
    /// externally, so it may run while other threads submit.
    pub(crate) fn wait(&self) -> Result<()> {
        wait_tracks(&self.gpu, &[(self.track.clone(), self.value)])
    }
}

/// A logical stream: what the core holds as `Backend::Stream`. Its device
/// state is given up when a recovery destroys the device, and made anew
/// on the device opened again; the stream itself, and the core's id for
/// it, carry over.
pub struct VulkanStream {
    /// The core's id for it (streams are numbered in creation order).
    id: scope_core::StreamId,
    /// Its state on the open device; `None` while the device is closed (a
    /// recovery destroyed it and could not open another).
    state: Option<OpenStream>,
}

impl VulkanStream {
    /// Stream `id`, on `gpu`.
    pub(crate) fn new(gpu: &Arc<Gpu>, id: scope_core::StreamId) -> Result<Self> {
        Ok(Self {
            id,
            state: Some(OpenStream::new(gpu, id)?),
        })
    }

    /// Its state on the open device, or why there is none.
    pub(crate) fn state(&mut self) -> Result<&mut OpenStream> {
        self.state.as_mut().ok_or_else(crate::closed)
    }

    /// Its timeline on the open device.
    pub(crate) fn track(&self) -> Result<&Arc<Track>> {
        self.state
            .as_ref()
            .map(|state| &state.track)
            .ok_or_else(crate::closed)
    }

    /// Give up its device state: its command pool and batches, what its
    /// submissions held, its arena and its waits on other streams (see
    /// `OpenStream`'s `Drop`). Its timeline semaphore goes once nothing
    /// else names it.
    pub(crate) fn close(&mut self) {
        self.state = None;
    }

    /// New state on `gpu`, not recording, in place of whatever it had; its
    /// timeline, for the backend to count.
    pub(crate) fn open_on(&mut self, gpu: &Arc<Gpu>) -> Result<Arc<Track>> {
        self.close();
        let state = self.state.insert(OpenStream::new(gpu, self.id)?);
        Ok(state.track.clone())
    }
}

/// A stream's state on an open device.
pub(crate) struct OpenStream {
    /// The core's id for it.
    pub(crate) id: scope_core::StreamId,
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) track: Arc<Track>,
    pool: vk::CommandPool,
    free_cmds: Vec<vk::CommandBuffer>,
    current: Option<Encoder>,
    /// Ended command buffers in submission order, not yet submitted.
    pending: Vec<vk::CommandBuffer>,
    held: Vec<Held>,
    waits: SmallVec<[(Arc<Track>, u64); 2]>,
    submitted: u64,
    in_flight: VecDeque<(u64, Vec<Held>)>,
    pub(crate) arena: Arena,
    /// A submission failure not yet reported by a sync or read.
    deferred: Option<Error>,
    pub(crate) recording: Option<Recording>,
}

impl OpenStream {
    fn new(gpu: &Arc<Gpu>, id: scope_core::StreamId) -> Result<Self> {
        let device = gpu.vk();
        let mut kind = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let info = vk::SemaphoreCreateInfo::default().push_next(&mut kind);
        // SAFETY: valid create info on a live device.
        let semaphore = unsafe { device.create_semaphore(&info, None) }
            .map_err(|e| classify(e, Site::Create, "timeline semaphore", 0))?;
        let track = Arc::new(Track {
            gpu: gpu.clone(),
            semaphore,
            covering: AtomicU64::new(0),
            submitted: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        });
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
        // SAFETY: the pool is this stream's and used only under the
        // server's lock.
        let cmds = unsafe { self.gpu.vk().allocate_command_buffers(&info) }
            .map_err(|e| classify(e, Site::Record, "vkAllocateCommandBuffers", 0))?;
        cmds.first()
            .copied()
            .ok_or_else(|| Error::internal("the stream has no command buffer to record into"))
    }

    /// Where the next command goes (the graph while capturing), with the
    /// arena its bytes go to.
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
            // SAFETY: `cmd` is initial or executable-and-complete (a reused
            // one came back only after its submission completed), and the
            // pool allows implicit reset.
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

    /// Record one command with `body`, and keep the stream's invariants
    /// around it: a barrier first (if an earlier command wrote), so it sees
    /// every earlier write of the stream; afterwards, the mark that it may
    /// have written (so the next command waits for it), its count, and the
    /// submission of a full batch.
    ///
    /// Every launch, copy and write goes through here: forgetting any of
    /// those steps on one path would be a data race or an unbounded batch.
    /// The mark is set even when `body` fails, since it may have recorded
    /// part of its work; an extra barrier costs little, a missing one is a
    /// race.
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

    /// After a command was recorded: submit when the batch is full.
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

    /// End the current batch's command buffer and queue it for submission.
    /// A failure loses every command in the batch, so it is a fault of the
    /// work in flight, like a failed submission.
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

    /// Queue a replay of `graph` after the work recorded so far, in the
    /// stream's next submission, and tell the graph which timeline value
    /// finishes it.
    ///
    /// A replay is batched like any other work: destroying a graph waits
    /// for its replays (rule 35), and the core flushes every stream before
    /// it asks (`Backend::destroy_graph`), so a replay still in a batch is
    /// submitted by then. One that is never submitted (its batch failed)
    /// is not waited for: its value is past the track's `submitted`.
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

    /// Submit everything pending (and any waits) as one submission.
    pub(crate) fn flush(&mut self) -> Result<()> {
        if let Err(e) = self.close_current() {
            self.abandon_pending();
            return Err(e);
        }
        self.submit()
    }

    /// Submit the ended command buffers (and any waits), then recycle and
    /// throttle.
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
        // SAFETY: every command buffer is executable (batches are
        // one-time and fresh; graphs are simultaneous-use), the semaphores
        // are live timeline semaphores, and the queue is used only under the
        // server's lock.
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

    /// Drop a batch that will never be submitted.
    fn abandon_pending(&mut self) {
        self.pending.clear();
        self.waits.clear();
        for held in std::mem::take(&mut self.held) {
            if let Held::Commands(cmd) = held {
                // SAFETY: never submitted, so not pending; the pool allows
                // resetting one buffer.
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

    /// Recycle what completed submissions held. Asks the device at most
    /// once (a semaphore counter read, no wait).
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

    /// With more than [`MAX_BATCHES_IN_FLIGHT`] submissions running, wait
    /// for the oldest and recycle it. A wait that fails is a fault of the
    /// work in flight (the core attributes it, rule 23).
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

    /// Wait on the host for everything submitted, without recycling.
    pub(crate) fn wait_submitted(&mut self) -> Result<()> {
        self.wait_for(self.submitted)
    }

    /// Wait on the host until the stream's semaphore reaches `value`, for
    /// at most the device's wait timeout. Giving up (other than on device loss,
    /// after which nothing runs) marks the device hung.
    fn wait_for(&mut self, value: u64) -> Result<()> {
        if value == 0 || self.track.reached(value) {
            return Ok(());
        }
        self.wait_semaphore(value)
    }

    fn wait_semaphore(&self, value: u64) -> Result<()> {
        wait_tracks(&self.gpu, &[(self.track.clone(), value)])
    }

    /// Submit everything batched and say what waiting for all of it takes:
    /// the stream's timeline semaphore and the value its last submission
    /// signals (`None` if that is reached already). A deferred submission
    /// failure is reported first: that batch is lost, and the core
    /// attributes it to everything in flight.
    ///
    /// The waiter holds the semaphore by `Arc`, so nothing recycled while
    /// it waits without the lock can be something it names; a timeline only
    /// counts up, so work submitted meanwhile cannot be mistaken for it.
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
    /// A failure submitting `first`'s batch is returned (the work on `then`
    /// that needed it cannot run) and also kept for `first`'s next sync or
    /// read: the core attributes an error to the stream whose call
    /// returned it, and the batch lost was `first`'s.
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

    /// Whether a submission failure is waiting to be reported.
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
            // The wait gave up (here or earlier): submitted work may still
            // be running, and it uses the command buffers in the pool and
            // what the submissions hold. Leaking them is safe; destroying
            // them is not.
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
        // SAFETY: the stream's work is complete (or the device is lost and
        // nothing runs); destroying the pool frees its command buffers.
        unsafe { self.gpu.vk().destroy_command_pool(self.pool, None) };
    }
}
