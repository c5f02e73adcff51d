//! AMD's real hiprtc on every HIP kernel the project emits, on a machine
//! with no AMD GPU.
//!
//! The other HIP tests run against a mock runtime whose hiprtc accepts any
//! source; a kernel the real compiler rejects would be found only on AMD
//! hardware. Here every kernel goes through the server's own compile path
//! ([`server_hip::hiprtc_code`]: hiprtc with the server's options and
//! program name) for `gfx90a` (MI200) and `gfx942` (MI300), and the code
//! object must be an AMDGPU ELF holding the kernel's descriptor
//! (`<entry>.kd`), which is what `hipModuleGetFunction` looks up.
//!
//! hiprtc comes from what `SCOPE_HIP_TOOLCHAIN` names (relative to the
//! workspace root): a hiprtc library (`libhiprtc.so.6`, or ROCm 5's
//! `libamdhip64.so.5`, which carries hiprtc), or a folder holding one.
//! `ci/install-hip-toolchain.sh` installs Debian's ROCm 5.2. Without it each
//! test prints `skipped: no hiprtc (...)`; with `SCOPE_REQUIRE` naming
//! `hip-toolchain` (or `all`) that is a failure.
//!
//! ROCm 5.2's compiler (comgr on LLVM 14) predates gfx942 — and its hiprtc
//! aborts the process, rather than answering an error, when asked for an
//! architecture it does not know. So each architecture is first tried on a
//! trivial kernel in a child process (this binary again, running only
//! [`hiprtc_arch_probe`]); an architecture the child dies on is reported
//! skipped, with the reason.
//!
//! The kernels, a test per group and architecture, each printing how many
//! distinct kernels it compiled:
//!
//! - [`every_hip_kernel_compiles_for_gfx90a`] (and `_gfx942`): this crate's
//!   test kernels, tiny-runtime's native HIP C++, and scope-cube's and
//!   tiny-runtime's `#[cube]` kernels translated to HIP C++.
//! - [`cubecl_kernels_compile_for_gfx90a`] (and `_gfx942`): what cubecl-cpp
//!   writes for `ScopeRuntime<Hip>` when cubecl-core's runtime tests and
//!   cubek's matmul and reductions run on it, collected in child processes
//!   on the mock (scope-cubecl's `tests/support/toolchain.rs`, shared with
//!   server-cuda, says how, and `toolchain/harvest.rs` what is HIP's).
//!
//! Also here: the server's loader given ROCm 5.2's runtime refuses it with
//! a typed error; hiprtc's log for the suite's `broken` kernel, whose
//! wording the mock imitates; and eight threads compiling at once, which
//! ROCm 5.2's hiprtc survives only because the server compiles one program
//! at a time.

mod common;
#[path = "toolchain/harvest.rs"]
mod harvest;
#[path = "../../scope-cubecl/tests/support/toolchain.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use scope_core::{Error, Kernel};
use scope_cube::Target;

const SKIP: &str = "skipped: no hiprtc (set SCOPE_HIP_TOOLCHAIN, see ci/install-hip-toolchain.sh)";

/// The variable that makes [`hiprtc_arch_probe`] compile for an
/// architecture.
const PROBE: &str = "SCOPE_HIPRTC_PROBE_ARCH";

/// The hiprtc library `SCOPE_HIP_TOOLCHAIN` names, or `None` after printing
/// why the test is skipped (a failure when `SCOPE_REQUIRE` names
/// `hip-toolchain`).
fn hiprtc() -> Option<PathBuf> {
    let Some(named) = std::env::var_os("SCOPE_HIP_TOOLCHAIN").filter(|v| !v.is_empty()) else {
        assert!(
            !scope_core::required("hip-toolchain"),
            "SCOPE_REQUIRE names hip-toolchain, and SCOPE_HIP_TOOLCHAIN is not set \
             (ci/install-hip-toolchain.sh installs ROCm 5.2's hiprtc)"
        );
        println!("{SKIP}");
        return None;
    };
    // Relative to the workspace root; cargo runs a test binary in its
    // package's folder.
    let named = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(named);
    if named.is_file() {
        return Some(named);
    }
    let found = [
        "libhiprtc.so.7",
        "libhiprtc.so.6",
        "libhiprtc.so",
        "libamdhip64.so.5",
    ]
    .iter()
    .flat_map(|name| [named.join(name), named.join("lib").join(name)])
    .find(|p| p.is_file());
    Some(found.unwrap_or_else(|| {
        panic!(
            "SCOPE_HIP_TOOLCHAIN={} holds no hiprtc library (libhiprtc.so.6/7, or ROCm 5's libamdhip64.so.5)",
            named.display()
        )
    }))
}

