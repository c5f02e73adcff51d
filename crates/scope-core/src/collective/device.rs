//! A device transport for collectives: the bytes move on the devices
//! (NCCL, RCCL); the decision about them stays where it is.
//!
//! Host staging moves every byte twice over the bus, so a backend with a
//! collective library implements [`DeviceCollectives`]:
//!
//! 1. **Every rank decides before data moves**, so a mismatched call never
//!    reaches the library, where NCCL would hang or overrun.
//! 2. **Nothing of the caller's stream is drained.** A rank decides from
//!    what is known at submission; the call runs on a communication
//!    stream ([`Site::Collective`]), ordered by an event.
//! 3. **What surfaces later reaches every rank** through the watchdog
//!    (`watchdog.rs`), before the communicators are aborted.
//! 4. **A call that fails after agreement breaks the group**: the failing
//!    rank aborts every communicator, releasing waiting peers (rule 43).
//!
//! [`Site::Collective`]: crate::Site::Collective

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::round::{Input, Kind, Outcome, Part, Written};
use super::watchdog::{self, Flight, Writes};
use super::{Call, Group, Rank, is_refusal, per_rank};
use crate::backend::Backend;
use crate::capture::{CaptureState, RecordedRound};
use crate::client::{Client, LentStream};
use crate::error::{Error, Result};
use crate::handle::Slice;
use crate::server::PendingWait;

/// A backend whose devices run collectives through the vendor's library; an
/// `unsafe` contract, as [`Backend`]'s is, and only the group calls it.
pub trait DeviceCollectives: Backend {
    /// One rank's membership of a communicator; dropping it destroys it.
    type Communicator: Send + Sync + 'static;

    /// What every rank of one communicator is given (`ncclGetUniqueId`).
    type Identity: Clone + Send + Sync + 'static;

    /// A new identity.
    ///
    /// # Errors
    ///
    /// [`Error::BackendUnavailable`] where the library is not installed.
    fn identity() -> Result<Self::Identity>;

    /// Join `identity`'s communicator as rank `rank` of `ranks`, blocking
    /// until every rank joined. `patience` bounds every host wait for peers;
    /// past it, [`CollectiveError::Stalled`](super::CollectiveError::Stalled).
    ///
    /// # Safety
    ///
    /// Every rank joins once, with the same arguments, on a thread of its
    /// own, and no two ranks share a device.
    unsafe fn join(
        &mut self,
        identity: &Self::Identity,
        rank: usize,
        ranks: usize,
        patience: Duration,
    ) -> Result<Self::Communicator>;

    /// Issue `call` on `stream`, or record it where the stream records.
    ///
    /// # Safety
    ///
    /// `communicator` is this backend's, both ranges lie inside live memory,
    /// and every rank issues, records and replays the same call together.
    unsafe fn collective(
        &mut self,
        communicator: &Self::Communicator,
        stream: &mut Self::Stream,
        call: &DeviceCall<'_, Self::Memory>,
    ) -> Result<()>;

    /// Issue this rank's half of a transfer with `call.peer` (`ncclSend`,
    /// `ncclRecv`), for ranks in separate processes.
    ///
    /// # Safety
    ///
    /// As for [`collective`](Self::collective), and `stream` is not
    /// recording. The peer issues the opposite half, of the same length.
    unsafe fn point_to_point(
        &mut self,
        communicator: &Self::Communicator,
        stream: &mut Self::Stream,
        call: &DeviceTransfer<'_, Self::Memory>,
    ) -> Result<()>;

    /// Abort `communicator`: waiting calls return. Any thread, any times.
    ///
    /// # Safety
    ///
    /// `communicator` came from [`join`](Self::join) on this backend type.
    unsafe fn abort(communicator: &Self::Communicator);

