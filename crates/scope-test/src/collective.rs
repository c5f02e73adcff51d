//! Collectives over several devices of one backend (rules 41–45).
//! A group of four servers of the suite's backend: four logical devices, on one adapter where
//! there is one.
//! Their collectives compute right, and a failed input fails every rank's output.
//! A rank that never joins fails the others within the deadline and breaks the group.
//! Bad input is refused everywhere, claiming nothing.

use std::time::{Duration, Instant};

use super::*;
use scope_core::collective::{Call, CollectiveError, Element, Group, Reduce, copy_across};

/// How many ranks the behaviours use.
pub(super) const RANKS: usize = 4;

/// Words per rank's part.
pub(super) const PART: u32 = 64;

/// A group of [`RANKS`] servers of the suite's backend, or `None` (skipped) without a device.
pub(super) fn group<S: Suite>(deadline: Duration) -> Option<Group<S::Backend>> {
    group_of::<S>(RANKS, deadline)
}

/// A group of `ranks` servers made by the suite, or `None` (skipped) without a device.
pub(super) fn group_of<S: Suite>(ranks: usize, deadline: Duration) -> Option<Group<S::Backend>> {
    let clients: Option<Vec<_>> = (0..ranks)
        .map(|rank| client_or_skip(|| S::rank_client(rank)))
        .collect();
    let group = S::group(clients?, deadline)
        .unwrap_or_else(|e| panic!("{ranks} servers of distinct devices make a group: {e}"));
    Some(kit::checked::<S>(group))
}

pub(super) fn collective_error(error: &Error) -> &CollectiveError {
    match error {
        Error::Collective(c) => c,
        other => panic!("expected a collective error, got: {other}"),
    }
}

/// Every rank of `group` sums a buffer of ones and reads the group's size.
pub(super) fn every_rank_sums_its_ones<S: Suite>(group: &Group<S::Backend>) {
    let totals = group.run(|rank| {
        let c = rank.client();
        let ones = upload(c, &[1; PART as usize]);
        rank.all_reduce(ones.all(), ones.all(), Element::U32, Reduce::Sum)
            .unwrap();
        read_twice::<S>(c, &ones).unwrap()
    });
    let ranks = group.ranks() as u32;
    assert!(
        totals.iter().all(|t| *t == vec![ranks; PART as usize]),
        "{totals:?}"
    );
}

/// Once the broken `group` is dropped, a new group over its clients works.
pub(super) fn a_new_group_over_its_devices_works<S: Suite>(group: Group<S::Backend>) {
    let clients = (0..group.ranks())
        .map(|r| group.rank(r).unwrap().client().clone())
        .collect();
    drop(group);
    every_rank_sums_its_ones::<S>(
        &S::group(clients, DEFAULT_WAIT).expect("a new group over the same devices"),
    );
}

/// Rank `rank`'s reports of a round whose call or replay failed on rank `failed` with `cause`.
/// What it returned (a peer may return `Ok` first, rule 47), and what its output's read found.
pub(super) fn names_the_failed_issue<'a>(
    (rank, failed, cause): (usize, usize, &str),
    returned: &'a Result<()>,
    claims: impl IntoIterator<Item = &'a CollectiveError>,
) {
    let returned = match returned {
        Err(error) => Some(collective_error(error)),
        Ok(()) if rank != failed => None,
        Ok(()) => panic!("rank {failed}'s failed issue returned Ok"),
    };
    for reported in returned.into_iter().chain(claims) {
        let CollectiveError::IssueFailed {
            rank: named,
            cause: why,
            ..
        } = reported
        else {
            panic!("rank {rank}: {reported}");
        };
        assert_eq!(
            *named, failed,
            "rank {rank} names the failed rank: {reported}"
        );
        assert!(why.to_string().contains(cause), "{why}");
    }
}

/// The root a read of a claimed output reports, as a collective error.
fn claimed_by<S: Suite>(client: &Client<S::Backend>, buffer: &Buffer) -> CollectiveError {
    let error =
        read_twice::<S>(client, buffer).expect_err("the output carries the collective's failure");
    collective_error(error.root()).clone()
}

