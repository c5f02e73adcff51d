//! The wgpu server's own behaviours, on both software adapters: compile
//! errors with positions, limits as typed errors, launch checks that stand in
//! for wgpu's deferred validation, a large kernel against a CPU reference, a
//! failing chain, many replays, device loss and stray errors.

mod common;

use scope_core::{Binding, Client, Dispatch, Error, FaultPlan, Kernel, Site, StreamId};
use scope_test::client_or_skip;
use server_wgpu::{Api, Wgpu};

use common::{ADD, BROKEN, COPY, FILL, bytes, words};

/// `acc[i] += x[i]` for `i < n`: a read-modify-write, so every replay shows.
const ACCUMULATE: &str = "
@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> acc: array<u32>;
@group(0) @binding(2) var<storage, read> n: u32;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < n) { acc[id.x] = acc[id.x] + x[id.x]; }
}
";

/// Needs a binding of at least 64 bytes.
const FIXED: &str = "
@group(0) @binding(0) var<storage, read_write> out: array<u32, 16>;
@compute @workgroup_size(16)
fn main(@builtin(local_invocation_index) i: u32) { out[i] = i; }
";

/// Seven bindings, the last needing at least 64 bytes.
const SEVEN: &str = "
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(0) @binding(2) var<storage, read> c: array<u32>;
@group(0) @binding(3) var<storage, read> d: array<u32>;
@group(0) @binding(4) var<storage, read> e: array<u32>;
@group(0) @binding(5) var<storage, read> f: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<u32, 16>;
@compute @workgroup_size(16)
fn main(@builtin(local_invocation_index) i: u32) {
    out[i] = a[0] + b[0] + c[0] + d[0] + e[0] + f[0] + i;
}
";

fn scalars(values: &[u32]) -> Vec<u8> {
    bytes(values)
}

fn groups(n: u32) -> Dispatch<'static> {
    Dispatch::linear(n.div_ceil(64))
}

fn setup(api: Api) -> Option<Client<Wgpu>> {
    client_or_skip(|| common::client_on(api))
}

fn read_words(c: &Client<Wgpu>, b: &scope_core::Buffer) -> scope_core::Result<Vec<u32>> {
    c.read(b).map(|v| words(&v))
}

/// The adapter is the one asked for, and says it is software here.
pub fn describes_the_adapter(api: Api) {
    let Some(c) = setup(api) else { return };
    let text = c.describe().to_owned();
    assert!(text.contains(api.name()), "{text}");
    let kind = c.with_backend(|b| b.adapter_info().device_type);
    if kind == wgpu::DeviceType::Cpu {
        assert!(text.contains("software"), "{text}");
    }
}

/// A WGSL error is a compile error with naga's message and its
/// `line:column`, claims the launch's outputs, and leaves the device working.
pub fn invalid_wgsl_names_line_and_column(api: Api) {
    let Some(c) = setup(api) else { return };
    let broken = Kernel::wgsl("broken", BROKEN);
    let error = c.compile(&broken).unwrap_err();
    let Error::Compile { log, .. } = &error else {
        panic!("{error}")
    };
    println!("{log}");
    assert!(log.contains("undefined_name"), "{log}");
    assert!(
        log.contains(":4:"),
        "the log should carry line 4 and a column: {log}"
    );
    let input = c.upload(&bytes(&[1; 64])).unwrap();
    let out = c.upload(&bytes(&[2; 64])).unwrap();
    let launched = c.launch(
        &broken,
        &[Binding::read(&input), Binding::write(&out)],
        &[],
        groups(64),
    );
    assert!(
        matches!(launched, Err(Error::Compile { .. })),
        "{launched:?}"
    );
    let on_read = c.read(&out).unwrap_err();
    assert!(on_read.to_string().contains(":4:24"), "{on_read}");
    // A valid shader that names a missing entry point fails the pipeline,
    // inside the scope, as a compile error too.
    let wrong_entry = Kernel::wgsl("fill", FILL).entry("nope");
    assert!(matches!(
        c.compile(&wrong_entry),
        Err(Error::Compile { .. })
    ));
    // SPIR-V is not taken.
    assert!(matches!(
        // SAFETY: never reaches a driver: server-wgpu does not take
        // SPIR-V (asserted here).
        c.compile(&unsafe { Kernel::spirv("x", vec![0u32; 5]) }),
        Err(Error::Compile { .. })
    ));
    let fill = Kernel::wgsl("fill", FILL);
    c.launch(
        &fill,
        &[Binding::write(&out)],
        &scalars(&[64, 9]),
        groups(64),
    )
    .unwrap();
    assert_eq!(read_words(&c, &out).unwrap(), vec![9; 64]);
}

