//! A device transport for collectives: the bytes move on the devices
//! (NCCL, RCCL); the decision about them stays where it is.
//!
//! Host staging moves every byte twice over the bus. A backend with a
//! collective library implements [`DeviceCollectives`], and
//! [`Group::over_device`](super::Group::over_device) runs rounds through
//! it. The order of things does not change:
//!
//! 1. **Every rank still decides before data moves.** A rank waits for its
//!    stream, checks its input without reading it, and meets its peers.
//!    Only when every input is clean does any rank call the library. A
//!    mismatched call never reaches it, where NCCL would hang or overrun.
//! 2. **The library's call is device work like any other.** It is issued
//!    through the server on the rank's stream ([`Site::Collective`]), and
//!    a later fault lands on its output as on any launch's.
//! 3. **A call that fails after the ranks agreed breaks the group.** Its
//!    peers wait inside the library for it, so the failing rank aborts
//!    every communicator (`ncclCommAbort`). Later calls get
//!    [`CollectiveError::Broken`](super::CollectiveError::Broken) (rule 43).
//!
//! [`Site::Collective`]: crate::Site::Collective

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::round::{Input, Kind, Outcome, Part, Written};
use super::{Call, Group, Rank, is_refusal, per_rank};
use crate::backend::Backend;
use crate::capture::{CaptureState, RecordedRound};
use crate::client::Client;
use crate::error::{Error, Result};
use crate::handle::Slice;

/// A backend whose devices run collectives themselves, through the vendor's
/// library: an `unsafe` contract, as [`Backend`]'s device calls are, which
/// only the group (through its clients' servers) calls.
pub trait DeviceCollectives: Backend {
    /// One rank's membership of a communicator. Dropping it releases the
    /// library's resources (`ncclCommDestroy`); it is shared between the
    /// rank that calls through it and a peer that may abort it.
    type Communicator: Send + Sync + 'static;

    /// What every rank of one communicator must be given, made once
    /// (`ncclGetUniqueId`) and passed to every rank — by a launcher, out of
    /// band, where the ranks are separate processes.
    type Identity: Clone + Send + Sync + 'static;

    /// A new identity.
    ///
    /// # Errors
    ///
    /// [`Error::BackendUnavailable`] where the library is not installed.
    fn identity() -> Result<Self::Identity>;

    /// Join the communicator `identity` names as rank `rank` of `ranks`,
    /// on this backend's device. Blocks until every rank joined, or
    /// `patience` passed. `patience` is also the longest any later call
    /// through the communicator waits on the host for its peers (the
    /// library's, to take a call; a transport whose calls block, to finish
    /// one). A join or call that gave up waiting, or found its
    /// communicator aborted by a peer, answers [`CollectiveError::Stalled`](super::CollectiveError::Stalled),
    /// which a rank across processes reports as its peers' absence rather
    /// than its own failure.
    ///
    /// # Safety
    ///
    /// Every rank of the communicator is called with the same identity and
    /// `ranks`, each rank once, each on a thread of its own (or in its own
    /// process), and no rank's device is another's.
    unsafe fn join(
        &mut self,
        identity: &Self::Identity,
        rank: usize,
        ranks: usize,
        patience: Duration,
    ) -> Result<Self::Communicator>;

    /// Issue `call` on `stream`, through `communicator`. On a stream that
    /// is recording a capture, record it instead (NCCL and RCCL capture
    /// their kernels): each replay of the graph then makes the call, as the
    /// communicator's next.
    ///
    /// # Safety
    ///
    /// `communicator` is one this backend joined; `stream`, `call.input`
    /// and `call.output` are this backend's and alive, their ranges inside
    /// them; every rank of the communicator issues the same call (kind,
    /// element, operation, root, length) as its next one, with output
    /// lengths as the call requires ([`Call`]'s rules, which the group
    /// checked). A recorded call: every rank records it, and the ranks
    /// replay their graphs together, each replay as their next call (the
    /// group's [`Rank::replay`](super::Rank::replay) does both).
    unsafe fn collective(
        &mut self,
        communicator: &Self::Communicator,
        stream: &mut Self::Stream,
        call: &DeviceCall<'_, Self::Memory>,
    ) -> Result<()>;

