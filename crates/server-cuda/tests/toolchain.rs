//! NVIDIA's real CUDA compilers on every CUDA kernel the project emits, on
//! a machine with no GPU.
//!
//! The other CUDA tests run against a mock NVRTC, which recognises five
//! test kernels and refuses the rest: a kernel the real NVRTC rejects, or
//! whose PTX the driver's JIT cannot assemble for the device, would be
//! found only on a GPU machine. Here every kernel goes through the
//! server's own compile path ([`server_cuda::nvrtc_ptx`]: NVRTC with the
//! server's options) on the real NVRTC for `compute_80` and `compute_90`,
//! and its PTX through the real `ptxas` for `sm_80` and `sm_90` — the
//! assembler the driver's JIT is built on, so register and shared-memory
//! limits are checked as loading the module would check them, and a block
//! whose registers no SM has is refused as its launch would be.
//!
//! The compilers come from the folder `SCOPE_CUDA_TOOLCHAIN` names
//! (relative to the workspace root), which `ci/install-cuda-toolchain.sh`
//! fills from NVIDIA's PyPI wheels (NVRTC and ptxas 12.2, the NVRTC the
//! CUDA bundle carries); a CUDA 12.x or 13.x toolkit's folder works too.
//! Without it each test prints `skipped: no cuda toolchain (...)`; with
//! `SCOPE_REQUIRE` naming `cuda-toolchain` (or `all`) that is a failure.
//!
//! Each group prints the PTX ISA version NVRTC wrote (`.version` of every
//! PTX, 8.2 for NVRTC 12.2): what a driver must JIT to load the kernels,
//! so which drivers the bundle runs on. A kernel that needs a newer NVRTC
//! than the folder's fails its group, named, with NVRTC's log saying what
//! it did not know.
//!
//! The kernels, a test per group, each printing how many distinct kernels
//! it compiled and assembled per architecture:
//!
//! - [`server_and_tiny_runtime_kernels`]: the CUDA C++ of this crate's tests
//!   (the conformance suite's `fill`, `copy`, `add`, the `accumulate` and
//!   `wild` kernels; the bench's `add` is the same source) and
//!   tiny-runtime's native CUDA C++; and NVRTC's log for the suite's
//!   `broken` kernel, whose wording the mock NVRTC imitates.
//! - [`cube_kernels`]: scope-cube's kernels and tiny-runtime's `#[cube]`
//!   kernels, translated to CUDA C++ by `scope_cube::translate`.
//! - [`cubecl_kernels`]: what cubecl-cpp writes for `ScopeRuntime<Cuda>`
//!   when cubecl-core's runtime tests and cubek's matmul and reductions
//!   run on it, collected in child processes on the mock (scope-cubecl's
//!   `tests/support/toolchain.rs`, shared with server-hip, says how, and
//!   `toolchain/harvest.rs` what that misses).
//! - [`nccl_library`]: cudarc's `nccl` loads the real NCCL of the same
//!   folder, `ncclGetVersion` answers, and every symbol a device transport
//!   for the collectives calls is there; and where NCCL is on the path
//!   only under its soname (`libnccl.so.2`, as its packages install it),
//!   cudarc's loader misses it and the server's opens it.

#[macro_use]
mod common;
#[path = "mock/harness.rs"]
mod harness;
#[path = "toolchain/harvest.rs"]
mod harvest;
#[path = "toolchain/nvidia.rs"]
mod nvidia;
#[path = "../../scope-cubecl/tests/support/toolchain.rs"]
mod support;

use nvidia::{Item, Toolchain};
use scope_core::{Error, Kernel};
use scope_cube::Target;

/// A kernel of `origin`, checked under the name `name`.
fn item(origin: &str, name: &str, kernel: Kernel) -> Item {
    Item {
        origin: format!("{origin}: {name}"),
        kernel,
    }
}

/// The translated kernel inside `cube`, to compile.
fn translated(cube: &scope_cube::CubeKernel) -> Kernel {
    // SAFETY: this test only compiles it; nothing launches it.
    unsafe { cube.kernel() }.clone()
}

