//! The CUDA server against a mock CUDA driver and NVRTC
//! (`tests/mock/mock_cuda.c`, `mock_nvrtc.c`; loading in
//! `tests/mock/harness.rs`).
//!
//! The mock is not CUDA — "device" memory is host memory and work runs
//! when it is issued — so these tests say nothing about NVIDIA hardware or
//! the real driver's timing. What they do run is the server's Rust, on its
//! success and failure paths: cudarc's loading and context handling, the
//! pool's struct layout and attributes, pinned staging, events, capture
//! and replay, NVRTC's options and log, the JIT's log, the launch
//! parameter convention and its check against `cuFuncGetParamInfo`, and a
//! real (not injected) out-of-memory. The mock also refuses what real CUDA
//! refuses or mis-handles (the list heads `mock_cuda.c`), and every test
//! here ends by asserting it refused nothing. The sticky fault is in
//! `mock_poison.rs`: it corrupts the process's one mock context.

mod common;
#[path = "mock/harness.rs"]
mod harness;

use common::{ACCUMULATE, ADD, COPY, FILL, bytes, kernel, words};
use harness::{client, mock};
use scope_core::conformance::Suite;
use scope_core::{Binding, Client, Dispatch, Error, Kernel, Result};
use server_cuda::Cuda;

struct MockSuite;

impl Suite for MockSuite {
    type Backend = Cuda;

    fn client() -> Result<Client<Cuda>> {
        let client = harness::mock_client();
        mock().assert_clean();
        client
    }

    fn fill() -> Kernel {
        kernel("fill", FILL)
    }

    fn copy() -> Kernel {
        kernel("copy", COPY)
    }

    fn add() -> Kernel {
        kernel("add", ADD)
    }

    fn broken() -> Kernel {
        kernel(
            "broken",
            r#"extern "C" __global__ void broken(unsigned int* out) { out[0] = this_is_not_declared; }"#,
        )
    }

    /// The mock's whole memory (1 GiB), of which its context holds some.
    fn oversized() -> Option<u64> {
        Some(1 << 30)
    }
}

mod conformance {
    scope_core::conformance_tests!(super::MockSuite);
}

/// The property test (`scope_core::conformance::property`) against the
/// mock: random sequences of allocations, writes, launches, copies, reads
/// and capture windows with injected failures, against the per-word oracle;
/// then the mock must have refused nothing. `SCOPE_PROPERTY_STEPS` and
/// `SCOPE_PROPERTY_SEED` change its size.
#[test]
fn random_sequences() {
    scope_core::conformance::random_sequences::<MockSuite>(
        &scope_core::conformance::property::SEEDS,
        2_500,
    );
    mock().assert_clean();
}

fn groups(n: u32) -> Dispatch<'static> {
    Dispatch::linear(n.div_ceil(64))
}

#[test]
fn the_mock_device_is_described_and_nvrtc_targets_its_arch() {
    let c = client();
    let description = c.describe();
    assert!(
        description.starts_with(
            "Mock H200 (scope test double) #0 (sm_90, 1.0 GiB, driver CUDA 13.0, NVRTC → compute_90)"
        ),
        "{description}"
    );
    assert_eq!(server_cuda::total_memory(0).unwrap(), 1 << 30);
    let probe = server_cuda::probe();
    assert!(probe.has_device(), "{probe:?}");
    assert!(c.with_backend(|b| b.has_nvrtc()));
    mock().assert_clean();
}

