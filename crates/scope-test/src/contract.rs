//! The contract under abuse: safe calls made the way a careless or adversarial runtime makes them.
//! Hooks call back in or panic. Captures and graphs are dropped on the floor.
//! Handles cross servers. Reads ask for buffers no host could hold. Requests go past the device.
//! Each must end in a typed error or a clean outcome.
//! Never a deadlock, a wedged stream, an abort, or bytes reading as written that nobody wrote.
//!
//! Every test here failed, hung or aborted on some server before the fix it names.
//! They run on every server through [`conformance_tests!`](crate::conformance_tests).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::{
    Suite, WORDS, alloc, assert_root_contains, copy, fail_next_launch, fill, launch, read, setup,
    upload,
};
use scope_core::CaptureState;
use scope_core::Error;
use scope_core::{Binding, Dispatch};
use scope_core::{FaultPlan, Site};

/// A failure hook runs after the server's lock is released.
/// So it may call back into the client, to read a counter or issue work, without deadlocking.
/// Events its own calls cause reach it after it returns, never inside it (rule 39).
pub fn a_hook_may_call_back_into_the_client<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let weak = c.downgrade();
    let calls = Arc::new(AtomicUsize::new(0));
    let depth = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicUsize::new(0));
    let spare = alloc(&c, WORDS);
    let (counter, nesting, held) = (calls.clone(), depth.clone(), seen.clone());
    c.on_failure(move |_, _| {
        assert_eq!(
            nesting.fetch_add(1, Ordering::SeqCst),
            0,
            "never inside itself"
        );
        let client = weak.upgrade().expect("the test holds the client");
        held.store(client.failures_held(), Ordering::SeqCst);
        if counter.fetch_add(1, Ordering::SeqCst) == 0 {
            // Work issued from the hook that fails too: its event comes after this call returns.
            fail_next_launch(&client, "from the hook");
            assert!(fill::<S>(&client, &spare, 1).is_err());
        }
        nesting.fetch_sub(1, Ordering::SeqCst);
    });
    let a = alloc(&c, WORDS);
    fail_next_launch(&c, "first");
    assert!(fill::<S>(&c, &a, 1).is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 2, "both failures, in turn");
    assert!(seen.load(Ordering::SeqCst) >= 1, "the hook read the store");
    assert_root_contains(&read(&c, &a).unwrap_err(), "first");
}

/// A hook that panics unwinds out of the call that delivered its event.
/// That call's bookkeeping is done first (rules 18, 36, 39).
/// A skipped launch's output still carries the failure.
/// A sticky fault still poisons, and the hook stays installed.
pub fn a_panicking_hook_leaves_the_books_right<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    c.on_failure(move |_, _| {
        counter.fetch_add(1, Ordering::SeqCst);
        panic!("a hook that panics");
    });
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    fill::<S>(&c, &b, 7).unwrap();
    let caught = |f: &dyn Fn()| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    fail_next_launch(&c, "root");
    assert!(caught(&|| drop(fill::<S>(&c, &a, 1))).is_err());
    // The skip's hook panics: `b` must not read as its old sevens.
    assert!(caught(&|| drop(copy::<S>(&c, &a, &b))).is_err());
    assert_root_contains(&read(&c, &b).unwrap_err(), "root");
    c.audit().unwrap();
    c.inject(FaultPlan::new().poison_at(1, "injected", "ILLEGAL_ADDRESS"));
    assert!(caught(&|| drop(fill::<S>(&c, &b, 2))).is_err());
    std::panic::set_hook(quiet);
    assert!(c.poison().is_some(), "the sticky fault poisoned the device");
    assert_eq!(calls.load(Ordering::SeqCst), 3, "the hook stayed installed");
}

/// A hook that holds a [`WeakClient`](scope_core::WeakClient) does not keep its server alive.
/// Dropping the last client drops the server and its hook.
pub fn a_hook_holding_a_weak_client_is_dropped_with_the_server<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    struct Flag(Arc<AtomicBool>);
    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = Flag(dropped.clone());
    let weak = c.downgrade();
    c.on_failure(move |_, _| {
        let _keep = &flag;
        let _ = weak.upgrade().map(|client| client.failures_held());
    });
    let other = c.new_stream().unwrap();
    drop(c);
    assert!(!dropped.load(Ordering::SeqCst), "another client holds it");
    drop(other);
    assert!(
        dropped.load(Ordering::SeqCst),
        "the server and hook are gone"
    );
}

