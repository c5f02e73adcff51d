//! Behaviours of the CUDA server through the `Client` API, shared by the
//! tests on a real device (`device.rs`) and on the mock driver (`mock.rs`),
//! so the checks the mock has run are exactly the ones a GPU runs: one body
//! each, no copy to drift. What only one side can check stays there (the
//! mock's hooks, real PTX, the mock's exact pool figures).

use super::{ACCUMULATE, ADD, COPY, FILL, WILD, bytes, kernel, words};
use scope_core::{Binding, Client, Dispatch, Error};
use server_cuda::Cuda;

/// `$then!(case, …)` with every case here: the device and mock binaries
/// each make one `#[test]` per case from this one list.
#[allow(unused_macros)] // the binaries that include `common` without running cases
macro_rules! with_every_case {
    ($then:ident) => {
        $then!(
            a_million_element_add_matches_the_cpu,
            a_chain_with_a_failure_in_the_middle_reports_the_root,
            a_window_replayed_a_thousand_times_writes_its_recorded_bytes_each_time,
            indirect_dispatch_is_refused_inside_a_window_and_runs_outside,
            freed_memory_is_reused_by_the_pool,
            large_and_many_small_writes_round_trip,
            streams_sharing_a_buffer_are_ordered_even_while_one_captures,
            a_launch_that_does_not_match_the_kernel_signature_is_refused_before_it_runs,
            recorded_host_writes_replay_the_bytes_given_at_call_time,
            nccl_collectives_and_their_failure_rules_on_every_device,
        );
    };
}

fn groups(n: u32) -> Dispatch<'static> {
    Dispatch::linear(n.div_ceil(64))
}

/// A million-element kernel agrees with the CPU word for word.
pub fn a_million_element_add_matches_the_cpu(c: &Client<Cuda>) {
    const N: u32 = 1 << 20;
    let a: Vec<u32> = (0..N).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let b: Vec<u32> = (0..N).map(|i| u32::MAX - i * 3).collect();
    let expected: Vec<u32> = a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y)).collect();
    let da = c.upload(&bytes(&a)).unwrap();
    let db = c.upload(&bytes(&b)).unwrap();
    let out = c.try_allocate(u64::from(N) * 4).unwrap();
    c.launch(
        &kernel("add", ADD),
        &[Binding::read(&da), Binding::read(&db), Binding::write(&out)],
        &N.to_le_bytes(),
        groups(N),
    )
    .unwrap();
    let got = words(&c.read(&out).unwrap());
    assert_eq!(got.len(), expected.len());
    let wrong = got.iter().zip(&expected).filter(|(g, e)| g != e).count();
    assert_eq!(
        wrong, 0,
        "{wrong} of {N} words differ from the CPU reference"
    );
}

