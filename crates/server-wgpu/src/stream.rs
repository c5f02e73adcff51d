//! Logical streams: ordering domains on wgpu's one queue, each batching its
//! work into one open encoder and compute pass.
//!
//! # What a stream is here
//!
//! wgpu exposes one queue per device, and the queue runs submissions in
//! order. So a logical stream is not a hardware queue; it is an *ordering
//! domain*: its own open command encoder, into which its launches, copies and
//! replays are encoded in issue order, submitted as one command buffer. What
//! that means for concurrency:
//!
//! - Work on two streams never runs concurrently on the device: submissions
//!   are serialized on the queue, and a submission starts after the previous
//!   one's work (wgpu inserts the barriers). Streams buy independence of
//!   *batching and waiting* — a sync on stream 1 submits and waits for stream
//!   1's batch without forcing stream 2's open batch out — not parallelism.
//! - Ordering between streams ([`Backend::order`](scope_core::Backend::order))
//!   is therefore just "submit the first stream's open batch now": anything
//!   the second stream submits later runs after it.
//! - Waiting for a stream waits for its last submission, and so also for
//!   every earlier submission of any stream.
//!
//! # Why batches
//!
//! On lavapipe raw wgpu takes about 1.5 µs per dispatch when the dispatches
//! share one compute pass and about 13.7 µs with a pass (and submit) per
//! dispatch. So consecutive launches of a stream share one open compute pass,
//! the pass closes only for a copy, and the batch is submitted when the
//! stream syncs, reads, writes (a queue write lands at the start of the next
//! submission, so the stream's earlier work must be submitted first), is
//! ordered before another stream, begins a capture, or reaches
//! [`BATCH_LIMIT`] dispatches (which bounds how far the host runs ahead).
//!
//! # Scalars
//!
//! A launch's scalar blob is bound as a storage buffer (the binding
//! convention). Rather than a buffer per launch, the batch appends each blob
//! to a host-side arena image (an identical blob to the previous launch's is
//! shared) and binds it with a dynamic offset; at submission the whole image
//! is written with one `write_buffer`, which wgpu places before the batch's
//! commands. An arena is reused once the submission that used it has
//! completed.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use scope_core::{Error, StreamId};

use crate::copy::ReadBack;
use crate::error::{Sink, late_fault, lost_first, message, no_panic, scoped};

/// Dispatches a batch holds before it is submitted: how far the host runs
/// ahead of the device, a few milliseconds of small launches. Each batch
/// pays a submission and grows wgpu's command vectors anew; at 1024 the
/// launch bench's same-scalar launches on llvmpipe-GL took some 3% longer
/// than at 4096, and lavapipe none shorter. A device with 256-byte
/// offsets still ends a batch of distinct scalar blobs at 1024, when the
/// arena (256 KiB) fills.
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
    // Declared before `encoder`: a pass must be dropped (ended) before its
    // encoder is finished or dropped.
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
    /// The capture window's recording, while one is open.
    pub(crate) recording: Option<crate::capture::Recording>,
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
            recording: None,
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
            return Err(crate::error::out_of_memory(&error, ARENA_BYTES)
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

    /// Drop arenas nothing uses.
    pub(crate) fn trim(&mut self) {
        self.idle.clear();
    }
}

/// The device handles a batch needs to submit.
/// A wait for a stream's last submission, run without the server's lock:
/// what `Backend::Waiter` is for this server.
pub struct StreamWait {
    device: wgpu::Device,
    sink: Arc<Sink>,
    /// `None` when the stream never had a submission accepted (a refused
    /// one is reported by `surfaced` when the wait ends).
    index: Option<wgpu::SubmissionIndex>,
    /// The read it carries, if it is a read's.
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

    /// The read it carries, if any.
    pub(crate) fn into_read(self) -> Option<ReadBack> {
        self.read
    }
}

/// Wait for submission `index` (or everything) and let a device loss speak
/// first. wgpu's device is shared between threads; polling it while another
/// thread submits is allowed.
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
        // A submission a lost device dropped is never reached; wgpu
        // reports the loss at a later maintenance, so let the loss, if
        // that is what it was, speak first.
        lost_first(device, sink)?;
        return Err(late_fault("wgpu poll", error.to_string()));
    }
    sink.check_lost()
}

pub(crate) struct Submitter<'a> {
    pub(crate) gpu: &'a crate::device::Gpu,
    pub(crate) submissions: &'a mut Submissions,
    pub(crate) next_batch: &'a mut u64,
}

impl Submitter<'_> {
    /// Submit the stream's open batch (and any queue writes it issued).
    ///
    /// An error wgpu raises here belongs to the batch as a whole; it is kept
    /// as the stream's deferred late fault, which the next sync or read
    /// returns and the core attributes to the work in flight.
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
            // A refused submission returns an index nothing will ever reach;
            // waiting on it would be an error of its own.
            batch.last_submission = Some(index);
        }
        *self.next_batch += 1;
        batch.number = *self.next_batch;
        batch.dispatches = 0;
        batch.scalars.clear();
        batch.last_scalars = 0..0;
        batch.writes_pending = false;
        if let Some(error) = error {
            // A batch naming objects of a device that went (destroyed, its
            // objects invalid) is refused too: the loss is the fault.
            lost_first(device, sink)?;
            tracing::error!(stream = %batch.stream, "wgpu refused a submitted batch: {}", message(&error));
            batch.deferred.get_or_insert_with(|| {
                late_fault("wgpu validation at submission", message(&error))
            });
        }
        Ok(())
    }

    /// Submit the stream's batch and say what waiting for it takes: its
    /// last submission (`None` when it never submitted, once what surfaced
    /// is reported). The waiter holds its own handles to the device, so it
    /// waits without the server's lock while other threads submit.
    pub(crate) fn begin_wait(&mut self, batch: &mut Batch) -> Result<Option<StreamWait>, Error> {
        self.flush(batch)?;
        if batch.last_submission.is_none() {
            return self.surfaced(batch).map(|()| None);
        }
        Ok(Some(self.waiter(batch, None)))
    }

    /// A waiter for the stream's last submission, holding `read` if it is
    /// for a read.
    pub(crate) fn waiter(&self, batch: &Batch, read: Option<ReadBack>) -> StreamWait {
        StreamWait {
            device: self.gpu.device.clone(),
            sink: self.gpu.sink.clone(),
            index: batch.last_submission.clone(),
            read,
        }
    }

    /// Wait for submission `index` (or everything).
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
