//! What each way of meeting costs a collective, side by side in one run, on
//! the reference server: four host servers as four ranks, an all-reduce
//! (`f32`, sum) of `size` bytes a rank, for sizes from one word to 16 MiB.
//!
//! - **host staging** (`Group::new`): every rank reads its part to the
//!   host, the last to arrive at the in-memory meeting sums them, every
//!   rank writes the sum back.
//! - **device transport, one process** (`Group::over_device`, the loopback
//!   communicator): the ranks meet once in memory on whether their inputs
//!   are readable, then call the transport.
//! - **ranks joined alone** (`Rank::join`, the same transport): what a rank
//!   in another process pays — a ballot of one 1 KiB record a rank,
//!   all-gathered through the transport, then the call, issued on a
//!   communication stream and left to the watchdog — with nothing of its
//!   peers' in its memory.
//! - **replayed**: the device transport's all-reduce recorded once into a
//!   graph per rank (untimed), then `Rank::replay` — one process, and
//!   joined alone — against calling it each time.
//! - **transfers**: ranks 0 and 2 send `size` bytes to ranks 1 and 3 —
//!   through the host mailbox in one process, and through the transport
//!   (a header exchange, then the bytes) for ranks joined alone.
//!
//! The figures that matter are the ratios: the ballot's price (alone over
//! one process) at one word, where it is all fixed cost, and at 16 MiB,
//! where the data should dominate. The loopback transport moves bytes on
//! the host, so neither transport says what NCCL on a GPU would give; the
//! ratios say what the meeting adds to the same data movement.
//!
//! Each round runs every way once, interleaved, so a machine that slows
//! down slows each alike; each figure is the median of its rounds.
//! `SCOPE_BENCH_SMOKE=1` runs a round of the smallest size, to prove the
//! bench runs.
//!
//! Measured on the 2-core development machine (release, three runs):
//!
//! | a rank | joined alone / one process | device transport / host staging |
//! |---|---|---|
//! | 4 B | 1.40–1.47× | 2.64–2.76× |
//! | 64 KiB | 0.82–0.86× | 1.28–1.42× |
//! | 1 MiB | 0.59–0.62× | 0.98–1.07× |
//! | 16 MiB | 0.99–1.25× | 0.73–0.90× |
//!
//! Replays and transfers (the same runs, every rank starting each
//! transfer round together):
//!
//! | a rank | replayed / called, one process | replayed / called, joined alone | transfer joined alone / one process |
//! |---|---|---|---|
//! | 4 B | 0.96–1.01× | 0.97× | 2.22–2.52× |
//! | 64 KiB | 0.76–0.81× | 0.96–1.06× | 1.47–1.69× |
//! | 1 MiB | 0.64–0.79× | 0.67–1.17× | 0.74–0.86× |
//! | 16 MiB | 0.69–0.73× | 0.59–0.71× | 0.68–0.86× |
//!
//! A replay costs at most what a call does: its meeting is the same
//! meeting, with a check of the graph's inputs for the input's. A transfer
//! between ranks joined alone pays a header exchange first (about 2.5× the
//! mailbox's time at one word), then moves the bytes once instead of
//! reading them to the host and writing them back.
//!
//! The ballot shows at one word only: a rank alone (the ballot's
//! all-gather and its host wait, then the call) takes 1.40–1.47× one
//! process's meeting and call, about 67–91 µs against 47–64 µs with four
//! threads on two cores; from 64 KiB on the data dominates. The loopback
//! runs a call as it is issued, so no wait on the call was ever paid
//! here: the rounds' move to a communication stream (more ordering, the
//! watchdog's entry) took the ratio from 1.30–1.32×, and what it buys,
//! overlap, shows on the timed mock (`ddp_step`). The device path's fixed
//! cost, about 3× host staging's at one word, is the loopback's call: it
//! blocks until every rank posted, a handoff NCCL's asynchronous call does
//! not make.

#[path = "common/timing.rs"]
mod timing;

