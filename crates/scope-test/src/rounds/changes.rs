//! Loss, recovery, shrink and admission between random rounds (rules 51–57). These are the events a
//! group meets when a rank's device is lost. They are drawn from the same seed on every rank. So
//! every rank's thread knows the whole event and keeps the whole oracle, as for the rounds
//! themselves.
//!
//! - **Lose**: one rank's device is lost and recovered at once. The loss is an injected sticky
//!   fault, its text the event's tag. The rank stays a member. Every byte it held is stale, "lost
//!   with the device", until a write or a collective heals it (rule 51).
//! - **Reform**: every rank shrinks, with no one gone. The same members take the next epoch, and
//!   every call through the old one is refused (rules 54, 55).
//! - **Rotate**: one rank's device is lost, and the others shrink without waiting for it. It
//!   recovers, and they admit it back as the last rank. Its bytes are stale as for a loss (rules
//!   51, 54, 56).
//! - **Expel**: one rank's library call failed in the last round, breaking the group. The others
//!   shrink without it, and admit it back as the last rank. Its device and bytes are as they were
//!   (rules 43, 54, 56).
//!
//! The ranks of a rotation meet outside the group to order its steps. The lost rank loses its
//! device before its peers shrink. It recovers only once they have, since a recovered device is no
//! longer known gone. It takes its new rank from the group they admitted it to. A runtime's
//! launcher does the same, between the processes it runs.

use std::time::Instant;

use parking_lot::Condvar;

use super::draw::*;
use super::oracle::*;
use super::parts::Parts;
use crate::as_bytes;
use crate::collective::DEFAULT_WAIT;
use crate::property::Rng;
use parking_lot::Mutex;
use scope_core::backend::Backend;
use scope_core::collective::Group;
use scope_core::collective::{CollectiveError, Element, Rank, Reduce};
use scope_core::{Client, Error, FaultPlan};

/// Percent of rounds that begin with an event, where events are drawn.
const EVENTS: u64 = 6;

/// One event between rounds.
#[derive(Clone, Copy, Debug)]
pub(super) enum Event {
    Lose { rank: usize, tag: u32 },
    Reform,
    Rotate { leaver: usize, tag: u32 },
    Expel { leaver: usize },
}

impl Event {
    /// An event before this round, or none, for a group of `n`.
    pub(super) fn draw(rng: &mut Rng, n: usize, next_tag: &mut u32) -> Option<Self> {
        if !rng.chance(EVENTS) {
            return None;
        }
        *next_tag += 1;
        let tag = *next_tag;
        let kinds = if n > 1 { 3 } else { 2 };
        Some(match rng.index(kinds) {
            0 => Event::Lose {
                rank: rng.index(n),
                tag,
            },
            1 => Event::Reform,
            _ => Event::Rotate {
                leaver: rng.index(n),
                tag,
            },
        })
    }
}

/// What the ranks of one play say to each other to order a rotation's steps. Each signal is keyed
/// by the round it belongs to.
pub(super) struct Handoff<B: Backend> {
    signals: Mutex<Signals<B>>,
    changed: Condvar,
}

struct Signals<B: Backend> {
    /// The leaver's device is lost.
    lost: Option<usize>,
    /// The survivors shrank.
    shrunk: Option<usize>,
    /// The leaver recovered.
    recovered: Option<usize>,
    /// The survivors admitted it: the group.
    grown: Option<(usize, Group<B>)>,
}

impl<B: Backend> Handoff<B> {
    pub(super) fn new() -> Self {
        Self {
            signals: Mutex::new(Signals {
                lost: None,
                shrunk: None,
                recovered: None,
                grown: None,
            }),
            changed: Condvar::new(),
        }
    }

    fn signal(&self, set: impl FnOnce(&mut Signals<B>)) {
        set(&mut self.signals.lock());
        self.changed.notify_all();
    }

    /// Wait, at most the group's deadline, until `ready` finds what it waits for.
    fn wait<T>(&self, what: &str, mut ready: impl FnMut(&Signals<B>) -> Option<T>) -> T {
        let until = Instant::now() + DEFAULT_WAIT;
        let mut signals = self.signals.lock();
        loop {
            if let Some(found) = ready(&signals) {
                return found;
            }
            if self.changed.wait_until(&mut signals, until).timed_out() {
                return ready(&signals)
                    .unwrap_or_else(|| panic!("a rotation waited {DEFAULT_WAIT:?} for {what}"));
            }
        }
    }
}

/// Lose `c`'s device: a sticky fault whose text carries `tag`, surfaced by a write.
fn lose<B: Backend>(c: &Client<B>, parts: &Parts, tag: u32) {
    let code = format!("DEVICE_LOST {}", tag_text(tag));
    c.inject(FaultPlan::new().poison_at(1, "injected", &code));
    let error = c
        .write(parts.view(0), &as_bytes(&vec![0; PART as usize]))
        .expect_err("the write meets the loss");
    assert!(error.is_sticky(), "{error}");
}

