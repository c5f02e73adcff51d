//! Point-to-point: one rank's bytes to one other rank, with the failure
//! carried instead of garbage (rules 41, 42 for two ranks).
//!
//! A send reads its bytes and leaves them — or the failure they carry,
//! with its root cause and chain — in the receiver's mailbox for that
//! sender; it does not wait for the receiver. A receive takes the next
//! parcel from that sender, in the order sent, waiting at most the group's
//! deadline: clean bytes are written (and heal), a failure is claimed on
//! the receive's output naming the sending rank, and a sender that never
//! sends fails the receive with [`CollectiveError::Missing`] and breaks
//! the group, as a missing rank does for a collective. The bytes move
//! through the host on every transport (a device transport's library is
//! not called for them).

use std::collections::VecDeque;
use std::time::Instant;

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

/// One sender's parcels for one receiver, in the order sent.
#[derive(Default)]
pub(super) struct Mailbox {
    queue: VecDeque<Parcel>,
    /// Parcels sent and taken so far, numbering them in errors.
    sent: u64,
    taken: u64,
}

impl<B: Backend> Rank<B> {
    /// Why `peer` cannot be this rank's partner, or `data` its bytes.
    fn p2p_refusal(&self, what: &str, peer: usize, data: Slice<'_>) -> Option<Error> {
        let ranks = self.shared.ranks;
        if self.shared.ballot.is_some() {
            return Some(Error::refused(format!(
                "{what} between ranks in separate processes: point-to-point moves its bytes \
                 through this process's memory, which those ranks do not share"
            )));
        }
        if peer >= ranks || peer == self.rank {
            return Some(Error::invalid(
                what,
                format!("rank {} named rank {peer} in a group of {ranks}", self.rank),
            ));
        }
        if data.buffer.server() != self.client().server_id() {
            return Some(Error::invalid(
                what,
                "a buffer of another rank's device".to_owned(),
            ));
        }
        None
    }

    /// Send `data` to rank `to`, whose next [`recv`](Self::recv) from this
    /// rank gets it: the bytes, or — when they carry a failure here, or
    /// their read fails — that failure, which the receive then claims on
    /// its output naming this rank. Returns once the bytes are read.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a rank past the group or this rank,
    /// or a buffer of another device (nothing sent); the read's refusal
    /// (nothing sent); [`Error::Collective`] with `InputFailed` when the
    /// bytes could not be read (the failure was sent); a broken group.
    pub fn send(&self, to: usize, data: Slice<'_>) -> Result<()> {
        if let Some(cause) = self.shared.state.lock().broken.clone() {
            return Err(CollectiveError::Broken { cause }.into());
        }
        if let Some(refused) = self.p2p_refusal("send", to, data) {
            return Err(refused);
        }
        let parcel = match self.client().read(data) {
            Ok(bytes) => Parcel::Bytes(bytes),
            Err(refused) if is_refusal(&refused) => return Err(refused),
            Err(failed) => Parcel::Failed(failed),
        };
        let shared = &*self.shared;
        let mut state = shared.state.lock();
        let mailbox = state.mail.entry((self.rank, to)).or_default();
        let number = mailbox.sent;
        mailbox.sent += 1;
        let failed = match &parcel {
            Parcel::Failed(cause) => Some(cause.clone()),
            Parcel::Bytes(_) => None,
        };
        mailbox.queue.push_back(parcel);
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

    /// Receive into `data` the next parcel rank `from` sent this rank,
    /// waiting at most the group's deadline: its bytes are written (they
    /// heal `data`); a failure it carries is claimed on `data`, naming
    /// `from`, its root cause and chain.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a rank past the group or this rank,
    /// or a buffer of another device (nothing taken, nothing claimed);
    /// [`Error::Collective`]: `InputFailed` (claimed), `Missing` when
    /// nothing came in time (claimed; the group is broken), `Refused` when
    /// the parcel's length is not `data`'s (the parcel is consumed,
    /// nothing claimed), a group broken before the call (nothing claimed)
    /// or while it waited (claimed); the write's own errors.
    pub fn recv(&self, from: usize, data: Slice<'_>) -> Result<()> {
        if let Some(refused) = self.p2p_refusal("recv", from, data) {
            return Err(refused);
        }
        let shared = &*self.shared;
        let until = Instant::now() + shared.deadline;
        let mut state = shared.state.lock();
        if let Some(cause) = state.broken.clone() {
            return Err(CollectiveError::Broken { cause }.into());
        }
        let (number, parcel) = loop {
            if let Some(cause) = state.broken.clone() {
                // Broken while this receive waited: its bytes will not
                // come, so `data` carries why (rule 42).
                drop(state);
                let error: Error = (*cause).clone().into();
                self.client().fail_writing(&[data], error.clone())?;
                return Err(error);
            }
            let mailbox = state.mail.entry((from, self.rank)).or_default();
            if let Some(parcel) = mailbox.queue.pop_front() {
                let number = mailbox.taken;
                mailbox.taken += 1;
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
            Parcel::Failed(cause) => {
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
        }
    }
}
