//! Collectives at every group size a machine has: one rank, and one rank per device
//! ([`Suite::devices`]).
//!
//! The other collective behaviours need four devices.
//! They name a failed rank, a missing one and a late one.
//! A machine with one GPU has one rank to give, and that is where a library's collectives first
//! run for real.
//! A one-rank communicator still builds, issues every call, captures into graphs, ballots, aborts
//! and is made again.
//! So these behaviours take the group's size as it comes: one, and every device there is.
//! They name the last rank where the others name rank 2.
//! They ask of each size what the rules ask of four (rules 41–45, 47–50, 54–57):
//! - right values;
//! - a failed input failing every output, naming its rank and root;
//! - a refusal claiming nothing;
//! - replays decided together;
//! - ranks joined alone agreeing by ballot;
//! - a join short of its peers ending within its deadline;
//! - a failed library call breaking the group, for a new one to replace;
//! - membership changing: a shrink to a new epoch, an admission and a heal.
//!
//! On a suite of logical devices the sizes are one and four.
//! On the CUDA bundle's suite they are one and the machine's GPUs.

use std::time::{Duration, Instant};

use super::across::on_threads_joined;
use super::collective::collective_error;
use super::recorded::{Recorded, record_sized};
use super::*;
use scope_core::collective::device::DeviceCollectives;
use scope_core::collective::{CollectiveError, Element, Group, Rank, Reduce};

/// The most ranks a group of these behaviours has, however many devices a machine has.
/// Eight keeps every product of `2..=n+1` inside a `u32`.
pub const MOST_RANKS: usize = 8;

/// How long a rank waits where no rank is meant to go missing.
const WAIT: Duration = Duration::from_secs(120);

/// The sizes the behaviours run at.
/// One rank, and one per device (at most [`MOST_RANKS`]) where the suite has more than one.
fn sizes<S: Suite>() -> Vec<usize> {
    let most = S::devices().clamp(1, MOST_RANKS);
    if most > 1 { vec![1, most] } else { vec![1] }
}

/// Words of each rank's part in a group of `n`.
/// Whole chunks of 16 for a reduce-scatter or an all-to-all at any size.
fn part(n: usize) -> u32 {
    16 * n as u32
}

/// Clients for ranks `0..n`, or `None` (skipped) without a device or the suite's collectives.
///
/// # Panics
///
/// When rank 0 can be made and a later one cannot.
/// The suite said it had `n` devices ([`Suite::devices`]).
/// A size it cannot reach must not pass as skipped after the smaller sizes ran.
fn clients<S: Suite>(n: usize) -> Option<Vec<Client<S::Backend>>> {
    let first = client_or_skip(|| S::rank_client(0))?;
    let rest = (1..n).map(|rank| {
        S::rank_client(rank).unwrap_or_else(|e| {
            panic!("the suite says it has {n} devices, but rank {rank} cannot be made: {e}")
        })
    });
    Some(std::iter::once(first).chain(rest).collect())
}

/// `f(group, n)` for a group of each size in [`sizes`], made by the suite.
/// Nothing (skipped) without a device.
fn at_every_size<S: Suite>(deadline: Duration, f: impl Fn(Group<S::Backend>, usize)) {
    for n in sizes::<S>() {
        let Some(clients) = clients::<S>(n) else {
            return;
        };
        let group = S::group(clients, deadline)
            .unwrap_or_else(|e| panic!("{n} servers of distinct devices make a group: {e}"));
        f(kit::checked::<S>(group), n);
    }
}

/// The root cause `reported` names: rank `failed`, the text carried.
fn names_the_failed_rank(at: &str, reported: &CollectiveError, failed: usize, text: &str) {
    let CollectiveError::InputFailed {
        rank: from, cause, ..
    } = reported
    else {
        panic!("{at}: {reported}");
    };
    assert_eq!(*from, failed, "{at} names rank {failed}: {reported}");
    assert!(
        cause.to_string().contains(text),
        "{at}: the root cause travels: {cause}"
    );
}

fn floats(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values.into_iter().flat_map(f32::to_le_bytes).collect()
}

