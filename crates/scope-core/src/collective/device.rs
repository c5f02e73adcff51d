//! A device transport for collectives: the bytes move on the devices
//! (NCCL, RCCL); the decision about them stays where it is.
//!
//! Host staging moves every byte twice over the bus, so a backend with a
//! collective library implements [`DeviceCollectives`]. The order holds:
//!
//! 1. **Every rank decides before data moves.** A mismatched call never
//!    reaches the library, where NCCL would hang or overrun.
//! 2. **The call is device work** on the rank's stream
//!    ([`Site::Collective`]); a later fault lands on its output.
//! 3. **A call that fails after agreement breaks the group.** The failing
//!    rank aborts every communicator, releasing peers waiting inside the
//!    library (rule 43).
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

/// A backend whose devices run collectives through the vendor's library.
///
/// An `unsafe` contract, as [`Backend`]'s is; only the group calls it.
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
    /// until every rank joined.
    ///
    /// `patience` bounds this and every later host wait for peers. Giving
    /// up, or finding the communicator aborted, answers
    /// [`CollectiveError::Stalled`](super::CollectiveError::Stalled).
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
    /// `communicator` is this backend's, and both ranges lie inside live
    /// memory. Every rank issues the same call as its next one.
    /// A recorded call is recorded and replayed by every rank together.
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

    /// Abort `communicator`: waiting calls return. Any thread, any number
    /// of times.
    ///
    /// # Safety
    ///
    /// `communicator` came from [`join`](Self::join) on a backend of this
    /// type.
    unsafe fn abort(communicator: &Self::Communicator);

    /// The survivors' communicator once the ranks `exclude` (ascending)
    /// left (`ncclCommShrink`), keeping their connections.
    ///
    /// `Ok(None)`, the default, makes the group join a fresh identity.
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

    /// Whether `waiter`'s work finished, without blocking: a wait with a
    /// deadline, where a missing peer would block [`Backend::wait`].
    ///
    /// # Safety
    ///
    /// As [`Backend::wait`].
    ///
    /// # Errors
    ///
    /// As [`Backend::wait`].
    unsafe fn finished(waiter: &Self::Waiter) -> Result<bool>;

    /// Whether `communicator` still works (`ncclCommGetAsyncError`).
    ///
    /// # Safety
    ///
    /// As [`abort`](Self::abort).
    ///
    /// # Errors
    ///
    /// [`CollectiveError::Stalled`](super::CollectiveError::Stalled) after a
    /// peer's abort or a failed link.
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

/// How an agreed round's bytes move, erased so a group needs only
/// `B: Backend`.
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

    /// A rank never came to a round. In one process the communicators stay
    /// for a shrink; across processes they are aborted.
    fn break_off(&self);

    /// The transport of a new epoch over `clients`; `survivors` are the
    /// old ranks of its first members.
    ///
    /// It shrinks where it can, else joins a fresh identity.
    ///
    /// # Errors
    ///
    /// What the library answered to a member's join.
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

    /// The survivors' communicators by the library's shrink, or `None`
    /// where it cannot or will not shrink.
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
                // SAFETY: this rank's communicator; the server resolved the
                // ranges; the ranks agreed on this call before any issued.
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
        // The meeting keeps the deadline; this guards a broken contract.
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
        ranks,
        aborted: AtomicBool::new(false),
    })
}

impl<B: DeviceCollectives> Group<B> {
    /// A group of `clients` whose bytes move on the devices through the
    /// backend's library ([`device`](crate::collective::device)).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); [`Error::BackendUnavailable`] without the
    /// library; the library's refusal.
    pub fn over_device(clients: Vec<Client<B>>, deadline: Duration) -> Result<Self> {
        Self::check_clients(&clients)?;
        let device: Box<dyn Mover<B>> = Box::new(join_all::<B>(&clients, deadline)?);
        Ok(Self::over(clients, deadline, Some(device)))
    }
}

impl<B: Backend> Rank<B> {
    /// Whether this rank's input can be sent: waited for, then checked
    /// unread. A recording stream is only checked (rule 23).
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

    /// After an agreed round was issued, meet again. If any rank's call
    /// failed, every output carries the failure and the group breaks.
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
                // Release peers waiting inside the library first.
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

/// A rank's stream wait and input check combined: the check decides, and
/// a refusal is the rank's own mistake.
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