/// Allocations past `max_buffer_size` or the storage-binding limit are
/// invalid arguments, never a wgpu panic; the device keeps working.
pub fn over_limit_buffer_is_typed(api: Api) {
    let Some(c) = setup(api) else { return };
    let (max_buffer, max_binding, max) = c.with_backend(|b| {
        use scope_core::Backend;
        (
            b.limits().max_buffer_size,
            b.limits().max_storage_buffer_binding_size,
            b.max_allocation(),
        )
    });
    assert_eq!(max, max_buffer.min(max_binding));
    for size in [max + 4, max_buffer + 4, u64::MAX - 3] {
        match c.allocate(size) {
            Err(Error::InvalidArgument { why, .. }) => {
                assert!(why.contains("largest allocation"), "{why}")
            }
            other => panic!("{size} bytes: expected an invalid argument, got {other:?}"),
        }
    }
    // The largest allowed allocation works, is written and read back.
    let big = c.try_allocate(max).unwrap();
    c.write(big.slice(max - 8..), &bytes(&[1, 2])).unwrap();
    assert_eq!(words(&c.read(big.slice(max - 8..)).unwrap()), vec![1, 2]);
    assert!(c.bytes_reserved() >= max);
}

/// A binding past the end of its buffer, a binding smaller than the
/// shader's type, too many workgroups, a binding count that does not match
/// the shader, or one buffer bound read-only and writable at once are each
/// refused before the launch's scope opens (`Backend::check_launch`): an
/// invalid argument naming what was wrong, which claims nothing and fires
/// no hook — and is caught before wgpu's deferred validation would refuse
/// the whole batch.
pub fn launch_checks_stand_in_for_deferred_validation(api: Api) {
    let Some(c) = setup(api) else { return };
    let fill = Kernel::wgsl("fill", FILL);
    let buf = c.upload(&bytes(&[7; 64])).unwrap();
    let past_end = c.launch(
        &fill,
        &[buf.slice(0..512).write()],
        &scalars(&[128, 0]),
        groups(128),
    );
    assert!(
        matches!(past_end, Err(Error::InvalidArgument { .. })),
        "{past_end:?}"
    );
    assert_eq!(
        read_words(&c, &buf).unwrap(),
        vec![7; 64],
        "nothing ran, nothing claimed"
    );

    let held = c.failures_held();
    let seen = c.failures_seen();
    let launch_error = |r: scope_core::Result<()>, text: &str| match r {
        Err(Error::InvalidArgument { what, why }) => {
            assert!(
                what.contains('`') && format!("{what}: {why}").contains(text),
                "{what}: {why}"
            )
        }
        other => panic!("expected an invalid argument about {text:?}, got {other:?}"),
    };
    let fixed = Kernel::wgsl("fixed", FIXED);
    let small = c.allocate(32).unwrap();
    launch_error(
        c.launch(&fixed, &[Binding::write(&small)], &[], Dispatch::linear(1)),
        "at least 64",
    );
    assert!(c.read(&small).is_ok(), "the outputs are not claimed");
    launch_error(
        c.launch(
            &fill,
            &[Binding::write(&buf)],
            &scalars(&[64, 1]),
            Dispatch::linear(1 << 20),
        ),
        "workgroups",
    );
    launch_error(
        c.launch(&fill, &[Binding::write(&buf)], &[], groups(64)),
        "declares 2 bindings",
    );
    let copy = Kernel::wgsl("copy", COPY);
    let whole = c.upload(&bytes(&[3; 128])).unwrap();
    launch_error(
        c.launch(
            &copy,
            &[whole.slice(0..256).read(), whole.slice(256..).write()],
            &scalars(&[64]),
            groups(64),
        ),
        "same buffer",
    );
    assert_eq!(c.failures_held(), held, "nothing was claimed");
    assert_eq!(c.failures_seen(), seen, "no failure was seen");
    assert_eq!(read_words(&c, &buf).unwrap(), vec![7; 64]);
    // The device is fine.
    c.launch(
        &fill,
        &[Binding::write(&buf)],
        &scalars(&[64, 5]),
        groups(64),
    )
    .unwrap();
    assert_eq!(read_words(&c, &buf).unwrap(), vec![5; 64]);
    c.launch(&fixed, &[Binding::write(&whole)], &[], Dispatch::linear(1))
        .unwrap();
    assert_eq!(
        read_words(&c, &whole).unwrap()[..16],
        (0..16).collect::<Vec<_>>()[..]
    );
    c.sync().unwrap();
}