/// Every collective computes what it says at every group size (rule 41's clean case).
/// The five reductions (`u32`, `i32` and `f32`), all-gather, reduce-scatter, all-to-all and
/// broadcast.
/// Every chunk of each part is told apart.
pub fn every_collective_computes_at_every_group_size<S: Suite>() {
    at_every_size::<S>(WAIT, |group, n| {
        let words = part(n);
        let chunk = words / n as u32;
        let outcomes = group.run(|rank| {
            let c = rank.client();
            let r = rank.index() as u32;
            let input = upload(c, &vec![r + 2; words as usize]);
            let reduced: Vec<Vec<u32>> = [Reduce::Sum, Reduce::Prod, Reduce::Min, Reduce::Max]
                .into_iter()
                .map(|op| {
                    let out = alloc(c, words);
                    rank.all_reduce(input.all(), out.all(), Element::U32, op)
                        .unwrap_or_else(|e| panic!("{op:?} at {n}: {e}"));
                    read_twice::<S>(c, &out).unwrap()
                })
                .collect();
            let negative = upload(c, &vec![(-(r as i32) - 1) as u32; words as usize]);
            let signed = alloc(c, words);
            rank.all_reduce(negative.all(), signed.all(), Element::I32, Reduce::Sum)
                .unwrap();
            let halves = c
                .upload(&floats(std::iter::repeat_n(r as f32 + 0.5, words as usize)))
                .unwrap();
            let mean = alloc(c, words);
            rank.all_reduce(halves.all(), mean.all(), Element::F32, Reduce::Mean)
                .unwrap();
            let gathered = alloc(c, words * n as u32);
            rank.all_gather(input.all(), gathered.all()).unwrap();
            // Chunk k of rank r's part is 100 k + r.
            let chunks = upload(
                c,
                &(0..words).map(|i| i / chunk * 100 + r).collect::<Vec<_>>(),
            );
            let scattered = alloc(c, chunk);
            rank.reduce_scatter(chunks.all(), scattered.all(), Element::U32, Reduce::Sum)
                .unwrap();
            let exchanged = alloc(c, words);
            rank.all_to_all(chunks.all(), exchanged.all()).unwrap();
            let shared = upload(c, &vec![r * 7; words as usize]);
            rank.broadcast(n - 1, shared.all()).unwrap();
            (
                reduced,
                read_twice::<S>(c, &signed).unwrap(),
                as_bytes(&read_twice::<S>(c, &mean).unwrap()),
                read_twice::<S>(c, &gathered).unwrap(),
                read_twice::<S>(c, &scattered).unwrap(),
                read_twice::<S>(c, &exchanged).unwrap(),
                read_twice::<S>(c, &shared).unwrap(),
            )
        });
        let ranks = 0..n as u32;
        let total: u32 = ranks.clone().map(|r| r + 2).sum();
        let product: u32 = ranks.clone().map(|r| r + 2).product();
        let mean = ranks.clone().map(|r| r as f32 + 0.5).sum::<f32>() / n as f32;
        let w = words as usize;
        for (rank, (reduced, signed, means, gathered, scattered, exchanged, shared)) in
            outcomes.into_iter().enumerate()
        {
            let at = format!("rank {rank} of {n}");
            let expected = [total, product, 2, n as u32 + 1];
            for (op, (got, want)) in ["sum", "prod", "min", "max"]
                .iter()
                .zip(reduced.iter().zip(expected))
            {
                assert_eq!(got, &vec![want; w], "{at}: {op}");
            }
            let signed_total = -(ranks.clone().map(|r| r as i32 + 1).sum::<i32>());
            assert_eq!(signed, vec![signed_total as u32; w], "{at}: i32 sum");
            for word in means.chunks_exact(4) {
                let got = f32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                assert!(
                    (got - mean).abs() <= mean.abs() * 1e-6,
                    "{at}: mean {got}, expected {mean}"
                );
            }
            let expected: Vec<u32> = ranks
                .clone()
                .flat_map(|r| std::iter::repeat_n(r + 2, w))
                .collect();
            assert_eq!(gathered, expected, "{at}: gather");
            let k = rank as u32;
            let scattered_value = n as u32 * k * 100 + ranks.clone().sum::<u32>();
            assert_eq!(
                scattered,
                vec![scattered_value; chunk as usize],
                "{at}: reduce_scatter"
            );
            let expected: Vec<u32> = ranks
                .clone()
                .flat_map(|from| std::iter::repeat_n(k * 100 + from, chunk as usize))
                .collect();
            assert_eq!(exchanged, expected, "{at}: all_to_all");
            assert_eq!(shared, vec![(n as u32 - 1) * 7; w], "{at}: broadcast");
        }
        assert!(group.broken().is_none());
    });
}

