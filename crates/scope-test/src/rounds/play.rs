//! One rank's side of the rounds: its buffers, its calls, its work behind them, and its reads
//! held to the oracle.
//!
//! Every assertion names the seed, the rank, the round and the last rounds drawn, so a failure
//! replays from the line it printed.

use super::changes::{self, Event, Handoff};
use super::draw::*;
use super::oracle::*;
use super::parts::Parts;
use crate::collective::collective_error;
use crate::property::Rng;
use crate::{as_bytes, as_words, injected};
use scope_core::backend::Backend;
use scope_core::collective::{CollectiveError, Element, Rank, Reduce};
use scope_core::{Client, Error, FaultPlan, Result, Site, Slice};

/// The most rounds in flight when the ranks read: a read comes after at most this many rounds.
pub const IN_FLIGHT: usize = 4;

/// Make `rank`'s calls of `collective` on `buffers`, in the order [`Oracle::apply`] answers them.
pub(super) fn call<B: Backend>(
    rank: &Rank<B>,
    parts: &Parts,
    collective: Collective,
) -> Vec<Result<()>> {
    let n = rank.ranks();
    let r = rank.index();
    let all = |slot: usize| parts.view(slot);
    match collective {
        Collective::AllReduce {
            src,
            dst,
            element,
            op,
        } => vec![rank.all_reduce(all(src), all(dst), element, op)],
        Collective::AllGather { src } => vec![rank.all_gather(all(src), all(WIDE))],
        Collective::ReduceScatter { dst, element, op } => {
            vec![rank.reduce_scatter(all(WIDE), all(dst), element, op)]
        }
        Collective::AllToAll { src, dst } => vec![rank.all_to_all(all(src), all(dst))],
        Collective::Broadcast { root, slot } => vec![rank.broadcast(root, all(slot))],
        Collective::Shift { src, dst } => {
            // Even ranks send first, odd ones receive first. Between processes a send waits for its
            // receiver (rule 48), so a ring in which every rank sends first would stall.
            let send = || rank.send((r + 1) % n, all(src));
            let recv = || rank.recv((r + n - 1) % n, all(dst));
            if r.is_multiple_of(2) {
                let sent = send();
                vec![sent, recv()]
            } else {
                let received = recv();
                vec![send(), received]
            }
        }
        Collective::Refused { odd, src, dst, how } => vec![match how {
            Disagreement::Call if r == odd => rank.all_gather(all(src), all(WIDE)),
            Disagreement::Length if r == odd => rank.all_reduce(
                all(src),
                parts.words(dst, PART / 2),
                Element::U32,
                Reduce::Sum,
            ),
            _ => rank.all_reduce(all(src), all(dst), Element::U32, Reduce::Sum),
        }],
    }
}

/// Whether `got` is what the oracle said the call answers.
pub(super) fn answered(at: &str, got: &Result<()>, expected: Answer) {
    match (got, expected) {
        (Ok(()), Answer::Ok) => {}
        (Err(error), Answer::InputFailed(rank)) => match error {
            Error::Collective(c) => match &**c {
                CollectiveError::InputFailed { rank: named, .. } if *named == rank => {}
                other => panic!("{at}: expected InputFailed naming rank {rank}, got {other}"),
            },
            other => panic!("{at}: expected InputFailed naming rank {rank}, got {other}"),
        },
        (Err(error), Answer::Refused) => assert!(
            matches!(collective_error(error), CollectiveError::Refused { .. }),
            "{at}: expected a refusal, got {error}"
        ),
        (Ok(()), Answer::IssueFailed(_)) => {}
        (Err(error), Answer::IssueFailed(ranks)) => assert!(
            matches!(collective_error(error), CollectiveError::IssueFailed { rank: named, .. } if ranks.names(*named)),
            "{at}: expected IssueFailed naming one of {ranks:?}, got {error}"
        ),
        (got, expected) => panic!("{at}: expected {expected:?}, got {got:?}"),
    }
}

/// Read `part` and hold it to what the oracle knows. A stale part's origins narrow to those its
/// root matches.
pub(super) fn check_read<B: Backend>(
    at: &str,
    client: &Client<B>,
    part: Slice<'_>,
    held: &mut Held,
) {
    match (client.read(part).map(|b| as_words(&b)), held) {
        (Ok(words), Held::Clean(expected)) => {
            assert!(
                words == *expected,
                "{at}: read {words:?}, expected {expected:?}"
            );
        }
        (Err(error), Held::Stale(origins)) => {
            let root = error.root();
            let (named, issue) = match root {
                Error::Collective(c) => match &**c {
                    CollectiveError::InputFailed { rank, .. } => (Some(*rank), false),
                    CollectiveError::IssueFailed { rank, .. } => (Some(*rank), true),
                    other => panic!("{at}: a stale buffer's root is {other}"),
                },
                _ => (None, false),
            };
            let text = format!("{root:?}");
            let before = origins.clone();
            origins.retain(|o| {
                o.named == named && o.issue == issue && text.contains(&tag_text(o.tag))
            });
            assert!(
                !origins.is_empty(),
                "{at}: the root names {named:?} and is {root}; expected one of {before:?}"
            );
        }
        (Ok(words), Held::Stale(origins)) => {
            panic!(
                "{at}: read {} words as clean; expected a failure from {origins:?}",
                words.len()
            )
        }
        (Err(error), Held::Clean(_)) => panic!("{at}: expected clean words, read failed: {error}"),
    }
}

