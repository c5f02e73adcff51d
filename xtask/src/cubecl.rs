//! The rows of `scope-cubecl`'s runtime tests: cubecl-core's own test
//! suite, one binary per server, run once per device it must pass on.
//!
//! Each row names the binary, the environment that picks the device, the
//! adapter the probe must have found (a row without one is skipped for no
//! device, like any device test), and the tests it does not run with the
//! reason — written here, next to the row, so the summary can print it.

/// A test a row leaves out, and why.
#[derive(Clone, Debug)]
pub struct Skip {
    /// The test's full name, as libtest prints it.
    pub test: &'static str,
    /// Why it is not run.
    pub why: &'static str,
}

/// One runtime-test row.
#[derive(Clone, Debug)]
pub struct Row {
    /// The summary's name for it.
    pub name: &'static str,
    /// The server whose backend it needs (`--backend` selects it).
    pub backend: &'static str,
    /// The test binary (`crates/scope-cubecl/tests/<binary>.rs`).
    pub binary: &'static str,
    /// The probe must have found a device of `backend` whose detail starts
    /// with this (the API, for wgpu).
    pub api: &'static str,
    /// What picks that device.
    pub env: &'static [(&'static str, &'static str)],
    /// What it leaves out.
    pub skip: &'static [Skip],
}

/// cubecl's IEEE test relaxes for a runtime whose name starts with `wgpu`
/// (WGSL lets the compiler fold NaN, infinity and the sign of zero); the
/// Vulkan server runs the same WGSL through naga with the same latitude,
/// under a name that does not say so.
const IEEE_UNDER_WGSL: Skip = Skip {
    test: "vulkan::binary_untyped::test_ieee_constant_folds",
    why: "WGSL's float latitude (naga folds NaN - NaN); cubecl relaxes this test only for runtimes named wgpu*",
};

/// On GL, WGSL becomes GLSL, whose `%` is undefined for negative operands.
const GL_SIGNED_REMAINDER: Skip = Skip {
    test: "wgpu::binary_untyped::test_signed_remainder",
    why: "on GL, -7 % 3 reads back 0 where WGSL says -1 (GLSL leaves % of negative operands undefined); cubecl-wgpu fails it the same way on this llvmpipe",
};

/// The rows, in the order they run.
pub const ROWS: [Row; 4] = [
    Row {
        name: "cubecl on wgpu (vulkan)",
        backend: "wgpu",
        binary: "runtime_wgpu",
        api: "vulkan",
        env: &[("SCOPE_WGPU_BACKEND", "vulkan")],
        skip: &[],
    },
    Row {
        name: "cubecl on wgpu (gl)",
        backend: "wgpu",
        binary: "runtime_wgpu",
        api: "gl",
        env: &[("SCOPE_WGPU_BACKEND", "gl")],
        skip: &[GL_SIGNED_REMAINDER],
    },
    Row {
        name: "cubecl on vulkan",
        backend: "vulkan",
        binary: "runtime_vulkan",
        api: "",
        env: &[("SCOPE_VULKAN_VALIDATION", "1")],
        skip: &[IEEE_UNDER_WGSL],
    },
    // No machine that runs CI has CUDA: the row is skipped there, and
    // `cargo xtask bundle --backend cuda` carries the binary to one that has.
    Row {
        name: "cubecl on cuda",
        backend: "cuda",
        binary: "runtime_cuda",
        api: "",
        env: &[],
        skip: &[],
    },
];

/// The runtime-test binary of `backend`'s server, if it has one.
pub fn binary_of(backend: &str) -> Option<&'static str> {
    ROWS.iter().find(|r| r.backend == backend).map(|r| r.binary)
}

/// The runtime-test binaries: the plain `scope-cubecl` row leaves them to
/// the rows above.
pub fn binaries() -> Vec<&'static str> {
    let mut all: Vec<_> = ROWS.iter().map(|r| r.binary).collect();
    all.dedup();
    all
}
