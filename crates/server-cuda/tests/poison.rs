//! A real illegal address poisons the device. In a binary of its own: a
//! sticky fault corrupts the process's primary context, which every other
//! client in the same process shares.

mod common;

use common::{FILL, WILD, bytes, client, kernel, words};
use scope_core::{Binding, Dispatch, Error};

#[test]
fn an_illegal_address_poisons_the_device() {
    let Some(c) = client() else { return };
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
    // The launch itself is accepted; the fault surfaces at the sync.
    let launched = c.launch(
        &kernel("wild", WILD),
        &[Binding::read_write(&victim)],
        &[],
        Dispatch::linear(1),
    );
    let fault = match launched {
        Ok(()) => c.sync().unwrap_err(),
        Err(error) => error,
    };
    assert!(fault.is_sticky(), "{fault}");
    match &fault {
        Error::Fault(f) => assert!(
            ["CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED"].contains(&f.code.as_str()),
            "{f}"
        ),
        other => panic!("{other}"),
    }
    assert!(c.poison().is_some());
    // Everything after fails fast, naming the fault.
    let later = c.try_allocate(64).unwrap_err();
    assert!(later.is_device_poisoned(), "{later}");
    assert!(later.to_string().contains("CUDA_ERROR"), "{later}");
    assert!(c.read(&clean).unwrap_err().is_device_poisoned());
    // The work in flight when it surfaced carries the poison.
    let report = c.check(&[victim.all()]).unwrap_err();
    assert!(report.is_device_poisoned(), "{report}");
}
