//! CUDA-specific behaviour on a real device. Without one each test prints
//! `skipped: no cuda device (...)` and returns; with `SCOPE_REQUIRE=cuda` it
//! fails instead.

mod common;

use common::{ACCUMULATE, ADD, COPY, FILL, bytes, client, kernel, words};
use scope_core::{Binding, Dispatch, Error, Kernel};

fn groups(n: u32) -> Dispatch<'static> {
    Dispatch::linear(n.div_ceil(64))
}

#[test]
fn a_million_element_add_matches_the_cpu() {
    let Some(c) = client() else { return };
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

#[test]
fn a_chain_with_a_failure_in_the_middle_reports_the_root() {
    let Some(c) = client() else { return };
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

#[test]
fn a_window_replayed_a_thousand_times_writes_its_recorded_bytes_each_time() {
    let Some(c) = client() else { return };
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

#[test]
fn indirect_dispatch_is_refused_inside_a_window_and_dooms_it() {
    let Some(c) = client() else { return };
    let out = c.try_allocate(256).unwrap();
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
}

#[test]
fn freed_memory_is_reused_by_the_pool() {
    let Some(c) = client() else { return };
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

#[test]
fn writes_and_reads_larger_than_the_staging_chunk_round_trip() {
    let Some(c) = client() else { return };
    let data: Vec<u8> = (0..(3 << 20) + 12)
        .map(|i: u32| (i * 7 + 1) as u8)
        .collect();
    let buffer = c.upload(&data).unwrap();
    assert_eq!(c.read(&buffer).unwrap(), data);
    // Many small writes in flight at once cycle the staging belt.
    let small = c.try_allocate(4096 * 64).unwrap();
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

#[test]
fn work_on_two_streams_is_ordered_by_the_buffers_they_share() {
    let Some(c) = client() else { return };
    let other = c.new_stream().unwrap();
    const N: u32 = 1 << 18;
    let a = c.try_allocate(u64::from(N) * 4).unwrap();
    let b = c.try_allocate(u64::from(N) * 4).unwrap();
    for round in 0..20u32 {
        c.launch(
            &kernel("fill", FILL),
            &[Binding::write(&a)],
            &bytes(&[N, round]),
            groups(N),
        )
        .unwrap();
        other
            .launch(
                &kernel("copy", COPY),
                &[Binding::read(&a), Binding::write(&b)],
                &N.to_le_bytes(),
                groups(N),
            )
            .unwrap();
        let got = words(&c.read(b.slice(0..16)).unwrap());
        assert_eq!(got, vec![round; 4], "round {round}");
    }
}

#[test]
fn ptx_kernels_load_and_a_rejected_ptx_carries_the_jit_log() {
    let Some(c) = client() else { return };
    let ptx = r#"
.version 7.0
.target sm_70
.address_size 64
.visible .entry seven(.param .u64 out) {
    .reg .b64 %rd<3>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r1, 7;
    st.global.u32 [%rd2], %r1;
    ret;
}
"#;
    let out = c.try_allocate(4).unwrap();
    c.launch(
        &Kernel::ptx("seven", ptx),
        &[Binding::write(&out)],
        &[],
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![7]);
    let bad = Kernel::ptx(
        "bad",
        ".version 7.0\n.target sm_70\n.visible .entry bad() { not_an_instruction; }",
    );
    let error = c.compile(&bad).unwrap_err();
    assert!(
        matches!(&error, Error::Compile { log, .. } if log.contains("CUDA_ERROR")),
        "{error}"
    );
}

#[test]
fn a_launch_that_does_not_match_the_kernel_signature_is_refused_before_it_runs() {
    let Some(c) = client() else { return };
    let out = c.try_allocate(256).unwrap();
    // `fill` takes a pointer and an 8-byte struct; pass a 4-byte blob.
    let error = c
        .launch(
            &kernel("fill", FILL),
            &[Binding::write(&out)],
            &64u32.to_le_bytes(),
            Dispatch::linear(1),
        )
        .unwrap_err();
    assert!(matches!(&error, Error::Launch { .. }), "{error}");
    assert!(
        c.read(&out).is_err(),
        "the refused launch claims its output"
    );
    assert!(c.poison().is_none());
}
