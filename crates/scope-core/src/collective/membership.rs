//! Membership: a group that lost a rank shrinks to its survivors and goes
//! on, and admits a rank that comes back (rules 54–57).
//!
//! A group that lost a rank is broken (rule 43); before this, the way on
//! was a new group built by hand. But which ranks survived is something
//! the group already knows — the rank a broken round named missing or
//! failed, the rank whose device is lost — so the survivors can form the
//! group of themselves, as MPI's `MPIX_Comm_shrink` and NCCL's
//! `ncclCommShrink` do, and a rank that recovered its device (or a new
//! client) can be admitted, as torchft's quorum admits a replica and heals
//! it from a healthy peer.
//!
//! 1. **Every membership change is a meeting with the deadline.** Each
//!    rank that goes on calls [`Rank::shrink`] (or [`Rank::admit`]); the
//!    change is decided once, by the last expected rank to arrive — or, at
//!    the deadline, by the first rank whose wait ran out — so every rank
//!    gets the same membership. Expected are the ranks not known gone:
//!    one a broken round named missing or failed, one whose device is
//!    lost (its client is poisoned) is not waited for. A rank expected
//!    but absent at the deadline is left out.
//! 2. **Membership has an epoch.** The new group is a new epoch: its ranks
//!    are renumbered in the order of their old ranks (newcomers last), and
//!    the old group is superseded — every call through a rank of the old
//!    epoch is refused with [`CollectiveError::Stale`], claiming nothing,
//!    so no call can reach a group whose ranks no longer agree on who is
//!    in it.
//! 3. **The transport comes along.** A host-staged group needs nothing
//!    more. A group over a device transport makes the new epoch's
//!    communicators while its ranks are in the meeting: through the
//!    library's own shrink where it has one and the old communicators are
//!    intact (`DeviceCollectives::shrink`, `ncclCommShrink`), else from a
//!    fresh identity, every member joining it on a thread of its own.
//! 4. **A collective over the survivors is over the survivors.** A mean
//!    divides by the new epoch's rank count; nothing silently keeps the
//!    old size.
//! 5. **A newcomer is healed by its peers, not trusted.** Its buffers hold
//!    what its device held — nothing, if it recovered: they read as lost
//!    with the device (rule 51) — so a collective that reads them fails on
//!    every rank (rule 41) until a broadcast from a healthy rank writes,
//!    and heals, them ([`Rank::heal`]).
//!
//! Ranks that each joined alone ([`Rank::join`]) share no memory to meet
//! in: their launcher decides the new membership and hands every member a
//! fresh identity, and each joins it again with the new epoch
//! ([`Rank::join_epoch`]); the first ballot refuses, on every rank, a member
//! that joined with another epoch.

use std::sync::Arc;
use std::time::Instant;

use super::{CollectiveError, Group, Rank, Shared};
use crate::backend::Backend;
use crate::client::Client;
use crate::error::{Error, Result};
use crate::handle::Slice;
use crate::id::ServerId;

/// The membership changes of one epoch, numbered as each rank calls
/// them: a rank's `k`-th call meets its peers' `k`-th, as a collective's
/// rounds do, so a rank that comes late, or asks for another change, meets
/// the change its peers met, never one of its own.
#[derive(Default)]
pub(super) struct Changes {
    /// How many changes each rank has called: its next.
    called: Vec<u64>,
    /// The changes not every rank has taken yet, by number.
    open: std::collections::BTreeMap<u64, Change>,
    /// Changes below this number were given up on for want of room
    /// ([`KEPT`]): a rank that comes to one is refused.
    forgotten_below: u64,
}

/// How many changes that a rank never came to are kept for it: a rank that
/// never comes would otherwise keep each refused change forever.
const KEPT: usize = 8;

/// One change: what each rank asked for, and once decided, what they get.
struct Change {
    /// By rank: `None` until it came; then `None` inside for a shrink, the
    /// newcomers' servers for an admission.
    asks: Vec<Option<Option<Vec<ServerId>>>>,
    decided: Option<Arc<Decided>>,
    taken: usize,
}

