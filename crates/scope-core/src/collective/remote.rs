//! Ranks in separate processes share no memory, and scope adds no wire of
//! its own, so the meeting becomes a collective on the library too:
//!
//! 1. **A ballot before every round**: the ranks all-gather [`RECORD`]-byte
//!    parts and run the same decision (torchft's `should_commit`).
//! 2. **An unreadable ballot is its rank's refusal**, so all refuse alike.
//! 3. **Every wait has the deadline**, past which the group breaks with
//!    [`CollectiveError::Stalled`] (rules 42, 43).
//! 4. **A failed call breaks what it can reach**; no output reads as written.
//! 5. **Point-to-point pairs its headers** first (rule 48).
//! 6. **Ballots have a stream and a communicator of their own**: usable
//!    while the rank's stream records, never behind a round in flight.
//! 7. **A round is watched, not waited for**, as in one process (rule 47).
//! 8. **A launcher's leases name a gone rank** ([`Liveness`]): `Missing`, sooner.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::device::{
    Communicators, DeviceCall, DeviceCollectives, DeviceTransfer, Direction, Mover,
};
use super::round::{Input, Kind, Outcome, Part, blame, decide};
use super::{Call, CollectiveError, Element, Rank, Reduce, Shared};
use crate::backend::Backend;
use crate::client::{Client, LentStream};
use crate::error::{Error, Result};
use crate::handle::{Buffer, Slice};

/// The bytes of one ballot, fixed so every all-gather has one count.
pub const RECORD: usize = 1024;

const MAGIC: u32 = 0x5343_4233;

/// The record layout's version: a rank refuses a ballot of another.
const VERSION: u32 = 1;

/// Where the text of a record begins.
const TEXT: usize = 56;

/// A peer's failure as its process rendered it ([`Error::external_root`]).
#[derive(Debug, thiserror::Error)]
#[error("{report}")]
pub struct PeerReport {
    /// The failure, as the peer's [`Error`] displayed it.
    pub report: String,
}

/// A launcher's record of which ranks' processes are gone. Without one a gone
/// peer fails a round at the deadline, and no rank can name it (rule 49).
pub trait Liveness: Send + Sync {
    /// The group's ranks known gone, lowest first; `None` while all live.
    /// Asked at every poll of a round in flight, so it reads, never calls out.
    fn gone(&self) -> Option<Vec<usize>>;

    /// [`gone`](Self::gone) asked afresh, once a wait failed for a peer's
    /// abort or the deadline: that peer may have learned first.
    fn gone_now(&self) -> Option<Vec<usize>> {
        self.gone()
    }
}

/// How long a wait of the ballots lasts, and who may end it sooner.
#[derive(Clone, Copy)]
pub(super) struct Patience<'a> {
    pub(super) deadline: Duration,
    pub(super) liveness: Option<&'a dyn Liveness>,
}

impl Patience<'_> {
    /// `Missing` for round `round` of `collective` if a rank is known gone.
    pub(super) fn missing(
        &self,
        (collective, round): (&'static str, u64),
        since: Instant,
    ) -> Option<CollectiveError> {
        let missing = self.liveness?.gone()?;
        Some(missing_since((collective, round), missing, since))
    }

    /// `error`, or `Missing` where it is `Stalled` and a rank is known gone.
    pub(super) fn naming(&self, error: CollectiveError, since: Instant) -> CollectiveError {
        match &error {
            CollectiveError::Stalled {
                collective, round, ..
            } => match self.liveness.and_then(Liveness::gone_now) {
                Some(missing) => missing_since((collective, *round), missing, since),
                None => error,
            },
            _ => error,
        }
    }
}

