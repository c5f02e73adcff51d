//! A lost device opened again (`Client::recover`), with every handle kept (rules 51–53).
//! The bytes it held fail as "lost with the device" until rewritten.
//! Graphs recorded on it refuse to replay, and open captures are aborted.
//! The client, its buffers, hook and counts carry over.
//!
//! Each behaviour loses the device by an injected sticky fault.
//! The backends' own tests lose it for real: wgpu's `Device::destroy`, a Vulkan device torn down
//! and made again, the mocks' process-fatal and resettable faults.
//! Injecting it here makes every server, the host included, keep the same promises.

use super::*;
use scope_core::Recovered;

/// Poison the device on the next device call, and make one happen.
fn lose<S: Suite>(c: &Client<S::Backend>, victim: &Buffer) -> Error {
    c.inject(FaultPlan::new().poison_at(1, "injected", "DEVICE_LOST"));
    let error = fill::<S>(c, victim, 0xdead).unwrap_err();
    assert!(error.is_sticky(), "{error}");
    assert!(c.poison().is_some());
    error
}

/// Recover, expecting the device to open again.
fn reopen<B: scope_core::Backend>(c: &Client<B>) -> (usize, usize) {
    match c.recover() {
        Ok(Recovered::Reopened {
            buffers, graphs, ..
        }) => (buffers, graphs),
        other => panic!("the device should have opened again: {other:?}"),
    }
}

/// A read of bytes the lost device held: "lost with the device", naming the fault.
fn assert_lost<B: scope_core::Backend>(c: &Client<B>, buffer: &Buffer) {
    let error = read(c, buffer).unwrap_err();
    assert!(error.is_lost_with_device(), "{error}");
    assert!(
        !error.is_device_poisoned(),
        "the device is not poisoned now: {error}"
    );
    assert!(
        error.to_string().contains("DEVICE_LOST"),
        "names the fault: {error}"
    );
}

/// The device comes back with every handle valid (rules 51, 52).
/// Its buffers fail as lost until rewritten, and work reading them is skipped.
/// A rewrite heals them.
/// The client, its hook and its count of failures seen carry over.
pub fn a_lost_device_comes_back_with_every_handle<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let heard = Arc::new(Mutex::new(0usize));
    let hook = heard.clone();
    c.on_failure(move |_, _| *hook.lock() += 1);
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    let other = c.new_stream().unwrap();
    fill::<S>(&c, &a, 1).unwrap();
    copy::<S>(&c, &a, &b).unwrap();
    assert_eq!(read(&c, &b).unwrap(), vec![1; WORDS as usize]);
    lose::<S>(&c, &a);
    let seen = c.failures_seen();
    assert!(seen > 0);
    let (buffers, _) = reopen(&c);
    assert_eq!(buffers, 2, "both buffers are made again");
    assert!(c.poison().is_none());
    assert_eq!(c.failures_seen(), seen, "the count carries over");
    assert_lost(&c, &a);
    assert_lost(&other, &b);
    assert!(c.check(&[a.all()]).unwrap_err().is_lost_with_device());
    // Work reading lost bytes is skipped; its outputs carry the loss.
    assert!(matches!(copy::<S>(&c, &a, &b), Err(Error::Skipped { .. })));
    assert_lost(&c, &b);
    assert!(
        *heard.lock() > 0,
        "the hook carried over and heard the skip"
    );
    // A rewrite heals, on any stream, and the device works as before.
    fill::<S>(&other, &a, 7).unwrap();
    copy::<S>(&c, &a, &b).unwrap();
    assert_eq!(read(&c, &b).unwrap(), vec![7; WORDS as usize]);
    let fresh = alloc(&c, WORDS);
    fill::<S>(&c, &fresh, 3).unwrap();
    assert_eq!(read(&c, &fresh).unwrap(), vec![3; WORDS as usize]);
    c.audit().unwrap();
    drop((a, b, fresh));
    c.sync().unwrap();
    assert_eq!(c.failures_held(), 0, "the store empties with the buffers");
}