    /// The survivors' communicator once the ranks `exclude` (ascending) left
    /// (`ncclCommShrink`); `Ok(None)`, the default, joins a fresh identity.
    ///
    /// # Safety
    ///
    /// `communicator` is this backend's, not aborted, and idle. Every
    /// survivor calls this once, with the same `exclude`, on its own thread.
    ///
    /// # Errors
    ///
    /// What the library answered, or
    /// [`CollectiveError::Stalled`](super::CollectiveError::Stalled).
    unsafe fn shrink(
        &mut self,
        communicator: &Self::Communicator,
        exclude: &[usize],
        patience: Duration,
    ) -> Result<Option<Self::Communicator>> {
        let _ = (communicator, exclude, patience);
        Ok(None)
    }

    /// A copy of `communicator` (`ncclCommSplit`) whose calls never wait
    /// behind its kernels; `Ok(None)`, the default, where there is none.
    ///
    /// # Safety
    ///
    /// As [`shrink`](Self::shrink), nothing excluded; `rank` is this rank.
    ///
    /// # Errors
    ///
    /// As [`shrink`](Self::shrink).
    unsafe fn duplicate(
        &mut self,
        communicator: &Self::Communicator,
        rank: usize,
        patience: Duration,
    ) -> Result<Option<Self::Communicator>> {
        let _ = (communicator, rank, patience);
        Ok(None)
    }

    /// Whether `waiter`'s work finished, without blocking: a wait with a
    /// deadline, where a missing peer would block [`Backend::wait`].
    ///
    /// # Safety
    ///
    /// As [`Backend::wait`], and so are its errors.
    unsafe fn finished(waiter: &Self::Waiter) -> Result<bool>;

    /// Whether `communicator` still works (`ncclCommGetAsyncError`).
    ///
    /// # Safety
    ///
    /// As [`abort`](Self::abort).
    ///
    /// # Errors
    ///
    /// [`CollectiveError::Stalled`](super::CollectiveError::Stalled) after an
    /// abort or a failed link.
    unsafe fn health(communicator: &Self::Communicator) -> Result<()>;

    /// Run `replay`, a graph's launch holding calls on `communicator`, never after an abort.
    ///
    /// # Safety
    ///
    /// As [`abort`](Self::abort).
    unsafe fn replaying(
        communicator: &Self::Communicator,
        replay: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        let _ = communicator;
        replay()
    }
}

/// One rank's part of a collective, resolved to device memory.
#[derive(Debug)]
pub struct DeviceCall<'a, M> {
    /// What the ranks agreed to run.
    pub call: Call,
    /// This rank's input: its memory and the byte range in it.
    pub input: (&'a M, std::ops::Range<u64>),
    /// This rank's output.
    pub output: (&'a M, std::ops::Range<u64>),
    /// This rank's index.
    pub rank: usize,
    /// How many ranks.
    pub ranks: usize,
}

/// Which way a transfer moves its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// This rank's bytes go to the peer.
    Send,
    /// The peer's bytes come into this rank's buffer.
    Recv,
}

/// One rank's half of a point-to-point transfer.
#[derive(Debug)]
pub struct DeviceTransfer<'a, M> {
    /// Send or receive.
    pub direction: Direction,
    /// The other rank.
    pub peer: usize,
    /// This rank's buffer: its memory and the byte range in it.
    pub data: (&'a M, std::ops::Range<u64>),
}

/// How an agreed round's bytes move, erased so a group needs only `B: Backend`.
pub(super) trait Mover<B: Backend>: Send + Sync {
    /// Issue rank `rank`'s part of `call`: recorded, else on its
    /// communication stream (returned to be watched), else on its own.
    fn issue(
        &self,
        rank: usize,
        client: &Client<B>,
        call: (Call, RecordedRound),
        input: Slice<'_>,
        output: Slice<'_>,
    ) -> Result<Option<Box<dyn watchdog::Part>>>;

    /// A watch on rank `rank`'s stream up to a replay just issued there;
    /// `None` where the caller waits for it itself (a draining group).
    fn watch_replay(
        &self,
        rank: usize,
        client: &Client<B>,
    ) -> Result<Option<Box<dyn watchdog::Part>>>;

    /// Launch rank `rank`'s graph of rounds with `replay`, never after an abort.
    fn replay(&self, rank: usize, replay: &mut dyn FnMut() -> Result<()>) -> Result<()>;