/// A capture dropped without being ended is aborted at the server's next call.
/// The stream does not stay recording.
/// What its recorded work would have written is claimed as by `abort_capture` (rules 29, 33).
pub fn a_dropped_capture_is_aborted<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    fill::<S>(&c, &a, 1).unwrap();
    {
        let _forgotten = c.begin_capture().unwrap();
        fill::<S>(&c, &a, 2).unwrap();
    }
    c.sync().unwrap();
    assert_eq!(c.capture_state(), CaptureState::NoCapture);
    assert!(
        read(&c, &a).is_err(),
        "the recorded write never runs, so it cannot heal"
    );
    let capture = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 3).unwrap();
    let graph = c.end_capture(capture).unwrap();
    c.replay(&graph).unwrap();
    assert_eq!(read(&c, &a).unwrap(), vec![3; WORDS as usize]);
}

/// A capture handed to another server is an invalid argument there.
/// It is aborted on its own server rather than wedging it.
/// A graph of another server is refused the same way (rules 29, 34).
pub fn a_foreign_capture_is_refused_and_aborted_at_home<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let Some(other) = setup::<S>() else { return };
    let capture = other.begin_capture().unwrap();
    assert!(matches!(
        c.end_capture(capture),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(c.capture_state(), CaptureState::NoCapture);
    other.sync().unwrap();
    assert_eq!(other.capture_state(), CaptureState::NoCapture);
    let capture = other.begin_capture().unwrap();
    assert!(matches!(
        c.abort_capture(capture),
        Err(Error::InvalidArgument { .. })
    ));
    other.sync().unwrap();
    let a = alloc(&other, WORDS);
    let capture = other.begin_capture().unwrap();
    fill::<S>(&other, &a, 4).unwrap();
    let graph = other.end_capture(capture).unwrap();
    assert!(matches!(
        c.replay(&graph),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        c.destroy_graph(&graph),
        Err(Error::InvalidArgument { .. })
    ));
    other.replay(&graph).unwrap();
    assert_eq!(read(&other, &a).unwrap(), vec![4; WORDS as usize]);
}

/// A read tests its ranges before anything else.
/// So reading a failed buffer of the largest size the device allows answers its failure.
/// It allocates nothing, and no read of any size aborts (rule 24).
pub fn reading_a_huge_failed_buffer_allocates_nothing<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let largest = c.with_backend(scope_core::Backend::max_allocation) & !3;
    let oom = || Error::OutOfMemory {
        backend: "injected",
        requested: largest,
        detail: "injected".to_owned(),
    };
    // The first try and the retry after trimming (rule 37).
    c.inject(
        FaultPlan::new()
            .fail(Site::Allocate, 1, oom())
            .fail(Site::Allocate, 2, oom()),
    );
    let huge = c.allocate(largest).unwrap();
    let error = c.read(&huge).unwrap_err();
    assert!(error.is_out_of_memory(), "{error}");
    drop(huge);
    let fine = alloc(&c, WORDS);
    fill::<S>(&c, &fine, 5).unwrap();
    assert_eq!(read(&c, &fine).unwrap(), vec![5; WORDS as usize]);
}

/// A request past the largest allocation the device could ever make is an invalid argument.
/// It leaves nothing behind, on every server. "Not now" is out-of-memory (rule 37).
pub fn past_the_largest_allocation_is_invalid_everywhere<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let largest = c.with_backend(scope_core::Backend::max_allocation);
    for size in [largest.saturating_add(4), u64::MAX] {
        if size <= largest {
            continue;
        }
        assert!(matches!(
            c.allocate(size),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            c.try_allocate(size),
            Err(Error::InvalidArgument { .. })
        ));
    }
    assert_eq!(c.failures_held(), 0);
    assert_eq!(c.bytes_allocated(), 0);
}

