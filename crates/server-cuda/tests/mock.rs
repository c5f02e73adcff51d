//! The CUDA server against a mock CUDA driver and NVRTC
//! (`tests/mock/mock_cuda.c`, `mock_nvrtc.c`; loading in
//! `tests/mock/harness.rs`).
//!
//! The mock is not CUDA — "device" memory is host memory and work runs
//! when it is issued — so these tests say nothing about NVIDIA hardware or
//! the real driver's timing. What they do run is the server's Rust, on its
//! success and failure paths: cudarc's loading and context handling, the
//! pool's struct layout and attributes, pinned staging, events, capture
//! and replay, NVRTC's options and log, the JIT's log, the launch
//! parameter convention and its check against `cuFuncGetParamInfo`, and a
//! real (not injected) out-of-memory. The mock also refuses what real CUDA
//! refuses or mis-handles (the list heads `mock_cuda.c`), and every test
//! here ends by asserting it refused nothing. The sticky fault is in
//! `mock_poison.rs`: it corrupts the process's one mock context.

#[macro_use]
mod common;
#[path = "mock/harness.rs"]
mod harness;

use common::{FILL, bytes, kernel, words};
use harness::{client, mock};
use scope_core::{Binding, Dispatch, Error, Kernel};
use scope_test::Suite;

// The mock's whole memory (1 GiB) is oversized: its context holds some.
cuda_suite!(
    MockSuite,
    {
        let client = harness::mock_client();
        mock().assert_clean();
        client
    },
    Some(1 << 30),
    mock().assert_clean(),
    {
        fn backend() -> Option<scope_core::Result<server_cuda::Cuda>> {
            mock();
            Some(server_cuda::Cuda::open(0))
        }

        fn pending(stream: &server_cuda::CudaStreamState) -> Option<u64> {
            Some(mock().pending(stream.raw().cu_stream().cast()))
        }

        // An injected loss leaves the driver's context working, so the
        // server reopens on it without a reset; a reset, and the refusals,
        // are `mock_recover.rs`'s.
        fn capabilities() -> &'static [scope_test::Capability] {
            &[scope_test::Capability::Reopen]
        }
    }
);

mod conformance {
    scope_test::conformance_tests!(super::MockSuite);
}

// The collective behaviours over NCCL (the mock's, `scope_test::clib::MOCK_NCCL`):
// four ranks on the mock's four devices, one communicator, every call
// checked by the mock as real NCCL would take it.
cuda_suite!(
    MockNcclSuite,
    MockSuite::client(),
    None,
    mock().assert_clean(),
    {
        over_mock_nccl!(mock());
    }
);

mod over_nccl {
    scope_test::conformance_tests!(@collectives super::MockNcclSuite);
}

/// The mock's four devices are four servers, each with its own context,
/// pool and streams, whose bytes stay apart.
#[test]
fn four_devices_are_four_servers() {
    mock();
    let probe = server_cuda::probe();
    assert_eq!(probe.devices.len(), 4, "{probe:?}");
    let clients: Vec<_> = (0..4).map(|d| server_cuda::client_on(d).unwrap()).collect();
    let buffers: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(d, c)| {
            assert!(c.describe().contains(&format!("#{d}")), "{}", c.describe());
            c.upload(&bytes(&[d as u32; 16])).unwrap()
        })
        .collect();
    for (d, (c, b)) in clients.iter().zip(&buffers).enumerate() {
        assert_eq!(words(&c.read(b.all()).unwrap()), vec![d as u32; 16]);
    }
    assert!(server_cuda::client_on(4).is_err());
    mock().assert_clean();
}

#[test]
fn the_mock_device_is_described_and_nvrtc_targets_its_arch() {
    let c = client();
    let description = c.describe();
    assert!(
        description.starts_with(
            "Mock sm_90 GPU (scope test double) #0 (sm_90, 1.0 GiB, driver CUDA 13.0, NVRTC → compute_90)"
        ),
        "{description}"
    );
    assert_eq!(server_cuda::total_memory(0).unwrap(), 1 << 30);
    let probe = server_cuda::probe();
    assert!(probe.has_device(), "{probe:?}");
    assert!(c.with_backend(|b| b.has_nvrtc()));
    mock().assert_clean();
}

