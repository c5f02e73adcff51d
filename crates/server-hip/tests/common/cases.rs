//! Device tests of the HIP server through the `Client` API, shared by the
//! tests on a real device (`device.rs`) and on the mock runtime (`mock.rs`):
//! chunked staging, recorded host bytes, pool reuse, cross-stream order,
//! hiprtc's log.

use super::{scalars, words};
use scope_core::{Binding, Client, Dispatch, Error};
use server_hip::Hip;

fn groups(n: u32) -> Dispatch<'static> {
    Dispatch::linear(n.div_ceil(64))
}

/// A write longer than one staging buffer goes through in chunks, and a
/// read of it comes back whole, at an offset that is not chunk-aligned.
pub fn large_writes_and_reads_cross_staging_chunks(c: &Client<Hip>) {
    let len = 40 << 20;
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let buffer = c.upload(&data).unwrap();
    assert_eq!(c.read(&buffer).unwrap(), data);
    let slice = c.read(buffer.slice(4096..(len as u64 - 4096))).unwrap();
    assert_eq!(slice, data[4096..len - 4096]);
}

/// The rule every server keeps: a host write inside a capture is recorded
/// with the bytes given at call time, and every replay writes those bytes.
pub fn recorded_host_writes_replay_the_bytes_given_at_call_time(c: &Client<Hip>) {
    let n = 1024u32;
    let buffer = c.allocate(u64::from(n) * 4).unwrap();
    let mut recorded = scalars(&(0..n).collect::<Vec<_>>());
    let capture = c.begin_capture().unwrap();
    c.write(&buffer, &recorded).unwrap();
    // Changing the caller's bytes after the call changes nothing recorded.
    recorded.fill(0xAB);
    let graph = c.end_capture(capture).unwrap();
    for round in 0..3 {
        c.write(&buffer, &scalars(&vec![7; n as usize])).unwrap();
        c.replay(&graph).unwrap();
        assert_eq!(
            words(&c.read(&buffer).unwrap()),
            (0..n).collect::<Vec<_>>(),
            "replay {round}"
        );
    }
    c.destroy_graph(&graph).unwrap();
    assert!(
        c.replay(&graph).is_err(),
        "a destroyed graph does not replay"
    );
}

/// A captured launch and copy replay; the graph sees the buffers' current
/// contents at each replay.
pub fn captured_kernels_replay_on_current_inputs(c: &Client<Hip>) {
    let n = 300u32;
    let a = c.upload(&scalars(&vec![1; n as usize])).unwrap();
    let b = c.upload(&scalars(&vec![2; n as usize])).unwrap();
    let out = c.allocate(u64::from(n) * 4).unwrap();
    let copied = c.allocate(u64::from(n) * 4).unwrap();
    let capture = c.begin_capture().unwrap();
    c.launch(
        &super::add(),
        &[Binding::read(&a), Binding::read(&b), Binding::write(&out)],
        &scalars(&[n]),
        groups(n),
    )
    .unwrap();
    c.copy(&out, &copied).unwrap();
    let graph = c.end_capture(capture).unwrap();
    c.replay(&graph).unwrap();
    assert_eq!(words(&c.read(&copied).unwrap()), vec![3; n as usize]);
    c.write(&a, &scalars(&vec![10; n as usize])).unwrap();
    c.replay(&graph).unwrap();
    assert_eq!(words(&c.read(&copied).unwrap()), vec![12; n as usize]);
    c.destroy_graph(&graph).unwrap();
}

/// HIP has no indirect launch: inside a capture it fails and dooms the
/// window; outside, the counts are read back and the launch runs.
pub fn indirect_dispatch_inside_a_capture_dooms_it(c: &Client<Hip>) {
    let out = c.allocate(256).unwrap();
    let counts = c.upload(&scalars(&[1, 1, 1])).unwrap();
    let capture = c.begin_capture().unwrap();
    let launched = c.launch(
        &super::fill(),
        &[Binding::write(&out)],
        &scalars(&[64, 9]),
        Dispatch::Indirect(counts.all()),
    );
    assert!(
        matches!(launched, Err(Error::Launch { .. })),
        "{launched:?}"
    );
    let sealed = c.end_capture(capture);
    assert!(matches!(sealed, Err(Error::Unsealed { .. })), "{sealed:?}");
    // The failed launch claimed `out`, and an indirect launch heals nothing
    // (its count is on the device), so rewrite it first.
    c.write(&out, &scalars(&[0; 64])).unwrap();
    c.launch(
        &super::fill(),
        &[Binding::write(&out)],
        &scalars(&[64, 9]),
        Dispatch::Indirect(counts.all()),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![9; 64]);
}

/// Freed blocks come back from the pool once the device is done with them:
/// a loop of allocate and free holds one block, not one per round.
pub fn freed_memory_is_reused(c: &Client<Hip>) {
    let size = 3 << 20;
    for _ in 0..4 {
        let buffer = c.upload(&vec![1u8; size]).unwrap();
        c.free(&buffer).unwrap();
    }
    c.sync().unwrap();
    let before = c.bytes_reserved();
    for _ in 0..16 {
        let buffer = c.upload(&vec![2u8; size]).unwrap();
        assert_eq!(c.read(buffer.slice(0..4)).unwrap(), vec![2; 4]);
        c.free(&buffer).unwrap();
        c.sync().unwrap();
    }
    assert_eq!(
        c.bytes_reserved(),
        before,
        "the pool grew while reusing one size"
    );
}

/// Work on two streams that share a buffer is ordered by events: the second
/// stream's copy sees the first stream's fill.
pub fn streams_sharing_a_buffer_are_ordered(c: &Client<Hip>) {
    let other = c.new_stream().unwrap();
    let n = 1 << 20;
    let a = c.allocate(u64::from(n) * 4).unwrap();
    let b = c.allocate(u64::from(n) * 4).unwrap();
    for value in 1..=4u32 {
        c.launch(
            &super::fill(),
            &[Binding::write(&a)],
            &scalars(&[n, value]),
            groups(n),
        )
        .unwrap();
        other
            .launch(
                &super::copy(),
                &[Binding::read(&a), Binding::write(&b)],
                &scalars(&[n]),
                groups(n),
            )
            .unwrap();
        let got = words(&other.read(b.slice(0..(u64::from(n) * 4))).unwrap());
        assert!(got.iter().all(|&w| w == value), "round {value}");
    }
}

/// hiprtc's log reaches the error, naming what it could not compile.
pub fn compile_errors_carry_the_hiprtc_log(c: &Client<Hip>) {
    let error = c.compile(&super::broken()).unwrap_err();
    let Error::Compile { backend, log, .. } = &error else {
        panic!("expected a compile error, got {error}");
    };
    assert_eq!(*backend, "hip");
    assert!(log.contains("this_name_is_not_declared_anywhere"), "{log}");
    let wrong_entry = super::fill().entry("not_the_entry_point");
    assert!(matches!(
        c.compile(&wrong_entry),
        Err(Error::Compile { .. })
    ));
    let wgsl = scope_core::Kernel::wgsl("w", "@compute @workgroup_size(1) fn main() {}");
    assert!(matches!(c.compile(&wgsl), Err(Error::Compile { .. })));
}