#[test]
fn server_and_tiny_runtime_kernels() {
    let Some(toolchain) = Toolchain::find() else {
        return;
    };
    let mut items: Vec<Item> = [
        ("fill", common::FILL),
        ("copy", common::COPY),
        ("add", common::ADD),
        ("accumulate", common::ACCUMULATE),
        ("wild", common::WILD),
    ]
    .into_iter()
    .map(|(name, source)| item("server-cuda tests", name, common::kernel(name, source)))
    .collect();
    // SAFETY: only compiled here, never launched.
    let native = unsafe {
        tiny_runtime::kernels::Kernels::for_language(tiny_runtime::kernels::Dialect::Cuda)
    };
    for kernel in [
        native.matmul,
        native.bias_add,
        native.gelu,
        native.softmax,
        native.transpose,
        native.gelu_grad,
        native.loss_grad,
        native.sgd,
        native.to_bf16,
        native.from_bf16,
    ] {
        let name = kernel.name().to_string();
        items.push(item("tiny-runtime native", &name, kernel));
    }
    toolchain.check("server-cuda and tiny-runtime CUDA C++", items);

    // The suite's broken kernel: refused, in the words the mock NVRTC
    // (tests/mock/mock_nvrtc.c) puts in its log.
    let broken = common::kernel("broken", common::BROKEN);
    match server_cuda::nvrtc_ptx(&broken, "compute_90") {
        Err(Error::Compile { log, .. }) => {
            assert!(
                log.contains(
                    r#"scope_kernel.cu(1): error: identifier "this_is_not_declared" is undefined"#
                ),
                "the real NVRTC's log differs from the mock's wording:\n{log}"
            );
            assert!(log.contains("NVRTC_ERROR_COMPILATION"), "{log}");
        }
        other => panic!("the real NVRTC accepted the broken kernel: {other:?}"),
    }
}

#[test]
fn cube_kernels() {
    let Some(toolchain) = Toolchain::find() else {
        return;
    };
    use scope_cube::kernels;
    let mut items = Vec::new();
    for (name, kernel) in [
        ("fill", kernels::fill_kernel(Target::Cuda)),
        ("copy", kernels::copy_kernel(Target::Cuda)),
        ("add", kernels::add_kernel(Target::Cuda)),
        ("mix", kernels::mix_kernel(Target::Cuda)),
        ("blend", kernels::blend_kernel(Target::Cuda)),
        ("wide_sum", kernels::wide_sum_kernel(Target::Cuda)),
    ] {
        let kernel = kernel.unwrap_or_else(|e| panic!("scope-cube's {name} for CUDA: {e}"));
        items.push(item("scope-cube", name, translated(&kernel)));
    }
    let tiny = tiny_runtime::CubeKernels::for_target(Target::Cuda)
        .expect("tiny-runtime's cube kernels translate for CUDA");
    for (name, kernel) in [
        ("matmul", &tiny.matmul),
        ("bias_add", &tiny.bias_add),
        ("gelu", &tiny.gelu),
        ("softmax", &tiny.softmax),
        ("transpose", &tiny.transpose),
        ("gelu_grad", &tiny.gelu_grad),
        ("loss_grad", &tiny.loss_grad),
        ("sgd", &tiny.sgd),
        ("to_bf16", &tiny.to_bf16),
        ("from_bf16", &tiny.from_bf16),
    ] {
        items.push(item("tiny-runtime cube", name, translated(kernel)));
    }
    toolchain.check("#[cube] kernels translated to CUDA C++", items);
}

#[test]
fn cubecl_kernels() {
    let Some(toolchain) = Toolchain::find() else {
        return;
    };
    let scratch = &toolchain.scratch;
    let sources = harvest::mock(scratch)
        .and_then(|mock| support::harvest(&mock, &harvest::runtime_cuda()?, scratch))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut items = Vec::new();
    for (what, source) in sources {
        let entry = support::entry_point(&source)
            .unwrap_or_else(|| panic!("no `__global__` function in:\n{source}"));
        let threads = launch_bounds(&source).unwrap_or(1);
        // SAFETY: only compiled here, never launched.
        let kernel = unsafe { Kernel::cuda(entry.as_str(), source) }.block([threads, 1, 1]);
        items.push(item(what, &entry, kernel));
    }
    toolchain.check("cubecl-cpp's CUDA C++ for ScopeRuntime<Cuda>", items);
}

