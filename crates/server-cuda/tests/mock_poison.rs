//! A real sticky fault on the mock CUDA driver poisons the device. In a
//! binary of its own: the mock's context is process-wide, as a CUDA
//! primary context is, and after the fault every call in it fails.

mod common;
#[path = "mock/harness.rs"]
mod harness;

use scope_core::Error;

/// The wild kernel's launch is accepted; the fault surfaces at the next
/// sync as the sticky `CUDA_ERROR_ILLEGAL_ADDRESS`, which poisons the
/// device: every later operation fails fast naming it, and the work in
/// flight carries it (rule 36).
#[test]
fn an_illegal_address_poisons_the_device() {
    let c = harness::client();
    let fault = common::cases::an_illegal_address_poisons_the_device(&c);
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
    // A new client on the corrupted context cannot start: the driver
    // answers 700 to everything, as CUDA does until the process exits.
    let fresh = harness::mock_client().map(|_| ()).unwrap_err();
    assert!(
        fresh.to_string().contains("CUDA_ERROR_ILLEGAL_ADDRESS"),
        "{fresh}"
    );
    harness::mock().assert_clean();
}