/// `Missing` naming `missing` in round `round` of `collective`, waited since `since`.
pub(super) fn missing_since(
    (collective, round): (&'static str, u64),
    missing: Vec<usize>,
    since: Instant,
) -> CollectiveError {
    CollectiveError::Missing {
        collective,
        round,
        missing,
        deadline: since.elapsed(),
    }
}

/// How ranks without shared memory meet, erased for [`Shared<B>`].
pub(super) trait Ballot<B: Backend>: Send + Sync {
    /// Exchange rank `rank`'s `part` of round `round` for every rank's.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::Stalled`] past the deadline;
    /// [`CollectiveError::IssueFailed`] when this rank's part failed.
    fn vote(
        &self,
        seat: (usize, u64),
        part: Part,
        patience: Patience<'_>,
    ) -> std::result::Result<Vec<Part>, CollectiveError>;

    /// Wait until `until` for `client`'s stream. `false` if late, after an
    /// abort; an error if a peer aborted, or (after an abort) `missing`'s.
    fn settle(
        &self,
        client: &Client<B>,
        until: Instant,
        missing: &dyn Fn() -> Option<CollectiveError>,
    ) -> Result<bool>;

    /// Swap this rank's `part` of transfer `seat` for `peer`'s, the send's
    /// first so the halves pair; errors as [`vote`](Self::vote)'s.
    fn exchange(
        &self,
        seat: (usize, u64),
        peer: usize,
        part: Part,
        patience: Patience<'_>,
    ) -> std::result::Result<Part, CollectiveError>;

    /// Issue this rank's half of the transfer once the headers agreed.
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
    /// The rounds' communicator's copy, where the library makes one.
    communicator: Arc<B::Communicator>,
    send: Buffer,
    gathered: Buffer,
    ranks: usize,
    /// The ballots' own stream; it drops after the buffers above.
    client: LentStream<B>,
}

impl<B: DeviceCollectives> Ballots<B> {
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
        patience: Patience<'_>,
    ) -> std::result::Result<Vec<Part>, CollectiveError> {
        let since = Instant::now();
        self.vote_within((rank, round), part, patience, since)
            .map_err(|error| patience.naming(error, since))
    }

    fn exchange(
        &self,
        seat: (usize, u64),
        peer: usize,
        part: Part,
        patience: Patience<'_>,
    ) -> std::result::Result<Part, CollectiveError> {
        let since = Instant::now();
        self.exchange_within(seat, peer, part, patience, since)
            .map_err(|error| patience.naming(error, since))
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
            // SAFETY: this rank's communicator; the server resolved the
            // buffer; the headers agreed the peer's opposite half.
            unsafe { backend.point_to_point(communicator, stream, &call) }
        })
    }

    fn settle(
        &self,
        client: &Client<B>,
        until: Instant,
        missing: &dyn Fn() -> Option<CollectiveError>,
    ) -> Result<bool> {
        client.sync_within(
            until,
            // SAFETY: a `B` communicator; a live waiter of this backend.
            // Health after finished: an abort also ends the work.
            |waiter| unsafe {
                let finished = B::finished(waiter)?;
                B::health(&self.communicator)?;
                match missing() {
                    Some(gone) if !finished => Err(gone.into()),
                    _ => Ok(finished),
                }
            },
            // SAFETY: the communicator was joined on a `B`.
            || unsafe { B::abort(&self.communicator) },
        )
    }
}