/// Each collective computes, on every rank, what it says.
/// The reductions agree across ranks (rule 41's clean case).
pub fn collectives_compute_on_every_rank<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    let n = RANKS as u32;
    let results = group.run(|rank| {
        let c = rank.client();
        let r = rank.index() as u32;
        let input = upload(c, &vec![r + 1; PART as usize]);
        let sum = alloc(c, PART);
        rank.all_reduce(input.all(), sum.all(), Element::U32, Reduce::Sum)
            .unwrap();
        let max = alloc(c, PART);
        rank.all_reduce(input.all(), max.all(), Element::U32, Reduce::Max)
            .unwrap();
        let gathered = alloc(c, PART * n);
        rank.all_gather(input.all(), gathered.all()).unwrap();
        let scattered = alloc(c, PART / n);
        rank.reduce_scatter(input.all(), scattered.all(), Element::U32, Reduce::Sum)
            .unwrap();
        let sent = upload(
            c,
            &(0..PART)
                .map(|i| r * 1000 + i / (PART / n))
                .collect::<Vec<_>>(),
        );
        let exchanged = alloc(c, PART);
        rank.all_to_all(sent.all(), exchanged.all()).unwrap();
        let shared = upload(c, &vec![r * 7; PART as usize]);
        rank.broadcast(2, shared.all()).unwrap();
        let floats = c
            .upload(&(r as f32 + 0.5).to_le_bytes().repeat(PART as usize))
            .unwrap();
        let mean = alloc(c, PART);
        rank.all_reduce(floats.all(), mean.all(), Element::F32, Reduce::Mean)
            .unwrap();
        (
            read_twice::<S>(c, &sum).unwrap(),
            read_twice::<S>(c, &max).unwrap(),
            read_twice::<S>(c, &gathered).unwrap(),
            read_twice::<S>(c, &scattered).unwrap(),
            read_twice::<S>(c, &exchanged).unwrap(),
            read_twice::<S>(c, &shared).unwrap(),
            as_bytes(&read_twice::<S>(c, &mean).unwrap()),
        )
    });
    let total: u32 = (1..=n).sum();
    for (rank, (sum, max, gathered, scattered, exchanged, shared, mean)) in
        results.into_iter().enumerate()
    {
        assert_eq!(sum, vec![total; PART as usize], "rank {rank}: sum");
        assert_eq!(max, vec![n; PART as usize], "rank {rank}: max");
        let expected: Vec<u32> = (1..=n)
            .flat_map(|v| std::iter::repeat_n(v, PART as usize))
            .collect();
        assert_eq!(gathered, expected, "rank {rank}: gather");
        assert_eq!(
            scattered,
            vec![total; (PART / n) as usize],
            "rank {rank}: reduce_scatter"
        );
        let expected: Vec<u32> = (0..n)
            .flat_map(|from| std::iter::repeat_n(from * 1000 + rank as u32, (PART / n) as usize))
            .collect();
        assert_eq!(exchanged, expected, "rank {rank}: all_to_all");
        assert_eq!(shared, vec![14; PART as usize], "rank {rank}: broadcast");
        let mean_value = (0..RANKS).map(|r| r as f32 + 0.5).sum::<f32>() / RANKS as f32;
        assert_eq!(
            mean,
            mean_value.to_le_bytes().repeat(PART as usize),
            "rank {rank}: mean"
        );
        let _ = rank;
    }
    assert!(group.broken().is_none());
}

/// How long a rank waits where no rank is meant to go missing.
pub(super) const DEFAULT_WAIT: Duration = Duration::from_secs(120);

