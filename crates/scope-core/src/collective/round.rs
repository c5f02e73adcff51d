//! The rendezvous: what each rank brings to a round, the meeting where the
//! last to arrive decides one outcome for all, and that decision.
//!
//! Kept apart from the collectives' API because it is the part every rule
//! of `docs/ERROR_MODEL.md` 41–44 and 47 is decided in: who waits, for how
//! long, and what every rank then applies.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use super::device::Written;
use super::{Call, CollectiveError, Rank, Shared, compute, device};
use crate::backend::Backend;
use crate::error::{Error, Result};

/// What a round runs: a collective call, or a replay of graphs that
/// recorded some (every rank's graph recorded the same rounds, which
/// `digest` sums up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Call(Call),
    Replay {
        digest: u64,
    },
    /// Across processes, the header a point-to-point transfer's sender
    /// (or receiver) exchanges with its peer before any byte moves; never
    /// met in a round.
    Send,
    Recv,
}

impl Kind {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::Call(call) => call.name(),
            Kind::Replay { .. } => "replay",
            Kind::Send => "send",
            Kind::Recv => "recv",
        }
    }
}

/// What one rank brings to a round.
pub(super) struct Part {
    pub(super) kind: Kind,
    /// The input's bytes; for a replay, how many rounds its graph recorded.
    pub(super) len: u64,
    /// The membership epoch the rank calls through: ranks across processes
    /// that joined with different epochs are refused (rule 55).
    pub(super) epoch: u64,
    /// Whether the rank records the round into a capture window rather than
    /// running it: every rank must (rule 50).
    pub(super) recorded: bool,
    pub(super) input: Input,
}

pub(super) enum Input {
    Bytes(Vec<u8>),
    /// Over a device transport: the rank's input is readable (its bytes
    /// stay on the device); in a round's second meeting, its call was
    /// issued.
    Ready,
    /// Over a device transport: the rank's call to the library failed;
    /// whether it failed first (the others may have failed because it
    /// aborted their communicators).
    IssueFailed(Error, bool),
    /// The rank's read failed.
    Failed(Error),
    /// The rank's own arguments were wrong.
    Refused(String),
}

/// What every rank applies, decided once per round.
pub(super) enum Outcome {
    /// Each rank's output bytes, by rank.
    Written(Vec<Arc<Vec<u8>>>),
    /// Every rank's output carries this.
    Failed(Error),
    /// Every rank's call is refused with this, claiming nothing.
    Refused(Error),
    /// Over a device transport: every rank's input is readable, so every
    /// rank issues the call (or, in the second meeting, every rank did).
    Agreed,
}

#[derive(Default)]
pub(super) struct Round {
    pub(super) parts: Vec<Option<Part>>,
    pub(super) outcome: Option<Arc<Outcome>>,
    pub(super) taken: usize,
}

#[derive(Default)]
pub(super) struct State {
    /// How many collectives each rank has called: its next round.
    pub(super) issued: Vec<u64>,
    pub(super) rounds: BTreeMap<u64, Round>,
    pub(super) broken: Option<Arc<CollectiveError>>,
    /// Over a device transport: the first rank whose call failed, which
    /// aborted every communicator.
    pub(super) first_failed: Option<usize>,
    /// Point-to-point parcels, by (sender, receiver).
    pub(super) mail: BTreeMap<(usize, usize), super::p2p::Mailbox>,
    /// The epoch that superseded this group's, once a membership change
    /// decided one, and which old ranks it kept: every later call is stale
    /// (rule 55).
    pub(super) superseded: Option<(u64, Vec<bool>)>,
    /// The membership changes called on this epoch
    /// (`collective/membership.rs`).
    pub(super) changes: Option<super::membership::Changes>,
}

impl State {
    /// Why a call through rank `rank` of epoch `epoch` is stale, once a
    /// change superseded the epoch.
    pub(super) fn stale(&self, epoch: u64, rank: usize) -> Option<CollectiveError> {
        let (current, kept) = self.superseded.as_ref()?;
        Some(CollectiveError::Stale {
            epoch,
            current: *current,
            left_out: !kept.get(rank).copied().unwrap_or(false),
        })
    }
}