/// A kernel of `origin`, under the name `name`.
struct Item {
    origin: String,
    kernel: Kernel,
}

fn item(origin: &str, name: &str, kernel: Kernel) -> Item {
    Item {
        origin: format!("{origin}: {name}"),
        kernel,
    }
}

/// Every HIP kernel the project emits, once each.
fn kernels() -> Vec<Item> {
    let mut items = vec![
        item("server-hip tests", "fill", common::fill()),
        item("server-hip tests", "copy", common::copy()),
        item("server-hip tests", "add", common::add()),
    ];
    // SAFETY: only compiled here, never launched.
    let native = unsafe {
        tiny_runtime::kernels::Kernels::for_language(tiny_runtime::kernels::Dialect::Hip)
    };
    for kernel in [
        native.matmul,
        native.bias_add,
        native.gelu,
        native.softmax,
        native.to_bf16,
        native.from_bf16,
    ] {
        let name = kernel.name().to_string();
        items.push(item("tiny-runtime native", &name, kernel));
    }
    use scope_cube::kernels;
    for (name, kernel) in [
        ("fill", kernels::fill_kernel(Target::Hip)),
        ("copy", kernels::copy_kernel(Target::Hip)),
        ("add", kernels::add_kernel(Target::Hip)),
        ("mix", kernels::mix_kernel(Target::Hip)),
        ("blend", kernels::blend_kernel(Target::Hip)),
        ("wide_sum", kernels::wide_sum_kernel(Target::Hip)),
    ] {
        let kernel = kernel.unwrap_or_else(|e| panic!("scope-cube's {name} for HIP: {e}"));
        // SAFETY: only compiled here, never launched.
        items.push(item("scope-cube", name, unsafe { kernel.kernel() }.clone()));
    }
    let tiny = tiny_runtime::CubeKernels::for_target(Target::Hip)
        .expect("tiny-runtime's cube kernels translate for HIP");
    for (name, kernel) in [
        ("matmul", &tiny.matmul),
        ("bias_add", &tiny.bias_add),
        ("gelu", &tiny.gelu),
        ("softmax", &tiny.softmax),
        ("to_bf16", &tiny.to_bf16),
        ("from_bf16", &tiny.from_bf16),
    ] {
        // SAFETY: only compiled here, never launched.
        items.push(item(
            "tiny-runtime cube",
            name,
            unsafe { kernel.kernel() }.clone(),
        ));
    }
    distinct(items)
}

/// `items` with each source and entry point once, the first origin kept.
fn distinct(mut items: Vec<Item>) -> Vec<Item> {
    let mut seen = std::collections::HashSet::new();
    items.retain(|i| {
        seen.insert((
            i.kernel.source().text().unwrap_or_default().to_owned(),
            i.kernel.entry_point().to_string(),
        ))
    });
    items
}

/// Whether `code` is an AMDGPU code object defining `entry`'s kernel
/// descriptor.
fn defines_kernel(code: &[u8], entry: &str) -> Result<(), String> {
    const EM_AMDGPU: u16 = 224;
    if code.get(..4) != Some(b"\x7fELF") {
        return Err("the code object is not an ELF file".to_owned());
    }
    let machine = code.get(18..20).map(|b| u16::from_le_bytes([b[0], b[1]]));
    if machine != Some(EM_AMDGPU) {
        return Err(format!("the ELF is for machine {machine:?}, not AMDGPU"));
    }
    let descriptor = format!("{entry}.kd\0");
    if !code
        .windows(descriptor.len())
        .any(|w| w == descriptor.as_bytes())
    {
        return Err(format!(
            "no kernel descriptor `{entry}.kd` in the code object: the server would not find \
             the entry point (is it `extern \"C\" __global__`?)"
        ));
    }
    Ok(())
}

