//! Membership: a broken group shrinks to its survivors (`ncclCommShrink`)
//! and admits a rank that comes back (torchft's quorum; rules 54–57).
//!
//! 1. **A change is a meeting with the deadline** (`meeting.rs`).
//! 2. **Membership has epochs**; an old one's calls are [`CollectiveError::Stale`].
//! 3. **The transport comes along**, shrunk or joined afresh; ranks that
//!    joined alone rejoin instead ([`Rank::join_epoch`]).
//! 4. **A newcomer is healed, not trusted** ([`Rank::heal`], rule 51).

use std::sync::Arc;
use std::time::Duration;

use super::meeting::{Agenda, Meeting, Met, attend};
use super::{Closed, CollectiveError, Group, Rank, Shared, State};
use crate::backend::Backend;
use crate::client::Client;
use crate::error::{Error, Result};
use crate::handle::Slice;
use crate::id::ServerId;

/// A group's membership: the changes on its epoch, and its successor.
pub(super) struct Membership<B: Backend> {
    changes: Meeting<Ask<B>, Decided<B>>,
    /// The new epoch and, by old rank, whether it kept the rank.
    superseded: Option<(u64, Vec<bool>)>,
}

impl<B: Backend> Membership<B> {
    pub(super) fn new(ranks: usize) -> Self {
        Self {
            changes: Meeting::new(ranks),
            superseded: None,
        }
    }

    /// Why a call through a superseded epoch is stale (rule 55).
    pub(super) fn stale(&self, epoch: u64, rank: usize) -> Option<CollectiveError> {
        let (current, kept) = self.superseded.as_ref()?;
        Some(CollectiveError::Stale {
            epoch,
            current: *current,
            left_out: !kept.get(rank).copied().unwrap_or(false),
        })
    }
}

/// A decided change: the new epoch, or why there is none.
pub(super) enum Decided<B: Backend> {
    /// The new group and, by old rank, each member's new rank.
    Group {
        shared: Arc<Shared<B>>,
        ranks: Vec<Option<usize>>,
        epoch: u64,
    },
    /// Refused on every participant, claiming nothing.
    Refused(Error),
}

/// A membership change's refusal, before it names the rank it is about.
struct RefusedChange {
    epoch: u64,
    number: u64,
    rank: usize,
    why: String,
}

impl RefusedChange {
    fn with_rank(self, rank: usize) -> Self {
        Self { rank, ..self }
    }
}

impl From<RefusedChange> for Error {
    fn from(refused: RefusedChange) -> Self {
        CollectiveError::Refused {
            collective: "membership change",
            round: refused.number,
            rank: refused.rank,
            why: format!("{} (epoch {})", refused.why, refused.epoch),
        }
        .into()
    }
}

/// The first rank that asked for a change other than the lowest rank's.
fn disagreement<B: Backend>(asks: &[Option<Ask<B>>]) -> Option<(usize, String)> {
    let mut came = asks
        .iter()
        .enumerate()
        .filter_map(|(r, a)| Some((r, a.as_ref()?.servers())));
    let (first, expected) = came.next()?;
    let say = |ask: &Option<Vec<ServerId>>| match ask {
        None => "shrink".to_owned(),
        Some(newcomers) => format!("admit {} newcomer(s) {newcomers:?}", newcomers.len()),
    };
    came.find(|(_, ask)| *ask != expected).map(|(rank, ask)| {
        (
            rank,
            format!(
                "asked to {} where rank {first} asked to {}",
                say(&ask),
                say(&expected)
            ),
        )
    })
}

pub(super) enum Ask<B: Backend> {
    Shrink,
    Admit(Vec<Client<B>>),
}

impl<B: Backend> Ask<B> {
    /// What ranks must agree on: the newcomers' servers, for an admission.
    fn servers(&self) -> Option<Vec<ServerId>> {
        match self {
            Ask::Shrink => None,
            Ask::Admit(newcomers) => Some(newcomers.iter().map(Client::server_id).collect()),
        }
    }
}

/// How a change meets: ranks known gone are not awaited (rules 54, 55).
struct Changing<'a, B: Backend> {
    rank: &'a Rank<B>,
}

