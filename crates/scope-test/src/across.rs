//! Ranks that share no memory (rule 49).
//! Each rank joins its group on its own, from the identity alone ([`Rank::join`]).
//! That is how a rank in another process would join.
//! The rules of one process then hold by ballot on the transport.

use std::time::{Duration, Instant};

use super::*;
use scope_core::collective::device::DeviceCollectives;
use scope_core::collective::remote::PeerReport;
use scope_core::collective::{CollectiveError, Element, Rank, Reduce};

use super::collective::{PART, RANKS, collective_error};

/// `f(rank)` on a thread per rank, each holding nothing of its peers' but the identity.
/// `None` (skipped) without a device or the library.
fn each_rank_alone<S: Suite, R: Send>(
    deadline: Duration,
    f: impl Fn(Rank<S::Backend>) -> R + Sync,
) -> Option<Vec<R>>
where
    S::Backend: DeviceCollectives,
{
    each_of_ranks_alone::<S, R>(RANKS, deadline, f)
}

/// [`each_rank_alone`] for `ranks` ranks.
pub(super) fn each_of_ranks_alone<S: Suite, R: Send>(
    ranks: usize,
    deadline: Duration,
    f: impl Fn(Rank<S::Backend>) -> R + Sync,
) -> Option<Vec<R>>
where
    S::Backend: DeviceCollectives,
{
    let clients: Option<Vec<_>> = (0..ranks)
        .map(|rank| client_or_skip(|| S::rank_client(rank)))
        .collect();
    let clients = clients?;
    let identity = <S::Backend as DeviceCollectives>::identity()
        .expect("the suite's backend has its collectives library");
    Some(on_threads_joined::<S, _>(
        clients,
        &identity,
        ranks,
        deadline,
        |joined| f(joined.expect("every rank joins")),
    ))
}

