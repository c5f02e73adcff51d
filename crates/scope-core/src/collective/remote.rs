//! Ranks in separate processes: the meeting moves onto the transport.
//!
//! Ranks in other processes share no memory, and scope adds no wire of its
//! own: the library that moves the bytes (NCCL, RCCL) is the only one. So
//! the meeting becomes a collective too, and the rules stay the same:
//!
//! 1. **A ballot before every round.** Each rank writes its part (the
//!    call, its input's length, and ready, failed or refused) into a
//!    record of [`RECORD`] bytes. The ranks all-gather the records, and
//!    each runs the same decision on them (`round::decide`). It is
//!    torchft's `should_commit` vote, taken by the transport itself.
//! 2. **A ballot is read or refused, never guessed.** A record of another
//!    version, or with a value this build does not know, stands as its
//!    rank's refusal: every rank refuses the round, claiming nothing.
//! 3. **Every wait has the deadline.** Completions are polled
//!    ([`DeviceCollectives::finished`]) without the server's lock. At the
//!    deadline the rank aborts its communicator, its output carries
//!    [`CollectiveError::Stalled`], and its group breaks (rules 42, 43).
//!    The library cannot say which peer is missing, so the error names
//!    none.
//! 4. **A failed call breaks what it can reach.** The failing rank aborts
//!    its own communicator; its peers reach their deadline and break
//!    theirs. No output reads as written.
//! 5. **The price**: one all-gather of [`RECORD`] bytes and a host wait
//!    before each collective, and a host wait after it.
//! 6. **Point-to-point pairs its headers.** Sender and receiver exchange
//!    headers first, so only clean bytes of an agreed length move
//!    (`ncclSend`, `ncclRecv`, rule 48).
//! 7. **Ballots have a stream of their own**, so a ballot is taken while
//!    the rank's stream records a capture (`collective/replay.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::device::{
    Communicators, DeviceCall, DeviceCollectives, DeviceTransfer, Direction, Mover,
};
use super::round::{Input, Kind, Outcome, Part, Written, decide, issue_failed};
use super::{Call, CollectiveError, Element, Rank, Reduce, Shared};
use crate::backend::Backend;
use crate::client::{Client, LentStream};
use crate::error::{Error, Result};
use crate::handle::{Buffer, Slice};

/// The bytes of one rank's ballot: a fixed size, so that every rank's
/// all-gather has the same count. What does not fit of a failure's text is
/// cut, and says so.
pub const RECORD: usize = 1024;

/// Marks a ballot record.
const MAGIC: u32 = 0x5343_4233;

/// The record layout's version: a rank refuses a ballot of another.
const VERSION: u32 = 1;

/// Where the text of a record begins.
const TEXT: usize = 56;

/// A peer's failure as its own process rendered it — the root cause and
/// the chain, as text: what of an [`Error`] crosses processes. A rank's
/// [`CollectiveError::InputFailed`] for a peer's input carries this as its
/// cause ([`Error::external_root`] finds it).
#[derive(Debug, thiserror::Error)]
#[error("{report}")]
pub struct PeerReport {
    /// The failure, as the peer's [`Error`] displayed it.
    pub report: String,
}

/// How the ranks meet when they share no memory, erased so that a
/// [`Shared<B>`] needs no more than `B: Backend`.
pub(super) trait Ballot<B: Backend>: Send + Sync {
    /// Exchange rank `rank`'s `part` of round `round` for every rank's,
    /// waiting at most `deadline`.
    ///
    /// # Errors
    ///
    /// What breaks the group: [`CollectiveError::Stalled`] when the
    /// exchange did not complete in time (the communicator is aborted), or
    /// [`CollectiveError::IssueFailed`] naming this rank when its own part
    /// could not be sent or read.
    fn vote(
        &self,
        seat: (usize, u64),
        part: Part,
        deadline: Duration,
    ) -> std::result::Result<Vec<Part>, CollectiveError>;