/// A device lost in the middle of a chain: everything downstream of the loss reads as lost.
/// Rewriting the head of the chain heals it all (rules 17, 51).
pub fn a_loss_in_the_middle_of_a_chain_heals_from_its_head<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    let sum = alloc(&c, WORDS);
    fill::<S>(&c, &a, 2).unwrap();
    c.inject(FaultPlan::new().poison_at(1, "injected", "DEVICE_LOST"));
    assert!(copy::<S>(&c, &a, &b).unwrap_err().is_sticky());
    assert!(add::<S>(&c, &a, &b, &sum).unwrap_err().is_device_poisoned());
    reopen(&c);
    for buffer in [&a, &b, &sum] {
        assert_lost(&c, buffer);
    }
    assert!(matches!(
        add::<S>(&c, &a, &b, &sum),
        Err(Error::Skipped { .. })
    ));
    fill::<S>(&c, &a, 2).unwrap();
    copy::<S>(&c, &a, &b).unwrap();
    add::<S>(&c, &a, &b, &sum).unwrap();
    assert_eq!(read(&c, &sum).unwrap(), vec![4; WORDS as usize]);
    c.audit().unwrap();
}

/// A device lost while a window records: recovery aborts the window (rules 33, 53).
/// Its handle then names no open window.
/// A graph recorded before the loss refuses to replay, claiming nothing, and can be destroyed.
/// A capture made afterwards replays.
pub fn a_loss_during_a_capture_aborts_it_and_old_graphs_refuse<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let before = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 5).unwrap();
    let old = c.end_capture(before).unwrap();
    c.replay(&old).unwrap();
    assert_eq!(read(&c, &a).unwrap(), vec![5; WORDS as usize]);
    let open = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 6).unwrap();
    c.inject(FaultPlan::new().poison_at(1, "injected", "DEVICE_LOST"));
    assert!(fill::<S>(&c, &a, 7).unwrap_err().is_sticky());
    let (_, graphs) = reopen(&c);
    assert_eq!(graphs, 1, "the graph recorded before the loss is lost");
    assert_eq!(
        c.capture_state(),
        CaptureState::NoCapture,
        "the window is aborted"
    );
    assert!(matches!(
        c.end_capture(open).unwrap_err(),
        Error::InvalidArgument { .. }
    ));
    let held = c.failures_held();
    let refused = c.replay(&old).unwrap_err();
    assert!(refused.is_refusal(), "{refused}");
    assert_eq!(c.failures_held(), held, "a refused replay claims nothing");
    assert_lost(&c, &a);
    c.destroy_graph(&old).unwrap();
    let again = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 8).unwrap();
    let new = c.end_capture(again).unwrap();
    c.replay(&new).unwrap();
    assert_eq!(read(&c, &a).unwrap(), vec![8; WORDS as usize]);
    c.audit().unwrap();
}

/// Lost, recovered, lost again, recovered again: the same handles work after both.
/// The store holds no more than its buffers claim (rules 7, 51).
pub fn a_device_lost_twice_comes_back_twice<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    for round in 0..2u32 {
        lose::<S>(&c, &a);
        assert_eq!(reopen(&c).0, 2, "round {round}");
        assert_lost(&c, &a);
        assert_lost(&c, &b);
        assert!(c.failures_held() <= c.failure_claims());
        fill::<S>(&c, &a, round).unwrap();
        fill::<S>(&c, &b, round + 1).unwrap();
        assert_eq!(read(&c, &a).unwrap(), vec![round; WORDS as usize]);
        assert_eq!(read(&c, &b).unwrap(), vec![round + 1; WORDS as usize]);
        c.audit().unwrap();
    }
    assert_eq!(c.failures_held(), 0);
}

/// Recovering a device that is not lost changes nothing.
/// Its bytes read as they were, and it answers that it was healthy.
pub fn recovering_a_healthy_device_changes_nothing<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    fill::<S>(&c, &a, 4).unwrap();
    let recovered = c.recover().unwrap();
    assert!(matches!(recovered, Recovered::Healthy), "{recovered:?}");
    assert_eq!(read(&c, &a).unwrap(), vec![4; WORDS as usize]);
    assert_eq!(c.failures_held(), 0);
}

