//! Random rounds of collectives against an oracle, for any group.
//!
//! The collective behaviours test each rule with the sequence someone wrote. This runs the
//! sequences nobody did. Each round, every rank may write fresh bytes into one of its buffers. It
//! may instead fail one, as a failed kernel would, or copy one into another. Then the group runs
//! one collective over those buffers:
//!
//! - an all-reduce (`u32` or `i32`, any reduction, in place now and then);
//! - an all-gather into a wide buffer, or a reduce-scatter out of it;
//! - an all-to-all, or a broadcast from any root;
//! - every rank sending to the next and receiving from the one before;
//! - a call the ranks disagree on: another collective, or an output of another length on one rank.
//!
//! Over a device transport a round whose inputs are clean is sometimes recorded on every rank,
//! sometimes with a copy of its output recorded after it. The ranks then replay it together, with a
//! failure claimed on one rank in between (rule 50).
//!
//! Rounds are left in flight. After its call each rank may copy the round's output into another
//! buffer, or write the round's input from the host. It may claim a buffer, or copy through a buffer
//! it frees at once. A runtime's step issues such work behind its round, and it must wait for the
//! round. Reads come only now and then: up to [`IN_FLIGHT`] rounds and their work are outstanding.
//!
//! Beside the group, an oracle keeps every buffer of every rank. It knows either its words or the
//! failures a read of it may name. When the ranks read, each reads all of its buffers, and:
//!
//! - a read fails exactly when the oracle says the buffer is stale. A clean read returns the
//!   oracle's words (rule 41's healing, 45's stream order);
//! - a stale buffer's root is the one the oracle expects. That is the injected failure, or
//!   `InputFailed` naming the lowest rank whose input failed. The failure's text is somewhere in
//!   its chain (rules 41, 48);
//! - every rank's call answered as the oracle expects. That is `Ok`, `InputFailed` naming that
//!   rank, or `Refused` on every rank with nothing claimed (rule 44). Rounds whose inputs also
//!   failed are included;
//! - the group never breaks, and the store's books add up ([`Client::audit`]).
//!
//! With changes ([`random_rounds_with_changes`]), over a device transport, one rank's library call
//! sometimes fails (rule 43). Its call answers `IssueFailed` naming it; a peer's answers that or
//! `Ok`, as its call went out before or after it learned (rule 47). Every rank's output then reads
//! `IssueFailed` naming the rank, the group is broken once read, and the others shrink without it
//! and admit it back.
//!
//! `SCOPE_ROUND_SEEDS=<n>` runs seeds 0 to n − 1 in place of the fixed ones, and
//! `SCOPE_ROUNDS=<n>` that many rounds a seed: `cargo xtask stress` runs thousands.
//!
//! # Why this shape
//!
//! Every rank's thread draws the whole round, every rank's part, from the same seed. Each keeps the
//! whole oracle. So a rank needs no message from another to know what its reads must return. The
//! ranks run as a runtime's would, each on its own thread, meeting only inside the collectives.
//! Buffers are whole parts (no sub-ranges), so staleness is per buffer, not per word. The words are
//! random over all of `u32`. So sums and products wrap, and `i32`'s order differs from `u32`'s. A
//! transport that computes in another width or sign is caught.
//!
//! `SCOPE_PROPERTY_SEED=<seed>` runs one seed alone, as for [`random_sequences`]. A failing round
//! prints the seed and the rounds before it.

//!
//! The rounds are drawn in `draw`, kept in `oracle` and played against a group in `play`;
//! `changes` holds the membership changes between them.

mod changes;
mod draw;
mod oracle;
mod parts;
mod play;

use self::changes::Handoff;
use self::play::*;
use super::across::each_of_ranks_alone;
use super::collective::{DEFAULT_WAIT, group_of};
use super::*;
use scope_core::collective::device::DeviceCollectives;

/// The seeds every suite runs. The group's size is one more than the seed's remainder by four
/// ([`ranks_for`]). So these are four, three, two, one and four ranks.
pub const ROUND_SEEDS: [u64; 5] = [3, 6, 9, 12, 0x0dd_ba13];

/// How many ranks seed `seed` plays: one to four, and no more than the suite has devices. See
/// [`Suite::devices`]: on a machine with one GPU, every seed plays one rank.
pub fn ranks_for<S: Suite>(seed: u64) -> usize {
    (1 + (seed % 4) as usize).min(S::devices().max(1))
}

/// Rounds per seed: a tenth of a second a seed on the host server, under a second on lavapipe.
pub const ROUNDS: usize = 100;

pub use self::play::IN_FLIGHT;

/// `rounds` random rounds per seed of `seeds` on a group of the suite's ranks.
/// `SCOPE_PROPERTY_SEED` replaces the seeds with one. Each rank holds its buffers to the oracle
/// after every round.
///
/// # Panics
///
/// When a rank's call or read disagrees with the oracle, the group breaks, or the books do not add
/// up. It prints the seed and the rounds so far first.
pub fn random_rounds<S: Suite>(seeds: &[u64], rounds: usize) {
    let rounds = rounds_or_asked(rounds);
    for seed in seeds_or_the_one_asked(seeds) {
        let Some(group) = group_of::<S>(ranks_for::<S>(seed), DEFAULT_WAIT) else {
            return;
        };
        let over_device = group.is_over_device();
        let tallies = group.run(|rank| play(rank, seed, rounds, over_device, None));
        report("", seed, rounds, &tallies);
    }
}

