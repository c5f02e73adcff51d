//! A group that lost a rank goes on (rules 54–57):
//!
//! - its survivors shrink to a group of themselves, the same on every
//!   survivor, without waiting for a rank known gone;
//! - the old epoch refuses every call, claiming nothing;
//! - a newcomer is admitted, and healed by a broadcast before its bytes
//!   count as clean;
//! - every wrong change is refused on every rank.
//!
//! The behaviours run on the suite's group ([`Suite::group`]): host staging,
//! or a device transport, whose new epoch joins new communicators.

use std::time::{Duration, Instant};

use super::collective::{DEFAULT_WAIT, PART, RANKS, collective_error, group, group_of};
use super::*;
use scope_core::collective::{CollectiveError, Element, Group, Rank, Reduce};

/// Lose `c`'s device: an injected sticky fault at its next launch.
pub(super) fn lose_device<S: Suite>(c: &Client<S::Backend>) {
    let victim = alloc(c, PART);
    c.inject(FaultPlan::new().poison_at(1, "injected", "DEVICE_LOST"));
    let error = fill::<S>(c, &victim, 1).unwrap_err();
    assert!(error.is_sticky(), "{error}");
    assert!(c.poison().is_some());
}

/// A mean of `3 * (rank + 1)` over `rank`'s group, as every rank reads it.
fn mean_over<S: Suite>(rank: &Rank<S::Backend>) -> Vec<u32> {
    let c = rank.client();
    let value = 3 * (rank.index() as u32 + 1);
    let input = upload(c, &[value; PART as usize]);
    let output = alloc(c, PART);
    rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Mean)
        .unwrap_or_else(|e| panic!("rank {}: the new epoch computes: {e}", rank.index()));
    read_twice::<S>(c, &output).unwrap()
}

/// What the new epoch's mean must be over `ranks` ranks: every rank's
/// `3 * (rank + 1)`, summed and divided by `ranks` — never by the old size.
fn expected_mean(ranks: u32) -> Vec<u32> {
    let sum: u32 = (1..=ranks).map(|r| 3 * r).sum();
    vec![sum / ranks; PART as usize]
}

/// A call through `rank`, of the superseded epoch: refused as stale,
/// claiming nothing (its output keeps its bytes).
fn assert_stale<S: Suite>(rank: &Rank<S::Backend>, left_out: bool) {
    let c = rank.client();
    let input = upload(c, &[1; PART as usize]);
    let output = upload(c, &[5; PART as usize]);
    let error = rank
        .all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
        .expect_err("a superseded epoch takes no calls");
    let CollectiveError::Stale {
        epoch,
        current,
        left_out: out,
    } = collective_error(&error)
    else {
        panic!("rank {}: {error}", rank.index());
    };
    assert_eq!((*epoch, *current, *out), (0, 1, left_out), "{error}");
    assert_eq!(
        read_twice::<S>(c, &output).unwrap(),
        vec![5; PART as usize],
        "a stale call claims nothing"
    );
}

/// The group's ranks, shrunk: each survivor's handle of the new epoch, by
/// old rank (`None` for a rank that did not call).
fn shrink_all<B: Backend>(group: &Group<B>, survivors: &[usize]) -> Vec<Option<Result<Rank<B>>>> {
    group.run(|rank| survivors.contains(&rank.index()).then(|| rank.shrink()))
}

/// A rank that never joined fails its peers' collective and breaks the
/// group. The survivors shrink to a group of themselves, the same on every
/// one, their ranks in their old order. They go on, a mean now over three
/// ranks. Every call through the old epoch is refused as stale, claiming
/// nothing, the absent rank's as left out (rules 43, 54, 55).
pub fn survivors_of_a_missing_rank_shrink_and_go_on<S: Suite>() {
    let deadline = Duration::from_millis(300);
    let Some(group) = group::<S>(deadline) else {
        return;
    };
    let outcomes = group.run(|rank| {
        if rank.index() == 3 {
            return None;
        }
        let c = rank.client();
        let input = upload(c, &[1; PART as usize]);
        let output = alloc(c, PART);
        let missing = rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
        assert!(
            matches!(
                collective_error(&missing.unwrap_err()),
                CollectiveError::Missing { .. }
            ),
            "rank {} finds rank 3 missing",
            rank.index()
        );
        let shrunk = rank
            .shrink()
            .unwrap_or_else(|e| panic!("rank {}: a broken group shrinks: {e}", rank.index()));
        assert_eq!(shrunk.epoch(), 1);
        assert_eq!(shrunk.ranks(), 3);
        assert_eq!(shrunk.index(), rank.index(), "ranks keep their order");
        assert!(shrunk.client().same_server(c));
        assert!(shrunk.broken().is_none(), "the new epoch is whole");
        let mean = mean_over::<S>(&shrunk);
        assert_stale::<S>(&rank, false);
        Some(mean)
    });
    for (rank, mean) in outcomes.into_iter().enumerate().take(3) {
        assert_eq!(mean.unwrap(), expected_mean(3), "rank {rank}");
    }
    assert_eq!(group.epoch(), 0, "the old group is the old epoch");
    let late = group.rank(3).unwrap();
    assert_stale::<S>(&late, true);
    let shrink = late.shrink().expect_err("a rank left out cannot shrink");
    assert!(
        matches!(
            collective_error(&shrink),
            CollectiveError::Stale { left_out: true, .. }
        ),
        "{shrink}"
    );
}

