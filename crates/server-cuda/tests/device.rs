//! CUDA-specific behaviour on a real device. Without one each test prints
//! `skipped: no cuda device (...)` and returns; with `SCOPE_REQUIRE=cuda` it
//! fails instead. Most bodies live in `common/cases.rs`, shared with the
//! mock-driver tests (`mock.rs`).

#[macro_use]
mod common;

use common::{cases, client, words};
use scope_core::{Binding, Dispatch, Error, Kernel};

/// One `#[test]` per shared case, on the real device.
macro_rules! on_the_device {
    ($($case:ident),* $(,)?) => {$(
        #[test]
        fn $case() {
            let Some(c) = client() else { return };
            cases::$case(&c);
        }
    )*};
}

with_every_case!(on_the_device);

/// Real PTX (written for `sm_70`, JIT-compiled for the device) loads and
/// runs; a PTX the JIT rejects is a compile error carrying the driver's
/// code.
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
        // SAFETY: it writes one word through its one parameter, and the
        // launch binds one word.
        &unsafe { Kernel::ptx("seven", ptx) },
        &[Binding::write(&out)],
        &[],
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![7]);
    // SAFETY: it does not assemble, so it never runs.
    let bad = unsafe {
        Kernel::ptx(
            "bad",
            ".version 7.0\n.target sm_70\n.visible .entry bad() { not_an_instruction; }",
        )
    };
    let error = c.compile(&bad).unwrap_err();
    assert!(
        matches!(&error, Error::Compile { log, .. } if log.contains("CUDA_ERROR")),
        "{error}"
    );
}
