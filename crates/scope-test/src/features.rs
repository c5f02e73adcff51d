//! The optional features a server enables where its device offers them: 16-bit floats, subgroup
//! operations, `f32` atomics. Each is used by a WGSL kernel, for a backend that compiles WGSL
//! ([`Capability::Wgsl`]). Where the server reports a feature
//! ([`DeviceFeatures`](scope_core::DeviceFeatures)), its kernel runs and gives the right numbers.
//! Where it does not, the kernel is a compile error, never one that runs without what it needs.

use super::*;

/// `out[i] = f16(x[i]) * 1.5 + 0.25`, in `f16`, into an `f16` buffer.
const F16: &str = "
enable f16;
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f16>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i < arrayLength(&out) && i < arrayLength(&x)) {
        out[i] = f16(x[i]) * 1.5h + 0.25h;
    }
}
";

/// Per invocation, five words. The subgroup's size, `subgroupAdd(1)`, and `subgroupMax` of the lane
/// index. Lane 0's lane index by `subgroupShuffle`, and whether `subgroupAll` saw every lane agree.
const SUBGROUPS: &str = "
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(
    @builtin(global_invocation_id) id: vec3<u32>,
    @builtin(subgroup_size) size: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    subgroupBarrier();
    let lanes = subgroupAdd(1u);
    let at = id.x * 5u;
    out[at] = size;
    out[at + 1u] = lanes;
    out[at + 2u] = subgroupMax(lane);
    out[at + 3u] = subgroupShuffle(lane, 0u);
    out[at + 4u] = select(0u, 1u, subgroupAll(lanes == subgroupBroadcastFirst(lanes)));
}
";

/// Every invocation adds 0.5 to `acc[0]` and subtracts 0.25 from `acc[2]`. The first exchanges 3.0
/// into `acc[1]`.
const F32_ATOMICS: &str = "
@group(0) @binding(0) var<storage, read_write> acc: array<atomic<f32>>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    atomicAdd(&acc[0], 0.5);
    atomicSub(&acc[2], 0.25);
    if (id.x == 0u) {
        atomicExchange(&acc[1], 3.0);
    }
}
";

/// An `f16`'s value (normal numbers and zero, which is all the tests make).
fn f16_value(bits: u16) -> f32 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((bits >> 10) & 0x1f);
    let mantissa = f32::from(bits & 0x3ff);
    assert!(exponent != 0x1f, "not a finite f16: {bits:#06x}");
    if exponent == 0 {
        return sign * mantissa * 2f32.powi(-24);
    }
    sign * (1.0 + mantissa / 1024.0) * 2f32.powi(exponent - 15)
}

/// A kernel the server did not enable the features for does not compile.
fn refused<B: Backend>(c: &Client<B>, kernel: &Kernel, what: &str) {
    let error = c.compile(kernel).map(drop).unwrap_err();
    assert!(
        matches!(error, Error::Compile { .. }),
        "{what} is not enabled, so the kernel must not compile: {error}"
    );
    println!("{what} not enabled on {}: {error}", c.describe());
}

/// The subgroup size range is reported exactly when subgroups are.
pub fn subgroup_sizes_come_with_subgroups<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let launch = &c.limits().launch;
    let features = launch.features;
    println!(
        "{}: {features:?}, subgroup size {:?}",
        c.describe(),
        launch.subgroup_size
    );
    assert_eq!(launch.subgroup_size.is_some(), features.subgroups);
}

/// An `f16` kernel gives `f16` arithmetic's numbers where `f16` is enabled, and does not compile
/// where it is not.
pub fn f16_kernels_run_where_f16_is_enabled<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let kernel = Kernel::wgsl("f16", F16);
    if !c.limits().launch.features.f16 {
        return refused(&c, &kernel, "f16");
    }
    let x: Vec<f32> = (0..64u16).map(f32::from).collect();
    let input = c
        .upload(&x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>())
        .unwrap();
    let out = c.upload(&[0u8; 128]).unwrap();
    c.launch(
        &kernel,
        &[Binding::read(&input), Binding::write(&out)],
        &[],
        Dispatch::linear(1),
    )
    .unwrap();
    let halves: Vec<f32> = c
        .read(&out)
        .unwrap()
        .chunks_exact(2)
        .map(|h| f16_value(u16::from_le_bytes([h[0], h[1]])))
        .collect();
    let expected: Vec<f32> = x.iter().map(|v| v * 1.5 + 0.25).collect();
    assert_eq!(halves, expected);
}

/// Subgroup operations see full subgroups of a size inside the reported range where subgroups are
/// enabled. The kernel does not compile where they are not.
pub fn subgroup_kernels_run_where_subgroups_are_enabled<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let kernel = Kernel::wgsl("subgroups", SUBGROUPS);
    let Some((min, max)) = c.limits().launch.subgroup_size else {
        return refused(&c, &kernel, "subgroups");
    };
    let invocations = 256;
    let out = c
        .upload(&as_bytes(&vec![u32::MAX; invocations * 5]))
        .unwrap();
    c.launch(
        &kernel,
        &[Binding::write(&out)],
        &[],
        Dispatch::linear(invocations as u32 / 64),
    )
    .unwrap();
    let got = as_words(&c.read(&out).unwrap());
    for (i, row) in got.chunks_exact(5).enumerate() {
        let [size, lanes, last, first, agreed] = [row[0], row[1], row[2], row[3], row[4]];
        assert!(
            (min..=max).contains(&size),
            "invocation {i}: a subgroup of {size}, outside the reported {min}..={max}"
        );
        // A workgroup of 64 fills each of its subgroups.
        let full = size.min(64);
        assert_eq!(
            (lanes, last, first, agreed),
            (full, full - 1, 0, 1),
            "invocation {i}"
        );
    }
}

/// Sixty-four invocations' `f32` atomics add up where `f32` atomics are enabled. The kernel does
/// not compile where they are not.
pub fn f32_atomics_run_where_enabled<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let kernel = Kernel::wgsl("f32 atomics", F32_ATOMICS);
    if !c.limits().launch.features.f32_atomic_add {
        return refused(&c, &kernel, "f32 atomics");
    }
    let acc = c.upload(&[0u8; 16]).unwrap();
    c.launch(
        &kernel,
        &[Binding::read_write(&acc)],
        &[],
        Dispatch::linear(4),
    )
    .unwrap();
    let values: Vec<f32> = as_words(&c.read(&acc).unwrap())
        .into_iter()
        .map(f32::from_bits)
        .collect();
    assert_eq!(values, [128.0, 3.0, -64.0, 0.0]);
}

/// The optional features' behaviours: one `#[test]` each for `$suite`, with what each needs.
#[macro_export]
macro_rules! features_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, features::f16_kernels_run_where_f16_is_enabled, Wgsl }
        $crate::behaviour! { $suite, features::subgroup_kernels_run_where_subgroups_are_enabled, Wgsl }
        $crate::behaviour! { $suite, features::f32_atomics_run_where_enabled, Wgsl }
        $crate::behaviour! { $suite, features::subgroup_sizes_come_with_subgroups, Wgsl }
    };
}