/// NVRTC's log reaches the error, in NVRTC's words, naming the file and
/// line; a missing entry point and a foreign language are compile errors
/// too.
#[test]
fn compile_errors_carry_the_nvrtc_log() {
    let c = client();
    let error = c.compile(&MockSuite::broken()).unwrap_err();
    let Error::Compile { backend, log, .. } = &error else {
        panic!("expected a compile error, got {error}");
    };
    assert_eq!(*backend, "cuda");
    assert!(
        log.contains(
            r#"scope_kernel.cu(1): error: identifier "this_is_not_declared" is undefined"#
        ),
        "{log}"
    );
    assert!(log.contains("NVRTC_ERROR_COMPILATION"), "{log}");
    assert!(log.contains("--gpu-architecture=compute_90"), "{log}");
    let wrong_entry = kernel("fill", FILL).entry("not_the_entry_point");
    let missing = c.compile(&wrong_entry).unwrap_err();
    assert!(
        matches!(&missing, Error::Compile { log, .. } if log.contains("no kernel named `not_the_entry_point`")),
        "{missing}"
    );
    let wgsl = Kernel::wgsl("w", "@compute @workgroup_size(1) fn main() {}");
    assert!(matches!(c.compile(&wgsl), Err(Error::Compile { .. })));
    mock().assert_clean();
}

