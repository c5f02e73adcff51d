//! Device choice and unavailability. One test in its own binary, because it
//! changes the process environment the loader and the server read.

use scope_core::Error;

fn set(key: &str, value: &str) {
    // SAFETY: this binary runs this one test on one thread; nothing reads
    // the environment concurrently.
    unsafe { std::env::set_var(key, value) };
}

fn unset(key: &str) {
    // SAFETY: as for `set`.
    unsafe { std::env::remove_var(key) };
}

#[test]
fn scope_vulkan_device_picks_by_index_or_name_devices_are_numbered_and_no_device_is_unavailable() {
    let _ = std::fs::create_dir_all("/tmp/xdg");
    let probe = server_vulkan::probe();
    if !probe.has_device() {
        println!("skipped: no vulkan device ({:?})", probe.why_not);
        assert!(!scope_test::required("vulkan"));
        return;
    }
    let first = probe.devices[0].name.clone();

    // By a substring of the name, in any case.
    let needle: String = first.chars().take(4).collect::<String>().to_uppercase();
    set("SCOPE_VULKAN_DEVICE", &needle);
    let client = server_vulkan::client().expect("picked by name");
    assert!(
        client.describe().starts_with(&first),
        "{}",
        client.describe()
    );
    drop(client);

    // By index.
    set("SCOPE_VULKAN_DEVICE", "0");
    let client = server_vulkan::client().expect("picked by index");
    assert!(
        client.describe().starts_with(&first),
        "{}",
        client.describe()
    );
    drop(client);

    // A name that matches nothing: unavailable, naming what exists.
    set("SCOPE_VULKAN_DEVICE", "no-such-device-anywhere");
    match server_vulkan::client() {
        Err(Error::BackendUnavailable { reason, .. }) => {
            assert!(reason.contains(&first), "{reason}")
        }
        other => panic!("expected BackendUnavailable, got {other:?}"),
    }
    set("SCOPE_VULKAN_DEVICE", "99");
    assert!(matches!(
        server_vulkan::client(),
        Err(Error::BackendUnavailable { .. })
    ));
    unset("SCOPE_VULKAN_DEVICE");

    // Every usable device by number: device 0 is the one `client` opens,
    // each index its own server, and the index past them does not exist.
    let count = server_vulkan::device_count();
    assert!(count >= 1, "a usable device, so at least one numbered");
    let chosen = server_vulkan::client().unwrap();
    let on_zero = server_vulkan::client_on(0).unwrap();
    assert_eq!(chosen.describe(), on_zero.describe());
    let mine = chosen.upload(&[0; 16]).unwrap();
    assert!(
        matches!(on_zero.read(&mine), Err(Error::InvalidArgument { .. })),
        "a server of its own: the other's buffer is foreign to it"
    );
    for index in 1..count {
        let other = server_vulkan::client_on(index).expect("every numbered device opens");
        println!("device {index}: {}", other.describe());
    }
    match server_vulkan::client_on(count) {
        Err(Error::BackendUnavailable { reason, .. }) => {
            assert!(reason.contains("does not exist"), "{reason}")
        }
        other => panic!("expected BackendUnavailable, got {other:?}"),
    }
    drop((chosen, on_zero));

    // No driver at all: the loader finds no device; unavailable, no panic,
    // and the probe says why.
    set("VK_ICD_FILENAMES", "/nonexistent/icd.json");
    set("VK_DRIVER_FILES", "/nonexistent/icd.json");
    match server_vulkan::client() {
        Err(Error::BackendUnavailable { reason, .. }) => {
            println!("unavailable as expected: {reason}")
        }
        other => panic!("expected BackendUnavailable, got {other:?}"),
    }
    let none = server_vulkan::probe();
    assert!(!none.has_device(), "{none:?}");
    unset("VK_ICD_FILENAMES");
    unset("VK_DRIVER_FILES");
    assert!(server_vulkan::client().is_ok());
}
