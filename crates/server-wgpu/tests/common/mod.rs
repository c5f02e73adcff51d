//! Kernels and adapters shared by the integration tests.

#![allow(dead_code)]

use scope_core::{Client, Kernel, Result};
use scope_test::Suite;
use server_wgpu::{Api, Options, Wgpu};

/// `out[i] = value` for `i < n`; scalars `[n, value]`.
pub const FILL: &str = "
struct Params { n: u32, value: u32 }
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@group(0) @binding(1) var<storage, read> params: Params;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < params.n && id.x < arrayLength(&out)) {
        out[id.x] = params.value;
    }
}
";

/// `out[i] = in[i]` for `i < n`; scalars `[n]`.
pub const COPY: &str = "
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> n: u32;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < n && id.x < arrayLength(&out) && id.x < arrayLength(&src)) {
        out[id.x] = src[id.x];
    }
}
";

/// `out[i] = a[i] + b[i]` (wrapping) for `i < n`; scalars `[n]`.
pub const ADD: &str = "
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<storage, read> n: u32;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i < n && i < arrayLength(&out) && i < arrayLength(&a) && i < arrayLength(&b)) {
        out[i] = a[i] + b[i];
    }
}
";

/// Does not compile: the error is on line 4, column 24.
pub const BROKEN: &str = "
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
fn f() -> u32 { return undefined_name; }
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) { out[id.x] = src[id.x] + f(); }
";

/// A client on `api`'s adapter.
pub fn client_on(api: Api) -> Result<Client<Wgpu>> {
    server_wgpu::client_with(&Options::api(api))
}

/// The suite's kernels on the adapter of one API.
pub trait OnApi: 'static {
    /// The API.
    const API: Api;
}

/// Vulkan (lavapipe here).
pub struct Vulkan;
impl OnApi for Vulkan {
    const API: Api = Api::Vulkan;
}

/// GL through EGL (llvmpipe here).
pub struct Gl;
impl OnApi for Gl {
    const API: Api = Api::Gl;
}

/// The conformance suite on `A`'s adapter.
pub struct WgpuSuite<A>(std::marker::PhantomData<A>);

impl<A: OnApi> Suite for WgpuSuite<A> {
    type Backend = Wgpu;

    fn capabilities() -> &'static [scope_test::Capability] {
        &[scope_test::Capability::Reopen, scope_test::Capability::Wgsl]
    }

    fn client() -> Result<Client<Wgpu>> {
        client_on(A::API)
    }

    fn backend() -> Option<Result<Wgpu>> {
        Some(Wgpu::new(&Options::api(A::API)))
    }

    fn fill() -> Kernel {
        Kernel::wgsl("fill", FILL)
    }

    fn copy() -> Kernel {
        Kernel::wgsl("copy", COPY)
    }

    fn add() -> Kernel {
        Kernel::wgsl("add", ADD)
    }

    fn broken() -> Kernel {
        Kernel::wgsl("broken", BROKEN)
    }
}

/// Little-endian bytes of `words`.
pub fn bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// `bytes` read as little-endian words.
pub fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