/// PTX goes straight to the JIT: the mock's own PTX loads and runs, and a
/// PTX the JIT rejects is a compile error carrying the JIT's log from
/// `CU_JIT_ERROR_LOG_BUFFER`.
#[test]
fn ptx_loads_and_a_rejected_ptx_carries_the_jit_log() {
    let c = client();
    let ptx = ".version 9.0\n.target sm_90\n.address_size 64\n.scope_mock_entry seven fill 8 8\n";
    let out = c.allocate(256).unwrap();
    c.launch(
        // SAFETY: the mock's `fill` entry, which writes `n` words of its one
        // binding; the launch passes the binding's length.
        &unsafe { Kernel::ptx("seven", ptx) }.block([64, 1, 1]),
        &[Binding::write(&out)],
        &bytes(&[64, 7]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![7; 64]);
    // SAFETY: it does not assemble, so it never runs.
    let bad = unsafe {
        Kernel::ptx(
            "bad",
            ".version 7.0\n.target sm_70\n.visible .entry bad() { not_an_instruction; }",
        )
    };
    let error = c.compile(&bad).unwrap_err();
    let Error::Compile { log, .. } = &error else {
        panic!("expected a compile error, got {error}");
    };
    assert!(
        log.contains("ptxas application ptx input, line 3"),
        "the JIT's log: {log}"
    );
    assert!(log.contains("CUDA_ERROR_INVALID_PTX"), "{log}");
    mock().assert_clean();
}

/// PTX of a newer ISA than the driver JITs (9.1 on this CUDA 13.0 driver)
/// is refused by the JIT with `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`, and the
/// server answers with [`UnsupportedPtx`](server_cuda::UnsupportedPtx):
/// the driver's version, the PTX's, the fix, and the JIT's log; typed
/// through the compile and the launch alike. Nothing is poisoned: PTX the
/// driver takes runs next.
#[test]
fn ptx_newer_than_the_driver_is_unsupported_ptx_naming_the_versions() {
    use server_cuda::{CudaVersion, PtxIsa, UnsupportedPtx};
    let c = client();
    let ptx = |version: &str, name: &str| {
        format!(
            ".version {version}\n.target sm_90\n.address_size 64\n.scope_mock_entry {name} fill 8 8\n"
        )
    };
    // SAFETY: never runs: the driver refuses it.
    let newer = unsafe { Kernel::ptx("newer", ptx("9.1", "newer")) }.block([64, 1, 1]);
    let error = c.compile(&newer).unwrap_err();
    let unsupported = error
        .external_root::<UnsupportedPtx>()
        .unwrap_or_else(|| panic!("expected UnsupportedPtx, got {error:?}"));
    assert_eq!(&*unsupported.kernel, "newer");
    assert_eq!(unsupported.ptx_isa, Some(PtxIsa::new(9, 1)));
    assert_eq!(unsupported.driver, Some(CudaVersion::new(13, 0)));
    assert_eq!(unsupported.nvrtc, None, "the caller gave this PTX");
    assert_eq!(unsupported.driver_isa(), Some(PtxIsa::new(9, 0)));
    let text = error.to_string();
    for part in [
        "the CUDA driver (CUDA 13.0) cannot JIT its PTX (ISA 9.1, given as PTX)",
        "it JITs PTX ISA 9.0 and older",
        "a driver for CUDA 13.1 or newer",
        "`.version 9.0` or older",
        "Unsupported .version 9.1; current version is '9.0'",
    ] {
        assert!(text.contains(part), "{part:?} missing from:\n{text}");
    }
    let out = c.allocate(256).unwrap();
    let launched = c.launch(
        &newer,
        &[Binding::write(&out)],
        &bytes(&[64, 7]),
        Dispatch::linear(1),
    );
    let launch_error = launched.unwrap_err();
    assert!(
        launch_error.external_root::<UnsupportedPtx>().is_some(),
        "{launch_error:?}"
    );
    // The output carries it, still typed, to whoever reads it.
    let report = c.read(&out).unwrap_err();
    assert!(
        report.external_root::<UnsupportedPtx>().is_some(),
        "{report}"
    );
    // SAFETY: the mock's `fill` entry writing `n` words of its one binding;
    // the launch passes the binding's length.
    let taken = unsafe { Kernel::ptx("taken", ptx("9.0", "taken")) }.block([64, 1, 1]);
    c.launch(
        &taken,
        &[Binding::write(&out)],
        &bytes(&[64, 7]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![7; 64]);
    mock().assert_clean();
}

/// A real out-of-memory from the driver is not sticky: the device keeps
/// working. Memory cached by the pool is what the core's trim-and-retry
/// gives back: an allocation that fits only once the cache is released
/// succeeds.
#[test]
fn out_of_memory_is_not_sticky_and_trimming_makes_room() {
    let c = client();
    let big = c.try_allocate(600 << 20).unwrap();
    let refused = c.try_allocate(600 << 20).unwrap_err();
    assert!(
        refused.is_out_of_memory() && !refused.is_sticky(),
        "{refused}"
    );
    assert!(c.poison().is_none());
    let fine = c.upload(&bytes(&[5; 64])).unwrap();
    assert_eq!(words(&c.read(&fine).unwrap()), vec![5; 64]);
    // Freed, the 600 MiB stay cached in the pool.
    c.free(&big).unwrap();
    c.sync().unwrap();
    assert!(c.bytes_reserved() >= 600 << 20, "{}", c.bytes_reserved());
    // 700 MiB do not fit beside the cache and cannot reuse it: the first
    // attempt runs out, the core trims the pool and the retry succeeds.
    let bigger = c.try_allocate(700 << 20).unwrap();
    assert!(
        c.bytes_reserved() < 800 << 20,
        "the cache was released: {}",
        c.bytes_reserved()
    );
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&bigger)],
        &bytes(&[64, 6]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(words(&c.read(bigger.slice(0..256)).unwrap()), vec![6; 64]);
    mock().assert_clean();
}

/// The pool reuses a freed block once the free has completed, and `trim`
/// gives every cached block back.
#[test]
fn freed_memory_is_reused_and_trimming_returns_it() {
    let c = client();
    let size = 3 << 20;
    let first = c.upload(&vec![1u8; size]).unwrap();
    c.free(&first).unwrap();
    c.sync().unwrap();
    let cached = c.bytes_reserved();
    assert!(cached >= size as u64, "{cached}");
    for round in 0..16u8 {
        let buffer = c.upload(&vec![round; size]).unwrap();
        assert_eq!(c.read(buffer.slice(0..4)).unwrap(), vec![round; 4]);
        c.free(&buffer).unwrap();
        c.sync().unwrap();
    }
    assert_eq!(
        c.bytes_reserved(),
        cached,
        "the pool grew while reusing one size"
    );
    // SAFETY: trimming only releases cached blocks the core no longer
    // hands out; it creates or destroys nothing the core tracks.
    unsafe { c.with_backend_mut(scope_core::Backend::trim) }.unwrap();
    assert_eq!(c.bytes_reserved(), 0);
    mock().assert_clean();
}

/// A buffer freed while the last work on it is being captured is freed
/// after the capture ends, not inside it (a free node in the graph).
#[test]
fn a_free_while_the_last_user_is_capturing_waits_for_the_end() {
    let c = client();
    let keep = c.allocate(256).unwrap();
    let doomed = c.allocate(1 << 20).unwrap();
    c.write(doomed.slice(0..16), &[1; 16]).unwrap();
    c.sync().unwrap();
    let capture = c.begin_capture().unwrap();
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&doomed)],
        &bytes(&[64, 2]),
        Dispatch::linear(1),
    )
    .unwrap();
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&keep)],
        &bytes(&[64, 3]),
        Dispatch::linear(1),
    )
    .unwrap();
    c.free(&doomed).unwrap();
    let deferred = c.bytes_reserved();
    assert!(deferred >= 1 << 20);
    mock().assert_clean();
    let graph = c.end_capture(capture).unwrap();
    // The graph wrote a freed buffer: the core refuses to replay it.
    assert!(c.replay(&graph).is_err());
    c.destroy_graph(&graph).unwrap();
    c.sync().unwrap();
    // The deferred free went out at the end of the capture: the block is
    // back in the pool and is reused.
    let again = c.allocate(1 << 20).unwrap();
    c.write(again.slice(0..16), &[9; 16]).unwrap();
    assert_eq!(c.read(again.slice(0..16)).unwrap(), vec![9; 16]);
    assert_eq!(c.bytes_reserved(), deferred);
    mock().assert_clean();
}