/// A failed input on the last rank fails every rank's output at every group size (rule 41).
/// One rank alone is included.
/// Each output names that rank, its root cause and chain.
/// The other inputs are untouched, and a clean collective heals.
pub fn a_failed_input_fails_every_output_at_every_group_size<S: Suite>() {
    at_every_size::<S>(WAIT, |group, n| {
        let words = part(n);
        let last = n - 1;
        let outcomes = group.run(|rank| {
            let c = rank.client();
            let input = upload(c, &vec![rank.index() as u32; words as usize]);
            if rank.index() == last {
                // Written by a launch that fails, copied on: a chain.
                let failed = alloc(c, words);
                fail_next_launch(c, "the last rank's backward pass");
                assert!(fill::<S>(c, &failed, 9).is_err());
                assert!(copy::<S>(c, &failed, &input).is_err());
            }
            let output = upload(c, &vec![77; words as usize]);
            let reduced = rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
            let claim = read_twice::<S>(c, &output).expect_err("the output carries the failure");
            let untouched = read_twice::<S>(c, &input);
            let ones = upload(c, &vec![1; words as usize]);
            rank.all_reduce(ones.all(), output.all(), Element::U32, Reduce::Sum)
                .expect("a clean collective runs");
            (
                reduced,
                claim,
                untouched,
                read_twice::<S>(c, &output).unwrap(),
            )
        });
        for (rank, (reduced, claim, untouched, healed)) in outcomes.into_iter().enumerate() {
            let at = format!("rank {rank} of {n}");
            let error = reduced.expect_err("every rank's collective fails");
            for reported in [collective_error(&error), collective_error(claim.root())] {
                names_the_failed_rank(&at, reported, last, "the last rank's backward pass");
                let CollectiveError::InputFailed { cause, .. } = reported else {
                    unreachable!("checked above");
                };
                assert!(
                    !cause.unwritten().is_empty() && !cause.unwritten()[0].chain.hops.is_empty(),
                    "{at}: the chain travels: {cause}"
                );
            }
            if rank == last {
                assert!(untouched.is_err(), "{at}: the failed input still fails");
            } else {
                assert_eq!(
                    untouched.unwrap(),
                    vec![rank as u32; words as usize],
                    "{at}: untouched"
                );
            }
            assert_eq!(healed, vec![n as u32; words as usize], "{at}: healed");
        }
        assert!(group.broken().is_none());
    });
}

/// A gather into too small an output, and a broadcast from a root past the group, are refused.
/// That holds on every rank at every group size.
/// They claim nothing, and the group stays in step (rule 44).
pub fn a_refused_collective_claims_nothing_at_every_group_size<S: Suite>() {
    at_every_size::<S>(WAIT, |group, n| {
        let words = part(n);
        let outcomes = group.run(|rank| {
            let c = rank.client();
            let input = upload(c, &vec![1; words as usize]);
            let output = upload(c, &vec![5; (words * n as u32) as usize]);
            let short = output.slice(0..(u64::from(words) * n as u64 - 1) * 4);
            let gathered = rank.all_gather(input.all(), short);
            let rooted = rank.broadcast(n, output.all());
            let kept = read_twice::<S>(c, &output).unwrap();
            let sum = alloc(c, words);
            rank.all_reduce(input.all(), sum.all(), Element::U32, Reduce::Sum)
                .expect("the group is in step");
            ([gathered, rooted], kept, read_twice::<S>(c, &sum).unwrap())
        });
        for (rank, (refusals, kept, sum)) in outcomes.into_iter().enumerate() {
            let at = format!("rank {rank} of {n}");
            for refused in refusals {
                let error = refused.expect_err("refused on every rank");
                assert!(
                    matches!(collective_error(&error), CollectiveError::Refused { .. }),
                    "{at}: {error}"
                );
            }
            assert_eq!(
                kept,
                vec![5; (words * n as u32) as usize],
                "{at}: nothing claimed"
            );
            assert_eq!(sum, vec![n as u32; words as usize], "{at}: in step");
        }
        assert!(group.broken().is_none());
    });
}

