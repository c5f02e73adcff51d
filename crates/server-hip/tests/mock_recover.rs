//! A device the mock HIP runtime really broke, recovered as the server's
//! `reopen.rs` says (rule 52): a sticky fault that is not process-fatal
//! (an uncorrectable ECC error, which the mock's `scope_ecc` kernel leaves
//! on its device) is reset with `hipDeviceReset` and the client comes back
//! with every handle; the reset is refused while another client of the
//! process holds the device; an illegal address, which HIP treats as CUDA's
//! documentation does, is refused with `Error::RestartRequired`.
//!
//! One test, its steps in order, in a binary of its own: a reset acts on
//! the whole process's device. A loss the runtime never saw — one injected
//! at a fault site — is the conformance suite's (`recover_tests!` in `mock.rs`).
//! None of this is AMD hardware.

#[macro_use]
mod common;

use common::{mock_library, scalars, words};
use scope_core::{Binding, Client, Dispatch, Error, Kernel, Recovered};
use server_hip::Hip;

fn client_on(ordinal: usize) -> Client<Hip> {
    let path = vec![mock_library()];
    server_hip::client_from(&path, &path, ordinal).expect("the mock HIP runtime loads")
}

/// The mock's kernel `entry`, which faults with the sticky code it names.
fn faulting(entry: &str) -> Kernel {
    let source =
        format!(r#"extern "C" __global__ void {entry}(unsigned int* out) {{ __builtin_trap(); }}"#);
    // SAFETY: it touches no memory: it faults.
    unsafe { Kernel::hip(entry, source.as_str()) }
        .entry(entry)
        .block([64, 1, 1])
}

/// Launch the faulting `entry` and surface its sticky fault: the client is
/// poisoned by the runtime's own error.
fn break_device(c: &Client<Hip>, entry: &str, name: &str) -> Error {
    let out = c.allocate(256).unwrap();
    c.launch(
        &faulting(entry),
        &[Binding::write(&out)],
        &[],
        Dispatch::linear(1),
    )
    .unwrap();
    let error = c.sync().unwrap_err();
    assert!(error.is_sticky(), "{error}");
    assert!(error.to_string().contains(name), "{error}");
    assert!(c.poison().is_some());
    error
}

fn fill(c: &Client<Hip>, out: &scope_core::Buffer, value: u32) {
    c.launch(
        &common::fill(),
        &[Binding::write(out)],
        &scalars(&[16, value]),
        Dispatch::linear(1),
    )
    .unwrap();
}

fn resets() -> u64 {
    common::mock_resets()
}

#[test]
fn the_runtime_s_sticky_faults_are_reset_or_refused() {
    // 1. An uncorrectable ECC error: the device is reset and every handle
    //    comes back, its bytes lost with the device until rewritten.
    let c = client_on(0);
    let a = c.upload(&scalars(&[1; 16])).unwrap();
    break_device(&c, "scope_ecc", "hipErrorECCNotCorrectable");
    let before = resets();
    assert!(
        matches!(c.recover(), Ok(Recovered::Reopened { .. })),
        "the device should have been reset"
    );
    assert_eq!(resets(), before + 1, "a hipDeviceReset");
    let lost = c.read(a.all()).unwrap_err();
    assert!(lost.is_lost_with_device(), "{lost}");
    assert!(
        lost.to_string().contains("hipErrorECCNotCorrectable"),
        "{lost}"
    );
    fill(&c, &a, 9);
    assert_eq!(words(&c.read(a.all()).unwrap()), vec![9; 16]);
    assert!(matches!(c.recover(), Ok(Recovered::Healthy)));
    drop((a, c));

    // 2. Refused while another client holds the device; reset once alone.
    let c = client_on(1);
    let other = client_on(1);
    let kept = c.upload(&scalars(&[4; 16])).unwrap();
    break_device(&c, "scope_ecc", "hipErrorECCNotCorrectable");
    let refused = c.recover().unwrap_err();
    assert!(
        matches!(&refused, Error::Refused { reason } if reason.contains("1 other client")),
        "{refused}"
    );
    assert!(c.poison().is_some(), "the client stays poisoned");
    drop(other);
    assert!(matches!(c.recover(), Ok(Recovered::Reopened { .. })));
    fill(&c, &kept, 5);
    assert_eq!(words(&c.read(kept.all()).unwrap()), vec![5; 16]);
    drop((kept, c));

    // 3. An illegal address: RestartRequired, nothing reset, the client
    //    stays poisoned and its releases still release.
    let c = client_on(2);
    let doomed = c.upload(&scalars(&[6; 16])).unwrap();
    let fault = break_device(&c, "scope_trap", "hipErrorIllegalAddress");
    let before = resets();
    match c.recover() {
        Err(Error::RestartRequired {
            backend: "hip",
            fault: named,
            reason,
        }) => {
            assert_eq!(named.to_string(), fault.to_string());
            assert!(reason.contains("terminated and relaunched"), "{reason}");
        }
        other => panic!("an illegal address requires a restart: {other:?}"),
    }
    assert_eq!(resets(), before, "nothing was reset");
    c.free(&doomed).unwrap();
    assert!(c.poison().is_some());
}
