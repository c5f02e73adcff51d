//! A lost device opened again, with every handle kept (rules 51–53).
//!
//! A sticky fault poisons a server for good (rule 36); before this, the way
//! on was a new client, whose buffers were all foreign to the old handles.
//! But a lost device is a failure of every byte it held, and the model
//! already says what failed bytes do: they fail reads, they stop the work
//! that reads them, and a rewrite heals them. So recovery is the failure
//! model applied to the whole device:
//!
//! 1. **Give the lost device up**, never waiting on it past a backend's wait
//!    timeout: open capture windows are aborted (their recorded writes
//!    claimed, rule 33), graphs destroyed and marked lost (a replay is
//!    refused; the caller captures again), every allocation freed, the
//!    kernel cache emptied (kernels compile again on first use).
//! 2. **Open it again** ([`Backend::reopen`]), which gives every stream new
//!    device state in place. A backend whose driver says the process must
//!    restart refuses here, touching nothing that matters: the server stays
//!    poisoned, and its buffers have no memory.
//! 3. **Make every allocation again**, under the limits the new device
//!    reports, and claim every byte with one failure, "lost with the
//!    device", naming the fault. A buffer the new device cannot hold (past
//!    its largest allocation, or out of memory) carries that error instead,
//!    as a failed allocation does (rule 28).
//!
//! The client, every buffer, stream, graph and capture handle, the failure
//! hook, each stream's count of failures seen and every failure already
//! claimed on a buffer the device never held (a failed allocation's record)
//! carry over. A recovery is refused while a wait or a read runs on
//! another thread with the lock released — a waiter names the lost
//! device's objects, and a read's second half copies out of the memory its
//! first half named — so the client tries again once it ends.

use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::*;

/// What [`Client::recover`](crate::Client::recover) did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Recovered {
    /// The device was not lost: nothing changed. Two threads that both saw
    /// the poison and both recover get one `Reopened` and one of these.
    Healthy,
    /// The device was lost and is open again.
    Reopened {
        /// The fault that lost it.
        fault: Arc<Error>,
        /// Buffers made again on the new device, each carrying
        /// [`Error::LostWithDevice`] until rewritten.
        buffers: usize,
        /// Buffers the new device could not hold, each carrying why.
        unallocated: usize,
        /// Graphs that can no longer replay.
        graphs: usize,
    },
}

/// How many waits run with the lock released ([`WaitToken`]).
///
/// A condition variable tells a waiting recovery when the last one ends.
#[derive(Debug, Default)]
pub(crate) struct Waits {
    count: Mutex<usize>,
    ended: Condvar,
}

impl Waits {
    pub(super) fn begin(&self) {
        *self.count.lock() += 1;
    }

    pub(super) fn end(&self) {
        let mut count = self.count.lock();
        *count -= 1;
        if *count == 0 {
            self.ended.notify_all();
        }
    }

    fn any(&self) -> bool {
        *self.count.lock() > 0
    }

    /// Block until no wait runs or `until` passes.
    pub(crate) fn wait_out(&self, until: Instant) {
        let mut count = self.count.lock();
        while *count > 0 {
            if self.ended.wait_until(&mut count, until).timed_out() {
                return;
            }
        }
    }
}

impl<B: Backend> Server<B> {
    /// Open the lost device again ([`Recovered`]); `Ok(None)` while a wait
    /// runs without the lock, which the caller waits out.
    pub(crate) fn recover(&mut self) -> Result<Option<Recovered>> {
        let Some(fault) = self.poison.clone() else {
            return Ok(Some(Recovered::Healthy));
        };
        if self.waits.any() {
            return Ok(None);
        }
        // Counted across attempts: one whose reopen failed gave graphs up
        // that the next attempt no longer finds.
        self.graphs_lost += self.give_up_device();
        self.fault(Site::Reopen, None)?;
        let mut streams: Vec<&mut B::Stream> =
            self.streams.iter_mut().map(|s| &mut s.device).collect();
        // SAFETY: `give_up_device` gave back every memory, graph and
        // kernel and aborted every capture; no waiter is outstanding (the
        // count above); `streams` are every stream of this backend, in id
        // order (the core made them in that order and never removes one).
        let reopened = unsafe { self.backend.reopen(&fault, &mut streams) };
        drop(streams);
        if let Err(error) = reopened {
            tracing::error!(
                backend = B::NAME,
                "the lost device did not open again: {error}"
            );
            return Err(error);
        }
        self.detached = false;
        self.reopened += 1;
        self.rules = LaunchRules::of(&self.backend);
        self.poison = None;
        let held = std::mem::take(&mut self.to_remake);
        let (buffers, unallocated) = self.allocate_again(&fault, &held);
        if let Some(again) = self.poison.clone() {
            return Err(Error::DevicePoisoned { fault: again });
        }
        let graphs = std::mem::take(&mut self.graphs_lost);
        tracing::info!(
            backend = B::NAME,
            buffers,
            unallocated,
            graphs,
            "the lost device is open again: {fault}"
        );
        Ok(Some(Recovered::Reopened {
            fault,
            buffers,
            unallocated,
            graphs,
        }))
    }