/// A rank not known gone is waited for, at most the deadline: one that
/// does not come to the shrink is left out of it, and finds the group
/// superseded when it comes (rules 54, 55).
pub fn a_rank_absent_from_a_shrink_is_left_out_at_the_deadline<S: Suite>() {
    let deadline = Duration::from_millis(300);
    let Some(group) = group::<S>(deadline) else {
        return;
    };
    let shrunk = shrink_all(&group, &[0, 1, 2]);
    let survivors: Vec<Rank<_>> = shrunk
        .into_iter()
        .take(3)
        .map(|r| r.expect("called").expect("the ranks that came go on"))
        .collect();
    assert!(survivors.iter().all(|r| r.ranks() == 3 && r.epoch() == 1));
    let means = survivors[0].group().run(|rank| mean_over::<S>(&rank));
    assert!(means.iter().all(|m| *m == expected_mean(3)), "{means:?}");
    assert_stale::<S>(&group.rank(3).unwrap(), true);
}

/// A rank whose device is lost is known gone: its input fails every
/// rank's collective (rule 41), its own shrink is refused (it cannot go
/// on), and the survivors' shrink does not wait the deadline for it (rule
/// 54).
pub fn a_rank_whose_device_is_lost_is_not_waited_for<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    let buffers: Vec<(Buffer, Buffer)> = (0..RANKS)
        .map(|r| {
            let rank = group.rank(r).unwrap();
            let c = rank.client();
            (upload(c, &[1; PART as usize]), alloc(c, PART))
        })
        .collect();
    lose_device::<S>(group.rank(3).unwrap().client());
    let started = Instant::now();
    let outcomes = group.run(|rank| {
        let c = rank.client();
        // Rank 3's buffers were made before its device was lost.
        let (input, output) = &buffers[rank.index()];
        let failed = rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
        let failed = failed.expect_err("rank 3's input cannot be read");
        if rank.index() == 3 {
            let refused = rank.shrink().expect_err("a lost device cannot go on");
            assert!(matches!(refused, Error::Refused { .. }), "{refused}");
            assert!(refused.to_string().contains("DEVICE_LOST"), "{refused}");
            return None;
        }
        assert!(
            read_twice::<S>(c, output).is_err(),
            "the output carries the failure"
        );
        assert!(
            matches!(
                collective_error(&failed),
                CollectiveError::InputFailed { rank: 3, .. }
            ),
            "{failed}"
        );
        let shrunk = rank.shrink().expect("the survivors go on");
        Some((started.elapsed(), mean_over::<S>(&shrunk)))
    });
    for (rank, outcome) in outcomes.into_iter().enumerate().take(3) {
        let (waited, mean) = outcome.unwrap();
        assert!(
            waited < DEFAULT_WAIT / 2,
            "rank {rank} waited {waited:?} for a rank known gone"
        );
        assert_eq!(mean, expected_mean(3), "rank {rank}");
    }
}