    /// Wait until `until` for the work issued so far on `client`'s
    /// stream; `false` when it did not finish in time, after aborting the
    /// communicator (which lets it finish); an error when the communicator
    /// failed meanwhile (a peer aborted: aborted here too).
    fn settle(&self, client: &Client<B>, until: Instant) -> Result<bool>;

    /// Exchange rank `rank`'s `part` of its transfer number `number`
    /// (`seat`) with
    /// rank `peer` — sent first when `part` is a send's, received first
    /// when a receive's, so the two halves pair — for `peer`'s, waiting at
    /// most `deadline`. Errors as [`vote`](Self::vote)'s.
    fn exchange(
        &self,
        seat: (usize, u64),
        peer: usize,
        part: Part,
        deadline: Duration,
    ) -> std::result::Result<Part, CollectiveError>;

    /// Issue this rank's half of the transfer of `data` with `peer` on
    /// `client` (the rank's stream), after the headers agreed.
    fn transfer(
        &self,
        client: &Client<B>,
        direction: Direction,
        peer: usize,
        data: Slice<'_>,
    ) -> Result<()>;
}

/// One rank's ballot boxes: what it sends, and where every rank's lands.
struct Ballots<B: DeviceCollectives> {
    communicator: Arc<B::Communicator>,
    send: Buffer,
    gathered: Buffer,
    ranks: usize,
    /// A stream of the rank's device of the ballots' own: a ballot is
    /// taken, and waited for, while the rank's stream may be recording.
    /// Lent by the server and given back when the rank goes, after the
    /// buffers above (fields drop in order), so joining again spends none.
    client: LentStream<B>,
}

impl<B: DeviceCollectives> Ballots<B> {
    /// Write this rank's record of `part` (round or transfer `number`)
    /// into its send box, the start of a ballot or a header exchange;
    /// when the exchange must be done by.
    fn post(&self, number: u64, part: &Part, deadline: Duration) -> Result<Instant> {
        let until = Instant::now() + deadline;
        self.client.write(self.send.all(), &encode(number, part))?;
        Ok(until)
    }
}

impl<B: DeviceCollectives> Ballot<B> for Ballots<B> {
    fn vote(
        &self,
        (rank, round): (usize, u64),
        part: Part,
        deadline: Duration,
    ) -> std::result::Result<Vec<Part>, CollectiveError> {
        let client = &self.client;
        let kind = part.kind;
        let failed = |cause: Error| blame(kind, (rank, round), deadline, cause);
        let until = self.post(round, &part, deadline).map_err(failed)?;
        let ranks = self.ranks;
        let communicator = &self.communicator;
        client
            .issue_collective(
                ("ballot", None),
                (self.send.all(), true),
                self.gathered.all(),
                |backend, stream, input, output| {
                    let call = DeviceCall {
                        call: Call::AllGather,
                        input,
                        output,
                        rank,
                        ranks,
                    };
                    // SAFETY: the communicator is this rank's, joined on
                    // this backend (`Rank::join`); the server resolved both
                    // ballot buffers, RECORD and RECORD × ranks bytes, as
                    // an all-gather needs; every rank's next call through
                    // the communicator is this round's ballot, since every
                    // collective of a group begins with one and a rank
                    // whose round failed breaks its group and calls no
                    // more.
                    unsafe { backend.collective(communicator, stream, &call) }
                },
            )
            .map_err(failed)?;
        if !self.settle(client, until).map_err(failed)? {
            return Err(CollectiveError::Stalled {
                collective: kind.name(),
                round,
                deadline,
            });
        }
        let gathered = client.read(self.gathered.all()).map_err(failed)?;
        tally(round, &gathered, ranks, (rank, part)).map_err(|()| {
            // A record scope did not write for this round: the exchange
            // ended without every rank's ballot, and the buffer is no vote.
            // SAFETY: the communicator was joined on a `B`.
            unsafe { B::abort(communicator) };
            CollectiveError::Stalled {
                collective: kind.name(),
                round,
                deadline,
            }
        })
    }

