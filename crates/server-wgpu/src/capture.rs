//! Capture: a window records its dispatches, copies and host writes as
//! values. Sealing validates them by encoding them once; a replay re-encodes
//! them into the stream's batch.
//!
//! wgpu has no replayable compute command buffer: a `CommandBuffer` is
//! consumed by its one submission. So a graph is the recorded sequence, with
//! everything that can be made in advance:
//!
//! - **Recording** keeps each step's pipeline, bound ranges and dispatch
//!   size. Scalar blobs and host writes are copied at call time, as on every
//!   server, and each replay writes those same bytes in order. Nothing runs
//!   until a replay.
//! - **Sealing** ([`end_capture`](scope_core::Backend::end_capture)) packs
//!   every recorded byte into one constants buffer and makes every bind
//!   group. It then encodes the sequence once and finishes it, inside error
//!   scopes. wgpu refuses here whatever it would refuse, so the core can
//!   answer "cannot seal". A replay encodes the same objects the same way.
//! - **Replaying** encodes the steps into the stream's open batch. A host
//!   write becomes a copy from the constants buffer, so a replay adds no
//!   submission of its own.
//!
//! A graph holds its wgpu buffers alive. The core refuses to replay a graph
//! whose buffers were freed, so an old graph never writes a reused buffer.
//!
//! The `Backend` impl hands a window's work to its [`Recording`], so the
//! copies and launches below never look for one.
//!
//! **Destroying a graph waits for its replays** (rule 35). It submits the
//! batches of the streams it was replayed on and waits for them. A failure
//! there is the destroy's error, which the core gives the graph's write set.

use std::sync::Arc;

use parking_lot::Mutex;
use scope_core::backend::{BoundDispatch, Launch};
use scope_core::{Error, StreamId};
use smallvec::SmallVec;

use crate::compile::Pipeline;
use crate::copy::bounce;
use crate::device::Gpu;
use crate::error::{late_fault, lost_first, message, no_panic, out_of_memory, scoped};
use crate::launch::{Entry, make_group, round_up};
use crate::memory::{Memory, Tag, mark, tag_value};
use crate::stream::{BATCH_LIMIT, Batch, Dispatch, Submitter};

/// A buffer a recording names.
#[derive(Clone)]
struct Held {
    buffer: wgpu::Buffer,
    id: u64,
    tag: Tag,
}

impl Held {
    fn of(memory: &Memory) -> Self {
        Self {
            buffer: memory.buffer.clone(),
            id: memory.id,
            tag: memory.tag.clone(),
        }
    }
}

enum Groups {
    Host([u32; 3]),
    Indirect(Held, u64),
}

enum Op {
    Launch {
        kernel: Arc<Pipeline>,
        bindings: Vec<(Held, u64, u64)>,
        /// The blob's place in the recording's bytes, and the padded size bound.
        scalars: Option<(usize, usize, u64)>,
        groups: Groups,
    },
    Copy {
        src: Held,
        src_offset: u64,
        dst: Held,
        dst_offset: u64,
        len: u64,
    },
    Write {
        dst: Held,
        offset: u64,
        /// Where its bytes start in the recording's bytes, and how many.
        start: usize,
        len: usize,
    },
}

/// What a capture window has recorded so far.
#[derive(Default)]
pub(crate) struct Recording {
    ops: Vec<Op>,
    bytes: Vec<u8>,
}

enum Step {
    Dispatch {
        kernel: Arc<Pipeline>,
        group: Option<(u64, wgpu::BindGroup, Option<u32>)>,
        groups: Groups,
    },
    Copy {
        src: wgpu::Buffer,
        src_offset: u64,
        dst: wgpu::Buffer,
        dst_offset: u64,
        len: u64,
    },
}

/// A sealed recording.
pub struct Graph {
    steps: Vec<Step>,
    /// Every buffer the steps use, to tag with the replaying batch.
    tags: Vec<Tag>,
    dispatches: u32,
    // The constants buffer, kept alive with the bind groups that name it.
    _constants: Option<wgpu::Buffer>,
    /// The streams it was replayed on since it was sealed.
    replayed_on: Mutex<SmallVec<[usize; 2]>>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "wgpu graph ({} steps, {} dispatches)",
            self.steps.len(),
            self.dispatches
        )
    }
}

/// Encode `steps` into `batch`.
fn encode(device: &wgpu::Device, batch: &mut Batch, steps: &[Step]) {
    for step in steps {
        match step {
            Step::Dispatch {
                kernel,
                group,
                groups,
            } => {
                let dispatch = match groups {
                    Groups::Host(g) => Dispatch::Groups(*g),
                    Groups::Indirect(held, offset) => Dispatch::Indirect(&held.buffer, *offset),
                };
                batch.dispatch(
                    device,
                    (kernel.id, &kernel.pipeline),
                    group.as_ref().map(|(id, g, d)| (*id, g, *d)),
                    dispatch,
                );
            }
            Step::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                len,
            } => batch.encoder(device).copy_buffer_to_buffer(
                src,
                *src_offset,
                dst,
                *dst_offset,
                *len,
            ),
        }
    }
}

