//! The context made current, and the streams: ordering and waits.
//!
//! One non-blocking stream per logical stream. Cross-stream order is an event recorded on one
//! stream and waited on by the other ([`Cuda::order_streams`]). cudarc's event tracking is off:
//! no `CudaSlice` is made, and the core decides the order.
//!
//! A wait without the server's lock records its own event under the lock, synchronises it without,
//! and keeps it for reuse. Its staging is freed only if no other thread took staging meanwhile.
//!
//! A stream keeps its staging, and what its recording graph will hold (`staging.rs`, `pool.rs`,
//! `module.rs`): those stand below. What issues work on a stream stands above.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::{CudaEvent, CudaStream};
use scope_core::{Error, Result, StreamId};

use crate::Cuda;
use crate::error::{Doing, classify, driver as driver_error};
use crate::module::Module;
use crate::pool::CudaMemory;
use crate::staging::{Pinned, Staging, StagingMark};

/// A logical stream's device state, shared with the backend. Its handles are an `Option` so a
/// reopen destroys them before the reset: after it, a handle could name a new context's object.
pub(crate) struct StreamShared {
    pub(crate) index: u32,
    handles: Option<StreamHandles>,
}

pub(crate) struct StreamHandles {
    pub(crate) cu: Arc<CudaStream>,
    /// Re-recorded for every cross-stream wait on this stream.
    pub(crate) order_event: CudaEvent,
    /// Recorded before a capture begins: the stream's real work ends here.
    pub(crate) pre_capture: CudaEvent,
}

impl std::ops::Deref for StreamShared {
    type Target = StreamHandles;

    /// The driver objects. A reopen gives new ones before `Ok`, and the core names no stream of a
    /// detached server: the `expect` fails only on a core bug.
    fn deref(&self) -> &StreamHandles {
        self.handles
            .as_ref()
            .expect("a stream of a detached CUDA server is never named")
    }
}

/// What a window records besides the graph itself.
#[derive(Default)]
pub(crate) struct Recording {
    /// Pinned bytes of the window's host writes, which every replay reads.
    pub(crate) staging: Vec<Pinned>,
    /// What the window touches, marked used on the replaying stream.
    pub(crate) memories: Vec<CudaMemory>,
    /// The launched kernels' modules, once each, kept loaded for replays.
    pub(crate) modules: Vec<Arc<Module>>,
}

impl Recording {
    pub(crate) fn keep_module(&mut self, module: &Arc<Module>) {
        if !self.modules.iter().any(|m| Arc::ptr_eq(m, module)) {
            self.modules.push(module.clone());
        }
    }
}

/// A logical stream: the core's [`Backend::Stream`](scope_core::Backend::Stream).
pub struct CudaStreamState {
    pub(crate) shared: Arc<StreamShared>,
    pub(crate) staging: Staging,
    pub(crate) recording: Option<Recording>,
    /// Spare wait events; more are made while several threads wait at once.
    spare_wait_events: Vec<CudaEvent>,
}

const SPARE_WAIT_EVENTS: usize = 4;

/// A wait for a stream's work, run without the server's lock: the core's
/// [`Backend::Waiter`](scope_core::Backend::Waiter).
///
/// Its own event, recorded when the wait begins, covers exactly the work before.
pub struct CudaWaiter {
    event: CudaEvent,
    stream: StreamId,
    /// The stream's staging when the event was recorded.
    staging: StagingMark,
    /// Set by a wait that returned success: the covered work is finished.
    finished: AtomicBool,
}

impl CudaWaiter {
    fn failed(&self, e: cudarc::driver::DriverError) -> Error {
        driver_error(
            e,
            Doing::Wait {
                stream: Some(self.stream),
                what: "the stream",
            },
        )
    }
}

impl CudaStreamState {
    pub(crate) fn id(&self) -> StreamId {
        StreamId(self.shared.index)
    }

    /// The cudarc stream, for a raw-API baseline.
    pub fn raw(&self) -> &Arc<CudaStream> {
        &self.shared.cu
    }

