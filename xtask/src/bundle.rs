//! `cargo xtask bundle`: one backend's device checks, built here, to run on
//! a GPU machine that has no Rust toolchain.
//!
//! Build on one machine, run on another. The GPU machine may have its driver
//! and toolkit but no cargo and no network, and building the workspace there
//! may not be possible or worth its time. So this task builds every test
//! binary that exercises the backend on a device, plus its bench, and packs
//! them into `.device/` with a `run.sh`. Copy `.device/` to the GPU machine
//! and run
//!
//! ```text
//! bash .device/run.sh        # logs and a summary to $OUT, or .device/out
//! ```
//!
//! which runs them with `SCOPE_REQUIRE` set (a missing device fails, never
//! skips) and writes three logs.
//!
//! Decisions, and what breaks otherwise:
//!
//! 1. **Tests build in their own profile** (`device`: dev with no debug info,
//!    symbols kept). Debug info makes each test binary ~500 MB, too much to
//!    copy; a separate profile also leaves `target/debug`'s cache untouched.
//! 2. **Benches build as `cargo bench` builds them**, so the figures are the
//!    ones `cargo xtask bench` would print there.
//! 3. **The binaries travel compressed** (`tar.xz`) and `run.sh` unpacks them
//!    in `/tmp`. `--max-mib N` makes a larger bundle a failure here rather
//!    than a refused transfer there.
//! 4. **The glibc they need is printed here**: a binary linked against a
//!    newer glibc than the GPU machine's will not start there.
//! 5. **Tests that fake the device are left out** (`mock*` binaries). They
//!    compile C from this checkout's paths, and would answer for the mock, not
//!    the hardware. So is the toolchain row, which needs no device.
//! 6. **Binaries outside the server's own package are stripped** of symbols.
//!    They link all of cubecl (and wgpu, ash), and a third of each is symbols.
//!    A failure still prints its panic message and location; only backtrace
//!    frames lose their names.
//! 7. **The CUDA bundle carries NVRTC 12.2** from NVIDIA's wheel (what
//!    `ci/install-cuda-toolchain.sh` puts in `target/cuda-toolchain`), so
//!    `run.sh` needs only the driver. A driver JITs PTX of its own CUDA
//!    release's ISA and older, never newer. NVRTC 12.2 writes PTX ISA 8.2,
//!    which every driver from CUDA 12.2 (Linux 535) on JITs; NVRTC 13.0's
//!    ISA 9.0 would need a 13.x driver. A probe travels with it
//!    (`bin/probe-cuda-versions`). Before any test, `run.sh` prints the
//!    driver's version and each candidate NVRTC's, with the PTX ISA it writes.
//!    It uses the machine's own NVRTC only where the driver JITs its PTX, else
//!    the bundle's. Without a driver it stops there (exit status 3). A driver
//!    that still meets newer PTX answers with server-cuda's `UnsupportedPtx`.
//! 8. **`run.sh` keeps one time budget** (`SCOPE_BUNDLE_SECONDS`, 540 s by
//!    default). It runs the server's own tests first, then tiny-runtime's,
//!    scope-cube's and cubecl's, then the bench. So a GPU machine lent for a
//!    few minutes reaches the checks that say most. What the budget does not
//!    reach is reported as not run (exit status 2), never passed.
//! 9. **`SCOPE_BUNDLE_NO_BENCH=1` leaves the bench out**: its build is the
//!    bundle's longest, and the tests alone still say most.
//! 10. **The collectives' library does not travel** (NCCL is 250 MB).
//!     `run.sh` uses the machine's own, requires it where it finds one
//!     (`SCOPE_REQUIRE=cuda,nccl`), and says so where there is none.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};

use crate::backends::{BackendKind, Choice};
use crate::run;

/// Where the bundle goes, relative to the workspace root (ignored by git).
pub const DIR: &str = ".device";

/// The script that runs on the device machine.
const RUN_SH: &str = include_str!("bundle_run.sh");