/// A failed input on one rank fails every rank's output of that collective (rule 41).
/// Each names the rank, its root cause and chain.
/// Every input is left as it was, and the group keeps working.
/// A clean collective then heals the outputs.
pub fn a_failed_input_fails_every_ranks_output<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let input = upload(c, &[rank.index() as u32; PART as usize]);
        if rank.index() == 2 {
            // Rank 2's input: written by a launch that fails, copied on.
            let failed = alloc(c, PART);
            fail_next_launch(c, "rank two's backward pass");
            assert!(fill::<S>(c, &failed, 9).is_err());
            assert!(copy::<S>(c, &failed, &input).is_err());
        }
        let output = upload(c, &[77; PART as usize]);
        let reduced = rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
        let claim = claimed_by::<S>(c, &output);
        let untouched = read_twice::<S>(c, &input);
        // The next collective, on clean inputs, runs and heals.
        let clean = upload(c, &[1; PART as usize]);
        rank.all_reduce(clean.all(), output.all(), Element::U32, Reduce::Sum)
            .unwrap();
        (
            reduced,
            claim,
            untouched,
            read_twice::<S>(c, &output).unwrap(),
        )
    });
    for (rank, (reduced, claim, untouched, healed)) in outcomes.into_iter().enumerate() {
        let error = reduced.expect_err("every rank's collective fails");
        for reported in [collective_error(&error), &claim] {
            let CollectiveError::InputFailed {
                rank: failed,
                cause,
                ..
            } = reported
            else {
                panic!("rank {rank}: {reported}");
            };
            assert_eq!(*failed, 2, "rank {rank} names the rank whose input failed");
            let text = cause.to_string();
            assert!(
                text.contains("rank two's backward pass"),
                "rank {rank}: the root cause travels: {text}"
            );
            assert!(
                !cause.unwritten().is_empty() && !cause.unwritten()[0].chain.hops.is_empty(),
                "rank {rank}: the chain travels: {text}"
            );
        }
        match rank {
            2 => assert!(untouched.is_err(), "rank 2's input still fails"),
            _ => assert_eq!(
                untouched.unwrap(),
                vec![rank as u32; PART as usize],
                "rank {rank}'s input is untouched"
            ),
        }
        assert_eq!(healed, vec![RANKS as u32; PART as usize]);
    }
    assert!(group.broken().is_none());
}

/// A broadcast reads only the root's bytes (rules 41, 50).
/// A failure the other ranks' buffers carry is healed by it, never a reason to skip their part.
/// That holds eagerly, and in a recorded round replayed after the failure on a device transport.
/// A failure at the root fails every rank's buffer, naming the root.
pub fn a_broadcast_heals_the_other_ranks_failed_buffers<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    let over_device = group.is_over_device();
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let r = rank.index() as u32;
        let data = upload(c, &[r + 10; PART as usize]);
        let fail_unless_root = |root: usize, what: &str| {
            if rank.index() != root {
                c.fail_writing(&[data.all()], injected(what)).unwrap();
            }
        };
        fail_unless_root(1, "a stale buffer off the root");
        let healed = rank.broadcast(1, data.all());
        let eager = read_twice::<S>(c, &data);
        let replayed = over_device.then(|| {
            c.write(data.all(), &as_bytes(&[r + 20; PART as usize]))
                .unwrap();
            let capture = c.begin_capture().unwrap();
            rank.broadcast(3, data.all())
                .expect("recorded on every rank");
            let graph = c.end_capture(capture).expect("a clean window seals");
            fail_unless_root(3, "stale after the recording");
            let replayed = rank.replay(&graph);
            c.destroy_graph(&graph).unwrap();
            (replayed, read_twice::<S>(c, &data))
        });
        if rank.index() == 2 {
            c.fail_writing(&[data.all()], injected("the root's own bytes"))
                .unwrap();
        }
        let failed = rank.broadcast(2, data.all());
        (healed, eager, replayed, failed, claimed_by::<S>(c, &data))
    });
    for (rank, (healed, eager, replayed, failed, claim)) in outcomes.into_iter().enumerate() {
        healed.unwrap_or_else(|e| panic!("rank {rank}: a broadcast heals, not skips: {e}"));
        assert_eq!(eager.unwrap(), vec![11; PART as usize], "rank {rank}");
        if let Some((replayed, read)) = replayed {
            replayed.unwrap_or_else(|e| panic!("rank {rank}: the replay heals: {e}"));
            assert_eq!(
                read.unwrap(),
                vec![23; PART as usize],
                "rank {rank}, replayed"
            );
        }
        let error = failed.expect_err("the root's failure fails every rank");
        for reported in [collective_error(&error), &claim] {
            assert!(
                matches!(reported, CollectiveError::InputFailed { rank: 2, .. }),
                "rank {rank}: {reported}"
            );
        }
    }
    assert!(group.broken().is_none());
}