    /// Issue this rank's half of a transfer with `call.peer` on `stream`,
    /// through `communicator` (NCCL's `ncclSend` or `ncclRecv`): how ranks
    /// in separate processes move point-to-point bytes
    /// ([`Rank::send`](super::Rank::send) across processes).
    ///
    /// # Safety
    ///
    /// `communicator` is one this backend joined; `stream` and
    /// `call.data` are this backend's and alive, the range inside the
    /// memory; `stream` is not recording; the peer issues the opposite
    /// half, of the same length, as its next transfer with this rank (the
    /// ranks exchanged headers and agreed).
    unsafe fn point_to_point(
        &mut self,
        communicator: &Self::Communicator,
        stream: &mut Self::Stream,
        call: &DeviceTransfer<'_, Self::Memory>,
    ) -> Result<()>;

    /// Abort `communicator`: calls waiting in it return, and it takes no
    /// more. Called from any thread, as often as need be.
    ///
    /// # Safety
    ///
    /// `communicator` came from [`join`](Self::join) on a backend of this
    /// type.
    unsafe fn abort(communicator: &Self::Communicator);

    /// This rank's communicator of the survivors of `communicator`, once
    /// the ranks `exclude` (ascending) left it: the library's own shrink
    /// (NCCL's `ncclCommShrink`, from 2.27), which keeps the connections
    /// among the survivors instead of setting every one up again. Its rank
    /// in the result is its old rank less the excluded ranks below it.
    /// `Ok(None)` where the library has no shrink: the group then joins a
    /// fresh identity ([`join`](Self::join)), which this default does for
    /// every library.
    ///
    /// # Safety
    ///
    /// `communicator` came from [`join`](Self::join) on this backend (or
    /// from this call) and was not aborted; no call through it is in
    /// flight; every rank of it that is not excluded calls this once, with
    /// the same `exclude`, each on a thread of its own, and no excluded
    /// rank does.
    ///
    /// # Errors
    ///
    /// What the library answered, or [`CollectiveError::Stalled`](super::CollectiveError::Stalled) when a
    /// survivor did not come within `patience`.
    unsafe fn shrink(
        &mut self,
        communicator: &Self::Communicator,
        exclude: &[usize],
        patience: Duration,
    ) -> Result<Option<Self::Communicator>> {
        let _ = (communicator, exclude, patience);
        Ok(None)
    }

    /// Whether the work `waiter` covers has finished, without blocking:
    /// how a rank whose peers live in other processes waits for a call
    /// with a deadline ([`Rank::join`](super::Rank::join)), where
    /// [`Backend::wait`] would block for as long as a missing peer keeps
    /// the library's kernel waiting.
    ///
    /// # Safety
    ///
    /// As [`Backend::wait`]: `waiter` came from this backend's
    /// [`Backend::begin_wait`] and has not been ended.
    ///
    /// # Errors
    ///
    /// A failure of the covered work the device reports, as
    /// [`Backend::wait`] would.
    unsafe fn finished(waiter: &Self::Waiter) -> Result<bool>;

    /// Whether `communicator` still works: a peer's abort, or a failed
    /// link to one, answers [`CollectiveError::Stalled`](super::CollectiveError::Stalled) (NCCL's
    /// `ncclCommGetAsyncError`). Asked while a rank across processes waits
    /// for a call, which will then not complete.
    ///
    /// # Safety
    ///
    /// As [`abort`](Self::abort).
    ///
    /// # Errors
    ///
    /// As above; what the library answered.
    unsafe fn health(communicator: &Self::Communicator) -> Result<()>;
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

/// One rank's half of a point-to-point transfer, resolved to device
/// memory.
#[derive(Debug)]
pub struct DeviceTransfer<'a, M> {
    /// Send or receive.
    pub direction: Direction,
    /// The other rank.
    pub peer: usize,
    /// This rank's buffer: its memory and the byte range in it.
    pub data: (&'a M, std::ops::Range<u64>),
}

/// How an agreed round's bytes move for a group over a device transport:
/// the one thing host staging does differently, erased so that a
/// [`Group<B>`](super::Group) needs no more than `B: Backend`.
pub(super) trait Mover<B: Backend>: Send + Sync {
    /// Issue rank `rank`'s part of `call`, round `round` of its group,
    /// through its client (recorded, where its stream records).
    fn issue(
        &self,
        rank: usize,
        client: &Client<B>,
        call: (Call, RecordedRound),
        input: Slice<'_>,
        output: Slice<'_>,
    ) -> Result<()>;