impl<B: DeviceCollectives> Ballots<B> {
    fn vote_within(
        &self,
        (rank, round): (usize, u64),
        part: Part,
        patience: Patience<'_>,
        since: Instant,
    ) -> std::result::Result<Vec<Part>, CollectiveError> {
        let (client, deadline) = (&self.client, patience.deadline);
        let kind = part.kind;
        let failed = |cause: Error| blame(kind.name(), (rank, round), deadline, cause);
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
                    // SAFETY: this rank's communicator; both buffers resolved at
                    // all-gather sizes; every rank's next call is this ballot.
                    unsafe { backend.collective(communicator, stream, &call) }
                },
            )
            .map_err(failed)?;
        let missing = || patience.missing((kind.name(), round), since);
        if !self.settle(client, until, &missing).map_err(failed)? {
            return Err(CollectiveError::Stalled {
                collective: kind.name(),
                round,
                deadline,
            });
        }
        let gathered = client.read(self.gathered.all()).map_err(failed)?;
        tally(round, &gathered, ranks, (rank, part)).map_err(|()| {
            // An unwritten record is no vote.
            // SAFETY: the communicator was joined on a `B`.
            unsafe { B::abort(communicator) };
            CollectiveError::Stalled {
                collective: kind.name(),
                round,
                deadline,
            }
        })
    }

    fn exchange_within(
        &self,
        (rank, number): (usize, u64),
        peer: usize,
        part: Part,
        patience: Patience<'_>,
        since: Instant,
    ) -> std::result::Result<Part, CollectiveError> {
        let (client, deadline) = (&self.client, patience.deadline);
        let kind = part.kind;
        let failed = |cause: Error| blame(kind.name(), (rank, number), deadline, cause);
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
        let missing = || patience.missing((kind.name(), number), since);
        if !self.settle(client, until, &missing).map_err(failed)? {
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
                // Not the peer's header for this transfer.
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
}

const CUT: &str = " [… cut …] ";

/// `text` in `room` bytes, middle cut: the root cause renders last (rules 41, 49).
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
    let element = Element::ALL.iter().position(|e| *e == element).unwrap_or(0) as u8;
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
    /// Not a ballot of this round: no vote.
    NoVote,
    /// A ballot of this round this build cannot read.
    Unreadable(String),
}

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
    let Some(&element) = Element::ALL.get(usize::from(record[5])) else {
        return unreadable(format!("element type {}", record[5]));
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

/// Every rank's part from the `gathered` records, this rank's kept whole;
/// `Err` for a record that is no vote (the exchange did not complete).
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
    /// Rank `rank` of `ranks`, joined by peers in other processes with the same
    /// `identity`; collectives decide by ballot ([`remote`](self)). `deadline`
    /// bounds the join too, so it must cover the library's setup.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a rank past `ranks` or a server out of
    /// streams; the library's refusal or missing peers; the ballots' allocation.
    pub fn join(
        client: Client<B>,
        identity: &B::Identity,
        rank: usize,
        ranks: usize,
        deadline: Duration,
    ) -> Result<Self> {
        Self::join_epoch(client, identity, rank, ranks, 0, deadline)
    }

    /// [`join`](Self::join) in membership epoch `epoch`, which the launcher
    /// decides (rules 54–56); a member of another epoch is refused (rule 55).
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
        // What can fail comes before the join, which peers wait for.
        let rounds = client.lend_stream()?;
        let ballots = client.lend_stream()?;
        let send = ballots.allocate(RECORD as u64)?;
        let gathered = ballots.allocate((RECORD * ranks) as u64)?;
        let join = |backend: &mut B| {
            // SAFETY: the launcher gives each rank this identity once.
            unsafe { backend.join(identity, rank, ranks, deadline) }
        };
        // SAFETY: joining leaves no work on any stream.
        let communicator = Arc::new(unsafe { client.with_backend_mut(join) }??);
        let duplicate = |backend: &mut B| {
            // SAFETY: every rank duplicates its idle communicator once, here.
            unsafe { backend.duplicate(&communicator, rank, deadline) }
        };
        // SAFETY: duplicating leaves no work on any stream.
        let ballots_on = match unsafe { client.with_backend_mut(duplicate) }.and_then(|d| d) {
            Ok(Some(copy)) => Arc::new(copy),
            Ok(None) => communicator.clone(),
            Err(error) => {
                // SAFETY: the communicator was joined on a `B`.
                unsafe { B::abort(&communicator) };
                return Err(error);
            }
        };
        let mover: Box<dyn Mover<B>> = Box::new(Communicators::<B> {
            first: rank,
            mine: vec![communicator],
            streams: vec![rounds],
            aborted: std::sync::atomic::AtomicBool::new(false),
            ranks,
        });
        let ballot: Box<dyn Ballot<B>> = Box::new(Ballots::<B> {
            client: ballots,
            communicator: ballots_on,
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

impl<B: Backend> Shared<B> {
    /// The deadline, and the liveness if the group has one.
    pub(super) fn patience(&self) -> Patience<'_> {
        Patience {
            deadline: self.deadline,
            liveness: self.liveness.get().map(|l| &**l),
        }
    }

    /// The ranks the liveness knows gone; `now` asks afresh ([`Liveness::gone_now`]).
    pub(super) fn gone(&self, now: bool) -> Option<Vec<usize>> {
        let liveness = self.liveness.get()?;
        if now {
            liveness.gone_now()
        } else {
            liveness.gone()
        }
    }
}

impl<B: Backend> Rank<B> {
    /// Let `liveness` name a gone rank before the deadline: a wait on it
    /// fails as [`CollectiveError::Missing`] naming it, at the next poll
    /// (rule 49). Once a group; a group of the next epoch takes its own.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the group already has one.
    pub fn watch_liveness(&self, liveness: Arc<dyn Liveness>) -> Result<()> {
        self.shared
            .liveness
            .set(liveness)
            .map_err(|_| Error::invalid("liveness", "this group already has one"))
    }

    /// Meet by ballot: every rank's part, then the one outcome, or what
    /// broke the group ([`Ballot::vote`]).
    pub(super) fn vote(&self, ballot: &dyn Ballot<B>, part: Part) -> Result<Arc<Outcome>> {
        let round = self.next_round();
        match ballot.vote((self.rank, round), part, self.shared.patience()) {
            Ok(parts) => Ok(Arc::new(decide(round, &parts))),
            Err(error) => {
                self.shared
                    .break_with(&mut self.shared.state.lock(), &error);
                Err(error.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let unknown_element = Element::ALL.len() as u8;
        for (at, byte) in [(5, unknown_element), (6, 9u8), (28, 9)] {
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