/// Collectives recorded into a graph on every rank replay together at every group size (rule 50).
/// Each replay takes fresh inputs.
/// Replayed alone, the graph is refused.
/// A failed input on the last rank at a replay fails every rank's replay, naming it.
/// The next clean replay heals.
pub fn recorded_collectives_replay_at_every_group_size<S: Suite>() {
    at_every_size::<S>(WAIT, |group, n| {
        let words = part(n);
        let last = n - 1;
        let outcomes = group.run(|rank| {
            let c = rank.client();
            let r = rank.index() as u32;
            let Recorded {
                input,
                sum,
                gathered,
                graph,
            } = record_sized(&rank, words, n);
            let alone = c.replay(&graph).expect_err("not replayed alone");
            assert!(alone.is_refusal(), "{alone}");
            let mut seen = Vec::new();
            for step in 1..=2u32 {
                c.write(input.all(), &as_bytes(&vec![r + step; words as usize]))
                    .unwrap();
                rank.replay(&graph).expect("every rank replays");
                seen.push((
                    read_twice::<S>(c, &sum).unwrap(),
                    read_twice::<S>(c, &gathered).unwrap(),
                ));
            }
            if rank.index() == last {
                c.fail_writing(&[input.all()], injected("the last rank's forward pass"))
                    .unwrap();
            }
            let failed = rank.replay(&graph);
            let claim = read_twice::<S>(c, &sum).expect_err("the output carries the failure");
            c.write(input.all(), &as_bytes(&vec![1; words as usize]))
                .unwrap();
            rank.replay(&graph).expect("a clean replay runs");
            (seen, failed, claim, read_twice::<S>(c, &sum).unwrap())
        });
        for (rank, (seen, failed, claim, healed)) in outcomes.into_iter().enumerate() {
            let at = format!("rank {rank} of {n}");
            for (step, (sum, gathered)) in (1..=2u32).zip(seen) {
                let total: u32 = (0..n as u32).map(|r| r + step).sum();
                assert_eq!(sum, vec![total; words as usize], "{at}, replay {step}");
                let expected: Vec<u32> = (0..n as u32)
                    .flat_map(|r| std::iter::repeat_n(r + step, words as usize))
                    .collect();
                assert_eq!(gathered, expected, "{at}, replay {step}: gather");
            }
            let error = failed.expect_err("every rank's replay fails");
            for reported in [collective_error(&error), collective_error(claim.root())] {
                names_the_failed_rank(&at, reported, last, "the last rank's forward pass");
            }
            assert_eq!(healed, vec![n as u32; words as usize], "{at}: healed");
        }
        assert!(group.broken().is_none());
    });
}

/// Ranks that each joined alone, from the identity, agree by ballot at every group size.
/// A sum and a gather compute (rules 41, 48, 49, 50).
/// The last rank's failed input fails every rank's output, naming it.
/// A graph recorded by every rank replays by ballot.
/// Pairs of ranks send and receive, and the group goes on.
pub fn ranks_joined_alone_agree_at_every_group_size<S: Suite>()
where
    S::Backend: DeviceCollectives,
{
    for n in sizes::<S>() {
        let Some(clients) = clients::<S>(n) else {
            return;
        };
        let identity = <S::Backend as DeviceCollectives>::identity()
            .expect("the suite's backend has its collectives library");
        let words = part(n);
        let last = n - 1;
        let outcomes = on_threads_joined::<S, _>(clients, &identity, n, WAIT, |joined| {
            let rank = joined.expect("every rank joins");
            let c = rank.client();
            let r = rank.index() as u32;
            let input = upload(c, &vec![r + 1; words as usize]);
            let sum = alloc(c, words);
            rank.all_reduce(input.all(), sum.all(), Element::U32, Reduce::Sum)
                .unwrap();
            let gathered = alloc(c, words * n as u32);
            rank.all_gather(input.all(), gathered.all()).unwrap();
            let clean = (
                read_twice::<S>(c, &sum).unwrap(),
                read_twice::<S>(c, &gathered).unwrap(),
            );
            let mine = upload(c, &vec![r; words as usize]);
            if rank.index() == last {
                c.fail_writing(&[mine.all()], injected("the last rank's activations"))
                    .unwrap();
            }
            let output = upload(c, &vec![77; words as usize]);
            let failed = rank.all_reduce(mine.all(), output.all(), Element::U32, Reduce::Sum);
            let claim = read_twice::<S>(c, &output).expect_err("the output carries the failure");
            let replayed = replayed_by_ballot::<S>(&rank, words);
            let sent = pairs_send_and_receive::<S>(&rank, n, words);
            (clean, (failed, claim), replayed, sent, rank.broken())
        });
        let total: u32 = (1..=n as u32).sum();
        for (rank, (clean, (failed, claim), replayed, sent, broken)) in
            outcomes.into_iter().enumerate()
        {
            let at = format!("rank {rank} of {n}, joined alone");
            assert_eq!(clean.0, vec![total; words as usize], "{at}: sum");
            let expected: Vec<u32> = (1..=n as u32)
                .flat_map(|v| std::iter::repeat_n(v, words as usize))
                .collect();
            assert_eq!(clean.1, expected, "{at}: gather");
            let error = failed.expect_err("every rank's collective fails");
            for reported in [collective_error(&error), collective_error(claim.root())] {
                names_the_failed_rank(&at, reported, last, "the last rank's activations");
            }
            assert_eq!(replayed, vec![total; words as usize], "{at}: replayed");
            if let Some(got) = sent {
                let peer = rank ^ 1;
                assert_eq!(
                    got,
                    vec![peer as u32 * 10 + 1; words as usize],
                    "{at}: got its peer's bytes"
                );
            }
            assert!(broken.is_none(), "{at}: {broken:?}");
        }
    }
}

