//! A real (not injected) sticky fault of the mock HIP runtime: a kernel
//! that traps leaves `hipErrorIllegalAddress` on its whole device, as on
//! real hardware, and an illegal address is process-fatal, so no reset
//! brings the device back. In a binary of its own: every later test of
//! the process on that device would meet it. None of this is AMD hardware.

#[macro_use]
mod common;

use common::mock_client;
use scope_core::{Binding, Client, Dispatch, Kernel};
use server_hip::Hip;

fn client() -> Client<Hip> {
    mock_client().expect("the mock HIP runtime loads")
}

/// A kernel that faults leaves a sticky `hipErrorIllegalAddress` on its
/// device, which surfaces at the next sync: classified sticky, it poisons
/// the device, and every later operation fails fast naming it (rule 36).
/// Another client of the same device, on streams of its own, meets the
/// same fault at its next wait: the fault is the device's, not the
/// faulting stream's.
#[test]
fn a_real_sticky_fault_poisons_the_whole_device() {
    let c = client();
    let neighbour = client();
    let theirs = neighbour.upload(&[2; 256]).unwrap();
    // SAFETY: it touches no memory: it traps.
    let trap = unsafe {
        Kernel::hip(
            "trap",
            r#"extern "C" __global__ void scope_trap(unsigned int* out) { __builtin_trap(); }"#,
        )
    }
    .entry("scope_trap")
    .block([64, 1, 1]);
    let out = c.allocate(256).unwrap();
    let other = c.allocate(256).unwrap();
    c.write(&other, &[1; 256]).unwrap();
    c.launch(&trap, &[Binding::write(&out)], &[], Dispatch::linear(1))
        .unwrap();
    let surfaced = c.sync().unwrap_err();
    assert!(surfaced.is_sticky(), "{surfaced}");
    assert!(
        surfaced.to_string().contains("hipErrorIllegalAddress"),
        "{surfaced}"
    );
    let poisoned = c.read(&other).unwrap_err();
    assert!(poisoned.is_device_poisoned(), "{poisoned}");
    assert!(c.poison().is_some());
    let again = c.allocate(256).unwrap_err();
    assert!(again.is_device_poisoned(), "{again}");

    let met = neighbour.sync().unwrap_err();
    assert!(
        met.is_sticky(),
        "the neighbour meets the device's fault: {met}"
    );
    assert!(met.to_string().contains("hipErrorIllegalAddress"), "{met}");
    let read = neighbour.read(&theirs).unwrap_err();
    assert!(read.is_device_poisoned(), "{read}");
}