/// The middle step of a chain does not compile: NVRTC's log is the root,
/// the steps after it are skipped and named in the read's chain, the clean
/// side is untouched, and a rewrite heals.
pub fn a_chain_with_a_failure_in_the_middle_reports_the_root(c: &Client<Cuda>) {
    const N: u32 = 4096;
    let a = c.try_allocate(u64::from(N) * 4).unwrap();
    let b = c.try_allocate(u64::from(N) * 4).unwrap();
    let d = c.try_allocate(u64::from(N) * 4).unwrap();
    let e = c.try_allocate(u64::from(N) * 4).unwrap();
    let fill = kernel("fill", FILL);
    c.launch(&fill, &[Binding::write(&a)], &bytes(&[N, 3]), groups(N))
        .unwrap();
    // The middle step does not compile: NVRTC's log names the error.
    let broken = kernel(
        "middle",
        r#"extern "C" __global__ void middle(const unsigned int* a, unsigned int* b) { b[0] = a[0] + undeclared_thing; }"#,
    );
    let error = c
        .launch(
            &broken,
            &[Binding::read(&a), Binding::write(&b)],
            &[],
            groups(N),
        )
        .unwrap_err();
    match &error {
        Error::Compile { log, backend, .. } => {
            assert_eq!(*backend, "cuda");
            assert!(log.contains("undeclared_thing"), "NVRTC's log: {log}");
        }
        other => panic!("expected a compile error, got {other}"),
    }
    // Downstream work is skipped, not run on garbage.
    let copy = kernel("copy", COPY);
    let skipped = c.launch(
        &copy,
        &[Binding::read(&b), Binding::write(&d)],
        &N.to_le_bytes(),
        groups(N),
    );
    assert!(matches!(skipped, Err(Error::Skipped { .. })), "{skipped:?}");
    let skipped = c.launch(
        &kernel("add", ADD),
        &[Binding::read(&d), Binding::read(&a), Binding::write(&e)],
        &N.to_le_bytes(),
        groups(N),
    );
    assert!(matches!(skipped, Err(Error::Skipped { .. })), "{skipped:?}");
    let report = c.read(&e).unwrap_err();
    assert!(matches!(report.root(), Error::Compile { .. }), "{report}");
    let hops = &report.unwritten()[0].chain.hops;
    assert_eq!(hops.len(), 2, "{report}");
    assert_eq!(&*hops[0].kernel, "add");
    assert_eq!(&*hops[1].kernel, "copy");
    // The clean side of the chain is untouched, and a rewrite heals.
    assert_eq!(words(&c.read(&a).unwrap()), vec![3; N as usize]);
    c.launch(&fill, &[Binding::write(&e)], &bytes(&[N, 7]), groups(N))
        .unwrap();
    assert_eq!(words(&c.read(&e).unwrap()), vec![7; N as usize]);
}

/// A window replayed a thousand times accumulates a thousand times and
/// rewrites the bytes its host write was given at call time, every replay.
pub fn a_window_replayed_a_thousand_times_writes_its_recorded_bytes_each_time(c: &Client<Cuda>) {
    const N: u32 = 1024;
    let by = c.try_allocate(u64::from(N) * 4).unwrap();
    let acc = c.upload(&bytes(&vec![0; N as usize])).unwrap();
    let accumulate = kernel("accumulate", ACCUMULATE);
    let step: Vec<u32> = (0..N).map(|i| i % 7 + 1).collect();
    let capture = c.begin_capture().unwrap();
    let mut recorded = bytes(&step);
    c.write(&by, &recorded).unwrap();
    // Changing the caller's bytes after the call changes nothing: the window
    // recorded a copy.
    recorded.fill(0xff);
    c.launch(
        &accumulate,
        &[Binding::read(&by), Binding::read_write(&acc)],
        &N.to_le_bytes(),
        groups(N),
    )
    .unwrap();
    let graph = c.end_capture(capture).unwrap();
    // Nothing in the window has run yet.
    assert_eq!(words(&c.read(&acc).unwrap()), vec![0; N as usize]);
    // Overwrite `by` between recording and replay: each replay rewrites it.
    c.write(&by, &bytes(&vec![1000; N as usize])).unwrap();
    for _ in 0..1000 {
        c.replay(&graph).unwrap();
    }
    let expected: Vec<u32> = step.iter().map(|s| s * 1000).collect();
    assert_eq!(words(&c.read(&acc).unwrap()), expected);
    assert_eq!(words(&c.read(&by).unwrap()), step);
    c.destroy_graph(&graph).unwrap();
    assert_eq!(c.failures_held(), 0);
}

/// CUDA has no indirect launch: inside a window it is refused and dooms
/// the window; outside, the counts are read back and the launch runs.
pub fn indirect_dispatch_is_refused_inside_a_window_and_runs_outside(c: &Client<Cuda>) {
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
    // The refused launch claimed `out`, and an indirect launch heals
    // nothing (its count is on the device), so rewrite it first.
    c.write(&out, &bytes(&[0; 64])).unwrap();
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&out)],
        &bytes(&[64, 5]),
        Dispatch::Indirect(counts.all()),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![5; 64]);
}

