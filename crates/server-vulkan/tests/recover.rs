//! Recovery on Vulkan, for real where lavapipe allows it: the loss is
//! injected (the core's fault plan poisons the server; lavapipe cannot
//! lose a device on demand), but what `Client::recover` then asks of the
//! backend happens on the real driver — every object made on the device
//! and the `VkDevice` itself are destroyed, a new device is opened on the
//! same physical device, and work runs on it — under the validation layer,
//! which must stay silent throughout.

mod common;

use ash::vk::Handle;
use common::{add, bytes, copy, fill, step, words};
use scope_core::{Binding, Client, Dispatch, Error, FaultPlan, Recovered};
use server_vulkan::Vulkan;

fn scalars(values: &[u32]) -> Vec<u8> {
    bytes(values)
}

fn groups(n: u32) -> Dispatch<'static> {
    Dispatch::linear(n.div_ceil(64))
}

/// The raw `VkDevice` the backend has open now; `None` while it is closed.
/// A recovery destroys the lost device only once the new one is open, so
/// the two handles differ; a handle is a pointer, which the allocator may
/// hand out again once its device is gone.
fn device(c: &Client<Vulkan>) -> Option<u64> {
    c.with_backend(|b| b.raw().map(|raw| raw.device.handle().as_raw()))
}

/// `b`'s words, read on `c`'s stream.
fn read_words(c: &Client<Vulkan>, b: &scope_core::Buffer) -> scope_core::Result<Vec<u32>> {
    c.read(b).map(|bytes| words(&bytes))
}

/// Lose the device by an injected sticky fault at the next device call,
/// and make one: a launch on `victim`.
fn lose(c: &Client<Vulkan>, victim: &scope_core::Buffer) {
    c.inject(FaultPlan::new().poison_at(1, "injected", "DEVICE_LOST"));
    let n = (victim.size() / 4) as u32;
    let error = c
        .launch(
            &fill(),
            &[Binding::write(victim)],
            &scalars(&[n, 0xdead]),
            groups(n),
        )
        .unwrap_err();
    assert!(error.is_sticky(), "{error}");
    assert!(c.poison().is_some());
}

/// Recover, expecting the device to open again; the buffers and graphs it
/// reports.
fn reopen(c: &Client<Vulkan>) -> (usize, usize) {
    match c.recover() {
        Ok(Recovered::Reopened {
            buffers, graphs, ..
        }) => (buffers, graphs),
        other => panic!("the device should have opened again: {other:?}"),
    }
}

/// The validation layer said nothing so far (the backend's drop checks
/// again, for what comes after).
fn assert_silent(c: &Client<Vulkan>) {
    let messages = c.with_backend(|b| b.validation_messages());
    assert!(messages.is_empty(), "{messages:#?}");
}

/// Three `u32` workgroup counts at words 5..8 of a fresh buffer.
fn indirect_counts(c: &Client<Vulkan>, x: u32) -> scope_core::Buffer {
    c.upload(&bytes(&[0, 0, 0, 0, 0, x, 1, 1])).unwrap()
}