use std::time::{Duration, Instant};

use scope_core::collective::device::DeviceCollectives;
use scope_core::collective::{Element, Group, Rank, Reduce};
use scope_core::{Buffer, Client, Result};
use scope_test::host::{Host, client};
use timing::{median, smoke};

const RANKS: usize = 4;
const DEADLINE: Duration = Duration::from_secs(120);

/// One rank's input and output of `size` bytes.
fn buffers(c: &Client<Host>, size: usize) -> Result<(Buffer, Buffer)> {
    let input = c.upload(&1.0f32.to_le_bytes().repeat(size / 4))?;
    let output = c.allocate(size as u64)?;
    Ok((input, output))
}

/// How a rank runs its all-reduce in the timed loop.
#[derive(Clone, Copy)]
enum How {
    /// Called each time.
    Called,
    /// Recorded once into a graph, untimed, then replayed with
    /// `Rank::replay` each time.
    Replayed,
}

/// Time `rounds` all-reduces of the ranks `ranks` (one thread each, each
/// with its own buffers), every rank's output synced when the clock stops;
/// the time of each, from the first rank's start to the last rank's end.
fn time_ranks(ranks: &[Rank<Host>], size: usize, rounds: usize, how: How) -> Vec<Duration> {
    spans(ranks, rounds, |rank| {
        let c = rank.client();
        let (input, output) = buffers(c, size).expect("buffers");
        let reduce = || rank.all_reduce(input.all(), output.all(), Element::F32, Reduce::Sum);
        let graph = match how {
            How::Called => None,
            How::Replayed => {
                let capture = c.begin_capture().expect("a capture");
                reduce().expect("a recorded all-reduce");
                Some(c.end_capture(capture).expect("a graph"))
            }
        };
        (0..rounds)
            .map(|_| {
                let start = Instant::now();
                match &graph {
                    None => reduce().expect("a clean all-reduce"),
                    Some(graph) => rank.replay(graph).expect("a clean replay"),
                }
                c.sync().expect("sync");
                (start, Instant::now())
            })
            .collect()
    })
}

/// Time `rounds` transfers of `size` bytes from rank 0 to rank 1 and from
/// rank 2 to rank 3 at once, each received buffer synced when the clock
/// stops: from the first start to the last end of each round.
///
/// Every rank starts each round together: a send through the host mailbox
/// does not wait for its receiver, and a sender running rounds ahead would
/// time the queue, not the transfer.
fn time_transfers(ranks: &[Rank<Host>], size: usize, rounds: usize) -> Vec<Duration> {
    let together = &std::sync::Barrier::new(ranks.len());
    spans(ranks, rounds, |rank| {
        let c = rank.client();
        let (data, _) = buffers(c, size).expect("buffers");
        let r = rank.index();
        (0..rounds)
            .map(|_| {
                together.wait();
                let start = Instant::now();
                if r.is_multiple_of(2) {
                    rank.send(r + 1, data.all()).expect("a clean send");
                } else {
                    rank.recv(r - 1, data.all()).expect("a clean receive");
                }
                c.sync().expect("sync");
                (start, Instant::now())
            })
            .collect()
    })
}

/// Run `each` on every rank, a thread each; it times its rounds, and a
/// round's span is from the first rank's start to the last rank's end.
fn spans(
    ranks: &[Rank<Host>],
    rounds: usize,
    each: impl Fn(&Rank<Host>) -> Vec<(Instant, Instant)> + Sync,
) -> Vec<Duration> {
    let each = &each;
    let per_rank: Vec<Vec<(Instant, Instant)>> = std::thread::scope(|scope| {
        let threads: Vec<_> = ranks
            .iter()
            .map(|rank| scope.spawn(move || each(rank)))
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a rank's thread"))
            .collect()
    });
    (0..rounds)
        .map(|i| {
            let start = per_rank.iter().map(|r| r[i].0).min().expect("ranks");
            let end = per_rank.iter().map(|r| r[i].1).max().expect("ranks");
            end - start
        })
        .collect()
}