/// A newcomer is admitted by every member as the last rank. What its
/// buffers held is not trusted: a collective that reads them fails on
/// every rank (rule 41). A broadcast from a healthy rank heals them, and
/// then every rank holds bit-identical weights (rules 56, 57).
pub fn a_newcomer_is_admitted_and_healed_by_its_peers<S: Suite>() {
    let Some(group) = group_of::<S>(RANKS - 1, DEFAULT_WAIT) else {
        return;
    };
    let newcomer = S::rank_client(RANKS - 1).expect("a fourth device");
    // The newcomer's weights hold what its device holds: not the group's.
    let stale = upload(&newcomer, &[99; PART as usize]);
    newcomer
        .fail_writing(&[stale.all()], injected("never trained"))
        .unwrap();
    let weights: Vec<Buffer> = (0..RANKS - 1)
        .map(|r| upload(group.rank(r).unwrap().client(), &[7; PART as usize]))
        .chain([stale])
        .collect();
    let admitted = group.run(|rank| {
        rank.admit(std::slice::from_ref(&newcomer))
            .unwrap_or_else(|e| panic!("rank {}: admitted: {e}", rank.index()))
    });
    assert!(
        admitted
            .iter()
            .all(|r| r.epoch() == 1 && r.ranks() == RANKS)
    );
    let grown = admitted[0].group();
    assert!(
        grown
            .rank(RANKS - 1)
            .unwrap()
            .client()
            .same_server(&newcomer),
        "the newcomer is the last rank"
    );
    let outcomes = grown.run(|rank| {
        let c = rank.client();
        let mine = &weights[rank.index()];
        let sum = alloc(c, PART);
        let unhealed = rank.all_reduce(mine.all(), sum.all(), Element::U32, Reduce::Sum);
        let healed = rank.heal(0, &[mine.all()]);
        rank.all_reduce(mine.all(), sum.all(), Element::U32, Reduce::Sum)
            .unwrap_or_else(|e| panic!("rank {}: healed weights reduce: {e}", rank.index()));
        (
            unhealed,
            healed,
            read_twice::<S>(c, mine),
            read_twice::<S>(c, &sum),
        )
    });
    for (rank, (unhealed, healed, mine, sum)) in outcomes.into_iter().enumerate() {
        let unhealed = unhealed.expect_err("unhealed weights are not clean");
        assert!(
            matches!(
                collective_error(&unhealed),
                CollectiveError::InputFailed { rank: 3, .. }
            ),
            "rank {rank}: {unhealed}"
        );
        healed.unwrap_or_else(|e| panic!("rank {rank}: the heal: {e}"));
        assert_eq!(
            mine.unwrap(),
            vec![7; PART as usize],
            "rank {rank}'s weights"
        );
        assert_eq!(sum.unwrap(), vec![28; PART as usize], "rank {rank}'s sum");
    }
    assert_stale::<S>(&group.rank(0).unwrap(), false);
}

/// Every wrong membership change is refused on every rank, claiming
/// nothing, and the group goes on at its epoch. The changes: no newcomer,
/// a newcomer already a rank, a newcomer whose device is lost, ranks that
/// ask for different changes. A heal whose root's bytes carry a failure
/// fails every rank's buffer, naming the root (rules 38, 41, 56, 57).
pub fn bad_membership_changes_are_refused_everywhere<S: Suite>() {
    // Three ranks, and a fourth device to name as a newcomer.
    let ranks = RANKS - 1;
    let Some(group) = group_of::<S>(ranks, DEFAULT_WAIT) else {
        return;
    };
    let member = group.rank(1).unwrap().client().clone();
    let fresh = S::rank_client(ranks).expect("a fourth device");
    // By rank, the newcomers each rank names.
    let everyone = |newcomers: Vec<Client<S::Backend>>| vec![newcomers; ranks];
    let mut different = everyone(vec![fresh.clone()]);
    different[2] = vec![member.clone()];
    let refuses = |what: &str, newcomers: &[Vec<Client<S::Backend>>]| {
        let refused = group.run(|rank| rank.admit(&newcomers[rank.index()]).map(|_| ()));
        for (rank, refused) in refused.into_iter().enumerate() {
            let error = refused.expect_err(what);
            assert!(
                matches!(collective_error(&error), CollectiveError::Refused { .. }),
                "{what}, rank {rank}: {error}"
            );
        }
        assert_eq!(group.epoch(), 0, "{what}");
    };
    refuses("no newcomer", &everyone(Vec::new()));
    refuses("a member", &everyone(vec![member.clone()]));
    refuses(
        "twice the same newcomer",
        &everyone(vec![fresh.clone(), fresh.clone()]),
    );
    refuses("different newcomers", &different);
    // A shrink on some ranks and an admission on others: no one changes.
    let mixed = group.run(|rank| match rank.index() {
        0 | 1 => rank.shrink().map(|_| ()),
        _ => rank.admit(std::slice::from_ref(&fresh)).map(|_| ()),
    });
    for (rank, refused) in mixed.into_iter().enumerate() {
        let error = refused.expect_err("disagreeing ranks are refused");
        assert!(
            error.to_string().contains("asked to"),
            "rank {rank}: {error}"
        );
    }
    lose_device::<S>(&fresh);
    refuses("a lost device", &everyone(vec![fresh.clone()]));
    // The group is untouched, and a heal from a failed root fails every
    // rank's buffer, naming the root.
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let data = upload(c, &[rank.index() as u32; PART as usize]);
        if rank.index() == 2 {
            c.fail_writing(&[data.all()], injected("the root's own bytes"))
                .unwrap();
        }
        let failed = rank.heal(2, &[data.all()]);
        (failed, read_twice::<S>(c, &data), mean_over::<S>(&rank))
    });
    for (rank, (failed, data, mean)) in outcomes.into_iter().enumerate() {
        let error = failed.expect_err("a failed root heals no one");
        assert!(
            matches!(
                collective_error(&error),
                CollectiveError::InputFailed { rank: 2, .. }
            ),
            "rank {rank}: {error}"
        );
        assert!(
            data.is_err(),
            "rank {rank}: the buffer carries the root's failure"
        );
        assert_eq!(mean, expected_mean(ranks as u32), "rank {rank}");
    }
    assert!(group.broken().is_none());
}