/// Whether this hiprtc can target `arch`: a trivial kernel compiled for it
/// in a child process, which survives. `Err` says why not.
fn can_target(arch: &str) -> Result<(), String> {
    let me = std::env::current_exe().expect("this test binary's path");
    let out = Command::new(&me)
        .args(["--exact", "hiprtc_arch_probe", "--ignored", "--nocapture"])
        .env(PROBE, arch)
        .stdin(Stdio::null())
        .output()
        .expect("running this test binary as a child");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && said.contains("1 passed") {
        return Ok(());
    }
    let how = match out.status.code() {
        Some(code) => format!("exit status {code}"),
        None => "killed by a signal".to_owned(),
    };
    let last = said
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    Err(format!(
        "this hiprtc cannot compile even a trivial kernel for {arch}: the child died ({how}; \
         its last words: {last:?})"
    ))
}

/// hiprtc, when `SCOPE_HIP_TOOLCHAIN` names one that can target `arch`;
/// `None` after saying why not.
fn hiprtc_for(arch: &str) -> Option<PathBuf> {
    let library = hiprtc()?;
    if let Err(why) = can_target(arch) {
        println!("skipped: {arch} not checked: {why}");
        return None;
    }
    Some(library)
}

/// Compile every kernel of the project's own for `arch`.
fn check_arch(arch: &str) {
    let Some(library) = hiprtc_for(arch) else {
        return;
    };
    check(&library, arch, "HIP kernels", kernels());
}

/// Why hiprtc's refusal of a kernel, with `log`, is ROCm 5's and not the
/// kernel's, when it is; `None` for every other refusal, which fails the
/// test.
///
/// One case, matched narrowly: the hiprtc is ROCm 5's (the runtime library
/// `libamdhip64.so.5`, which carries it) and every error in the log is
/// that `__activemask` is undeclared. cubecl-cpp's `elect` (lowest active
/// lane) calls `__activemask()`, which HIP's headers gained only in ROCm
/// 6.2; ROCm 5.2's have no such function, whatever the source or options.
/// A kernel of ROCm 6's API that a newer hiprtc compiles is not a fault of
/// the kernel, and hiding every refusal of ROCm 5.2 would hide real ones.
fn older_rocm(library: &Path, log: &str) -> Option<&'static str> {
    let rocm5 = library
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("libamdhip64.so.5"));
    let mut errors = log.lines().filter(|l| l.contains("error:")).peekable();
    let only_activemask = errors.peek().is_some()
        && errors.all(|l| l.ends_with("error: use of undeclared identifier '__activemask'"));
    (rocm5 && only_activemask).then_some(
        "ROCm 5.2's HIP headers have no `__activemask()` (cubecl-cpp's `elect` calls it; HIP \
         has it from ROCm 6.2)",
    )
}

/// Compile every kernel of `items` (distinct) with the hiprtc `library`
/// for `arch`, through the server's compile path, print a line each and a
/// count under the heading `what`, and fail naming every kernel refused,
/// with hiprtc's log — except a refusal [`older_rocm`] explains, which is
/// reported as not compiled, with its reason.
fn check(library: &Path, arch: &str, what: &str, items: Vec<Item>) {
    let rtc = [library.display().to_string()];
    let mut refused = Vec::new();
    let mut not_compiled = Vec::new();
    println!(
        "{what} for {arch}: {} distinct, hiprtc from {}, options {:?}",
        items.len(),
        library.display(),
        server_hip::compile_options(arch)
    );
    for i in &items {
        let compiled = server_hip::hiprtc_code(&rtc, &i.kernel, arch);
        if let Err(Error::Compile { log, .. }) = &compiled
            && let Some(reason) = older_rocm(library, log)
        {
            println!("  not compiled  {arch}  {}: {reason}", i.origin);
            not_compiled.push(reason);
            continue;
        }
        let result = compiled
            .map_err(|e| match e {
                Error::Compile { log, .. } => format!("hiprtc refused it:\n{log}"),
                other => format!("hiprtc failed: {other}"),
            })
            .and_then(|code| {
                defines_kernel(&code, i.kernel.entry_point())?;
                Ok(code.len())
            });
        match result {
            Ok(bytes) => println!("  ok      {arch}  {bytes:>6} B  {}", i.origin),
            Err(why) => {
                println!("  FAILED  {arch}  {}", i.origin);
                refused.push(format!(
                    "---- {} for {arch} ----\n{why}\n(source:)\n{}",
                    i.origin,
                    i.kernel.source().text().unwrap_or_default()
                ));
            }
        }
    }
    let skipped = not_compiled.len();
    not_compiled.sort_unstable();
    not_compiled.dedup();
    let why_not = match skipped {
        0 => String::new(),
        n => format!(" ({n} not compiled: {})", not_compiled.join("; ")),
    };
    println!(
        "{what} for {arch}: {} of {} distinct kernels compiled by hiprtc into a code object defining their entry point{why_not}",
        items.len() - refused.len() - skipped,
        items.len()
    );
    assert!(
        refused.is_empty(),
        "{} of {} kernels refused for {arch}:\n\n{}",
        refused.len(),
        items.len(),
        refused.join("\n\n")
    );
}