/// NVRTC's log reaches the error, in NVRTC's words, naming the file and
/// line; a missing entry point and a foreign language are compile errors
/// too.
#[test]
fn compile_errors_carry_the_nvrtc_log() {
    let c = client();
    let error = c.compile(&MockSuite::broken()).unwrap_err();
    let Error::Compile { backend, log, .. } = &error else {
        panic!("expected a compile error, got {error}");
    };
    assert_eq!(*backend, "cuda");
    assert!(
        log.contains(
            r#"scope_kernel.cu(1): error: identifier "this_is_not_declared" is undefined"#
        ),
        "{log}"
    );
    assert!(log.contains("NVRTC_ERROR_COMPILATION"), "{log}");
    assert!(log.contains("--gpu-architecture=compute_90"), "{log}");
    let wrong_entry = kernel("fill", FILL).entry("not_the_entry_point");
    let missing = c.compile(&wrong_entry).unwrap_err();
    assert!(
        matches!(&missing, Error::Compile { log, .. } if log.contains("no kernel named `not_the_entry_point`")),
        "{missing}"
    );
    let wgsl = Kernel::wgsl("w", "@compute @workgroup_size(1) fn main() {}");
    assert!(matches!(c.compile(&wgsl), Err(Error::Compile { .. })));
    mock().assert_clean();
}

/// PTX goes straight to the JIT: the mock's own PTX loads and runs, and a
/// PTX the JIT rejects is a compile error carrying the JIT's log from
/// `CU_JIT_ERROR_LOG_BUFFER`.
#[test]
fn ptx_loads_and_a_rejected_ptx_carries_the_jit_log() {
    let c = client();
    let ptx = ".version 9.0\n.target sm_90\n.address_size 64\n.scope_mock_entry seven fill 8 8\n";
    let out = c.allocate(256).unwrap();
    c.launch(
        &Kernel::ptx("seven", ptx).block([64, 1, 1]),
        &[Binding::write(&out)],
        &bytes(&[64, 7]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![7; 64]);
    let bad = Kernel::ptx(
        "bad",
        ".version 7.0\n.target sm_70\n.visible .entry bad() { not_an_instruction; }",
    );
    let error = c.compile(&bad).unwrap_err();
    let Error::Compile { log, .. } = &error else {
        panic!("expected a compile error, got {error}");
    };
    assert!(
        log.contains("ptxas application ptx input, line 3"),
        "the JIT's log: {log}"
    );
    assert!(log.contains("CUDA_ERROR_INVALID_PTX"), "{log}");
    mock().assert_clean();
}

/// The kernel's own parameter list (`cuFuncGetParamInfo`) is checked at
/// launch: a blob of the wrong size, or the wrong number of bindings, is
/// refused before anything runs, and the outputs carry the refusal.
#[test]
fn a_launch_that_does_not_match_the_kernel_signature_is_refused_before_it_runs() {
    let c = client();
    let out = c.upload(&bytes(&[3; 64])).unwrap();
    let other = c.upload(&bytes(&[4; 64])).unwrap();
    // `fill` takes a pointer and an 8-byte struct; pass a 4-byte blob.
    let short = c
        .launch(
            &kernel("fill", FILL),
            &[Binding::write(&out)],
            &64u32.to_le_bytes(),
            Dispatch::linear(1),
        )
        .unwrap_err();
    assert!(
        matches!(&short, Error::Launch { detail, .. } if detail.contains("the scalar parameter is 8 bytes; the blob is 4")),
        "{short}"
    );
    // `copy` takes two pointers and a blob; pass one binding.
    let few = c
        .launch(
            &kernel("copy", COPY),
            &[Binding::write(&other)],
            &64u32.to_le_bytes(),
            Dispatch::linear(1),
        )
        .unwrap_err();
    assert!(
        matches!(&few, Error::Launch { detail, .. } if detail.contains("the kernel takes 3 parameters")),
        "{few}"
    );
    assert!(
        c.read(&out).is_err(),
        "the refused launch claims its output"
    );
    // Nothing ran: the bytes under the claims are the uploaded ones.
    assert_eq!(words(&c.peek(&out).unwrap()), vec![3; 64]);
    assert_eq!(words(&c.peek(&other).unwrap()), vec![4; 64]);
    assert!(c.poison().is_none());
    mock().assert_clean();
}

/// A real out-of-memory from the driver is not sticky: the device keeps
/// working. Memory cached by the pool is what the core's trim-and-retry
/// gives back: an allocation that fits only once the cache is released
/// succeeds.
#[test]
fn out_of_memory_is_not_sticky_and_trimming_makes_room() {
    let c = client();
    let big = c.try_allocate(600 << 20).unwrap();
    let refused = c.try_allocate(600 << 20).unwrap_err();
    assert!(
        refused.is_out_of_memory() && !refused.is_sticky(),
        "{refused}"
    );
    assert!(c.poison().is_none());
    let fine = c.upload(&bytes(&[5; 64])).unwrap();
    assert_eq!(words(&c.read(&fine).unwrap()), vec![5; 64]);
    // Freed, the 600 MiB stay cached in the pool.
    c.free(&big).unwrap();
    c.sync().unwrap();
    assert!(c.bytes_reserved() >= 600 << 20, "{}", c.bytes_reserved());
    // 700 MiB do not fit beside the cache and cannot reuse it: the first
    // attempt runs out, the core trims the pool and the retry succeeds.
    let bigger = c.try_allocate(700 << 20).unwrap();
    assert!(
        c.bytes_reserved() < 800 << 20,
        "the cache was released: {}",
        c.bytes_reserved()
    );
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&bigger)],
        &bytes(&[64, 6]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(words(&c.read(bigger.slice(0..256)).unwrap()), vec![6; 64]);
    mock().assert_clean();
}