    /// Abort every rank's communicator.
    fn abort_all(&self);

    /// The group broke because a rank never came to a round: nobody
    /// issued it, so no rank waits inside the library. Where every rank is
    /// in this process, the communicators stay as they are, for the
    /// survivors' shrink ([`regroup`](Self::regroup)); where peers live in
    /// other processes the absent one may be dead, and its communicators
    /// are aborted (the library's way to drop a peer that will not answer).
    fn break_off(&self);

    /// The transport of a new membership epoch over `clients`, its ranks
    /// in order (`collective/membership.rs`): `survivors` are the old ranks
    /// of its first members, any member after them a newcomer. Every
    /// member gets its communicator, each on a thread of its own, before
    /// the change is decided on any rank: by the library's shrink where it
    /// has one, no one is new and the old communicators are intact, else
    /// by joining a fresh identity.
    ///
    /// # Errors
    ///
    /// What the library answered to a member's join: no member gets the
    /// new epoch.
    fn regroup(
        &self,
        survivors: &[usize],
        clients: &[Client<B>],
        deadline: Duration,
    ) -> Result<Box<dyn Mover<B>>>;
}

/// This process's ranks' communicators of one group: every rank's, or —
/// for a rank whose peers live in other processes — its own.
pub(super) struct Communicators<B: DeviceCollectives> {
    /// The rank `mine[0]` is.
    pub(super) first: usize,
    pub(super) mine: Vec<Arc<B::Communicator>>,
    /// How many ranks the group has.
    pub(super) ranks: usize,
    /// Set once [`Mover::abort_all`] aborted them: the library can shrink
    /// none of them then.
    pub(super) aborted: AtomicBool,
}

impl<B: DeviceCollectives> Communicators<B> {
    /// Every rank's communicator is here: the group lives in this process.
    fn every_rank_here(&self) -> bool {
        self.first == 0 && self.mine.len() == self.ranks
    }

    /// The survivors' communicators by the library's shrink, each survivor
    /// on a thread of its own: `None` where that cannot be (a communicator
    /// aborted, a rank in another process, a newcomer, a library without a
    /// shrink) or the library refused it, which the caller answers by
    /// joining a fresh identity.
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
                // SAFETY: the communicator is this survivor's, joined on
                // this backend and not aborted (checked above, under the
                // meeting every rank of the group is in: no call is in
                // flight); every survivor calls this once, with the same
                // `exclude`, on a thread of its own (`per_rank`), and no
                // excluded rank does.
                unsafe { backend.shrink(communicator, &exclude, patience) }
            };
            // SAFETY: shrinking makes a library object the core does not
            // track, and leaves no work on any stream.
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
        Some(Communicators {
            first: 0,
            ranks: mine.len(),
            mine,
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
    ) -> Result<()> {
        let communicator = &self.mine[rank - self.first];
        let ranks = self.ranks;
        client.issue_collective(
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
                // SAFETY: the communicator is this rank's, joined on this
                // backend (`Group::over_device`); the server resolved both
                // ranges inside their live memory and hands its own stream;
                // every rank issues this same call as its next, because the
                // ranks met and agreed on it (`decide`) before any issued, and
                // a group issues rounds in order.
                unsafe { backend.collective(communicator, stream, &call) }
            },
        )
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
        // The ranks meet in memory before every call, and that meeting
        // keeps the deadline; the library's own patience only guards
        // against a broken contract (as in `join_all`).
        let patience = deadline.max(super::DEFAULT_DEADLINE);
        if let Some(shrunk) = self.shrink(survivors, clients, patience) {
            return Ok(Box::new(shrunk));
        }
        Ok(Box::new(join_all::<B>(clients, deadline)?))
    }
}