/// Everything a device holds before the loss — buffers on two streams, a
/// graph replayed, an indirect launch (whose guard pipeline is cached),
/// pooled frees deferred behind work still running — goes with it; a new
/// `VkDevice` is opened, and work on it gives the right numbers.
#[test]
fn a_recovery_destroys_the_device_and_work_runs_on_a_new_one() {
    let Some(c) = common::validating_or_skip() else {
        return;
    };
    let other = c.new_stream().unwrap();
    let described = c.describe();
    let n = 4096u32;
    let x0: Vec<u32> = (0..n).collect();
    let x = c.upload(&bytes(&x0)).unwrap();
    let y = other.try_allocate(u64::from(n) * 4).unwrap();
    let sum = c.try_allocate(u64::from(n) * 4).unwrap();
    let capture = c.begin_capture().unwrap();
    c.launch(
        &step(),
        &[Binding::read_write(&x)],
        &scalars(&[n]),
        groups(n),
    )
    .unwrap();
    let graph = c.end_capture(capture).unwrap();
    c.replay(&graph).unwrap();
    let counts = indirect_counts(&c, n.div_ceil(64));
    c.launch(
        &copy(),
        &[Binding::read(&x), Binding::write(&y)],
        &scalars(&[n]),
        Dispatch::Indirect(counts.slice(20..32)),
    )
    .unwrap();
    assert_eq!(
        words(&other.read(&y).unwrap()),
        x0.iter().map(|&v| v * 3 + 1).collect::<Vec<_>>()
    );
    // Work left running, and a free deferred behind it.
    for _ in 0..64 {
        c.launch(
            &step(),
            &[Binding::read_write(&x)],
            &scalars(&[n]),
            groups(n),
        )
        .unwrap();
    }
    let freed = c.try_allocate(1 << 20).unwrap();
    c.launch(
        &fill(),
        &[Binding::write(&freed)],
        &scalars(&[1 << 18, 5]),
        groups(1 << 18),
    )
    .unwrap();
    c.flush().unwrap();
    drop(freed);

    let before = device(&c).expect("the device is open");
    lose(&c, &sum);
    let (buffers, graphs) = reopen(&c);
    assert_eq!(buffers, 4, "x, y, sum and the counts are made again");
    assert_eq!(graphs, 1);
    let after = device(&c).expect("the device is open again");
    assert_ne!(before, after, "a new VkDevice");
    assert_eq!(c.describe(), described, "on the same physical device");
    assert_silent(&c);
    for buffer in [&x, &y, &sum, &counts] {
        assert!(c.read(buffer).unwrap_err().is_lost_with_device());
    }
    assert!(c.replay(&graph).unwrap_err().is_refusal());
    c.destroy_graph(&graph).unwrap();

    // The new device runs every kind of work, on both streams.
    let x1: Vec<u32> = (0..n).map(|i| i * 5).collect();
    c.write(&x, &bytes(&x1)).unwrap();
    c.write(&counts, &bytes(&[0, 0, 0, 0, 0, n.div_ceil(64), 1, 1]))
        .unwrap();
    let capture = c.begin_capture().unwrap();
    c.launch(
        &step(),
        &[Binding::read_write(&x)],
        &scalars(&[n]),
        groups(n),
    )
    .unwrap();
    let graph = c.end_capture(capture).unwrap();
    c.replay(&graph).unwrap();
    c.replay(&graph).unwrap();
    // An indirect launch may run nothing, so it heals nothing: `y` is
    // rewritten first.
    other.write(&y, &bytes(&vec![0; n as usize])).unwrap();
    other
        .launch(
            &copy(),
            &[Binding::read(&x), Binding::write(&y)],
            &scalars(&[n]),
            Dispatch::Indirect(counts.slice(20..32)),
        )
        .unwrap();
    c.launch(
        &add(),
        &[Binding::read(&x), Binding::read(&y), Binding::write(&sum)],
        &scalars(&[n]),
        groups(n),
    )
    .unwrap();
    let stepped: Vec<u32> = x1.iter().map(|&v| (v * 3 + 1) * 3 + 1).collect();
    assert_eq!(words(&other.read(&y).unwrap()), stepped);
    assert_eq!(
        words(&c.read(&sum).unwrap()),
        stepped.iter().map(|v| v * 2).collect::<Vec<_>>()
    );
    c.destroy_graph(&graph).unwrap();
    c.audit().unwrap();
    assert_silent(&c);
}

/// With device memory that is not host-visible, writes and reads take the
/// staging path — staging chunks in every stream's arena, large ones of
/// their own size — and after a recovery they take it again on the new
/// device.
#[test]
fn a_recovery_with_staged_memory() {
    let Some(c) = common::validating_staged_or_skip() else {
        return;
    };
    let n = 300_000u32; // 1.2 MB: staged in a chunk of its own
    let data: Vec<u32> = (0..n).map(|i| i ^ 0x5a5a).collect();
    let big = c.upload(&bytes(&data)).unwrap();
    assert_eq!(words(&c.read(&big).unwrap()), data);
    let small = c.upload(&bytes(&[7; 64])).unwrap();
    let before = device(&c).expect("the device is open");
    lose(&c, &small);
    assert_eq!(reopen(&c).0, 2);
    assert_ne!(before, device(&c).expect("open again"), "a new VkDevice");
    assert_silent(&c);
    assert!(c.read(&big).unwrap_err().is_lost_with_device());
    let again: Vec<u32> = data.iter().map(|v| v.wrapping_mul(7)).collect();
    c.write(&big, &bytes(&again)).unwrap();
    assert_eq!(words(&c.read(&big).unwrap()), again);
    let out = c.try_allocate(u64::from(n) * 4).unwrap();
    c.launch(
        &add(),
        &[
            Binding::read(&big),
            Binding::read(&big),
            Binding::write(&out),
        ],
        &scalars(&[n]),
        groups(n),
    )
    .unwrap();
    assert_eq!(
        words(&c.read(&out).unwrap()),
        again.iter().map(|v| v.wrapping_mul(2)).collect::<Vec<_>>()
    );
    c.write(&small, &bytes(&[9; 64])).unwrap();
    assert_eq!(words(&c.read(&small).unwrap()), vec![9; 64]);
    c.audit().unwrap();
    assert_silent(&c);
}