    /// Abort every rank's communicator.
    fn abort_all(&self);

    /// A rank never came: keep the communicators for a shrink in one
    /// process, abort them across processes.
    fn break_off(&self);

    /// The transport of a new epoch over `clients`, whose first members
    /// were ranks `survivors`: shrunk where it can be, else joined anew.
    fn regroup(
        &self,
        survivors: &[usize],
        clients: &[Client<B>],
        deadline: Duration,
    ) -> Result<Box<dyn Mover<B>>>;
}

/// This process's communicators of one group.
pub(super) struct Communicators<B: DeviceCollectives> {
    /// The rank `mine[0]` is.
    pub(super) first: usize,
    pub(super) mine: Vec<Arc<B::Communicator>>,
    /// Each rank's communication stream; empty where a group drains.
    pub(super) streams: Vec<LentStream<B>>,
    /// How many ranks the group has.
    pub(super) ranks: usize,
    /// Set by [`Mover::abort_all`]: no shrink then.
    pub(super) aborted: AtomicBool,
}

impl<B: DeviceCollectives> Communicators<B> {
    /// Every rank's communicator is here: the group lives in this process.
    fn every_rank_here(&self) -> bool {
        self.first == 0 && self.mine.len() == self.ranks
    }

    /// The survivors' communicators by the library's shrink, if it will.
    fn shrink(
        &self,
        survivors: &[usize],
        clients: &[Client<B>],
        patience: Duration,
    ) -> Option<Communicators<B>> {
        if self.aborted.load(Ordering::Acquire)
            || !self.every_rank_here()
            || survivors.is_empty()
            || clients.len() != survivors.len()
        {
            return None;
        }
        let exclude: Vec<usize> = (0..self.ranks).filter(|r| !survivors.contains(r)).collect();
        let shrunk: Vec<Result<Option<B::Communicator>>> = per_rank(survivors.len(), |rank| {
            let communicator = &self.mine[survivors[rank]];
            let shrink = |backend: &mut B| {
                // SAFETY: this survivor's live communicator, idle under the
                // meeting; each survivor calls once, on its own thread.
                unsafe { backend.shrink(communicator, &exclude, patience) }
            };
            // SAFETY: shrinking leaves no work on any stream.
            unsafe { clients[rank].with_backend_mut(shrink) }.and_then(|s| s)
        });
        let mut mine = Vec::with_capacity(shrunk.len());
        for communicator in shrunk {
            match communicator {
                Ok(Some(communicator)) => mine.push(Arc::new(communicator)),
                Ok(None) => return None,
                Err(error) => {
                    tracing::warn!("the library's shrink failed ({error}); joining anew");
                    return None;
                }
            }
        }
        let streams = match communication_streams(clients) {
            Ok(streams) => streams,
            Err(error) => {
                tracing::warn!("no communication stream after the shrink ({error})");
                return None;
            }
        };
        Some(Communicators {
            first: 0,
            ranks: mine.len(),
            mine,
            streams,
            aborted: AtomicBool::new(false),
        })
    }
}

impl<B: DeviceCollectives> Mover<B> for Communicators<B> {
    fn issue(
        &self,
        rank: usize,
        client: &Client<B>,
        (call, round): (Call, RecordedRound),
        input: Slice<'_>,
        output: Slice<'_>,
    ) -> Result<Option<Box<dyn watchdog::Part>>> {
        let communicator = &self.mine[rank - self.first];
        let ranks = self.ranks;
        let recording = client.capture_state() == CaptureState::Recording;
        let comm = self.streams.get(rank - self.first).filter(|_| !recording);
        let on: &Client<B> = comm.map_or(client, |comm| comm);
        on.issue_collective(
            (call.name(), Some(round)),
            (input, call.reads_input_of(rank)),
            output,
            |backend, stream, input, output| {
                let call = DeviceCall {
                    call,
                    input,
                    output,
                    rank,
                    ranks,
                };
                // SAFETY: this rank's communicator; the server resolved the
                // ranges; the ranks agreed on this call before any issued.
                unsafe { backend.collective(communicator, stream, &call) }
            },
        )?;
        if comm.is_none() {
            return Ok(None);
        }
        Ok(Some(Box::new(InFlight::<B> {
            pending: Some(on.watch()?),
            client: on.clone(),
            communicator: communicator.clone(),
        })))
    }