/// Record a sum of a fresh input on `rank`; every rank calls this together.
/// Replay it by ballot with `index + 1` as input, and read it.
fn replayed_by_ballot<S: Suite>(rank: &Rank<S::Backend>, words: u32) -> Vec<u32> {
    let c = rank.client();
    let input = upload(c, &vec![0; words as usize]);
    let sum = upload(c, &vec![9; words as usize]);
    let capture = c.begin_capture().unwrap();
    rank.all_reduce(input.all(), sum.all(), Element::U32, Reduce::Sum)
        .expect("recorded on every rank");
    let graph = c.end_capture(capture).expect("a clean window seals");
    c.write(
        input.all(),
        &as_bytes(&vec![rank.index() as u32 + 1; words as usize]),
    )
    .unwrap();
    rank.replay(&graph).expect("every rank replays");
    read_twice::<S>(c, &sum).unwrap()
}

/// Ranks `2k` and `2k + 1` of `n` swap `words` words, the even rank sending first.
/// What this rank received, or `None` for a rank without a pair (the last of an odd group).
fn pairs_send_and_receive<S: Suite>(
    rank: &Rank<S::Backend>,
    n: usize,
    words: u32,
) -> Option<Vec<u32>> {
    let r = rank.index();
    let peer = r ^ 1;
    if peer >= n {
        return None;
    }
    let c = rank.client();
    let mine = upload(c, &vec![r as u32 * 10 + 1; words as usize]);
    let got = upload(c, &vec![7; words as usize]);
    if r.is_multiple_of(2) {
        rank.send(peer, mine.all()).expect("the even rank sends");
        rank.recv(peer, got.all()).expect("the even rank receives");
    } else {
        rank.recv(peer, got.all()).expect("the odd rank receives");
        rank.send(peer, mine.all()).expect("the odd rank sends");
    }
    Some(read_twice::<S>(c, &got).unwrap())
}

/// Ranks that join a group of one more rank than ever arrives give up within the deadline.
/// They end with [`CollectiveError::Stalled`], releasing what the library set up.
/// NCCL's init is aborted, not destroyed: destroying it would wait for the missing peer.
/// The same devices then join a new group of the ranks there are, and it works (rules 42, 43, 49).
pub fn a_join_short_of_its_peers_ends_within_the_deadline<S: Suite>()
where
    S::Backend: DeviceCollectives,
{
    let deadline = Duration::from_millis(500);
    for n in sizes::<S>() {
        let Some(clients) = clients::<S>(n) else {
            return;
        };
        let identity = <S::Backend as DeviceCollectives>::identity()
            .expect("the suite's backend has its collectives library");
        let started = Instant::now();
        let outcomes =
            on_threads_joined::<S, _>(clients.clone(), &identity, n + 1, deadline, |joined| {
                (joined.map(|_| ()), started.elapsed())
            });
        for (rank, (joined, waited)) in outcomes.into_iter().enumerate() {
            let at = format!("rank {rank} of {n} present, {} expected", n + 1);
            let error = joined.expect_err("a join short of a peer fails");
            assert!(
                matches!(collective_error(&error), CollectiveError::Stalled { .. }),
                "{at}: {error}"
            );
            assert!(
                waited >= deadline && waited < deadline + Duration::from_secs(30),
                "{at}: waited {waited:?} for a deadline of {deadline:?}"
            );
        }
        let identity = <S::Backend as DeviceCollectives>::identity().unwrap();
        let sums = on_threads_joined::<S, _>(clients, &identity, n, WAIT, |joined| {
            sum_of_ones::<S>(&joined.expect("the ranks there are join"))
        });
        assert!(sums.iter().all(|s| *s == vec![n as u32; 16]), "{sums:?}");
    }
}

