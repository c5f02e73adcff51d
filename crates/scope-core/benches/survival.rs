//! What surviving a lost device costs, against starting over, side by side
//! in one run on the reference server (rules 51–57).
//!
//! - **recovery**: a client holding `BUFFERS` buffers of `SIZE` bytes
//!   loses its device (an injected sticky fault) and `Client::recover`s —
//!   the lost device given up, opened again, every allocation made anew
//!   and claimed as lost with the device — against what a runtime does
//!   without it: open a new client and allocate the same buffers (its old
//!   handles all foreign to the new server).
//! - **shrink**: a group of four, rank 3's device lost; the other three
//!   shrink to a group of themselves — against making a new group of
//!   their three clients.
//! - **admission**: a group of three admits a fourth client — against
//!   making a new group of the four.
//!
//! Membership is timed on host staging and on the loopback device
//! transport, whose new epoch joins new communicators (as NCCL's would,
//! from a fresh identity). The figures that matter are the ratios: what
//! keeping the handles and the membership costs over starting from
//! scratch, which on a real device is dominated by opening the device and
//! setting up the library — neither of which the host server pays — so
//! these ratios measure scope's own bookkeeping alone.
//!
//! A change is a meeting of the ranks, decided once for all of them; a new
//! group made on one thread that holds every client agrees on nothing.
//! So each change is reported against both: the new group, and one
//! all-reduce of a word on the same ranks, each on its own thread as the
//! change runs — the floor of any agreement between them.
//!
//! Each round runs every way once, interleaved; each figure is the median
//! of its rounds. `SCOPE_BENCH_SMOKE=1` runs one round.

#[path = "common/timing.rs"]
mod timing;

use std::time::{Duration, Instant};

use scope_core::collective::{Element, Group, Rank, Reduce};
use scope_core::{Buffer, Client, FaultPlan, Recovered, Result};
use scope_test::host::{Host, client};
use timing::{median, smoke};

const BUFFERS: usize = 64;
const SIZE: u64 = 64 << 10;
const DEADLINE: Duration = Duration::from_secs(120);

/// Poison `c` with an injected sticky fault, surfaced by an allocation.
fn lose(c: &Client<Host>) {
    c.inject(FaultPlan::new().poison_at(1, "injected", "DEVICE_LOST"));
    let _ = c.allocate(4);
    assert!(c.poison().is_some(), "the device is lost");
}

fn buffers(c: &Client<Host>) -> Result<Vec<Buffer>> {
    (0..BUFFERS)
        .map(|_| c.upload(&vec![1u8; SIZE as usize]))
        .collect()
}

/// One recovery of a client holding its buffers; one new client and its
/// buffers.
fn recovery_round() -> (Duration, Duration) {
    let c = client().expect("a host server");
    let held = buffers(&c).expect("buffers");
    lose(&c);
    let start = Instant::now();
    let recovered = c.recover().expect("the device opens again");
    let recover = start.elapsed();
    assert!(matches!(recovered, Recovered::Reopened { buffers, .. } if buffers == BUFFERS));
    drop(held);

    let start = Instant::now();
    let fresh = client().expect("a host server");
    let made: Vec<Buffer> = (0..BUFFERS)
        .map(|_| fresh.allocate(SIZE).expect("a buffer"))
        .collect();
    let scratch = start.elapsed();
    drop(made);
    (recover, scratch)
}

fn clients(n: usize) -> Vec<Client<Host>> {
    (0..n).map(|_| client().expect("a host server")).collect()
}

/// A group of `clients`, over the loopback transport or host staging.
fn group(clients: Vec<Client<Host>>, over_device: bool) -> Group<Host> {
    if over_device {
        Group::over_device(clients, DEADLINE).expect("a group")
    } else {
        Group::new(clients, DEADLINE).expect("a group")
    }
}

/// Every rank of `group` runs `f`; the time from the first start to the
/// last end.
fn timed<R: Send>(group: &Group<Host>, f: impl Fn(Rank<Host>) -> R + Sync) -> (Duration, Vec<R>) {
    let start = Instant::now();
    let out = group.run(f);
    (start.elapsed(), out)
}