impl<B: Backend> Rank<B> {
    /// [`meet`](Self::meet); a rank that went missing leaves this rank's
    /// output unwritten, so it carries that (rule 42).
    pub(super) fn meet_or_claim(&self, part: Part, written: Written<'_>) -> Result<Arc<Outcome>> {
        self.meet(part).or_else(|missing| {
            self.claim(written, missing.clone())?;
            Err(missing)
        })
    }

    /// Arrive with `part`, wait for every rank's, and take the round's
    /// outcome.
    ///
    /// # Errors
    ///
    /// [`CollectiveError::Missing`] when a rank did not arrive in time —
    /// this rank's wait, or a peer's that ran out first.
    pub(super) fn meet(&self, part: Part) -> Result<Arc<Outcome>> {
        if let Some(ballot) = &self.shared.ballot {
            return self.vote(ballot.as_ref(), part);
        }
        let shared = &*self.shared;
        let ranks = shared.ranks;
        let kind = part.kind;
        let mut state = shared.state.lock();
        let round = state.issued[self.rank];
        state.issued[self.rank] += 1;
        let entry = state.rounds.entry(round).or_default();
        if entry.parts.is_empty() {
            entry.parts = (0..ranks).map(|_| None).collect();
        }
        entry.parts[self.rank] = Some(part);
        if entry.parts.iter().all(Option::is_some) {
            let parts: Vec<Part> = entry.parts.iter_mut().filter_map(Option::take).collect();
            let outcome = decide(round, &parts);
            if let Outcome::Failed(Error::Collective(failed)) = &outcome
                && matches!(**failed, CollectiveError::IssueFailed { .. })
            {
                state.broken = Some(Arc::new((**failed).clone()));
            }
            if let Some(entry) = state.rounds.get_mut(&round) {
                entry.outcome = Some(Arc::new(outcome));
            }
            shared.changed.notify_all();
        }
        let until = Instant::now() + shared.deadline;
        loop {
            if let Some(outcome) = state.rounds.get_mut(&round).and_then(|r| r.outcome.clone()) {
                let r = state.rounds.get_mut(&round);
                if let Some(r) = r {
                    r.taken += 1;
                    if r.taken == ranks {
                        state.rounds.remove(&round);
                    }
                }
                return Ok(outcome);
            }
            if let Some(cause) = state.broken.clone() {
                return Err(Error::Collective(Box::new((*cause).clone())));
            }
            if let Some(stale) = state.stale(shared.epoch, self.rank) {
                // Peers changed membership while this rank waited in a
                // round they will not come to: it is stale, not missing.
                return Err(stale.into());
            }
            if shared.changed.wait_until(&mut state, until).timed_out()
                && state.rounds.get(&round).is_none_or(|r| r.outcome.is_none())
            {
                let missing = state
                    .rounds
                    .get(&round)
                    .map(|r| {
                        (0..ranks)
                            .filter(|&i| r.parts[i].is_none() && i != self.rank)
                            .collect()
                    })
                    .unwrap_or_default();
                let error = CollectiveError::Missing {
                    collective: kind.name(),
                    round,
                    missing,
                    deadline: shared.deadline,
                };
                shared.break_with(&mut state, &error);
                return Err(error.into());
            }
        }
    }
}

impl<B: Backend> Rank<B> {
    /// This rank's next round, counted.
    pub(super) fn next_round(&self) -> u64 {
        let mut state = self.shared.state.lock();
        let round = state.issued[self.rank];
        state.issued[self.rank] += 1;
        round
    }
}

