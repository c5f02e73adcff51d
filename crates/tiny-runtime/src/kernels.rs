//! The native path: the runtime's kernels hand-written in every language a
//! server takes, side by side.
//!
//! The default is the `#[cube]` path ([`crate::cube`]). These stay as the other
//! half of the demo's and tests' comparison, and for a runtime author with no
//! cubecl. Each operation is written twice, WGSL (wgpu; Vulkan through naga) and
//! CUDA C++ (CUDA; HIP through hiprtc). Side by side, a change made to one and
//! not the other shows in the same diff.
//!
//! Every kernel follows the contract's binding convention: buffers in order,
//! then the blob of `u32` scalars, as a read-only storage buffer in WGSL or a
//! struct by value in CUDA C++. Elementwise and row kernels run 64 invocations
//! a group; the matmul runs 64 columns × [`ROWS`] rows a group.

use scope_core::{Kernel, Language};

/// Rows of the output one matmul invocation computes.
pub const ROWS: u32 = 4;

/// Invocations a group for the elementwise and row kernels.
pub const GROUP: u32 = 64;

/// `c[m×n] = a[m×k] · b[k×n]`, row-major. Bindings `[a, b, c]`; scalars `[m, n, k]`.
/// An invocation computes one column of [`ROWS`] rows, so each load of `b` feeds four
/// multiply-adds.
///
/// Not the textbook 16×16 tiling: on lavapipe a workgroup barrier switches every
/// invocation's coroutine, and the tiled kernel ran 4.5× slower (0.28 vs 1.26 GFLOP/s).
const MATMUL_WGSL: &str = r"
struct Dims { m: u32, n: u32, k: u32 }
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<storage, read> dims: Dims;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let col = id.x;
    let row0 = id.y * 4u;
    let m = dims.m;
    let n = dims.n;
    let k = dims.k;
    if (col >= n || row0 >= m) { return; }
    let r1 = min(row0 + 1u, m - 1u);
    let r2 = min(row0 + 2u, m - 1u);
    let r3 = min(row0 + 3u, m - 1u);
    var acc0 = 0.0; var acc1 = 0.0; var acc2 = 0.0; var acc3 = 0.0;
    for (var i = 0u; i < k; i = i + 1u) {
        let bv = b[i * n + col];
        acc0 = acc0 + a[row0 * k + i] * bv;
        acc1 = acc1 + a[r1 * k + i] * bv;
        acc2 = acc2 + a[r2 * k + i] * bv;
        acc3 = acc3 + a[r3 * k + i] * bv;
    }
    c[row0 * n + col] = acc0;
    if (row0 + 1u < m) { c[(row0 + 1u) * n + col] = acc1; }
    if (row0 + 2u < m) { c[(row0 + 2u) * n + col] = acc2; }
    if (row0 + 3u < m) { c[(row0 + 3u) * n + col] = acc3; }
}
";

const MATMUL_CUDA: &str = r#"
struct Dims { unsigned int m, n, k; };
extern "C" __global__ void matmul(const float* a, const float* b, float* c, Dims d) {
    unsigned int col = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int row0 = blockIdx.y * 4u;
    if (col >= d.n || row0 >= d.m) { return; }
    size_t r1 = min(row0 + 1u, d.m - 1u), r2 = min(row0 + 2u, d.m - 1u), r3 = min(row0 + 3u, d.m - 1u);
    float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
    for (unsigned int i = 0; i < d.k; ++i) {
        float bv = b[(size_t)i * d.n + col];
        acc0 += a[(size_t)row0 * d.k + i] * bv;
        acc1 += a[r1 * d.k + i] * bv;
        acc2 += a[r2 * d.k + i] * bv;
        acc3 += a[r3 * d.k + i] * bv;
    }
    c[(size_t)row0 * d.n + col] = acc0;
    if (row0 + 1u < d.m) { c[(size_t)(row0 + 1u) * d.n + col] = acc1; }
    if (row0 + 2u < d.m) { c[(size_t)(row0 + 2u) * d.n + col] = acc2; }
    if (row0 + 3u < d.m) { c[(size_t)(row0 + 3u) * d.n + col] = acc3; }
}
"#;

/// `out[i] = x[i] + bias[i % cols]`. Bindings `[x, bias, out]`; scalars `[len, cols]`.
const BIAS_ADD_WGSL: &str = r"
struct Dims { len: u32, cols: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> bias: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read> dims: Dims;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i < dims.len) { out[i] = x[i] + bias[i % dims.cols]; }
}
";

