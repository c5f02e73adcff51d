//! Rounds in flight over a device transport (rule 47): a round returns
//! once issued, drains no stream, and leaves every byte right however the
//! caller goes on — more rounds, frees, reads from another stream.

use std::time::{Duration, Instant};

use super::collective::{DEFAULT_WAIT, PART, RANKS, group};
use super::*;
use scope_core::collective::{Element, Group, Reduce};

/// Rounds issued back to back without a read or a sync.
const ROUNDS: usize = 1_000;

/// Every part of `group`'s rounds landed, as the watchdog saw it, within
/// a second of every output having been read.
fn every_part_lands<B: Backend>(group: &Group<B>) {
    let until = Instant::now() + Duration::from_secs(5);
    while group.rounds_in_flight() > 0 {
        assert!(
            Instant::now() < until,
            "{} parts still in flight after every output was read",
            group.rounds_in_flight()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A thousand rounds issued without a read or a sync drain no rank's
/// stream, hold no more memory than their buffers, and every output is
/// right at the end; the watchdog's list empties once they completed
/// (rule 47).
pub fn device_rounds_drain_no_stream<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    assert!(group.is_over_device(), "a behaviour of device transports");
    let ranks = RANKS as u32;
    let results = group.run(|rank| {
        let c = rank.client();
        let r = rank.index() as u32;
        let input = upload(c, &vec![r + 1; PART as usize]);
        let output = alloc(c, PART);
        let (drains, bytes) = (c.drains(), c.bytes_allocated());
        for _ in 0..ROUNDS {
            rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
                .unwrap();
        }
        let drained = c.drains() - drains;
        let grew = c.bytes_allocated().saturating_sub(bytes);
        (drained, grew, read(c, &output).unwrap())
    });
    let sum = ranks * (ranks + 1) / 2;
    for (rank, (drained, grew, output)) in results.into_iter().enumerate() {
        assert_eq!(drained, 0, "rank {rank}'s stream was drained by a round");
        assert_eq!(grew, 0, "rank {rank} holds more memory after the rounds");
        assert_eq!(output, vec![sum; PART as usize], "rank {rank}'s output");
    }
    every_part_lands(&group);
}

/// The caller frees a round's input, or its output, while the round may
/// be in flight, then allocates and writes a new buffer: the round's bytes
/// and the new buffer's are both right (rule 47).
pub fn freeing_a_rounds_buffers_in_flight_leaves_every_byte_right<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    let ranks = RANKS as u32;
    let results = group.run(|rank| {
        let c = rank.client();
        let r = rank.index() as u32;
        let input = upload(c, &vec![r + 1; PART as usize]);
        let output = alloc(c, PART);
        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
            .unwrap();
        c.free(&input).unwrap();
        let after_input = upload(c, &vec![7; PART as usize]);
        let reduced = read(c, &output).unwrap();

        let input = upload(c, &vec![r + 1; PART as usize]);
        let output = alloc(c, PART);
        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Max)
            .unwrap();
        c.free(&output).unwrap();
        let after_output = upload(c, &vec![9; PART as usize]);
        (
            reduced,
            read(c, &after_input).unwrap(),
            read(c, &after_output).unwrap(),
            read(c, &input).unwrap(),
        )
    });
    let sum = ranks * (ranks + 1) / 2;
    for (rank, (reduced, after_input, after_output, input)) in results.into_iter().enumerate() {
        assert_eq!(reduced, vec![sum; PART as usize], "rank {rank}'s round");
        assert_eq!(
            after_input,
            vec![7; PART as usize],
            "rank {rank}'s new buffer"
        );
        assert_eq!(
            after_output,
            vec![9; PART as usize],
            "rank {rank}'s new buffer"
        );
        assert_eq!(
            input,
            vec![rank as u32 + 1; PART as usize],
            "rank {rank}'s input is left as it was"
        );
    }
    every_part_lands(&group);
}

/// A round's output read through another stream of the same server waits
/// for the round on the device and reads it right (rules 45, 47).
pub fn a_rounds_output_reads_right_from_another_stream<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    let results = group.run(|rank| {
        let c = rank.client();
        let r = rank.index() as u32;
        let input = upload(c, &vec![r + 1; PART as usize]);
        let output = alloc(c, PART);
        rank.all_gather(input.all(), alloc(c, PART * RANKS as u32).all())
            .unwrap();
        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Max)
            .unwrap();
        let other = c.new_stream().unwrap();
        read(&other, &output).unwrap()
    });
    for (rank, output) in results.into_iter().enumerate() {
        assert_eq!(output, vec![RANKS as u32; PART as usize], "rank {rank}");
    }
}

/// The behaviours of rounds in flight: one `#[test]` each for `$suite`.
#[macro_export]
macro_rules! inflight_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, inflight::device_rounds_drain_no_stream, DeviceCollectives }
        $crate::behaviour! { $suite, inflight::freeing_a_rounds_buffers_in_flight_leaves_every_byte_right, DeviceCollectives }
        $crate::behaviour! { $suite, inflight::a_rounds_output_reads_right_from_another_stream, DeviceCollectives }
    };
}