/// After a sticky fault, every call that issues, waits, reads or checks fails fast (rule 36).
/// It fails with the poison. A capture's end fails too, and throws the window away.
/// Releases still release, so a runtime can tear down.
pub fn poison_fails_fast_and_releases_still_release<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let capture = c.begin_capture().unwrap();
    c.inject(FaultPlan::new().poison_at(1, "injected", "ILLEGAL_ADDRESS"));
    assert!(fill::<S>(&c, &a, 1).unwrap_err().is_sticky());
    let ended = c.end_capture(capture).unwrap_err();
    assert!(ended.is_device_poisoned(), "{ended}");
    assert_eq!(c.capture_state(), CaptureState::NoCapture);
    assert!(c.check(&[a.all()]).unwrap_err().is_device_poisoned());
    assert!(c.sync().unwrap_err().is_device_poisoned());
    assert!(c.begin_capture().unwrap_err().is_device_poisoned());
    c.free(&a).unwrap();
    assert_eq!(c.bytes_allocated(), 0);
}

/// Workgroup counts past the device's grid (rules 17, 38).
/// Given on the host, they are an invalid argument refused before anything runs.
/// Read from device memory, where no check sees them first, they make a launch that runs nothing.
/// Never a hang, and never a launch clamped to some other size.
pub fn a_count_past_the_device_runs_nothing<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let out = upload(&c, &[3; WORDS as usize]);
    let huge = Dispatch::Groups([u32::MAX, 1, 1]);
    let refused = launch::<S>(&c, &S::fill(), &[Binding::write(&out)], &[WORDS, 9], huge);
    assert!(
        matches!(refused, Err(Error::InvalidArgument { .. })),
        "{refused:?}"
    );
    assert_eq!(c.failures_held(), 0, "a refusal claims nothing");
    for counts in [[u32::MAX, 1, 1], [1, u32::MAX, 1], [1, 1, u32::MAX]] {
        let counts = upload(&c, &counts);
        launch::<S>(
            &c,
            &S::fill(),
            &[Binding::write(&out)],
            &[WORDS, 9],
            Dispatch::Indirect(counts.all()),
        )
        .unwrap();
        assert_eq!(read(&c, &out).unwrap(), vec![3; WORDS as usize]);
    }
}

/// A replay cannot know a recorded indirect launch's counts any more than the launch could.
/// Bytes it may write that carry a failure when the graph replays keep it (rules 19, 33, 34).
/// A zero count there wrote nothing.
/// Its recording healed nothing, so aborting such a window claims nothing.
/// A server that cannot record an indirect launch refuses it in the window.
/// That window then cannot seal.
pub fn a_replayed_indirect_launch_heals_nothing<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let out = upload(&c, &[3; WORDS as usize]);
    let zero = upload(&c, &[0, 1, 1]);
    let capture = c.begin_capture().unwrap();
    let recorded = launch::<S>(
        &c,
        &S::fill(),
        &[Binding::write(&out)],
        &[WORDS, 9],
        Dispatch::Indirect(zero.all()),
    );
    if recorded.is_err() {
        assert!(matches!(
            c.end_capture(capture),
            Err(Error::Unsealed { .. })
        ));
        return;
    }
    let graph = c.end_capture(capture).unwrap();
    fail_next_launch(&c, "stale");
    assert!(fill::<S>(&c, &out, 1).is_err());
    c.replay(&graph).unwrap();
    assert_root_contains(&read(&c, &out).unwrap_err(), "stale");
    c.write(&out, &super::as_bytes(&[4; WORDS as usize]))
        .unwrap();
    c.replay(&graph).unwrap();
    assert_eq!(read(&c, &out).unwrap(), vec![4; WORDS as usize]);
    let capture = c.begin_capture().unwrap();
    launch::<S>(
        &c,
        &S::fill(),
        &[Binding::write(&out)],
        &[WORDS, 9],
        Dispatch::Indirect(zero.all()),
    )
    .unwrap();
    c.abort_capture(capture).unwrap();
    assert_eq!(read(&c, &out).unwrap(), vec![4; WORDS as usize]);
}

