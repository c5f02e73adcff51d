//! The reference server's device transport: an in-process communicator
//! that behaves as NCCL's does where the group relies on it, so that the
//! device path of [`Group::over_device`](crate::collective::Group::over_device)
//! — the agreement, the call, the second meeting, the abort — runs on every
//! machine, and the conformance suite's collectives run on it beside host
//! staging.
//!
//! Like NCCL's, a call blocks until every rank of the communicator made its
//! own (NCCL's kernel waits on the device; the host server runs work as it
//! is issued, so here the thread waits), [`abort`](DeviceCollectives::abort)
//! releases every waiter with an error, and ranks that issue different
//! calls are a broken contract: NCCL would hang or read past a buffer; this
//! transport refuses with an internal error and counts it
//! ([`Loopback::mismatches`]), which the suite asserts stays zero.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{Host, HostStream, Op, range};
use crate::collective::compute::compute;
use crate::collective::device::{DeviceCall, DeviceCollectives};
use crate::collective::{Call, CollectiveError};
use crate::error::{Error, Result};

/// Calls whose ranks disagreed, process-wide.
static MISMATCHES: AtomicU64 = AtomicU64::new(0);

/// One communicator's shared state, which every rank's [`Loopback`] holds.
#[derive(Default)]
struct Clique {
    state: Mutex<CliqueState>,
    changed: Condvar,
}

#[derive(Default)]
struct CliqueState {
    ranks: usize,
    joined: Vec<bool>,
    aborted: bool,
    /// Calls by sequence number: each rank's input, then the outputs.
    calls: BTreeMap<u64, Posted>,
}

#[derive(Default)]
struct Posted {
    call: Option<Call>,
    inputs: Vec<Option<Vec<u8>>>,
    outputs: Option<std::result::Result<Vec<Arc<Vec<u8>>>, String>>,
    taken: usize,
}

/// The identity every rank of one loopback communicator joins with (what
/// `ncclGetUniqueId` makes for NCCL).
#[derive(Clone)]
pub struct LoopbackId(Arc<Clique>);

/// One rank's membership of a loopback communicator.
pub struct Loopback {
    clique: Arc<Clique>,
    rank: usize,
    next: AtomicU64,
    /// How long a call waits inside the transport for its peers (the
    /// `patience` of [`DeviceCollectives::join`]), as NCCL's kernel would
    /// until aborted.
    patience: Duration,
}

impl Loopback {
    /// Calls whose ranks disagreed on what to run, since the process began:
    /// zero unless a group let mismatched calls through to the transport.
    pub fn mismatches() -> u64 {
        MISMATCHES.load(Ordering::Relaxed)
    }
}

/// What a call answers when its peers did not come, or one aborted.
fn stalled(collective: &'static str, seq: u64, patience: Duration) -> Error {
    CollectiveError::Stalled {
        collective,
        round: seq,
        deadline: patience,
    }
    .into()
}

