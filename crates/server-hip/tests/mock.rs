//! The HIP server against a mock HIP runtime (`tests/mock/mock_hip.c`),
//! built here with the system C compiler and loaded through the server's
//! own loader.
//!
//! The mock is not HIP — "device" memory is host memory and work runs at
//! once — so these tests say nothing about AMD hardware. What they do test
//! is every line of the server's Rust on its success and failure paths: the
//! loader finding all forty-one entry points, the struct offsets it reads the
//! device's name, `gcnArchName` and launch limits from, the launch limits
//! reported and enforced, the `--offload-arch` option,
//! staging, pooling, events, capture and replay, and the launch parameter
//! convention; a real (not injected) sticky fault is `mock_sticky.rs`'s,
//! since it is the whole device's until the process ends. The mock also
//! refuses what real HIP would mis-handle: an event recorded on, or a wait
//! issued to, a capturing stream, a capture not in relaxed mode, or a
//! launch or graph replay of a function whose module was unloaded.

#[macro_use]
mod common;

use common::{mock_client, mock_library, mock_rccl};
use scope_core::{Binding, Client, Dispatch, Error, Result};
use server_hip::Hip;

fn client() -> Client<Hip> {
    mock_client().expect("the mock HIP runtime loads")
}

// The mock's whole memory (1 GiB) is oversized: its "runtime" holds some.
hip_suite!(MockSuite, mock_client(), Some(1 << 30), {
    fn backend() -> Option<Result<Hip>> {
        Some(Hip::open_from(&[mock_library()], &[mock_library()], 0))
    }

    // An injected loss leaves the device working, so the server reopens on
    // it without a reset; a reset, and its refusals, are
    // `mock_recover.rs`'s.
    fn capabilities() -> &'static [scope_test::Capability] {
        &[scope_test::Capability::Reopen]
    }
});

mod conformance {
    scope_test::conformance_tests!(super::MockSuite);
}

// The collective behaviours over RCCL (the mock's): four ranks on the mock
// runtime's four devices, every call checked by the mock as RCCL would
// take it.
hip_suite!(MockRcclSuite, mock_client(), None, {
    over_mock_rccl!(mock_rccl());
});

mod over_rccl {
    scope_test::conformance_tests!(@collectives super::MockRcclSuite);
}

/// Four ranks in four processes, each a child of this binary with its own
/// mock runtime and mock RCCL, meeting in the mock's shared mode (a file
/// each maps, where real RCCL's ranks meet over the network).
mod across_processes {
    scope_test::conformance_tests!(@processes super::MockRcclSuite, "across_processes", |dir| {
        crate::common::shared_rccl_id(dir)
    });
}

macro_rules! mock_cases {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                common::cases::$name(&client());
            }
        )*
    };
}

mock_cases!(
    large_writes_and_reads_cross_staging_chunks,
    recorded_host_writes_replay_the_bytes_given_at_call_time,
    captured_kernels_replay_on_current_inputs,
    indirect_dispatch_inside_a_capture_dooms_it,
    freed_memory_is_reused,
    streams_sharing_a_buffer_are_ordered,
    compile_errors_carry_the_hiprtc_log,
);

#[test]
fn the_device_is_described_from_the_r0600_props() {
    let c = client();
    let description = c.describe();
    assert!(
        description.starts_with(
            "Mock Radeon (scope test double) (gfx90a:sramecc+:xnack-, 1024 MiB, HIP runtime 6.2)"
        ),
        "{description}"
    );
    let hip = Hip::open_from(&[mock_library()], &[mock_library()], 0).unwrap();
    assert_eq!(hip.info().arch, "gfx90a:sramecc+:xnack-");
    assert_eq!(hip.info().total_memory, 1 << 30);
    let missing = Hip::open_from(&[mock_library()], &[mock_library()], 4);
    assert!(
        matches!(missing, Err(Error::BackendUnavailable { .. })),
        "{missing:?}"
    );
}

/// The pool's blocks are reused once the device is done with them, and
/// `trim` (the core's step before retrying an allocation that ran out)
/// gives every cached block back.
#[test]
fn trimming_returns_cached_blocks() {
    let c = client();
    let buffer = c.allocate(1 << 20).unwrap();
    c.free(&buffer).unwrap();
    c.sync().unwrap();
    assert!(c.bytes_reserved() >= 1 << 20);
    // SAFETY: trimming only releases cached blocks the core no longer
    // hands out; it creates or destroys nothing the core tracks.
    unsafe { c.with_backend_mut(scope_core::Backend::trim) }.unwrap();
    assert_eq!(c.bytes_reserved(), 0);
}