/// A loss while the device is opened again, injected where the backend reopens it (rule 52).
/// The client is left poisoned, its buffers without memory, and every call fails fast.
/// A later recovery succeeds.
pub fn a_loss_while_reopening_leaves_it_poisoned_and_recoverable<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    fill::<S>(&c, &a, 1).unwrap();
    lose::<S>(&c, &a);
    c.inject(FaultPlan::new().fail(
        Site::Reopen,
        1,
        Error::Fault(scope_core::DeviceFault {
            backend: "injected",
            code: "DEVICE_LOST".into(),
            class: scope_core::FaultClass::Sticky,
            stream: None,
            detail: "lost again while opening".into(),
        }),
    ));
    let failed = c.recover().unwrap_err();
    assert!(failed.to_string().contains("lost again"), "{failed}");
    assert!(c.poison().is_some(), "still poisoned");
    assert!(c.allocate(64).unwrap_err().is_device_poisoned());
    assert!(read(&c, &a).unwrap_err().is_device_poisoned());
    assert_eq!(reopen(&c).0, 1);
    assert_lost(&c, &a);
    fill::<S>(&c, &a, 2).unwrap();
    assert_eq!(read(&c, &a).unwrap(), vec![2; WORDS as usize]);
    c.audit().unwrap();
}

/// A graph given up by a recovery whose reopen failed is counted by the one that opens the device.
/// `Recovered::Reopened` counts the graphs lost with the device, however many attempts it took.
/// The graph refuses to replay either way (rules 52, 53).
pub fn graphs_lost_before_a_failed_reopen_are_counted_when_it_opens<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let capture = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 5).unwrap();
    let graph = c.end_capture(capture).unwrap();
    lose::<S>(&c, &a);
    c.inject(FaultPlan::new().fail(
        Site::Reopen,
        1,
        Error::Fault(scope_core::DeviceFault {
            backend: "injected",
            code: "DEVICE_LOST".into(),
            class: scope_core::FaultClass::Sticky,
            stream: None,
            detail: "lost again while opening".into(),
        }),
    ));
    assert!(c.recover().is_err(), "the first attempt fails");
    assert!(c.poison().is_some(), "still poisoned");
    let (buffers, graphs) = reopen(&c);
    assert_eq!(buffers, 1);
    assert_eq!(graphs, 1, "the graph the failed attempt gave up is counted");
    assert!(c.replay(&graph).unwrap_err().is_refusal());
    c.destroy_graph(&graph).unwrap();
    assert_lost(&c, &a);
    c.audit().unwrap();
}

/// The device lost again while a recovery makes its buffers again (rules 51, 52).
/// That recovery fails and leaves the client poisoned.
/// The next one makes every buffer again, those the failed attempt made and those it had not.
/// Each is lost with the device until rewritten.
pub fn a_loss_while_remaking_buffers_leaves_none_behind<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let buffers: Vec<Buffer> = (0..3).map(|_| alloc(&c, WORDS)).collect();
    lose::<S>(&c, &buffers[0]);
    c.inject(FaultPlan::new().fail(
        Site::Allocate,
        2,
        Error::Fault(scope_core::DeviceFault {
            backend: "injected",
            code: "DEVICE_LOST".into(),
            class: scope_core::FaultClass::Sticky,
            stream: None,
            detail: "lost again while remaking".into(),
        }),
    ));
    let failed = c.recover().unwrap_err();
    c.inject(FaultPlan::new());
    assert!(failed.to_string().contains("lost again"), "{failed}");
    assert!(c.poison().is_some(), "still poisoned");
    assert_eq!(reopen(&c).0, 3, "every buffer is made again");
    for (i, buffer) in (0u32..).zip(&buffers) {
        assert_lost(&c, buffer);
        fill::<S>(&c, buffer, i).unwrap();
        assert_eq!(read(&c, buffer).unwrap(), vec![i; WORDS as usize]);
    }
    c.audit().unwrap();
}

/// A device whose backend cannot open it again, as [`Capability::Reopen`] says (rules 36, 52).
/// Recovery is refused with `Error::RestartRequired` naming the fault, again at a second try.
/// The client stays poisoned, and its releases still release.
/// Where the backend reopens, the same loss comes back.
/// It is in every suite's list, so each server's answer is checked against its suite's word.
pub fn recovery_is_refused_where_the_backend_cannot_reopen<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    fill::<S>(&c, &b, 1).unwrap();
    lose::<S>(&c, &a);
    if kit::has::<S>(Capability::Reopen) {
        assert_eq!(reopen(&c).0, 2, "both buffers are made again");
        assert_lost(&c, &b);
        return;
    }
    for attempt in 0..2 {
        match c.recover() {
            Err(Error::RestartRequired { fault, .. }) => assert!(
                fault.to_string().contains("DEVICE_LOST"),
                "attempt {attempt} names the fault: {fault}"
            ),
            other => panic!("attempt {attempt}: a restart is required: {other:?}"),
        }
        assert!(c.poison().is_some(), "still poisoned");
    }
    assert!(read(&c, &b).unwrap_err().is_device_poisoned());
    c.free(&a).expect("a release still releases");
    drop((a, b));
    assert_eq!(c.failures_held(), 0, "the store empties with the buffers");
    assert_eq!(c.bytes_allocated(), 0);
}