/// `f` of what [`Rank::join`] answered client `i` of `clients`, as rank `i` of `ranks`.
/// Each joins with `identity` on a thread of its own.
/// What each returned, in rank order.
pub(super) fn on_threads_joined<S: Suite, R: Send>(
    clients: Vec<Client<S::Backend>>,
    identity: &<S::Backend as DeviceCollectives>::Identity,
    ranks: usize,
    deadline: Duration,
    f: impl Fn(Result<Rank<S::Backend>>) -> R + Sync,
) -> Vec<R>
where
    S::Backend: DeviceCollectives,
{
    let f = &f;
    std::thread::scope(|scope| {
        let threads: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(rank, client)| {
                scope.spawn(move || f(Rank::join(client, identity, rank, ranks, deadline)))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// What rank `rank` hears when rank 2's input failed with `text`.
/// Rank 2 is named and the text carried.
/// Every other rank gets a [`PeerReport`]; rank 2 gets the error itself.
fn names_rank_two(rank: usize, reported: &CollectiveError, text: &str) {
    let CollectiveError::InputFailed {
        rank: from, cause, ..
    } = reported
    else {
        panic!("rank {rank}: {reported}");
    };
    assert_eq!(*from, 2, "rank {rank} names rank 2: {reported}");
    assert!(
        cause.to_string().contains(text),
        "rank {rank}: the root cause travels: {cause}"
    );
    assert_eq!(
        cause.external_root::<PeerReport>().is_some(),
        rank != 2,
        "rank {rank}: a peer's failure arrives as its report: {cause:?}"
    );
}

/// Ranks that each joined alone, as in separate processes, compute every collective.
/// A failed input on rank 2 fails every rank's output (rules 41, 44, 49).
/// Each names rank 2 and its root cause, as rank 2's process rendered it.
/// The inputs stay as they were.
/// Ranks that disagree on the call are refused everywhere, claiming nothing.
/// The group goes on.
pub fn ranks_in_separate_processes_decide_alike<S: Suite>()
where
    S::Backend: DeviceCollectives,
{
    let outcomes = each_rank_alone::<S, _>(Duration::from_secs(120), |rank| {
        let c = rank.client();
        let r = rank.index() as u32;
        let input = upload(c, &vec![r + 1; PART as usize]);
        let sum = alloc(c, PART);
        rank.all_reduce(input.all(), sum.all(), Element::U32, Reduce::Sum)
            .unwrap();
        let gathered = alloc(c, PART * RANKS as u32);
        rank.all_gather(input.all(), gathered.all()).unwrap();
        let shared = upload(c, &vec![r * 7; PART as usize]);
        rank.broadcast(1, shared.all()).unwrap();
        // Rank 2's input carries a failure.
        let mine = upload(c, &vec![r; PART as usize]);
        if r == 2 {
            c.fail_writing(&[mine.all()], injected("rank two's backward pass"))
                .unwrap();
        }
        let output = upload(c, &[77; PART as usize]);
        let failed = rank.all_reduce(mine.all(), output.all(), Element::U32, Reduce::Sum);
        let claim = read_twice::<S>(c, &output).expect_err("the output carries the failure");
        let untouched = read_twice::<S>(c, &mine);
        // Rank 1 calls another collective.
        let kept = upload(c, &[5; PART as usize]);
        let refused = if r == 1 {
            rank.all_gather(input.all(), alloc(c, PART * RANKS as u32).all())
        } else {
            rank.all_reduce(input.all(), kept.all(), Element::U32, Reduce::Sum)
        };
        let kept = read_twice::<S>(c, &kept).unwrap();
        // Still in step.
        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Max)
            .unwrap();
        (
            (
                read_twice::<S>(c, &sum).unwrap(),
                read_twice::<S>(c, &gathered).unwrap(),
            ),
            read_twice::<S>(c, &shared).unwrap(),
            (failed, claim, untouched),
            (refused, kept),
            read_twice::<S>(c, &output).unwrap(),
            rank.broken(),
        )
    });
    let Some(outcomes) = outcomes else {
        return;
    };
    let total: u32 = (1..=RANKS as u32).sum();
    for (
        rank,
        ((sum, gathered), shared, (failed, claim, untouched), (refused, kept), healed, broken),
    ) in outcomes.into_iter().enumerate()
    {
        assert_eq!(sum, vec![total; PART as usize], "rank {rank}: sum");
        let expected: Vec<u32> = (1..=RANKS as u32)
            .flat_map(|v| std::iter::repeat_n(v, PART as usize))
            .collect();
        assert_eq!(gathered, expected, "rank {rank}: gather");
        assert_eq!(shared, vec![7; PART as usize], "rank {rank}: broadcast");
        let error = failed.expect_err("every rank's collective fails");
        for reported in [collective_error(&error), collective_error(claim.root())] {
            names_rank_two(rank, reported, "rank two's backward pass");
        }
        match rank {
            2 => assert!(untouched.is_err(), "rank 2's input still fails"),
            _ => assert_eq!(untouched.unwrap(), vec![rank as u32; PART as usize]),
        }
        let refused = refused.expect_err("a mismatched call is refused everywhere");
        assert!(
            matches!(
                collective_error(&refused),
                CollectiveError::Refused { rank: 1, .. }
            ),
            "rank {rank}: {refused}"
        );
        assert_eq!(
            kept,
            vec![5; PART as usize],
            "rank {rank}: a refusal claims nothing"
        );
        assert_eq!(
            healed,
            vec![RANKS as u32; PART as usize],
            "rank {rank}: healed"
        );
        assert!(broken.is_none(), "rank {rank}: {broken:?}");
    }
}

/// Ranks that each joined alone record collectives into a graph and replay it together.
/// Each replay is decided by ballot, and the recorded calls run only then (rules 49, 50).
/// Rank 2's failed input fails every rank's replay, naming rank 2 and its root cause.
/// Once it is written again, the next replay runs.
pub fn ranks_in_separate_processes_record_and_replay<S: Suite>()
where
    S::Backend: DeviceCollectives,
{
    let outcomes = each_rank_alone::<S, _>(Duration::from_secs(120), |rank| {
        let c = rank.client();
        let r = rank.index() as u32;
        let input = upload(c, &[0; PART as usize]);
        let sum = upload(c, &[9; PART as usize]);
        let capture = c.begin_capture().unwrap();
        rank.all_reduce(input.all(), sum.all(), Element::U32, Reduce::Sum)
            .expect("recorded on every rank");
        let graph = c.end_capture(capture).expect("a clean window seals");
        c.write(input.all(), &as_bytes(&vec![r + 1; PART as usize]))
            .unwrap();
        rank.replay(&graph).expect("every rank replays");
        let replayed = read_twice::<S>(c, &sum).unwrap();
        if r == 2 {
            c.fail_writing(&[input.all()], injected("rank two's forward pass"))
                .unwrap();
        }
        let failed = rank.replay(&graph);
        let claim = read_twice::<S>(c, &sum).expect_err("the output carries the failure");
        c.write(input.all(), &as_bytes(&vec![1; PART as usize]))
            .unwrap();
        rank.replay(&graph).expect("a clean replay runs");
        (
            replayed,
            failed,
            claim,
            read_twice::<S>(c, &sum).unwrap(),
            rank.broken(),
        )
    });
    let Some(outcomes) = outcomes else {
        return;
    };
    let total: u32 = (1..=RANKS as u32).sum();
    for (rank, (replayed, failed, claim, healed, broken)) in outcomes.into_iter().enumerate() {
        assert_eq!(
            replayed,
            vec![total; PART as usize],
            "rank {rank}: replayed"
        );
        let error = failed.expect_err("every rank's replay fails");
        for reported in [collective_error(&error), collective_error(claim.root())] {
            names_rank_two(rank, reported, "rank two's forward pass");
        }
        assert_eq!(
            healed,
            vec![RANKS as u32; PART as usize],
            "rank {rank}: healed"
        );
        assert!(broken.is_none(), "rank {rank}: {broken:?}");
    }
}

/// Rounds issued back to back.
const ROUNDS: usize = 200;

/// Ranks that each joined alone issue rounds and replay a graph of rounds with no read or sync.
/// No rank's stream is drained (rules 47, 49, 50).
/// Each ballot is taken from what is known at submission.
/// Each round is watched, not waited for.
/// Every output is right at the end.
pub fn rounds_of_ranks_joined_alone_drain_no_stream<S: Suite>()
where
    S::Backend: DeviceCollectives,
{
    let outcomes = each_rank_alone::<S, _>(Duration::from_secs(120), |rank| {
        let c = rank.client();
        let r = rank.index() as u32;
        let g = super::recorded::record_sized(&rank, PART, RANKS);
        c.write(g.input.all(), &as_bytes(&vec![r + 1; PART as usize]))
            .unwrap();
        let output = alloc(c, PART);
        let drains = c.drains();
        for k in 0..ROUNDS {
            if k % 10 == 0 {
                rank.replay(&g.graph).unwrap();
            }
            rank.all_reduce(g.input.all(), output.all(), Element::U32, Reduce::Max)
                .unwrap();
        }
        let drained = c.drains() - drains;
        (
            drained,
            read_twice::<S>(c, &output).unwrap(),
            read_twice::<S>(c, &g.sum).unwrap(),
            read_twice::<S>(c, &g.gathered).unwrap(),
        )
    });
    let Some(outcomes) = outcomes else {
        return;
    };
    let ranks = RANKS as u32;
    let gathered: Vec<u32> = (1..=ranks)
        .flat_map(|r| std::iter::repeat_n(r, PART as usize))
        .collect();
    for (rank, (drained, max, sum, all)) in outcomes.into_iter().enumerate() {
        assert_eq!(drained, 0, "rank {rank}'s stream was drained by a round");
        assert_eq!(max, vec![ranks; PART as usize], "rank {rank}'s rounds");
        let total = ranks * (ranks + 1) / 2;
        assert_eq!(
            sum,
            vec![total; PART as usize],
            "rank {rank}'s replayed sum"
        );
        assert_eq!(all, gathered, "rank {rank}'s replayed gather");
    }
}

/// Ranks that each joined alone send and receive through the library (rules 41, 44, 48, 49).
/// Clean bytes arrive.
/// Rank 2's failed bytes are claimed on rank 3's buffer, naming rank 2 and its root cause.
/// Rank 2 hears its own failure.
/// Lengths that differ are refused on both ends, claiming nothing.
/// The group goes on.
pub fn ranks_in_separate_processes_send_and_receive<S: Suite>()
where
    S::Backend: DeviceCollectives,
{
    let outcomes = each_rank_alone::<S, _>(Duration::from_secs(120), |rank| {
        let c = rank.client();
        let r = rank.index();
        // Pairs: 0 with 1, 2 with 3; the even rank sends first.
        let peer = r ^ 1;
        let mine = upload(c, &vec![r as u32 * 10 + 1; PART as usize]);
        let got = upload(c, &[7; PART as usize]);
        let (there, back) = if r.is_multiple_of(2) {
            (rank.send(peer, mine.all()), rank.recv(peer, got.all()))
        } else {
            let there = rank.recv(peer, got.all());
            (there, rank.send(peer, mine.all()))
        };
        let clean = (there, back, read_twice::<S>(c, &got).unwrap());
        // Rank 2's bytes carry a failure.
        if r == 2 {
            c.fail_writing(&[mine.all()], injected("rank two's activations"))
                .unwrap();
        }
        let failed = if r.is_multiple_of(2) {
            rank.send(peer, mine.all())
        } else {
            rank.recv(peer, got.all())
        };
        let claimed = read_twice::<S>(c, &got);
        // Lengths that differ: rank 1 receives half.
        let kept = upload(c, &[5; PART as usize]);
        let mismatched = match r {
            0 => rank.send(1, mine.all()),
            1 => rank.recv(0, kept.slice(0..u64::from(PART) * 2)),
            _ => Ok(()),
        };
        let kept = read_twice::<S>(c, &kept).unwrap();
        // Still in step.
        let ones = upload(c, &[1; PART as usize]);
        let sum = alloc(c, PART);
        rank.all_reduce(ones.all(), sum.all(), Element::U32, Reduce::Sum)
            .expect("the group goes on");
        assert_eq!(
            read_twice::<S>(c, &sum).unwrap(),
            vec![RANKS as u32; PART as usize]
        );
        (clean, (failed, claimed), (mismatched, kept), rank.broken())
    });
    let Some(outcomes) = outcomes else {
        return;
    };
    for (rank, ((there, back, got), (failed, claimed), (mismatched, kept), broken)) in
        outcomes.into_iter().enumerate()
    {
        there.expect("the first transfer of each pair");
        back.expect("the second transfer of each pair");
        let peer = rank ^ 1;
        assert_eq!(
            got,
            vec![peer as u32 * 10 + 1; PART as usize],
            "rank {rank} got its peer's bytes"
        );
        match rank {
            2 | 3 => {
                let error = failed.expect_err("rank 2's failed bytes fail both ends");
                names_rank_two(rank, collective_error(&error), "rank two's activations");
                if rank == 3 {
                    let claim = claimed.expect_err("rank 3's buffer carries the failure");
                    names_rank_two(
                        rank,
                        collective_error(claim.root()),
                        "rank two's activations",
                    );
                }
            }
            _ => {
                failed.expect("clean bytes travel");
                assert_eq!(
                    claimed.unwrap(),
                    vec![if rank == 1 { 1 } else { 11 }; PART as usize]
                );
            }
        }
        match rank {
            0 | 1 => {
                let refused = mismatched.expect_err("lengths that differ are refused");
                assert!(
                    matches!(collective_error(&refused), CollectiveError::Refused { .. }),
                    "rank {rank}: {refused}"
                );
            }
            _ => mismatched.unwrap(),
        }
        assert_eq!(
            kept,
            vec![5; PART as usize],
            "rank {rank}: a refusal claims nothing"
        );
        assert!(broken.is_none(), "rank {rank}: {broken:?}");
    }
}

/// A rank that never calls (rules 42, 43, 49).
/// Every other rank, joined alone, fails within the deadline with [`CollectiveError::Stalled`].
/// Across processes no rank can name the missing one.
/// Its output carries the stall, and its group is broken for later calls, claiming nothing.
pub fn a_silent_rank_in_another_process_stalls_its_peers_within_the_deadline<S: Suite>()
where
    S::Backend: DeviceCollectives,
{
    // Long enough for four threads joining under load: the join waits as long as a round.
    let deadline = Duration::from_secs(2);
    let started = Instant::now();
    let outcomes = each_rank_alone::<S, _>(deadline, |rank| {
        let c = rank.client();
        let input = upload(c, &[1; PART as usize]);
        let output = upload(c, &[5; PART as usize]);
        // One clean round, then rank 3 falls silent.
        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
            .unwrap();
        if rank.index() == 3 {
            return None;
        }
        let before = started.elapsed();
        let stalled = rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum);
        let waited = started.elapsed() - before;
        let claim = read_twice::<S>(c, &output).expect_err("the output carries the stall");
        let kept = upload(c, &[9; PART as usize]);
        let later = rank.all_reduce(input.all(), kept.all(), Element::U32, Reduce::Sum);
        Some((
            stalled,
            waited,
            claim,
            later,
            read_twice::<S>(c, &kept).unwrap(),
        ))
    });
    let Some(outcomes) = outcomes else {
        return;
    };
    let mut longest = Duration::ZERO;
    for (rank, outcome) in outcomes.into_iter().enumerate().take(3) {
        let (stalled, waited, claim, later, kept) = outcome.expect("ranks 0 to 2 called");
        let error = stalled.expect_err("a silent peer fails the collective");
        for reported in [collective_error(&error), collective_error(claim.root())] {
            assert!(
                matches!(reported, CollectiveError::Stalled { round: 1, .. }),
                "rank {rank}: {reported}"
            );
        }
        assert!(
            waited < deadline + Duration::from_secs(30),
            "rank {rank} waited {waited:?} for a deadline of {deadline:?}"
        );
        longest = longest.max(waited);
        let later = later.expect_err("the group is broken");
        assert!(
            matches!(collective_error(&later), CollectiveError::Broken { .. }),
            "rank {rank}: {later}"
        );
        assert_eq!(
            kept,
            vec![9; PART as usize],
            "rank {rank}: a refusal claims nothing"
        );
    }
    // The first to give up waited its deadline out; its peers may learn of its abort sooner.
    assert!(
        longest >= deadline,
        "no rank waited the deadline: {longest:?}"
    );
}

/// A sender that never sends (rules 42, 48, 49).
/// Its receiver, joined alone, fails within the deadline with [`CollectiveError::Stalled`].
/// Its buffer carries that, and its group is broken.
pub fn a_silent_sender_in_another_process_stalls_its_receiver_within_the_deadline<S: Suite>()
where
    S::Backend: DeviceCollectives,
{
    let deadline = Duration::from_secs(2);
    let outcomes = each_rank_alone::<S, _>(deadline, |rank| {
        if rank.index() != 1 {
            return None;
        }
        let c = rank.client();
        let data = upload(c, &[5; PART as usize]);
        let started = Instant::now();
        let stalled = rank.recv(0, data.all());
        Some((
            stalled,
            started.elapsed(),
            read_twice::<S>(c, &data),
            rank.broken(),
        ))
    });
    let Some(mut outcomes) = outcomes else {
        return;
    };
    let (stalled, waited, claim, broken) = outcomes.remove(1).expect("rank 1 received");
    let error = stalled.expect_err("a silent sender fails the receive");
    let claim = claim.expect_err("the buffer carries the stall");
    for reported in [collective_error(&error), collective_error(claim.root())] {
        assert!(
            matches!(reported, CollectiveError::Stalled { .. }),
            "{reported}"
        );
    }
    assert!(
        waited >= deadline && waited < deadline + Duration::from_secs(30),
        "waited {waited:?} for a deadline of {deadline:?}"
    );
    assert!(broken.is_some(), "the group is broken");
}

/// Ranks that joined alone with different membership epochs are refused (rules 44, 55).
/// A restarted process whose launcher gave it a stale epoch is the case.
/// Every rank refuses every call, claiming nothing, and they never meet as one group.
/// Ranks that joined a changed group alone cannot shrink it in memory: they join again.
pub fn a_rank_joined_with_a_stale_epoch_is_refused_everywhere<S: Suite>()
where
    S::Backend: DeviceCollectives,
{
    let clients: Option<Vec<_>> = (0..RANKS)
        .map(|rank| client_or_skip(|| S::rank_client(rank)))
        .collect();
    let Some(clients) = clients else {
        return;
    };
    let identity = <S::Backend as DeviceCollectives>::identity()
        .expect("the suite's backend has its collectives library");
    let identity = &identity;
    let outcomes = std::thread::scope(|scope| {
        let threads: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(rank, client)| {
                scope.spawn(move || {
                    // Rank 3 comes back with the epoch before.
                    let epoch = if rank == 3 { 1 } else { 2 };
                    let me = Rank::join_epoch(
                        client,
                        identity,
                        rank,
                        RANKS,
                        epoch,
                        Duration::from_secs(120),
                    )
                    .expect("every rank joins");
                    let c = me.client();
                    let input = upload(c, &[1; PART as usize]);
                    let output = upload(c, &[5; PART as usize]);
                    let calls = [
                        me.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum),
                        me.broadcast(0, output.all()),
                    ];
                    let shrink = me.shrink().map(|_| ());
                    (
                        calls,
                        read_twice::<S>(c, &output).unwrap(),
                        shrink,
                        me.broken(),
                    )
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect::<Vec<_>>()
    });
    for (rank, (calls, output, shrink, broken)) in outcomes.into_iter().enumerate() {
        for call in calls {
            let error = call.expect_err("a stale epoch is refused");
            let CollectiveError::Refused {
                rank: named, why, ..
            } = collective_error(&error)
            else {
                panic!("rank {rank}: {error}");
            };
            assert_eq!(*named, 3, "rank {rank} names the stale rank: {error}");
            assert!(why.contains("epoch 1"), "rank {rank}: {why}");
        }
        assert_eq!(
            output,
            vec![5; PART as usize],
            "rank {rank}: nothing claimed"
        );
        let shrink = shrink.expect_err("joined alone, a rank joins again instead");
        assert!(
            matches!(shrink, Error::Refused { .. }),
            "rank {rank}: {shrink}"
        );
        assert!(broken.is_none(), "rank {rank}: refusals break nothing");
    }
}

// The variables a parent hands each child process of `ranks_in_separate_processes`.
const CHILD_RANK: &str = "SCOPE_CONFORMANCE_RANK";
const CHILD_ID: &str = "SCOPE_CONFORMANCE_ID";
const CHILD_DIR: &str = "SCOPE_CONFORMANCE_DIR";

/// Four ranks in four processes, for a backend whose identity is NCCL's unique id.
/// This test binary runs itself four times, running only the test `child`.
/// That test calls [`one_rank_in_its_own_process`].
/// Each child is a rank with its own server, handed nothing of its peers' but the id, as hex.
/// `identity(dir)` makes the id.
/// Real NCCL's [`DeviceCollectives::identity`] is joinable from anywhere.
/// A mock's must be made to be: its clique is a file of `dir`, for the children to map.
/// Each child asserts its own part, and every child must pass (rules 41, 42, 49).
pub fn ranks_in_separate_processes<S: Suite>(
    child: &str,
    identity: impl FnOnce(&std::path::Path) -> scope_native::nccl::UniqueId,
) where
    S::Backend: DeviceCollectives<Identity = scope_native::nccl::UniqueId>,
{
    use std::process::{Command, Stdio};

    let dir = std::env::temp_dir().join(format!(
        "scope-conformance-ranks-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a folder for the children");
    // The server first: the library it loads is the one `identity` asks.
    if client_or_skip(|| S::rank_client(0)).is_none() {
        return;
    }
    let id = identity(&dir);
    let hex: String = id.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let me = std::env::current_exe().expect("this test binary");
    let children: Vec<_> = (0..RANKS)
        .map(|rank| {
            Command::new(&me)
                .args(["--exact", child, "--ignored", "--nocapture"])
                .env(CHILD_RANK, rank.to_string())
                .env(CHILD_ID, &hex)
                .env(CHILD_DIR, &dir)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("a child process")
        })
        .collect();
    let mut failed = Vec::new();
    for (rank, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().expect("the child's output");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() || !said.contains("1 passed") {
            failed.push(format!("rank {rank} ({}):\n{said}", out.status));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The rank a child of [`ranks_in_separate_processes`] is, and the children's folder.
/// It joins with the id its parent handed out once every child started.
/// So `deadline` times the ranks, not the start-up.
/// `None`, saying so, where the test runs by hand (`--ignored`), not as a child.
pub fn joined_as_a_child<S: Suite>(
    deadline: Duration,
) -> Option<(Rank<S::Backend>, std::path::PathBuf)>
where
    S::Backend: DeviceCollectives<Identity = scope_native::nccl::UniqueId>,
{
    if std::env::var_os(CHILD_RANK).is_none() {
        println!(
            "not run: a child process of ranks_in_separate_processes, which sets {CHILD_RANK}"
        );
        return None;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} (a child only)"));
    let rank: usize = var(CHILD_RANK).parse().expect("a rank");
    let hex = var(CHILD_ID);
    let raw: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
        .collect();
    let id = scope_native::nccl::UniqueId::from_bytes(&raw).expect("128 bytes");
    let dir = std::path::PathBuf::from(var(CHILD_DIR));
    let client = S::rank_client(rank).expect("the suite's rank client");
    std::fs::write(dir.join(format!("ready-{rank}")), b"").expect("a mark");
    let started = Instant::now();
    while (0..RANKS).any(|r| !dir.join(format!("ready-{r}")).exists()) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "peers never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let me = Rank::join(client, &id, rank, RANKS, deadline).expect("every rank joins");
    Some((me, dir))
}

/// One child of [`ranks_in_separate_processes`].
/// It is rank `SCOPE_CONFORMANCE_RANK` of four, on the suite's rank client of that number.
/// A clean all-reduce and all-gather run.
/// A graph of an all-reduce is recorded and replayed in every process.
/// Pairs of processes send and receive.
/// Rank 2's failed input fails every rank's output, its text crossing as a [`PeerReport`].
/// Then rank 3's process ends, and the others stall within the deadline, their group broken.
pub fn one_rank_in_its_own_process<S: Suite>()
where
    S::Backend: DeviceCollectives<Identity = scope_native::nccl::UniqueId>,
{
    // Generous for four processes under load; the silent step waits it out.
    let deadline = Duration::from_secs(5);
    let Some((me, _)) = joined_as_a_child::<S>(deadline) else {
        return;
    };
    let rank = me.index();
    let c = me.client();
    let r = rank as u32;

    let input = upload(c, &vec![r + 1; PART as usize]);
    let sum = alloc(c, PART);
    me.all_reduce(input.all(), sum.all(), Element::U32, Reduce::Sum)
        .unwrap();
    assert_eq!(read_twice::<S>(c, &sum).unwrap(), vec![10; PART as usize]);
    let gathered = alloc(c, PART * RANKS as u32);
    me.all_gather(input.all(), gathered.all()).unwrap();
    let expected: Vec<u32> = (1..=RANKS as u32)
        .flat_map(|v| std::iter::repeat_n(v, PART as usize))
        .collect();
    assert_eq!(read_twice::<S>(c, &gathered).unwrap(), expected);

    // A graph of an all-reduce, recorded and replayed by every process together.
    let recorded = alloc(c, PART);
    let capture = c.begin_capture().unwrap();
    me.all_reduce(input.all(), recorded.all(), Element::U32, Reduce::Sum)
        .expect("recorded in every process");
    let graph = c.end_capture(capture).expect("a clean window seals");
    c.write(input.all(), &as_bytes(&vec![2 * r; PART as usize]))
        .unwrap();
    me.replay(&graph).expect("every process replays");
    assert_eq!(
        read_twice::<S>(c, &recorded).unwrap(),
        vec![12; PART as usize]
    );

    // Point-to-point between processes: 0 with 1, 2 with 3.
    let peer = rank ^ 1;
    let got = alloc(c, PART);
    if rank.is_multiple_of(2) {
        me.send(peer, input.all()).expect("sent");
        me.recv(peer, got.all()).expect("received");
    } else {
        me.recv(peer, got.all()).expect("received");
        me.send(peer, input.all()).expect("sent");
    }
    assert_eq!(
        read_twice::<S>(c, &got).unwrap(),
        vec![2 * peer as u32; PART as usize]
    );

    let mine = upload(c, &vec![r; PART as usize]);
    if rank == 2 {
        c.fail_writing(
            &[mine.all()],
            injected("rank two's backward pass, in its own process"),
        )
        .unwrap();
    }
    let out = upload(c, &[77; PART as usize]);
    let failed = me
        .all_reduce(mine.all(), out.all(), Element::U32, Reduce::Sum)
        .expect_err("every rank's collective fails");
    let claimed = read_twice::<S>(c, &out).expect_err("the output carries the failure");
    for reported in [collective_error(&failed), collective_error(claimed.root())] {
        names_rank_two(rank, reported, "in its own process");
    }

    if rank == 3 {
        S::finished();
        return;
    }
    let before = Instant::now();
    let stalled = me
        .all_reduce(input.all(), sum.all(), Element::U32, Reduce::Sum)
        .expect_err("a silent peer fails the collective");
    assert!(before.elapsed() < deadline + Duration::from_secs(20));
    assert!(
        matches!(collective_error(&stalled), CollectiveError::Stalled { .. }),
        "rank {rank}: {stalled}"
    );
    assert!(
        read_twice::<S>(c, &sum).is_err(),
        "the output carries the stall"
    );
    assert!(me.broken().is_some());
    S::finished();
}

/// The behaviours of ranks joined alone: one `#[test]` each for `$suite`, with what each needs.
#[macro_export]
macro_rules! across_tests {
    ($suite:ty) => {
        $crate::behaviour! { joined $suite, across::ranks_in_separate_processes_decide_alike }
        $crate::behaviour! { joined $suite, across::ranks_in_separate_processes_record_and_replay }
        $crate::behaviour! { joined $suite, across::rounds_of_ranks_joined_alone_drain_no_stream }
        $crate::behaviour! { joined $suite, across::ranks_in_separate_processes_send_and_receive }
        $crate::behaviour! { joined $suite, across::a_silent_rank_in_another_process_stalls_its_peers_within_the_deadline }
        $crate::behaviour! { joined $suite, across::a_silent_sender_in_another_process_stalls_its_receiver_within_the_deadline }
        $crate::behaviour! { joined $suite, across::a_rank_joined_with_a_stale_epoch_is_refused_everywhere }
    };
}