impl<B: Backend> Agenda<State<B>> for Changing<'_, B> {
    type Part = Ask<B>;
    type Decision = Decided<B>;
    type Leave = CollectiveError;

    fn meeting<'s>(&self, state: &'s mut State<B>) -> &'s mut Meeting<Ask<B>, Decided<B>> {
        &mut state.membership.changes
    }

    fn awaits(&self, state: &State<B>, rank: usize) -> bool {
        !self
            .rank
            .known_gone(state.broken.as_deref())
            .contains(&rank)
    }

    fn leave(&self, state: &State<B>) -> Option<CollectiveError> {
        match self.rank.shared.closed(state, self.rank.rank)? {
            Closed::Stale(stale) => Some(stale),
            Closed::Broken(_) => None,
        }
    }

    fn decide(&self, state: &mut State<B>, number: u64, asks: Vec<Option<Ask<B>>>) -> Decided<B> {
        let rank = self.rank;
        let decided = match disagreement(&asks) {
            Some((other, why)) => {
                Decided::Refused(rank.refuse(number, why).with_rank(other).into())
            }
            None => {
                let arrived: Vec<usize> = (0..asks.len()).filter(|&r| asks[r].is_some()).collect();
                let ask = asks[rank.rank].as_ref().unwrap_or(&Ask::Shrink);
                rank.decide_change(ask, number, &arrived)
            }
        };
        if let Decided::Group { epoch, ranks, .. } = &decided {
            state.membership.superseded =
                Some((*epoch, ranks.iter().map(Option::is_some).collect()));
        }
        decided
    }
}

impl<B: Backend> Group<B> {
    /// The membership epoch: 0 at first, one more after each change.
    pub fn epoch(&self) -> u64 {
        self.shared.epoch
    }
}

impl<B: Backend> Rank<B> {
    /// The membership epoch of its group ([`Group::epoch`]).
    pub fn epoch(&self) -> u64 {
        self.shared.epoch
    }

    /// Its group, for the handles of its other ranks.
    pub fn group(&self) -> Group<B> {
        Group {
            shared: self.shared.clone(),
        }
    }