/// Test targets of a bundled package that are not device checks. The toolchain
/// row (`tests/toolchain.rs`) runs the real compilers and NCCL on the building
/// machine, needs no device, and links all of cubecl and cubek.
const NOT_DEVICE_CHECKS: [&str; 1] = ["toolchain"];

/// The NVRTC libraries `ci/install-cuda-toolchain.sh` installs, relative to the
/// workspace root. The CUDA bundle carries them for a GPU machine without a
/// toolkit; `run.sh` uses them only if the machine has no NVRTC of its own.
const NVRTC_FROM_WHEEL: [&str; 2] = [
    "target/cuda-toolchain/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
    "target/cuda-toolchain/nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.2",
];

/// The probe `run.sh` asks which driver and NVRTC a machine has, and whether the
/// driver JITs that NVRTC's PTX. It is server-cuda's `cuda_versions` example.
const CUDA_PROBE: &str = "probe-cuda-versions";

/// One cargo build whose executables go into the bundle.
struct Build {
    /// Arguments after `cargo`.
    args: Vec<String>,
    /// Prefix of the bundled file names: `test`, `bench` or `probe`.
    kind: &'static str,
}

/// One executable in the bundle.
struct Unit {
    /// Where cargo put it.
    from: PathBuf,
    /// Its name in the bundle: `test-server-cuda-device`.
    name: String,
}

