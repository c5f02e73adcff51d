//! The caller's arguments (rules 16, 38). Bad input is a typed error that claims nothing.
//! Dispatches that run nothing, or read their counts from the device, behave as the contract says.

use super::*;

/// Bad input is a typed error naming what was wrong. Nothing panics and nothing already written is
/// lost.
pub fn bad_input_is_typed<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let buf = upload(&c, &[11; 64]);
    let out = alloc(&c, 64);
    let invalid = |r: Result<()>| match r {
        Err(Error::InvalidArgument { .. }) => {}
        other => panic!("expected an invalid argument, got {other:?}"),
    };
    // A binding past the end of its buffer.
    invalid(launch::<S>(
        &c,
        &S::fill(),
        &[buf.slice(0..512).write()],
        &[128, 0],
        groups(128),
    ));
    // Zero and overflowing sizes.
    invalid(c.allocate(0).map(drop));
    invalid(c.write(buf.slice(u64::MAX - 3..u64::MAX), &[0; 4]));
    invalid(c.read(buf.slice(8..8)).map(drop));
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = buf.slice(16..8);
    invalid(c.read(reversed).map(drop));
    invalid(c.write(buf.slice(0..8), &[0; 4]));
    invalid(c.write(buf.slice(2..6), &[0; 4]));
    invalid(c.copy(buf.slice(0..16), out.slice(0..8)));
    // A handle from another server.
    if let Some(other) = setup::<S>() {
        let foreign = alloc(&other, 64);
        invalid(copy::<S>(&c, &foreign, &out));
        invalid(c.read(&foreign).map(drop));
        invalid(c.free(&foreign));
    }
    // A freed handle.
    let freed = alloc(&c, 64);
    let stale = freed.clone();
    c.free(&freed).unwrap();
    invalid(c.read(&stale).map(drop));
    invalid(fill::<S>(&c, &stale, 1));
    invalid(c.free(&stale));
    // Nothing was lost, nothing was claimed.
    assert_eq!(read(&c, &buf).unwrap(), vec![11; 64]);
    assert_eq!(c.failures_held(), 0);
}

/// A launch that runs no workgroup writes nothing and heals nothing (rules 17, 19). An indirect
/// launch heals nothing, since its count is on the device. An indirect count joins the read set.
pub fn zero_and_indirect_dispatch<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let out = alloc(&c, WORDS);
    fail_next_launch(&c, "stale");
    assert!(fill::<S>(&c, &out, 1).is_err());
    let n = WORDS;
    launch::<S>(
        &c,
        &S::fill(),
        &[Binding::write(&out)],
        &[n, 5],
        Dispatch::Groups([0, 1, 1]),
    )
    .unwrap();
    assert!(read(&c, &out).is_err(), "a zero dispatch heals nothing");
    // A device-side count is unknown when the launch concludes, so an indirect launch heals
    // nothing. A zero count would leave the stale bytes, which nobody wrote.
    let zero = upload(&c, &[0, 1, 1]);
    launch::<S>(
        &c,
        &S::fill(),
        &[Binding::write(&out)],
        &[n, 5],
        Dispatch::Indirect(zero.all()),
    )
    .unwrap();
    assert_root_contains(&read(&c, &out).unwrap_err(), "stale");
    let counts = upload(&c, &[n.div_ceil(64), 1, 1]);
    launch::<S>(
        &c,
        &S::fill(),
        &[Binding::write(&out)],
        &[n, 5],
        Dispatch::Indirect(counts.all()),
    )
    .unwrap();
    assert_root_contains(&read(&c, &out).unwrap_err(), "stale");
    // Clean bytes it may write: they read as the kernel left them.
    c.write(&out, &as_bytes(&[0; WORDS as usize])).unwrap();
    launch::<S>(
        &c,
        &S::fill(),
        &[Binding::write(&out)],
        &[n, 5],
        Dispatch::Indirect(counts.all()),
    )
    .unwrap();
    assert_eq!(read(&c, &out).unwrap(), vec![5; WORDS as usize]);
    launch::<S>(
        &c,
        &S::fill(),
        &[Binding::write(&out)],
        &[n, 7],
        Dispatch::Indirect(zero.all()),
    )
    .unwrap();
    assert_eq!(
        read(&c, &out).unwrap(),
        vec![5; WORDS as usize],
        "a zero count leaves clean bytes as they were"
    );
    fail_next_launch(&c, "count");
    assert!(fill::<S>(&c, &counts, 0).is_err());
    let skipped = launch::<S>(
        &c,
        &S::fill(),
        &[Binding::write(&out)],
        &[n, 6],
        Dispatch::Indirect(counts.all()),
    );
    assert!(matches!(skipped, Err(Error::Skipped { .. })), "{skipped:?}");
    assert_root_contains(&read(&c, &out).unwrap_err(), "count");
}

/// The input behaviours: one `#[test]` each for `$suite`, with what each needs.
#[macro_export]
macro_rules! input_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, input::bad_input_is_typed }
        $crate::behaviour! { $suite, input::zero_and_indirect_dispatch }
    };
}