/// The pool reuses a freed block once the free has completed, and `trim`
/// gives every cached block back.
#[test]
fn freed_memory_is_reused_and_trimming_returns_it() {
    let c = client();
    let size = 3 << 20;
    let first = c.upload(&vec![1u8; size]).unwrap();
    c.free(&first).unwrap();
    c.sync().unwrap();
    let cached = c.bytes_reserved();
    assert!(cached >= size as u64, "{cached}");
    for round in 0..16u8 {
        let buffer = c.upload(&vec![round; size]).unwrap();
        assert_eq!(c.read(buffer.slice(0..4)).unwrap(), vec![round; 4]);
        c.free(&buffer).unwrap();
        c.sync().unwrap();
    }
    assert_eq!(
        c.bytes_reserved(),
        cached,
        "the pool grew while reusing one size"
    );
    c.with_backend(scope_core::Backend::trim);
    assert_eq!(c.bytes_reserved(), 0);
    mock().assert_clean();
}

/// Writes past one staging chunk go straight from the caller's memory;
/// thousands of small writes cycle the pinned belt, waiting for the oldest
/// chunk when the belt is full.
#[test]
fn large_and_many_small_writes_round_trip() {
    let c = client();
    let data: Vec<u8> = (0..(3u32 << 20) + 12).map(|i| (i * 7 + 1) as u8).collect();
    let buffer = c.upload(&data).unwrap();
    assert_eq!(c.read(&buffer).unwrap(), data);
    assert_eq!(c.read(buffer.slice(4096..8192)).unwrap(), data[4096..8192]);
    let small = c.allocate(4096 * 64).unwrap();
    for i in 0..4096u32 {
        let at = u64::from(i) * 64;
        c.write(small.slice(at..at + 64), &[(i % 251) as u8; 64])
            .unwrap();
    }
    let back = c.read(&small).unwrap();
    for i in 0..4096usize {
        assert!(
            back[i * 64..i * 64 + 64]
                .iter()
                .all(|&b| b == (i % 251) as u8),
            "write {i}"
        );
    }
    mock().assert_clean();
}

/// A host write inside a window is recorded from a pinned copy of the
/// caller's bytes: every replay writes the bytes given at call time, and
/// the capture never copies from pageable memory (the mock would refuse).
#[test]
fn recorded_host_writes_replay_the_bytes_given_at_call_time() {
    let c = client();
    // Past the staging chunk too: the pageable path must not be captured.
    for n in [1024u32, (2 << 20) / 4 + 5] {
        let buffer = c.allocate(u64::from(n) * 4).unwrap();
        let mut recorded = bytes(&(0..n).collect::<Vec<_>>());
        let capture = c.begin_capture().unwrap();
        c.write(&buffer, &recorded).unwrap();
        recorded.fill(0xAB);
        let graph = c.end_capture(capture).unwrap();
        for round in 0..3 {
            c.write(&buffer, &bytes(&vec![7; n as usize])).unwrap();
            c.replay(&graph).unwrap();
            assert_eq!(
                words(&c.read(&buffer).unwrap()),
                (0..n).collect::<Vec<_>>(),
                "{n} words, replay {round}"
            );
        }
        c.destroy_graph(&graph).unwrap();
    }
    mock().assert_clean();
}

