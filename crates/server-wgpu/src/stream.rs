//! Logical streams: ordering domains on wgpu's one queue, each batching its
//! work into one open encoder and compute pass.
//!
//! # What a stream is here
//!
//! wgpu has one queue per device, run in order. So a logical stream is an
//! *ordering domain*: an open command encoder that takes its work in issue
//! order, submitted as one command buffer.
//!
//! - The queue serializes submissions, so two streams never run at once.
//!   Streams buy independent *batching and waiting*, not parallelism.
//! - Ordering streams ([`Backend::order`](scope_core::Backend::order)) just
//!   submits the first stream's open batch now.
//! - Waiting for a stream's last submission waits for every earlier one too.
//!
//! # Why batches
//!
//! On lavapipe, a raw dispatch costs about 1.5 µs in a shared compute pass,
//! and 13.7 µs with a pass and submit of its own. So a stream's launches
//! share one open pass, which closes only for a copy. The batch is submitted
//! when the stream syncs, reads, writes, is ordered, begins a capture, or
//! reaches [`BATCH_LIMIT`] dispatches.
//!
//! # Scalars
//!
//! A launch's scalar blob goes into a host-side arena image, bound with a
//! dynamic offset; a blob equal to the last is shared. At submission one
//! `write_buffer` writes the image before the batch's commands. An arena is
//! reused once its submission completes.
//!
//! A [`Submitter`] carries what every stream's work shares on its way to the
//! queue. Copies, launches and replays take one with the batch, above this file.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use scope_core::{Error, StreamId};

use crate::device::Gpu;
use crate::error::{Sink, late_fault, lost_first, message, no_panic, out_of_memory, scoped};
use crate::staging::ReadBack;

/// Dispatches a batch holds before it is submitted: how far the host runs
/// ahead. 1024 ran 3% slower than 4096 on llvmpipe-GL. A full 256 KiB arena
/// ends a batch of distinct blobs sooner.
pub const BATCH_LIMIT: u32 = 4096;

/// Bytes of one scalar arena.
pub(crate) const ARENA_BYTES: u64 = 256 << 10;

/// Arenas in flight before taking another waits for the oldest.
const ARENAS_IN_FLIGHT: usize = 8;

/// How many workgroups one encoded dispatch runs.
#[derive(Clone, Copy)]
pub(crate) enum Dispatch<'a> {
    /// Counted on the host.
    Groups([u32; 3]),
    /// Three `u32`s in this buffer at this offset.
    Indirect(&'a wgpu::Buffer, u64),
}

/// A scalar arena: a buffer the blobs of one batch are written into.
pub(crate) struct Arena {
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) id: u64,
}

/// The open batch of one logical stream.
pub(crate) struct Batch {
    pub(crate) stream: StreamId,
    // Before `encoder`: a pass must end (drop) before its encoder finishes.
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    /// This batch's number; tags of the buffers it uses carry it.
    pub(crate) number: u64,
    pub(crate) dispatches: u32,
    /// The scalar image and the arena it will be written to.
    pub(crate) scalars: Vec<u8>,
    pub(crate) arena: Option<Arena>,
    pub(crate) last_scalars: Range<usize>,
    /// What the open pass has bound, to skip redundant calls.
    pub(crate) bound_pipeline: u64,
    pub(crate) bound_group: (u64, u32),
    /// Queue writes issued since the stream's last submission.
    pub(crate) writes_pending: bool,
    pub(crate) last_submission: Option<wgpu::SubmissionIndex>,
    /// An error that surfaced at submission, for the next sync or read.
    pub(crate) deferred: Option<Error>,
}

impl Batch {
    pub(crate) fn new(stream: StreamId, number: u64) -> Self {
        Self {
            stream,
            pass: None,
            encoder: None,
            number,
            dispatches: 0,
            scalars: Vec::new(),
            arena: None,
            last_scalars: 0..0,
            bound_pipeline: 0,
            bound_group: (0, 0),
            writes_pending: false,
            last_submission: None,
            deferred: None,
        }
    }

    /// Whether work has been encoded and not submitted.
    #[inline]
    pub(crate) fn is_open(&self) -> bool {
        self.encoder.is_some()
    }