/// [`random_rounds`] with events between rounds, for a suite whose devices recover
/// ([`Client::recover`]). A rank's device is lost and recovered in place. Every rank shrinks to a
/// new epoch. A rank is lost, shrunk away, recovered and admitted back (`rounds/changes.rs`).
///
/// # Panics
///
/// As [`random_rounds`]; when a change or a recovery fails.
pub fn random_rounds_with_changes<S: Suite>(seeds: &[u64], rounds: usize) {
    let rounds = rounds_or_asked(rounds);
    for seed in seeds_or_the_one_asked(seeds) {
        let Some(group) = group_of::<S>(ranks_for::<S>(seed), DEFAULT_WAIT) else {
            return;
        };
        let over_device = group.is_over_device();
        let handoff = Handoff::new();
        let tallies = group.run(|rank| play(rank, seed, rounds, over_device, Some(&handoff)));
        report(" with losses and changes", seed, rounds, &tallies);
    }
}

/// [`random_rounds`] on ranks that each joined alone, from the identity ([`Rank::join`](scope_core::collective::Rank::join)). Ranks in
/// separate processes do the same. Every decision is a ballot through the device transport.
///
/// # Panics
///
/// As [`random_rounds`]; when a rank does not join.
pub fn random_rounds_joined<S: Suite>(seeds: &[u64], rounds: usize)
where
    S::Backend: DeviceCollectives,
{
    let rounds = rounds_or_asked(rounds);
    for seed in seeds_or_the_one_asked(seeds) {
        let Some(tallies) =
            each_of_ranks_alone::<S, _>(ranks_for::<S>(seed), DEFAULT_WAIT, |rank| {
                play(rank, seed, rounds, true, None)
            })
        else {
            return;
        };
        report(" joined alone", seed, rounds, &tallies);
    }
}

/// `seeds`, or the one `SCOPE_PROPERTY_SEED` names, or `0..n` for `SCOPE_ROUND_SEEDS=n`.
fn seeds_or_the_one_asked(seeds: &[u64]) -> Vec<u64> {
    if let Some(seed) = property::env_seed() {
        return vec![seed];
    }
    property::env_number("SCOPE_ROUND_SEEDS").map_or_else(|| seeds.to_vec(), |n| (0..n).collect())
}

/// `rounds`, or the number `SCOPE_ROUNDS` names.
fn rounds_or_asked(rounds: usize) -> usize {
    property::env_number("SCOPE_ROUNDS").map_or(rounds, |n| n as usize)
}

fn report(how: &str, seed: u64, rounds: usize, tallies: &[Tally]) {
    let [
        recorded,
        ok,
        failed,
        refused,
        lost,
        reformed,
        rotated,
        in_flight,
        _,
        issues,
        twice,
    ] = tallies[0];
    let words: usize = tallies.iter().map(|t| t[8]).sum();
    let events = if lost + reformed + rotated + issues > 0 {
        format!(
            "; {lost} devices lost and recovered in place, {reformed} shrinks of every rank, \
             {rotated} ranks lost, shrunk away and admitted back, {issues} library calls failed \
             ({twice} on two ranks at once)"
        )
    } else {
        String::new()
    };
    println!(
        "random rounds: seed {seed}, {rounds} rounds on {} rank(s){how}; rank 0's calls: {ok} ran, \
         {failed} failed on an input, {refused} refused; {recorded} rounds recorded and replayed\
         {events}; at most {in_flight} rounds in flight at a read; {words} words read, as the oracle \
         said",
        tallies.len()
    );
}

/// Random rounds of every collective hold to the oracle on every rank (rules 41, 44, 45, 48).
/// Failed, healed and copied buffers come between them. [`ROUND_SEEDS`], [`ROUNDS`] each.
pub fn random_rounds_of_collectives_match_the_oracle<S: Suite>() {
    random_rounds::<S>(&ROUND_SEEDS, ROUNDS);
}

/// [`random_rounds_of_collectives_match_the_oracle`] with devices lost and recovered between
/// rounds. The group is shrunk and grown too (rules 41, 44, 51, 54–57). Every rank's buffers are
/// held to the oracle throughout. [`ROUND_SEEDS`], [`ROUNDS`] each.
pub fn random_rounds_with_losses_and_changes_match_the_oracle<S: Suite>() {
    random_rounds_with_changes::<S>(&ROUND_SEEDS, ROUNDS);
}

/// [`random_rounds_of_collectives_match_the_oracle`] on ranks that each joined alone. They decide
/// by ballot (rules 41, 44, 48, 49, 50).
pub fn random_rounds_of_ranks_joined_alone_match_the_oracle<S: Suite>()
where
    S::Backend: DeviceCollectives,
{
    random_rounds_joined::<S>(&ROUND_SEEDS, ROUNDS);
}

/// The random rounds: one `#[test]` each for `$suite`, with what each needs.
#[macro_export]
macro_rules! rounds_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, rounds::random_rounds_of_collectives_match_the_oracle }
        $crate::behaviour! { joined $suite, rounds::random_rounds_of_ranks_joined_alone_match_the_oracle }
        $crate::behaviour! { $suite, rounds::random_rounds_with_losses_and_changes_match_the_oracle, Reopen }
    };
}