/// What one rank's thread counted. Rounds recorded and replayed. Its calls that ran, failed on an
/// input, and were refused. Devices lost and recovered in place, and shrinks of every rank. Ranks
/// lost, shrunk away and admitted back. The most rounds in flight at a read, and the words read.
/// Rounds whose library call failed on a rank, and of them those where it failed on two at once.
pub(super) type Tally = [usize; 11];

/// Rank `rank`'s side of `rounds` random rounds from `seed`. Every round is drawn whole, and the
/// whole oracle kept. This rank's parts are played and its buffers held to the oracle.
/// `over_device`: the group's transport can record a round.
pub(super) fn play<B: Backend>(
    mut rank: Rank<B>,
    seed: u64,
    rounds: usize,
    over_device: bool,
    changes: Option<&Handoff<B>>,
) -> Tally {
    let n = rank.ranks();
    let mut tally = [0usize; 11];
    let mut in_flight = 0;
    // The rank whose failed call broke the group in the last round.
    let mut broken: Option<usize> = None;
    let c = rank.client().clone();
    let c = &c;
    let mut rng = Rng::new(seed);
    let mut oracle = Oracle::new(&mut rng, n);
    let first = rank.index();
    let parts = Parts::upload(c, &oracle, first, &mut Rng::new(seed ^ (first as u64 + 1)));
    let mut next_tag = 0;
    let mut log: Vec<String> = Vec::new();
    for round in 0..rounds {
        let expelled = broken.take();
        if let (Some(leaver), Some(handoff)) = (expelled, changes) {
            // The last round's failed call broke the group. The others go on without the rank it
            // names, known gone, then admit it back.
            let event = Event::Expel { leaver };
            log.push(format!("{round}: {event:?}"));
            let at = format!("seed {seed}, round {round}, {event:?}");
            rank = changes::apply(&at, (event, round), rank, &mut oracle, &parts, handoff);
        }
        // One change a round: the ranks order a change's steps by its round.
        let event = changes
            .and_then(|_| Event::draw(&mut rng, n, &mut next_tag))
            .filter(|_| expelled.is_none());
        if let (Some(event), Some(handoff)) = (event, changes) {
            log.push(format!("{round}: {event:?}"));
            let at = format!("seed {seed}, round {round}, {event:?}");
            rank = changes::apply(&at, (event, round), rank, &mut oracle, &parts, handoff);
            tally[match event {
                Event::Lose { .. } => 4,
                Event::Reform => 5,
                Event::Rotate { .. } | Event::Expel { .. } => 6,
            }] += 1;
        }
        let r = rank.index();
        let rank = &rank;
        let plan = Round::draw(&mut rng, n, &mut next_tag);
        // Where changes follow, one rank's library call may fail (rule 43), now and then two
        // ranks' at once: `(rank, tag)` each. The peers go on without it, so there are some.
        let mut failing: Vec<(usize, u32)> = Vec::new();
        if changes.is_some() && over_device && n > 1 && rng.chance(8) {
            let first = rng.index(n);
            next_tag += 1;
            failing.push((first, next_tag));
            if rng.chance(25) {
                next_tag += 1;
                failing.push(((first + 1 + rng.index(n - 1)) % n, next_tag));
            }
        }
        log.push(format!("{round}: {plan:?}, failing calls: {failing:?}"));
        let at = |what: &str| {
            let tail = log[log.len().saturating_sub(4)..].join("\n  ");
            format!("seed {seed}, rank {r}, round {round}, {what}; the last rounds:\n  {tail}")
        };
        for (owner, locals) in plan.locals.iter().enumerate() {
            for local in locals {
                oracle.local(owner, local);
                if owner == r {
                    do_local(c, &parts, local);
                }
            }
        }
        let collective = plan.collective;
        // A call fails only where it is made: every input clean, through the library.
        if !(collective.recordable() && oracle.first_failed(collective).is_none()) {
            failing.clear();
        }
        if let Some((_, tag)) = failing.iter().find(|(failed, _)| *failed == r) {
            c.inject(FaultPlan::new().fail(Site::Collective, 1, injected(&tag_text(*tag))));
        }
        let mut copied_in_graph = None;
        let answers = if plan.recorded
            && failing.is_empty()
            && over_device
            && collective.recordable()
            && oracle.first_failed(collective).is_none()
        {
            let capture = c.begin_capture().expect("a window opens");
            for recorded in call(rank, &parts, collective) {
                recorded.unwrap_or_else(|e| panic!("{}: {e}", at("recording")));
            }
            if let (Some(from), Some(to)) = (collective.writes(), plan.recorded_copy) {
                c.copy(parts.view(from), parts.view(to))
                    .unwrap_or_else(|e| panic!("{}: {e}", at("recording the copy")));
                copied_in_graph = Some((from, to));
            }
            let graph = c
                .end_capture(capture)
                .unwrap_or_else(|e| panic!("{}: {e}", at("sealing")));
            if let Some((owner, late)) = &plan.late {
                oracle.local(*owner, late);
                if *owner == r {
                    do_local(c, &parts, late);
                }
            }
            tally[0] += 1;
            let replayed = rank.replay(&graph);
            c.destroy_graph(&graph)
                .unwrap_or_else(|e| panic!("{}: {e}", at("destroying the graph")));
            vec![replayed]
        } else {
            call(rank, &parts, collective)
        };
        // A rank whose call was to fail may never have made it: a peer's failure broke the round
        // first. Its plan goes, so that no later call fails for it.
        if failing.iter().any(|(failed, _)| *failed == r) {
            c.inject(FaultPlan::new());
        }
        let expected = if failing.is_empty() {
            oracle.apply(collective)
        } else {
            oracle.failed_call(collective, &failing)
        };
        for (i, (got, &want)) in answers.iter().zip(&expected[r]).enumerate() {
            answered(&at(&format!("call {i}")), got, want);
            match want {
                Answer::Ok => tally[1] += 1,
                Answer::InputFailed(_) => tally[2] += 1,
                Answer::Refused => tally[3] += 1,
                Answer::IssueFailed(failed) => {
                    assert!(
                        !failed.names(r) || got.is_err(),
                        "{}",
                        at("the failed call returned Ok")
                    );
                    tally[9] += 1;
                    tally[10] += usize::from(failing.len() > 1);
                }
            }
        }
        if let Some((from, to)) = copied_in_graph {
            for owner in 0..n {
                oracle.local(owner, &Local::Copy { from, to });
            }
        }
        // After a failed call only reads of its output follow: anything else issued then is claimed
        // or not as the claim's timing falls, which no oracle can say.
        let reads_output = |local: &&Local| match local {
            Local::Copy { from, .. } | Local::Through { from, .. } => {
                Some(*from) == collective.writes()
            }
            _ => false,
        };
        for (owner, locals) in plan.after.iter().enumerate() {
            for local in locals
                .iter()
                .filter(|l| failing.is_empty() || reads_output(l))
            {
                oracle.local(owner, local);
                if owner == r {
                    do_local(c, &parts, local);
                }
            }
        }
        in_flight += 1;
        // A peer whose call went out learns of the failure later (rule 47): only once every read
        // waited for the round may a failed call's group be required broken.
        assert!(
            !failing.is_empty() || rank.broken().is_none(),
            "{}",
            at("the group broke")
        );
        // Around a change every rank reads: the change's own checks expect nothing in flight.
        if plan.read || in_flight == IN_FLIGHT || round + 1 == rounds || changes.is_some() {
            for slot in 0..=SLOTS {
                check_read(
                    &at(&format!("buffer {slot} ({in_flight} rounds in flight)")),
                    c,
                    parts.view(slot),
                    &mut oracle.held[r][slot],
                );
                tally[8] += words_in(slot, n) as usize;
            }
            parts.check_margins(&at("the margins"), c);
            if let Err(books) = c.audit() {
                panic!("{}: {books}", at("the store's books"));
            }
            tally[7] = tally[7].max(in_flight);
            in_flight = 0;
            assert_eq!(
                rank.broken().is_some(),
                !failing.is_empty(),
                "{}",
                at("a failed call's group, once read, is broken")
            );
            // The group names the first rank whose call failed: every rank reads the same.
            broken = rank.broken().map(|why| match *why {
                CollectiveError::IssueFailed { rank: named, .. }
                    if failing.iter().any(|(failed, _)| *failed == named) =>
                {
                    named
                }
                ref other => panic!("{}: {other}", at("the group broke naming no failed call")),
            });
        }
    }
    tally
}

pub(super) fn do_local<B: Backend>(c: &Client<B>, parts: &Parts, local: &Local) {
    match local {
        Local::Write { slot, words } => c
            .write(parts.view(*slot), &as_bytes(words))
            .expect("a host write"),
        Local::Fail { slot, tag } => c
            .fail_writing(&[parts.view(*slot)], injected(&tag_text(*tag)))
            .expect("a claim from outside"),
        Local::Copy { from, to } => {
            // A copy of stale bytes is skipped, its destination claimed.
            let _ = c.copy(parts.view(*from), parts.view(*to));
        }
        Local::Through { from, to } => {
            let through = c
                .try_allocate(u64::from(PART) * 4)
                .expect("a buffer to copy through");
            let _ = c.copy(parts.view(*from), through.all());
            let _ = c.copy(through.all(), parts.view(*to));
        }
    }
}
