//! Point-to-point: one rank's bytes to another, or their failure, never
//! garbage (rules 41, 42). In one process a send leaves them in the
//! receiver's mailbox, and a silent party is [`CollectiveError::Missing`];
//! across processes ([`Rank::join`]) headers go first (`remote.rs`).

use std::collections::VecDeque;
use std::time::Instant;

use super::device::{Direction, readiness};
use super::remote::Ballot;
use super::round::{Input, Kind, Part};
use super::{CollectiveError, Rank, is_refusal};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::handle::Slice;

/// What a send leaves for its receiver.
pub(super) enum Parcel {
    Bytes(Vec<u8>),
    /// The sender's bytes could not be read: what the read answered.
    Failed(Error),
}

/// How many untaken parcels one sender may leave, bounding its memory.
pub const MAILBOX_PARCELS: usize = 256;

/// How many bytes those parcels may hold; one larger parcel still goes.
pub const MAILBOX_BYTES: usize = 256 << 20;

/// One sender's parcels for one receiver, in the order sent.
#[derive(Default)]
pub(super) struct Mailbox {
    queue: VecDeque<Parcel>,
    queued: usize,
    /// Parcels sent and taken so far, numbering them in errors.
    sent: u64,
    taken: u64,
}

impl<B: Backend> Rank<B> {
    /// Why `peer` cannot be this rank's partner, or `data` its bytes.
    fn p2p_refusal(&self, what: &str, peer: usize, data: Slice<'_>) -> Option<Error> {
        let ranks = self.shared.ranks;
        if peer >= ranks || peer == self.rank {
            return Some(Error::invalid(
                what,
                format!("rank {} named rank {peer} in a group of {ranks}", self.rank),
            ));
        }
        self.client()
            .unusable(data.buffer)
            .map(|why| Error::invalid(what, why))
    }

    /// Send `data`, or its failure, to rank `to`'s next [`recv`](Self::recv).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] or the read's refusal: nothing sent.
    /// [`Error::Collective`]: `InputFailed` (sent), `Missing` for a full
    /// mailbox, a broken group; across processes `Refused` and `Stalled`.
    pub fn send(&self, to: usize, data: Slice<'_>) -> Result<()> {
        self.usable()?;
        if let Some(refused) = self.p2p_refusal("send", to, data) {
            return Err(refused);
        }
        if let Some(ballot) = &self.shared.ballot {
            return self.send_across(ballot.as_ref(), to, data);
        }
        let parcel = match self.client().read(data) {
            Ok(bytes) => Parcel::Bytes(bytes),
            Err(refused) if is_refusal(&refused) => return Err(refused),
            Err(failed) => Parcel::Failed(failed),
        };
        let shared = &*self.shared;
        let size = match &parcel {
            Parcel::Bytes(bytes) => bytes.len(),
            Parcel::Failed(_) => 0,
        };
        let until = Instant::now() + shared.deadline;
        let mut state = shared.state.lock();
        loop {
            if let Some(closed) = shared.closed(&state, self.rank) {
                return Err(closed.refusal());
            }
            let mailbox = state.mail.entry((self.rank, to)).or_default();
            let full = mailbox.queue.len() >= MAILBOX_PARCELS
                || (!mailbox.queue.is_empty() && mailbox.queued + size > MAILBOX_BYTES);
            if !full {
                break;
            }
            if shared.changed.wait_until(&mut state, until).timed_out() {
                // A receiver silent for a deadline is missing.
                let error = CollectiveError::Missing {
                    collective: "send",
                    round: state.mail.get(&(self.rank, to)).map_or(0, |m| m.sent),
                    missing: vec![to],
                    deadline: shared.deadline,
                };
                shared.break_with(&mut state, &error);
                return Err(error.into());
            }
        }
        let mailbox = state.mail.entry((self.rank, to)).or_default();
        let number = mailbox.sent;
        mailbox.sent += 1;
        let failed = match &parcel {
            Parcel::Failed(cause) => Some(cause.clone()),
            Parcel::Bytes(_) => None,
        };
        mailbox.queue.push_back(parcel);
        mailbox.queued += size;
        shared.changed.notify_all();
        match failed {
            None => Ok(()),
            Some(cause) => Err(CollectiveError::InputFailed {
                collective: "send",
                round: number,
                rank: self.rank,
                cause,
            }
            .into()),
        }
    }