impl Recording {
    /// Keep `launch` of `kernel`, its scalar blob at a multiple of `align`.
    pub(crate) fn launch(
        &mut self,
        align: u64,
        kernel: &Arc<Pipeline>,
        launch: &Launch<'_, Memory>,
    ) {
        let align = align as usize;
        let recording = self;
        let scalars = (!launch.scalars.is_empty()).then(|| {
            let start = recording.bytes.len().next_multiple_of(align);
            recording.bytes.resize(start, 0);
            recording.bytes.extend_from_slice(launch.scalars);
            let padded = round_up(launch.scalars.len() as u64, 4);
            recording.bytes.resize(start + padded as usize, 0);
            (start, launch.scalars.len(), padded)
        });
        let groups = match &launch.dispatch {
            BoundDispatch::Groups(g) => Groups::Host(*g),
            BoundDispatch::Indirect { memory, offset } => {
                Groups::Indirect(Held::of(memory), *offset)
            }
        };
        recording.ops.push(Op::Launch {
            kernel: kernel.clone(),
            bindings: launch
                .bindings
                .iter()
                .map(|b| (Held::of(b.memory), b.offset, b.len))
                .collect(),
            scalars,
            groups,
        });
    }

    /// Keep a host write of `data`, its bytes at a multiple of `align`.
    pub(crate) fn write(&mut self, align: u64, dst: &Memory, offset: u64, data: &[u8]) {
        let align = align as usize;
        let recording = self;
        let start = recording.bytes.len().next_multiple_of(align);
        recording.bytes.resize(start, 0);
        recording.bytes.extend_from_slice(data);
        recording.ops.push(Op::Write {
            dst: Held::of(dst),
            offset,
            start,
            len: data.len(),
        });
    }

    /// Keep a copy of `len` bytes.
    pub(crate) fn copy(
        &mut self,
        src: &Memory,
        src_offset: u64,
        dst: &Memory,
        dst_offset: u64,
        len: u64,
    ) {
        self.ops.push(Op::Copy {
            src: Held::of(src),
            src_offset,
            dst: Held::of(dst),
            dst_offset,
            len,
        });
    }