    /// The open compute pass, opening the encoder and pass as needed.
    #[inline]
    pub(crate) fn pass(&mut self, device: &wgpu::Device) -> &mut wgpu::ComputePass<'static> {
        match self.pass {
            Some(ref mut pass) => pass,
            None => {
                let encoder = self.encoder.get_or_insert_with(|| {
                    device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("scope batch"),
                    })
                });
                self.bound_pipeline = 0;
                self.bound_group = (0, u32::MAX);
                self.pass.insert(
                    encoder
                        .begin_compute_pass(&wgpu::ComputePassDescriptor {
                            label: Some("scope launches"),
                            timestamp_writes: None,
                        })
                        .forget_lifetime(),
                )
            }
        }
    }

    /// Encode one dispatch into the open pass (opening it as needed),
    /// skipping the pipeline and bind group when the pass has them bound.
    #[inline]
    pub(crate) fn dispatch(
        &mut self,
        device: &wgpu::Device,
        pipeline: (u64, &wgpu::ComputePipeline),
        group: Option<(u64, &wgpu::BindGroup, Option<u32>)>,
        dispatch: Dispatch<'_>,
    ) {
        self.pass(device);
        let Some(pass) = self.pass.as_mut() else {
            return;
        };
        if self.bound_pipeline != pipeline.0 {
            pass.set_pipeline(pipeline.1);
            self.bound_pipeline = pipeline.0;
        }
        if let Some((id, group, dynamic)) = group {
            let state = (id, dynamic.unwrap_or(0));
            if self.bound_group != state {
                match dynamic {
                    Some(offset) => pass.set_bind_group(0, group, &[offset]),
                    None => pass.set_bind_group(0, group, &[]),
                }
                self.bound_group = state;
            }
        }
        match dispatch {
            Dispatch::Groups([x, y, z]) => pass.dispatch_workgroups(x, y, z),
            Dispatch::Indirect(buffer, offset) => pass.dispatch_workgroups_indirect(buffer, offset),
        }
        self.dispatches += 1;
    }

    /// End the pass and finish the encoder, without submitting.
    pub(crate) fn finish(&mut self) -> Option<wgpu::CommandBuffer> {
        self.pass = None;
        self.encoder.take().map(wgpu::CommandEncoder::finish)
    }

    /// The open encoder with no pass open, for copies.
    pub(crate) fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("scope batch"),
            })
        })
    }
}

/// Completion of submissions, counted by wgpu's work-done callbacks.
#[derive(Default)]
pub(crate) struct Submissions {
    pub(crate) issued: u64,
    pub(crate) completed: Arc<AtomicU64>,
    /// Arenas whose submission may still be running: (submission, index, arena).
    in_flight: VecDeque<(u64, wgpu::SubmissionIndex, Arena)>,
    idle: Vec<Arena>,
}

impl Submissions {
    /// Count a submission just made, and hear when it completes.
    pub(crate) fn submitted(&mut self, queue: &wgpu::Queue) -> u64 {
        self.issued += 1;
        let number = self.issued;
        let completed = self.completed.clone();
        queue.on_submitted_work_done(move || {
            completed.fetch_max(number, Ordering::AcqRel);
        });
        number
    }

    /// An arena no submission is using.
    pub(crate) fn arena(
        &mut self,
        device: &wgpu::Device,
        sink: &Sink,
        next_id: &mut u64,
    ) -> Result<Arena, Error> {
        if let Some(arena) = self.idle.pop() {
            return Ok(arena);
        }
        let done = self.completed.load(Ordering::Acquire);
        if self.in_flight.front().is_some_and(|(n, _, _)| *n <= done)
            && let Some((_, _, arena)) = self.in_flight.pop_front()
        {
            return Ok(arena);
        }
        if self.in_flight.len() >= ARENAS_IN_FLIGHT
            && let Some((_, index, arena)) = self.in_flight.pop_front()
        {
            let _ = device.poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            });
            return Ok(arena);
        }
        let (buffer, error) = scoped(device, || {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("scope scalars"),
                size: ARENA_BYTES,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::UNIFORM
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        if let Some(error) = error {
            lost_first(device, sink)?;
            return Err(out_of_memory(&error, ARENA_BYTES)
                .unwrap_or_else(|| late_fault("wgpu validation", message(&error))));
        }
        *next_id += 1;
        Ok(Arena {
            buffer,
            id: *next_id,
        })
    }

    /// Hand back an arena written into submission `number`.
    pub(crate) fn retire(&mut self, number: u64, index: wgpu::SubmissionIndex, arena: Arena) {
        self.in_flight.push_back((number, index, arena));
    }

    pub(crate) fn trim(&mut self) {
        self.idle.clear();
    }
}

/// A wait for a stream's last submission, run without the server's lock:
/// what `Backend::Waiter` is for this server.
pub struct StreamWait {
    device: wgpu::Device,
    sink: Arc<Sink>,
    /// `None` when no submission was accepted; `surfaced` reports a refused one.
    index: Option<wgpu::SubmissionIndex>,
    read: Option<ReadBack>,
}

impl StreamWait {
    pub(crate) fn wait(&self) -> Result<(), Error> {
        if let Some(index) = &self.index {
            wait_for(&self.device, &self.sink, Some(index.clone()))?;
        }
        match &self.read {
            Some(read) => read.until_mapped(&self.device, &self.sink),
            None => Ok(()),
        }
    }