fn clients() -> Vec<Client<Host>> {
    (0..RANKS)
        .map(|_| client().expect("a host server"))
        .collect()
}

/// Four ranks that each joined alone, from one identity.
fn joined_alone() -> Vec<Rank<Host>> {
    let identity = <Host as DeviceCollectives>::identity().expect("the loopback identity");
    let identity = &identity;
    std::thread::scope(|scope| {
        let threads: Vec<_> = clients()
            .into_iter()
            .enumerate()
            .map(|(rank, c)| {
                scope.spawn(move || Rank::join(c, identity, rank, RANKS, DEADLINE).expect("join"))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a rank's thread"))
            .collect()
    })
}

fn ranks_of(group: &Group<Host>) -> Vec<Rank<Host>> {
    (0..RANKS).map(|r| group.rank(r).expect("a rank")).collect()
}

fn main() {
    let smoke = smoke();
    let sizes: &[usize] = if smoke {
        &[4]
    } else {
        &[4, 64 << 10, 1 << 20, 16 << 20]
    };
    let staged = ranks_of(&Group::new(clients(), DEADLINE).expect("a host-staged group"));
    let device = ranks_of(&Group::over_device(clients(), DEADLINE).expect("a loopback group"));
    let alone = joined_alone();
    println!("collectives: all-reduce (f32, sum) over {RANKS} host servers, median of the rounds");
    for &size in sizes {
        let (rounds, per_round) = match (smoke, size) {
            (true, _) => (1, 2),
            (false, s) if s >= 16 << 20 => (9, 1),
            (false, s) if s >= 1 << 20 => (11, 4),
            _ => (15, 50),
        };
        let ways = [
            (&staged, How::Called),
            (&device, How::Called),
            (&alone, How::Called),
            (&device, How::Replayed),
            (&alone, How::Replayed),
        ];
        let mut times: [Vec<Duration>; 7] = Default::default();
        for _ in 0..=rounds {
            for (way, (ranks, how)) in ways.into_iter().enumerate() {
                let each = time_ranks(ranks, size, per_round, how);
                times[way].push(each.into_iter().sum::<Duration>() / per_round as u32);
            }
            for (way, ranks) in [&staged, &alone].into_iter().enumerate() {
                let each = time_transfers(ranks, size, per_round);
                times[5 + way].push(each.into_iter().sum::<Duration>() / per_round as u32);
            }
        }
        // The first round warms up.
        let [
            staged_t,
            device_t,
            alone_t,
            replayed_t,
            replayed_alone_t,
            mailbox_t,
            sent_alone_t,
        ] = times.map(|mut t| {
            t.remove(0);
            median(t)
        });
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
        println!(
            "  {size:>9} B a rank: host staging {:9.1} µs, device transport {:9.1} µs, joined alone {:9.1} µs",
            us(staged_t),
            us(device_t),
            us(alone_t)
        );
        println!(
            "  {size:>9} B a rank: replayed graph, one process {:9.1} µs, joined alone {:9.1} µs",
            us(replayed_t),
            us(replayed_alone_t)
        );
        println!(
            "  {size:>9} B a transfer: in one process (host mailbox) {:9.1} µs, joined alone (library) {:9.1} µs",
            us(mailbox_t),
            us(sent_alone_t)
        );
        println!(
            "  {size:>9} B a rank: ratio joined alone / one process {:.2}×, device transport / host staging {:.2}×",
            ratio(alone_t, device_t),
            ratio(device_t, staged_t)
        );
        println!(
            "  {size:>9} B a rank: ratio replayed / called {:.2}× (one process), {:.2}× (joined alone); transfer joined alone / one process {:.2}×",
            ratio(replayed_t, device_t),
            ratio(replayed_alone_t, alone_t),
            ratio(sent_alone_t, mailbox_t)
        );
    }
}
