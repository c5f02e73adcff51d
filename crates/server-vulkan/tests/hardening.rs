//! The Vulkan server's hardening, through the public client:
//! what a kernel can reach, indirect counts past the device's limits, and
//! destroying a graph with replays in flight.

mod common;

use common::{bytes, fill, words};
use scope_core::{Binding, Dispatch, Kernel};

/// Writes `value` at `out[base + id.x]` for every invocation, with no bounds
/// check of its own: indices past the binding are the kernel's bug.
const SCRIBBLE: &str = r#"
struct Params { base: u32, value: u32 }
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@group(0) @binding(1) var<storage, read> params: Params;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    out[params.base + id.x] = params.value;
}
"#;

/// An out-of-bounds index in a WGSL kernel stays inside its own binding:
/// neither the rest of its buffer nor a neighbouring allocation (the pool
/// sub-allocates both from one `VkBuffer`) changes.
///
/// Lavapipe bounds-checks storage accesses by itself, so on lavapipe this
/// passed before the server restricted indices; the test holds the server
/// to it on drivers that do not.
#[test]
fn an_out_of_bounds_kernel_stays_inside_its_binding() {
    let Some(c) = common::validating_or_skip() else {
        return;
    };
    if c.describe().contains("llvmpipe") {
        assert!(
            c.with_backend(|b| b.robust_buffer_access()),
            "lavapipe offers robustBufferAccess; the server enables it"
        );
    }
    let whole = c.upload(&bytes(&[1; 256])).unwrap();
    let neighbour = c.upload(&bytes(&[2; 256])).unwrap();
    let kernel = Kernel::wgsl("scribble", SCRIBBLE);
    // The binding is words 0..64; the kernel writes words 32..32+64*16.
    c.launch(
        &kernel,
        &[whole.slice(0..256).write()],
        &bytes(&[32, 0xdead]),
        Dispatch::linear(16),
    )
    .unwrap();
    let got = words(&c.read(&whole).unwrap());
    assert!(got[..32].iter().all(|&w| w == 1), "before the writes");
    assert!(
        got[32..63].iter().all(|&w| w == 0xdead),
        "the writes in range"
    );
    assert!(
        got[64..].iter().all(|&w| w == 1),
        "past the binding, in the same buffer"
    );
    assert_eq!(words(&c.read(&neighbour).unwrap()), vec![2; 256]);
}

/// A WGSL binding that is not a storage buffer would not match the
/// push-descriptor layout (undefined behaviour): a compile error instead.
#[test]
fn a_wgsl_binding_that_is_not_a_storage_buffer_does_not_compile() {
    let Some(c) = common::validating_or_skip() else {
        return;
    };
    let uniform = Kernel::wgsl(
        "uniform",
        "@group(0) @binding(0) var<uniform> u: vec4<u32>;
         @group(0) @binding(1) var<storage, read_write> out: array<u32>;
         @compute @workgroup_size(1) fn main() { out[0] = u.x; }",
    );
    let error = c.compile(&uniform).expect_err("a uniform binding");
    assert!(
        matches!(&error, scope_core::Error::Compile { log, .. } if log.contains("var<storage>")),
        "{error}"
    );
}

/// A workgroup the device cannot run — too wide along an axis, too many
/// invocations, too much workgroup memory — is invalid usage when the
/// pipeline is made (undefined behaviour, which naga does not know to
/// prevent): a compile error naming the limit instead. The same kernel
/// within the limits compiles.
#[test]
fn a_workgroup_past_the_device_does_not_compile() {
    let Some(c) = common::validating_or_skip() else {
        return;
    };
    let limits = c.limits().launch;
    let kernel = |name: &str, size: String, shared_words: u32| {
        Kernel::wgsl(
            name,
            format!(
                "var<workgroup> scratch: array<u32, {shared_words}>;
                 @group(0) @binding(0) var<storage, read_write> out: array<u32>;
                 @compute @workgroup_size({size}) fn main() {{
                     scratch[0] = 1u;
                     workgroupBarrier();
                     out[0] = scratch[0];
                 }}"
            ),
        )
    };
    let [x, y, _] = limits.max_workgroup_size;
    // As wide as the device allows, then one row more than fits.
    let wide = x.min(limits.max_invocations);
    let rows = limits.max_invocations / wide + 1;
    assert!(rows <= y, "{limits:?}");
    let within = kernel("within", format!("{wide}"), limits.max_workgroup_memory / 4);
    c.compile(&within)
        .expect("a workgroup at the device's limits");
    for (name, size, shared, names) in [
        (
            "too wide",
            format!("{}", x + 1),
            1,
            "maxComputeWorkGroupSize",
        ),
        (
            "too many",
            format!("{wide}, {rows}"),
            1,
            "maxComputeWorkGroupInvocations",
        ),
        (
            "too much memory",
            "1".to_owned(),
            limits.max_workgroup_memory / 4 + 1,
            "maxComputeSharedMemorySize",
        ),
    ] {
        let error = c.compile(&kernel(name, size, shared)).expect_err(name);
        assert!(
            matches!(&error, scope_core::Error::Compile { log, .. } if log.contains(names)),
            "{name}: {error}"
        );
    }
}

