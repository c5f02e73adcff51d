//! Collectives in captured graphs (rule 50). Every rank records them as a round. Every rank replays
//! them together with [`Rank::replay`], never alone. A failed input at replay fails every rank's
//! replay, naming the rank. Graphs of other rounds are refused everywhere. A rank that never
//! replays fails the others within the deadline.

use std::time::{Duration, Instant};

use super::collective::{
    PART, RANKS, a_new_group_over_its_devices_works, collective_error, group,
    names_the_failed_issue,
};
use super::*;
use scope_core::Graph;
use scope_core::collective::{CollectiveError, Element, Group, Rank, Reduce};

/// How long a rank waits where no rank is meant to go missing.
const WAIT: Duration = Duration::from_secs(120);

/// One rank's graph of a sum and a gather of `input`, and their outputs.
pub(super) struct Recorded {
    pub(super) input: Buffer,
    pub(super) sum: Buffer,
    pub(super) gathered: Buffer,
    pub(super) graph: Graph,
}

/// Record, on `rank`, an all-reduce of `input` into `sum` and an all-gather of it into `gathered`.
/// Every rank must call this together.
fn record<B: Backend>(rank: &Rank<B>) -> Recorded {
    record_sized(rank, PART, RANKS)
}

/// [`record`] with parts of `words` words, in a group of `ranks`.
pub(super) fn record_sized<B: Backend>(rank: &Rank<B>, words: u32, ranks: usize) -> Recorded {
    let c = rank.client();
    let input = upload(c, &vec![0; words as usize]);
    let sum = alloc(c, words);
    let gathered = alloc(c, words * ranks as u32);
    let capture = c.begin_capture().unwrap();
    rank.all_reduce(input.all(), sum.all(), Element::U32, Reduce::Sum)
        .expect("recorded on every rank");
    rank.all_gather(input.all(), gathered.all())
        .expect("recorded on every rank");
    let graph = c.end_capture(capture).expect("a clean window seals");
    Recorded {
        input,
        sum,
        gathered,
        graph,
    }
}

/// Collectives recorded in a window on every rank replay together and compute what they say. Each
/// replay takes fresh inputs. A graph that holds collectives is refused when one client replays it
/// alone, claiming nothing (rule 50).
pub fn collectives_recorded_in_a_graph_replay_on_every_rank<S: Suite>() {
    let Some(group) = group::<S>(WAIT) else {
        return;
    };
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let r = rank.index() as u32;
        let g = record(&rank);
        let alone = c
            .replay(&g.graph)
            .expect_err("a graph of collectives is not replayed alone");
        assert!(alone.is_refusal(), "{alone}");
        let mut seen = Vec::new();
        for step in 1..=2u32 {
            c.write(g.input.all(), &as_bytes(&vec![r + step; PART as usize]))
                .unwrap();
            rank.replay(&g.graph).expect("every rank replays");
            seen.push((
                read_twice::<S>(c, &g.sum).unwrap(),
                read_twice::<S>(c, &g.gathered).unwrap(),
            ));
        }
        seen
    });
    let n = RANKS as u32;
    for (rank, seen) in outcomes.into_iter().enumerate() {
        for (step, (sum, gathered)) in (1..=2u32).zip(seen) {
            let total: u32 = (0..n).map(|r| r + step).sum();
            assert_eq!(
                sum,
                vec![total; PART as usize],
                "rank {rank}, replay {step}"
            );
            let expected: Vec<u32> = (0..n)
                .flat_map(|r| std::iter::repeat_n(r + step, PART as usize))
                .collect();
            assert_eq!(gathered, expected, "rank {rank}, replay {step}: gather");
        }
    }
    assert!(group.broken().is_none());
}

