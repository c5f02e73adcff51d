//! How a failure travels with the bytes (rules 15–22, 24–27). Clean work computes, and a failed
//! launch's outputs carry its error. Work that reads them is skipped and its outputs point at the
//! root. A rewrite heals, and chains that share no buffer never meet.

use super::*;

/// Clean work computes the right numbers and leaves nothing held (rules 15, 16, 19).
pub fn clean_work_computes<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    let sum = alloc(&c, WORDS);
    fill::<S>(&c, &a, 3).unwrap();
    copy::<S>(&c, &a, &b).unwrap();
    add::<S>(&c, &a, &b, &sum).unwrap();
    assert_eq!(read(&c, &sum).unwrap(), vec![6; WORDS as usize]);
    assert_eq!(
        c.failures_held(),
        0,
        "the success path leaves no failure behind"
    );
}

/// A read three skips downstream of a failure names the root and every hop, newest first (rules 17,
/// 18, 25, 26).
pub fn chain_report_over_three_hops<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    let d = alloc(&c, WORDS);
    let x = upload(&c, &vec![1; WORDS as usize]);
    let out = alloc(&c, WORDS);
    fail_next_launch(&c, "root-fill");
    assert!(fill::<S>(&c, &a, 1).is_err());
    assert!(matches!(copy::<S>(&c, &a, &b), Err(Error::Skipped { .. })));
    assert!(matches!(copy::<S>(&c, &b, &d), Err(Error::Skipped { .. })));
    assert!(matches!(
        add::<S>(&c, &x, &d, &out),
        Err(Error::Skipped { .. })
    ));
    let error = read(&c, &out).unwrap_err();
    let report = &error.unwritten()[0];
    assert_root_contains(&error, "root-fill");
    let kernels: Vec<_> = report
        .chain
        .hops
        .iter()
        .map(|h| h.kernel.to_string())
        .collect();
    assert_eq!(
        kernels,
        vec![
            S::add().name().to_string(),
            S::copy().name().to_string(),
            S::copy().name().to_string()
        ]
    );
    assert_eq!(report.chain.hops[0].needed.buffer, d.id());
    assert_eq!(report.chain.hops[1].needed.buffer, b.id());
    assert_eq!(report.chain.hops[2].needed.buffer, a.id());
    assert_eq!(report.carriers, 4, "a, b, d and out carry the one failure");
    let text = error.to_string();
    assert!(
        text.contains(&format!("{}", a.id())) && text.contains("root-fill"),
        "{text}"
    );
    // The same failure, not a new one per hop.
    let from_b = read(&c, &b).unwrap_err();
    assert_eq!(from_b.unwritten()[0].failure, report.failure);
}

/// A skipped launch never runs: a sentinel it would overwrite survives (rules 17, 18).
pub fn skipped_launch_never_runs<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let bad = alloc(&c, WORDS);
    let out = upload(&c, &vec![0xdead_beef; WORDS as usize]);
    fail_next_launch(&c, "poisoned-input");
    assert!(fill::<S>(&c, &bad, 1).is_err());
    let outcome = copy::<S>(&c, &bad, &out);
    assert!(matches!(outcome, Err(Error::Skipped { .. })), "{outcome:?}");
    assert!(
        read(&c, &out).is_err(),
        "the skipped launch's output carries the failure"
    );
    let under = as_words(&c.peek(&out).unwrap());
    assert_eq!(
        under,
        vec![0xdead_beef; WORDS as usize],
        "the body never ran"
    );
}

/// A failed write over part of a buffer claims only that part (rules 8, 11, 12, 19, 27). Rewrites
/// heal exactly what they cover, and reads never clear.
pub fn partial_writes_and_healing<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let buf = upload(&c, &vec![5; WORDS as usize]);
    let half = u64::from(WORDS) * 2;
    fail_next_launch(&c, "half");
    let n = WORDS / 2;
    assert!(
        launch::<S>(
            &c,
            &S::fill(),
            &[buf.slice(0..half).write()],
            &[n, 9],
            groups(n)
        )
        .is_err()
    );
    assert!(c.read(buf.slice(0..half)).is_err());
    assert!(c.read(buf.slice(0..4)).is_err());
    assert_eq!(
        as_words(&c.read(buf.slice(half..)).unwrap()),
        vec![5; n as usize]
    );
    assert!(
        c.read(buf.slice(0..half)).is_err(),
        "a read never clears a failure"
    );
    c.write(buf.slice(0..64), &[7; 64]).unwrap();
    assert!(c.read(buf.slice(0..64)).is_ok());
    assert!(
        c.read(buf.slice(64..half)).is_err(),
        "the rest is still unwritten"
    );
    assert!(
        c.read(buf.slice(60..68)).is_err(),
        "a straddling read fails"
    );
    c.write(buf.slice(64..half), &vec![7; (half - 64) as usize])
        .unwrap();
    assert!(read(&c, &buf).is_ok());
    assert_eq!(c.failures_held(), 0, "healing released the failure");
}