fn builds(backend: BackendKind) -> Vec<Build> {
    let server = backend.server_crate();
    let test = |extra: &[&str]| Build {
        args: ["test", "--profile", "device", "--no-run"]
            .iter()
            .chain(extra)
            .map(|s| (*s).to_owned())
            .collect(),
        kind: "test",
    };
    let mut builds = vec![
        // The server's own unit and integration tests.
        test(&["-p", server]),
        // Single-source kernels compiled by this backend's compiler.
        test(&["-p", "scope-cube", "--test", "servers"]),
        // The demo runtime on this backend alone.
        test(&[
            "-p",
            "tiny-runtime",
            "--no-default-features",
            "--features",
            backend.feature(),
            "--test",
            "backends",
        ]),
        // cubecl's runtime tests and cubek's kernels through the adapter.
        scope_cubecl(backend),
    ];
    // The bench needs the bench profile's own build of every dependency:
    // the longest build of the bundle. `SCOPE_BUNDLE_NO_BENCH=1` leaves it
    // out when the tests alone are wanted soon; run.sh then says so.
    if std::env::var_os("SCOPE_BUNDLE_NO_BENCH").is_none() {
        builds.push(Build {
            args: ["bench", "--no-run", "-p", server]
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            kind: "bench",
        });
    }
    if backend == BackendKind::Cuda {
        // The versions `run.sh` prints before any test, and its choice of
        // NVRTC.
        builds.push(Build {
            args: [
                "build",
                "--profile",
                "device",
                "-p",
                BackendKind::Cuda.server_crate(),
                "--example",
                "cuda_versions",
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .collect(),
            kind: "probe",
        });
    }
    builds
}

/// `scope-cubecl` on `backend` alone: its runtime-test binary, where the server
/// has one, and the cubek tests. HIP's runtime-test binary stays out: it serves
/// the HIP toolchain row, which runs it over the mock runtime.
fn scope_cubecl(backend: BackendKind) -> Build {
    let features = format!("{},runtime-tests", backend.feature());
    let mut args: Vec<String> = [
        "test",
        "--profile",
        "device",
        "--no-run",
        "-p",
        "scope-cubecl",
        "--no-default-features",
        "--features",
        &features,
        "--test",
        "cubek",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let binary = crate::cubecl::binary_of(backend).filter(|_| backend != BackendKind::Hip);
    if let Some(binary) = binary {
        args.extend(["--test".to_owned(), binary.to_owned()]);
    }
    Build { args, kind: "test" }
}

/// Build one cargo invocation and return the executables it made.
fn executables(build: &Build) -> Result<Vec<Unit>> {
    let mut command = run::cargo();
    command
        .args(&build.args)
        .arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    println!("==> {}", run::show(&command));
    let output = command
        .output()
        .with_context(|| format!("starting {}", run::show(&command)))?;
    ensure!(
        output.status.success(),
        "the build failed: {}",
        run::show(&command)
    );
    let mut units = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(path) = message["executable"].as_str() else {
            continue;
        };
        let target = message["target"]["name"].as_str().unwrap_or("unknown");
        if target.starts_with("mock") || NOT_DEVICE_CHECKS.contains(&target) {
            continue;
        }
        // `package_id` reads `path+file:///…/crates/server-cuda#0.1.0`.
        let package = message["package_id"]
            .as_str()
            .and_then(|id| id.rsplit('/').next())
            .and_then(|tail| tail.split(['#', '@']).next())
            .unwrap_or("unknown");
        let kinds = &message["target"]["kind"];
        let has_kind = |kind: &str| {
            kinds
                .as_array()
                .is_some_and(|k| k.iter().any(|v| v == kind))
        };
        // A test build also makes the binaries its tests run
        // (`CARGO_BIN_EXE_*`), and a bench build the library's own bench
        // harness: neither is a check.
        let wanted = match build.kind {
            "bench" => has_kind("bench"),
            "probe" => has_kind("example"),
            _ => message["profile"]["test"].as_bool() == Some(true),
        };
        if !wanted {
            continue;
        }
        let is_lib = has_kind("lib");
        let name = if build.kind == "probe" {
            format!("probe-{}", target.replace('_', "-"))
        } else if is_lib {
            format!("{}-{package}-unit", build.kind)
        } else {
            format!("{}-{package}-{target}", build.kind)
        };
        units.push(Unit {
            from: PathBuf::from(path),
            name,
        });
    }
    Ok(units)
}

/// Drop `binary`'s symbol tables (`strip --strip-all`), or say why not.
fn strip(binary: &Path) {
    match Command::new("strip")
        .arg("--strip-all")
        .arg(binary)
        .status()
    {
        Ok(status) if status.success() => {}
        Ok(status) => println!("  (strip failed on {}: {status})", binary.display()),
        Err(e) => println!("  (not stripped, no `strip` here: {e})"),
    }
}

/// The newest `GLIBC_x.y` symbol version `binary` needs, if `objdump` can
/// tell.
fn glibc_needed(binary: &Path) -> Option<String> {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(binary)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut versions: Vec<Vec<u32>> = text
        .split_whitespace()
        .filter_map(|w| w.trim_start_matches('(').strip_prefix("GLIBC_"))
        .map(|v| v.trim_end_matches(')'))
        .filter_map(|v| v.split('.').map(|p| p.parse().ok()).collect())
        .collect();
    versions.sort();
    versions
        .last()
        .map(|v| v.iter().map(u32::to_string).collect::<Vec<_>>().join("."))
}

/// What the probe said of the bundled NVRTC.
struct NvrtcSaid {
    /// `12.2`.
    version: String,
    /// `8.2`.
    ptx_isa: String,
}

/// Run the bundle's probe on its NVRTC (`lib` first on the loader's path)
/// and print what it says: the version and the PTX ISA version it writes,
/// measured, not assumed. "unknown" where the probe could not tell.
fn probe_nvrtc(probe: &Path, lib: &Path) -> NvrtcSaid {
    let output = Command::new(probe).env("LD_LIBRARY_PATH", lib).output();
    let text = match &output {
        Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
        Err(e) => format!("(the probe did not run: {e})"),
    };
    for line in text.lines() {
        println!("  probe: {line}");
    }
    // "NVRTC: 12.2 (/…/libnvrtc.so.12), writes PTX ISA 8.2"
    let line = text
        .lines()
        .find(|l| l.starts_with("NVRTC: "))
        .unwrap_or("");
    let version = line
        .strip_prefix("NVRTC: ")
        .and_then(|rest| rest.split_whitespace().next())
        .filter(|v| v.contains('.'))
        .unwrap_or("unknown")
        .to_owned();
    let ptx_isa = line
        .rsplit_once("writes PTX ISA ")
        .map_or("unknown", |(_, isa)| isa.trim())
        .to_owned();
    NvrtcSaid { version, ptx_isa }
}

fn size_mib(path: &Path) -> f64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0) as f64 / (1 << 20) as f64
}