    fn exchange(
        &self,
        (rank, number): (usize, u64),
        peer: usize,
        part: Part,
        deadline: Duration,
    ) -> std::result::Result<Part, CollectiveError> {
        let client = &self.client;
        let kind = part.kind;
        let failed = |cause: Error| blame(kind, (rank, number), deadline, cause);
        let until = self.post(number, &part, deadline).map_err(failed)?;
        let header = self.gathered.slice(0..RECORD as u64);
        let send = || self.transfer(client, Direction::Send, peer, self.send.all());
        let recv = || self.transfer(client, Direction::Recv, peer, header);
        let exchanged = if kind == Kind::Send {
            send().and_then(|()| recv())
        } else {
            recv().and_then(|()| send())
        };
        exchanged.map_err(failed)?;
        if !self.settle(client, until).map_err(failed)? {
            return Err(CollectiveError::Stalled {
                collective: kind.name(),
                round: number,
                deadline,
            });
        }
        let record = client.read(header).map_err(failed)?;
        let expected = if kind == Kind::Send {
            Kind::Recv
        } else {
            Kind::Send
        };
        match decode(number, &record) {
            Ok(theirs) if theirs.kind == expected => Ok(theirs),
            _ => {
                // Not the peer's header for this transfer: the exchange
                // ended without it (an abort), or the ranks are out of
                // step; either way nothing here is a header.
                // SAFETY: the communicator was joined on a `B`.
                unsafe { B::abort(&self.communicator) };
                Err(CollectiveError::Stalled {
                    collective: kind.name(),
                    round: number,
                    deadline,
                })
            }
        }
    }

    fn transfer(
        &self,
        client: &Client<B>,
        direction: Direction,
        peer: usize,
        data: Slice<'_>,
    ) -> Result<()> {
        let communicator = &self.communicator;
        let (name, writes) = match direction {
            Direction::Send => ("send", false),
            Direction::Recv => ("recv", true),
        };
        client.issue_transfer(name, (data, writes), |backend, stream, data| {
            let call = DeviceTransfer {
                direction,
                peer,
                data,
            };
            // SAFETY: the communicator is this rank's, joined on this
            // backend (`Rank::join`); the server resolved the buffer and
            // refused a recording stream; the peer issues the opposite
            // half of the same length next with this rank, because the
            // two exchanged headers in this order before any data moved
            // and agreed on the length.
            unsafe { backend.point_to_point(communicator, stream, &call) }
        })
    }

    fn settle(&self, client: &Client<B>, until: Instant) -> Result<bool> {
        client.sync_within(
            until,
            // SAFETY: the communicator was joined on a `B`; the client
            // hands only a waiter its backend's `begin_wait` made and has
            // not ended.
            // Health is asked after the work says finished: a peer's abort
            // also ends the work, with nothing written, and must not read
            // as a completion.
            |waiter| unsafe {
                let finished = B::finished(waiter)?;
                B::health(&self.communicator)?;
                Ok(finished)
            },
            // SAFETY: the communicator was joined on a `B`.
            || unsafe { B::abort(&self.communicator) },
        )
    }
}

/// Why rank `rank`'s round `round` of `kind` failed, when its own call
/// answered `cause`: a transport that gave up waiting for its peers
/// ([`CollectiveError::Stalled`]) says the peers are missing; anything else
/// is this rank's own failure.
pub(super) fn blame(
    kind: Kind,
    (rank, round): (usize, u64),
    deadline: Duration,
    cause: Error,
) -> CollectiveError {
    match &cause {
        Error::Collective(stalled) if matches!(**stalled, CollectiveError::Stalled { .. }) => {
            CollectiveError::Stalled {
                collective: kind.name(),
                round,
                deadline,
            }
        }
        _ => issue_failed(kind.name(), round, rank, cause),
    }
}

/// What a record's text holds between the part it keeps of a long
/// failure's head and the part it keeps of its end.
const CUT: &str = " [… cut …] ";

