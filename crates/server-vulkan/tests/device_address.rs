//! The device-address interface on its own, without cubecl: a SPIR-V module
//! that reaches its buffers through a push-constant block of buffer device
//! addresses, as cubecl's compiler emits them.
//!
//! `fixtures/cube_fill.spv` is what `scope-cube` produced (cubecl 0.12.0-pre.1,
//! debug info off, unchecked) for
//!
//! ```text
//! #[cube(launch)]
//! fn fill(out: &mut [u32], params: &[u32]) {
//!     if (ABSOLUTE_POS as u32) < params[0] { out[ABSOLUTE_POS] = params[1]; }
//! }
//! ```
//!
//! with the buffer-length table dropped, so its push-constant block holds
//! two addresses: `out`'s, then the scalar blob's (`[n, value]`).

mod common;

use common::{bytes, validating_or_skip, words};
use scope_core::{Binding, Dispatch, Error, FaultPlan, Kernel, Site, StreamId};

const ENTRY: &str = "fill_6aceb640";

fn fill() -> Kernel {
    let raw = include_bytes!("fixtures/cube_fill.spv");
    let words: Vec<u32> = raw
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    // SAFETY: scope-cube's output for a `#[cube]` fill, compiled
    // bounds-checked (`ExecutionMode::Checked`): every access is checked
    // against the length in the blob, and the launches here pass each
    // binding's own length.
    unsafe { Kernel::spirv("cube_fill", words) }.entry(ENTRY)
}

/// The addresses of a binding (at an offset) and of the blob reach the
/// kernel; nothing outside the binding is written; the validation layer
/// says nothing.
#[test]
fn a_device_address_kernel_writes_its_binding() {
    let Some(c) = validating_or_skip() else {
        return;
    };
    let buffer = c.upload(&bytes(&vec![1; 512])).unwrap();
    // Words 256.. of the buffer, 200 of them written: the offset is added
    // to the address, and `n` stops short of the binding's end.
    let window = buffer.slice(1024..2048);
    c.launch(
        &fill(),
        &[window.write()],
        &bytes(&[200, 0xabcd]),
        Dispatch::linear(4),
    )
    .unwrap();
    let got = words(&c.read(&buffer).unwrap());
    assert!(got[..256].iter().all(|&w| w == 1), "before the binding");
    assert!(got[256..456].iter().all(|&w| w == 0xabcd), "the binding");
    assert!(got[456..].iter().all(|&w| w == 1), "past n");
}

/// The same failure model as a descriptor launch: the binding is the
/// write set, a failed launch claims it, a downstream reader is skipped,
/// and a rewrite through the address kernel heals it.
#[test]
fn the_failure_model_holds_for_address_kernels() {
    let Some(c) = validating_or_skip() else {
        return;
    };
    let out = c.try_allocate(256 * 4).unwrap();
    let copy = common::copy();
    let dst = c.try_allocate(256 * 4).unwrap();
    c.inject(FaultPlan::new().fail(
        Site::Launch,
        1,
        Error::Launch {
            kernel: "cube_fill".into(),
            stream: StreamId(0),
            detail: "injected".into(),
        },
    ));
    let fill_out = |value: u32| {
        c.launch(
            &fill(),
            &[Binding::write(&out)],
            &bytes(&[256, value]),
            Dispatch::linear(4),
        )
    };
    assert!(fill_out(3).is_err());
    let skipped = c.launch(
        &copy,
        &[Binding::read(&out), Binding::write(&dst)],
        &bytes(&[256]),
        Dispatch::linear(4),
    );
    assert!(matches!(skipped, Err(Error::Skipped { .. })), "{skipped:?}");
    assert!(
        c.read(&dst).is_err(),
        "the skip's output carries the failure"
    );
    fill_out(4).unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![4; 256], "healed");
    assert_eq!(c.failures_held(), 1, "only dst still carries it");
}

/// A launch that gives the wrong number of addresses is refused before it
/// is recorded.
#[test]
fn the_address_count_must_match_the_block() {
    let Some(c) = validating_or_skip() else {
        return;
    };
    let a = c.try_allocate(256).unwrap();
    let b = c.try_allocate(256).unwrap();
    let error = c
        .launch(
            &fill(),
            &[Binding::write(&a), Binding::write(&b)],
            &bytes(&[64, 1]),
            Dispatch::linear(1),
        )
        .unwrap_err();
    assert!(
        error.to_string().contains("takes 2 buffer addresses"),
        "{error}"
    );
    let error = c
        .launch(&fill(), &[Binding::write(&a)], &[], Dispatch::linear(1))
        .unwrap_err();
    assert!(error.to_string().contains("binds 1"), "{error}");
}

/// An entry point the module does not have is a compile error, found
/// before the driver sees it (for it, a missing entry point is undefined
/// behaviour).
#[test]
fn a_missing_entry_point_is_a_compile_error() {
    let Some(c) = validating_or_skip() else {
        return;
    };
    let error = c.compile(&fill().entry("main")).unwrap_err();
    assert!(
        matches!(&error, Error::Compile { log, .. } if log.contains("no entry point `main`") && log.contains(ENTRY)),
        "{error}"
    );
    c.compile(&fill()).unwrap();
}