/// Wait on `clique` until `done` holds, it is aborted, or `patience`
/// passes — then [`CollectiveError::Stalled`] for call `seq` of
/// `collective`, as [`DeviceCollectives::join`] asks of a transport whose
/// peers did not come.
fn wait_until(
    clique: &Clique,
    state: &mut parking_lot::MutexGuard<'_, CliqueState>,
    patience: Duration,
    (collective, seq): (&'static str, u64),
    done: impl Fn(&CliqueState) -> bool,
) -> Result<()> {
    let until = Instant::now() + patience;
    while !done(state) {
        let timed_out =
            state.aborted || (clique.changed.wait_until(state, until).timed_out() && !done(state));
        if timed_out {
            return Err(stalled(collective, seq, patience));
        }
    }
    Ok(())
}

impl DeviceCollectives for Host {
    type Communicator = Loopback;
    type Identity = LoopbackId;

    fn identity() -> Result<LoopbackId> {
        Ok(LoopbackId(Arc::default()))
    }

    unsafe fn join(
        &mut self,
        identity: &LoopbackId,
        rank: usize,
        ranks: usize,
        patience: Duration,
    ) -> Result<Loopback> {
        let clique = identity.0.clone();
        let mut state = clique.state.lock();
        if state.joined.is_empty() {
            state.ranks = ranks;
            state.joined = vec![false; ranks];
        }
        if state.ranks != ranks || rank >= ranks || state.joined[rank] {
            return Err(Error::invalid(
                "loopback communicator",
                format!(
                    "rank {rank} of {ranks} joined a communicator of {}",
                    state.ranks
                ),
            ));
        }
        state.joined[rank] = true;
        clique.changed.notify_all();
        wait_until(&clique, &mut state, patience, ("join", 0), |s| {
            s.joined.iter().all(|j| *j)
        })?;
        drop(state);
        Ok(Loopback {
            clique,
            rank,
            next: AtomicU64::new(0),
            patience,
        })
    }

    unsafe fn collective(
        &mut self,
        communicator: &Loopback,
        stream: &mut HostStream,
        call: &DeviceCall<'_, super::HostMemory>,
    ) -> Result<()> {
        let reads = !matches!(call.call, Call::Broadcast { root } if root != communicator.rank);
        let input = if reads {
            let (memory, r) = &call.input;
            memory.lock()[range(r.start, r.end - r.start)].to_vec()
        } else {
            Vec::new()
        };
        let seq = communicator.next.fetch_add(1, Ordering::Relaxed);
        let clique = &communicator.clique;
        let mut state = clique.state.lock();
        let ranks = state.ranks;
        let posted = state.calls.entry(seq).or_default();
        if posted.inputs.is_empty() {
            posted.inputs = vec![None; ranks];
            posted.call = Some(call.call);
        }
        if posted.call != Some(call.call) {
            MISMATCHES.fetch_add(1, Ordering::Relaxed);
            posted.outputs = Some(Err(format!(
                "rank {} called {:?} where a peer called {:?}",
                communicator.rank, call.call, posted.call
            )));
        }
        posted.inputs[communicator.rank] = Some(input);
        if posted.outputs.is_none() && posted.inputs.iter().all(Option::is_some) {
            let inputs: Vec<&[u8]> = posted.inputs.iter().flatten().map(Vec::as_slice).collect();
            posted.outputs = Some(Ok(compute(call.call, &inputs)));
        }
        clique.changed.notify_all();
        let what = (call.call.name(), seq);
        wait_until(clique, &mut state, communicator.patience, what, |s| {
            s.calls.get(&seq).is_some_and(|p| p.outputs.is_some())
        })?;
        let Some(posted) = state.calls.get_mut(&seq) else {
            return Err(Error::internal("a loopback call lost its outputs"));
        };
        posted.taken += 1;
        let mine = match &posted.outputs {
            Some(Ok(outputs)) => Ok(outputs[communicator.rank].clone()),
            Some(Err(why)) => Err(Error::internal(why.clone())),
            None => Err(Error::internal("a loopback call lost its outputs")),
        };
        if posted.taken == ranks {
            state.calls.remove(&seq);
        }
        drop(state);
        let mine = mine?;
        if matches!(call.call, Call::Broadcast { root } if root == communicator.rank) {
            return Ok(());
        }
        let (memory, r) = &call.output;
        stream.issue(Op::Write {
            dst: (*memory).clone(),
            offset: r.start,
            data: Arc::from(mine.as_slice()),
        })
    }

    unsafe fn abort(communicator: &Loopback) {
        let mut state = communicator.clique.state.lock();
        state.aborted = true;
        communicator.clique.changed.notify_all();
    }

    /// The host runs work as it is issued: a call that returned finished.
    unsafe fn finished((): &()) -> Result<bool> {
        Ok(true)
    }

    unsafe fn health(communicator: &Loopback) -> Result<()> {
        if communicator.clique.state.lock().aborted {
            return Err(stalled("communicator", 0, communicator.patience));
        }
        Ok(())
    }
}