/// A rank that never joins fails every waiting rank's collective within the deadline, naming it.
/// Their outputs carry that (rules 42, 43).
/// The group is broken for later collectives: a typed refusal, claiming nothing.
/// A new group over the same devices works.
pub fn a_rank_that_never_joins_fails_the_others_within_the_deadline<S: Suite>() {
    let deadline = Duration::from_millis(300);
    let Some(group) = group::<S>(deadline) else {
        return;
    };
    let started = Instant::now();
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let input = upload(c, &[1; PART as usize]);
        let output = upload(c, &[5; PART as usize]);
        if rank.index() == 3 {
            return None;
        }
        let reduced = rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
        let waited = started.elapsed();
        let claim = claimed_by::<S>(c, &output);
        let later = rank.all_gather(input.all(), alloc(c, PART * RANKS as u32).all());
        Some((reduced, waited, claim, later))
    });
    for (rank, outcome) in outcomes.into_iter().enumerate().take(3) {
        let (reduced, waited, claim, later) = outcome.expect("ranks 0 to 2 joined");
        let error = reduced.expect_err("a missing rank fails the collective");
        for reported in [collective_error(&error), &claim] {
            let CollectiveError::Missing { missing, .. } = reported else {
                panic!("rank {rank}: {reported}");
            };
            assert_eq!(missing, &vec![3], "rank {rank} names the missing rank");
        }
        assert!(
            waited < deadline + Duration::from_secs(30),
            "rank {rank} waited {waited:?}, past its deadline"
        );
        let later = later.expect_err("the group is broken");
        assert!(
            matches!(collective_error(&later), CollectiveError::Broken { .. }),
            "{later}"
        );
    }
    assert!(group.broken().is_some());
    // Rank 3 arriving late is refused too, and a new group works.
    let late = group.rank(3).unwrap();
    let c = late.client();
    let input = upload(c, &[1; PART as usize]);
    let output = upload(c, &[5; PART as usize]);
    let refused = late.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
    assert!(matches!(
        collective_error(&refused.unwrap_err()),
        CollectiveError::Broken { .. }
    ));
    assert_eq!(
        read_twice::<S>(c, &output).unwrap(),
        vec![5; PART as usize],
        "a refusal claims nothing"
    );
    let clients = (0..RANKS)
        .map(|r| group.rank(r).unwrap().client().clone())
        .collect();
    let fresh = S::group(clients, DEFAULT_WAIT).unwrap();
    let sums = fresh.run(|rank| {
        let c = rank.client();
        let input = upload(c, &[2; PART as usize]);
        let output = alloc(c, PART);
        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
            .unwrap();
        read_twice::<S>(c, &output).unwrap()
    });
    assert!(sums.iter().all(|s| *s == vec![8; PART as usize]));
}

/// Over a device transport, a rank's library call fails after the ranks agreed (rules 42, 43).
/// It is injected at [`Site::Collective`] on rank 2.
/// Its collective fails, naming it and its cause, and every rank's output carries that.
/// A peer whose call went out may return before it learns (rule 47).
/// The peers waiting inside the library are released, and the group is broken.
/// A new group over the same devices works.
pub fn a_failed_device_call_breaks_the_group<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    assert!(
        group.is_over_device(),
        "this behaviour is for a suite whose groups are over a device transport"
    );
    let started = Instant::now();
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let input = upload(c, &[1; PART as usize]);
        let output = upload(c, &[5; PART as usize]);
        if rank.index() == 2 {
            c.inject(FaultPlan::new().fail(Site::Collective, 1, injected("rank 2's call")));
        }
        let reduced = rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
        let claim = claimed_by::<S>(c, &output);
        let later = rank.all_gather(input.all(), alloc(c, PART * RANKS as u32).all());
        (reduced, claim, later)
    });
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the peers were released, not left to a timeout: {:?}",
        started.elapsed()
    );
    for (rank, (reduced, claim, later)) in outcomes.into_iter().enumerate() {
        names_the_failed_issue((rank, 2, "rank 2's call"), &reduced, [&claim]);
        let later = later.expect_err("the group is broken");
        assert!(
            matches!(collective_error(&later), CollectiveError::Broken { .. }),
            "{later}"
        );
    }
    assert!(group.broken().is_some());
    a_new_group_over_its_devices_works::<S>(group);
}

