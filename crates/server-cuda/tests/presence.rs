//! The entry points answer on every machine, never panicking: with no
//! driver or device, `client()` is `BackendUnavailable` and `probe()` says
//! why; with one, both find it. They must agree.

use scope_core::Error;
use scope_test::required;

#[test]
fn client_and_probe_agree_and_never_panic() {
    let probe = server_cuda::probe();
    assert_eq!(probe.backend, "cuda");
    let client = server_cuda::client();
    if probe.has_device() {
        assert!(probe.why_not.is_none(), "{probe:?}");
        let client = client.unwrap_or_else(|e| {
            panic!(
                "the probe found {:?} but client() failed: {e}",
                probe.devices
            )
        });
        assert!(
            client.describe().contains(&probe.devices[0].name),
            "{}",
            client.describe()
        );
        println!("cuda: {}", client.describe());
    } else {
        let why = probe
            .why_not
            .clone()
            .expect("a probe with no device says why");
        assert!(!why.is_empty());
        match client {
            Err(Error::BackendUnavailable { backend, reason }) => {
                assert_eq!(backend, "cuda");
                assert!(!reason.is_empty());
                println!("cuda unavailable here, as the probe says: {why}");
            }
            Err(other) => {
                panic!("no device, but client() failed with {other} instead of BackendUnavailable")
            }
            Ok(c) => panic!("the probe found nothing but client() made {c:?}"),
        }
        assert!(!required("cuda"), "SCOPE_REQUIRE names cuda, but: {why}");
    }
}

#[test]
fn asking_twice_gives_the_same_answer() {
    // Presence is decided once per process; the second answer must not
    // differ or panic.
    let first = server_cuda::probe();
    let second = server_cuda::probe();
    assert_eq!(first.has_device(), second.has_device());
    assert_eq!(first.why_not, second.why_not);
    let a = server_cuda::client().map(|_| ()).map_err(|e| e.to_string());
    let b = server_cuda::client().map(|_| ()).map_err(|e| e.to_string());
    assert_eq!(a.is_ok(), b.is_ok());
    if let (Err(a), Err(b)) = (a, b) {
        assert_eq!(a, b);
    }
}

#[test]
fn total_memory_without_a_driver_is_unavailable_not_a_panic() {
    match server_cuda::total_memory(0) {
        Ok(bytes) => assert!(bytes > 0),
        Err(error) => assert!(matches!(error, Error::BackendUnavailable { .. }), "{error}"),
    }
}