    /// Take rank `from`'s next parcel: clean bytes heal `data`, a failure claims it.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`], claiming nothing. [`Error::Collective`]:
    /// `InputFailed` and `Missing` (claimed), `Refused` for another length
    /// (unclaimed), a broken group. The write's own errors.
    pub fn recv(&self, from: usize, data: Slice<'_>) -> Result<()> {
        if let Some(refused) = self.p2p_refusal("recv", from, data) {
            return Err(refused);
        }
        self.usable()?;
        if let Some(ballot) = &self.shared.ballot {
            return self.recv_across(ballot.as_ref(), from, data);
        }
        let shared = &*self.shared;
        let until = Instant::now() + shared.deadline;
        let mut state = shared.state.lock();
        let (number, parcel) = loop {
            if let Some(closed) = shared.closed(&state, self.rank) {
                // Closed while waiting: `data` carries why (rule 42).
                drop(state);
                let error = closed.cause();
                self.client().fail_writing(&[data], error.clone())?;
                return Err(error);
            }
            let mailbox = state.mail.entry((from, self.rank)).or_default();
            if let Some(parcel) = mailbox.queue.pop_front() {
                let number = mailbox.taken;
                mailbox.taken += 1;
                if let Parcel::Bytes(bytes) = &parcel {
                    mailbox.queued -= bytes.len();
                }
                // A sender may wait for room in the mailbox.
                shared.changed.notify_all();
                break (number, parcel);
            }
            if shared.changed.wait_until(&mut state, until).timed_out()
                && state
                    .mail
                    .get(&(from, self.rank))
                    .is_none_or(|m| m.queue.is_empty())
            {
                let number = state.mail.get(&(from, self.rank)).map_or(0, |m| m.taken);
                let error = CollectiveError::Missing {
                    collective: "recv",
                    round: number,
                    missing: vec![from],
                    deadline: shared.deadline,
                };
                shared.break_with(&mut state, &error);
                drop(state);
                let error: Error = error.into();
                self.client().fail_writing(&[data], error.clone())?;
                return Err(error);
            }
        };
        drop(state);
        let len = data.range.end.saturating_sub(data.range.start);
        match parcel {
            Parcel::Bytes(bytes) if bytes.len() as u64 != len => Err(CollectiveError::Refused {
                collective: "recv",
                round: number,
                rank: from,
                why: format!(
                    "sent {} bytes where rank {} receives {len}",
                    bytes.len(),
                    self.rank
                ),
            }
            .into()),
            Parcel::Bytes(bytes) => self.client().write(data, &bytes),
            Parcel::Failed(cause) => self.claim_sent_failure(data, (from, number), cause),
        }
    }
}

impl<B: Backend> Rank<B> {
    /// A send carried `cause`: `data` carries it, naming the sender (rule 48).
    fn claim_sent_failure(
        &self,
        data: Slice<'_>,
        (from, number): (usize, u64),
        cause: Error,
    ) -> Result<()> {
        let error: Error = CollectiveError::InputFailed {
            collective: "send",
            round: number,
            rank: from,
            cause,
        }
        .into();
        self.client().fail_writing(&[data], error.clone())?;
        Err(error)
    }

    fn next_transfer(&self, from: usize, to: usize) -> u64 {
        let mut state = self.shared.state.lock();
        let mailbox = state.mail.entry((from, to)).or_default();
        let number = if from == self.rank {
            mailbox.sent
        } else {
            mailbox.taken
        };
        if from == self.rank {
            mailbox.sent += 1;
        } else {
            mailbox.taken += 1;
        }
        number
    }