/// hiprtc is found in the runtime library when no separate one loads (ROCm
/// 5's layout); when it is found nowhere, the server still copies, and a
/// compile fails with the reason instead.
#[test]
fn hiprtc_is_optional_and_its_absence_is_a_compile_error() {
    let runtime = vec![mock_library()];
    let fallback =
        server_hip::client_from(&runtime, &["libscope-no-such-hiprtc.so".to_owned()], 0).unwrap();
    fallback.compile(&common::fill()).unwrap();

    let without = server_hip::client_from(&runtime, &["libm.so.6".to_owned()], 0).unwrap();
    let buffer = without.upload(&[7; 64]).unwrap();
    assert_eq!(without.read(&buffer).unwrap(), vec![7; 64]);
    let error = without.compile(&common::fill()).unwrap_err();
    let Error::Compile { log, .. } = &error else {
        panic!("expected a compile error, got {error}");
    };
    assert!(log.contains("hiprtcCreateProgram"), "{log}");
}

/// A scalar blob larger than the launch scratch is an invalid argument,
/// refused before the launch's scope opens: nothing runs, nothing is
/// claimed.
#[test]
fn an_oversized_scalar_blob_is_an_invalid_argument() {
    let c = client();
    let out = c.upload(&[7; 256]).unwrap();
    let error = c
        .launch(
            &common::fill(),
            &[Binding::write(&out)],
            &vec![0; 8192],
            Dispatch::linear(1),
        )
        .unwrap_err();
    assert!(matches!(error, Error::InvalidArgument { .. }), "{error}");
    assert_eq!(
        c.read(&out).unwrap(),
        vec![7; 256],
        "nothing ran or was claimed"
    );
    assert_eq!(c.failures_held(), 0);
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn fill_args(n: u32, value: u32) -> Vec<u8> {
    [n, value].iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// What `Client::limits` reports is what the runtime says of the device
/// (an MI300's numbers on the mock) and what `check_launch` enforces. The
/// grid along each axis is the device's `maxGridSize`, bounded so that
/// blocks times threads of the largest block stay within `u32::MAX`, which
/// HIP itself refuses past: a grid at the edge runs, and one block past any
/// axis, or a block past the device's, is an invalid argument refused
/// before its scope opens — nothing runs, nothing is claimed.
#[test]
fn limits_are_the_devices_and_a_launch_past_them_is_refused() {
    let c = client();
    let limits = c.limits();
    assert_eq!(limits.max_allocation, 1 << 30);
    let launch = &limits.launch;
    // 2^32 - 1 threads / 1024 per block along x; y and z are the device's.
    assert_eq!(launch.max_workgroups, [4_194_303, 65_535, 65_535]);
    assert_eq!(launch.max_workgroup_size, [1024, 1024, 1024]);
    assert_eq!(launch.max_invocations, 1024);
    assert_eq!(launch.max_workgroup_memory, 64 << 10);
    assert_eq!(launch.subgroup_size, Some((64, 64)));
    assert_eq!(launch.max_binding_size, 1 << 30);
    assert_eq!(launch.max_bindings, 4096);
    assert_eq!(launch.max_scalar_bytes, 4096);
    let features = launch.features;
    assert!(features.f16 && features.f64 && features.i64, "{features:?}");
    assert!(
        features.f32_atomic_add && features.subgroups,
        "{features:?}"
    );

    let out = c.upload(&[7; 256]).unwrap();
    let fill = common::fill();
    for groups in [[launch.max_workgroups[0], 1, 1], [1, 65_535, 1]] {
        c.launch(
            &fill,
            &[Binding::write(&out)],
            &fill_args(64, 3),
            Dispatch::Groups(groups),
        )
        .unwrap_or_else(|e| panic!("{groups:?} is within the limits: {e}"));
    }
    assert_eq!(words(&c.read(&out).unwrap()), vec![3; 64]);
    for axis in 0..3 {
        let mut groups = [1; 3];
        groups[axis] = launch.max_workgroups[axis] + 1;
        let refused = c
            .launch(
                &fill,
                &[Binding::write(&out)],
                &fill_args(64, 9),
                Dispatch::Groups(groups),
            )
            .unwrap_err();
        assert!(
            matches!(&refused, Error::InvalidArgument { why, .. } if why.contains(&format!("axis {axis}"))),
            "{refused}"
        );
    }
    for block in [[1, 1, 1025], [1024, 2, 1]] {
        let refused = c
            .launch(
                &fill.clone().block(block),
                &[Binding::write(&out)],
                &fill_args(64, 9),
                Dispatch::linear(1),
            )
            .unwrap_err();
        assert!(
            matches!(&refused, Error::InvalidArgument { why, .. } if why.contains("block")),
            "{refused}"
        );
    }
    assert_eq!(words(&c.read(&out).unwrap()), vec![3; 64], "nothing ran");
    assert_eq!(c.failures_held(), 0, "nothing was claimed");
}