#[test]
fn every_hip_kernel_compiles_for_gfx90a() {
    check_arch("gfx90a");
}

#[test]
fn every_hip_kernel_compiles_for_gfx942() {
    check_arch("gfx942");
}

/// The HIP C++ cubecl-cpp writes for `ScopeRuntime<Hip>`, collected once
/// per process from the children [`support::harvest`] runs on the mock.
fn cubecl_items() -> &'static [(&'static str, String)] {
    static COLLECTED: OnceLock<Result<Vec<(&'static str, String)>, String>> = OnceLock::new();
    let collected = COLLECTED.get_or_init(|| {
        let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("hip-toolchain")
            .join(std::process::id().to_string());
        let mock = harvest::mock(&scratch)?;
        support::harvest(&mock, &harvest::runtime_hip()?, &scratch)
    });
    collected.as_deref().unwrap_or_else(|e| panic!("{e}"))
}

/// Compile cubecl-cpp's HIP C++ for `ScopeRuntime<Hip>` for `arch`.
fn check_cubecl(arch: &str) {
    let Some(library) = hiprtc_for(arch) else {
        return;
    };
    let items = cubecl_items()
        .iter()
        .map(|(what, source)| {
            let entry = support::entry_point(source)
                .unwrap_or_else(|| panic!("no `__global__` function in:\n{source}"));
            // SAFETY: only compiled here, never launched.
            let kernel = unsafe { Kernel::hip(entry.as_str(), source.as_str()) };
            item(what, &entry, kernel)
        })
        .collect();
    check(
        &library,
        arch,
        "cubecl-cpp's HIP C++ for ScopeRuntime<Hip>",
        distinct(items),
    );
}

#[test]
fn cubecl_kernels_compile_for_gfx90a() {
    check_cubecl("gfx90a");
}

#[test]
fn cubecl_kernels_compile_for_gfx942() {
    check_cubecl("gfx942");
}

/// Not a test of its own: the child [`cubecl_items`] starts (with
/// `--ignored`) to collect cubek's kernels ([`support::CUBEK_TEST`]).
/// Ignored, so that a run that does nothing with it is never counted as
/// passed.
#[test]
#[ignore = "a helper: cubecl_items runs it in a child process"]
fn cubek_kernels_for_the_toolchain_test() {
    support::cubek_child::<server_hip::Hip>(harvest::assert_on_the_mock);
}

/// The rule that reports a kernel as not compiled matches ROCm 5's hiprtc
/// refusing `__activemask` and nothing else: another error beside it, or
/// the same log from a newer hiprtc, is a refusal.
#[test]
fn only_rocm_5s_missing_activemask_is_not_compiled() {
    let rocm5 = Path::new("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5");
    let rocm6 = Path::new("/opt/rocm/lib/libhiprtc.so.6");
    let activemask = "/tmp/comgr-5430d5/input/CompileSource:23:22: error: use of undeclared \
                      identifier '__activemask'\nuint64_t const v31 = __activemask();\n1 error \
                      generated when compiling for gfx90a.";
    let and_another = format!(
        "{activemask}\n/tmp/comgr-5430d5/input/CompileSource:30:1: error: use of undeclared \
         identifier 'v99'"
    );
    assert!(older_rocm(rocm5, activemask).is_some());
    assert_eq!(older_rocm(rocm6, activemask), None);
    assert_eq!(older_rocm(rocm5, &and_another), None);
    assert_eq!(
        older_rocm(rocm5, "error: use of undeclared identifier 'x'"),
        None
    );
    assert_eq!(older_rocm(rocm5, ""), None);
}

/// Eight threads compile at once through the server's path, twice each:
/// ROCm 5.2's hiprtc aborts the process when two threads compile at once
/// (`LLVM ERROR: inconsistency in registered CommandLine options`), so the
/// server takes one program at a time, and every compile here succeeds.
/// (This binary's other tests compile on libtest's threads too, without a
/// lock of their own.)
#[test]
fn hiprtc_compiles_from_many_threads_at_once() {
    let Some(library) = hiprtc() else {
        return;
    };
    let rtc = [library.display().to_string()];
    let objects: Vec<usize> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    (0..2)
                        .map(|_| {
                            server_hip::hiprtc_code(&rtc, &common::fill(), "gfx90a")
                                .expect("hiprtc compiles the fill kernel")
                                .len()
                        })
                        .sum::<usize>()
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("no compiling thread panicked"))
            .collect()
    });
    assert!(objects.iter().all(|bytes| *bytes > 0), "{objects:?}");
    println!(
        "16 compiles on 8 threads: {} bytes of code objects",
        objects.iter().sum::<usize>()
    );
}

