//! The reference server's device transport: an in-process communicator that behaves as NCCL's does
//! where the group relies on it. So the device path of
//! [`Group::over_device`](scope_core::collective::Group::over_device) runs on every machine: the
//! agreement, the call, the abort. The conformance suite's collectives run on it beside host
//! staging.
//!
//! Like NCCL's, a call blocks until every rank of the communicator made its own. NCCL's kernel
//! waits on the device; the host server runs work as it is issued, so here the thread waits.
//! [`Loopback::abort`] releases every waiter with an error. Ranks that issue
//! different calls break the contract, and NCCL would hang or read past a buffer. This transport
//! refuses with an internal error and counts it ([`Loopback::mismatches`]). The suite asserts that
//! count stays zero.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::memory::{HostMemory, range};
use scope_core::collective::device::{DeviceCall, DeviceTransfer, Direction};
use scope_core::collective::{Call, CollectiveError};
use scope_core::{Error, Result};

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
    /// Transfers sent and not yet received, by (sender, receiver), in order.
    mail: BTreeMap<(usize, usize), VecDeque<Vec<u8>>>,
}

#[derive(Default)]
struct Posted {
    call: Option<Call>,
    inputs: Vec<Option<Vec<u8>>>,
    outputs: Option<std::result::Result<Vec<Arc<Vec<u8>>>, String>>,
    taken: usize,
}

/// The identity every rank of one loopback communicator joins with (`ncclGetUniqueId` for NCCL).
#[derive(Clone)]
pub struct LoopbackId(Arc<Clique>);

/// One rank's membership of a loopback communicator.
pub struct Loopback(Arc<Member>);

struct Member {
    clique: Arc<Clique>,
    rank: usize,
    next: AtomicU64,
    /// How long a call waits inside the transport for its peers, as NCCL's kernel would until
    /// aborted. The `patience` a rank joined with.
    patience: Duration,
}

/// One rank's part of a call, as stream work. It runs when issued, or at each replay when recorded
/// into a graph. There it is the communicator's next call, as a captured NCCL call is.
#[derive(Clone)]
pub(super) struct Exchange {
    member: Arc<Member>,
    call: Call,
    input: (HostMemory, std::ops::Range<u64>),
    output: (HostMemory, std::ops::Range<u64>),
}

impl Loopback {
    /// Calls whose ranks disagreed on what to run, since the process began. Zero unless a group let
    /// mismatched calls through to the transport.
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

/// Wait on `clique` until `done` holds, it is aborted, or `patience` passes. Then
/// [`CollectiveError::Stalled`] for call `seq` of `collective`, as the device collectives ask
/// of a transport whose peers did not come.
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

impl LoopbackId {
    /// A fresh communicator's identity.
    pub(super) fn new() -> Self {
        Self(Arc::default())
    }
}

impl Loopback {
    /// Join `identity`'s communicator as `rank` of `ranks`, waiting up to `patience` for every
    /// rank to join, as `ncclCommInitRank` does.
    pub(super) fn join(
        identity: &LoopbackId,
        rank: usize,
        ranks: usize,
        patience: Duration,
    ) -> Result<Self> {
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
        Ok(Self(Arc::new(Member {
            clique,
            rank,
            next: AtomicU64::new(0),
            patience,
        })))
    }

    /// This rank's part of `call`, as stream work: it runs when its stream reaches it.
    pub(super) fn exchange(&self, call: &DeviceCall<'_, HostMemory>) -> Exchange {
        Exchange {
            member: self.0.clone(),
            call: call.call,
            input: (call.input.0.clone(), call.input.1.clone()),
            output: (call.output.0.clone(), call.output.1.clone()),
        }
    }