/// Every one of `clients` joins one new communicator, rank `i` being
/// `clients[i]`, each on a thread of its own.
///
/// # Errors
///
/// [`Error::BackendUnavailable`] where the library is not installed; the
/// first member's join that failed.
fn join_all<B: DeviceCollectives>(
    clients: &[Client<B>],
    deadline: Duration,
) -> Result<Communicators<B>> {
    let identity = B::identity()?;
    let ranks = clients.len();
    // The ranks meet in memory before every call, and that meeting
    // keeps the deadline; the transport's own patience only guards
    // against a broken contract, and must not fail a join or a call
    // that a loaded machine merely scheduled late.
    let patience = deadline.max(super::DEFAULT_DEADLINE);
    let joined: Vec<Result<B::Communicator>> = per_rank(ranks, |rank| {
        let join = |backend: &mut B| {
            // SAFETY: every rank joins this one identity with the same
            // count, once, on a thread of its own (`per_rank`); the group
            // checked that every rank's server is distinct.
            unsafe { backend.join(&identity, rank, ranks, patience) }
        };
        // SAFETY: joining makes a library object the core does not
        // track, and leaves no work on any stream.
        unsafe { clients[rank].with_backend_mut(join) }.and_then(|j| j)
    });
    let mut mine = Vec::with_capacity(ranks);
    for communicator in joined {
        mine.push(Arc::new(communicator?));
    }
    Ok(Communicators {
        first: 0,
        mine,
        ranks,
        aborted: AtomicBool::new(false),
    })
}

impl<B: DeviceCollectives> Group<B> {
    /// A group of `clients`, rank `i` being `clients[i]`, whose collectives
    /// move their bytes on the devices through the backend's library (NCCL
    /// for CUDA): every rank joins one communicator, each on a thread of its
    /// own. Each round decides as a host-staged one does, before any byte
    /// moves ([`device`](crate::collective::device)).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); [`Error::BackendUnavailable`] where the
    /// library is not installed; the library's refusal to make the
    /// communicator (two ranks on one device, say).
    pub fn over_device(clients: Vec<Client<B>>, deadline: Duration) -> Result<Self> {
        Self::check_clients(&clients)?;
        let device: Box<dyn Mover<B>> = Box::new(join_all::<B>(&clients, deadline)?);
        Ok(Self::over(clients, deadline, Some(device)))
    }
}

impl<B: Backend> Rank<B> {
    /// Over a device transport, whether this rank's input can be sent:
    /// the stream's work waited for, then the bytes checked, none read.
    /// A recording stream runs nothing until its graph is replayed, and
    /// what its window's work wrote is healed or claimed as it is recorded
    /// (rule 23), so there the check alone decides.
    pub(super) fn ready(&self, input: Slice<'_>, recording: bool) -> Input {
        let client = self.client();
        let waited = if recording {
            Ok(())
        } else {
            client.sync_buffers(&[input])
        };
        readiness(waited, || client.check(&[input]))
    }

    /// Issue an agreed round's call on the device transport, then settle
    /// it (see [`settle`](Self::settle)).
    pub(super) fn issue(&self, kind: Call, input: Slice<'_>, output: Slice<'_>) -> Result<()> {
        let Some(device) = &self.shared.device else {
            return Err(Error::internal(
                "a round agreed for a device transport in a host-staged group",
            ));
        };
        let round = self.recorded_round();
        let issued = device.issue(self.rank, self.client(), (kind, round), input, output);
        let len = input.range.end.saturating_sub(input.range.start);
        self.settle(Kind::Call(kind), len, issued, Written::Output(output))
    }

    /// After this rank issued (or recorded) an agreed round, `issued`
    /// answering how that went: meet again. If any rank's call failed, no
    /// rank's output is trusted (its peers' calls may have been aborted
    /// mid-way), every output carries the failure and the group breaks.
    /// Across processes, wait for the call within the deadline instead.
    pub(super) fn settle(
        &self,
        kind: Kind,
        len: u64,
        issued: Result<()>,
        written: Written<'_>,
    ) -> Result<()> {
        let recorded = self.client().capture_state() == CaptureState::Recording;
        if let Some(ballot) = &self.shared.ballot {
            return self.settle_issued(ballot.as_ref(), (kind, recorded), issued, written);
        }
        let status = match issued {
            Ok(()) => Input::Ready,
            Err(cause) => {
                let first = {
                    let mut state = self.shared.state.lock();
                    let first = state.first_failed.is_none();
                    state.first_failed.get_or_insert(self.rank);
                    first
                };
                // Peers may already wait inside the library for this
                // rank's part: release them before meeting them.
                if let Some(device) = &self.shared.device {
                    device.abort_all();
                }
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

/// What a rank brings from a wait for its stream (`waited`) and a check of
/// its inputs. A wait that fails on work other than the inputs' does not
/// fail them; the check decides. A refusal of either is the rank's own
/// mistake.
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