/// A rank's device is lost in the middle of training, and the others shrink
/// and train on. It recovers, its weights lost with the device (rule 51).
/// It is admitted back and healed by a broadcast. Then the four ranks'
/// weights are bit-identical (rules 51, 54, 56, 57).
pub fn a_lost_rank_recovers_and_is_admitted_back<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    let weights: Vec<Buffer> = (0..RANKS)
        .map(|r| upload(group.rank(r).unwrap().client(), &[1; PART as usize]))
        .collect();
    let lost = group.rank(2).unwrap().client().clone();
    lose_device::<S>(&lost);
    let survivors = group.run(|rank| {
        let c = rank.client();
        let mine = &weights[rank.index()];
        let step = rank.all_reduce(mine.all(), mine.all(), Element::U32, Reduce::Sum);
        let step = step.expect_err("rank 2's weights cannot be read");
        if rank.index() == 2 {
            // Its own output cannot even be claimed: its device is lost.
            assert!(step.is_device_poisoned(), "{step}");
            return None;
        }
        assert!(
            matches!(
                collective_error(&step),
                CollectiveError::InputFailed { rank: 2, .. }
            ),
            "{step}"
        );
        assert!(
            read_twice::<S>(c, mine).is_err(),
            "the failed step's output carries it"
        );
        let shrunk = rank.shrink().expect("the survivors go on");
        // The survivors reload their weights and take one step: a sum of
        // three ones.
        c.write(mine.all(), &as_bytes(&[1; PART as usize])).unwrap();
        shrunk
            .all_reduce(mine.all(), mine.all(), Element::U32, Reduce::Sum)
            .unwrap();
        Some(shrunk)
    });
    let survivors: Vec<Rank<_>> = survivors.into_iter().flatten().collect();
    assert_eq!(survivors.len(), 3);
    match lost.recover() {
        Ok(scope_core::Recovered::Reopened { .. }) => {}
        other => panic!("the device opens again: {other:?}"),
    }
    let error = read(&lost, &weights[2]).unwrap_err();
    assert!(error.is_lost_with_device(), "{error}");
    let admitted = survivors[0].group().run(|rank| {
        rank.admit(std::slice::from_ref(&lost))
            .unwrap_or_else(|e| panic!("rank {}: admits: {e}", rank.index()))
    });
    let grown = admitted[0].group();
    assert_eq!(grown.ranks(), RANKS);
    assert_eq!(grown.epoch(), 2);
    // By new rank: the survivors in their order, then the recovered one.
    let order = [0, 1, 3, 2];
    let outcomes = grown.run(|rank| {
        let mine = &weights[order[rank.index()]];
        rank.heal(0, &[mine.all()])
            .unwrap_or_else(|e| panic!("rank {}: healed: {e}", rank.index()));
        rank.all_reduce(mine.all(), mine.all(), Element::U32, Reduce::Sum)
            .unwrap();
        read(rank.client(), mine).unwrap()
    });
    for (rank, weights) in outcomes.iter().enumerate() {
        assert_eq!(weights, &vec![12; PART as usize], "rank {rank}");
    }
}

/// The membership behaviours: one `#[test]` each for
/// `$suite`, with what each needs.
#[macro_export]
macro_rules! membership_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, membership::survivors_of_a_missing_rank_shrink_and_go_on }
        $crate::behaviour! { $suite, membership::a_rank_absent_from_a_shrink_is_left_out_at_the_deadline }
        $crate::behaviour! { $suite, membership::a_rank_whose_device_is_lost_is_not_waited_for }
        $crate::behaviour! { $suite, membership::a_newcomer_is_admitted_and_healed_by_its_peers }
        $crate::behaviour! { $suite, membership::bad_membership_changes_are_refused_everywhere }
        $crate::behaviour! { $suite, membership::a_lost_rank_recovers_and_is_admitted_back, Reopen }
    };
}