/// A buffer freed while the last work on it is being captured is freed
/// after the capture ends, not inside it (a free node in the graph).
#[test]
fn a_free_while_the_last_user_is_capturing_waits_for_the_end() {
    let c = client();
    let keep = c.allocate(256).unwrap();
    let doomed = c.allocate(1 << 20).unwrap();
    c.write(doomed.slice(0..16), &[1; 16]).unwrap();
    c.sync().unwrap();
    let capture = c.begin_capture().unwrap();
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&doomed)],
        &bytes(&[64, 2]),
        Dispatch::linear(1),
    )
    .unwrap();
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&keep)],
        &bytes(&[64, 3]),
        Dispatch::linear(1),
    )
    .unwrap();
    c.free(&doomed).unwrap();
    let deferred = c.bytes_reserved();
    assert!(deferred >= 1 << 20);
    mock().assert_clean();
    let graph = c.end_capture(capture).unwrap();
    // The graph wrote a freed buffer: the core refuses to replay it.
    assert!(c.replay(&graph).is_err());
    c.destroy_graph(&graph).unwrap();
    c.sync().unwrap();
    // The deferred free went out at the end of the capture: the block is
    // back in the pool and is reused.
    let again = c.allocate(1 << 20).unwrap();
    c.write(again.slice(0..16), &[9; 16]).unwrap();
    assert_eq!(c.read(again.slice(0..16)).unwrap(), vec![9; 16]);
    assert_eq!(c.bytes_reserved(), deferred);
    mock().assert_clean();
}

/// Destroying a graph waits on the host for its replays (rule 35): the
/// replay's stream has nothing outstanding when the graph goes.
#[test]
fn destroying_a_graph_waits_for_its_replays() {
    let c = client();
    let out = c.allocate(256).unwrap();
    let capture = c.begin_capture().unwrap();
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&out)],
        &bytes(&[64, 4]),
        Dispatch::linear(1),
    )
    .unwrap();
    let graph = c.end_capture(capture).unwrap();
    let stream = harness::raw_stream(&c, 0);
    c.replay(&graph).unwrap();
    assert!(
        mock().pending(stream) > 0,
        "the replay is not waited for yet"
    );
    let before = mock().graphs_destroyed_in_flight();
    c.destroy_graph(&graph).unwrap();
    assert_eq!(mock().pending(stream), 0, "destroy waited for the replay");
    assert_eq!(mock().graphs_destroyed_in_flight(), before);
    assert_eq!(words(&c.read(&out).unwrap()), vec![4; 64]);
    mock().assert_clean();
}

/// Two streams that share a buffer are ordered through events; a stream
/// that captures is ordered after the other by a host wait instead (a
/// capturing stream may not wait on outside work).
#[test]
fn streams_sharing_a_buffer_are_ordered_even_while_one_captures() {
    let c = client();
    let other = c.new_stream().unwrap();
    let n = 1 << 16;
    let a = c.allocate(u64::from(n) * 4).unwrap();
    let b = c.allocate(u64::from(n) * 4).unwrap();
    for value in 1..=4u32 {
        c.launch(
            &kernel("fill", FILL),
            &[Binding::write(&a)],
            &bytes(&[n, value]),
            groups(n),
        )
        .unwrap();
        other
            .launch(
                &kernel("copy", COPY),
                &[Binding::read(&a), Binding::write(&b)],
                &bytes(&[n]),
                groups(n),
            )
            .unwrap();
        let got = words(&c.read(&b).unwrap());
        assert!(got.iter().all(|&w| w == value), "round {value}");
    }
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&a)],
        &bytes(&[n, 11]),
        groups(n),
    )
    .unwrap();
    let capture = other.begin_capture().unwrap();
    other
        .launch(
            &kernel("copy", COPY),
            &[Binding::read(&a), Binding::write(&b)],
            &bytes(&[n]),
            groups(n),
        )
        .unwrap();
    let graph = other.end_capture(capture).unwrap();
    other.replay(&graph).unwrap();
    assert!(words(&c.read(&b).unwrap()).iter().all(|&w| w == 11));
    mock().assert_clean();
}