/// A sender running ahead of a receiver that never receives holds few parcels (rules 42, 48).
/// At most [`MAILBOX_PARCELS`](scope_core::collective::MAILBOX_PARCELS) wait.
/// The next send waits for room, then fails within the deadline naming the receiver as missing.
/// The group is broken.
pub fn a_sender_ahead_of_a_silent_receiver_holds_a_bounded_mailbox<S: Suite>() {
    let deadline = Duration::from_millis(300);
    let Some(group) = group::<S>(deadline) else {
        return;
    };
    let rank = group.rank(0).unwrap();
    let c = rank.client();
    let data = upload(c, &[1]);
    for sent in 0..scope_core::collective::MAILBOX_PARCELS {
        rank.send(1, data.all())
            .unwrap_or_else(|e| panic!("send {sent} fits: {e}"));
    }
    let started = Instant::now();
    let error = rank.send(1, data.all()).expect_err("the mailbox is full");
    assert!(
        matches!(collective_error(&error), CollectiveError::Missing { missing, .. } if missing == &[1]),
        "{error}"
    );
    assert!(
        started.elapsed() >= deadline && started.elapsed() < deadline + Duration::from_secs(30),
        "waited {:?} for a deadline of {deadline:?}",
        started.elapsed()
    );
    assert!(group.broken().is_some());
}

/// Bad input is refused on every rank as a typed error that claims nothing (rule 44).
/// The group stays in step.
/// The cases: one server twice, a rank that calls another collective, and mismatched sizes.
/// Also an output too small, a buffer of another rank's device, and a root past the group.
pub fn bad_collective_input_is_refused_everywhere<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    let one = group.rank(0).unwrap().client().clone();
    assert!(matches!(
        S::group(vec![one.clone(), one.clone()], DEFAULT_WAIT),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        S::group(Vec::new(), DEFAULT_WAIT),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        group.rank(RANKS),
        Err(Error::InvalidArgument { .. })
    ));
    let foreign = upload(&one, &[0; PART as usize]);
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let r = rank.index();
        let input = upload(c, &[1; PART as usize]);
        let output = upload(c, &[5; PART as usize]);
        let mut refusals = Vec::new();
        // Rank 1 calls another collective.
        refusals.push(if r == 1 {
            rank.all_gather(input.all(), alloc(c, PART * RANKS as u32).all())
        } else {
            rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
        });
        // Rank 2 passes fewer bytes.
        let short = input.slice(0..u64::from(PART) * 2);
        let mine = if r == 2 { short } else { input.all() };
        let out = if r == 2 {
            output.slice(0..u64::from(PART) * 2)
        } else {
            output.all()
        };
        refusals.push(rank.all_reduce(mine, out, Element::U32, Reduce::Sum));
        // Rank 3's output is too small for a gather.
        let gathered = alloc(c, PART * RANKS as u32);
        let small = gathered.slice(0..u64::from(PART) * 4);
        refusals.push(rank.all_gather(input.all(), if r == 3 { small } else { gathered.all() }));
        // Rank 1 passes a buffer of rank 0's device.
        refusals.push(if r == 1 {
            rank.broadcast(0, foreign.all())
        } else {
            rank.broadcast(0, input.all())
        });
        // Everyone names a root past the group.
        refusals.push(rank.broadcast(RANKS, input.all()));
        let kept = read_twice::<S>(c, &output).unwrap();
        // Still in step: a clean collective runs.
        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
            .unwrap();
        (refusals, kept, read_twice::<S>(c, &output).unwrap())
    });
    for (rank, (refusals, kept, summed)) in outcomes.into_iter().enumerate() {
        for (i, refused) in refusals.into_iter().enumerate() {
            let error = refused.expect_err("refused on every rank");
            assert!(
                matches!(collective_error(&error), CollectiveError::Refused { .. }),
                "rank {rank}, refusal {i}: {error}"
            );
        }
        assert_eq!(kept, vec![5; PART as usize], "rank {rank}: nothing claimed");
        assert_eq!(summed, vec![RANKS as u32; PART as usize]);
    }
    assert!(group.broken().is_none());
}