/// The check itself: a kernel NVRTC accepts but ptxas refuses (inline PTX
/// of sm_90a, which neither sm_80 nor plain sm_90 has) is reported, named,
/// for both architectures, with ptxas's words.
#[test]
fn a_kernel_ptxas_refuses_is_named_with_its_log() {
    let Some(toolchain) = Toolchain::find() else {
        return;
    };
    // SAFETY: only compiled here, never launched.
    let kernel = unsafe {
        Kernel::cuda(
            "needs_sm_90a",
            r#"extern "C" __global__ void needs_sm_90a(unsigned int* out) {
                asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
                out[threadIdx.x] = 1;
            }"#,
        )
    }
    .block([128, 1, 1]);
    let (checked, refusals) =
        toolchain.refusals("the check", vec![item("this test", "needs_sm_90a", kernel)]);
    assert_eq!(checked, 1);
    assert_eq!(
        refusals.iter().map(|r| r.arch).collect::<Vec<_>>(),
        nvidia::ARCHS
    );
    for r in &refusals {
        assert_eq!(r.origin, "this test: needs_sm_90a");
        assert!(
            r.what.contains("ptxas") && r.what.contains("setmaxnreg"),
            "{}",
            r.what
        );
    }
}

/// Not a test of its own: the child [`cubecl_kernels`] starts (with
/// `--ignored`) to collect cubek's kernels ([`support::CUBEK_TEST`]).
/// Ignored, so that a run that does nothing with it is never counted as
/// passed.
#[test]
#[ignore = "a helper: cubecl_kernels runs it in a child process"]
fn cubek_kernels_for_the_toolchain_test() {
    support::cubek_child::<server_cuda::Cuda>(harvest::assert_on_the_mock);
}

/// `N` of the first `__launch_bounds__(N)` in `source`.
fn launch_bounds(source: &str) -> Option<u32> {
    let after = &source[source.find("__launch_bounds__(")? + "__launch_bounds__(".len()..];
    after[..after.find(')')?]
        .split(',')
        .next()?
        .trim()
        .parse()
        .ok()
}

/// The NCCL symbols server-cuda's device transport (`src/collective.rs`)
/// calls, and the point-to-point and group calls send/recv would: the
/// communicator's identity and setup (non-blocking, so a missing rank can
/// be aborted instead of hanging), the five collectives, the asynchronous
/// error and abort a deadline needs.
const NCCL_SYMBOLS: [&str; 18] = [
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRankConfig",
    "ncclCommInitRank",
    "ncclCommGetAsyncError",
    "ncclCommAbort",
    "ncclCommDestroy",
    "ncclCommCount",
    "ncclAllReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclBroadcast",
    "ncclAlltoAll",
    "ncclSend",
    "ncclRecv",
    "ncclGroupStart",
    "ncclGroupEnd",
    "ncclGetErrorString",
];