    /// A send leaves its bytes for the receiver at once; NCCL buffers small sends too. A receive
    /// waits for them within the patience. A length that is not the receiver's breaks the contract:
    /// refused and counted as a mismatch.
    pub(super) fn transfer(&self, call: &DeviceTransfer<'_, HostMemory>) -> Result<()> {
        let member = &*self.0;
        let clique = &member.clique;
        let (memory, r) = &call.data;
        let mut state = clique.state.lock();
        if state.aborted {
            return Err(stalled("transfer", 0, member.patience));
        }
        match call.direction {
            Direction::Send => {
                let bytes = memory.lock()[range(r.start, r.end - r.start)].to_vec();
                state
                    .mail
                    .entry((member.rank, call.peer))
                    .or_default()
                    .push_back(bytes);
                clique.changed.notify_all();
                Ok(())
            }
            Direction::Recv => {
                let from = (call.peer, member.rank);
                wait_until(clique, &mut state, member.patience, ("recv", 0), |s| {
                    s.mail.get(&from).is_some_and(|q| !q.is_empty())
                })?;
                let bytes = state
                    .mail
                    .get_mut(&from)
                    .and_then(VecDeque::pop_front)
                    .ok_or_else(|| Error::internal("a loopback transfer lost its bytes"))?;
                drop(state);
                if bytes.len() as u64 != r.end - r.start {
                    MISMATCHES.fetch_add(1, Ordering::Relaxed);
                    return Err(Error::internal(format!(
                        "rank {} sent {} bytes where rank {} receives {}",
                        call.peer,
                        bytes.len(),
                        member.rank,
                        r.end - r.start
                    )));
                }
                memory.lock()[range(r.start, r.end - r.start)].copy_from_slice(&bytes);
                Ok(())
            }
        }
    }

    /// Release every waiter of the communicator with an error, as `ncclCommAbort` does.
    pub(super) fn abort(&self) {
        let clique = &self.0.clique;
        let mut state = clique.state.lock();
        state.aborted = true;
        clique.changed.notify_all();
    }

    /// `Stalled` once the communicator was aborted.
    pub(super) fn health(&self) -> Result<()> {
        let member = &self.0;
        if member.clique.state.lock().aborted {
            return Err(stalled("communicator", 0, member.patience));
        }
        Ok(())
    }
}

impl Exchange {
    /// Post this rank's input, wait for every rank's, and write this rank's output. The call
    /// itself, blocking as NCCL's kernel does.
    pub(super) fn run(&self) -> Result<()> {
        let member = &*self.member;
        let reads = !matches!(self.call, Call::Broadcast { root } if root != member.rank);
        let input = if reads {
            let (memory, r) = &self.input;
            memory.lock()[range(r.start, r.end - r.start)].to_vec()
        } else {
            Vec::new()
        };
        let seq = member.next.fetch_add(1, Ordering::Relaxed);
        let clique = &member.clique;
        let mut state = clique.state.lock();
        let ranks = state.ranks;
        let posted = state.calls.entry(seq).or_default();
        if posted.inputs.is_empty() {
            posted.inputs = vec![None; ranks];
            posted.call = Some(self.call);
        }
        if posted.call != Some(self.call) {
            MISMATCHES.fetch_add(1, Ordering::Relaxed);
            posted.outputs = Some(Err(format!(
                "rank {} called {:?} where a peer called {:?}",
                member.rank, self.call, posted.call
            )));
        }
        posted.inputs[member.rank] = Some(input);
        if posted.outputs.is_none() && posted.inputs.iter().all(Option::is_some) {
            let inputs: Vec<&[u8]> = posted.inputs.iter().flatten().map(Vec::as_slice).collect();
            posted.outputs = Some(Ok(self.call.outputs(&inputs)));
        }
        clique.changed.notify_all();
        let what = (self.call.name(), seq);
        wait_until(clique, &mut state, member.patience, what, |s| {
            s.calls.get(&seq).is_some_and(|p| p.outputs.is_some())
        })?;
        let Some(posted) = state.calls.get_mut(&seq) else {
            return Err(Error::internal("a loopback call lost its outputs"));
        };
        posted.taken += 1;
        let mine = match &posted.outputs {
            Some(Ok(outputs)) => Ok(outputs[member.rank].clone()),
            Some(Err(why)) => Err(Error::internal(why.clone())),
            None => Err(Error::internal("a loopback call lost its outputs")),
        };
        if posted.taken == ranks {
            state.calls.remove(&seq);
        }
        drop(state);
        let mine = mine?;
        if matches!(self.call, Call::Broadcast { root } if root == member.rank) {
            return Ok(());
        }
        let (memory, r) = &self.output;
        memory.lock()[range(r.start, mine.len() as u64)].copy_from_slice(&mine);
        Ok(())
    }
}