/// Freed memory stays cached in the pool and is reused: 32 rounds of
/// allocate/free of one size reserve no more than one more block.
pub fn freed_memory_is_reused_by_the_pool(c: &Client<Cuda>) {
    let size = 64 << 20;
    let first = c.try_allocate(size).unwrap();
    c.write(first.slice(0..16), &[1; 16]).unwrap();
    c.sync().unwrap();
    drop(first);
    c.sync().unwrap();
    let after_one = c.bytes_reserved();
    assert!(
        after_one >= size,
        "the pool caches the freed block: {after_one}"
    );
    for _ in 0..32 {
        let again = c.try_allocate(size).unwrap();
        c.write(again.slice(0..16), &[2; 16]).unwrap();
        drop(again);
        c.sync().unwrap();
    }
    let after_many = c.bytes_reserved();
    assert!(
        after_many <= after_one + size,
        "32 allocate/free rounds reserved {after_many} bytes, from {after_one}: freed memory was not reused"
    );
}

/// Writes past one staging chunk go straight from the caller's memory;
/// thousands of small writes cycle the pinned belt, waiting for the oldest
/// chunk when the belt is full.
pub fn large_and_many_small_writes_round_trip(c: &Client<Cuda>) {
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
}

/// Two streams that share a buffer are ordered through events; a stream
/// that captures is ordered after the other by a host wait instead (a
/// capturing stream may not wait on outside work).
pub fn streams_sharing_a_buffer_are_ordered_even_while_one_captures(c: &Client<Cuda>) {
    let other = c.new_stream().unwrap();
    let n = 1 << 18;
    let a = c.allocate(u64::from(n) * 4).unwrap();
    let b = c.allocate(u64::from(n) * 4).unwrap();
    for value in 1..=20u32 {
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
}

/// The kernel's own parameter list (`cuFuncGetParamInfo`) is checked
/// before the launch's scope opens: a blob of the wrong size, or the wrong
/// number of bindings, is an invalid argument that runs nothing and claims
/// nothing, as every server's own limit checks are.
pub fn a_launch_that_does_not_match_the_kernel_signature_is_refused_before_it_runs(
    c: &Client<Cuda>,
) {
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
        matches!(&short, Error::InvalidArgument { why, .. } if why.contains("the scalar parameter is 8 bytes; the blob is 4")),
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
        matches!(&few, Error::InvalidArgument { why, .. } if why.contains("the kernel takes 3 parameters")),
        "{few}"
    );
    // Nothing ran and nothing is claimed: the uploaded bytes read back.
    assert_eq!(words(&c.read(&out).unwrap()), vec![3; 64]);
    assert_eq!(words(&c.read(&other).unwrap()), vec![4; 64]);
    assert_eq!(c.failures_held(), 0);
    assert!(c.poison().is_none());
}

/// A host write inside a window is recorded from a pinned copy of the
/// caller's bytes: every replay writes the bytes given at call time, and
/// the capture never copies from pageable memory (the mock would refuse).
pub fn recorded_host_writes_replay_the_bytes_given_at_call_time(c: &Client<Cuda>) {
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
}