    /// Seal the recording, made on `stream`, into a graph, or say why not.
    /// Each bind group made takes an id of `next_id`.
    pub(crate) fn seal(
        self,
        gpu: &Gpu,
        stream: StreamId,
        next_id: &mut u64,
    ) -> Result<Graph, Error> {
        gpu.sink.check_lost()?;
        let recording = self;
        let device = &gpu.device;
        let refused =
            |what: &str, detail: String| late_fault("wgpu validation", format!("{what}: {detail}"));
        let constants = if recording.bytes.is_empty() {
            None
        } else {
            let size = round_up(recording.bytes.len() as u64, 4).max(4);
            let (buffer, error) = scoped(device, || {
                let buffer = device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("scope graph constants"),
                    size,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::UNIFORM
                        | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: true,
                });
                if let Ok(mut view) = buffer.get_mapped_range_mut(..) {
                    view.slice(..recording.bytes.len())
                        .copy_from_slice(&recording.bytes);
                }
                buffer.unmap();
                buffer
            });
            if let Some(error) = error {
                lost_first(device, &gpu.sink)?;
                return Err(out_of_memory(&error, size)
                    .unwrap_or_else(|| refused("the constants buffer", message(&error))));
            }
            Some(buffer)
        };
        let mut steps = Vec::with_capacity(recording.ops.len());
        let mut tags: Vec<Tag> = Vec::new();
        let mut seen: Vec<u64> = Vec::new();
        let mut hold = |held: &Held| {
            if !seen.contains(&held.id) {
                seen.push(held.id);
                tags.push(held.tag.clone());
            }
        };
        let mut dispatches = 0u32;
        for op in &recording.ops {
            match op {
                Op::Launch {
                    kernel,
                    bindings,
                    scalars,
                    groups,
                } => {
                    bindings.iter().for_each(|(h, _, _)| hold(h));
                    if let Groups::Indirect(h, _) = groups {
                        hold(h);
                    }
                    let group = match &kernel.layout {
                        None => None,
                        Some(_) => {
                            let mut entries: SmallVec<[Entry<'_>; 6]> = bindings
                                .iter()
                                .map(|(h, offset, size)| Entry {
                                    buffer: &h.buffer,
                                    id: h.id,
                                    offset: *offset,
                                    size: *size,
                                })
                                .collect();
                            let mut dynamic = kernel.dynamic.then_some(0u32);
                            if let (Some((start, _, padded)), Some(constants)) =
                                (scalars, &constants)
                            {
                                let (offset, dyn_offset) = if kernel.dynamic {
                                    (0, Some(*start as u32))
                                } else {
                                    (*start as u64, None)
                                };
                                dynamic = dyn_offset;
                                entries.push(Entry {
                                    buffer: constants,
                                    id: 0,
                                    offset,
                                    size: *padded,
                                });
                            }
                            let group = match make_group(device, kernel, &entries) {
                                Ok(group) => group,
                                Err(detail) => {
                                    lost_first(device, &gpu.sink)?;
                                    let what = format!("binding `{}`", kernel.name);
                                    return Err(refused(&what, detail));
                                }
                            };
                            // Uncached, so each gets its own id for the pass.
                            *next_id += 1;
                            Some((*next_id, group, dynamic))
                        }
                    };
                    let groups = match groups {
                        Groups::Host(g) => Groups::Host(*g),
                        Groups::Indirect(h, o) => Groups::Indirect(h.clone(), *o),
                    };
                    dispatches += 1;
                    steps.push(Step::Dispatch {
                        kernel: kernel.clone(),
                        group,
                        groups,
                    });
                }
                Op::Copy {
                    src,
                    src_offset,
                    dst,
                    dst_offset,
                    len,
                } => {
                    hold(src);
                    hold(dst);
                    if src.id == dst.id {
                        // Within one buffer: through a graph-owned bounce (`copy::bounce`).
                        let bounce = bounce(device, *len);
                        steps.push(Step::Copy {
                            src: src.buffer.clone(),
                            src_offset: *src_offset,
                            dst: bounce.clone(),
                            dst_offset: 0,
                            len: *len,
                        });
                        steps.push(Step::Copy {
                            src: bounce,
                            src_offset: 0,
                            dst: dst.buffer.clone(),
                            dst_offset: *dst_offset,
                            len: *len,
                        });
                        continue;
                    }
                    steps.push(Step::Copy {
                        src: src.buffer.clone(),
                        src_offset: *src_offset,
                        dst: dst.buffer.clone(),
                        dst_offset: *dst_offset,
                        len: *len,
                    });
                }
                Op::Write {
                    dst,
                    offset,
                    start,
                    len,
                } => {
                    hold(dst);
                    let Some(constants) = &constants else {
                        return Err(refused(
                            "a recorded write",
                            "its bytes were lost".to_owned(),
                        ));
                    };
                    steps.push(Step::Copy {
                        src: constants.clone(),
                        src_offset: *start as u64,
                        dst: dst.buffer.clone(),
                        dst_offset: *offset,
                        len: *len as u64,
                    });
                }
            }
        }
        // Encode once, never submitted: `finish` is where wgpu validates.
        let mut trial = Batch::new(stream, 0);
        let (finished, error) = no_panic(&gpu.sink, "sealing a recording", || {
            scoped(device, || {
                encode(device, &mut trial, &steps);
                trial.finish()
            })
        })?;
        drop(finished);
        if let Some(error) = error {
            lost_first(device, &gpu.sink)?;
            return Err(refused("the recorded work", message(&error)));
        }
        Ok(Graph {
            steps,
            tags,
            dispatches,
            _constants: constants,
            replayed_on: Mutex::default(),
        })
    }
}

/// Destroy `graph` once its replays are done (rule 35): submit each batch
/// it was replayed into, and wait for it.
pub(crate) fn destroy(
    submitter: &mut Submitter<'_>,
    batches: &mut [Batch],
    graph: Graph,
) -> Result<(), Error> {
    let streams = std::mem::take(&mut *graph.replayed_on.lock());
    let mut result = Ok(());
    for s in streams {
        if let Err(error) = submitter.flush(&mut batches[s]) {
            result = result.and(Err(error));
            continue;
        }
        if let Some(index) = batches[s].last_submission.clone() {
            result = result.and(submitter.wait(Some(index)));
        }
    }
    drop(graph);
    result
}

/// Encode `graph` into `batch`, stream `s`'s.
pub(crate) fn replay(
    submitter: &mut Submitter<'_>,
    batch: &mut Batch,
    s: usize,
    graph: &Graph,
) -> Result<(), Error> {
    let gpu = submitter.gpu;
    gpu.sink.check_lost()?;
    let device = &gpu.device;
    let ((), error) = scoped(device, || encode(device, batch, &graph.steps));
    {
        let mut on = graph.replayed_on.lock();
        if !on.contains(&s) {
            on.push(s);
        }
    }
    let tag = tag_value(s, batch.number);
    for t in &graph.tags {
        mark(t, tag);
    }
    if let Some(error) = error {
        lost_first(device, &gpu.sink)?;
        return Err(late_fault("wgpu validation", message(&error)));
    }
    if batch.dispatches >= BATCH_LIMIT {
        submitter.flush(batch)?;
    }
    Ok(())
}