/// `text` in at most `room` bytes: whole where it fits; else its head and
/// its end, with [`CUT`] between, each cut on a character boundary.
///
/// A failure renders outermost first and its root cause last: a failure
/// passed on through several collectives nests one "rank r's input could
/// not be read" in the next, and what went wrong first is the end of the
/// text. So the middle goes — the hops between — never the end: cutting
/// the tail would keep the hops and lose the root cause the rules promise
/// every rank (rules 41, 49).
fn fit(text: &str, room: usize) -> String {
    if text.len() <= room {
        return text.to_owned();
    }
    if room <= CUT.len() {
        // No room for the mark: the head alone.
        let mut end = room;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        return text[..end].to_owned();
    }
    let keep = room - CUT.len();
    let head = keep / 3;
    let mut start = head;
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = text.len() - (keep - head);
    while !text.is_char_boundary(end) {
        end += 1;
    }
    format!("{}{CUT}{}", &text[..start], &text[end..])
}

/// `part` of round `round` as a ballot record.
fn encode(round: u64, part: &Part) -> Vec<u8> {
    let mut record = vec![0u8; RECORD];
    let mut digest = 0u64;
    let (kind, element, op, root) = match part.kind {
        Kind::Call(Call::AllReduce { element, op }) => (0u8, element, op, 0u32),
        Kind::Call(Call::AllGather) => (1, Element::U32, Reduce::Sum, 0),
        Kind::Call(Call::ReduceScatter { element, op }) => (2, element, op, 0),
        Kind::Call(Call::Broadcast { root }) => (3, Element::U32, Reduce::Sum, root as u32),
        Kind::Call(Call::AllToAll) => (4, Element::U32, Reduce::Sum, 0),
        Kind::Replay { digest: d } => {
            digest = d;
            (5, Element::U32, Reduce::Sum, 0)
        }
        Kind::Send => (6, Element::U32, Reduce::Sum, 0),
        Kind::Recv => (7, Element::U32, Reduce::Sum, 0),
    };
    let element = match element {
        Element::F32 => 0u8,
        Element::I32 => 1,
        Element::U32 => 2,
    };
    let op = match op {
        Reduce::Sum => 0u8,
        Reduce::Prod => 1,
        Reduce::Min => 2,
        Reduce::Max => 3,
        Reduce::Mean => 4,
    };
    let (status, text) = match &part.input {
        Input::Ready | Input::Bytes(_) => (0u32, String::new()),
        Input::Failed(cause) => (1, cause.to_string()),
        Input::Refused(why) => (2, why.clone()),
        Input::IssueFailed(cause, _) => (1, cause.to_string()),
    };
    let text = fit(&text, RECORD - TEXT).into_bytes();
    record[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    record[4..8].copy_from_slice(&[kind, element, op, u8::from(part.recorded)]);
    record[8..12].copy_from_slice(&root.to_le_bytes());
    record[12..20].copy_from_slice(&part.len.to_le_bytes());
    record[20..28].copy_from_slice(&round.to_le_bytes());
    record[28..32].copy_from_slice(&status.to_le_bytes());
    record[32..36].copy_from_slice(&(text.len() as u32).to_le_bytes());
    record[36..44].copy_from_slice(&digest.to_le_bytes());
    record[44..52].copy_from_slice(&part.epoch.to_le_bytes());
    record[52..56].copy_from_slice(&VERSION.to_le_bytes());
    record[TEXT..TEXT + text.len()].copy_from_slice(&text);
    record
}

/// Why a record is not a part.
#[derive(Debug, PartialEq, Eq)]
enum Unread {
    /// Not a ballot of this round: the exchange ended without it (an
    /// abort, say), so it is no vote.
    NoVote,
    /// A ballot of this round this build cannot read: another version,
    /// an unknown call, a truncated record.
    Unreadable(String),
}

/// A rank's record, read in round `round`, as the part it stands for.
fn decode(round: u64, record: &[u8]) -> std::result::Result<Part, Unread> {
    let word = |at: usize| {
        u32::from_le_bytes([record[at], record[at + 1], record[at + 2], record[at + 3]])
    };
    let long = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&record[at..at + 8]);
        u64::from_le_bytes(bytes)
    };
    if record.len() < 28 || word(0) != MAGIC || long(20) != round {
        return Err(Unread::NoVote);
    }
    let unreadable = |why: String| Err(Unread::Unreadable(why));
    if record.len() != RECORD {
        return unreadable(format!(
            "{} bytes where a ballot has {RECORD}",
            record.len()
        ));
    }
    if word(52) != VERSION {
        return unreadable(format!(
            "version {} where this build reads {VERSION}",
            word(52)
        ));
    }
    let element = match record[5] {
        0 => Element::F32,
        1 => Element::I32,
        2 => Element::U32,
        other => return unreadable(format!("element type {other}")),
    };
    let op = match record[6] {
        0 => Reduce::Sum,
        1 => Reduce::Prod,
        2 => Reduce::Min,
        3 => Reduce::Max,
        4 => Reduce::Mean,
        other => return unreadable(format!("reduction {other}")),
    };
    let kind = match record[4] {
        0 => Kind::Call(Call::AllReduce { element, op }),
        1 => Kind::Call(Call::AllGather),
        2 => Kind::Call(Call::ReduceScatter { element, op }),
        3 => Kind::Call(Call::Broadcast {
            root: word(8) as usize,
        }),
        4 => Kind::Call(Call::AllToAll),
        5 => Kind::Replay { digest: long(36) },
        6 => Kind::Send,
        7 => Kind::Recv,
        other => return unreadable(format!("call kind {other}")),
    };
    let len = word(32) as usize;
    if len > RECORD - TEXT {
        return unreadable(format!("{len} bytes of text in a record of {RECORD}"));
    }
    let text = String::from_utf8_lossy(&record[TEXT..TEXT + len]).into_owned();
    let input = match word(28) {
        0 => Input::Ready,
        1 => Input::Failed(Error::external(PeerReport { report: text })),
        2 => Input::Refused(text),
        other => return unreadable(format!("status {other}")),
    };
    Ok(Part {
        kind,
        len: long(12),
        epoch: long(44),
        recorded: record[7] != 0,
        input,
    })
}