    /// The waits running without the lock, for a recovery to wait out.
    pub(crate) fn waits(&self) -> Arc<Waits> {
        self.waits.clone()
    }

    /// The limits of the device as it is now, for the client to publish.
    pub(crate) fn limits(&self) -> crate::limits::DeviceLimits {
        crate::limits::DeviceLimits {
            max_allocation: self.backend.max_allocation(),
            binding_alignment: self.backend.binding_alignment(),
            launch: self.backend.launch_limits(),
        }
    }

    /// Step 1: abort every capture, destroy every graph, free every
    /// allocation (remembering whose, for step 3, however many attempts it
    /// takes) and empty the kernel cache; the number of graphs this attempt
    /// gave up (an earlier attempt's are counted in `graphs_lost`).
    /// Afterwards the server is detached: its streams name a device that is
    /// being given up.
    fn give_up_device(&mut self) -> usize {
        for index in 0..self.streams.len() {
            if self.streams[index].window.state() != CaptureState::NoCapture {
                self.abort_window(StreamId(index as u32));
            }
        }
        // A backend may batch replays; every one is submitted before a
        // graph is destroyed (`Backend::destroy_graph`). On a lost device
        // the submission fails fast, and its fault lands on nothing new.
        // A server detached by an earlier attempt whose reopen failed has
        // nothing left to submit, and its streams name no device to ask.
        if !self.detached {
            self.flush_streams();
        }
        let mut lost = 0;
        for entry in self.graphs.values_mut() {
            if let Some(graph) = entry.graph.take() {
                // SAFETY: taken out of its entry, so named by no later call;
                // on a lost device the wait for its replays fails fast.
                if let Err(error) = unsafe { self.backend.destroy_graph(graph) } {
                    tracing::debug!("a graph of the lost device: {error}");
                }
                lost += 1;
            }
        }
        for id in self.table.ledger.ids() {
            if let Some(memory) = self.table.take_memory(id) {
                // SAFETY: taken out of the table, so named by no later call;
                // every graph that recorded work on it is destroyed above.
                unsafe { self.backend.free(memory) };
                self.to_remake.push(id);
            }
        }
        self.kernels.clear();
        self.kernel_index.clear();
        self.last_kernel = None;
        for state in &mut self.streams {
            state.in_flight.clear();
        }
        self.detached = true;
        lost
    }

    /// Step 3: every buffer in `held` (those the lost device held) gets
    /// memory again, on the stream that used it last, claimed whole by one
    /// failure naming `fault`; one the new device cannot hold records why.
    /// A buffer the lost device never held keeps its record. When the
    /// device is lost again meanwhile, the buffers not yet made record the
    /// loss and wait in `to_remake` for the next recovery. The numbers made
    /// and not made.
    fn allocate_again(&mut self, fault: &Arc<Error>, held: &[BufferId]) -> (usize, usize) {
        let max = self.backend.max_allocation();
        let mut made: Vec<BufferRange> = Vec::new();
        let mut not_made = 0;
        let mut sticky: Option<Error> = None;
        for &id in held {
            let Some(entry) = self.table.ledger.get(id) else {
                continue;
            };
            let (size, stream) = (entry.size, entry.last_user);
            let allocated = if size > max {
                Err(Error::OutOfMemory {
                    backend: B::NAME,
                    requested: size,
                    detail: format!(
                        "the device opened again holds at most {max} bytes in one allocation"
                    ),
                })
            } else if let Some(fault) = &sticky {
                Err(Error::DevicePoisoned {
                    fault: Arc::new(fault.clone()),
                })
            } else {
                let index = self.stream_index(stream);
                self.fault(Site::Allocate, Some(stream)).and_then(|()| {
                    // SAFETY: this server's stream, given new device state
                    // by `reopen`; `size` is non-zero (no buffer is empty)
                    // and within the largest allocation (checked above).
                    unsafe { self.backend.allocate(&mut self.streams[index].device, size) }
                })
            };
            match allocated {
                Ok(memory) => {
                    self.table.give_memory(id, memory);
                    made.push(BufferRange {
                        buffer: id,
                        range: ByteRange::new(0, size),
                    });
                }
                Err(error) => {
                    // Lost again before this buffer got memory (at it or
                    // earlier): not a buffer the device cannot hold, so the
                    // next recovery makes it again.
                    let lost_again = error.is_sticky() || sticky.is_some();
                    if error.is_sticky() && sticky.is_none() {
                        sticky = Some(error.clone());
                    }
                    let record = self
                        .table
                        .failures()
                        .mint_failed(Work::new(WorkKind::Allocate, stream), error);
                    self.table.record_unallocated(id, record);
                    self.table.failures().prune(record);
                    if lost_again {
                        self.to_remake.push(id);
                    }
                    not_made += 1;
                }
            }
        }
        self.table.claim_failed(
            &made,
            Work::new(WorkKind::Settle, StreamId(0)),
            Error::LostWithDevice {
                fault: fault.clone(),
            },
        );
        if let Some(sticky) = sticky {
            // Lost again while coming back: poisoned anew, and recoverable
            // anew.
            self.poison_with(&sticky);
        }
        (made.len(), not_made)
    }
}
