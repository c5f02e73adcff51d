//! A device the mock CUDA driver really broke, recovered as CUDA allows
//! (`server_cuda`'s `reopen.rs`, rule 52): a sticky fault that is not
//! process-fatal (an uncorrectable ECC error) is reset with
//! `cuDevicePrimaryCtxReset` and the client comes back with every handle;
//! a reset is refused while another client of the process holds the
//! device; an illegal address, which CUDA's documentation says ends the
//! process's use of CUDA, is refused with `Error::RestartRequired`.
//!
//! One test, its steps in order, in a binary of its own: the mock's sticky
//! error is process-wide (as the state a reset destroys is), so no other
//! test may run beside these. A loss the driver never saw — one injected at
//! a fault site — is the conformance suite's (`recover_tests!` in `mock.rs`),
//! and is reopened without a reset.

mod common;
#[path = "mock/harness.rs"]
mod harness;

use common::{FILL, bytes, kernel, words};
use harness::mock;
use scope_core::{Binding, Client, Dispatch, Error, Recovered};
use server_cuda::Cuda;

const ECC_UNCORRECTABLE: i32 = 214;
const ILLEGAL_ADDRESS: i32 = 700;

fn fill(c: &Client<Cuda>, out: &scope_core::Buffer, value: u32) -> scope_core::Result<()> {
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(out)],
        &bytes(&[16, value]),
        Dispatch::linear(1),
    )
}

/// Leave `code` pending on the mock and surface it: the client is poisoned
/// by the driver's own sticky error.
fn break_device(c: &Client<Cuda>, code: i32, name: &str) -> Error {
    mock().fault_next_sync(code);
    let error = c.sync().unwrap_err();
    assert!(error.is_sticky(), "{error}");
    assert!(error.to_string().contains(name), "{error}");
    assert!(c.poison().is_some());
    error
}

#[test]
fn the_driver_s_sticky_faults_are_reset_or_refused_as_cuda_documents() {
    mock();
    // 1. An uncorrectable ECC error: the context is reset and every handle
    //    comes back, its bytes lost with the device until rewritten.
    let c = server_cuda::client_on(0).unwrap();
    let a = c.upload(&bytes(&[1; 16])).unwrap();
    let b = c.upload(&bytes(&[2; 16])).unwrap();
    break_device(&c, ECC_UNCORRECTABLE, "CUDA_ERROR_ECC_UNCORRECTABLE");
    let resets = mock().resets();
    match c.recover() {
        Ok(Recovered::Reopened { buffers: 2, .. }) => {}
        other => panic!("the device should have been reset: {other:?}"),
    }
    assert_eq!(
        mock().resets(),
        resets + 1,
        "a reset of the primary context"
    );
    assert!(c.poison().is_none());
    let lost = c.read(a.all()).unwrap_err();
    assert!(lost.is_lost_with_device(), "{lost}");
    assert!(
        lost.to_string().contains("CUDA_ERROR_ECC_UNCORRECTABLE"),
        "names the fault: {lost}"
    );
    // A kernel compiles again on the new context and heals what it writes;
    // an upload heals the other.
    fill(&c, &a, 9).unwrap();
    assert_eq!(words(&c.read(a.all()).unwrap()), vec![9; 16]);
    c.write(b.all(), &bytes(&[3; 16])).unwrap();
    assert_eq!(words(&c.read(b.all()).unwrap()), vec![3; 16]);
    // Recovering a healthy client changes nothing.
    assert!(matches!(c.recover(), Ok(Recovered::Healthy)));
    drop((a, b, c));

    // 2. A reset is refused while another client holds the device: it
    //    would destroy that client's memory. Once it is gone, the reset
    //    goes ahead.
    let c = server_cuda::client_on(1).unwrap();
    let other = server_cuda::client_on(1).unwrap();
    let kept = c.upload(&bytes(&[4; 16])).unwrap();
    break_device(&c, ECC_UNCORRECTABLE, "CUDA_ERROR_ECC_UNCORRECTABLE");
    let refused = c.recover().unwrap_err();
    assert!(
        matches!(&refused, Error::Refused { reason } if reason.contains("1 other client")),
        "{refused}"
    );
    assert!(c.poison().is_some(), "the client stays poisoned");
    drop(other);
    assert!(
        matches!(c.recover(), Ok(Recovered::Reopened { buffers: 1, .. })),
        "the device resets once it is this client's alone"
    );
    fill(&c, &kept, 5).unwrap();
    assert_eq!(words(&c.read(kept.all()).unwrap()), vec![5; 16]);
    drop((kept, c));

    // 3. An illegal address ends the process's use of CUDA: recovery is
    //    refused with RestartRequired, touching nothing; the client stays
    //    poisoned and its releases still release (rule 36). Last: the mock's
    //    context never comes back from it.
    let c = server_cuda::client_on(2).unwrap();
    let doomed = c.upload(&bytes(&[6; 16])).unwrap();
    let fault = break_device(&c, ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS");
    let resets = mock().resets();
    match c.recover() {
        Err(Error::RestartRequired {
            backend: "cuda",
            fault: named,
            reason,
        }) => {
            assert_eq!(named.to_string(), fault.to_string());
            assert!(reason.contains("terminated and relaunched"), "{reason}");
        }
        other => panic!("an illegal address requires a restart: {other:?}"),
    }
    assert_eq!(mock().resets(), resets, "nothing was reset");
    assert!(c.poison().is_some());
    c.free(&doomed).unwrap();
    assert!(matches!(c.recover(), Err(Error::RestartRequired { .. })));
    mock().assert_clean();
}