/// Destroying a graph waits on the host for its replays (rule 35): the
/// replay's stream has nothing outstanding when the graph goes.
#[test]
fn destroying_a_graph_waits_for_its_replays() {
    let c = client();
    let out = c.allocate(256).unwrap();
    let capture = c.begin_capture().unwrap();
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&out)],
        &bytes(&[64, 4]),
        Dispatch::linear(1),
    )
    .unwrap();
    let graph = c.end_capture(capture).unwrap();
    let stream = harness::raw_stream(&c, 0);
    c.replay(&graph).unwrap();
    assert!(
        mock().pending(stream) > 0,
        "the replay is not waited for yet"
    );
    let before = mock().graphs_destroyed_in_flight();
    c.destroy_graph(&graph).unwrap();
    assert_eq!(mock().pending(stream), 0, "destroy waited for the replay");
    assert_eq!(mock().graphs_destroyed_in_flight(), before);
    assert_eq!(words(&c.read(&out).unwrap()), vec![4; 64]);
    mock().assert_clean();
}

/// A capture the driver invalidates yields no graph: the end of capture
/// reports `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, and the window's
/// outputs carry it (rule 33). The stream keeps working.
#[test]
fn a_capture_invalidated_by_the_driver_claims_the_window_outputs() {
    let c = client();
    let out = c.allocate(256).unwrap();
    let capture = c.begin_capture().unwrap();
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&out)],
        &bytes(&[64, 8]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert!(mock().invalidate_capture(harness::raw_stream(&c, 0)));
    let sealed = c.end_capture(capture).unwrap_err();
    assert!(
        sealed
            .to_string()
            .contains("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"),
        "{sealed}"
    );
    let report = c.read(&out).unwrap_err();
    assert!(
        report
            .to_string()
            .contains("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"),
        "{report}"
    );
    assert!(c.poison().is_none());
    c.launch(
        &kernel("fill", FILL),
        &[Binding::write(&out)],
        &bytes(&[64, 9]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![9; 64]);
    mock().assert_clean();
}

/// A kernel's dynamic shared memory reaches the launch, and more than a
/// block holds is refused when the kernel compiles, typed, before the
/// driver would fail the launch inside its scope.
#[test]
fn dynamic_shared_memory_past_the_block_is_refused_at_compile() {
    let c = client();
    let room = c.limits().launch.max_workgroup_memory;
    // SAFETY: FILL declares no shared memory; the bytes are never used.
    let fits = unsafe { kernel("fill", FILL).dynamic_shared_memory(room) };
    c.compile(&fits).unwrap();
    // SAFETY: as above; this one never compiles.
    let past = unsafe { kernel("fill", FILL).dynamic_shared_memory(room + 1) };
    let error = c.compile(&past).unwrap_err();
    assert!(
        error.to_string().contains("dynamic shared memory"),
        "{error}"
    );
    assert!(matches!(error, Error::InvalidArgument { .. }), "{error}");
    mock().assert_clean();
}

/// What `Client::limits` reports is what the driver says of the device (an
/// H100/H200's numbers on the mock) and what `check_launch` enforces: a
/// grid at the edge of an axis runs, and a grid one block past any axis, or
/// a block past the device's, is an invalid argument refused before its
/// scope opens — nothing runs, nothing is claimed, and the driver is never
/// asked (it would fail the launch inside its scope instead).
#[test]
fn limits_are_the_devices_and_a_launch_past_them_is_refused() {
    let c = client();
    let limits = c.limits();
    assert_eq!(limits.max_allocation, 1 << 30);
    let launch = &limits.launch;
    assert_eq!(launch.max_workgroups, [2_147_483_647, 65_535, 65_535]);
    assert_eq!(launch.max_workgroup_size, [1024, 1024, 64]);
    assert_eq!(launch.max_invocations, 1024);
    assert_eq!(launch.max_workgroup_memory, 48 << 10);
    assert_eq!(launch.subgroup_size, Some((32, 32)));
    assert_eq!(launch.max_binding_size, 1 << 30);
    // The driver reports each kernel's parameters (`cuFuncGetParamInfo`):
    // as many and as large as any kernel can declare.
    assert_eq!(launch.max_bindings, 32 * 1024);
    assert_eq!(launch.max_scalar_bytes, 32 * 1024);
    let features = launch.features;
    assert!(features.f16 && features.f64 && features.i64, "{features:?}");
    assert!(
        features.f32_atomic_add && features.subgroups,
        "{features:?}"
    );

    let out = c.upload(&bytes(&[7; 64])).unwrap();
    let fill = kernel("fill", FILL);
    let edge = launch.max_workgroups[1];
    c.launch(
        &fill,
        &[Binding::write(&out)],
        &bytes(&[64, 3]),
        Dispatch::Groups([1, edge, 1]),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![3; 64]);
    for axis in 0..3 {
        let mut groups = [1; 3];
        groups[axis] = launch.max_workgroups[axis] + 1;
        let refused = c
            .launch(
                &fill,
                &[Binding::write(&out)],
                &bytes(&[64, 9]),
                Dispatch::Groups(groups),
            )
            .unwrap_err();
        assert!(
            matches!(&refused, Error::InvalidArgument { why, .. } if why.contains(&format!("axis {axis}"))),
            "{refused}"
        );
    }
    for block in [[1, 1, 65], [1024, 2, 1]] {
        let refused = c
            .launch(
                &kernel("fill", FILL).block(block),
                &[Binding::write(&out)],
                &bytes(&[64, 9]),
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
    mock().assert_clean();
}

/// One `#[test]` per case shared with the real-device tests, on the mock,
/// each ending with the mock's check that it refused nothing.
macro_rules! on_the_mock {
    ($($case:ident),* $(,)?) => {$(
        #[test]
        fn $case() {
            let c = client();
            common::cases::$case(&c);
            mock().assert_clean();
        }
    )*};
}

with_every_case!(on_the_mock);

/// Four ranks in four processes, each a child of this binary with its own
/// mock driver and mock NCCL, meeting in the mock NCCL's shared mode (a
/// file each maps, where real NCCL's ranks meet over the network).
mod across_processes {
    scope_test::conformance_tests!(@processes super::MockNcclSuite, "across_processes", |dir| {
        super::mock().shared_nccl_id(dir)
    });
}