/// The server skips its check of a launch exactly like the one it last
/// accepted (same pipeline, buffers, ranges and scalar length): each launch
/// here differs from an accepted one in one thing the check reads — a
/// range's length, a scalar blob, which buffer a binding names, the last
/// of more bindings than the server remembers — and is still refused,
/// claiming nothing; the accepted launch, repeated, still runs.
pub fn a_launch_like_an_accepted_one_is_still_checked(api: Api) {
    let Some(c) = setup(api) else { return };
    let refused = |r: scope_core::Result<()>, text: &str| match r {
        Err(Error::InvalidArgument { what, why }) => {
            assert!(format!("{what}: {why}").contains(text), "{what}: {why}")
        }
        other => panic!("expected an invalid argument about {text:?}, got {other:?}"),
    };
    let fixed = Kernel::wgsl("fixed", FIXED);
    let whole = c.upload(&bytes(&[9; 16])).unwrap();
    let accepted = || c.launch(&fixed, &[Binding::write(&whole)], &[], Dispatch::linear(1));
    accepted().unwrap();
    refused(
        c.launch(
            &fixed,
            &[whole.slice(0..32).write()],
            &[],
            Dispatch::linear(1),
        ),
        "at least 64",
    );
    accepted().unwrap();
    refused(
        c.launch(
            &fixed,
            &[Binding::write(&whole)],
            &scalars(&[1]),
            Dispatch::linear(1),
        ),
        "declares 1 binding",
    );
    accepted().unwrap();

    let copy = Kernel::wgsl("copy", COPY);
    let src = c.upload(&bytes(&[4; 64])).unwrap();
    let out = c.allocate(256).unwrap();
    let copied = |from: &scope_core::Buffer| {
        c.launch(
            &copy,
            &[Binding::read(from), out.slice(0..256).write()],
            &scalars(&[64]),
            groups(64),
        )
    };
    copied(&src).unwrap();
    refused(copied(&out), "same buffer");

    // More bindings than the server remembers of a launch: each launch is
    // checked, so one that differs only in its last binding is refused.
    let seven = Kernel::wgsl("seven", SEVEN);
    let inputs: Vec<_> = (0..6)
        .map(|_| c.upload(&bytes(&[1; 16])).unwrap())
        .collect();
    let sevenfold = |last: &scope_core::Buffer| {
        let mut bindings: Vec<_> = inputs.iter().map(Binding::read).collect();
        bindings.push(Binding::write(last));
        c.launch(&seven, &bindings, &[], Dispatch::linear(1))
    };
    sevenfold(&whole).unwrap();
    let small = c.allocate(32).unwrap();
    refused(sevenfold(&small), "at least 64");
    sevenfold(&whole).unwrap();
    assert_eq!(c.failures_held(), 0, "no refusal claimed anything");
    copied(&src).unwrap();
    assert_eq!(read_words(&c, &out).unwrap(), vec![4; 64]);
    assert_eq!(
        read_words(&c, &whole).unwrap(),
        (6..22).collect::<Vec<_>>(),
        "the last launch, of seven bindings, ran"
    );
}