/// Every rank's part from the `gathered` records of round `round`, this
/// rank's (`rank`) being `mine`, kept whole. A ballot this build cannot
/// read stands as its rank's refusal, so every rank refuses the round
/// alike, claiming nothing.
///
/// # Errors
///
/// A record that is no vote: the exchange did not complete.
fn tally(
    round: u64,
    gathered: &[u8],
    ranks: usize,
    (rank, mine): (usize, Part),
) -> std::result::Result<Vec<Part>, ()> {
    let mut mine = Some(mine);
    let mut parts = Vec::with_capacity(ranks);
    for r in 0..ranks {
        let record = gathered.get(r * RECORD..).unwrap_or_default();
        let record = &record[..record.len().min(RECORD)];
        let part = match decode(round, record) {
            Err(Unread::NoVote) => return Err(()),
            Err(Unread::Unreadable(why)) => Part {
                kind: mine.as_ref().map_or(Kind::Send, |m| m.kind),
                len: 0,
                epoch: 0,
                recorded: false,
                input: Input::Refused(format!("sent a ballot this rank cannot read: {why}")),
            },
            // This rank's own failure keeps its error whole, not its text.
            Ok(part) if r == rank => mine.take().unwrap_or(part),
            Ok(part) => part,
        };
        parts.push(part);
    }
    Ok(parts)
}

