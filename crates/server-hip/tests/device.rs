//! The HIP server's own device tests, on a real HIP device: the shared
//! cases of `common/cases.rs`, and the probe.
//!
//! Each test needs a HIP device. Without one it prints `skipped: no hip
//! device (...)` and returns; with `SCOPE_REQUIRE=hip` it fails.

mod common;

use scope_core::Client;
use scope_test::client_or_skip;
use server_hip::Hip;

fn client() -> Option<Client<Hip>> {
    client_or_skip(server_hip::client)
}

#[test]
fn probe_names_the_device_and_its_arch() {
    let Some(c) = client() else { return };
    let probe = server_hip::probe();
    assert!(probe.has_device(), "{:?}", probe.why_not);
    assert!(
        probe.devices[0].detail.starts_with("gfx"),
        "{:?}",
        probe.devices[0]
    );
    assert!(c.describe().contains("gfx"), "{}", c.describe());
}

macro_rules! device_cases {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let Some(c) = client() else { return };
                common::cases::$name(&c);
            }
        )*
    };
}

device_cases!(
    large_writes_and_reads_cross_staging_chunks,
    recorded_host_writes_replay_the_bytes_given_at_call_time,
    captured_kernels_replay_on_current_inputs,
    indirect_dispatch_inside_a_capture_dooms_it,
    freed_memory_is_reused,
    streams_sharing_a_buffer_are_ordered,
    compile_errors_carry_the_hiprtc_log,
);