/// One million elements through `add`, against a CPU reference.
pub fn million_element_add_matches_cpu(api: Api) {
    let Some(c) = setup(api) else { return };
    let n: u32 = 1 << 20;
    let a: Vec<u32> = (0..n).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let b: Vec<u32> = (0..n).map(|i| i ^ 0x5555_5555).collect();
    let expected: Vec<u32> = a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y)).collect();
    let da = c.upload(&bytes(&a)).unwrap();
    let db = c.upload(&bytes(&b)).unwrap();
    let out = c.allocate(u64::from(n) * 4).unwrap();
    let add = Kernel::wgsl("add", ADD);
    c.launch(
        &add,
        &[Binding::read(&da), Binding::read(&db), Binding::write(&out)],
        &scalars(&[n]),
        groups(n),
    )
    .unwrap();
    let got = read_words(&c, &out).unwrap();
    assert_eq!(got.len(), expected.len());
    let first_wrong = got.iter().zip(&expected).position(|(g, e)| g != e);
    assert_eq!(first_wrong, None, "element {first_wrong:?} differs");
}

/// fill → copy (fails) → add → copy: the last read names the root and every
/// skipped hop; the first stage's output is untouched; a rewrite heals.
pub fn chain_with_a_failure_in_the_middle(api: Api) {
    let Some(c) = setup(api) else { return };
    let fill = Kernel::wgsl("fill", FILL);
    let copy = Kernel::wgsl("copy", COPY);
    let add = Kernel::wgsl("add", ADD);
    let n = 256u32;
    let size = u64::from(n) * 4;
    let [a, b, sum, last] = [(); 4].map(|_| c.allocate(size).unwrap());
    c.launch(&fill, &[Binding::write(&a)], &scalars(&[n, 4]), groups(n))
        .unwrap();
    c.inject(FaultPlan::new().fail(
        Site::Launch,
        1,
        Error::Launch {
            kernel: "copy".into(),
            stream: StreamId(0),
            detail: "injected in the middle".into(),
        },
    ));
    assert!(
        c.launch(
            &copy,
            &[Binding::read(&a), Binding::write(&b)],
            &scalars(&[n]),
            groups(n)
        )
        .is_err()
    );
    let skipped = c.launch(
        &add,
        &[Binding::read(&a), Binding::read(&b), Binding::write(&sum)],
        &scalars(&[n]),
        groups(n),
    );
    assert!(matches!(skipped, Err(Error::Skipped { .. })), "{skipped:?}");
    let skipped = c.launch(
        &copy,
        &[Binding::read(&sum), Binding::write(&last)],
        &scalars(&[n]),
        groups(n),
    );
    assert!(matches!(skipped, Err(Error::Skipped { .. })), "{skipped:?}");
    let report = c.read(&last).unwrap_err();
    let entry = &report.unwritten()[0];
    assert!(
        entry.root.to_string().contains("injected in the middle"),
        "{report}"
    );
    let hops: Vec<&str> = entry.chain.hops.iter().map(|h| &*h.kernel).collect();
    assert_eq!(hops, ["copy", "add"], "{report}");
    assert_eq!(
        read_words(&c, &a).unwrap(),
        vec![4; n as usize],
        "upstream is clean"
    );
    // Rerun the middle: everything downstream runs and heals.
    c.launch(
        &copy,
        &[Binding::read(&a), Binding::write(&b)],
        &scalars(&[n]),
        groups(n),
    )
    .unwrap();
    c.launch(
        &add,
        &[Binding::read(&a), Binding::read(&b), Binding::write(&sum)],
        &scalars(&[n]),
        groups(n),
    )
    .unwrap();
    c.launch(
        &copy,
        &[Binding::read(&sum), Binding::write(&last)],
        &scalars(&[n]),
        groups(n),
    )
    .unwrap();
    assert_eq!(read_words(&c, &last).unwrap(), vec![8; n as usize]);
    assert_eq!(c.failures_held(), 0);
}

