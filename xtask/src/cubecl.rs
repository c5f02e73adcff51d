//! The rows of `scope-cubecl`'s runtime tests: cubecl-core's own test
//! suite, one binary per server, run once per device it must pass on.
//!
//! Each row names the binary, the environment that picks the device, and the
//! adapter the probe must have found; without one the row is skipped for no
//! device. A row runs its binary whole. A test known not to hold on a device
//! prints `not run: <reason>`, and one that returned early for a feature the
//! device lacks prints `not exercised: …`. The summary counts both as not
//! exercised (`crates/scope-cubecl/tests/common/mod.rs`).

use crate::backends::BackendKind;

/// One runtime-test row.
#[derive(Clone, Debug)]
pub struct Row {
    /// The summary's name for it.
    pub name: &'static str,
    /// The server whose backend it needs (`--backend` selects it).
    pub backend: BackendKind,
    /// The test binary (`crates/scope-cubecl/tests/<binary>.rs`).
    pub binary: &'static str,
    /// The probe must have found a device of `backend` whose detail starts
    /// with this (the API, for wgpu).
    pub api: &'static str,
    /// What picks that device.
    pub env: &'static [(&'static str, &'static str)],
}

/// The rows, in the order they run.
pub const ROWS: [Row; 7] = [
    Row {
        name: "cubecl on wgpu (vulkan)",
        backend: BackendKind::Wgpu,
        binary: "runtime_wgpu",
        api: "vulkan",
        env: &[("SCOPE_WGPU_BACKEND", "vulkan")],
    },
    Row {
        name: "cubecl on wgpu (gl)",
        backend: BackendKind::Wgpu,
        binary: "runtime_wgpu",
        api: "gl",
        env: &[("SCOPE_WGPU_BACKEND", "gl")],
    },
    Row {
        name: "cubecl on vulkan",
        backend: BackendKind::Vulkan,
        binary: "runtime_vulkan",
        api: "",
        env: &[("SCOPE_VULKAN_VALIDATION", "1")],
    },
    // No machine that runs CI has CUDA: the row is skipped there, and
    // `cargo xtask bundle --backend cuda` carries the binary to one that has.
    Row {
        name: "cubecl on cuda",
        backend: BackendKind::Cuda,
        binary: "runtime_cuda",
        api: "",
        env: &[],
    },
    // Nor has any AMD hardware: skipped too. The HIP toolchain row runs
    // this binary over the mock runtime, for the sources it compiles.
    Row {
        name: "cubecl on hip",
        backend: BackendKind::Hip,
        binary: "runtime_hip",
        api: "",
        env: &[],
    },
    // cubecl's collectives, all_reduce and to_client families on four
    // logical devices (the binary splits the adapter itself): on wgpu over
    // each adapter, and on the Vulkan server under validation in both rows.
    Row {
        name: "cubecl collectives on wgpu (vulkan) and vulkan",
        backend: BackendKind::Wgpu,
        binary: "collectives",
        api: "vulkan",
        env: &[
            ("SCOPE_WGPU_BACKEND", "vulkan"),
            ("SCOPE_VULKAN_VALIDATION", "1"),
        ],
    },
    Row {
        name: "cubecl collectives on wgpu (gl) and vulkan",
        backend: BackendKind::Wgpu,
        binary: "collectives",
        api: "gl",
        env: &[
            ("SCOPE_WGPU_BACKEND", "gl"),
            ("SCOPE_VULKAN_VALIDATION", "1"),
        ],
    },
];

/// The runtime-test binary of `backend`'s server, if it has one.
pub fn binary_of(backend: BackendKind) -> Option<&'static str> {
    ROWS.iter().find(|r| r.backend == backend).map(|r| r.binary)
}

/// The runtime-test binaries: the plain `scope-cubecl` row leaves them to
/// the rows above.
pub fn binaries() -> Vec<&'static str> {
    let mut all: Vec<_> = ROWS.iter().map(|r| r.binary).collect();
    all.dedup();
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_backend_has_a_row_of_its_runtime_tests() {
        let tests = crate::run::root().join("crates/scope-cubecl/tests");
        for &kind in BackendKind::ALL {
            let binary = format!("runtime_{kind}");
            assert_eq!(binary_of(kind), Some(binary.as_str()), "a row for {kind}");
            assert!(tests.join(format!("{binary}.rs")).is_file(), "{binary}.rs");
        }
    }
}