/// `cargo xtask bundle --backend B [--max-mib N]`: false when the bundle
/// is larger than `max_mib`.
pub fn bundle(backend: Choice, max_mib: Option<f64>) -> Result<bool> {
    let Choice::One(kind) = backend else {
        return backend.refused(&[]);
    };
    let root = run::root();
    let dir = root.join(DIR);
    let staging = dir.join("bin");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&staging)?;

    let mut units = Vec::new();
    for build in builds(kind) {
        units.extend(executables(&build)?);
    }
    if units.is_empty() {
        bail!("the builds made no executables");
    }
    println!("\nbundle for {backend}");
    let mut newest_glibc: Option<String> = None;
    let own = format!("-server-{backend}-");
    for unit in &units {
        let to = staging.join(&unit.name);
        std::fs::copy(&unit.from, &to)
            .with_context(|| format!("copying {}", unit.from.display()))?;
        if !unit.name.contains(&own) {
            strip(&to);
        }
        let glibc = glibc_needed(&to);
        println!(
            "  {:<44} {:>6.1} MiB  glibc {}",
            unit.name,
            size_mib(&to),
            glibc.as_deref().unwrap_or("?")
        );
        if let Some(g) = glibc {
            let parse =
                |s: &str| -> Vec<u32> { s.split('.').filter_map(|p| p.parse().ok()).collect() };
            if newest_glibc.as_deref().is_none_or(|n| parse(&g) > parse(n)) {
                newest_glibc = Some(g);
            }
        }
    }

    let mut packed = vec!["bin"];
    // The bundled NVRTC's version and the PTX ISA it writes, as the probe
    // measured them here.
    let mut nvrtc: Option<NvrtcSaid> = None;
    if kind == BackendKind::Cuda {
        let wheel: Vec<PathBuf> = NVRTC_FROM_WHEEL.iter().map(|p| root.join(p)).collect();
        if wheel.iter().all(|p| p.exists()) {
            let lib = dir.join("lib");
            std::fs::create_dir_all(&lib)?;
            for from in &wheel {
                let to = lib.join(from.file_name().unwrap_or_default());
                std::fs::copy(from, &to).with_context(|| format!("copying {}", from.display()))?;
                println!(
                    "  {:<44} {:>6.1} MiB  (NVRTC, where the machine's PTX is too new for its driver)",
                    to.file_name().unwrap_or_default().to_string_lossy(),
                    size_mib(&to)
                );
            }
            // The server looks NVRTC up as `libnvrtc.so` first: under that
            // name too, so that the bundle's, first on the path, wins over
            // any other the machine has.
            #[cfg(unix)]
            std::os::unix::fs::symlink("libnvrtc.so.12", lib.join("libnvrtc.so"))
                .context("linking libnvrtc.so")?;
            let said = probe_nvrtc(&staging.join(CUDA_PROBE), &lib);
            nvrtc = Some(said);
            packed.push("lib");
        } else {
            println!(
                "  no NVRTC carried: {} is missing (ci/install-cuda-toolchain.sh installs it); \
                 the GPU machine must have its own",
                NVRTC_FROM_WHEEL[0]
            );
        }
    }
    let archive = dir.join("bundle.tar.xz");
    let tar = Command::new("tar")
        .env("XZ_OPT", "-9 -T0")
        .arg("-cJf")
        .arg(&archive)
        .arg("-C")
        .arg(&dir)
        .args(&packed)
        .status()
        .context("running tar (with xz) to pack the bundle")?;
    ensure!(tar.success(), "tar could not pack {}", staging.display());
    for folder in &packed {
        std::fs::remove_dir_all(dir.join(folder))?;
    }

    let commit = run::output_of("git", &["rev-parse", "--short", "HEAD"])
        .unwrap_or_else(|| "unknown".to_owned());
    let dirty = run::output_of("git", &["status", "--porcelain"]).is_some_and(|s| !s.is_empty());
    let script = RUN_SH
        .replace("@BACKEND@", kind.name())
        .replace(
            "@COMMIT@",
            &format!(
                "{commit}{}",
                if dirty { " (uncommitted changes)" } else { "" }
            ),
        )
        .replace("@GLIBC@", newest_glibc.as_deref().unwrap_or("unknown"))
        .replace(
            "@NVRTC@",
            nvrtc.as_ref().map_or("(none)", |n| n.version.as_str()),
        )
        .replace(
            "@PTX_ISA@",
            nvrtc.as_ref().map_or("(none)", |n| n.ptx_isa.as_str()),
        );
    let run_sh = dir.join("run.sh");
    std::fs::write(&run_sh, script)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&run_sh, std::fs::Permissions::from_mode(0o755))?;
    }

    let total = size_mib(&archive) + size_mib(&run_sh);
    println!(
        "\n{} executables, {total:.1} MiB packed in {DIR}/",
        units.len()
    );
    println!(
        "they need glibc {} or newer on the device machine",
        newest_glibc
            .as_deref()
            .unwrap_or("(unknown: objdump missing)")
    );
    println!("on the GPU machine, with {DIR}/ copied there: bash {DIR}/run.sh");
    match max_mib {
        Some(max) if total > max => {
            println!("the bundle is larger than --max-mib {max}");
            Ok(false)
        }
        _ => Ok(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cubecl_build(backend: BackendKind) -> String {
        builds(backend)
            .iter()
            .map(|b| b.args.join(" "))
            .find(|a| a.contains("scope-cubecl"))
            .unwrap_or_else(|| panic!("no scope-cubecl build for {backend}"))
    }

    #[test]
    fn each_bundle_carries_cubecls_tests_on_its_server_alone() {
        assert!(
            cubecl_build(BackendKind::Cuda).ends_with(
                "--no-default-features --features cuda,runtime-tests --test cubek --test runtime_cuda"
            ),
            "{}",
            cubecl_build(BackendKind::Cuda)
        );
        // HIP's runtime-test binary stays out of its bundle: the cubek tests
        // only.
        assert!(
            cubecl_build(BackendKind::Hip).ends_with("--features hip,runtime-tests --test cubek")
        );
    }

    /// The CUDA bundle builds the version probe (server-cuda's
    /// `cuda_versions` example) and no other bundle does; `run.sh` runs it,
    /// and prints the driver's version, before the first test.
    #[test]
    fn the_cuda_bundle_prints_driver_and_nvrtc_versions_before_any_test() {
        let probes = |backend: BackendKind| {
            builds(backend)
                .iter()
                .filter(|b| b.kind == "probe")
                .map(|b| b.args.join(" "))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            probes(BackendKind::Cuda),
            ["build --profile device -p server-cuda --example cuda_versions"]
        );
        assert!(probes(BackendKind::Hip).is_empty());
        let at = |needle: &str| {
            RUN_SH
                .find(needle)
                .unwrap_or_else(|| panic!("run.sh has no {needle:?}"))
        };
        let first_test = at("for t in $ordered");
        assert!(at(&format!("$work/bin/{CUDA_PROBE}")) < first_test);
        assert!(at("nvidia-smi: ") < first_test);
        assert!(at("\"NVRTC: the bundle's @NVRTC@") < first_test);
        for placeholder in ["@NVRTC@", "@PTX_ISA@", "@BACKEND@", "@GLIBC@"] {
            at(placeholder);
        }
    }
}
