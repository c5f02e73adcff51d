//! A real sticky fault on the mock CUDA driver poisons the device. In a
//! binary of its own: the mock's context is process-wide, as a CUDA
//! primary context is, and after the fault every call in it fails.

mod common;
#[path = "mock/harness.rs"]
mod harness;

use common::{FILL, WILD, bytes, kernel, words};
use scope_core::{Binding, Dispatch, Error};

/// The wild kernel's launch is accepted; the fault surfaces at the next
/// sync as the sticky `CUDA_ERROR_ILLEGAL_ADDRESS`, which poisons the
/// device: every later operation fails fast naming it, and the work in
/// flight carries it (rule 36).
#[test]
fn an_illegal_address_poisons_the_device() {
    let c = harness::client();
    let clean = c.try_allocate(256).unwrap();
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&clean)],
        &bytes(&[64, 5]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(words(&c.read(&clean).unwrap()), vec![5; 64]);
    let victim = c.try_allocate(256).unwrap();
    c.launch(
        &kernel("wild", WILD),
        &[Binding::read_write(&victim)],
        &[],
        Dispatch::linear(1),
    )
    .unwrap();
    let fault = c.sync().unwrap_err();
    assert!(fault.is_sticky(), "{fault}");
    match &fault {
        Error::Fault(f) => {
            assert_eq!(f.code, "CUDA_ERROR_ILLEGAL_ADDRESS", "{f}");
            assert!(
                f.detail
                    .contains("an illegal memory access was encountered"),
                "the driver's description: {f}"
            );
        }
        other => panic!("{other}"),
    }
    assert!(c.poison().is_some());
    let later = c.try_allocate(64).unwrap_err();
    assert!(later.is_device_poisoned(), "{later}");
    assert!(
        later.to_string().contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
        "{later}"
    );
    assert!(c.read(&clean).unwrap_err().is_device_poisoned());
    let report = c.check(&[victim.all()]).unwrap_err();
    assert!(report.is_device_poisoned(), "{report}");
    // A new client on the corrupted context cannot start: the driver
    // answers 700 to everything, as CUDA does until the process exits.
    let fresh = harness::mock_client().map(|_| ()).unwrap_err();
    assert!(
        fresh.to_string().contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
        "{fresh}"
    );
    harness::mock().assert_clean();
}