/// A graph's work runs in the order it was recorded, its collectives included, as a device runs
/// it. A copy recorded after a sum reads that replay's sum, never the one before. A fill recorded
/// after it overwrites the sum's input only once the sum has read it. A runtime's step is such a
/// graph: the optimizer reads the gradient the round just reduced, and the next forward pass
/// overwrites what the round read.
pub fn work_recorded_after_a_collective_sees_it_done<S: Suite>() {
    let Some(group) = group::<S>(WAIT) else {
        return;
    };
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let r = rank.index() as u32;
        let input = alloc(c, PART);
        let sum = alloc(c, PART);
        let after = alloc(c, PART);
        let capture = c.begin_capture().unwrap();
        rank.all_reduce(input.all(), sum.all(), Element::U32, Reduce::Sum)
            .expect("recorded on every rank");
        copy::<S>(c, &sum, &after).expect("recorded");
        fill::<S>(c, &input, 1000).expect("recorded");
        let graph = c.end_capture(capture).expect("a clean window seals");
        (1..=3u32)
            .map(|step| {
                c.write(input.all(), &as_bytes(&vec![r + step; PART as usize]))
                    .unwrap();
                rank.replay(&graph).expect("every rank replays");
                let seen = (read(c, &after).unwrap(), read(c, &sum).unwrap());
                (seen, read(c, &input).unwrap())
            })
            .collect::<Vec<_>>()
    });
    let n = RANKS as u32;
    for (rank, seen) in outcomes.into_iter().enumerate() {
        for (step, ((after, sum), input)) in (1..=3u32).zip(seen) {
            let total: u32 = (0..n).map(|r| r + step).sum();
            let expected = vec![total; PART as usize];
            assert_eq!(
                sum, expected,
                "rank {rank}, replay {step}: the sum read the fill"
            );
            assert_eq!(
                after, expected,
                "rank {rank}, replay {step}: the copy ran first"
            );
            assert_eq!(
                input,
                vec![1000; PART as usize],
                "rank {rank}, replay {step}"
            );
        }
    }
    assert!(group.broken().is_none());
}

/// An input that carries a failure on rank 2 at replay fails every rank's replay (rule 50). Each
/// names rank 2 and its root cause. Nothing is replayed, and everything every graph writes carries
/// the failure. Once the input is written again, the next replay runs and heals.
pub fn a_failed_input_fails_every_ranks_replay<S: Suite>() {
    let Some(group) = group::<S>(WAIT) else {
        return;
    };
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let g = record(&rank);
        let r = rank.index() as u32;
        c.write(g.input.all(), &as_bytes(&vec![r; PART as usize]))
            .unwrap();
        if rank.index() == 2 {
            fail_next_launch(c, "rank two's forward pass");
            assert!(fill::<S>(c, &g.input, 9).is_err());
        }
        let replayed = rank.replay(&g.graph);
        let claims = [claimed::<S>(c, &g.sum), claimed::<S>(c, &g.gathered)];
        c.write(g.input.all(), &as_bytes(&vec![1; PART as usize]))
            .unwrap();
        rank.replay(&g.graph).expect("a clean replay runs");
        (replayed, claims, read_twice::<S>(c, &g.sum).unwrap())
    });
    for (rank, (replayed, claims, healed)) in outcomes.into_iter().enumerate() {
        let error = replayed.expect_err("every rank's replay fails");
        for reported in std::iter::once(collective_error(&error)).chain(&claims) {
            let CollectiveError::InputFailed {
                rank: failed,
                cause,
                collective,
                ..
            } = reported
            else {
                panic!("rank {rank}: {reported}");
            };
            assert_eq!(*collective, "replay", "rank {rank}: {reported}");
            assert_eq!(*failed, 2, "rank {rank} names rank 2: {reported}");
            assert!(
                cause.to_string().contains("rank two's forward pass"),
                "rank {rank}: the root cause travels: {cause}"
            );
        }
        assert_eq!(healed, vec![RANKS as u32; PART as usize], "rank {rank}");
    }
    assert!(group.broken().is_none());
}

/// The collective error a read of `buffer` reports as its root.
fn claimed<S: Suite>(client: &Client<S::Backend>, buffer: &Buffer) -> CollectiveError {
    let error =
        read_twice::<S>(client, buffer).expect_err("the output carries the replay's failure");
    collective_error(error.root()).clone()
}