    fn watch_replay(
        &self,
        rank: usize,
        client: &Client<B>,
    ) -> Result<Option<Box<dyn watchdog::Part>>> {
        if self.streams.is_empty() {
            return Ok(None);
        }
        Ok(Some(Box::new(InFlight::<B> {
            pending: Some(client.watch()?),
            client: client.clone(),
            communicator: self.mine[rank - self.first].clone(),
        })))
    }

    fn replay(&self, rank: usize, replay: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        // SAFETY: this rank's communicator, joined on a `B`.
        unsafe { B::replaying(&self.mine[rank - self.first], replay) }
    }

    fn abort_all(&self) {
        self.aborted.store(true, Ordering::Release);
        for communicator in &self.mine {
            // SAFETY: every communicator here was joined on a `B`.
            unsafe { B::abort(communicator) };
        }
    }

    fn break_off(&self) {
        if !self.every_rank_here() {
            self.abort_all();
        }
    }

    fn regroup(
        &self,
        survivors: &[usize],
        clients: &[Client<B>],
        deadline: Duration,
    ) -> Result<Box<dyn Mover<B>>> {
        // The meeting keeps the deadline; this guards a broken contract.
        let patience = deadline.max(super::DEFAULT_DEADLINE);
        if let Some(shrunk) = self.shrink(survivors, clients, patience) {
            return Ok(Box::new(shrunk));
        }
        Ok(Box::new(join_all::<B>(clients, deadline)?))
    }
}

/// Every one of `clients` joins one new communicator, each on its own
/// thread; the first failed join, or no library, is the error.
fn join_all<B: DeviceCollectives>(
    clients: &[Client<B>],
    deadline: Duration,
) -> Result<Communicators<B>> {
    let identity = B::identity()?;
    let ranks = clients.len();
    // The meeting keeps the deadline; this only guards a broken contract.
    let patience = deadline.max(super::DEFAULT_DEADLINE);
    let joined: Vec<Result<B::Communicator>> = per_rank(ranks, |rank| {
        let join = |backend: &mut B| {
            // SAFETY: each rank joins once, on its own thread and device.
            unsafe { backend.join(&identity, rank, ranks, patience) }
        };
        // SAFETY: joining leaves no work on any stream.
        unsafe { clients[rank].with_backend_mut(join) }.and_then(|j| j)
    });
    let mut mine = Vec::with_capacity(ranks);
    for communicator in joined {
        mine.push(Arc::new(communicator?));
    }
    Ok(Communicators {
        first: 0,
        mine,
        streams: communication_streams(clients)?,
        ranks,
        aborted: AtomicBool::new(false),
    })
}

/// A communication stream per device: a round there overlaps later compute.
fn communication_streams<B: Backend>(clients: &[Client<B>]) -> Result<Vec<LentStream<B>>> {
    clients.iter().map(Client::lend_stream).collect()
}

/// One rank's part on its communication stream, as the watchdog polls it.
struct InFlight<B: DeviceCollectives> {
    /// The communication stream's client.
    client: Client<B>,
    /// A wait on the stream's work up to the part.
    pending: Option<PendingWait<B>>,
    communicator: Arc<B::Communicator>,
}

impl<B: DeviceCollectives> watchdog::Part for InFlight<B> {
    fn finished(&mut self) -> Result<bool> {
        let Some(pending) = &self.pending else {
            return Ok(true);
        };
        // SAFETY: this backend's waiter, from `watch`; only `end` ends it.
        let done = pending.finished_by(std::time::Instant::now(), |w| unsafe { B::finished(w) })?;
        // Health after the part: an abort also ends it, its bytes partial.
        // SAFETY: the communicator was joined on a `B`.
        unsafe { B::health(&self.communicator) }.map(|()| done)
    }