impl<B: Backend> Shared<B> {
    /// Break the group with `error` (a rank that never came): later calls
    /// are refused and every waiter wakes to it. Over a device transport
    /// nobody issued the round, so no rank waits inside the library: the
    /// communicators are aborted only where a peer lives in another
    /// process and may be dead, and kept in one process for the survivors'
    /// shrink ([`Mover::break_off`](super::device::Mover::break_off)).
    /// The one way a group breaks for a missing rank, collective or
    /// point-to-point.
    pub(super) fn break_with(&self, state: &mut State, error: &CollectiveError) {
        tracing::warn!("{error}");
        state.broken = Some(Arc::new(error.clone()));
        if let Some(device) = &self.device {
            device.break_off();
        }
        self.changed.notify_all();
    }
}

/// The one outcome of a round every rank applies.
pub(super) fn decide(round: u64, parts: &[Part]) -> Outcome {
    let kind = parts[0].kind;
    let collective = kind.name();
    let refuse = |rank: usize, why: String| {
        Outcome::Refused(
            CollectiveError::Refused {
                collective,
                round,
                rank,
                why,
            }
            .into(),
        )
    };
    for (rank, part) in parts.iter().enumerate() {
        if let Input::Refused(why) = &part.input {
            return refuse(rank, why.clone());
        }
    }
    for (rank, part) in parts.iter().enumerate().skip(1) {
        if part.kind != kind {
            let what = |kind: Kind| match kind {
                Kind::Call(call) => format!("{call:?}"),
                Kind::Replay { .. } => "a replay of its graph".to_owned(),
                other => other.name().to_owned(),
            };
            let why = match (part.kind, kind) {
                (Kind::Replay { .. }, Kind::Replay { .. }) => {
                    "replayed a graph that recorded other rounds than rank 0's".to_owned()
                }
                _ => format!(
                    "called {} where rank 0 called {}",
                    what(part.kind),
                    what(kind)
                ),
            };
            return refuse(rank, why);
        }
        if part.recorded != parts[0].recorded {
            let does = |recorded: bool| {
                if recorded {
                    "records it into a capture window"
                } else {
                    "runs it"
                }
            };
            return refuse(
                rank,
                format!(
                    "{} where rank 0 {}",
                    does(part.recorded),
                    does(parts[0].recorded)
                ),
            );
        }
        if part.epoch != parts[0].epoch {
            return refuse(
                rank,
                format!(
                    "joined membership epoch {} where rank 0 joined epoch {}",
                    part.epoch, parts[0].epoch
                ),
            );
        }
        if part.len != parts[0].len {
            return refuse(
                rank,
                format!(
                    "passed {} input bytes where rank 0 passed {}",
                    part.len, parts[0].len
                ),
            );
        }
    }
    if let Some((rank, cause)) = parts
        .iter()
        .enumerate()
        .find_map(|(rank, p)| match &p.input {
            Input::Failed(cause) => Some((rank, cause.clone())),
            _ => None,
        })
    {
        return Outcome::Failed(
            CollectiveError::InputFailed {
                collective,
                round,
                rank,
                cause,
            }
            .into(),
        );
    }
    let failed_call = |first: bool| {
        parts
            .iter()
            .enumerate()
            .find_map(|(rank, p)| match &p.input {
                Input::IssueFailed(cause, was_first) if *was_first || !first => {
                    Some((rank, cause.clone()))
                }
                _ => None,
            })
    };
    if let Some((rank, cause)) = failed_call(true).or_else(|| failed_call(false)) {
        return Outcome::Failed(device::issue_failed(collective, round, rank, cause).into());
    }
    if parts.iter().all(|p| matches!(p.input, Input::Ready)) {
        return Outcome::Agreed;
    }
    let Kind::Call(call) = kind else {
        return Outcome::Refused(Error::internal(
            "a replay's parts held bytes: a replay moves none through the host",
        ));
    };
    let inputs: Vec<&[u8]> = parts
        .iter()
        .map(|p| match &p.input {
            Input::Bytes(bytes) => bytes.as_slice(),
            _ => &[],
        })
        .collect();
    Outcome::Written(compute::compute(call, &inputs))
}