/// A replay that fails to start on rank 2, injected at [`Site::Replay`] (rules 43, 47, 50). It
/// fails its replay, naming it and its cause. Everything every graph writes carries that. A peer
/// whose replay went out may return first (rule 47). The peers are released and the group is
/// broken. A new group over the same devices works.
pub fn a_replay_that_fails_to_start_breaks_the_group<S: Suite>() {
    let Some(group) = group::<S>(WAIT) else {
        return;
    };
    let started = Instant::now();
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let g = record(&rank);
        if rank.index() == 2 {
            c.inject(FaultPlan::new().fail(Site::Replay, 1, injected("rank 2's replay")));
        }
        let replayed = rank.replay(&g.graph);
        let claims = [claimed::<S>(c, &g.sum), claimed::<S>(c, &g.gathered)];
        let later = rank.replay(&g.graph);
        (replayed, claims, later)
    });
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the peers were released, not left to a timeout: {:?}",
        started.elapsed()
    );
    for (rank, (replayed, claims, later)) in outcomes.into_iter().enumerate() {
        names_the_failed_issue((rank, 2, "rank 2's replay"), &replayed, &claims);
        let later = later.expect_err("the group is broken");
        assert!(
            matches!(collective_error(&later), CollectiveError::Broken { .. }),
            "rank {rank}: {later}"
        );
    }
    assert!(group.broken().is_some());
    a_new_group_over_its_devices_works::<S>(group);
}

/// Ranks that disagree are refused on every rank, claiming nothing, and the group stays in step
/// (rules 44, 50). One rank runs a collective while its peers record it. Another replays a graph of
/// other rounds. An input that already carries a failure when the call is recorded dooms every
/// rank's window.
pub fn recorded_collectives_that_disagree_are_refused_everywhere<S: Suite>() {
    let Some(group) = group::<S>(WAIT) else {
        return;
    };
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let input = upload(c, &[1; PART as usize]);
        let output = upload(c, &[5; PART as usize]);
        // Rank 0 runs the call; its peers record it.
        let capture = (rank.index() != 0).then(|| c.begin_capture().unwrap());
        let mixed = rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
        if let Some(capture) = capture {
            c.end_capture(capture)
                .expect("nothing was recorded, nothing is missing");
        }
        let untouched = read_twice::<S>(c, &output).unwrap();
        // Graphs of different rounds: rank 3 replays its second.
        let first = record(&rank);
        let second = record(&rank);
        let graph = if rank.index() == 3 {
            &second.graph
        } else {
            &first.graph
        };
        let other = rank.replay(graph);
        // A failed input when recording: every window is doomed.
        if rank.index() == 2 {
            fail_next_launch(c, "rank two's input");
            assert!(fill::<S>(c, &input, 9).is_err());
        }
        let capture = c.begin_capture().unwrap();
        let recorded = rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
        let sealed = c.end_capture(capture);
        // The group is in step: a clean collective runs.
        let clean = upload(c, &[2; PART as usize]);
        rank.all_reduce(clean.all(), output.all(), Element::U32, Reduce::Sum)
            .unwrap();
        (
            mixed,
            untouched,
            other,
            recorded,
            sealed.map(drop),
            read_twice::<S>(c, &output).unwrap(),
        )
    });
    for (rank, (mixed, untouched, other, recorded, sealed, after)) in
        outcomes.into_iter().enumerate()
    {
        let mixed = mixed.expect_err("recording and running are refused");
        assert!(
            matches!(collective_error(&mixed), CollectiveError::Refused { rank: 1, why, .. } if why.contains("capture window")),
            "rank {rank}: {mixed}"
        );
        assert_eq!(
            untouched,
            vec![5; PART as usize],
            "rank {rank}: nothing claimed"
        );
        let other = other.expect_err("graphs of other rounds are refused");
        assert!(
            matches!(
                collective_error(&other),
                CollectiveError::Refused { rank: 3, .. }
            ),
            "rank {rank}: {other}"
        );
        let recorded = recorded.expect_err("a failed input is not recorded");
        assert!(
            matches!(
                collective_error(&recorded),
                CollectiveError::InputFailed { rank: 2, .. }
            ),
            "rank {rank}: {recorded}"
        );
        let sealed = sealed.expect_err("every rank's window is missing the call");
        assert!(
            matches!(sealed, Error::Unsealed { .. }),
            "rank {rank}: {sealed}"
        );
        assert_eq!(after, vec![8; PART as usize], "rank {rank}");
    }
    assert!(group.broken().is_none());
}

