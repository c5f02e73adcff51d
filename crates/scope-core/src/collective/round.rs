//! A round: how the ranks' parts become one outcome (`decide`, also the
//! ballot's), and what every rank applies (rules 41–44, 47).

use std::sync::Arc;

use super::meeting::{Agenda, Meeting, Met, attend};
use super::{Call, Closed, CollectiveError, Rank, Shared, State, compute};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::handle::{Graph, Slice};

/// What a round runs: a collective call, or a replay of graphs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Call(Call),
    Replay {
        digest: u64,
    },
    /// A point-to-point header across processes; never met in a round.
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
    /// The rank's membership epoch; differing ones are refused (rule 55).
    pub(super) epoch: u64,
    /// Whether the rank records the round; every rank must (rule 50).
    pub(super) recorded: bool,
    pub(super) input: Input,
}

pub(super) enum Input {
    Bytes(Vec<u8>),
    /// Over a device transport: the input is readable, or the call issued.
    Ready,
    /// Over a device transport: the library call failed; whether first.
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
    /// Over a device transport: every rank issues the call.
    Agreed,
}

/// What a round writes on one rank: an output, or a replayed graph's.
#[derive(Clone, Copy)]
pub(super) enum Written<'a> {
    Output(Slice<'a>),
    Graph(&'a Graph),
}

/// The error that breaks the group after a failed device call.
pub(super) fn issue_failed(
    collective: &'static str,
    round: u64,
    rank: usize,
    cause: Error,
) -> CollectiveError {
    CollectiveError::IssueFailed {
        collective,
        round,
        rank,
        cause,
    }
}

/// Why a rank's round failed: a stall blames no rank, else the rank.
pub(super) fn blame(
    collective: &'static str,
    (rank, round): (usize, u64),
    deadline: std::time::Duration,
    cause: Error,
) -> CollectiveError {
    match &cause {
        Error::Collective(stalled) if matches!(**stalled, CollectiveError::Stalled { .. }) => {
            CollectiveError::Stalled {
                collective,
                round,
                deadline,
            }
        }
        // Named by the liveness, with the round and how long it waited.
        Error::Collective(missing) if matches!(**missing, CollectiveError::Missing { .. }) => {
            (**missing).clone()
        }
        _ => issue_failed(collective, round, rank, cause),
    }
}

impl<B: Backend> Rank<B> {
    /// [`meet`](Self::meet); if the group closed meanwhile, the output
    /// carries why (rule 42).
    pub(super) fn meet_or_claim(&self, part: Part, written: Written<'_>) -> Result<Arc<Outcome>> {
        self.meet(part).or_else(|left| {
            self.claim(written, left.clone())?;
            Err(left)
        })
    }

    /// Arrive with `part` and take the round's one outcome, or what closed
    /// the group while this rank waited.
    pub(super) fn meet(&self, part: Part) -> Result<Arc<Outcome>> {
        if let Some(ballot) = &self.shared.ballot {
            return self.vote(ballot.as_ref(), part);
        }
        let shared = &*self.shared;
        let agenda = Rounds {
            shared,
            rank: self.rank,
        };
        match attend(
            &shared.state,
            &shared.changed,
            &agenda,
            (self.rank, part),
            shared.deadline,
        ) {
            Met::Decided(outcome) => Ok(outcome),
            Met::Left(error) => Err(error),
            Met::Forgotten(round) => Err(Error::internal(format!(
                "round {round} was forgotten before rank {} came",
                self.rank
            ))),
        }
    }

    /// This rank's next round, counted: a ballot's seat.
    pub(super) fn next_round(&self) -> u64 {
        self.shared.state.lock().rounds.seat(self.rank)
    }
}

/// How rounds meet: a rank absent at the deadline breaks the group (rules 42, 43).
struct Rounds<'a, B: Backend> {
    shared: &'a Shared<B>,
    rank: usize,
}

impl<B: Backend> Agenda<State<B>> for Rounds<'_, B> {
    type Part = Part;
    type Decision = Outcome;
    type Leave = Error;

    fn meeting<'s>(&self, state: &'s mut State<B>) -> &'s mut Meeting<Part, Outcome> {
        &mut state.rounds
    }

    fn leave(&self, state: &State<B>) -> Option<Error> {
        self.shared.closed(state, self.rank).map(Closed::cause)
    }

    fn decide(&self, state: &mut State<B>, round: u64, parts: Vec<Option<Part>>) -> Outcome {
        let missing: Vec<usize> = (0..parts.len()).filter(|&r| parts[r].is_none()).collect();
        if !missing.is_empty() {
            let kind = parts.iter().flatten().next().map(|p| p.kind);
            let error = CollectiveError::Missing {
                collective: kind.map_or("collective", Kind::name),
                round,
                missing,
                deadline: self.shared.deadline,
            };
            self.shared.break_with(state, &error);
            return Outcome::Failed(error.into());
        }
        let parts: Vec<Part> = parts.into_iter().flatten().collect();
        let outcome = decide(round, &parts);
        if let Outcome::Failed(Error::Collective(failed)) = &outcome
            && matches!(**failed, CollectiveError::IssueFailed { .. })
        {
            state.broken = Some(Arc::new((**failed).clone()));
        }
        outcome
    }
}

impl<B: Backend> Shared<B> {
    /// Break the group for a rank that never came; waiters wake to `error`
    /// ([`Mover::break_off`](super::device::Mover::break_off)).
    pub(super) fn break_with(&self, state: &mut State<B>, error: &CollectiveError) {
        tracing::warn!("{error}");
        state.broken = Some(Arc::new(error.clone()));
        self.abort_once_landed(state, super::watchdog::AbortDue::break_off());
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
        return Outcome::Failed(issue_failed(collective, round, rank, cause).into());
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