/// A freed buffer is a wrong argument like a foreign one (rule 44).
/// One rank passes a freed input or output to any collective.
/// It is refused with every other rank, before the ranks agree, claiming nothing.
/// The group stays in step.
/// A receive into a freed buffer is refused before it takes anything.
/// So the parcel waits for the next receive (rule 48).
pub fn a_freed_buffer_is_refused_on_every_rank<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    let calls: [(&str, Call); 5] = [
        (
            "all_reduce",
            Call::AllReduce {
                element: Element::U32,
                op: Reduce::Sum,
            },
        ),
        ("all_gather", Call::AllGather),
        (
            "reduce_scatter",
            Call::ReduceScatter {
                element: Element::U32,
                op: Reduce::Sum,
            },
        ),
        ("broadcast", Call::Broadcast { root: 0 }),
        ("all_to_all", Call::AllToAll),
    ];
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let r = rank.index();
        let parts = RANKS as u32;
        let mut answers = Vec::new();
        for (i, (name, call)) in calls.iter().enumerate() {
            for freed_input in [false, true] {
                let words = PART * parts;
                let out_words = match call {
                    Call::AllGather => words * parts,
                    Call::ReduceScatter { .. } => PART,
                    _ => words,
                };
                let input = upload(c, &vec![1; words as usize]);
                let output = upload(c, &vec![5; out_words as usize]);
                // Rank `i % RANKS` frees one of its buffers first.
                let culprit = r == i % RANKS;
                if culprit {
                    c.free(if freed_input { &input } else { &output }).unwrap();
                }
                let answer = match call {
                    Call::AllReduce { element, op } => {
                        rank.all_reduce(input.all(), output.all(), *element, *op)
                    }
                    Call::AllGather => rank.all_gather(input.all(), output.all()),
                    Call::ReduceScatter { element, op } => {
                        rank.reduce_scatter(input.all(), output.all(), *element, *op)
                    }
                    Call::Broadcast { root } => rank.broadcast(
                        *root,
                        if freed_input {
                            input.all()
                        } else {
                            output.all()
                        },
                    ),
                    Call::AllToAll => rank.all_to_all(input.all(), output.all()),
                };
                let kept = if culprit {
                    None
                } else {
                    read_twice::<S>(c, &output).ok()
                };
                answers.push((*name, freed_input, answer, kept, out_words));
            }
        }
        assert_eq!(c.failures_held(), 0, "rank {r}: nothing claimed");
        // Still in step: a clean collective runs.
        let input = upload(c, &[1; PART as usize]);
        let output = alloc(c, PART);
        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
            .unwrap();
        let summed = read_twice::<S>(c, &output).unwrap();
        // A receive into a freed buffer takes nothing.
        let ring = if r % 2 == 0 { r + 1 } else { r - 1 };
        let received = if ring < RANKS && r % 2 == 1 {
            let gone = alloc(c, PART);
            c.free(&gone).unwrap();
            let refused = rank.recv(ring, gone.all());
            let buffer = alloc(c, PART);
            let after = rank
                .recv(ring, buffer.all())
                .map(|()| read_twice::<S>(c, &buffer).unwrap());
            Some((refused, after))
        } else {
            if ring < RANKS {
                rank.send(ring, upload(c, &[7; PART as usize]).all())
                    .unwrap();
            }
            None
        };
        (answers, summed, received)
    });
    for (rank, (answers, summed, received)) in outcomes.into_iter().enumerate() {
        for (name, freed_input, answer, kept, out_words) in answers {
            let error = answer.expect_err("refused on every rank");
            assert!(
                matches!(collective_error(&error), CollectiveError::Refused { .. }),
                "rank {rank}, {name} (freed input: {freed_input}): {error}"
            );
            if let Some(kept) = kept {
                assert_eq!(
                    kept,
                    vec![5; out_words as usize],
                    "rank {rank}, {name}: its output untouched"
                );
            }
        }
        assert_eq!(summed, vec![RANKS as u32; PART as usize]);
        if let Some((refused, after)) = received {
            assert!(
                matches!(refused, Err(Error::InvalidArgument { .. })),
                "rank {rank}: {refused:?}"
            );
            assert_eq!(after.unwrap(), vec![7; PART as usize], "the parcel waited");
        }
    }
    assert!(group.broken().is_none());
}