/// hiprtc's log for the suite's broken kernel names the identifier in the
/// words the mock hiprtc (tests/mock/mock_hip.c) uses.
#[test]
fn the_broken_kernel_is_refused_in_the_mocks_words() {
    let Some(library) = hiprtc() else {
        return;
    };
    let rtc = [library.display().to_string()];
    let compiled = server_hip::hiprtc_code(&rtc, &common::broken(), "gfx90a");
    match compiled {
        Err(Error::Compile { log, .. }) => {
            println!("{log}");
            // The file name is the compiler's own (ROCm 5.2's comgr names
            // a temporary folder's file, not the program), so only the
            // position and the words are compared.
            assert!(
                log.contains(
                    ":3:24: error: use of undeclared identifier 'this_name_is_not_declared_anywhere'"
                ),
                "the real hiprtc's log differs from the mock's wording:\n{log}"
            );
            assert!(log.contains("HIPRTC_ERROR_COMPILATION"), "{log}");
        }
        other => panic!("hiprtc accepted the broken kernel: {other:?}"),
    }
}

/// The server's loader, given the runtime the toolchain came with, answers
/// a typed error and never a panic: ROCm 5's `libamdhip64.so.5` lacks
/// `hipGetDevicePropertiesR0600` (the ROCm 6 ABI the server is written
/// to), and a ROCm 6+ runtime on a machine without an AMD GPU has no device.
#[test]
fn the_toolchains_runtime_is_refused_with_a_typed_error() {
    let Some(library) = hiprtc() else {
        return;
    };
    let runtime = library.with_file_name("libamdhip64.so.5");
    let runtime = if runtime.is_file() {
        runtime
    } else {
        library.with_file_name("libamdhip64.so.6")
    };
    if !runtime.is_file() {
        println!("skipped: no HIP runtime beside {}", library.display());
        return;
    }
    let names = [runtime.display().to_string()];
    match server_hip::client_from(&names, &names, 0) {
        Err(Error::BackendUnavailable { reason, .. }) => {
            println!("{}: {reason}", runtime.display());
            if runtime.ends_with("libamdhip64.so.5") {
                assert!(
                    reason.contains("hipGetDevicePropertiesR0600") && reason.contains("ROCm 6"),
                    "{reason}"
                );
            }
        }
        Err(other) => panic!("expected BackendUnavailable, got {other}"),
        Ok(client) => println!("a HIP device is here: {}", client.describe()),
    }
}

/// Not a test of its own: the child [`can_target`] starts (with
/// `--ignored`). Ignored, so that a run that does nothing with it is never
/// counted as passed.
#[test]
#[ignore = "a helper: can_target runs it in a child process"]
fn hiprtc_arch_probe() {
    let Ok(arch) = std::env::var(PROBE) else {
        return;
    };
    let library = hiprtc().expect("the parent found hiprtc");
    // SAFETY: only compiled here, never launched.
    let kernel = unsafe {
        Kernel::hip(
            "probe",
            r#"extern "C" __global__ void probe(unsigned int* out) { out[threadIdx.x] = 1; }"#,
        )
    };
    server_hip::hiprtc_code(&[library.display().to_string()], &kernel, &arch)
        .unwrap_or_else(|e| panic!("{e}"));
}