/// A recovery that destroyed the lost device and then failed — opening
/// the new one (`at` 0), or giving a stream its state on it (`at` 2, the
/// second of two streams, after the first got its own) — leaves the
/// backend closed and the client poisoned; the next recovery opens it.
fn a_recovery_that_fails_leaves_it_closed(at: usize) {
    let Some(c) = common::validating_or_skip() else {
        return;
    };
    let other = c.new_stream().unwrap();
    let a = c.upload(&bytes(&[1; 256])).unwrap();
    lose(&c, &a);
    // SAFETY: it sets where the next recovery fails; it creates and
    // destroys nothing the core tracks.
    unsafe { c.with_backend_mut(|b| b.fail_next_reopen(at)) }.unwrap();
    let failed = c.recover().unwrap_err();
    assert!(
        matches!(failed, Error::BackendUnavailable { .. })
            && failed.to_string().contains("injected"),
        "{failed}"
    );
    assert!(c.poison().is_some(), "still poisoned");
    assert_eq!(device(&c), None, "the device is closed");
    assert_eq!(c.with_backend(scope_core::Backend::bytes_reserved), 0);
    assert!(c.allocate(64).unwrap_err().is_device_poisoned());
    assert!(other.read(&a).unwrap_err().is_device_poisoned());
    assert_silent(&c);
    assert_eq!(reopen(&c).0, 1);
    // No handle to compare: the lost device was destroyed with the failed
    // recovery, so the allocator may give the new one its address.
    assert!(device(&c).is_some(), "open again");
    assert!(c.read(&a).unwrap_err().is_lost_with_device());
    other
        .launch(
            &fill(),
            &[Binding::write(&a)],
            &scalars(&[256, 4]),
            groups(256),
        )
        .unwrap();
    assert_eq!(words(&c.read(&a).unwrap()), vec![4; 256]);
    c.audit().unwrap();
    assert_silent(&c);
}

#[test]
fn a_recovery_that_cannot_open_the_device_leaves_it_closed_until_the_next() {
    a_recovery_that_fails_leaves_it_closed(0);
}

#[test]
fn a_recovery_that_fails_on_a_stream_closes_the_new_device_again() {
    a_recovery_that_fails_leaves_it_closed(2);
}

/// A client whose recovery failed can be dropped with the device closed:
/// nothing is destroyed twice, and the layer stays silent.
#[test]
fn a_client_dropped_while_its_device_is_closed() {
    let Some(c) = common::validating_or_skip() else {
        return;
    };
    let _other = c.new_stream().unwrap();
    let a = c.upload(&bytes(&[1; 64])).unwrap();
    lose(&c, &a);
    // SAFETY: as above: nothing the core tracks is touched.
    unsafe { c.with_backend_mut(|b| b.fail_next_reopen(0)) }.unwrap();
    assert!(c.recover().is_err());
    assert_eq!(device(&c), None);
    assert_silent(&c);
}

/// Threads reading while another recovers never read the new device's
/// memory as the buffer's bytes. A read copies when it ends, under the
/// lock again; it must hold a recovery off from its start (the backend
/// gives every read a waiter, which the core counts), or a recovery in
/// between leaves it copying memory that nothing wrote. Twenty rounds:
/// without the waiter, about one in forty read zeros as clean.
#[test]
fn reads_on_other_threads_never_take_the_new_devices_memory_for_their_bytes() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const WORDS: u32 = 256;
    let fill_with = |c: &Client<Vulkan>, b: &scope_core::Buffer, value: u32| {
        c.launch(
            &fill(),
            &[Binding::write(b)],
            &scalars(&[WORDS, value]),
            groups(WORDS),
        )
    };
    for round in 0..20 {
        let Some(c) = common::validating_or_skip() else {
            return;
        };
        let a = c.try_allocate(u64::from(WORDS) * 4).unwrap();
        fill_with(&c, &a, 9).unwrap();
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            for _ in 0..3 {
                let reader = c.new_stream().unwrap();
                let (a, stop) = (&a, &stop);
                scope.spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        match read_words(&reader, a) {
                            Ok(words) => assert!(
                                words == vec![9; WORDS as usize]
                                    || words == vec![10; WORDS as usize],
                                "round {round}: a clean read of bytes no write wrote: {:?}",
                                &words[..8]
                            ),
                            // The injected loss may meet a reader's call
                            // first.
                            Err(error) => assert!(
                                error.is_device_poisoned()
                                    || error.is_lost_with_device()
                                    || error.is_sticky(),
                                "{error}"
                            ),
                        }
                    }
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            c.inject(FaultPlan::new().poison_at(1, "injected", "DEVICE_LOST"));
            let _ = fill_with(&c, &a, 0xdead);
            let recovered = c.recover();
            let refilled = match recovered {
                Ok(Recovered::Reopened { .. }) => fill_with(&c, &a, 10),
                _ => Ok(()),
            };
            std::thread::sleep(std::time::Duration::from_millis(10));
            // Stopped before any assertion here, which would otherwise
            // leave the readers running and the scope waiting for them.
            stop.store(true, Ordering::Release);
            assert!(
                matches!(recovered, Ok(Recovered::Reopened { .. })),
                "{recovered:?}"
            );
            refilled.unwrap();
        });
        assert_eq!(read_words(&c, &a).unwrap(), vec![10; WORDS as usize]);
        assert_silent(&c);
    }
}