fn indirect_counts(
    c: &scope_core::Client<server_vulkan::Vulkan>,
    x: u32,
    y: u32,
) -> scope_core::Buffer {
    // Counts at byte 20 of the buffer: 4-aligned, not binding-aligned.
    let mut w = vec![0u32; 16];
    w[5..8].copy_from_slice(&[x, y, 1]);
    c.upload(&bytes(&w)).unwrap()
}

/// An indirect count past `maxComputeWorkGroupCount` runs nothing and
/// returns at once; before the guard, `[u32::MAX, 1, 1]` ran on lavapipe
/// for hours (a sync gave up after 120 s with a timeout fault).
#[test]
fn an_indirect_count_past_the_limit_runs_nothing() {
    let Some(c) = common::validating_or_skip() else {
        return;
    };
    let max = c.with_backend(|b| b.max_workgroups());
    let out = c.upload(&bytes(&[4; 64])).unwrap();
    let start = std::time::Instant::now();
    for (x, y) in [(u32::MAX, 1), (1, max[1] + 1), (max[0] + 1, 1)] {
        let counts = indirect_counts(&c, x, y);
        c.launch(
            &fill(),
            &[Binding::write(&out)],
            &bytes(&[64, 9]),
            Dispatch::Indirect(counts.slice(20..32)),
        )
        .unwrap();
        c.sync().unwrap();
        assert_eq!(
            words(&c.read(&out).unwrap()),
            vec![4; 64],
            "[{x}, {y}, 1] ran nothing"
        );
    }
    assert!(
        start.elapsed() < std::time::Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
    // A count within the limits runs, read through the same guard.
    let counts = indirect_counts(&c, 1, 1);
    c.launch(
        &fill(),
        &[Binding::write(&out)],
        &bytes(&[64, 9]),
        Dispatch::Indirect(counts.slice(20..32)),
    )
    .unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![9; 64]);
}

/// The guard is part of a captured graph: each replay judges the counts it
/// finds in memory then.
#[test]
fn a_replayed_indirect_launch_judges_the_counts_of_each_replay() {
    let Some(c) = common::validating_or_skip() else {
        return;
    };
    let out = c.upload(&bytes(&[4; 64])).unwrap();
    let counts = indirect_counts(&c, 1, 1);
    let capture = c.begin_capture().unwrap();
    c.launch(
        &fill(),
        &[Binding::write(&out)],
        &bytes(&[64, 7]),
        Dispatch::Indirect(counts.slice(20..32)),
    )
    .unwrap();
    let graph = c.end_capture(capture).unwrap();
    c.write(counts.slice(20..32), &bytes(&[u32::MAX, 1, 1]))
        .unwrap();
    c.replay(&graph).unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![4; 64], "ran nothing");
    c.write(counts.slice(20..32), &bytes(&[1, 1, 1])).unwrap();
    c.replay(&graph).unwrap();
    assert_eq!(words(&c.read(&out).unwrap()), vec![7; 64], "ran");
    c.destroy_graph(&graph).unwrap();
}

/// Rule 35: destroying a graph waits for its replays in flight. Before,
/// the Vulkan server dropped its handle at once and the replay was still
/// in the stream's unsubmitted batch.
#[test]
fn destroying_a_graph_waits_for_its_replays() {
    let Some(c) = common::validating_or_skip() else {
        return;
    };
    let out = c.try_allocate(64 * 1024 * 4).unwrap();
    let capture = c.begin_capture().unwrap();
    for value in 0..8 {
        c.launch(
            &fill(),
            &[Binding::write(&out)],
            &bytes(&[64 * 1024, value]),
            Dispatch::linear(1024),
        )
        .unwrap();
    }
    let graph = c.end_capture(capture).unwrap();
    c.sync().unwrap();
    c.replay(&graph).unwrap();
    c.destroy_graph(&graph).unwrap();
    assert_eq!(
        c.with_backend(|b| b.streams_with_work_outstanding()),
        0,
        "the replay finished before destroy returned"
    );
    assert_eq!(words(&c.read(out.slice(0..64)).unwrap()), vec![7; 16]);
}