impl<B: DeviceCollectives> Rank<B> {
    /// Rank `rank` of a group of `ranks` whose other ranks live in other
    /// processes, or on other machines: each joins with its own client and
    /// the same `identity`, made once by [`DeviceCollectives::identity`]
    /// and handed to every rank by the launcher, out of band (for NCCL and
    /// RCCL, a `UniqueId`'s `to_bytes`, in scope-native).
    /// Its collectives decide by ballot on the transport
    /// ([`remote`](self)); every wait is bounded by `deadline`, the join's
    /// included — so a deadline must also cover the library's setup (NCCL
    /// connecting machines takes seconds). The rank borrows a stream of
    /// its client's server for its ballots and gives it back when the last
    /// clone of the rank drops, so a runtime that joins again after its
    /// group broke (or after a join failed) reuses it: only ranks alive at
    /// once count against the server's [`MAX_STREAMS`](crate::MAX_STREAMS).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a rank past `ranks`, or a server out
    /// of streams; the library's refusal to join (an identity it did not
    /// make, two ranks on one device), or a join whose peers did not all
    /// arrive within `deadline`; the ballot buffers' allocation.
    pub fn join(
        client: Client<B>,
        identity: &B::Identity,
        rank: usize,
        ranks: usize,
        deadline: Duration,
    ) -> Result<Self> {
        Self::join_epoch(client, identity, rank, ranks, 0, deadline)
    }

    /// [`join`](Self::join), as a member of membership epoch `epoch`: how
    /// ranks in separate processes change membership (rules 54–56). They
    /// share no memory to meet in, so their launcher decides who goes on
    /// — the survivors of a broken group, a restarted process admitted —
    /// and hands every member a fresh identity, its new rank and the next
    /// epoch; each joins again. Every ballot carries the epoch, and a
    /// member that joined with another epoch than its peers — a restarted
    /// process the launcher gave a stale one — has every call refused on
    /// every rank, claiming nothing (rule 55), rather than meet peers that
    /// count its ranks differently.
    ///
    /// # Errors
    ///
    /// As [`join`](Self::join).
    pub fn join_epoch(
        client: Client<B>,
        identity: &B::Identity,
        rank: usize,
        ranks: usize,
        epoch: u64,
        deadline: Duration,
    ) -> Result<Self> {
        if rank >= ranks {
            return Err(Error::invalid(
                "rank",
                format!("{rank} in a group of {ranks}"),
            ));
        }
        // What can fail here is made first, so a rank that cannot take
        // part never joins: its peers then wait their deadline for it,
        // rather than find a communicator its owner already destroyed.
        let ballots = client.lend_stream()?;
        let send = ballots.allocate(RECORD as u64)?;
        let gathered = ballots.allocate((RECORD * ranks) as u64)?;
        let join = |backend: &mut B| {
            // SAFETY: the caller's launcher gives every rank this identity
            // and count, each rank once, each in its own process or on its
            // own thread; the library refuses two ranks on one device.
            unsafe { backend.join(identity, rank, ranks, deadline) }
        };
        // SAFETY: joining makes a library object the core does not track,
        // and leaves no work on any stream.
        let communicator = Arc::new(unsafe { client.with_backend_mut(join) }??);
        let mover: Box<dyn Mover<B>> = Box::new(Communicators::<B> {
            first: rank,
            mine: vec![communicator.clone()],
            aborted: std::sync::atomic::AtomicBool::new(false),
            ranks,
        });
        let ballot: Box<dyn Ballot<B>> = Box::new(Ballots::<B> {
            client: ballots,
            communicator,
            send,
            gathered,
            ranks,
        });
        let shared = Shared::new(
            vec![client],
            (rank, ranks),
            deadline,
            Some(mover),
            Some(ballot),
            epoch,
        );
        Ok(Self {
            shared: Arc::new(shared),
            rank,
        })
    }
}

impl<B: Backend> Rank<B> {
    /// Meet by ballot: every rank's part, then the one outcome.
    ///
    /// # Errors
    ///
    /// What broke the group ([`Ballot::vote`]).
    pub(super) fn vote(&self, ballot: &dyn Ballot<B>, part: Part) -> Result<Arc<Outcome>> {
        let round = self.next_round();
        match ballot.vote((self.rank, round), part, self.shared.deadline) {
            Ok(parts) => Ok(Arc::new(decide(round, &parts))),
            Err(error) => {
                self.shared
                    .break_with(&mut self.shared.state.lock(), &error);
                Err(error.into())
            }
        }
    }