    /// Form the group of the ranks that go on; every survivor calls this
    /// once, and one absent at the deadline is left out (rules 54, 55).
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] for a lost device or a rank that joined alone;
    /// [`CollectiveError::Stale`]; the transport's failure, on every survivor.
    pub fn shrink(&self) -> Result<Rank<B>> {
        self.change(Ask::Shrink)
    }

    /// Admit `newcomers` as the group's last ranks (rule 56); every member
    /// calls this alike, then newcomers are [`heal`](Self::heal)ed.
    ///
    /// # Errors
    ///
    /// Refused on every member: newcomers that differ, none, a member, a
    /// lost device. Else as [`shrink`](Self::shrink).
    pub fn admit(&self, newcomers: &[Client<B>]) -> Result<Rank<B>> {
        self.change(Ask::Admit(newcomers.to_vec()))
    }

    /// Broadcast each of `buffers` from rank `root`, healing them, whatever
    /// an earlier one answered, so the ranks stay in step (rule 41).
    ///
    /// # Errors
    ///
    /// The first broadcast's error, naming the root (rule 41).
    pub fn heal(&self, root: usize, buffers: &[Slice<'_>]) -> Result<()> {
        let mut first = Ok(());
        for buffer in buffers {
            let healed = self.broadcast(root, *buffer);
            if first.is_ok() {
                first = healed;
            }
        }
        first
    }

    fn change(&self, ask: Ask<B>) -> Result<Rank<B>> {
        if self.shared.ballot.is_some() {
            return Err(Error::refused(
                "ranks that joined alone change membership by joining again with the new \
                 epoch and the identity their launcher hands out (Rank::join_epoch)",
            ));
        }
        if let Some(fault) = self.client().poison() {
            return Err(Error::refused(format!(
                "rank {}'s device is lost ({fault}): it cannot go on with the group; recover \
                 it, and have the group admit it",
                self.rank
            )));
        }
        let shared = &*self.shared;
        // A broken group is what a shrink is for; a superseded one is not.
        if let Some(Closed::Stale(stale)) = shared.closed(&shared.state.lock(), self.rank) {
            return Err(stale.into());
        }
        shared.wait_landed(std::time::Instant::now() + shared.deadline + Duration::from_millis(50));
        let agenda = Changing { rank: self };
        let decided = match attend(
            &shared.state,
            &shared.changed,
            &agenda,
            (self.rank, ask),
            shared.deadline,
        ) {
            Met::Decided(decided) => decided,
            Met::Left(stale) => return Err(stale.into()),
            Met::Forgotten(number) => {
                return Err(self
                    .refuse(
                        number,
                        "came to a membership change its peers decided long before; every rank \
                         must call each change"
                            .to_owned(),
                    )
                    .into());
            }
        };
        match &*decided {
            Decided::Refused(error) => Err(error.clone()),
            Decided::Group {
                shared,
                ranks: mapping,
                epoch,
            } => match mapping.get(self.rank).copied().flatten() {
                Some(rank) => Ok(Rank {
                    shared: shared.clone(),
                    rank,
                }),
                None => Err(CollectiveError::Stale {
                    epoch: self.shared.epoch,
                    current: *epoch,
                    left_out: true,
                }
                .into()),
            },
        }
    }

    fn refuse(&self, number: u64, why: String) -> RefusedChange {
        RefusedChange {
            epoch: self.shared.epoch,
            number,
            rank: self.rank,
            why,
        }
    }

    fn known_gone(&self, broken: Option<&CollectiveError>) -> Vec<usize> {
        let mut gone: Vec<usize> = match broken {
            Some(CollectiveError::Missing { missing, .. }) => missing.clone(),
            Some(CollectiveError::IssueFailed { rank, .. }) => vec![*rank],
            _ => Vec::new(),
        };
        for rank in 0..self.shared.ranks {
            if self.shared.client(rank).poison().is_some() && !gone.contains(&rank) {
                gone.push(rank);
            }
        }
        gone
    }

    fn decide_change(&self, ask: &Ask<B>, number: u64, arrived: &[usize]) -> Decided<B> {
        let shared = &*self.shared;
        let first = arrived.first().copied().unwrap_or(self.rank);
        let refuse =
            |why: String| Decided::Refused(self.refuse(number, why).with_rank(first).into());
        let mut clients: Vec<Client<B>> =
            arrived.iter().map(|&r| shared.client(r).clone()).collect();
        if let Ask::Admit(newcomers) = ask {
            if newcomers.is_empty() {
                return refuse("admitted no one".to_owned());
            }
            for (i, newcomer) in newcomers.iter().enumerate() {
                if let Some(fault) = newcomer.poison() {
                    return refuse(format!(
                        "admitted newcomer {i}, whose device is lost ({fault}): recover it first"
                    ));
                }
                let already = (0..shared.ranks)
                    .map(|r| shared.client(r))
                    .chain(&newcomers[..i])
                    .any(|c| c.server_id() == newcomer.server_id());
                if already {
                    return refuse(format!(
                        "admitted newcomer {i}, whose device is already a rank of the group \
                         (one device cannot be two ranks)"
                    ));
                }
            }
            clients.extend(newcomers.iter().cloned());
        }
        let device = match &shared.device {
            None => None,
            Some(device) => match device.regroup(arrived, &clients, shared.deadline) {
                Ok(device) => Some(device),
                Err(error) => return Decided::Refused(error),
            },
        };
        let epoch = shared.epoch + 1;
        let members = clients.len();
        let mut mapping = vec![None; shared.ranks];
        for (new, &old) in arrived.iter().enumerate() {
            mapping[old] = Some(new);
        }
        tracing::info!(
            epoch,
            members,
            left_out = ?(0..shared.ranks).filter(|r| !arrived.contains(r)).collect::<Vec<_>>(),
            "the group's membership changed"
        );
        let group = Arc::new(Shared::new(
            clients,
            (0, members),
            shared.deadline,
            device,
            None,
            epoch,
        ));
        Decided::Group {
            shared: group,
            ranks: mapping,
            epoch,
        }
    }
}