/// NCCL over every device, one rank each (the mock's four; one rank on a
/// one-GPU machine): a clean all-reduce, a failed input failing every rank's output
/// before NCCL is called, a failed call breaking the group and aborting its
/// communicators, and a new group working after it. Skipped, saying so,
/// where `libnccl.so` is not installed.
pub fn nccl_collectives_and_their_failure_rules_on_every_device(first: &Client<Cuda>) {
    use scope_core::collective::{CollectiveError, Element, Group, Reduce};
    use scope_core::{FaultPlan, Site};
    let gpus = server_cuda::probe().devices.len().max(1);
    let mut clients = vec![first.clone()];
    for ordinal in 1..gpus {
        clients.push(server_cuda::client_on(ordinal).expect("every GPU the probe lists opens"));
    }
    let group = match Group::over_device(clients.clone(), std::time::Duration::from_secs(60)) {
        Err(Error::BackendUnavailable { reason, .. }) => {
            println!("skipped: no nccl library ({reason})");
            return;
        }
        other => other.expect("an NCCL communicator over every GPU"),
    };
    let ranks = group.ranks() as u32;
    let sums = group.run(|rank| {
        let c = rank.client();
        let input = c.upload(&bytes(&[rank.index() as u32 + 1; 1024])).unwrap();
        let output = c.try_allocate(4096).unwrap();
        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
            .unwrap();
        words(&c.read(&output).unwrap())
    });
    let expected = ranks * (ranks + 1) / 2;
    assert!(sums.iter().all(|s| *s == vec![expected; 1024]), "{sums:?}");
    let failed = group.run(|rank| {
        let c = rank.client();
        let input = c.try_allocate(4096).unwrap();
        if rank.index() == 0 {
            c.fail_writing(
                &[input.all()],
                Error::internal("rank 0's input never written"),
            )
            .unwrap();
        }
        let output = c.upload(&bytes(&[9; 1024])).unwrap();
        let error = rank
            .all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
            .unwrap_err();
        (error, c.read(&output).unwrap_err())
    });
    for (error, read) in failed {
        assert!(error.to_string().contains("rank 0's input"), "{error}");
        assert!(
            read.to_string().contains("rank 0's input never written"),
            "{read}"
        );
    }
    let broken = group.run(|rank| {
        let c = rank.client();
        let input = c.upload(&bytes(&[1; 1024])).unwrap();
        if rank.index() == 0 {
            c.inject(FaultPlan::new().fail(Site::Collective, 1, Error::internal("rank 0's call")));
        }
        let called = rank.all_reduce(input.all(), input.all(), Element::U32, Reduce::Sum);
        // A peer whose call went out may return before it learns; its
        // output carries the failure either way (rule 47).
        let claimed = c.read(&input).unwrap_err();
        (rank.index(), called, claimed)
    });
    for (rank, called, claimed) in broken {
        assert!(
            rank != 0 || called.is_err(),
            "rank 0's failed call returned Ok"
        );
        for error in called.err().iter().chain([claimed.root()]) {
            let Error::Collective(c) = error else {
                panic!("{error}")
            };
            assert!(
                matches!(**c, CollectiveError::IssueFailed { rank: 0, .. }),
                "{error}"
            );
        }
    }
    assert!(group.broken().is_some());
    drop(group);
    let fresh = Group::over_device(clients, std::time::Duration::from_secs(60)).unwrap();
    let again = fresh.run(|rank| {
        let c = rank.client();
        let input = c.upload(&bytes(&[2; 1024])).unwrap();
        rank.all_reduce(input.all(), input.all(), Element::U32, Reduce::Sum)
            .unwrap();
        words(&c.read(&input).unwrap())
    });
    assert!(again.iter().all(|s| *s == vec![2 * ranks; 1024]));
}

/// A wild kernel's illegal address is a sticky fault that poisons the
/// device (rule 36): the launch is accepted or refused, the fault surfaces
/// by the next sync, every later operation fails fast naming it, and the
/// work in flight when it surfaced carries it. Not in [`with_every_case`]:
/// the fault corrupts the process's context, so each binary that runs it
/// runs nothing else. Returns the fault, for the driver's own words.
#[allow(dead_code)] // the binaries that include `common` without it
pub fn an_illegal_address_poisons_the_device(c: &Client<Cuda>) -> Error {
    let clean = c.try_allocate(256).unwrap();
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&clean)],
        &bytes(&[64, 5]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(words(&c.read(&clean).unwrap()), vec![5; 64]);
    let victim = c.try_allocate(256).unwrap();
    let launched = c.launch(
        &kernel("wild", WILD),
        &[Binding::read_write(&victim)],
        &[],
        Dispatch::linear(1),
    );
    let fault = match launched {
        Ok(()) => c.sync().unwrap_err(),
        Err(error) => error,
    };
    assert!(fault.is_sticky(), "{fault}");
    let Error::Fault(f) = &fault else {
        panic!("a sticky fault is a device fault: {fault}");
    };
    assert!(
        ["CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED"].contains(&f.code.as_str()),
        "{f}"
    );
    assert!(c.poison().is_some());
    // Everything after fails fast, naming the fault.
    let later = c.try_allocate(64).unwrap_err();
    assert!(later.is_device_poisoned(), "{later}");
    assert!(later.to_string().contains(&f.code), "{later}");
    assert!(c.read(&clean).unwrap_err().is_device_poisoned());
    // The work in flight when it surfaced carries the poison.
    let report = c.check(&[victim.all()]).unwrap_err();
    assert!(report.is_device_poisoned(), "{report}");
    fault
}