const BIAS_ADD_CUDA: &str = r#"
struct Dims { unsigned int len, cols; };
extern "C" __global__ void bias_add(const float* x, const float* bias, float* out, Dims d) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < d.len) { out[i] = x[i] + bias[i % d.cols]; }
}
"#;

/// `out[i] = gelu(x[i])`, the tanh approximation (WGSL has no `erf`, and
/// the two languages must agree). Bindings `[x, out]`; scalars `[len]`.
const GELU_WGSL: &str = r"
struct Dims { len: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> dims: Dims;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i < dims.len) {
        let v = x[i];
        // Clamped so that tanh never sees a value where an implementation
        // computes it as a ratio of overflowing exponentials.
        let t = clamp(0.7978845608 * (v + 0.044715 * v * v * v), -15.0, 15.0);
        out[i] = 0.5 * v * (1.0 + tanh(t));
    }
}
";

const GELU_CUDA: &str = r#"
struct Dims { unsigned int len; };
extern "C" __global__ void gelu(const float* x, float* out, Dims d) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < d.len) {
        float v = x[i];
        float t = fminf(fmaxf(0.7978845608f * (v + 0.044715f * v * v * v), -15.0f), 15.0f);
        out[i] = 0.5f * v * (1.0f + tanhf(t));
    }
}
"#;

/// Row-wise softmax, one invocation a row. Bindings `[x, out]`; scalars `[rows, cols]`.
const SOFTMAX_WGSL: &str = r"
struct Dims { rows: u32, cols: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> dims: Dims;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let row = id.x;
    if (row >= dims.rows) { return; }
    let base = row * dims.cols;
    var top = x[base];
    for (var j = 1u; j < dims.cols; j = j + 1u) { top = max(top, x[base + j]); }
    var sum = 0.0;
    for (var j = 0u; j < dims.cols; j = j + 1u) {
        let e = exp(x[base + j] - top);
        out[base + j] = e;
        sum = sum + e;
    }
    for (var j = 0u; j < dims.cols; j = j + 1u) { out[base + j] = out[base + j] / sum; }
}
";

const SOFTMAX_CUDA: &str = r#"
struct Dims { unsigned int rows, cols; };
extern "C" __global__ void softmax(const float* x, float* out, Dims d) {
    unsigned int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= d.rows) { return; }
    size_t base = (size_t)row * d.cols;
    float top = x[base];
    for (unsigned int j = 1; j < d.cols; ++j) { top = fmaxf(top, x[base + j]); }
    float sum = 0.0f;
    for (unsigned int j = 0; j < d.cols; ++j) {
        float e = expf(x[base + j] - top);
        out[base + j] = e;
        sum += e;
    }
    for (unsigned int j = 0; j < d.cols; ++j) { out[base + j] = out[base + j] / sum; }
}
"#;

/// `out = xᵀ`, one invocation an element. Bindings `[x, out]`; scalars `[rows, cols]`.
/// The backward pass's matmuls run on transposed copies, so one matmul kernel serves.
const TRANSPOSE_WGSL: &str = r"
struct Dims { rows: u32, cols: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> dims: Dims;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i < dims.rows * dims.cols) {
        out[(i % dims.cols) * dims.rows + i / dims.cols] = x[i];
    }
}
";

const TRANSPOSE_CUDA: &str = r#"
struct Dims { unsigned int rows, cols; };
extern "C" __global__ void transpose(const float* x, float* out, Dims d) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < d.rows * d.cols) { out[(size_t)(i % d.cols) * d.rows + i / d.cols] = x[i]; }
}
"#;

/// `out[i] = dy[i] · gelu'(x[i])`, the derivative of [`GELU_WGSL`]'s approximation.
/// Bindings `[x, dy, out]`; scalars `[len]`.
const GELU_GRAD_WGSL: &str = r"
struct Dims { len: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> dy: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read> dims: Dims;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i < dims.len) {
        let v = x[i];
        let t = tanh(clamp(0.7978845608 * (v + 0.044715 * v * v * v), -15.0, 15.0));
        let du = 0.7978845608 * (1.0 + 0.134145 * v * v);
        out[i] = dy[i] * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du);
    }
}
";

