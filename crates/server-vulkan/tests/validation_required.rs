//! Validation asked for where the layer is missing: a run without it (and a
//! skip for a test that promises validation) on a person's machine, a
//! refusal naming the layer and its package under CI or `SCOPE_REQUIRE`.
//!
//! One test in its own binary, because it changes the process environment
//! the loader and the server read. The loader is pointed away from the
//! layer with `VK_LAYER_PATH` at an empty folder: it then searches that
//! folder instead of its manifest folders, so the drivers stay and the
//! layer goes (`XDG_DATA_DIRS` would hide the drivers as well).

mod common;

use scope_core::Error;
use server_vulkan::{Config, VALIDATION_LAYER_MISSING, Vulkan};

fn set(key: &str, value: &str) {
    // SAFETY: this binary runs this one test on one thread; nothing reads
    // the environment concurrently.
    unsafe { std::env::set_var(key, value) };
}

fn unset(key: &str) {
    // SAFETY: as for `set`.
    unsafe { std::env::remove_var(key) };
}

const ASKED: Config = Config {
    validation: true,
    fail_on_validation: true,
    force_staging: false,
    device: None,
};

#[test]
fn a_missing_validation_layer_is_a_skip_here_and_a_refusal_where_required() {
    let _ = std::fs::create_dir_all("/tmp/xdg");
    let empty = std::env::temp_dir().join(format!("scope-no-layers-{}", std::process::id()));
    std::fs::create_dir_all(&empty).expect("an empty layer folder");
    set("VK_LAYER_PATH", empty.to_str().expect("a UTF-8 temp path"));
    let probe = server_vulkan::probe();
    if !probe.has_device() {
        println!("skipped: no vulkan device ({:?})", probe.why_not);
        assert!(!scope_test::required("vulkan"));
        return;
    }
    // What this machine has does not matter from here on: the loader sees
    // no layer at all.
    assert!(!server_vulkan::validation_layer_installed());
    let ci = std::env::var("CI").ok();
    let require = std::env::var("SCOPE_REQUIRE").ok();
    unset("CI");
    unset("SCOPE_REQUIRE");

    // Not required: the device opens without the layer and says so, and a
    // test that promises validation is told to skip.
    assert_eq!(server_vulkan::validation_required_by(), None);
    let client = server_vulkan::client_with(ASKED).expect("opens without the layer");
    assert!(!client.with_backend(Vulkan::validating));
    drop(client);
    match common::validating() {
        Err(Error::BackendUnavailable { reason, .. }) => {
            assert_eq!(reason, VALIDATION_LAYER_MISSING);
        }
        other => panic!("a test promising validation must skip: {other:?}"),
    }
    // SCOPE_REQUIRE naming another backend leaves it a skip.
    set("SCOPE_REQUIRE", "wgpu");
    assert_eq!(server_vulkan::validation_required_by(), None);
    assert!(server_vulkan::client_with(ASKED).is_ok());

    // Required: asking for the layer is a refusal that names it and its
    // package, and never a skip.
    for (key, value) in [
        ("CI", "true"),
        ("SCOPE_REQUIRE", "vulkan"),
        ("SCOPE_REQUIRE", "wgpu, Vulkan"),
        ("SCOPE_REQUIRE", "all"),
    ] {
        unset("CI");
        unset("SCOPE_REQUIRE");
        set(key, value);
        assert!(
            server_vulkan::validation_required_by().is_some(),
            "{key}={value}"
        );
        let error = server_vulkan::client_with(ASKED)
            .map(drop)
            .expect_err("validation is required here");
        let text = error.to_string();
        assert!(
            matches!(error, Error::Refused { .. })
                && text.contains("VK_LAYER_KHRONOS_validation")
                && text.contains("vulkan-validationlayers"),
            "{key}={value}: {text}"
        );
        // Validation not asked for is no requirement.
        assert!(server_vulkan::client_with(Config::default()).is_ok());
    }

    unset("CI");
    unset("SCOPE_REQUIRE");
    if let Some(ci) = ci {
        set("CI", &ci);
    }
    if let Some(require) = require {
        set("SCOPE_REQUIRE", &require);
    }
    unset("VK_LAYER_PATH");
    let _ = std::fs::remove_dir(&empty);
}