/// A rank that never replays fails every waiting rank's replay within the deadline, naming it.
/// Nothing was replayed, and what each graph writes carries that. The group is broken (rules 42,
/// 43, 50).
pub fn a_rank_that_never_replays_fails_the_others_within_the_deadline<S: Suite>() {
    let deadline = Duration::from_millis(500);
    let Some(group) = group::<S>(deadline) else {
        return;
    };
    let started = Instant::now();
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let g = record(&rank);
        if rank.index() == 3 {
            return None;
        }
        let replayed = rank.replay(&g.graph);
        Some((replayed, claimed::<S>(c, &g.sum)))
    });
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "bounded by the deadline: {:?}",
        started.elapsed()
    );
    for (rank, outcome) in outcomes.into_iter().enumerate().take(3) {
        let (replayed, claim) = outcome.expect("ranks 0 to 2 replayed");
        let error = replayed.expect_err("rank 3 never replays");
        for reported in [collective_error(&error), &claim] {
            assert!(
                matches!(reported, CollectiveError::Missing { missing, .. } if missing.contains(&3))
                    || matches!(reported, CollectiveError::Broken { .. }),
                "rank {rank}: {reported}"
            );
        }
    }
    assert!(group.broken().is_some());
}

/// A host-staged group cannot record a collective (rule 50). It is refused on every rank, claiming
/// nothing, and the window seals without it.
pub fn a_host_staged_collective_is_not_recorded<S: Suite>() {
    let clients: Option<Vec<_>> = (0..RANKS)
        .map(|rank| client_or_skip(|| S::rank_client(rank)))
        .collect();
    let Some(clients) = clients else { return };
    let group = Group::new(clients, WAIT).unwrap();
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let input = upload(c, &[1; PART as usize]);
        let output = upload(c, &[5; PART as usize]);
        let capture = c.begin_capture().unwrap();
        let refused = rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
        let sealed = c.end_capture(capture).map(drop);
        (refused, sealed, read_twice::<S>(c, &output).unwrap())
    });
    for (rank, (refused, sealed, output)) in outcomes.into_iter().enumerate() {
        let refused = refused.expect_err("host staging is not recorded");
        assert!(
            matches!(collective_error(&refused), CollectiveError::Refused { why, .. } if why.contains("host-staged")),
            "rank {rank}: {refused}"
        );
        sealed.expect("nothing was recorded, nothing is missing");
        assert_eq!(
            output,
            vec![5; PART as usize],
            "rank {rank}: nothing claimed"
        );
    }
    assert!(group.broken().is_none());
}

/// The recorded collectives' behaviours: one `#[test]` each for `$suite`, with what each needs.
#[macro_export]
macro_rules! recorded_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, recorded::collectives_recorded_in_a_graph_replay_on_every_rank, DeviceCollectives }
        $crate::behaviour! { $suite, recorded::work_recorded_after_a_collective_sees_it_done, DeviceCollectives }
        $crate::behaviour! { $suite, recorded::a_failed_input_fails_every_ranks_replay, DeviceCollectives }
        $crate::behaviour! { $suite, recorded::recorded_collectives_that_disagree_are_refused_everywhere, DeviceCollectives }
        $crate::behaviour! { $suite, recorded::a_rank_that_never_replays_fails_the_others_within_the_deadline, DeviceCollectives }
        $crate::behaviour! { $suite, recorded::a_replay_that_fails_to_start_breaks_the_group, DeviceCollectives }
        $crate::behaviour! { $suite, recorded::a_host_staged_collective_is_not_recorded }
    };
}
