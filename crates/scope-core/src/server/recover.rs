//! A lost device opened again, with every handle kept (rules 51–53): a failure
//! of every byte it held, which heals when rewritten. Unlocked waits are
//! waited out first ([`Waits`](super::waits::Waits)).
//!
//! 1. **Give the lost device up**, within the wait timeout: captures
//!    aborted (rule 33), graphs lost, allocations freed.
//! 2. **Refuse a process-fatal fault** with [`Error::RestartRequired`].
//! 3. **Open it again** ([`Backend::reopen`]); a refusal leaves it poisoned.
//! 4. **Make every allocation again**, claimed, or carrying why not (rule 28).

use super::*;

/// What [`Client::recover`](crate::Client::recover) did.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Recovered {
    /// The device was not lost: nothing changed.
    Healthy,
    /// The device was lost and is open again.
    Reopened {
        /// The fault that lost it.
        fault: Arc<Error>,
        /// Buffers made again, carrying [`Error::LostWithDevice`].
        buffers: usize,
        /// Buffers the new device could not hold, each carrying why.
        unallocated: usize,
        /// Graphs that can no longer replay.
        graphs: usize,
    },
}

impl<B: Backend> Server<B> {
    /// Open the lost device again; `Ok(None)` while an unlocked wait runs.
    pub(crate) fn recover(&mut self) -> Result<Option<Recovered>> {
        let Some(fault) = self.poison.clone() else {
            return Ok(Some(Recovered::Healthy));
        };
        if self.waits.any() {
            return Ok(None);
        }
        // Counted across attempts.
        self.graphs_lost += self.give_up_device();
        self.fault(Site::Reopen, None)?;
        // Step 2.
        let reopened = fault
            .refuse_process_fatal(B::NAME, B::RESTART)
            .and_then(|()| {
                let mut streams: Vec<&mut B::Stream> =
                    self.streams.iter_mut().map(|s| &mut s.device).collect();
                // SAFETY: `give_up_device` gave everything back; no waiter
                // is outstanding; `streams` are all of them, in id order.
                unsafe { self.backend.reopen(&fault, &mut streams) }
            });
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
        self.set_poison(None);
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

    /// Step 1: give everything back; returns the graphs given up.
    fn give_up_device(&mut self) -> usize {
        for index in 0..self.streams.len() {
            if self.streams[index].window.state() != CaptureState::NoCapture {
                self.abort_window(StreamId(index as u32));
            }
        }
        // Submit replays before their graphs go; a detached server has none.
        if !self.detached {
            self.flush_streams();
        }
        let mut lost = 0;
        for entry in self.graphs.values_mut() {
            if let Some(graph) = entry.graph.take() {
                // SAFETY: taken out of its entry, so named by no later call.
                if let Err(error) = unsafe { self.backend.destroy_graph(graph) } {
                    tracing::debug!("a graph of the lost device: {error}");
                }
                lost += 1;
            }
        }
        for id in self.table.ledger.ids() {
            if let Some(memory) = self.table.take_memory(id) {
                // SAFETY: taken out of the table; its graphs are destroyed.
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

    /// Step 4: remake every buffer in `held`; returns how many were, and not.
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
                    // SAFETY: a reopened stream; `size` is non-zero and
                    // within the largest allocation (checked above).
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
                    // Lost again: the next recovery makes it.
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
            // Lost again: poisoned and recoverable anew.
            self.poison_with(&sticky);
        }
        (made.len(), not_made)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::error::{DeviceFault, FaultClass};
    use crate::handle::{Binding, Buffer, Dispatch};
    use crate::kernel::Kernel;
    use crate::null::{Null, Script};
    use crate::{Client, Error, Recovered, Result, StreamId};

    struct Faulty {
        class: FaultClass,
        reopens: Arc<AtomicUsize>,
    }

    impl Script for Faulty {
        fn launch(&mut self, _stream: StreamId, _kernel: &str) -> Result<()> {
            Err(Error::Fault(DeviceFault {
                backend: "null",
                // A process-fatal CUDA name; the class decides.
                code: "CUDA_ERROR_ILLEGAL_ADDRESS".to_owned(),
                class: self.class,
                stream: None,
                detail: String::new(),
            }))
        }

        fn reopen(&mut self, _fault: &Error) -> Result<()> {
            self.reopens.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    fn poisoned(class: FaultClass) -> (Client<Null<Faulty>>, Arc<AtomicUsize>, Buffer) {
        let reopens = Arc::new(AtomicUsize::new(0));
        let script = Faulty {
            class,
            reopens: reopens.clone(),
        };
        let client = Client::new(Null::scripted(script)).unwrap();
        let out = client.allocate(16).unwrap();
        let launched = client.launch(
            &Kernel::host("k"),
            &[Binding::write(&out)],
            &[],
            Dispatch::linear(1),
        );
        assert!(launched.is_err(), "the launch reported its fault");
        assert!(client.poison().is_some());
        (client, reopens, out)
    }

    /// Rule 52: a process-fatal fault is refused before any reopen.
    #[test]
    fn a_process_fatal_fault_is_refused_without_a_reopen() {
        let (client, reopens, _out) = poisoned(FaultClass::ProcessFatal);
        for _ in 0..2 {
            match client.recover() {
                Err(Error::RestartRequired {
                    backend: "null",
                    fault,
                    reason: said,
                }) => {
                    assert!(fault.is_process_fatal(), "{fault}");
                    assert_eq!(said, <Null<Faulty> as crate::Backend>::RESTART);
                }
                other => panic!("a process-fatal fault requires a restart: {other:?}"),
            }
            assert_eq!(reopens.load(Ordering::SeqCst), 0, "reopen was called");
            assert!(client.poison().is_some());
        }
    }

    #[test]
    fn a_sticky_fault_of_the_same_name_reopens() {
        let (client, reopens, _out) = poisoned(FaultClass::Sticky);
        let recovered = client.recover().unwrap();
        assert!(
            matches!(recovered, Recovered::Reopened { buffers: 1, .. }),
            "{recovered:?}"
        );
        assert_eq!(reopens.load(Ordering::SeqCst), 1);
        assert!(client.poison().is_none());
    }
}