    fn end(&mut self, waited: Result<()>) {
        if let Some(pending) = self.pending.take() {
            // What the wait surfaced is settled on the stream.
            let _ = self.client.end_watch(pending, waited);
        }
    }
}

impl<B: DeviceCollectives> Group<B> {
    /// A group whose bytes move through the backend's library
    /// ([`device`](crate::collective::device)).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); [`Error::BackendUnavailable`]; the library's refusal.
    pub fn over_device(clients: Vec<Client<B>>, deadline: Duration) -> Result<Self> {
        Self::check_clients(&clients)?;
        let device: Box<dyn Mover<B>> = Box::new(join_all::<B>(&clients, deadline)?);
        Ok(Self::over(clients, deadline, Some(device)))
    }

    /// [`over_device`](Self::over_device) draining each rank's stream before
    /// a round, as before communication streams; for the `ddp_step` bench.
    ///
    /// # Errors
    ///
    /// As [`over_device`](Self::over_device).
    #[doc(hidden)]
    pub fn over_device_draining(clients: Vec<Client<B>>, deadline: Duration) -> Result<Self> {
        Self::check_clients(&clients)?;
        let mut communicators = join_all::<B>(&clients, deadline)?;
        communicators.streams.clear();
        let device: Box<dyn Mover<B>> = Box::new(communicators);
        let mut group = Self::over(clients, deadline, Some(device));
        if let Some(shared) = Arc::get_mut(&mut group.shared) {
            shared.draining = true;
        }
        Ok(group)
    }
}

impl<B: Backend> Rank<B> {
    /// Whether this rank's input can be sent, from its claims at submission;
    /// a fault still in flight reaches the round through the watchdog.
    pub(super) fn ready(&self, input: Slice<'_>, recording: bool) -> Input {
        let client = self.client();
        readiness(self.drained(recording, &[input]), || client.check(&[input]))
    }