/// A window of a host write, a launch and a copy, replayed 1,000 times: every
/// replay writes the bytes given at record time and runs the launch once.
pub fn thousand_replays_of_a_window(api: Api) {
    let Some(c) = setup(api) else { return };
    let acc_kernel = Kernel::wgsl("accumulate", ACCUMULATE);
    let n = 128u32;
    let size = u64::from(n) * 4;
    let x = c.upload(&bytes(&vec![0; n as usize])).unwrap();
    let acc = c.upload(&bytes(&vec![0; n as usize])).unwrap();
    let mirror = c.allocate(size).unwrap();
    let recorded: Vec<u32> = (0..n).collect();
    let capture = c.begin_capture().unwrap();
    c.write(&x, &bytes(&recorded)).unwrap();
    c.launch(
        &acc_kernel,
        &[Binding::read(&x), Binding::read_write(&acc)],
        &scalars(&[n]),
        groups(n),
    )
    .unwrap();
    c.copy(&acc, &mirror).unwrap();
    let graph = c.end_capture(capture).unwrap();
    assert_eq!(
        read_words(&c, &acc).unwrap(),
        vec![0; n as usize],
        "nothing ran until a replay"
    );
    for i in 0..1000 {
        if i == 500 {
            // Bytes written between replays are overwritten by the
            // recorded write.
            c.write(&x, &bytes(&vec![1000; n as usize])).unwrap();
        }
        c.replay(&graph).unwrap();
    }
    let expected: Vec<u32> = recorded.iter().map(|v| v * 1000).collect();
    assert_eq!(read_words(&c, &acc).unwrap(), expected);
    assert_eq!(read_words(&c, &mirror).unwrap(), expected);
    assert_eq!(read_words(&c, &x).unwrap(), recorded);
    c.destroy_graph(&graph).unwrap();
    assert_eq!(c.failures_held(), 0);
}

/// A lost device is learned at the next call that reaches it (here the
/// sync); that call and every later one get a sticky fault, which poisons
/// the device and lands on the work that was in flight.
pub fn device_loss_poisons(api: Api) {
    let Some(c) = setup(api) else { return };
    let fill = Kernel::wgsl("fill", FILL);
    let buf = c.allocate(256).unwrap();
    c.launch(
        &fill,
        &[Binding::write(&buf)],
        &scalars(&[64, 1]),
        groups(64),
    )
    .unwrap();
    c.sync().unwrap();
    c.with_backend(|b| b.raw().0.destroy());
    // wgpu reports the loss at its next poll, so this may still be encoded.
    let _ = c.launch(
        &fill,
        &[Binding::write(&buf)],
        &scalars(&[64, 2]),
        groups(64),
    );
    let error = c.sync().unwrap_err();
    assert!(error.is_sticky(), "{error}");
    assert!(error.to_string().contains("DEVICE_LOST"), "{error}");
    assert!(c.poison().is_some());
    assert!(c.allocate(64).unwrap_err().is_device_poisoned());
    assert!(c.read(&buf).unwrap_err().is_device_poisoned());
}