/// Point-to-point: clean bytes sent arrive and heal the receiver's buffer.
/// Bytes that carry a failure at the sender are not sent.
/// The receiver's buffer carries the failure, naming the sending rank, its root cause and chain.
/// Parcels arrive in the order sent.
/// Bad peers are refused, claiming nothing.
/// A receive from a rank that never sends fails within the deadline.
/// It claims its buffer and breaks the group.
pub fn send_and_recv_carry_failures_between_ranks<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let r = rank.index() as u32;
        match rank.index() {
            0 => {
                rank.send(1, upload(c, &[10; PART as usize]).all()).unwrap();
                rank.send(1, upload(c, &[11; PART as usize]).all()).unwrap();
                let refused = rank.send(0, upload(c, &[1; 4]).all());
                assert!(
                    matches!(refused, Err(Error::InvalidArgument { .. })),
                    "{refused:?}"
                );
                Vec::new()
            }
            1 => {
                let first = upload(c, &[r; PART as usize]);
                let second = upload(c, &[r; PART as usize]);
                rank.recv(0, first.all()).unwrap();
                rank.recv(0, second.all()).unwrap();
                vec![
                    read_twice::<S>(c, &first).unwrap(),
                    read_twice::<S>(c, &second).unwrap(),
                ]
            }
            2 => {
                let failed = alloc(c, PART);
                fail_next_launch(c, "rank 2's send");
                assert!(fill::<S>(c, &failed, 3).is_err());
                let sent = rank.send(3, failed.all()).unwrap_err();
                assert!(
                    matches!(
                        collective_error(&sent),
                        CollectiveError::InputFailed { rank: 2, .. }
                    ),
                    "{sent}"
                );
                Vec::new()
            }
            _ => {
                let into = upload(c, &[5; PART as usize]);
                let error = rank.recv(2, into.all()).unwrap_err();
                for reported in [collective_error(&error), &claimed_by::<S>(c, &into)] {
                    let CollectiveError::InputFailed { rank, cause, .. } = reported else {
                        panic!("{reported}");
                    };
                    assert_eq!(*rank, 2, "{reported}");
                    assert!(cause.to_string().contains("rank 2's send"), "{cause}");
                }
                let refused = rank.recv(RANKS, into.all());
                assert!(
                    matches!(refused, Err(Error::InvalidArgument { .. })),
                    "{refused:?}"
                );
                Vec::new()
            }
        }
    });
    assert_eq!(
        outcomes[1],
        vec![vec![10; PART as usize], vec![11; PART as usize]],
        "in the order sent"
    );
    assert!(group.broken().is_none());
    let clients: Vec<_> = (0..RANKS)
        .map(|r| group.rank(r).unwrap().client().clone())
        .collect();
    drop(group);
    let deadline = Duration::from_millis(300);
    let short = S::group(clients.clone(), deadline).unwrap();
    let waiting = short.rank(0).unwrap();
    let c = waiting.client();
    let into = upload(c, &[5; PART as usize]);
    let started = Instant::now();
    let error = waiting.recv(1, into.all()).unwrap_err();
    assert!(started.elapsed() < deadline + Duration::from_secs(30));
    for reported in [collective_error(&error), &claimed_by::<S>(c, &into)] {
        assert!(
            matches!(reported, CollectiveError::Missing { missing, .. } if missing == &vec![1]),
            "{reported}"
        );
    }
    assert!(short.broken().is_some());
    // A group that breaks while a receive waits (rank 1's all-reduce runs out first) fails that
    // receive with what broke it, claimed. Rank 0 receives 100 ms after rank 1 is ready, so the
    // receive waits when the all-reduce's deadline comes. A thread that loses time reorders
    // that: the receive's own deadline comes first (it names the silent sender, claimed), or the
    // receive starts on a group already broken (refused, claiming nothing: rule 43). The rules
    // hold every way, and the next attempt tries the order again.
    for attempt in 0.. {
        let short = S::group(clients.clone(), deadline).unwrap();
        let ready = std::sync::Barrier::new(2);
        let outcomes = short.run(|rank| match rank.index() {
            0 => {
                ready.wait();
                std::thread::sleep(Duration::from_millis(100));
                let c = rank.client();
                let into = upload(c, &[5; PART as usize]);
                let error = rank.recv(3, into.all()).unwrap_err();
                Some((error, read_twice::<S>(c, &into)))
            }
            1 => {
                let c = rank.client();
                let input = upload(c, &[1; PART as usize]);
                let output = alloc(c, PART);
                ready.wait();
                let _ = rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
                None
            }
            _ => None,
        });
        let (error, read) = outcomes[0].as_ref().expect("rank 0 received");
        let at = format!("attempt {attempt}: {error}, then read {read:?}");
        let claim = read.as_ref().err().map(|e| collective_error(e.root()));
        let broke_while_waiting = match (collective_error(error), claim) {
            (
                CollectiveError::Missing {
                    collective: "all_reduce",
                    ..
                },
                Some(CollectiveError::Missing {
                    collective: "all_reduce",
                    ..
                }),
            ) => true,
            (
                CollectiveError::Missing {
                    collective: "recv",
                    missing,
                    ..
                },
                Some(CollectiveError::Missing {
                    collective: "recv",
                    missing: claimed,
                    ..
                }),
            ) if missing == &vec![3] && claimed == &vec![3] => false,
            (CollectiveError::Broken { .. }, None) => {
                assert_eq!(read.as_ref().ok(), Some(&vec![5; PART as usize]), "{at}");
                false
            }
            _ => panic!("{at}"),
        };
        if broke_while_waiting {
            break;
        }
        assert!(
            attempt < 4,
            "in 5 attempts the group never broke while the receive waited"
        );
    }
}