/// Two chains that share no buffer never affect each other, even on one stream (rule 40).
pub fn independent_chains_never_interfere<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let (a1, a2) = (alloc(&c, WORDS), alloc(&c, WORDS));
    let (b1, b2) = (alloc(&c, WORDS), alloc(&c, WORDS));
    fill::<S>(&c, &b1, 3).unwrap();
    fail_next_launch(&c, "chain-a");
    assert!(fill::<S>(&c, &a1, 1).is_err());
    copy::<S>(&c, &b1, &b2).unwrap();
    assert!(copy::<S>(&c, &a1, &a2).is_err());
    assert_eq!(read(&c, &b2).unwrap(), vec![3; WORDS as usize]);
    assert!(read(&c, &a2).is_err());
}

/// Each distinct failure a read meets is named once, in the order found (rule 25).
pub fn several_failures_named_once_each<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let buf = alloc(&c, WORDS);
    let half = u64::from(WORDS) * 2;
    let n = WORDS / 2;
    fail_next_launch(&c, "first-half");
    assert!(
        launch::<S>(
            &c,
            &S::fill(),
            &[buf.slice(0..half).write()],
            &[n, 1],
            groups(n)
        )
        .is_err()
    );
    fail_next_launch(&c, "second-half");
    assert!(
        launch::<S>(
            &c,
            &S::fill(),
            &[buf.slice(half..).write()],
            &[n, 1],
            groups(n)
        )
        .is_err()
    );
    let error = read(&c, &buf).unwrap_err();
    let entries = error.unwritten();
    assert_eq!(entries.len(), 2, "{error}");
    assert!(entries[0].root.to_string().contains("first-half"));
    assert!(entries[1].root.to_string().contains("second-half"));
    assert!(matches!(error, Error::SeveralUnwritten(_)));
}

/// A kernel that does not compile claims its outputs with the compiler's log (rule 21).
pub fn compile_error_claims_outputs<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let input = upload(&c, &[1; 64]);
    let out = upload(&c, &[2; 64]);
    let error = launch::<S>(
        &c,
        &S::broken(),
        &[Binding::read(&input), Binding::write(&out)],
        &[64],
        groups(64),
    )
    .unwrap_err();
    assert!(matches!(error, Error::Compile { .. }), "{error}");
    let on_read = read(&c, &out).unwrap_err();
    assert!(
        matches!(&*on_read.unwritten()[0].root, Error::Compile { .. }),
        "{on_read}"
    );
    assert_eq!(
        read(&c, &input).unwrap(),
        vec![1; 64],
        "inputs are untouched"
    );
    assert!(c.compile(&S::broken()).is_err());
    assert!(c.compile(&S::fill()).is_ok());
}

/// A buffer bound for reading and writing is in both sets (rules 16, 17). Tainted, it skips; clean,
/// it runs and heals.
pub fn read_write_binding_is_in_both_sets<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let buf = alloc(&c, WORDS);
    fail_next_launch(&c, "rw");
    assert!(fill::<S>(&c, &buf, 1).is_err());
    let n = WORDS;
    let rw = launch::<S>(
        &c,
        &S::fill(),
        &[Binding::read_write(&buf)],
        &[n, 2],
        groups(n),
    );
    assert!(matches!(rw, Err(Error::Skipped { .. })), "{rw:?}");
    c.write(&buf, &as_bytes(&vec![0; WORDS as usize])).unwrap();
    launch::<S>(
        &c,
        &S::fill(),
        &[Binding::read_write(&buf)],
        &[n, 2],
        groups(n),
    )
    .unwrap();
    assert_eq!(read(&c, &buf).unwrap(), vec![2; WORDS as usize]);
}

/// The dataflow behaviours: one `#[test]` each for `$suite`, with what each needs.
#[macro_export]
macro_rules! dataflow_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, dataflow::clean_work_computes }
        $crate::behaviour! { $suite, dataflow::chain_report_over_three_hops }
        $crate::behaviour! { $suite, dataflow::skipped_launch_never_runs }
        $crate::behaviour! { $suite, dataflow::partial_writes_and_healing }
        $crate::behaviour! { $suite, dataflow::independent_chains_never_interfere }
        $crate::behaviour! { $suite, dataflow::several_failures_named_once_each }
        $crate::behaviour! { $suite, dataflow::compile_error_claims_outputs }
        $crate::behaviour! { $suite, dataflow::read_write_binding_is_in_both_sets }
    };
}