/// A decided change: the new epoch, or why there is none.
pub(super) enum Decided {
    /// The new group (a `Shared<B>`: the state holding it is not generic)
    /// and, by old rank, each member's new rank (`None` for a rank left
    /// out).
    Group {
        shared: Arc<dyn std::any::Any + Send + Sync>,
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

impl Changes {
    /// After a rank took change `number`: forget it once every rank has,
    /// and keep at most [`KEPT`] that some rank never came to.
    fn settle(&mut self, number: u64, ranks: usize) {
        if self.open.get(&number).is_some_and(|c| c.taken >= ranks) {
            self.open.remove(&number);
        }
        while self.open.len() > KEPT {
            // Only a change every rank that came to has taken: a rank
            // still waking to its decision must find it.
            let taken_by_all_who_came =
                |c: &Change| c.decided.is_some() && c.taken >= c.asks.iter().flatten().count();
            let Some((&oldest, _)) = self.open.iter().find(|(_, c)| taken_by_all_who_came(c))
            else {
                break;
            };
            self.open.remove(&oldest);
            self.forgotten_below = self.forgotten_below.max(oldest + 1);
        }
    }
}

/// The first rank that asked for another change than the lowest rank that
/// came, and what it asked, if any did.
fn disagreement(asks: &[Option<Option<Vec<ServerId>>>]) -> Option<(usize, String)> {
    let mut came = asks
        .iter()
        .enumerate()
        .filter_map(|(r, a)| Some((r, a.as_ref()?)));
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
                say(ask),
                say(expected)
            ),
        )
    })
}

/// What kind of change a rank asks for.
enum Ask<B: Backend> {
    Shrink,
    Admit(Vec<Client<B>>),
}

impl<B: Backend> Group<B> {
    /// The membership epoch: 0 for a group made with [`new`](Self::new) or
    /// [`over_device`](Self::over_device), one more after each change.
    pub fn epoch(&self) -> u64 {
        self.shared.epoch
    }
}

impl<B: Backend> Rank<B> {
    /// The membership epoch of its group ([`Group::epoch`]).
    pub fn epoch(&self) -> u64 {
        self.shared.epoch
    }

    /// Its group, for the handles of its other ranks (an admitted rank's
    /// thread takes its own from the group its peers' [`admit`](Self::admit)
    /// made).
    pub fn group(&self) -> Group<B> {
        Group {
            shared: self.shared.clone(),
        }
    }

    /// Form the group of the ranks that go on (rules 54, 55): every
    /// surviving rank calls this, once; the ranks known gone (named missing
    /// or failed by the round that broke the group, or whose device is
    /// lost) are not waited for, and one expected but absent at the
    /// deadline is left out. Every survivor gets its rank of the new epoch
    /// — the same membership on every one — and the old group takes no
    /// more calls ([`CollectiveError::Stale`]).
    ///
    /// # Errors
    ///
    /// [`Error::Refused`] for a rank whose own device is lost (it cannot be
    /// a survivor; recover it and be admitted) and for ranks that joined
    /// alone ([`Rank::join_epoch`] is their way); [`CollectiveError::Stale`]
    /// on a group already superseded; the device transport's failure to
    /// make the new epoch's communicators (refused on every survivor).
    pub fn shrink(&self) -> Result<Rank<B>> {
        self.change(Ask::Shrink)
    }

    /// Admit `newcomers` — clients of devices not in the group (a device
    /// that recovered, a new one) — as the group's last ranks, in order
    /// (rule 56): every current member calls this, once, with the same
    /// newcomers, and gets its rank of the new epoch; a newcomer's thread
    /// takes its rank from that group ([`group`](Self::group)). A newcomer
    /// holds what its device holds; heal what it needs from a healthy rank
    /// ([`heal`](Self::heal)) before it takes part as clean.
    ///
    /// # Errors
    ///
    /// Refused on every member, claiming nothing: newcomers that differ
    /// between members, none, a newcomer already in the group (one device
    /// cannot be two ranks), a newcomer whose device is lost; otherwise as
    /// [`shrink`](Self::shrink).
    pub fn admit(&self, newcomers: &[Client<B>]) -> Result<Rank<B>> {
        self.change(Ask::Admit(newcomers.to_vec()))
    }

