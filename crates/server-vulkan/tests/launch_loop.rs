//! A loop that only launches runs in bounded memory: the batches it submits
//! are recycled as they complete, so neither the process's resident size nor
//! the batches in flight grow with the number of launches.
//!
//! Its own test binary, so that no other test's allocations move the
//! process's resident size while it is measured.

mod common;

use common::{bytes, copy, words};
use scope_core::{Binding, Dispatch};

/// Resident set size in KiB (Linux), or `None` where `/proc` is absent.
fn rss_kib() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4)
}

/// 200,000 launches over two ping-pong buffers with no sync: before the
/// stream recycled completed submissions this held every batch's command
/// buffers and staging chunks until the next sync (+183 MiB resident over
/// the loop on lavapipe). Now the submissions in flight, the bytes reserved
/// and the resident size stay flat.
#[test]
fn a_loop_that_only_launches_runs_in_bounded_memory() {
    let Some(c) = common::validating_or_skip() else {
        return;
    };
    let n = 64u32;
    let a = c.upload(&bytes(&vec![1; n as usize])).unwrap();
    let b = c.try_allocate(u64::from(n) * 4).unwrap();
    let kernel = copy();
    let params = bytes(&[n]);
    c.sync().unwrap();
    let launches = 200_000u32;
    let mut most_in_flight = 0;
    let mut warm = None;
    let reserved = c.bytes_reserved();
    for i in 0..launches {
        let (src, dst) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        c.launch(
            &kernel,
            &[Binding::read(src), Binding::write(dst)],
            &params,
            Dispatch::linear(1),
        )
        .unwrap();
        if i % 1000 == 0 {
            most_in_flight = most_in_flight.max(c.with_backend(|v| v.batches_in_flight()));
            assert_eq!(c.bytes_reserved(), reserved, "launch {i}");
        }
        if i == 20_000 {
            warm = rss_kib();
        }
    }
    let end = rss_kib();
    assert!(
        most_in_flight <= 8,
        "{most_in_flight} submissions were in flight at once"
    );
    if let (Some(warm), Some(end)) = (warm, end) {
        eprintln!("resident: {warm} KiB after 20,000 launches, {end} KiB after {launches}");
        assert!(
            end < warm + 32 * 1024,
            "resident size grew from {warm} KiB to {end} KiB over the loop"
        );
    }
    c.sync().unwrap();
    assert_eq!(words(&c.read(&a).unwrap()), vec![1; n as usize]);
    assert_eq!(words(&c.read(&b).unwrap()), vec![1; n as usize]);
}