/// An error raised outside every scope reaches the server's handler, not
/// wgpu's panicking default, and surfaces at the next sync as a late fault.
pub fn stray_errors_never_panic(api: Api) {
    let Some(c) = setup(api) else { return };
    c.with_backend(|b| {
        // MAP_READ with STORAGE is invalid; no scope is open.
        let _ = b.raw().0.create_buffer(&wgpu::BufferDescriptor {
            label: Some("stray"),
            size: 64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
    });
    let error = c.sync().unwrap_err();
    assert!(
        matches!(&error, Error::Fault(f) if !f.class.poisons()),
        "{error}"
    );
    assert!(c.poison().is_none());
    c.sync().unwrap();
}

/// Freed buffers are reused by size class: the reservation does not grow.
pub fn freed_buffers_are_reused(api: Api) {
    let Some(c) = setup(api) else { return };
    let fill = Kernel::wgsl("fill", FILL);
    let first = c.allocate(4000).unwrap();
    c.launch(
        &fill,
        &[Binding::write(&first)],
        &scalars(&[1000, 1]),
        groups(1000),
    )
    .unwrap();
    drop(first);
    let reserved = c.bytes_reserved();
    assert!(reserved >= 4000);
    for i in 0..50u32 {
        let b = c.allocate(3900 + u64::from(i) * 4).unwrap();
        c.launch(
            &fill,
            &[Binding::write(&b)],
            &scalars(&[900, i]),
            groups(900),
        )
        .unwrap();
        assert_eq!(words(&c.read(b.slice(0..8)).unwrap()), vec![i, i]);
    }
    assert_eq!(
        c.bytes_reserved(),
        reserved,
        "one class, one buffer, reused"
    );
}

/// Two streams share buffers through the core's ordering; each batches on
/// its own, and the results are in order.
pub fn streams_order_through_one_queue(api: Api) {
    let Some(c) = setup(api) else { return };
    let other = c.new_stream().unwrap();
    let fill = Kernel::wgsl("fill", FILL);
    let add = Kernel::wgsl("add", ADD);
    let n = 1024u32;
    let size = u64::from(n) * 4;
    let [a, b, sum] = [(); 3].map(|_| c.allocate(size).unwrap());
    for round in 1..20u32 {
        c.launch(
            &fill,
            &[Binding::write(&a)],
            &scalars(&[n, round]),
            groups(n),
        )
        .unwrap();
        other
            .launch(
                &fill,
                &[Binding::write(&b)],
                &scalars(&[n, 2 * round]),
                groups(n),
            )
            .unwrap();
        other
            .launch(
                &add,
                &[Binding::read(&a), Binding::read(&b), Binding::write(&sum)],
                &scalars(&[n]),
                groups(n),
            )
            .unwrap();
        assert_eq!(read_words(&c, &sum).unwrap(), vec![3 * round; n as usize]);
    }
}

/// Many launches with distinct scalars in one batch: each sees its own blob.
pub fn scalars_are_per_launch(api: Api) {
    let Some(c) = setup(api) else { return };
    let fill = Kernel::wgsl("fill", FILL);
    let count = 3000u32; // past one batch and one arena
    let out = c.allocate(u64::from(count) * 256).unwrap();
    for i in 0..count {
        let slice = out.slice(u64::from(i) * 256..u64::from(i + 1) * 256);
        c.launch(&fill, &[slice.write()], &scalars(&[64, i]), groups(64))
            .unwrap();
    }
    let got = read_words(&c, &out).unwrap();
    for i in 0..count as usize {
        assert_eq!(got[i * 64], i as u32, "launch {i}");
        assert_eq!(got[i * 64 + 63], i as u32, "launch {i}");
    }
}

/// An indirect count past `max_compute_workgroups_per_dimension` runs
/// nothing and returns at once, in a launch and in a replay; a count within
/// the limit runs. Before the instance kept wgpu's indirect-call validation
/// on, `[u32::MAX, 1, 1]` hung lavapipe and llvmpipe (still running after
/// 150 s).
pub fn an_indirect_count_past_the_limit_runs_nothing(api: Api) {
    let Some(c) = setup(api) else { return };
    let fill = Kernel::wgsl("fill", FILL);
    let max = c.with_backend(|b| b.limits().max_compute_workgroups_per_dimension);
    let out = c.upload(&bytes(&[4; 64])).unwrap();
    let counts = c.allocate(64).unwrap();
    let start = std::time::Instant::now();
    for bad in [[u32::MAX, 1, 1], [1, max + 1, 1], [1, 1, max + 1]] {
        c.write(counts.slice(16..28), &bytes(&bad)).unwrap();
        c.launch(
            &fill,
            &[Binding::write(&out)],
            &scalars(&[64, 9]),
            Dispatch::Indirect(counts.slice(16..28)),
        )
        .unwrap();
        c.sync().unwrap();
        assert_eq!(read_words(&c, &out).unwrap(), vec![4; 64], "{bad:?}");
    }
    let capture = c.begin_capture().unwrap();
    c.launch(
        &fill,
        &[Binding::write(&out)],
        &scalars(&[64, 9]),
        Dispatch::Indirect(counts.slice(16..28)),
    )
    .unwrap();
    let graph = c.end_capture(capture).unwrap();
    c.replay(&graph).unwrap();
    assert_eq!(read_words(&c, &out).unwrap(), vec![4; 64], "replayed");
    assert!(
        start.elapsed() < std::time::Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
    c.write(counts.slice(16..28), &bytes(&[1, 1, 1])).unwrap();
    c.replay(&graph).unwrap();
    assert_eq!(read_words(&c, &out).unwrap(), vec![9; 64]);
    c.destroy_graph(&graph).unwrap();
}

/// Rule 35: destroying a graph waits for its replays. Before, the replay
/// was still in the stream's open batch when destroy returned.
pub fn destroying_a_graph_waits_for_its_replays(api: Api) {
    let Some(c) = setup(api) else { return };
    let fill = Kernel::wgsl("fill", FILL);
    let out = c.allocate(64 * 4).unwrap();
    let capture = c.begin_capture().unwrap();
    c.launch(
        &fill,
        &[Binding::write(&out)],
        &scalars(&[64, 3]),
        groups(64),
    )
    .unwrap();
    let graph = c.end_capture(capture).unwrap();
    c.sync().unwrap();
    c.replay(&graph).unwrap();
    c.destroy_graph(&graph).unwrap();
    assert!(
        !c.with_backend(|b| b.work_outstanding()),
        "the replay finished before destroy returned"
    );
    assert_eq!(read_words(&c, &out).unwrap(), vec![3; 64]);
}

macro_rules! on_each_api {
    ($($name:ident),* $(,)?) => {
        mod vulkan {
            $( #[test] fn $name() { super::$name(server_wgpu::Api::Vulkan); } )*
        }
        mod gl {
            $( #[test] fn $name() { super::$name(server_wgpu::Api::Gl); } )*
        }
    };
}

/// Every adapter an API offers is numbered, in the server's order: adapter
/// 0 is the one a plain open chooses, each index opens a server of its own,
/// and the index past them does not exist.
pub fn adapters_are_numbered(api: Api) {
    let Some(chosen) = setup(api) else { return };
    let count = server_wgpu::adapter_count(&server_wgpu::Options::api(api));
    assert!(count >= 1, "an adapter opened, so at least one is numbered");
    let numbered = |index| server_wgpu::Options {
        index: Some(index),
        ..server_wgpu::Options::api(api)
    };
    let on_zero = server_wgpu::client_with(&numbered(0)).unwrap();
    assert_eq!(chosen.describe(), on_zero.describe());
    let mine = chosen.upload(&[0; 16]).unwrap();
    assert!(
        matches!(on_zero.read(&mine), Err(Error::InvalidArgument { .. })),
        "a server of its own: the other's buffer is foreign to it"
    );
    for index in 1..count {
        let other =
            server_wgpu::client_with(&numbered(index)).expect("every numbered adapter opens");
        println!("adapter {index}: {}", other.describe());
    }
    match server_wgpu::client_with(&numbered(count)) {
        Err(Error::BackendUnavailable { reason, .. }) => {
            assert!(reason.contains("does not exist"), "{reason}")
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
}

on_each_api!(
    adapters_are_numbered,
    describes_the_adapter,
    invalid_wgsl_names_line_and_column,
    over_limit_buffer_is_typed,
    launch_checks_stand_in_for_deferred_validation,
    a_launch_like_an_accepted_one_is_still_checked,
    an_indirect_count_past_the_limit_runs_nothing,
    destroying_a_graph_waits_for_its_replays,
    million_element_add_matches_cpu,
    chain_with_a_failure_in_the_middle,
    thousand_replays_of_a_window,
    device_loss_poisons,
    stray_errors_never_panic,
    freed_buffers_are_reused,
    streams_order_through_one_queue,
    scalars_are_per_launch,
);

#[test]
fn unknown_adapter_is_unavailable_and_says_what_was_found() {
    let options = server_wgpu::Options {
        adapter: Some("no-such-adapter-anywhere".into()),
        ..server_wgpu::Options::default()
    };
    match server_wgpu::client_with(&options) {
        Err(Error::BackendUnavailable { reason, .. }) => {
            assert!(reason.contains("no-such-adapter"), "{reason}")
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    match server_wgpu::client_with(&server_wgpu::Options::api(Api::Metal)) {
        Err(Error::BackendUnavailable { reason, .. }) => {
            assert!(reason.contains("metal"), "{reason}")
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
}

#[test]
fn probe_lists_adapters_per_api() {
    let probe = server_wgpu::probe();
    assert_eq!(probe.backend, "wgpu");
    for device in &probe.devices {
        assert!(
            device.detail.starts_with("vulkan") || device.detail.starts_with("gl"),
            "{device:?}"
        );
    }
    if scope_test::required("wgpu") {
        assert!(probe.has_device(), "{probe:?}");
    }
    println!("{probe:?}");
}