/// cudarc's `nccl` loads the real NCCL the toolchain folder holds
/// (`nvidia-nccl-cu13`), `ncclGetVersion` answers, and every symbol a
/// device transport needs is there — all without a GPU. cudarc finds NCCL
/// by name on the loader's path, which is fixed when a process starts, so
/// the check runs in a child process of this binary with the wheel's
/// folder on `LD_LIBRARY_PATH`.
#[test]
fn nccl_library() {
    const CHILD: &str = "SCOPE_NCCL_CHILD";
    if std::env::var_os(CHILD).is_some_and(|v| v == "soname") {
        // Only `libnccl.so.2` on the path, as NCCL's runtime packages and
        // NVIDIA's wheel install it: cudarc's loader misses it, the
        // server's finds it.
        // SAFETY: asks the loader whether a library of NCCL's names opens.
        let by_cudarc = unsafe { cudarc::nccl::sys::is_culib_present() };
        assert!(!by_cudarc, "cudarc found an NCCL beside the soname alone");
        server_cuda::load_nccl().expect("the server opens NCCL by its soname");
        println!("NCCL by its soname alone: cudarc's loader misses it, server-cuda's opens it");
        return;
    }
    if std::env::var_os(CHILD).is_some() {
        // SAFETY: asks the loader whether a library of NCCL's names opens;
        // loading NCCL runs no code of ours.
        let present = unsafe { cudarc::nccl::sys::is_culib_present() };
        assert!(present, "cudarc finds no NCCL on LD_LIBRARY_PATH");
        let version = cudarc::nccl::result::get_nccl_version().expect("ncclGetVersion answers");
        // SAFETY: the library is NCCL, found above; it stays loaded for the
        // life of the process (cudarc keeps it in a static).
        let library = unsafe { cudarc::nccl::sys::culib() };
        let missing: Vec<_> = NCCL_SYMBOLS
            .iter()
            .filter(|name| {
                // SAFETY: the symbol is only looked up, never called.
                unsafe { library.get::<unsafe extern "C" fn()>(name.as_bytes()) }.is_err()
            })
            .collect();
        assert!(missing.is_empty(), "NCCL {version} lacks {missing:?}");
        // The device transport's own table resolves from the real library,
        // and its first call (a unique id: no GPU needed) answers.
        // SAFETY: each address is looked up by its NCCL name in NCCL,
        // which stays loaded.
        let table = unsafe {
            scope_native::nccl::NcclTable::resolve("nccl", |name| {
                library
                    .get::<*const std::ffi::c_void>(name.as_bytes())
                    .ok()
                    .map(|s| *s)
            })
        }
        .expect("the transport's table resolves from the real NCCL");
        let id = table.unique_id();
        println!(
            "NCCL {version} loaded by cudarc: ncclGetVersion answers, all {} symbols a device transport calls are there, the transport's table resolves, and ncclGetUniqueId answers {}",
            NCCL_SYMBOLS.len(),
            match &id {
                Ok(_) => "an id".to_owned(),
                Err(e) => format!("an error ({e})"),
            }
        );
        let id = id.expect("ncclGetUniqueId answers without a GPU");
        // Joining needs a GPU: without one (no driver here) the real
        // library's refusal comes back typed, through the non-blocking
        // join's poll, rather than as a hang or an abort.
        // SAFETY: the table is NCCL's; one rank of one, joining once.
        let joined = unsafe {
            scope_native::nccl::Communicator::join(
                table,
                id,
                0,
                1,
                std::time::Duration::from_secs(5),
            )
        };
        let refused = joined.expect_err("no GPU here, so no communicator");
        println!("ncclCommInitRankConfig without a GPU: {refused}");
        return;
    }
    let Some(toolchain) = Toolchain::find() else {
        return;
    };
    let lib = toolchain.dir.join("nvidia/nccl/lib");
    assert!(
        lib.join("libnccl.so").exists(),
        "no NCCL in {} (rerun ci/install-cuda-toolchain.sh)",
        toolchain.dir.display()
    );
    // This test again, in a child whose loader searches `path`, as `mode`:
    // whether it passed, and what it said.
    let child = |mode: &str, path: &std::path::Path| {
        let output = std::process::Command::new(std::env::current_exe().expect("this test binary"))
            .args([
                "nccl_library",
                "--exact",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CHILD, mode)
            .env("LD_LIBRARY_PATH", path)
            .output()
            .expect("the child runs");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.success(), said)
    };
    let (passed, said) = child("1", &lib);
    assert!(passed, "the NCCL check failed:\n{said}");
    let reported = said
        .lines()
        .find_map(|l| l.find("NCCL ").map(|at| &l[at..]))
        .expect("the child says which NCCL it loaded");
    println!("{reported}");
    if let Some(join) = said
        .lines()
        .find(|l| l.contains("ncclCommInitRankConfig without"))
    {
        println!("{join}");
    }
    // A folder holding NCCL under its soname alone.
    let soname_only =
        std::env::temp_dir().join(format!("scope-nccl-soname-{}", std::process::id()));
    std::fs::create_dir_all(&soname_only).expect("a folder");
    let link = soname_only.join("libnccl.so.2");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(lib.join("libnccl.so.2"), &link).expect("a link");
    let (passed, said) = child("soname", &soname_only);
    let _ = std::fs::remove_dir_all(&soname_only);
    assert!(passed, "the soname check failed:\n{said}");
    assert!(said.contains("NCCL by its soname alone"), "{said}");
    println!("NCCL by its soname alone: cudarc's loader misses it, server-cuda's opens it");
}