/// The limits a server reports are its own (rule 38).
/// The largest allocation and the binding alignment are the backend's.
/// The grid is exact: a launch at the edge of each axis runs, where that is cheap to run.
/// One past it is an invalid argument that claims nothing.
/// So are too many bindings and too long a scalar blob.
pub fn the_limits_reported_are_the_limits_enforced<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let limits = c.limits();
    assert_eq!(
        limits.max_allocation,
        c.with_backend(scope_core::Backend::max_allocation)
    );
    assert_eq!(
        limits.binding_alignment,
        c.with_backend(scope_core::Backend::binding_alignment)
    );
    let launch_limits = &limits.launch;
    assert!(launch_limits.max_bindings >= 2, "{limits:?}");
    assert!(
        launch_limits.max_invocations >= 1
            && launch_limits.max_workgroup_size.iter().all(|&n| n >= 1),
        "{limits:?}"
    );
    let out = upload(&c, &[3; WORDS as usize]);
    let mut expected = 3;
    for axis in 0..3 {
        let max = launch_limits.max_workgroups[axis];
        // Cover the buffer along x (the suite's kernels index by x), then the edge along `axis`.
        let mut groups = [WORDS.div_ceil(64), 1, 1];
        if max <= 65_535 {
            groups[axis] = max;
            launch::<S>(
                &c,
                &S::fill(),
                &[Binding::write(&out)],
                &[WORDS, axis as u32],
                Dispatch::Groups(groups),
            )
            .unwrap_or_else(|e| panic!("{groups:?} is within {max} along axis {axis}: {e}"));
            expected = axis as u32;
            assert_eq!(read(&c, &out).unwrap(), vec![expected; WORDS as usize]);
        }
        if let Some(past) = max.checked_add(1) {
            groups[axis] = past;
            let refused = launch::<S>(
                &c,
                &S::fill(),
                &[Binding::write(&out)],
                &[WORDS, 9],
                Dispatch::Groups(groups),
            );
            assert!(
                matches!(refused, Err(Error::InvalidArgument { .. })),
                "{groups:?} along axis {axis}: {refused:?}"
            );
        }
    }
    if launch_limits.max_bindings <= 64 {
        let many: Vec<scope_core::Buffer> = (0..launch_limits.max_bindings)
            .map(|_| alloc(&c, 4))
            .collect();
        let bindings: Vec<Binding<'_>> = many.iter().map(Binding::write).collect();
        // One word past the blob limit, in raw words: no suite kernel takes these bindings.
        let refused = c.launch(
            &S::fill(),
            &bindings,
            &[4, 0, 0, 0, 9, 0, 0, 0],
            Dispatch::Groups([1, 1, 1]),
        );
        assert!(
            matches!(refused, Err(Error::InvalidArgument { .. })),
            "{} bindings and a blob: {refused:?}",
            many.len()
        );
    }
    if launch_limits.max_scalar_bytes < 1 << 20 {
        let blob = vec![0u8; launch_limits.max_scalar_bytes as usize + 4];
        let refused = c.launch(
            &S::fill(),
            &[Binding::write(&out)],
            &blob,
            Dispatch::Groups([1, 1, 1]),
        );
        assert!(
            matches!(refused, Err(Error::InvalidArgument { .. })),
            "a {}-byte blob: {refused:?}",
            blob.len()
        );
    }
    assert_eq!(c.failures_held(), 0, "a refusal claims nothing");
    assert_eq!(read(&c, &out).unwrap(), vec![expected; WORDS as usize]);
}

/// Reads on several threads at once each get their own bytes.
/// Some use streams of their own, some one shared stream.
/// A read waits without the server's lock.
/// What it holds meanwhile (staging, an event) is its own, never another read's.
pub fn reads_on_many_threads_each_get_their_own_bytes<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    const ROUNDS: u32 = 25;
    std::thread::scope(|scope| {
        for t in 0..4u32 {
            let c = if t % 2 == 0 {
                c.clone()
            } else {
                c.new_stream().unwrap()
            };
            scope.spawn(move || {
                let buffer = alloc(&c, WORDS);
                for round in 0..ROUNDS {
                    let value = t * 1000 + round;
                    fill::<S>(&c, &buffer, value).unwrap();
                    assert_eq!(
                        read(&c, &buffer).unwrap(),
                        vec![value; WORDS as usize],
                        "thread {t}, round {round}"
                    );
                }
            });
        }
    });
    c.audit().unwrap();
    assert_eq!(c.failures_held(), 0, "{}", c.dump_failures());
}