    /// Destroy the driver objects, staging and spare events on their own context, until
    /// [`attach`](Self::attach). Refused while a waiter shares the state.
    pub(crate) fn detach(&mut self) -> Result<()> {
        self.recording = None;
        self.staging = Staging::default();
        self.spare_wait_events.clear();
        let index = self.shared.index;
        let shared = Arc::get_mut(&mut self.shared).ok_or_else(|| still_waited_on(index))?;
        shared.handles = None;
        Ok(())
    }

    /// Give a detached stream new driver objects; the state for the backend's list.
    pub(crate) fn attach(&mut self, handles: StreamHandles) -> Result<Arc<StreamShared>> {
        let index = self.shared.index;
        let shared = Arc::get_mut(&mut self.shared).ok_or_else(|| still_waited_on(index))?;
        shared.handles = Some(handles);
        Ok(self.shared.clone())
    }

    pub(crate) fn touch(&mut self, memory: &CudaMemory) {
        memory.used_by(self.shared.index);
        if let Some(recording) = &mut self.recording {
            recording.memories.push(memory.clone());
        }
    }
}

fn still_waited_on(index: u32) -> Error {
    Error::refused(format!(
        "stream {index} of the lost device is still waited on; recover once the wait ends"
    ))
}

impl Cuda {
    /// Make the context current here: the lock may be taken on any thread.
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| {
            driver_error(
                e,
                Doing::Wait {
                    stream: None,
                    what: "binding the context",
                },
            )
        })
    }

    pub(crate) fn new_stream(&mut self, id: StreamId) -> Result<CudaStreamState> {
        self.bind()?;
        // The core's ids count creations from 0: they index `streams` and `capturing`.
        let index = id.0;
        debug_assert_eq!(index as usize, self.streams.len());
        let shared = Arc::new(StreamShared {
            index,
            handles: Some(self.stream_handles()?),
        });
        self.streams.push(shared.clone());
        self.capturing.push(false);
        Ok(CudaStreamState {
            shared,
            staging: Staging::default(),
            recording: None,
            spare_wait_events: Vec::new(),
        })
    }

    /// A new driver stream and its two events, on the current context.
    pub(crate) fn stream_handles(&self) -> Result<StreamHandles> {
        let start = |what| move |e| driver_error(e, Doing::Start { what });
        Ok(StreamHandles {
            cu: self.ctx.new_stream().map_err(start("cuStreamCreate"))?,
            order_event: self.ctx.new_event(None).map_err(start("cuEventCreate"))?,
            pre_capture: self.ctx.new_event(None).map_err(start("cuEventCreate"))?,
        })
    }

    pub(crate) fn is_capturing(&self, index: u32) -> bool {
        self.capturing.get(index as usize).copied().unwrap_or(false)
    }

    /// Wait on the host for what runs of stream `index`: its pre-capture work if it records.
    pub(crate) fn finish_on_host(&self, index: u32) -> Result<()> {
        let Some(shared) = self.streams.get(index as usize) else {
            return Ok(());
        };
        let stream = Some(StreamId(index));
        if self.is_capturing(index) {
            shared.pre_capture.synchronize().map_err(|e| {
                driver_error(
                    e,
                    Doing::Wait {
                        stream,
                        what: "the work before the capture",
                    },
                )
            })
        } else {
            shared.cu.synchronize().map_err(|e| {
                driver_error(
                    e,
                    Doing::Wait {
                        stream,
                        what: "the stream",
                    },
                )
            })
        }
    }

    /// [`Backend::sync`](scope_core::Backend::sync): a recording stream waits for its pre-capture
    /// work; another goes through a lockless wait's three steps.
    pub(crate) fn sync_stream(&mut self, stream: &mut CudaStreamState) -> Result<()> {
        if stream.recording.is_some() {
            // Only to order another recording stream after it.
            self.bind()?;
            return self.finish_on_host(stream.shared.index);
        }
        let Some(waiter) = self.begin_wait_for(stream)? else {
            return Ok(());
        };
        let waited = Self::wait_for(&waiter);
        self.end_wait_for(stream, waiter).and(waited)
    }

    /// [`Backend::begin_wait`](scope_core::Backend::begin_wait): record an event at the stream's
    /// end. Work is issued as it comes, so nothing is submitted first.
    pub(crate) fn begin_wait_for(
        &mut self,
        stream: &mut CudaStreamState,
    ) -> Result<Option<CudaWaiter>> {
        self.bind()?;
        if stream.recording.is_some() {
            return Err(Error::internal(
                "a wait without the lock reached a stream that is capturing",
            ));
        }
        let id = stream.id();
        let failed = |e| {
            driver_error(
                e,
                Doing::Wait {
                    stream: Some(id),
                    what: "the stream",
                },
            )
        };
        let event = match stream.spare_wait_events.pop() {
            Some(event) => event,
            None => self.ctx.new_event(None).map_err(failed)?,
        };
        if let Err(e) = event.record(&stream.shared.cu) {
            stream.spare_wait_events.push(event);
            return Err(failed(e));
        }
        Ok(Some(CudaWaiter {
            event,
            stream: id,
            staging: stream.staging.mark(),
            finished: AtomicBool::new(false),
        }))
    }

    /// Whether the waiter's work finished, without blocking (for
    /// [`DeviceCollectives::finished`](scope_core::collective::device::DeviceCollectives::finished)).
    pub(crate) fn finished(waiter: &CudaWaiter) -> Result<bool> {
        // Any thread may poll (the watchdog does): bind the event's context first.
        waiter
            .event
            .context()
            .bind_to_thread()
            .map_err(|e| waiter.failed(e))?;
        let done = waiter
            .event
            .try_is_complete()
            .map_err(|e| waiter.failed(e))?;
        if done {
            waiter.finished.store(true, Ordering::Release);
        }
        Ok(done)
    }

    /// [`Backend::wait`](scope_core::Backend::wait), with no lock: only the waiter's own event is
    /// touched, and any thread may synchronise one.
    pub(crate) fn wait_for(waiter: &CudaWaiter) -> Result<()> {
        waiter.event.synchronize().map_err(|e| waiter.failed(e))?;
        waiter.finished.store(true, Ordering::Release);
        Ok(())
    }

    /// [`Backend::end_wait`](scope_core::Backend::end_wait): free staging, keep the event.
    pub(crate) fn end_wait_for(
        &mut self,
        stream: &mut CudaStreamState,
        waiter: CudaWaiter,
    ) -> Result<()> {
        // After a failed wait the copies may be in flight: staging stays.
        if waiter.finished.load(Ordering::Acquire) {
            stream.staging.settled_at(waiter.staging);
        }
        if stream.spare_wait_events.len() < SPARE_WAIT_EVENTS {
            stream.spare_wait_events.push(waiter.event);
        }
        Ok(())
    }

    /// `then`'s later work waits for `first`'s earlier work.
    pub(crate) fn order_streams(
        &mut self,
        first: &CudaStreamState,
        then: &CudaStreamState,
    ) -> Result<()> {
        self.bind()?;
        let (f, t) = (first.shared.index, then.shared.index);
        if self.is_capturing(t) {
            // A capturing stream cannot wait outside its graph: finish that work first.
            return self.finish_on_host(f);
        }
        let stream = Some(then.id());
        let event = if self.is_capturing(f) {
            // Recorded work runs at replay: wait for the pre-capture work.
            &first.shared.pre_capture
        } else {
            first
                .shared
                .order_event
                .record(&first.shared.cu)
                .map_err(|e| {
                    classify(
                        e.0,
                        Doing::Wait {
                            stream,
                            what: "an ordering event",
                        },
                    )
                })?;
            &first.shared.order_event
        };
        then.shared.cu.wait(event).map_err(|e| {
            classify(
                e.0,
                Doing::Wait {
                    stream,
                    what: "another stream's work",
                },
            )
        })
    }
}