/// Two threads that both saw the poison recover at once.
/// One opens the device again, the other learns it is healthy; neither waits forever.
pub fn two_recoveries_at_once_open_the_device_once<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    lose::<S>(&c, &a);
    let outcomes: Vec<Recovered> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let c = c.clone();
                scope.spawn(move || c.recover().unwrap())
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let reopened = outcomes
        .iter()
        .filter(|r| matches!(r, Recovered::Reopened { .. }))
        .count();
    assert_eq!(reopened, 1, "{outcomes:?}");
    assert_lost(&c, &a);
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// Threads read on their own streams while the device is lost and opened again (rules 24, 51).
/// Each read answers its bytes, the poison or the loss.
/// Never a hang, never bytes read as clean that were not rewritten.
/// Once rewritten, every stream reads them.
pub fn reads_in_flight_on_other_threads_meet_a_recovery<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    fill::<S>(&c, &a, 9).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..3 {
            let reader = c.new_stream().unwrap();
            let (a, stop) = (&a, &stop);
            scope.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    match read(&reader, a) {
                        Ok(words) => assert!(
                            words == vec![9; WORDS as usize] || words == vec![10; WORDS as usize],
                            "a clean read holds words some write wrote"
                        ),
                        // A reader's call may be where the loss surfaces (sticky), or after it.
                        Err(error) => assert!(
                            error.is_sticky()
                                || error.is_device_poisoned()
                                || error.is_lost_with_device(),
                            "{error}"
                        ),
                    }
                }
            });
        }
        // However this thread leaves the scope, a failed assertion included, the readers stop.
        // So a failure fails and never hangs.
        let _stop = StopOnDrop(&stop);
        std::thread::sleep(std::time::Duration::from_millis(20));
        // The loss surfaces at the next device call of any thread: a reader's or this fill's.
        c.inject(FaultPlan::new().poison_at(1, "injected", "DEVICE_LOST"));
        let _ = fill::<S>(&c, &a, 0xdead);
        assert!(c.poison().is_some(), "the device is lost");
        std::thread::sleep(std::time::Duration::from_millis(10));
        reopen(&c);
        fill::<S>(&c, &a, 10).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(10));
    });
    assert_eq!(read(&c, &a).unwrap(), vec![10; WORDS as usize]);
    c.audit().unwrap();
}

/// The recovery behaviours: one `#[test]` each for `$suite`, with what each needs.
#[macro_export]
macro_rules! recover_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, recover::a_lost_device_comes_back_with_every_handle, Reopen }
        $crate::behaviour! { $suite, recover::a_loss_in_the_middle_of_a_chain_heals_from_its_head, Reopen }
        $crate::behaviour! { $suite, recover::a_loss_during_a_capture_aborts_it_and_old_graphs_refuse, Reopen }
        $crate::behaviour! { $suite, recover::a_device_lost_twice_comes_back_twice, Reopen }
        $crate::behaviour! { $suite, recover::recovering_a_healthy_device_changes_nothing, Reopen }
        $crate::behaviour! { $suite, recover::a_loss_while_reopening_leaves_it_poisoned_and_recoverable, Reopen }
        $crate::behaviour! { $suite, recover::graphs_lost_before_a_failed_reopen_are_counted_when_it_opens, Reopen }
        $crate::behaviour! { $suite, recover::a_loss_while_remaking_buffers_leaves_none_behind, Reopen }
        $crate::behaviour! { $suite, recover::recovery_is_refused_where_the_backend_cannot_reopen }
        $crate::behaviour! { $suite, recover::two_recoveries_at_once_open_the_device_once, Reopen }
        $crate::behaviour! { $suite, recover::reads_in_flight_on_other_threads_meet_a_recovery, Reopen }
    };
}