    /// Drain the rank's stream where the group drains before every round
    /// ([`Group::over_device_draining`]), the schedule rounds had before.
    pub(super) fn drained(&self, recording: bool, buffers: &[Slice<'_>]) -> Result<()> {
        if self.shared.draining && !recording {
            self.client().sync_buffers(buffers)
        } else {
            Ok(())
        }
    }

    /// Issue an agreed round's call; a part on a communication stream is
    /// left to the watchdog.
    pub(super) fn issue(&self, kind: Call, input: Slice<'_>, output: Slice<'_>) -> Result<()> {
        let Some(device) = &self.shared.device else {
            return Err(Error::internal(
                "a round agreed for a device transport in a host-staged group",
            ));
        };
        let round = self.recorded_round();
        let writes = Writes::Output(output.buffer.clone(), output.range);
        let issued = self.fly((round.round, kind.name()), writes, || {
            device.issue(self.rank, self.client(), (kind, round), input, output)
        });
        let recorded = self.client().capture_state() == CaptureState::Recording;
        let len = input.range.end.saturating_sub(input.range.start);
        let call = (Kind::Call(kind), len, round.round);
        self.after_issue(call, issued, Written::Output(output), recorded)
    }

    /// The ranks meet once: a failed issue fails its round in flight, and a
    /// peer may return first, its output claimed (rules 47, 49). In one
    /// process a recorded round meets again, as a draining group's does.
    pub(super) fn after_issue(
        &self,
        (kind, len, round): (Kind, u64, u64),
        issued: Result<()>,
        written: Written<'_>,
        recorded: bool,
    ) -> Result<()> {
        if (recorded && self.shared.ballot.is_none()) || self.shared.draining {
            self.settle(kind, len, issued, written)?;
        } else if let Err(cause) = issued {
            let seat = (self.rank, round);
            let error = super::round::blame(kind.name(), seat, self.shared.deadline, cause);
            self.shared.fail_in_flight(round, &error);
        }
        self.claim_if_failed_in_flight(round, written)
    }

    /// Issue this rank's part of round `round` with `issue`, remembered as
    /// in flight first; a part it returns is watched, else it has landed.
    pub(super) fn fly(
        &self,
        (round, collective): (u64, &'static str),
        writes: Writes,
        issue: impl FnOnce() -> Result<Option<Box<dyn watchdog::Part>>>,
    ) -> Result<()> {
        let flight = Flight {
            round,
            rank: self.rank,
            client: self.client().clone(),
            mark: self.client().in_flight_mark(),
            writes,
            issuing: true,
        };
        match self.shared.take_off(flight).and_then(|()| issue()) {
            Ok(Some(part)) => {
                self.shared.issued(self.rank, round);
                self.shared.watch((self.rank, round, collective), part);
                Ok(())
            }
            Ok(None) => {
                self.shared.landed(self.rank, round);
                Ok(())
            }
            Err(error) => {
                self.shared.landed(self.rank, round);
                Err(error)
            }
        }
    }

    /// A round failing in flight may have claimed this rank's part before
    /// its write landed over the claim: claim again.
    pub(super) fn claim_if_failed_in_flight(&self, round: u64, written: Written<'_>) -> Result<()> {
        match self.shared.failed_in_flight(round) {
            None => Ok(()),
            Some(cause) => {
                self.claim(written, cause.clone())?;
                Err(cause)
            }
        }
    }

    /// Meet again after an issued round: if any call failed, every output
    /// carries the failure and the group breaks.
    pub(super) fn settle(
        &self,
        kind: Kind,
        len: u64,
        issued: Result<()>,
        written: Written<'_>,
    ) -> Result<()> {
        let recorded = self.client().capture_state() == CaptureState::Recording;
        let status = match issued {
            Ok(()) => Input::Ready,
            Err(cause) => {
                let (first, round) = {
                    let mut state = self.shared.state.lock();
                    let first = state.first_failed.is_none();
                    state.first_failed.get_or_insert(self.rank);
                    let round = state.rounds.last(self.rank);
                    if first && state.broken.is_none() {
                        // Marked before the abort, so the watchdog never
                        // reports the abort as a peer's own failure.
                        let error = super::round::issue_failed(
                            kind.name(),
                            round,
                            self.rank,
                            cause.clone(),
                        );
                        state.broken = Some(Arc::new(error));
                        state.failed_from = Some(state.failed_from.map_or(round, |f| f.min(round)));
                        self.shared.changed.notify_all();
                    }
                    (first, round)
                };
                // Release peers waiting inside the library first.
                self.shared.abort_after_claims(round);
                Input::IssueFailed(cause, first)
            }
        };
        let part = Part {
            kind,
            len,
            epoch: self.shared.epoch,
            recorded,
            input: status,
        };
        match &*self.meet_or_claim(part, written)? {
            Outcome::Agreed => Ok(()),
            Outcome::Failed(error) | Outcome::Refused(error) => {
                self.claim(written, error.clone())?;
                Err(error.clone())
            }
            Outcome::Written(_) => Err(Error::internal(
                "a device transport's second meeting computed bytes",
            )),
        }
    }
}

/// A rank's stream wait and input check; a refusal is the rank's own mistake.
pub(super) fn readiness(waited: Result<()>, check: impl FnOnce() -> Result<()>) -> Input {
    if let Err(refused) = waited
        && is_refusal(&refused)
    {
        return Input::Refused(format!("could not read its input: {refused}"));
    }
    match check() {
        Ok(()) => Input::Ready,
        Err(refused) if is_refusal(&refused) => {
            Input::Refused(format!("could not read its input: {refused}"))
        }
        Err(failed) => Input::Failed(failed),
    }
}

impl<B: Backend> Rank<B> {
    /// Claim what this rank's round writes with `error` (rule 21).
    pub(super) fn claim(&self, written: Written<'_>, error: Error) -> Result<()> {
        match written {
            Written::Output(output) => self.client().fail_writing(&[output], error),
            Written::Graph(graph) => self.client().fail_graph(graph, error),
        }
    }

    /// The round this rank met last, as a capture window records it.
    pub(super) fn recorded_round(&self) -> RecordedRound {
        RecordedRound {
            group: self.shared.id,
            round: self.shared.state.lock().rounds.last(self.rank),
        }
    }
}