/// A library call that fails on the last rank, after the ranks agreed, fails every rank's output.
/// Each names it, at every group size (rule 47).
/// That includes its own call, and a peer's that returns before it learns.
/// The group is broken, its communicators aborted.
/// A new group over the same devices works (rules 42, 43, 47).
pub fn a_failed_library_call_breaks_the_group_at_every_group_size<S: Suite>() {
    at_every_size::<S>(WAIT, |group, n| {
        assert!(
            group.is_over_device(),
            "this behaviour is for a suite whose groups are over a device transport"
        );
        let last = n - 1;
        let outcomes = group.run(|rank| {
            let c = rank.client();
            let input = upload(c, &[1; 16]);
            let output = upload(c, &[5; 16]);
            if rank.index() == last {
                c.inject(FaultPlan::new().fail(
                    Site::Collective,
                    1,
                    injected("the last rank's call"),
                ));
            }
            let reduced = rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
            let claim = read_twice::<S>(c, &output).expect_err("the output carries the failure");
            let later = rank.all_reduce(input.all(), alloc(c, 16).all(), Element::U32, Reduce::Sum);
            (reduced, claim, later)
        });
        for (rank, (reduced, claim, later)) in outcomes.into_iter().enumerate() {
            let at = format!("rank {rank} of {n}");
            let returned = match &reduced {
                Err(error) => Some(collective_error(error)),
                Ok(()) if rank != last => None,
                Ok(()) => panic!("{at}: the failed call returned Ok"),
            };
            for reported in returned.into_iter().chain([collective_error(claim.root())]) {
                let CollectiveError::IssueFailed { rank: failed, .. } = reported else {
                    panic!("{at}: {reported}");
                };
                assert_eq!(*failed, last, "{at} names the failed rank: {reported}");
            }
            let later = later.expect_err("the group is broken");
            assert!(
                matches!(collective_error(&later), CollectiveError::Broken { .. }),
                "{at}: {later}"
            );
        }
        assert!(group.broken().is_some());
        let clients = (0..n)
            .map(|r| group.rank(r).unwrap().client().clone())
            .collect();
        drop(group);
        let fresh = S::group(clients, WAIT).expect("a new group over the same devices");
        let sums = fresh.run(|rank| sum_of_ones::<S>(&rank));
        assert!(sums.iter().all(|s| *s == vec![n as u32; 16]), "{sums:?}");
    });
}