/// Threads race frees against launches, reads and copies on shared buffers.
/// Every call ends in success or in the typed error for a freed buffer.
/// Once everything is dropped, the store and the allocator are empty (rules 7, 13).
pub fn threads_racing_frees_against_launches<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    const ROUNDS: usize = 40;
    for _ in 0..ROUNDS {
        let shared: Vec<scope_core::Buffer> = (0..4).map(|_| alloc(&c, WORDS)).collect();
        let shared = Arc::new(shared);
        std::thread::scope(|scope| {
            for t in 0..3 {
                let c = if t == 0 {
                    c.clone()
                } else {
                    c.new_stream().unwrap()
                };
                let shared = shared.clone();
                scope.spawn(move || {
                    for (i, buffer) in shared.iter().enumerate() {
                        let outcome = match (t + i) % 3 {
                            0 => fill::<S>(&c, buffer, t as u32),
                            1 => copy::<S>(&c, buffer, &shared[(i + 1) % shared.len()]),
                            _ => c.read(buffer).map(drop),
                        };
                        assert!(
                            outcome.is_ok()
                                || matches!(
                                    outcome,
                                    Err(Error::InvalidArgument { .. }) | Err(Error::Unwritten(_))
                                )
                                || outcome.as_ref().is_err_and(Error::is_refusal)
                                || matches!(outcome, Err(Error::Skipped { .. })),
                            "{outcome:?}"
                        );
                    }
                });
            }
            let c = c.clone();
            let shared = shared.clone();
            scope.spawn(move || {
                for buffer in shared.iter() {
                    let freed = c.free(buffer);
                    assert!(
                        freed.is_ok() || matches!(freed, Err(Error::InvalidArgument { .. })),
                        "{freed:?}"
                    );
                }
            });
        });
    }
    c.sync().unwrap();
    c.audit().unwrap();
    assert_eq!(c.failures_held(), 0, "{}", c.dump_failures());
    assert_eq!(c.bytes_allocated(), 0);
}