const GELU_GRAD_CUDA: &str = r#"
struct Dims { unsigned int len; };
extern "C" __global__ void gelu_grad(const float* x, const float* dy, float* out, Dims d) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < d.len) {
        float v = x[i];
        float t = tanhf(fminf(fmaxf(0.7978845608f * (v + 0.044715f * v * v * v), -15.0f), 15.0f));
        float du = 0.7978845608f * (1.0f + 0.134145f * v * v);
        out[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
}
"#;

/// `out[i] = (probs[i] - targets[i]) / rows`: the mean cross-entropy's gradient at the
/// logits. Bindings `[probs, targets, out]`; scalars `[len, rows]`.
const LOSS_GRAD_WGSL: &str = r"
struct Dims { len: u32, rows: u32 }
@group(0) @binding(0) var<storage, read> probs: array<f32>;
@group(0) @binding(1) var<storage, read> targets: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read> dims: Dims;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i < dims.len) { out[i] = (probs[i] - targets[i]) / f32(dims.rows); }
}
";

const LOSS_GRAD_CUDA: &str = r#"
struct Dims { unsigned int len, rows; };
extern "C" __global__ void loss_grad(const float* probs, const float* targets, float* out, Dims d) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < d.len) { out[i] = (probs[i] - targets[i]) / (float)d.rows; }
}
"#;

/// Plain SGD into new memory: `out[i] = w[i] - lr[0] · g[i]`. `lr` is a buffer so no
/// kernel takes a float scalar. Bindings `[w, g, lr, out]`; scalars `[len]`.
const SGD_WGSL: &str = r"
struct Dims { len: u32 }
@group(0) @binding(0) var<storage, read> w: array<f32>;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read> lr: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> dims: Dims;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i < dims.len) { out[i] = w[i] - lr[0] * g[i]; }
}
";

const SGD_CUDA: &str = r#"
struct Dims { unsigned int len; };
extern "C" __global__ void sgd(const float* w, const float* g, const float* lr, float* out, Dims d) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < d.len) { out[i] = w[i] - lr[0] * g[i]; }
}
"#;

/// Gradients to `bf16`, two to a word, rounded to nearest even (rule 45's rounding):
/// `out[i]` holds `x[2i]` low and `x[2i + 1]` high, zero past the end. Bindings
/// `[x, out]`; scalars `[len]` of `x`; an invocation a word.
const TO_BF16_WGSL: &str = r"
struct Dims { len: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read> dims: Dims;

fn bf16(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let lo = 2u * id.x;
    if (lo >= dims.len) { return; }
    var hi = 0u;
    if (lo + 1u < dims.len) { hi = bf16(x[lo + 1u]); }
    out[id.x] = bf16(x[lo]) | (hi << 16u);
}
";

const TO_BF16_CUDA: &str = r#"
struct Dims { unsigned int len; };
__device__ unsigned int bf16_bits(float v) {
    unsigned int b = __float_as_uint(v);
    return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
}
extern "C" __global__ void to_bf16(const float* x, unsigned int* out, Dims d) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int lo = 2u * i;
    if (lo >= d.len) { return; }
    unsigned int hi = lo + 1u < d.len ? bf16_bits(x[lo + 1u]) : 0u;
    out[i] = bf16_bits(x[lo]) | (hi << 16);
}
"#;

/// `bf16` words back to `f32`s, exactly. Bindings `[packed, out]`; scalars `[len]` of
/// `out`; an invocation a value.
const FROM_BF16_WGSL: &str = r"
struct Dims { len: u32 }
@group(0) @binding(0) var<storage, read> packed: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read> dims: Dims;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i >= dims.len) { return; }
    let word = packed[i / 2u];
    var bits = word << 16u;
    if (i % 2u == 1u) { bits = word & 0xffff0000u; }
    out[i] = bitcast<f32>(bits);
}
";

const FROM_BF16_CUDA: &str = r#"
struct Dims { unsigned int len; };
extern "C" __global__ void from_bf16(const unsigned int* packed, float* out, Dims d) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= d.len) { return; }
    unsigned int word = packed[i / 2u];
    out[i] = __uint_as_float(i % 2u == 1u ? (word & 0xffff0000u) : (word << 16));
}
"#;

/// The operations as one server compiles them. Public fields let a server with another
/// language supply its own; [`Kernels::for_language`] builds the two shipped sets.
#[derive(Clone, Debug)]
pub struct Kernels {
    /// `[a, b, c]`, scalars `[m, n, k]`, 64 columns × [`ROWS`] rows a group.
    pub matmul: Kernel,
    /// `[x, bias, out]`, scalars `[len, cols]`, 64 a group.
    pub bias_add: Kernel,
    /// `[x, out]`, scalars `[len]`, 64 a group.
    pub gelu: Kernel,
    /// `[x, out]`, scalars `[rows, cols]`, 64 rows a group.
    pub softmax: Kernel,
    /// `[x, out]`, scalars `[rows, cols]` of `x`, 64 a group.
    pub transpose: Kernel,
    /// `[x, dy, out]`, scalars `[len]`, 64 a group.
    pub gelu_grad: Kernel,
    /// `[probs, targets, out]`, scalars `[len, rows]`, 64 a group.
    pub loss_grad: Kernel,
    /// `[w, g, lr, out]`, scalars `[len]`, 64 a group.
    pub sgd: Kernel,
    /// `[x, out]`, scalars `[len]` of `x`, 64 words a group.
    pub to_bf16: Kernel,
    /// `[packed, out]`, scalars `[len]` of `out`, 64 a group.
    pub from_bf16: Kernel,
}