/// A window replayed a thousand times accumulates a thousand times and
/// rewrites its recorded bytes each time.
#[test]
fn a_window_replayed_a_thousand_times_writes_its_recorded_bytes_each_time() {
    let c = client();
    const N: u32 = 1024;
    let by = c.allocate(u64::from(N) * 4).unwrap();
    let acc = c.upload(&bytes(&vec![0; N as usize])).unwrap();
    let step: Vec<u32> = (0..N).map(|i| i % 7 + 1).collect();
    let capture = c.begin_capture().unwrap();
    c.write(&by, &bytes(&step)).unwrap();
    c.launch(
        &kernel("accumulate", ACCUMULATE),
        &[Binding::read(&by), Binding::read_write(&acc)],
        &N.to_le_bytes(),
        groups(N),
    )
    .unwrap();
    let graph = c.end_capture(capture).unwrap();
    assert_eq!(words(&c.read(&acc).unwrap()), vec![0; N as usize]);
    c.write(&by, &bytes(&vec![1000; N as usize])).unwrap();
    for _ in 0..1000 {
        c.replay(&graph).unwrap();
    }
    let expected: Vec<u32> = step.iter().map(|s| s * 1000).collect();
    assert_eq!(words(&c.read(&acc).unwrap()), expected);
    assert_eq!(words(&c.read(&by).unwrap()), step);
    c.destroy_graph(&graph).unwrap();
    assert_eq!(c.failures_held(), 0);
    mock().assert_clean();
}

/// A capture the driver invalidates yields no graph: the end of capture
/// reports `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, and the window's
/// outputs carry it (rule 33). The stream keeps working.
#[test]
fn a_capture_invalidated_by_the_driver_claims_the_window_outputs() {
    let c = client();
    let out = c.allocate(256).unwrap();
    let capture = c.begin_capture().unwrap();
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&out)],
        &bytes(&[64, 8]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert!(mock().invalidate_capture(harness::raw_stream(&c, 0)));
    let sealed = c.end_capture(capture).unwrap_err();
    assert!(
        sealed
            .to_string()
            .contains("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"),
        "{sealed}"
    );
    let report = c.read(&out).unwrap_err();
    assert!(
        report
            .to_string()
            .contains("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"),
        "{report}"
    );
    assert!(c.poison().is_none());
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&out)],
        &bytes(&[64, 9]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![9; 64]);
    mock().assert_clean();
}

/// CUDA has no indirect launch: inside a window it is refused and dooms
/// the window; outside, the counts are read back and the launch runs.
#[test]
fn indirect_dispatch_is_refused_inside_a_window_and_runs_outside() {
    let c = client();
    let out = c.allocate(256).unwrap();
    let counts = c.upload(&bytes(&[1, 1, 1])).unwrap();
    let capture = c.begin_capture().unwrap();
    let refused = c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&out)],
        &bytes(&[64, 1]),
        Dispatch::Indirect(counts.all()),
    );
    assert!(
        matches!(&refused, Err(Error::Launch { detail, .. }) if detail.contains("indirect")),
        "{refused:?}"
    );
    let sealed = c.end_capture(capture);
    assert!(matches!(sealed, Err(Error::Unsealed { .. })), "{sealed:?}");
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&out)],
        &bytes(&[64, 5]),
        Dispatch::Indirect(counts.all()),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![5; 64]);
    mock().assert_clean();
}
