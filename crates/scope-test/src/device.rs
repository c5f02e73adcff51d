//! The device as a whole (rules 7, 23, 28, 36, 39). Allocations fail and leave it working, and
//! sticky faults poison it. The failure hook, several streams, and a store that empties when every
//! buffer is gone.

use super::*;

/// A failed allocation's buffer carries its error, and launches reading it skip. The device keeps
/// working (rules 17, 28, 37).
pub fn failed_allocation_keeps_device_working<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let oom = || Error::OutOfMemory {
        backend: "injected",
        requested: 1024,
        detail: "injected".into(),
    };
    // Two failures: the server retries once after trimming its caches.
    c.inject(
        FaultPlan::new()
            .fail(Site::Allocate, 1, oom())
            .fail(Site::Allocate, 2, oom()),
    );
    let lost = c.allocate(1024).unwrap();
    assert!(read(&c, &lost).unwrap_err().is_out_of_memory());
    let out = alloc(&c, WORDS);
    assert!(matches!(
        copy::<S>(&c, &lost, &out),
        Err(Error::Skipped { .. })
    ));
    assert!(read(&c, &out).unwrap_err().is_out_of_memory());
    // One failure: the retry succeeds.
    c.inject(FaultPlan::new().fail(Site::Allocate, 1, oom()));
    let retried = c.try_allocate(1024).unwrap();
    fill::<S>(&c, &retried, 4).unwrap();
    assert_eq!(read(&c, &retried).unwrap(), vec![4; 256]);
    if let Some(size) = S::oversized() {
        let huge = c.allocate(size).unwrap();
        assert!(c.read(huge.slice(0..4)).unwrap_err().is_out_of_memory());
        assert!(c.try_allocate(size).unwrap_err().is_out_of_memory());
    }
    let fine = alloc(&c, WORDS);
    fill::<S>(&c, &fine, 9).unwrap();
    assert_eq!(read(&c, &fine).unwrap(), vec![9; WORDS as usize]);
    drop((lost, out));
    assert_eq!(
        c.failures_held(),
        0,
        "freeing the carriers empties the store"
    );
}

/// A sticky fault poisons the device: every later operation fails fast naming it. Work in flight
/// carries it (rule 36).
pub fn sticky_fault_poisons<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let early = alloc(&c, WORDS);
    let victim = alloc(&c, WORDS);
    fill::<S>(&c, &early, 1).unwrap();
    c.inject(FaultPlan::new().poison_at(1, "injected", "ILLEGAL_ADDRESS"));
    let error = fill::<S>(&c, &victim, 2).unwrap_err();
    assert!(error.is_sticky(), "{error}");
    assert!(c.poison().is_some());
    let later = c.allocate(64).unwrap_err();
    assert!(later.is_device_poisoned(), "{later}");
    assert!(later.to_string().contains("ILLEGAL_ADDRESS"), "{later}");
    assert!(c.read(&early).unwrap_err().is_device_poisoned());
    assert!(c.sync().unwrap_err().is_device_poisoned());
    // Work in flight when the fault surfaced carries the poison, seen through the report's chain.
    let in_flight = c.check(&[early.all()]).unwrap_err();
    assert!(in_flight.is_device_poisoned(), "{in_flight}");
}

/// The failure hook fires on every skip and failure, never on success (rule 39).
pub fn failure_hook_fires_on_skip_and_failure_only<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = seen.clone();
    c.on_failure(move |_, error| sink.lock().push(error.to_string()));
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    fill::<S>(&c, &a, 1).unwrap();
    copy::<S>(&c, &a, &b).unwrap();
    assert!(seen.lock().is_empty(), "success is silent");
    let before = c.failures_seen();
    fail_next_launch(&c, "candidate");
    assert!(fill::<S>(&c, &a, 2).is_err());
    assert!(copy::<S>(&c, &a, &b).is_err());
    let seen = seen.lock();
    assert_eq!(seen.len(), 2);
    assert!(
        seen[0].contains("candidate") && seen[1].contains("candidate"),
        "{seen:?}"
    );
    assert_eq!(
        c.failures_seen(),
        before + 2,
        "a measurement in flight sees both"
    );
}

/// Several streams: ordered across streams, and a failure raised on one is seen from another (rules
/// 22, 40).
pub fn several_streams<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let s1 = c.new_stream().unwrap();
    let s2 = c.new_stream().unwrap();
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    let sum = alloc(&c, WORDS);
    fill::<S>(&c, &a, 2).unwrap();
    copy::<S>(&s1, &a, &b).unwrap();
    add::<S>(&s2, &a, &b, &sum).unwrap();
    assert_eq!(read(&c, &sum).unwrap(), vec![4; WORDS as usize]);
    assert_eq!(read(&s1, &sum).unwrap(), vec![4; WORDS as usize]);
    fail_next_launch(&s1, "on-stream-1");
    assert!(fill::<S>(&s1, &a, 7).is_err());
    assert_root_contains(&read(&s2, &a).unwrap_err(), "on-stream-1");
    assert!(matches!(copy::<S>(&s2, &a, &b), Err(Error::Skipped { .. })));
    s1.sync().unwrap();
    s2.sync().unwrap();
}

/// Freeing every buffer empties the store, whatever failed (rules 7, 13).
pub fn freeing_everything_empties_the_store<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let mut buffers: Vec<Buffer> = (0..6).map(|_| alloc(&c, WORDS)).collect();
    fail_next_launch(&c, "one");
    assert!(fill::<S>(&c, &buffers[0], 1).is_err());
    for i in 1..buffers.len() {
        let _ = copy::<S>(&c, &buffers[i - 1], &buffers[i]);
    }
    fail_next_launch(&c, "two");
    assert!(fill::<S>(&c, &buffers[3], 1).is_err());
    assert!(c.failures_held() <= c.failure_claims(), "rule 7 bound");
    c.audit().unwrap();
    assert!(c.failures_held() >= 1);
    buffers.clear();
    assert_eq!(c.failures_held(), 0);
    assert_eq!(c.bytes_allocated(), 0);
}

/// The device behaviours: one `#[test]` each for `$suite`, with what each needs.
#[macro_export]
macro_rules! device_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, device::failed_allocation_keeps_device_working }
        $crate::behaviour! { $suite, device::sticky_fault_poisons }
        $crate::behaviour! { $suite, device::failure_hook_fires_on_skip_and_failure_only }
        $crate::behaviour! { $suite, device::several_streams }
        $crate::behaviour! { $suite, device::freeing_everything_empties_the_store }
    };
}