    pub(crate) fn into_read(self) -> Option<ReadBack> {
        self.read
    }
}

/// Wait for submission `index` (or everything), letting a loss speak first.
fn wait_for(
    device: &wgpu::Device,
    sink: &Sink,
    index: Option<wgpu::SubmissionIndex>,
) -> Result<(), Error> {
    let polled = no_panic(sink, "a device wait", || {
        device.poll(wgpu::PollType::Wait {
            submission_index: index,
            timeout: None,
        })
    })?;
    if let Err(error) = polled {
        // A lost device drops submissions and reports the loss later: let it speak.
        lost_first(device, sink)?;
        return Err(late_fault("wgpu poll", error.to_string()));
    }
    sink.check_lost()
}

/// What a stream's work goes through on its way to the queue: the device,
/// the submissions shared by every stream, and the server's counters. Copies,
/// launches and replays take one with the stream's batch.
pub(crate) struct Submitter<'a> {
    pub(crate) gpu: &'a Gpu,
    pub(crate) submissions: &'a mut Submissions,
    pub(crate) next_batch: &'a mut u64,
    /// Ids for buffers, arenas, pipelines and bind groups.
    pub(crate) next_id: &'a mut u64,
}

impl Submitter<'_> {
    /// A scalar arena no submission is using.
    pub(crate) fn arena(&mut self) -> Result<Arena, Error> {
        self.submissions
            .arena(&self.gpu.device, &self.gpu.sink, self.next_id)
    }

    /// Submit the stream's open batch and its queue writes. An error here is
    /// the whole batch's: a deferred late fault for the next sync or read.
    pub(crate) fn flush(&mut self, batch: &mut Batch) -> Result<(), Error> {
        let sink = &self.gpu.sink;
        sink.check_lost()?;
        if !batch.is_open() && !batch.writes_pending {
            return Ok(());
        }
        let pass = batch.pass.take();
        let encoder = batch.encoder.take();
        let arena = batch.arena.take();
        let device = &self.gpu.device;
        let queue = &self.gpu.queue;
        let scalars = &batch.scalars;
        let (index, error) = no_panic(sink, "a submission", || {
            scoped(device, || {
                drop(pass);
                if let Some(arena) = &arena
                    && !scalars.is_empty()
                {
                    queue.write_buffer(&arena.buffer, 0, scalars);
                }
                let commands = encoder.map(wgpu::CommandEncoder::finish);
                queue.submit(commands)
            })
        })?;
        let number = self.submissions.submitted(queue);
        if let Some(arena) = arena {
            self.submissions.retire(number, index.clone(), arena);
        }
        if error.is_none() {
            // A refused submission's index is never reached: waiting on it would fail.
            batch.last_submission = Some(index);
        }
        *self.next_batch += 1;
        batch.number = *self.next_batch;
        batch.dispatches = 0;
        batch.scalars.clear();
        batch.last_scalars = 0..0;
        batch.writes_pending = false;
        if let Some(error) = error {
            // A batch naming a lost device's objects is refused too: the loss is the fault.
            lost_first(device, sink)?;
            tracing::error!(stream = %batch.stream, "wgpu refused a submitted batch: {}", message(&error));
            batch.deferred.get_or_insert_with(|| {
                late_fault("wgpu validation at submission", message(&error))
            });
        }
        Ok(())
    }

    /// Submit the stream's batch; the wait for its last submission, if any. The
    /// waiter holds its own device handles, so it waits without the server's lock.
    pub(crate) fn begin_wait(&mut self, batch: &mut Batch) -> Result<Option<StreamWait>, Error> {
        self.flush(batch)?;
        if batch.last_submission.is_none() {
            return self.surfaced(batch).map(|()| None);
        }
        Ok(Some(self.waiter(batch, None)))
    }

    /// A waiter for the stream's last submission, holding `read` for a read.
    pub(crate) fn waiter(&self, batch: &Batch, read: Option<ReadBack>) -> StreamWait {
        StreamWait {
            device: self.gpu.device.clone(),
            sink: self.gpu.sink.clone(),
            index: batch.last_submission.clone(),
            read,
        }
    }

    pub(crate) fn wait(&self, index: Option<wgpu::SubmissionIndex>) -> Result<(), Error> {
        wait_for(&self.gpu.device, &self.gpu.sink, index)
    }

    /// The stream's deferred fault, or an error no scope caught.
    pub(crate) fn surfaced(&self, batch: &mut Batch) -> Result<(), Error> {
        let sink = &self.gpu.sink;
        sink.check_lost()?;
        let Some(error) = batch.deferred.take().or_else(|| sink.take_uncaptured()) else {
            return Ok(());
        };
        lost_first(&self.gpu.device, sink)?;
        Err(error)
    }
}
