//! Shared by the crate's tests: a validating client and the WGSL kernels.
#![allow(dead_code)]

use scope_core::{Client, Error, Kernel, Result};
use scope_test::client_or_skip;
use server_vulkan::{Config, VALIDATION_LAYER_MISSING, Vulkan};

/// A client with the validation layer on whose backend panics on drop if
/// the layer said anything: any message fails the test.
///
/// Where the layer is not installed: under CI or `SCOPE_REQUIRE=vulkan`
/// the server refuses to open without it (a failure, through
/// `client_or_skip`); elsewhere this is
/// [`Error::BackendUnavailable`] with [`VALIDATION_LAYER_MISSING`] as the
/// reason, so that a test that promises validation skips instead of
/// passing without it.
pub fn validating() -> Result<Client<Vulkan>> {
    open(false)
}

/// As [`validating`], with device memory treated as not host-visible.
pub fn validating_staged() -> Result<Client<Vulkan>> {
    open(true)
}

fn open(force_staging: bool) -> Result<Client<Vulkan>> {
    Client::new(open_backend(force_staging)?)
}

/// A backend as [`validating`] wraps it, for the behaviours that drive the
/// `Backend` contract directly.
pub fn validating_backend() -> Result<Vulkan> {
    open_backend(false)
}

fn open_backend(force_staging: bool) -> Result<Vulkan> {
    let _ = std::fs::create_dir_all("/tmp/xdg");
    let backend = Vulkan::new(Config {
        validation: true,
        fail_on_validation: true,
        force_staging,
        ..Default::default()
    })?;
    if backend.validating() {
        Ok(backend)
    } else {
        Err(Error::BackendUnavailable {
            backend: "vulkan",
            reason: VALIDATION_LAYER_MISSING.to_owned(),
        })
    }
}

/// A [`validating`] client, or `None` after printing why the test is
/// skipped: `skipped: VK_LAYER_KHRONOS_validation is not installed (…)`
/// where the layer is missing, `skipped: no vulkan device (…)` where the
/// device is. Panics where either is required and missing.
pub fn validating_or_skip() -> Option<Client<Vulkan>> {
    or_skip(validating())
}

/// As [`validating_or_skip`], with memory staged ([`validating_staged`]).
pub fn validating_staged_or_skip() -> Option<Client<Vulkan>> {
    or_skip(validating_staged())
}

fn or_skip(made: Result<Client<Vulkan>>) -> Option<Client<Vulkan>> {
    match made {
        Err(Error::BackendUnavailable { reason, .. }) if reason == VALIDATION_LAYER_MISSING => {
            println!("skipped: {VALIDATION_LAYER_MISSING}");
            None
        }
        made => client_or_skip(|| made),
    }
}

pub const FILL: &str = r#"
struct Params { n: u32, value: u32 }
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@group(0) @binding(1) var<storage, read> params: Params;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < params.n) { out[id.x] = params.value; }
}
"#;

pub const COPY: &str = r#"
struct Params { n: u32 }
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<storage, read> params: Params;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < params.n) { dst[id.x] = src[id.x]; }
}
"#;

pub const ADD: &str = r#"
struct Params { n: u32 }
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<storage, read> params: Params;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < params.n) { out[id.x] = a[id.x] + b[id.x]; }
}
"#;

/// `x = x * 3 + 1` over `n` words, in place; no scalars beyond `n`.
pub const STEP: &str = r#"
struct Params { n: u32 }
@group(0) @binding(0) var<storage, read_write> x: array<u32>;
@group(0) @binding(1) var<storage, read> params: Params;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < params.n) { x[id.x] = x[id.x] * 3u + 1u; }
}
"#;

pub fn fill() -> Kernel {
    Kernel::wgsl("fill", FILL)
}
pub fn copy() -> Kernel {
    Kernel::wgsl("copy", COPY)
}
pub fn add() -> Kernel {
    Kernel::wgsl("add", ADD)
}
pub fn step() -> Kernel {
    Kernel::wgsl("step", STEP)
}

pub fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}
