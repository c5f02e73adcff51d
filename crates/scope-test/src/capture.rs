//! Capture windows and graphs (rules 29–35). What dooms a window, and what an abandoned or refused
//! one leaves claimed. Replays that succeed and fail, and graphs that are unknown or destroyed.

use super::*;

/// Work that failed or was skipped inside a window dooms it. Its recorded outputs carry the reason
/// (rules 31, 33).
pub fn capture_doomed_by_failure<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    let capture = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 1).unwrap();
    fail_next_launch(&c, "inside-window");
    assert!(fill::<S>(&c, &b, 2).is_err());
    let error = c.end_capture(capture).unwrap_err();
    assert!(matches!(error, Error::Unsealed { .. }), "{error}");
    assert!(error.to_string().contains("inside-window"), "{error}");
    assert_eq!(c.capture_state(), CaptureState::NoCapture);
    let on_a = read(&c, &a).unwrap_err();
    assert!(
        matches!(&*on_a.unwritten()[0].root, Error::Unsealed { .. }),
        "{on_a}"
    );
}

/// A skip inside a window dooms it (rules 18, 31).
pub fn capture_doomed_by_skip<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let bad = alloc(&c, WORDS);
    let out = alloc(&c, WORDS);
    fail_next_launch(&c, "before-window");
    assert!(fill::<S>(&c, &bad, 1).is_err());
    let capture = c.begin_capture().unwrap();
    assert!(matches!(
        copy::<S>(&c, &bad, &out),
        Err(Error::Skipped { .. })
    ));
    let error = c.end_capture(capture).unwrap_err();
    assert!(matches!(error, Error::Unsealed { .. }), "{error}");
}

/// A window ended from another stream is abandoned (rule 33).
pub fn abandoned_window<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let other = c.new_stream().unwrap();
    let a = alloc(&c, WORDS);
    let capture = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 1).unwrap();
    let error = other.end_capture(capture).unwrap_err();
    assert!(matches!(error, Error::Unsealed { .. }));
    assert!(error.to_string().contains("abandons"), "{error}");
    assert!(read(&c, &a).is_err(), "the recorded output is claimed");
    assert_eq!(c.capture_state(), CaptureState::NoCapture);
}

/// A sealed graph replays its work and heals its outputs (rules 32, 34). It replays host writes
/// with the bytes given when they were recorded.
pub fn replay_success<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let input = upload(&c, &vec![1; WORDS as usize]);
    let mid = alloc(&c, WORDS);
    let out = alloc(&c, WORDS);
    // Taint `out` first: a clean replay must heal it.
    fail_next_launch(&c, "stale-out");
    assert!(fill::<S>(&c, &out, 0).is_err());
    let capture = c.begin_capture().unwrap();
    c.write(&input, &as_bytes(&vec![4; WORDS as usize]))
        .unwrap();
    copy::<S>(&c, &input, &mid).unwrap();
    add::<S>(&c, &mid, &input, &out).unwrap();
    let graph = c.end_capture(capture).unwrap();
    // The recorded work has not run yet.
    assert_eq!(read(&c, &input).unwrap(), vec![1; WORDS as usize]);
    c.write(&input, &as_bytes(&vec![100; WORDS as usize]))
        .unwrap();
    for _ in 0..3 {
        c.replay(&graph).unwrap();
    }
    assert_eq!(
        read(&c, &out).unwrap(),
        vec![8; WORDS as usize],
        "replay wrote the retained bytes"
    );
    assert_eq!(c.failures_held(), 0);
    c.destroy_graph(&graph).unwrap();
}

/// A replay that fails claims every output with the replay's error (rule 34).
pub fn replay_failure<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    let capture = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 1).unwrap();
    copy::<S>(&c, &a, &b).unwrap();
    let graph = c.end_capture(capture).unwrap();
    c.inject(FaultPlan::new().fail(Site::Replay, 1, injected("replay-broke")));
    assert!(c.replay(&graph).is_err());
    for buffer in [&a, &b] {
        assert_root_contains(&read(&c, buffer).unwrap_err(), "replay-broke");
    }
    c.replay(&graph).unwrap();
    assert_eq!(
        read(&c, &b).unwrap(),
        vec![1; WORDS as usize],
        "the next replay heals"
    );
}