    /// A send across processes: headers, then clean bytes by `ncclSend`.
    fn send_across(&self, ballot: &dyn Ballot<B>, to: usize, data: Slice<'_>) -> Result<()> {
        let client = self.client();
        let input = readiness(client.sync_buffers(&[data]), || client.check(&[data]));
        if let Input::Refused(why) = input {
            return Err(Error::refused(why));
        }
        let number = self.next_transfer(self.rank, to);
        let len = data.range.end.saturating_sub(data.range.start);
        let failed = match &input {
            Input::Failed(cause) => Some(cause.clone()),
            _ => None,
        };
        let part = Part {
            kind: Kind::Send,
            len,
            epoch: self.shared.epoch,
            recorded: false,
            input,
        };
        let theirs = self.exchange_or_break(ballot, to, number, part)?;
        if let Some(cause) = failed {
            return Err(CollectiveError::InputFailed {
                collective: "send",
                round: number,
                rank: self.rank,
                cause,
            }
            .into());
        }
        let refused = |why: String| {
            Err(CollectiveError::Refused {
                collective: "send",
                round: number,
                rank: to,
                why,
            }
            .into())
        };
        if let Input::Refused(why) = theirs.input {
            return refused(why);
        }
        if theirs.len != len {
            return refused(format!(
                "receives {} bytes where rank {} sends {len}",
                theirs.len, self.rank
            ));
        }
        let moved = ballot.transfer(client, Direction::Send, to, data);
        self.settle_transfer(ballot, (Kind::Send, number), moved, None)
    }

    /// A receive across processes: headers, then a claim or `ncclRecv`.
    fn recv_across(&self, ballot: &dyn Ballot<B>, from: usize, data: Slice<'_>) -> Result<()> {
        let client = self.client();
        let number = self.next_transfer(from, self.rank);
        let len = data.range.end.saturating_sub(data.range.start);
        let part = Part {
            kind: Kind::Recv,
            len,
            epoch: self.shared.epoch,
            recorded: false,
            input: Input::Ready,
        };
        let theirs = match self.exchange_or_break(ballot, from, number, part) {
            Ok(theirs) => theirs,
            Err(error) => {
                client.fail_writing(&[data], error.clone())?;
                return Err(error);
            }
        };
        match theirs.input {
            Input::Failed(cause) => self.claim_sent_failure(data, (from, number), cause),
            _ if theirs.len != len => Err(CollectiveError::Refused {
                collective: "recv",
                round: number,
                rank: from,
                why: format!(
                    "sent {} bytes where rank {} receives {len}",
                    theirs.len, self.rank
                ),
            }
            .into()),
            _ => {
                let moved = ballot.transfer(client, Direction::Recv, from, data);
                self.settle_transfer(ballot, (Kind::Recv, number), moved, Some(data))
            }
        }
    }

    /// [`Ballot::exchange`]; a late peer breaks the group.
    fn exchange_or_break(
        &self,
        ballot: &dyn Ballot<B>,
        peer: usize,
        number: u64,
        part: Part,
    ) -> Result<Part> {
        ballot
            .exchange((self.rank, number), peer, part, self.shared.patience())
            .map_err(|error| {
                self.shared
                    .break_with(&mut self.shared.state.lock(), &error);
                error.into()
            })
    }

    /// Wait for an issued transfer; a failed or late one breaks the group.
    fn settle_transfer(
        &self,
        ballot: &dyn Ballot<B>,
        (kind, number): (Kind, u64),
        moved: Result<()>,
        written: Option<Slice<'_>>,
    ) -> Result<()> {
        let patience = self.shared.patience();
        let (deadline, until) = (
            patience.deadline,
            std::time::Instant::now() + patience.deadline,
        );
        let missing = || patience.missing((kind.name(), number), until);
        let error = match moved.and_then(|()| ballot.settle(self.client(), until, &missing)) {
            Ok(true) => return Ok(()),
            Ok(false) => CollectiveError::Stalled {
                collective: kind.name(),
                round: number,
                deadline,
            },
            Err(cause) => super::round::blame(kind.name(), (self.rank, number), deadline, cause),
        };
        self.shared
            .break_with(&mut self.shared.state.lock(), &error);
        let error: Error = error.into();
        if let Some(data) = written {
            self.client().fail_writing(&[data], error.clone())?;
        }
        Err(error)
    }
}