/// A failure found outside scope, say in a runtime's kernel compiler, acts as a failed launch.
/// It claims the bytes its work would have written.
/// Reads return it as their root, typed as its author made it.
/// Work that reads them is skipped, a recording window is doomed, and the hook hears it.
/// Bad slices claim nothing (rules 17, 18, 21, 31, 39).
pub fn a_failure_from_outside_claims_like_a_failed_launch<S: Suite>() {
    #[derive(Debug)]
    struct CompilerSaidNo(&'static str);
    impl std::fmt::Display for CompilerSaidNo {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "the runtime's compiler said no: {}", self.0)
        }
    }
    impl std::error::Error for CompilerSaidNo {}

    let Some(c) = setup::<S>() else { return };
    let heard = Arc::new(AtomicUsize::new(0));
    let counter = heard.clone();
    c.on_failure(move |_, _| {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    let out = upload(&c, &[1; WORDS as usize]);
    let next = alloc(&c, WORDS);
    let spare = alloc(&c, WORDS);
    let error = Error::external(CompilerSaidNo("matmul"));
    c.fail_writing(&[out.slice(0..64)], error).unwrap();
    assert_eq!(heard.load(Ordering::SeqCst), 1);
    let report = c.read(&out).unwrap_err();
    assert_eq!(
        report.external_root::<CompilerSaidNo>().map(|e| e.0),
        Some("matmul"),
        "{report}"
    );
    assert_eq!(
        c.read(out.slice(64..)).unwrap(),
        super::as_bytes(&[1; WORDS as usize - 16]),
        "only the bytes named"
    );
    assert!(matches!(
        copy::<S>(&c, &out, &next),
        Err(Error::Skipped { .. })
    ));
    let downstream = c.read(&next).unwrap_err();
    assert!(downstream.external_root::<CompilerSaidNo>().is_some());
    assert_eq!(heard.load(Ordering::SeqCst), 2);
    // Bad input claims nothing.
    let freed = alloc(&c, WORDS);
    c.free(&freed).unwrap();
    let claims = c.failure_claims();
    assert!(matches!(
        c.fail_writing(
            &[spare.all(), freed.all()],
            Error::external(CompilerSaidNo("x"))
        ),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(c.failure_claims(), claims);
    // Inside a window it dooms the recording, as a failed launch does.
    let capture = c.begin_capture().unwrap();
    c.fail_writing(
        &[spare.all()],
        Error::external(CompilerSaidNo("in a window")),
    )
    .unwrap();
    let unsealed = c.end_capture(capture).unwrap_err();
    assert!(
        unsealed.external_root::<CompilerSaidNo>().is_some(),
        "{unsealed}"
    );
    // A rewrite heals, as always.
    c.write(&out, &super::as_bytes(&[2; WORDS as usize]))
        .unwrap();
    assert_eq!(read(&c, &out).unwrap(), vec![2; WORDS as usize]);
}

/// `flush` submits without waiting and changes nothing the contract shows.
/// Clean work reads back, and a recording stream has nothing to submit.
pub fn flush_submits_and_changes_nothing_else<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    fill::<S>(&c, &a, 6).unwrap();
    c.flush().unwrap();
    fill::<S>(&c, &a, 7).unwrap();
    c.flush().unwrap();
    assert_eq!(read(&c, &a).unwrap(), vec![7; WORDS as usize]);
    let capture = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 8).unwrap();
    c.flush().unwrap();
    let graph = c.end_capture(capture).unwrap();
    assert_eq!(
        read(&c, &a).unwrap(),
        vec![7; WORDS as usize],
        "recorded, not run"
    );
    c.replay(&graph).unwrap();
    c.flush().unwrap();
    assert_eq!(read(&c, &a).unwrap(), vec![8; WORDS as usize]);
}

/// A buffer made failed by the caller acts like one the device could not provide.
/// It reads, skips and frees the same way, whatever its size (rules 17, 28, 37).
pub fn a_caller_failed_allocation_behaves_like_the_devices<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let size = c
        .with_backend(scope_core::Backend::max_allocation)
        .saturating_add(4)
        .min(u64::MAX - 3)
        & !3;
    let failed = c
        .failed_allocation(
            size,
            Error::OutOfMemory {
                backend: "adapter",
                requested: size,
                detail: "past the device".to_owned(),
            },
        )
        .unwrap();
    assert_eq!(failed.size(), size);
    let error = c.read(failed.slice(0..4)).unwrap_err();
    assert!(error.is_out_of_memory(), "{error}");
    let out = alloc(&c, WORDS);
    let n = WORDS;
    let skipped = launch::<S>(
        &c,
        &S::copy(),
        &[
            failed.slice(0..4 * u64::from(n)).read(),
            Binding::write(&out),
        ],
        &[n],
        super::groups(n),
    );
    assert!(matches!(skipped, Err(Error::Skipped { .. })), "{skipped:?}");
    assert!(read(&c, &out).unwrap_err().is_out_of_memory());
    assert!(c.poison().is_none());
    assert!(matches!(
        c.failed_allocation(0, Error::refused("x")),
        Err(Error::InvalidArgument { .. })
    ));
    drop((failed, out));
    assert_eq!(c.failures_held(), 0);
    assert_eq!(c.bytes_allocated(), 0);
}

