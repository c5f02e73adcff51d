//! The runtime's four kernels, in every language a server takes, side by side.
//!
//! Each operation is written twice: WGSL for wgpu and Vulkan (the Vulkan
//! server compiles WGSL through naga) and CUDA C++ for CUDA and HIP (hiprtc
//! accepts the same dialect for what these kernels use). Keeping the two
//! next to each other is what makes them reviewable as one operation until
//! the single-source kernel issue replaces them; a change to one that is not
//! made to the other shows in the same diff.
//!
//! Every kernel follows the contract's binding convention: buffers in order,
//! then the scalar blob (little-endian `u32`s) as one more read-only storage
//! buffer in WGSL, or as a struct passed by value in CUDA C++. Elementwise
//! and row kernels run 64 invocations a group over `ceil(n / 64)` groups;
//! the matmul runs 16×16 tiles over `ceil(cols / 16) × ceil(rows / 16)`.

use scope_core::{Kernel, Language};

/// Side of the matmul's square tile, and its workgroup's.
pub const TILE: u32 = 16;

/// Invocations a group for the elementwise and row kernels.
pub const GROUP: u32 = 64;

/// `c[m×n] = a[m×k] · b[k×n]`, row-major. Bindings `[a, b, c]`; scalars
/// `[m, n, k]`. Tiled through workgroup memory: a naive kernel reads each
/// input element `n` (or `m`) times from global memory, which on a CPU
/// adapter costs more than the arithmetic.
const MATMUL_WGSL: &str = r"
struct Dims { m: u32, n: u32, k: u32 }
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<storage, read> dims: Dims;

var<workgroup> tile_a: array<array<f32, 16>, 16>;
var<workgroup> tile_b: array<array<f32, 16>, 16>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_id) local: vec3<u32>) {
    let row = group.y * 16u + local.y;
    let col = group.x * 16u + local.x;
    let m = dims.m;
    let n = dims.n;
    let k = dims.k;
    var acc = 0.0;
    let tiles = (k + 15u) / 16u;
    for (var t = 0u; t < tiles; t = t + 1u) {
        let ak = t * 16u + local.x;
        let bk = t * 16u + local.y;
        var va = 0.0;
        if (row < m && ak < k) { va = a[row * k + ak]; }
        var vb = 0.0;
        if (bk < k && col < n) { vb = b[bk * n + col]; }
        tile_a[local.y][local.x] = va;
        tile_b[local.y][local.x] = vb;
        workgroupBarrier();
        for (var i = 0u; i < 16u; i = i + 1u) {
            acc = acc + tile_a[local.y][i] * tile_b[i][local.x];
        }
        workgroupBarrier();
    }
    if (row < m && col < n) { c[row * n + col] = acc; }
}
";

const MATMUL_CUDA: &str = r#"
struct Dims { unsigned int m, n, k; };
extern "C" __global__ void matmul(const float* a, const float* b, float* c, Dims d) {
    __shared__ float tile_a[16][16];
    __shared__ float tile_b[16][16];
    unsigned int row = blockIdx.y * 16u + threadIdx.y;
    unsigned int col = blockIdx.x * 16u + threadIdx.x;
    float acc = 0.0f;
    unsigned int tiles = (d.k + 15u) / 16u;
    for (unsigned int t = 0; t < tiles; ++t) {
        unsigned int ak = t * 16u + threadIdx.x;
        unsigned int bk = t * 16u + threadIdx.y;
        tile_a[threadIdx.y][threadIdx.x] = (row < d.m && ak < d.k) ? a[(size_t)row * d.k + ak] : 0.0f;
        tile_b[threadIdx.y][threadIdx.x] = (bk < d.k && col < d.n) ? b[(size_t)bk * d.n + col] : 0.0f;
        __syncthreads();
        for (unsigned int i = 0; i < 16u; ++i) {
            acc += tile_a[threadIdx.y][i] * tile_b[i][threadIdx.x];
        }
        __syncthreads();
    }
    if (row < d.m && col < d.n) { c[(size_t)row * d.n + col] = acc; }
}
"#;

/// `out[i] = x[i] + bias[i % cols]`. Bindings `[x, bias, out]`; scalars
/// `[len, cols]`.
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

/// Row-wise softmax, one invocation a row (rows are short: the output
/// layer). Bindings `[x, out]`; scalars `[rows, cols]`.
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

/// The four operations, as the kernels one server compiles.
///
/// Fields are public so that a server with another language (the reference
/// host server's registered closures, in this crate's tests) can supply its
/// own; [`Kernels::for_language`] builds the two shipped sets.
#[derive(Clone, Debug)]
pub struct Kernels {
    /// See the WGSL above: `[a, b, c]`, scalars `[m, n, k]`, 16×16 groups.
    pub matmul: Kernel,
    /// `[x, bias, out]`, scalars `[len, cols]`, 64 a group.
    pub bias_add: Kernel,
    /// `[x, out]`, scalars `[len]`, 64 a group.
    pub gelu: Kernel,
    /// `[x, out]`, scalars `[rows, cols]`, 64 rows a group.
    pub softmax: Kernel,
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
    /// The first shipped dialect `accepts` admits, WGSL first (the one
    /// language two servers share).
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

fn make(dialect: Dialect, entry: &str, wgsl: &str, cuda: &str, block: [u32; 3]) -> Kernel {
    match dialect {
        Dialect::Wgsl => Kernel::wgsl(entry, wgsl),
        Dialect::Cuda => Kernel::cuda(entry, cuda).block(block),
        Dialect::Hip => Kernel::hip(entry, cuda).block(block),
    }
}

impl Kernels {
    /// The shipped kernels in `dialect`.
    pub fn for_language(dialect: Dialect) -> Self {
        Self {
            matmul: make(dialect, "matmul", MATMUL_WGSL, MATMUL_CUDA, [TILE, TILE, 1]),
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
        }
    }
}

/// `kernel` under the name reports will use — `layer1.matmul` rather than
/// `matmul` — so a chain of skipped kernels says which layer it passed
/// through. The compile cache keys on source, entry and block, not the
/// name, so every layer shares one compiled kernel.
pub fn named(kernel: &Kernel, name: &str) -> Kernel {
    Kernel::new(name, kernel.source().clone())
        .entry(kernel.entry_point())
        .block(kernel.block_size())
}