    /// Write each of `buffers` from rank `root`'s bytes, on every rank: a
    /// broadcast per buffer, which heals what a rank's buffers carried
    /// (rule 41) — how a group gives an admitted rank its state. Every rank
    /// calls it with buffers of the same lengths, in the same order.
    ///
    /// Every buffer is broadcast, whatever an earlier one answered: each
    /// broadcast's outcome is the same on every rank, so the ranks stay in
    /// step, and one buffer the root cannot give does not keep the others
    /// unhealed.
    ///
    /// # Errors
    ///
    /// The first broadcast's error: a root whose bytes carry a failure
    /// fails that buffer on every rank with it (rule 41), naming the root.
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
        let ranks = shared.ranks;
        let what = match &ask {
            Ask::Shrink => None,
            Ask::Admit(newcomers) => Some(newcomers.iter().map(Client::server_id).collect()),
        };
        let until = Instant::now() + shared.deadline;
        let mut state = shared.state.lock();
        // A broken group is what a shrink is for; a superseded one is not.
        if let Some(stale) = state.stale(shared.epoch, self.rank) {
            return Err(stale.into());
        }
        let changes = state.changes.get_or_insert_with(|| Changes {
            called: vec![0; ranks],
            ..Changes::default()
        });
        let number = changes.called[self.rank];
        changes.called[self.rank] += 1;
        if number < changes.forgotten_below {
            return Err(self
                .refuse(
                    number,
                    "came to a membership change its peers decided long before; every rank \
                     must call each change"
                        .to_owned(),
                )
                .into());
        }
        let change = changes.open.entry(number).or_insert_with(|| Change {
            asks: vec![None; ranks],
            decided: None,
            taken: 0,
        });
        if change.decided.is_none() {
            change.asks[self.rank] = Some(what);
        }
        let decided = loop {
            let gone = self.known_gone(state.broken.as_deref());
            let Some(change) = state.changes.as_mut().and_then(|c| c.open.get_mut(&number)) else {
                return Err(Error::internal(
                    "a membership change left the group before its ranks took it",
                ));
            };
            if let Some(decided) = change.decided.clone() {
                change.taken += 1;
                break decided;
            }
            let all_here = (0..ranks).all(|r| change.asks[r].is_some() || gone.contains(&r));
            if all_here || Instant::now() >= until {
                let decided = match disagreement(&change.asks) {
                    Some((rank, why)) => {
                        Decided::Refused(self.refuse(number, why).with_rank(rank).into())
                    }
                    None => {
                        let arrived: Vec<usize> =
                            (0..ranks).filter(|&r| change.asks[r].is_some()).collect();
                        self.decide_change(&ask, number, &arrived)
                    }
                };
                if let Decided::Group { epoch, ranks, .. } = &decided {
                    state.superseded = Some((*epoch, ranks.iter().map(Option::is_some).collect()));
                }
                if let Some(change) = state.changes.as_mut().and_then(|c| c.open.get_mut(&number)) {
                    change.decided = Some(Arc::new(decided));
                }
                shared.changed.notify_all();
                continue;
            }
            let _ = shared.changed.wait_until(&mut state, until);
        };
        if let Some(changes) = state.changes.as_mut() {
            changes.settle(number, ranks);
        }
        drop(state);
        match &*decided {
            Decided::Refused(error) => Err(error.clone()),
            Decided::Group {
                shared: group,
                ranks: mapping,
                epoch,
            } => {
                let Some(rank) = mapping.get(self.rank).copied().flatten() else {
                    return Err(CollectiveError::Stale {
                        epoch: self.shared.epoch,
                        current: *epoch,
                        left_out: true,
                    }
                    .into());
                };
                let shared = group
                    .clone()
                    .downcast::<Shared<B>>()
                    .map_err(|_| Error::internal("a new epoch of another backend"))?;
                Ok(Rank { shared, rank })
            }
        }
    }

    /// A membership change refused on every rank that comes to it,
    /// claiming nothing: about this rank, until [`RefusedChange::with_rank`]
    /// names another.
    fn refuse(&self, number: u64, why: String) -> RefusedChange {
        RefusedChange {
            epoch: self.shared.epoch,
            number,
            rank: self.rank,
            why,
        }
    }

    /// The ranks a change does not wait for: named missing or failed by
    /// the round that broke the group, or whose device is lost.
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

    /// Decide a change among the ranks that `arrived` (in rank order): the
    /// new epoch's group, or a refusal for every participant.
    fn decide_change(&self, ask: &Ask<B>, number: u64, arrived: &[usize]) -> Decided {
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
        let group: Arc<dyn std::any::Any + Send + Sync> = Arc::new(Shared::new(
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