/// A closure passed to `with_backend` or `with_memory` runs under the server's lock.
/// The lock is not re-entrant: a call back into the same server's client must not wait for it.
/// That holds on the closure's own stream or another.
/// A call that only looks is answered.
/// One that would change the server is an [`Error::InvalidArgument`] that claims nothing.
/// Afterwards every client works.
/// It runs on a thread with a deadline, so the deadlock it guards against fails the test.
pub fn a_closure_holding_the_lock_may_call_back<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let (done, finished) = std::sync::mpsc::channel();
    let calling = std::thread::spawn(move || {
        let same = c.clone();
        let other = c.new_stream().expect("a second stream");
        let a = upload(&c, &[1; WORDS as usize]);
        let b = upload(&c, &[2; WORDS as usize]);
        // Looking is answered from inside, with what is true outside.
        let held = c.with_backend(|_| same.failures_held());
        assert_eq!(held, c.failures_held());
        let largest = c.with_backend(|_| same.with_backend(scope_core::Backend::max_allocation));
        assert_eq!(largest, c.limits().max_allocation);
        let nested = c.with_memory(&a, |_, _| same.with_memory(&b, |_, _| 7));
        assert_eq!(nested.ok().and_then(Result::ok), Some(7));
        // Changing is refused, typed, on any stream, claiming nothing.
        let invalid = |r: &Result<(), Error>| matches!(r, Err(Error::InvalidArgument { .. }));
        let read_inside = c.with_backend(|_| same.read(&a).map(drop));
        assert!(invalid(&read_inside), "{read_inside:?}");
        let launched = c.with_memory(&a, |_, _| fill::<S>(&same, &b, 3)).unwrap();
        assert!(invalid(&launched), "{launched:?}");
        let allocated = c.with_backend(|_| other.allocate(64).map(drop));
        assert!(invalid(&allocated), "{allocated:?}");
        let synced = c.with_backend(|_| other.sync());
        assert!(invalid(&synced), "{synced:?}");
        // SAFETY: the closure does nothing to the backend.
        let exclusive = c.with_backend(|_| unsafe { same.with_backend_mut(|_| ()) });
        assert!(invalid(&exclusive), "{exclusive:?}");
        assert_eq!(read(&c, &b).unwrap(), vec![2; WORDS as usize]);
        // And after the closure, all of it works.
        fill::<S>(&same, &b, 3).unwrap();
        assert_eq!(read(&other, &b).unwrap(), vec![3; WORDS as usize]);
        assert_eq!(read(&same, &a).unwrap(), vec![1; WORDS as usize]);
        assert_eq!(c.failures_held(), 0);
        done.send(()).expect("the test waits");
    });
    finished
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("a call from inside a closure holding the server's lock deadlocked");
    // Let the thread drop its clients first: a device torn down at process exit can crash it.
    calling.join().expect("the calling thread finished");
}

/// The contract behaviours: one `#[test]` each for `$suite`, with what each needs.
#[macro_export]
macro_rules! contract_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, contract::a_hook_may_call_back_into_the_client }
        $crate::behaviour! { $suite, contract::a_panicking_hook_leaves_the_books_right }
        $crate::behaviour! { $suite, contract::a_hook_holding_a_weak_client_is_dropped_with_the_server }
        $crate::behaviour! { $suite, contract::a_dropped_capture_is_aborted }
        $crate::behaviour! { $suite, contract::a_foreign_capture_is_refused_and_aborted_at_home }
        $crate::behaviour! { $suite, contract::reading_a_huge_failed_buffer_allocates_nothing }
        $crate::behaviour! { $suite, contract::past_the_largest_allocation_is_invalid_everywhere }
        $crate::behaviour! { $suite, contract::poison_fails_fast_and_releases_still_release }
        $crate::behaviour! { $suite, contract::a_count_past_the_device_runs_nothing }
        $crate::behaviour! { $suite, contract::a_replayed_indirect_launch_heals_nothing }
        $crate::behaviour! { $suite, contract::the_limits_reported_are_the_limits_enforced }
        $crate::behaviour! { $suite, contract::reads_on_many_threads_each_get_their_own_bytes }
        $crate::behaviour! { $suite, contract::threads_racing_frees_against_launches }
        $crate::behaviour! { $suite, contract::a_failure_from_outside_claims_like_a_failed_launch }
        $crate::behaviour! { $suite, contract::flush_submits_and_changes_nothing_else }
        $crate::behaviour! { $suite, contract::a_caller_failed_allocation_behaves_like_the_devices }
        $crate::behaviour! { $suite, contract::a_closure_holding_the_lock_may_call_back }
    };
}