/// A copy between two devices keeps the failure model across them (rule 46).
/// Failed bytes on one make the destination on the other carry a failure.
/// It names the source device, its root cause and chain.
/// Clean bytes heal it, and a mismatched length is refused, claiming nothing.
pub fn copies_across_devices_carry_failures<S: Suite>() {
    let (Some(a), Some(b)) = (setup::<S>(), setup::<S>()) else {
        return;
    };
    let failed = alloc(&a, WORDS);
    fail_next_launch(&a, "on device a");
    assert!(fill::<S>(&a, &failed, 3).is_err());
    let dst = upload(&b, &[5; WORDS as usize]);
    let error = copy_across(&a, failed.all(), &b, dst.all()).unwrap_err();
    for reported in [collective_error(&error), &claimed_by::<S>(&b, &dst)] {
        let CollectiveError::SourceFailed { cause, .. } = reported else {
            panic!("{reported}");
        };
        assert!(cause.to_string().contains("on device a"), "{cause}");
    }
    let clean = upload(&a, &[8; WORDS as usize]);
    let short = upload(&b, &[1; 4]);
    assert!(matches!(
        copy_across(&a, clean.all(), &b, short.all()),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(
        read(&b, &short).unwrap(),
        vec![1; 4],
        "a refusal claims nothing"
    );
    copy_across(&a, clean.all(), &b, dst.all()).unwrap();
    assert_eq!(
        read(&b, &dst).unwrap(),
        vec![8; WORDS as usize],
        "clean bytes heal"
    );
    assert_eq!(read(&a, &clean).unwrap(), vec![8; WORDS as usize]);
}

/// The collective behaviours: one `#[test]` each for `$suite`, with what each needs.
#[macro_export]
macro_rules! collective_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, collective::collectives_compute_on_every_rank }
        $crate::behaviour! { $suite, collective::a_failed_input_fails_every_ranks_output }
        $crate::behaviour! { $suite, collective::a_broadcast_heals_the_other_ranks_failed_buffers }
        $crate::behaviour! { $suite, collective::a_rank_that_never_joins_fails_the_others_within_the_deadline }
        $crate::behaviour! { $suite, collective::bad_collective_input_is_refused_everywhere }
        $crate::behaviour! { $suite, collective::a_freed_buffer_is_refused_on_every_rank }
        $crate::behaviour! { $suite, collective::send_and_recv_carry_failures_between_ranks }
        $crate::behaviour! { $suite, collective::a_sender_ahead_of_a_silent_receiver_holds_a_bounded_mailbox }
        $crate::behaviour! { $suite, collective::a_failed_device_call_breaks_the_group, DeviceCollectives }
        $crate::behaviour! { $suite, collective::copies_across_devices_carry_failures }
        $crate::element_tests! { $suite }
    };
}