/// Open `c`'s lost device again, and write its margins back. The rounds check them after every
/// round, and a recovery lost them with the rest.
fn recover<B: Backend>(c: &Client<B>, parts: &Parts) {
    match c.recover() {
        Ok(scope_core::Recovered::Reopened { .. }) => {}
        other => panic!("the device opens again: {other:?}"),
    }
    for (buffer, (before, after)) in parts.buffers.iter().zip(&parts.margins) {
        let margin = u64::from(MARGIN) * 4;
        let end = buffer.size();
        c.write(buffer.slice(0..margin), &as_bytes(before))
            .expect("a margin written back");
        c.write(buffer.slice(end - margin..end), &as_bytes(after))
            .expect("a margin written back");
    }
}

impl Oracle {
    /// Every buffer of `rank` lost with its device, by the fault `tag`.
    fn lost(&mut self, rank: usize, tag: u32) {
        for held in &mut self.held[rank] {
            *held = Held::Stale(vec![Origin {
                named: None,
                issue: false,
                tag,
            }]);
        }
    }
}

/// A call through `old`, whose epoch a change superseded: refused as stale, claiming nothing.
fn assert_stale<B: Backend>(at: &str, old: &Rank<B>, parts: &Parts) {
    let refused = old.all_reduce(parts.view(0), parts.view(1), Element::U32, Reduce::Sum);
    match refused {
        Err(Error::Collective(c)) if matches!(*c, CollectiveError::Stale { .. }) => {}
        other => panic!("{at}: a call through the old epoch answered {other:?}"),
    }
}

/// Apply `event` on `rank`'s thread to the oracle. Where it is this rank's part, apply it to its
/// device and its group too. The rank it goes on as.
pub(super) fn apply<B: Backend>(
    at: &str,
    (event, round): (Event, usize),
    rank: Rank<B>,
    oracle: &mut Oracle,
    parts: &Parts,
    handoff: &Handoff<B>,
) -> Rank<B> {
    let r = rank.index();
    let c = rank.client().clone();
    match event {
        Event::Lose { rank: lost, tag } => {
            oracle.lost(lost, tag);
            if lost == r {
                lose(&c, parts, tag);
                recover(&c, parts);
            }
            rank
        }
        Event::Reform => {
            let shrunk = rank
                .shrink()
                .unwrap_or_else(|e| panic!("{at}: every rank shrinks: {e}"));
            assert_eq!(shrunk.index(), r, "{at}: the same order");
            assert_eq!(shrunk.epoch(), rank.epoch() + 1, "{at}: the next epoch");
            assert_stale(at, &rank, parts);
            shrunk
        }
        Event::Rotate { leaver, .. } | Event::Expel { leaver } => {
            let n = rank.ranks();
            let tag = match event {
                Event::Rotate { tag, .. } => Some(tag),
                _ => None,
            };
            if let Some(tag) = tag {
                oracle.lost(leaver, tag);
            }
            let row = oracle.held.remove(leaver);
            oracle.held.push(row);
            if leaver == r {
                if let Some(tag) = tag {
                    lose(&c, parts, tag);
                }
                handoff.signal(|s| s.lost = Some(round));
                handoff.wait("the survivors' shrink", |s| {
                    (s.shrunk == Some(round)).then_some(())
                });
                if tag.is_some() {
                    recover(&c, parts);
                }
                handoff.signal(|s| s.recovered = Some(round));
                let grown = handoff.wait("the admission", |s| {
                    s.grown
                        .as_ref()
                        .filter(|(at, _)| *at == round)
                        .map(|(_, g)| g.clone())
                });
                assert_stale(at, &rank, parts);
                return grown
                    .rank(n - 1)
                    .unwrap_or_else(|e| panic!("{at}: the last rank: {e}"));
            }
            let newcomer = rank
                .group()
                .rank(leaver)
                .unwrap_or_else(|e| panic!("{at}: the leaver's rank: {e}"))
                .client()
                .clone();
            handoff.wait("the leaver's loss", |s| {
                (s.lost == Some(round)).then_some(())
            });
            let shrunk = rank
                .shrink()
                .unwrap_or_else(|e| panic!("{at}: the survivors shrink: {e}"));
            assert_eq!(shrunk.ranks(), n - 1, "{at}: the leaver is left out");
            if shrunk.index() == 0 {
                handoff.signal(|s| s.shrunk = Some(round));
            }
            handoff.wait("the leaver's recovery", |s| {
                (s.recovered == Some(round)).then_some(())
            });
            let grown = shrunk
                .admit(std::slice::from_ref(&newcomer))
                .unwrap_or_else(|e| panic!("{at}: the survivors admit it: {e}"));
            assert_eq!(grown.ranks(), n, "{at}: admitted");
            if grown.index() == 0 {
                let group = grown.group();
                handoff.signal(|s| s.grown = Some((round, group)));
            }
            assert_stale(at, &rank, parts);
            assert_stale(at, &shrunk, parts);
            grown
        }
    }
}