    /// After a ballot agreed and this rank issued its call (`issued`): wait
    /// for the call within the deadline (a recorded call is not waited
    /// for: it runs when its graph is replayed). A call that failed, or did not
    /// finish in time, breaks the group (aborting the communicator) and its
    /// output carries why.
    pub(super) fn settle_issued(
        &self,
        ballot: &dyn Ballot<B>,
        (kind, recorded): (Kind, bool),
        issued: Result<()>,
        written: Written<'_>,
    ) -> Result<()> {
        let round = self.shared.state.lock().rounds.last(self.rank);
        let deadline = self.shared.deadline;
        let seat = (self.rank, round);
        let error = match issued {
            Err(cause) => blame(kind, seat, deadline, cause),
            // A recorded call runs at its graph's replay, which waits then.
            Ok(()) if recorded => return Ok(()),
            Ok(()) => match ballot.settle(self.client(), Instant::now() + deadline) {
                Ok(true) => return Ok(()),
                Ok(false) => CollectiveError::Stalled {
                    collective: kind.name(),
                    round,
                    deadline,
                },
                Err(cause) => blame(kind, seat, deadline, cause),
            },
        };
        self.shared
            .break_with(&mut self.shared.state.lock(), &error);
        let error: Error = error.into();
        self.claim(written, error.clone())?;
        Err(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every call, with each status, reads back as written; a failure's
    /// text too long for a record is cut on a character boundary, and
    /// says so.
    #[test]
    fn a_ballot_reads_back_as_written() {
        let calls = [
            Call::AllReduce {
                element: Element::F32,
                op: Reduce::Mean,
            },
            Call::AllGather,
            Call::ReduceScatter {
                element: Element::I32,
                op: Reduce::Min,
            },
            Call::Broadcast { root: 3 },
            Call::AllToAll,
        ];
        let long = "é".repeat(RECORD);
        let others = [
            Kind::Replay {
                digest: u64::MAX - 1,
            },
            Kind::Send,
            Kind::Recv,
        ];
        let kinds = calls.into_iter().map(Kind::Call).chain(others);
        for (i, kind) in kinds.enumerate() {
            for input in [
                Input::Ready,
                Input::Refused("passed 3 bytes".to_owned()),
                Input::Failed(Error::internal(long.clone())),
            ] {
                let part = Part {
                    kind,
                    len: 4096 + i as u64,
                    epoch: i as u64,
                    recorded: i % 2 == 1,
                    input,
                };
                let record = encode(7, &part);
                assert_eq!(record.len(), RECORD);
                let read = decode(7, &record).expect("a ballot of this round");
                assert_eq!(read.kind, kind);
                assert_eq!(read.recorded, i % 2 == 1);
                assert_eq!(read.len, 4096 + i as u64);
                assert_eq!(read.epoch, i as u64);
                match (&part.input, &read.input) {
                    (Input::Ready, Input::Ready) => {}
                    (Input::Refused(a), Input::Refused(b)) => assert_eq!(a, b),
                    (Input::Failed(_), Input::Failed(cause)) => {
                        let text = cause.to_string();
                        assert!(text.contains(CUT), "{text}");
                        assert!(text.ends_with("éé"), "the end is kept: {text}");
                        assert!(text.len() <= RECORD - TEXT);
                        assert!(cause.external_root::<PeerReport>().is_some());
                    }
                    _ => panic!("{kind:?}: the status changed"),
                }
            }
        }
    }

    /// A long failure keeps its head and its root cause, at its end, and
    /// loses the middle: whole characters, within the room.
    #[test]
    fn a_long_failure_loses_its_middle_not_its_root_cause() {
        let nested = format!(
            "all_gather #9: rank 0's input could not be read: {}root cause: the tag",
            "rank 1's input could not be read: ".repeat(60)
        );
        for room in [60, 200, RECORD - TEXT] {
            let kept = fit(&nested, room);
            assert!(kept.len() <= room, "{room}: {}", kept.len());
            assert!(kept.starts_with("all_gather #9"), "{kept}");
            assert!(kept.ends_with("root cause: the tag"), "{kept}");
            assert!(kept.contains(CUT));
        }
        assert_eq!(fit("short", 60), "short");
        assert_eq!(fit(&nested, 5), "all_g", "too small for the mark");
        let wide = "é".repeat(100);
        let kept = fit(&wide, 61);
        assert!(kept.len() <= 61 && kept.starts_with('é') && kept.ends_with('é'));
    }

    /// A record of another round, or one scope did not write, is no vote.
    #[test]
    fn a_foreign_or_stale_ballot_is_no_vote() {
        let part = Part {
            kind: Kind::Call(Call::AllGather),
            len: 64,
            epoch: 0,
            recorded: false,
            input: Input::Ready,
        };
        assert!(decode(7, &encode(7, &part)).is_ok());
        assert_eq!(decode(8, &encode(7, &part)).err(), Some(Unread::NoVote));
        assert_eq!(decode(0, &[0; RECORD]).err(), Some(Unread::NoVote));
    }

    fn gather(part: &Part) -> Part {
        Part {
            kind: part.kind,
            len: part.len,
            epoch: part.epoch,
            recorded: part.recorded,
            input: Input::Ready,
        }
    }

    /// What this build cannot read is refused, never guessed: garbage is
    /// no vote, and a truncated record, a future version, an unknown call,
    /// element, reduction or status refuse the round on every rank.
    #[test]
    fn a_ballot_this_build_cannot_read_is_refused_on_every_rank() {
        let part = Part {
            kind: Kind::Call(Call::AllReduce {
                element: Element::F32,
                op: Reduce::Sum,
            }),
            len: 64,
            epoch: 0,
            recorded: false,
            input: Input::Ready,
        };
        let good = encode(3, &part);
        let mut garbage: Vec<u8> = (0..RECORD).map(|i| (i * 31 + 7) as u8).collect();
        assert_eq!(decode(3, &garbage).err(), Some(Unread::NoVote));
        garbage[..TEXT].copy_from_slice(&good[..TEXT]);
        garbage[4] = 0xee;
        let unreadable = |record: &[u8]| matches!(decode(3, record), Err(Unread::Unreadable(_)));
        assert!(unreadable(&garbage), "an unknown call kind is no replay");
        assert!(unreadable(&good[..RECORD - 1]), "truncated");
        let mut future = good.clone();
        future[52..56].copy_from_slice(&(VERSION + 1).to_le_bytes());
        assert!(unreadable(&future), "a future version");
        for (at, byte) in [(5, 9u8), (6, 9), (28, 9)] {
            let mut odd = good.clone();
            odd[at] = byte;
            assert!(unreadable(&odd), "byte {at} = {byte}");
        }
        // Rank 1 sends the future version: both ranks refuse alike.
        let gathered = [good.clone(), future].concat();
        for rank in 0..2 {
            let parts = tally(3, &gathered, 2, (rank, gather(&part))).expect("a vote");
            match decide(3, &parts) {
                Outcome::Refused(Error::Collective(refused)) => match *refused {
                    CollectiveError::Refused {
                        rank: 1, ref why, ..
                    } => {
                        assert!(why.contains("version 2"), "{why}");
                    }
                    ref other => panic!("rank {rank}: {other}"),
                },
                _ => panic!("rank {rank}: not refused"),
            }
        }
        // A short gather is a truncated last record: refused too.
        let parts = tally(3, &gathered[..RECORD + 100], 2, (0, gather(&part))).expect("a vote");
        assert!(matches!(decide(3, &parts), Outcome::Refused(_)));
        // Garbage in place of a ballot is no vote at all.
        let noise = [good, vec![0x5a; RECORD]].concat();
        assert!(tally(3, &noise, 2, (0, gather(&part))).is_err());
    }
}