/// Which of the shipped sources a server takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// WGSL: wgpu, and Vulkan through naga.
    Wgsl,
    /// CUDA C++ through NVRTC.
    Cuda,
    /// The same C++ through hiprtc.
    Hip,
}

impl Dialect {
    /// The first shipped dialect `accepts` admits, WGSL first (two servers share it).
    pub fn choose(accepts: impl Fn(Language) -> bool) -> Option<Self> {
        [
            (Language::Wgsl, Dialect::Wgsl),
            (Language::Cuda, Dialect::Cuda),
            (Language::Hip, Dialect::Hip),
        ]
        .into_iter()
        .find(|(language, _)| accepts(*language))
        .map(|(_, dialect)| dialect)
    }
}

/// Safety: as [`Kernels::for_language`].
unsafe fn make(dialect: Dialect, entry: &str, wgsl: &str, cuda: &str, block: [u32; 3]) -> Kernel {
    match dialect {
        Dialect::Wgsl => Kernel::wgsl(entry, wgsl),
        // SAFETY: each shipped CUDA C++ kernel guards every access with its blob's
        // sizes, and the caller promises the blob describes the bindings.
        Dialect::Cuda => unsafe { Kernel::cuda(entry, cuda) }.block(block),
        // SAFETY: as for CUDA; hiprtc compiles the same source.
        Dialect::Hip => unsafe { Kernel::hip(entry, cuda) }.block(block),
    }
}

impl Kernels {
    /// The shipped kernels in `dialect`.
    ///
    /// # Safety
    ///
    /// For CUDA and HIP, every launch passes scalars no larger than the buffers bound,
    /// as [`Runtime`](crate::runtime::Runtime) does. CUDA C++ cannot know a buffer's
    /// length, so larger ones let a launch write past its bindings.
    pub unsafe fn for_language(dialect: Dialect) -> Self {
        // SAFETY: `make`'s contract is this function's, which the caller keeps.
        unsafe {
            Self {
                matmul: make(dialect, "matmul", MATMUL_WGSL, MATMUL_CUDA, [GROUP, 1, 1]),
                bias_add: make(
                    dialect,
                    "bias_add",
                    BIAS_ADD_WGSL,
                    BIAS_ADD_CUDA,
                    [GROUP, 1, 1],
                ),
                gelu: make(dialect, "gelu", GELU_WGSL, GELU_CUDA, [GROUP, 1, 1]),
                softmax: make(
                    dialect,
                    "softmax",
                    SOFTMAX_WGSL,
                    SOFTMAX_CUDA,
                    [GROUP, 1, 1],
                ),
                transpose: make(
                    dialect,
                    "transpose",
                    TRANSPOSE_WGSL,
                    TRANSPOSE_CUDA,
                    [GROUP, 1, 1],
                ),
                gelu_grad: make(
                    dialect,
                    "gelu_grad",
                    GELU_GRAD_WGSL,
                    GELU_GRAD_CUDA,
                    [GROUP, 1, 1],
                ),
                loss_grad: make(
                    dialect,
                    "loss_grad",
                    LOSS_GRAD_WGSL,
                    LOSS_GRAD_CUDA,
                    [GROUP, 1, 1],
                ),
                sgd: make(dialect, "sgd", SGD_WGSL, SGD_CUDA, [GROUP, 1, 1]),
                to_bf16: make(
                    dialect,
                    "to_bf16",
                    TO_BF16_WGSL,
                    TO_BF16_CUDA,
                    [GROUP, 1, 1],
                ),
                from_bf16: make(
                    dialect,
                    "from_bf16",
                    FROM_BF16_WGSL,
                    FROM_BF16_CUDA,
                    [GROUP, 1, 1],
                ),
            }
        }
    }
}

/// `kernel` under the name reports use (`layer1.matmul`), so a chain names each layer.
/// The compile cache ignores names, so every layer shares one compiled kernel.
pub fn named(kernel: &Kernel, name: &str) -> Kernel {
    Kernel::new(name, kernel.source().clone())
        .entry(kernel.entry_point())
        .block(kernel.block_size())
}