/// One all-reduce of one word on every rank of `group`, timed as
/// [`timed`] times a change: what one meeting of these ranks costs, the
/// scale a change (a meeting, decided once) should be read against.
fn one_meeting(group: &Group<Host>) -> Duration {
    let (took, out) = timed(group, |rank| {
        let c = rank.client();
        let input = c.upload(&[1u8; 4])?;
        let output = c.allocate(4)?;
        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
    });
    for done in out {
        done.expect("a clean all-reduce");
    }
    took
}

/// One shrink of four ranks to three, rank 3's device lost; one new group
/// of the three; one meeting of the three.
fn shrink_round(over_device: bool) -> Round {
    let all = clients(4);
    let four = group(all.clone(), over_device);
    lose(&all[3]);
    let (shrink, shrunk) = timed(&four, |rank| (rank.index() != 3).then(|| rank.shrink()));
    for rank in shrunk.into_iter().flatten() {
        assert_eq!(rank.expect("the survivors shrink").ranks(), 3);
    }
    let start = Instant::now();
    let three = group(all[..3].to_vec(), over_device);
    let scratch = start.elapsed();
    let meeting = one_meeting(&three);
    (shrink, scratch, meeting)
}

/// One admission of a fourth client into three ranks; one new group of
/// the four; one meeting of the four.
fn admission_round(over_device: bool) -> Round {
    let all = clients(4);
    let three = group(all[..3].to_vec(), over_device);
    let newcomer = std::slice::from_ref(&all[3]);
    let (admit, admitted) = timed(&three, |rank| rank.admit(newcomer));
    for rank in admitted {
        assert_eq!(rank.expect("admitted").ranks(), 4);
    }
    let start = Instant::now();
    let four = group(all, over_device);
    let scratch = start.elapsed();
    let meeting = one_meeting(&four);
    (admit, scratch, meeting)
}

/// A change's time, a new group's, and one meeting's of the same ranks.
type Round = (Duration, Duration, Duration);

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn report(name: &str, rounds: Vec<(Duration, Duration)>, against: &str) {
    let (ours, theirs): (Vec<_>, Vec<_>) = rounds.into_iter().unzip();
    let (ours, theirs) = (median(ours), median(theirs));
    println!(
        "{name:<36} {:>10.1} µs   {against:<28} {:>10.1} µs   ratio {:.2}×",
        micros(ours),
        micros(theirs),
        ours.as_secs_f64() / theirs.as_secs_f64().max(1e-12)
    );
}

/// A change against a new group made on one thread (no agreement: the
/// caller holds every client), and against one all-reduce of a word on the
/// same ranks (an agreement's floor: every rank on its thread, meeting).
fn report_change(name: &str, rounds: Vec<Round>) {
    let ours = median(rounds.iter().map(|r| r.0).collect());
    let scratch = median(rounds.iter().map(|r| r.1).collect());
    let meeting = median(rounds.iter().map(|r| r.2).collect());
    println!(
        "{name:<36} {:>10.1} µs   new group {:>8.1} µs ({:.0}×)   one all-reduce {:>8.1} µs ({:.2}×)",
        micros(ours),
        micros(scratch),
        ours.as_secs_f64() / scratch.as_secs_f64().max(1e-12),
        micros(meeting),
        ours.as_secs_f64() / meeting.as_secs_f64().max(1e-12),
    );
}

fn main() {
    let rounds = if smoke() { 1 } else { 31 };
    println!(
        "survival on the reference server: median of {rounds} interleaved rounds; \
         {BUFFERS} buffers of {} KiB",
        SIZE >> 10
    );
    let mut recovery = Vec::new();
    let mut shrink = [Vec::new(), Vec::new()];
    let mut admission = [Vec::new(), Vec::new()];
    for _ in 0..rounds {
        recovery.push(recovery_round());
        for (i, over_device) in [false, true].into_iter().enumerate() {
            shrink[i].push(shrink_round(over_device));
            admission[i].push(admission_round(over_device));
        }
    }
    report(
        "recover (every handle kept)",
        recovery,
        "new client + allocations",
    );
    let [staged, device] = shrink;
    report_change("shrink 4 → 3, host staging", staged);
    report_change("shrink 4 → 3, loopback transport", device);
    let [staged, device] = admission;
    report_change("admit 3 → 4, host staging", staged);
    report_change("admit 3 → 4, loopback transport", device);
}