/// Replaying or destroying an unknown or destroyed graph is an error that claims nothing. A failed
/// destroy claims the graph's outputs (rules 34, 35).
pub fn unknown_and_destroyed_graphs<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let capture = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 1).unwrap();
    let graph = c.end_capture(capture).unwrap();
    c.destroy_graph(&graph).unwrap();
    let held = c.failures_held();
    assert!(matches!(
        c.replay(&graph),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        c.destroy_graph(&graph),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(c.failures_held(), held, "claims nothing");
    if let Some(other) = setup::<S>() {
        assert!(matches!(
            other.replay(&graph),
            Err(Error::InvalidArgument { .. })
        ));
    }
    let capture = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 2).unwrap();
    let graph = c.end_capture(capture).unwrap();
    c.replay(&graph).unwrap();
    c.inject(FaultPlan::new().fail(Site::Destroy, 1, injected("destroy-wait")));
    assert!(c.destroy_graph(&graph).is_err());
    assert_root_contains(&read(&c, &a).unwrap_err(), "destroy-wait");
}

/// Host reads, syncs and replays on a recording stream are refused (rules 29, 38). They change
/// nothing and do not doom the window. Capture steps need their predecessor.
pub fn refusals_while_recording<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let capture = c.begin_capture().unwrap();
    assert!(c.begin_capture().unwrap_err().is_refusal());
    fill::<S>(&c, &a, 1).unwrap();
    assert!(c.read(&a).unwrap_err().is_refusal());
    assert!(c.sync().unwrap_err().is_refusal());
    assert_eq!(c.capture_state(), CaptureState::Recording);
    let graph = c.end_capture(capture).unwrap();
    c.replay(&graph).unwrap();
    assert_eq!(read(&c, &a).unwrap(), vec![1; WORDS as usize]);
}

/// A buffer last used by work recorded on one stream cannot be used from another until that capture
/// ends (rule 38). The work to wait for has not run. Nothing is doomed or lost. A buffer the
/// capturing stream used only before its capture is not refused. The exception is when the other
/// stream is capturing too.
pub fn recorded_buffers_wait_for_their_capture<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let other = c.new_stream().unwrap();
    let a = upload(&c, &vec![1; WORDS as usize]);
    let b = alloc(&c, WORDS);
    let early = upload(&c, &vec![7; WORDS as usize]);
    let seen = (c.failures_seen(), other.failures_seen());
    let capture = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 2).unwrap();
    assert!(other.read(&a).unwrap_err().is_refusal());
    assert!(
        other.read(&a).unwrap_err().is_refusal(),
        "refused again: a refusal does not make the other stream a's last user"
    );
    let refused = copy::<S>(&other, &a, &b).unwrap_err();
    assert!(refused.is_refusal(), "{refused}");
    // A refusal is the caller's error, not a device failure (rule 38): nothing claimed, nothing
    // seen.
    other.check(&[b.all()]).unwrap();
    assert_eq!((c.failures_seen(), other.failures_seen()), seen);
    // What the capturing stream used only before its capture is usable elsewhere, after that work.
    assert_eq!(read(&other, &early).unwrap(), vec![7; WORDS as usize]);
    copy::<S>(&other, &early, &b).unwrap();
    assert_eq!(read(&other, &b).unwrap(), vec![7; WORDS as usize]);
    let graph = c.end_capture(capture).unwrap();
    c.replay(&graph).unwrap();
    assert_eq!(read(&other, &a).unwrap(), vec![2; WORDS as usize]);
    // Two captures cannot wait for each other's streams. While both record, a buffer the other
    // capturing stream used, even before its capture, is refused, claiming nothing.
    let before = upload(&c, &vec![5; WORDS as usize]);
    let first = c.begin_capture().unwrap();
    let second = other.begin_capture().unwrap();
    let refused = copy::<S>(&other, &before, &b).unwrap_err();
    assert!(refused.is_refusal(), "{refused}");
    other.abort_capture(second).unwrap();
    c.abort_capture(first).unwrap();
    assert_eq!(read(&other, &before).unwrap(), vec![5; WORDS as usize]);
    assert_eq!(read(&other, &b).unwrap(), vec![7; WORDS as usize]);
}

/// The capture behaviours: one `#[test]` each for `$suite`, with what each needs.
#[macro_export]
macro_rules! capture_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, capture::capture_doomed_by_failure }
        $crate::behaviour! { $suite, capture::capture_doomed_by_skip }
        $crate::behaviour! { $suite, capture::abandoned_window }
        $crate::behaviour! { $suite, capture::replay_success }
        $crate::behaviour! { $suite, capture::replay_failure }
        $crate::behaviour! { $suite, capture::unknown_and_destroyed_graphs }
        $crate::behaviour! { $suite, capture::refusals_while_recording }
        $crate::behaviour! { $suite, capture::recorded_buffers_wait_for_their_capture }
    };
}