/// Membership changes at every group size (rules 54–57).
/// Every rank of the group shrinks.
/// None is gone, so the new epoch keeps them all, in order.
/// The new epoch computes while the old one refuses, claiming nothing.
/// Where there is a second device, a group of all but the last admits it.
/// It then heals the newcomer's weights from rank 0.
/// On the CUDA bundle's suite this is a new communicator from a fresh identity on local NCCL.
/// At one rank, that is a shrink to itself.
/// The admission needs a rank that is not a member.
/// So a machine of one device has no admission to run, and says so.
pub fn membership_changes_at_every_group_size<S: Suite>() {
    at_every_size::<S>(WAIT, |group, n| {
        let shrunk = group.run(|rank| {
            rank.shrink().unwrap_or_else(|e| {
                panic!(
                    "{n} ranks: rank {}: a whole group shrinks: {e}",
                    rank.index()
                )
            })
        });
        for (index, rank) in shrunk.iter().enumerate() {
            assert_eq!(
                (rank.epoch(), rank.ranks(), rank.index()),
                (1, n, index),
                "{n} ranks: nobody gone, nobody left out, the order kept"
            );
        }
        let sums = shrunk[0].group().run(|rank| sum_of_ones::<S>(&rank));
        assert!(
            sums.iter().all(|s| *s == vec![n as u32; 16]),
            "{n} ranks: {sums:?}"
        );
        let old = group.rank(0).unwrap();
        let c = old.client();
        let (ones, untouched) = (upload(c, &[1; 16]), upload(c, &[5; 16]));
        let stale = old
            .all_reduce(ones.all(), untouched.all(), Element::U32, Reduce::Sum)
            .expect_err("the superseded epoch takes no calls");
        assert!(
            matches!(
                collective_error(&stale),
                CollectiveError::Stale {
                    epoch: 0,
                    current: 1,
                    left_out: false
                }
            ),
            "{n} ranks: {stale}"
        );
        assert_eq!(
            read_twice::<S>(c, &untouched).unwrap(),
            vec![5; 16],
            "a stale call claims nothing"
        );
        if n < 2 {
            println!(
                "membership at one rank: the shrink ran; the admission not exercised \
                 (a newcomer needs a device that is not a member)"
            );
            return;
        }
        let clients: Vec<Client<S::Backend>> = (0..n)
            .map(|r| group.rank(r).unwrap().client().clone())
            .collect();
        drop((shrunk, group));
        let newcomer = clients[n - 1].clone();
        let fewer =
            S::group(clients[..n - 1].to_vec(), WAIT).expect("a group of all but the last device");
        // What the newcomer holds is not the group's until healed.
        let weights: Vec<Buffer> = clients
            .iter()
            .enumerate()
            .map(|(rank, c)| upload(c, &[if rank == n - 1 { 97 } else { 7 }; 16]))
            .collect();
        newcomer
            .fail_writing(&[weights[n - 1].all()], injected("never trained"))
            .unwrap();
        let admitted = fewer.run(|rank| {
            rank.admit(std::slice::from_ref(&newcomer))
                .unwrap_or_else(|e| panic!("{n} ranks: rank {}: the admission: {e}", rank.index()))
        });
        let grown = admitted[0].group();
        assert_eq!((admitted[0].epoch(), admitted[0].ranks()), (1, n));
        let outcomes = grown.run(|rank| {
            let c = rank.client();
            let mine = &weights[rank.index()];
            let sum = alloc(c, 16);
            let unhealed = rank.all_reduce(mine.all(), sum.all(), Element::U32, Reduce::Sum);
            rank.heal(0, &[mine.all()])
                .unwrap_or_else(|e| panic!("{n} ranks: rank {}: the heal: {e}", rank.index()));
            rank.all_reduce(mine.all(), sum.all(), Element::U32, Reduce::Sum)
                .unwrap_or_else(|e| {
                    panic!("{n} ranks: rank {}: healed, it reduces: {e}", rank.index())
                });
            (unhealed, read_twice::<S>(c, &sum).unwrap())
        });
        for (rank, (unhealed, sum)) in outcomes.into_iter().enumerate() {
            let unhealed = unhealed.expect_err("the newcomer's weights were not the group's");
            names_the_failed_rank(
                &format!("{n} ranks: rank {rank}, before the heal"),
                collective_error(&unhealed),
                n - 1,
                "never trained",
            );
            assert_eq!(
                sum,
                vec![7 * n as u32; 16],
                "{n} ranks: rank {rank}'s healed sum"
            );
        }
    });
}

/// Every rank of a group that is meant to work sums ones: what it read.
fn sum_of_ones<S: Suite>(rank: &Rank<S::Backend>) -> Vec<u32> {
    let c = rank.client();
    let ones = upload(c, &[1; 16]);
    let sum = alloc(c, 16);
    rank.all_reduce(ones.all(), sum.all(), Element::U32, Reduce::Sum)
        .expect("the new group works");
    read_twice::<S>(c, &sum).unwrap()
}

/// The behaviours at every group size: one `#[test]` each for `$suite`, with what each needs.
#[macro_export]
macro_rules! sizes_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, sizes::every_collective_computes_at_every_group_size, DeviceCollectives }
        $crate::behaviour! { $suite, sizes::a_failed_input_fails_every_output_at_every_group_size, DeviceCollectives }
        $crate::behaviour! { $suite, sizes::a_refused_collective_claims_nothing_at_every_group_size, DeviceCollectives }
        $crate::behaviour! { $suite, sizes::recorded_collectives_replay_at_every_group_size, DeviceCollectives }
        $crate::behaviour! { joined $suite, sizes::ranks_joined_alone_agree_at_every_group_size }
        $crate::behaviour! { joined $suite, sizes::a_join_short_of_its_peers_ends_within_the_deadline }
        $crate::behaviour! { $suite, sizes::a_failed_library_call_breaks_the_group_at_every_group_size, DeviceCollectives }
        $crate::behaviour! { $suite, sizes::membership_changes_at_every_group_size, DeviceCollectives }
    };
}
