//! `cargo xtask test`: the tests of each backend, and one summary.
//!
//! Every test binary comes from one build, `cargo test --workspace
//! --all-features --no-run` ([`crate::artifacts`] says why one). Each row of
//! the summary runs its packages' tests from it. With nextest that is
//! `cargo nextest run -E 'package(=server-wgpu)'` reusing the build ([`Reuse`]).
//! Without it, the row's test binaries run directly, as `cargo test` would.
//! Counts stay per backend without parsing test names. A row whose package
//! failed to build fails alone, since the build keeps going past a broken crate.
//!
//! A device test with nothing to run on passes after printing
//! `skipped: <reason>`. Runners show every test's output, and [`crate::report`]
//! reads it test by test, so the summary tells "passed" from "skipped". Both
//! differ from a test that did nothing on the device: `not exercised: <reason>`,
//! or `not run: <reason>` for one marked as not holding there. A kit behaviour
//! its suite cannot have on any machine says `not applicable: <reason>`. With
//! `--backend X`, `SCOPE_REQUIRE=X` reaches the tests and a missing device
//! fails them instead.
//!
//! A person reads one line per row, the reasons for its skips, and every
//! failure in full. Everything the runners printed goes to
//! `target/xtask/test.log`; `--verbose` shows it as it runs, too.

use std::io::{LineWriter, Write};
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::artifacts::{self, Built};
use crate::backends::{BackendKind, Choice, ci};
use crate::cubecl;
use crate::report::{self, Counts};
use crate::run;

/// What `test` was asked for.
#[derive(Clone, Debug)]
pub struct Options {
    /// One backend, or every one.
    pub backend: Option<Choice>,
    /// Build with `--release`.
    pub release: bool,
    /// Use `cargo nextest` (when installed).
    pub nextest: bool,
    /// Run the doc tests as a last row.
    pub doctests: bool,
}

/// One group of tests: a row of the summary.
#[derive(Clone, Debug)]
struct Group {
    name: String,
    /// The packages whose tests it runs.
    packages: Vec<String>,
    /// For `--backend X`: of tiny-runtime's `backends` tests, only X's
    /// (`X::…`); its other tests run whole.
    only_backend: Option<String>,
    /// `SCOPE_REQUIRE` for it, if any.
    require: Option<String>,
    /// Why it did not run, when it did not.
    missing: Option<String>,
    /// Which of the packages' test binaries it runs.
    binaries: Binaries,
    /// Environment for its tests (what picks the device).
    env: Vec<(&'static str, &'static str)>,
    /// A device the probe must have found (backend, API prefix), or the row
    /// is skipped for no device.
    needs: Option<(BackendKind, &'static str)>,
}

/// Which test binaries of its packages a group runs.
#[derive(Clone, Debug, Default)]
enum Binaries {
    /// All of them.
    #[default]
    All,
    /// Only this one.
    Only(&'static str),
    /// All but these.
    Except(Vec<&'static str>),
}

impl Binaries {
    fn runs(&self, target: &str) -> bool {
        match self {
            Binaries::All => true,
            Binaries::Only(name) => target == *name,
            Binaries::Except(names) => !names.contains(&target),
        }
    }
}

fn crate_exists(name: &str) -> bool {
    run::root()
        .join("crates")
        .join(name)
        .join("Cargo.toml")
        .is_file()
}

/// The packages of the "core" row.
const CORE: [&str; 3] = ["scope-core", "scope-test", "scope-native"];

fn plain(name: &str) -> Group {
    let binaries = match name {
        "scope-cubecl" => Binaries::Except(cubecl::binaries()),
        _ => Binaries::All,
    };
    Group {
        name: name.to_owned(),
        packages: vec![name.to_owned()],
        only_backend: None,
        require: None,
        missing: None,
        binaries,
        env: Vec::new(),
        needs: None,
    }
}

/// cubecl's runtime tests on `row`'s server.
fn cubecl_group(row: &cubecl::Row, require: bool) -> Group {
    Group {
        name: row.name.to_owned(),
        binaries: Binaries::Only(row.binary),
        env: row.env.to_vec(),
        needs: Some((row.backend, row.api)),
        require: require.then(|| row.backend.name().to_owned()),
        missing: (!crate_exists("scope-cubecl"))
            .then(|| "crate not built yet (crates/scope-cubecl)".to_owned()),
        ..plain("scope-cubecl")
    }
}

fn cubecl_groups(backend: Option<BackendKind>, require: bool) -> impl Iterator<Item = Group> {
    cubecl::ROWS
        .iter()
        .filter(move |row| backend.is_none_or(|b| b == row.backend))
        .map(move |row| cubecl_group(row, require))
}

/// The real compilers of a GPU API on every kernel the project emits, with no
/// device (`crates/server-*/tests/toolchain.rs`). Under CI a missing toolchain
/// fails, since `ci/run.sh` installs it.
fn toolchain_group(backend: BackendKind, env: (&'static str, &'static str)) -> Group {
    let required = std::env::var("CI").is_ok_and(|v| v == "true");
    // Without the toolchain the tests skip, naming the script that installs it;
    // under CI, or when `SCOPE_REQUIRE` names it, they fail instead.
    let installed = run::root().join(env.1).exists();
    Group {
        name: format!("{backend} toolchain"),
        binaries: Binaries::Only("toolchain"),
        env: if installed || required {
            vec![env]
        } else {
            Vec::new()
        },
        require: required.then(|| format!("{backend}-toolchain")),
        ..plain(backend.server_crate())
    }
}

fn backend_group(backend: BackendKind, require: bool) -> Group {
    let server = backend.server_crate();
    let mut packages = Vec::new();
    let missing = (!crate_exists(server)).then(|| format!("crate not built yet (crates/{server})"));
    if missing.is_none() {
        packages.push(server.to_owned());
    }
    let with_runtime = require && crate_exists("tiny-runtime");
    if with_runtime {
        packages.push("tiny-runtime".to_owned());
    }
    Group {
        name: backend.name().to_owned(),
        packages,
        only_backend: with_runtime.then(|| backend.name().to_owned()),
        require: require.then(|| backend.name().to_owned()),
        missing,
        // The toolchain rows run that binary, with their own requirement.
        binaries: match ci(backend).toolchain {
            Some(_) => Binaries::Except(vec!["toolchain"]),
            None => Binaries::All,
        },
        ..plain("")
    }
}

fn groups(backend: Option<Choice>) -> Result<Vec<Group>> {
    // The core is three crates: the failure model, its test kit (the
    // suite on the reference host server), and what CUDA and HIP share.
    let core = Group {
        name: "core".to_owned(),
        packages: CORE.iter().map(|p| (*p).to_owned()).collect(),
        ..plain("scope-core")
    };
    Ok(match backend {
        None | Some(Choice::All) => {
            let mut all = vec![core];
            all.extend(BackendKind::ALL.iter().map(|&b| backend_group(b, false)));
            if crate_exists("tiny-runtime") {
                // Every server linked at once: its per-backend tests run or
                // skip, and its host-server tests always run.
                all.push(plain("tiny-runtime"));
            }
            all.extend(cubecl_groups(None, false));
            all.extend(
                BackendKind::ALL
                    .iter()
                    .filter_map(|&b| Some(toolchain_group(b, ci(b).toolchain?))),
            );
            all.extend(other_crates().iter().map(|name| plain(name)));
            all
        }
        Some(Choice::Core) => vec![core],
        Some(Choice::Host) => return Choice::Host.refused(&["core", "all"]),
        Some(Choice::One(kind)) => {
            let mut one = vec![backend_group(kind, true)];
            one.extend(cubecl_groups(Some(kind), true));
            one
        }
    })
}

/// Refuse an unknown backend before anything is built.
///
/// # Errors
///
/// When `backend` is the host server, which has no row of its own.
pub fn check_backend(backend: Option<Choice>) -> Result<()> {
    groups(backend).map(drop)
}

/// Workspace crates that no row above covers, xtask's own tests included,
/// so that a new crate's tests are never silently left out.
fn other_crates() -> Vec<String> {
    let servers = BackendKind::ALL.iter().map(|b| b.server_crate());
    let known: Vec<&str> = CORE
        .into_iter()
        .chain(servers)
        .chain(["tiny-runtime"])
        .collect();
    let Ok(dirs) = std::fs::read_dir(run::root().join("crates")) else {
        return vec!["xtask".to_owned()];
    };
    let mut names: Vec<String> = dirs
        .flatten()
        .filter(|d| d.path().join("Cargo.toml").is_file())
        .filter_map(|d| d.file_name().into_string().ok())
        .filter(|n| !known.contains(&n.as_str()))
        .collect();
    names.sort();
    names.push("xtask".to_owned());
    names
}

/// Whether `cargo nextest` is installed (and not turned off with
/// `SCOPE_XTASK_RUNNER=cargo-test`, which is how the fallback is tested).
pub fn nextest_installed() -> bool {
    if std::env::var("SCOPE_XTASK_RUNNER").is_ok_and(|r| r == "cargo-test") {
        return false;
    }
    run::cargo()
        .args(["nextest", "--version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The nextest filterset for a group's tests.
fn filterset(group: &Group) -> String {
    let packages = group
        .packages
        .iter()
        .map(|package| match &group.only_backend {
            Some(b) if package == "tiny-runtime" => {
                format!("(package(=tiny-runtime) & (not binary(=backends) | test(/^{b}::/)))")
            }
            _ => format!("package(={package})"),
        })
        .collect::<Vec<_>>()
        .join(" | ");
    match &group.binaries {
        Binaries::All => packages,
        Binaries::Only(name) => format!("({packages}) & binary(={name})"),
        Binaries::Except(names) => names.iter().fold(format!("({packages})"), |f, name| {
            format!("{f} & not binary(={name})")
        }),
    }
}

/// Why `group` cannot run here, if its device is missing.
fn no_device(group: &Group, probed: &[crate::matrix::Row]) -> Option<String> {
    let (backend, api) = group.needs?;
    let found = probed
        .iter()
        .any(|r| r.backend == backend && r.kind.is_some() && r.detail.starts_with(api));
    let what = if api.is_empty() {
        backend.name().to_owned()
    } else {
        format!("{backend} {api}")
    };
    (!found).then(|| format!("skipped: no {what} device"))
}

/// What nextest needs to run tests from an existing build without
/// invoking cargo: `cargo nextest list --list-type binaries-only` and
/// `cargo metadata`, written once, after the build. Every row then runs the
/// very binaries that build made, even if the tree changes meanwhile, and
/// no row pays for cargo's fingerprint checks.
pub struct Reuse {
    dir: std::path::PathBuf,
    binaries: std::path::PathBuf,
    metadata: std::path::PathBuf,
}

impl Drop for Reuse {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Write nextest's reuse files for the build `build` made (cargo finds it
/// fresh). `None`, after saying why, when that fails: the rows then run
/// the build's binaries directly.
pub fn reuse(release: bool) -> Option<Reuse> {
    let dir = std::env::temp_dir().join(format!("scope-xtask-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let reuse = Reuse {
        binaries: dir.join("binaries-metadata.json"),
        metadata: dir.join("cargo-metadata.json"),
        dir,
    };
    let mut list = run::cargo();
    list.args(["nextest", "list", "--list-type", "binaries-only"])
        .args(["--message-format", "json"])
        .args(artifacts::SELECT);
    if release {
        list.arg("--release");
    }
    let mut metadata = run::cargo();
    metadata.args(["metadata", "--format-version", "1"]);
    for (command, to) in [(list, &reuse.binaries), (metadata, &reuse.metadata)] {
        if let Err(why) = write_stdout(command, to) {
            println!(
                "==> nextest cannot reuse the build ({why:#}); running the test binaries directly"
            );
            return None;
        }
    }
    Some(reuse)
}

fn write_stdout(mut command: Command, to: &std::path::Path) -> Result<()> {
    let shown = run::show(&command);
    let out = command
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("starting {shown}"))?;
    anyhow::ensure!(out.status.success(), "{shown} failed");
    std::fs::write(to, out.stdout).with_context(|| format!("writing {}", to.display()))
}

/// `cargo nextest run` over the shared build, for one group.
fn nextest(reuse: &Reuse, group: &Group) -> Command {
    let mut cmd = run::cargo();
    cmd.args(["nextest", "run", "--no-fail-fast", "--no-tests=pass"])
        .arg("--binaries-metadata")
        .arg(&reuse.binaries)
        .arg("--cargo-metadata")
        .arg(&reuse.metadata)
        .args([
            "--success-output",
            "immediate",
            "--failure-output",
            "immediate",
        ]);
    cmd.args(["-E", &filterset(group)]);
    cmd
}

/// The build every row runs from.
///
/// # Errors
///
/// When cargo cannot be started.
pub fn build(release: bool) -> Result<Built> {
    artifacts::build(
        "every test binary of the workspace (and the demo binary, which probes devices)",
        &["test", "--no-run", "--no-fail-fast"],
        release,
    )
}

/// Where a test run's output goes: a line per row and the failures on the
/// terminal, everything in the log (and on the terminal too, verbose).
pub struct Output {
    verbose: bool,
    log: Option<LineWriter<std::fs::File>>,
    path: PathBuf,
}

/// The log's place: `target/xtask/<name>` (under `CARGO_TARGET_DIR` when
/// set).
fn log_path(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|t| {
            if t.is_absolute() {
                t
            } else {
                run::root().join(t)
            }
        })
        .unwrap_or_else(|| run::root().join("target"));
    target.join("xtask").join(name)
}

impl Output {
    /// Start `target/xtask/test.log` afresh. Without a log to write, the
    /// output is shown whole rather than lost.
    pub fn new(verbose: bool) -> Self {
        let path = log_path("test.log");
        let log = path
            .parent()
            .map(std::fs::create_dir_all)
            .transpose()
            .and_then(|_| std::fs::File::create(&path))
            .map(LineWriter::new);
        match log {
            Ok(log) => Self {
                verbose,
                log: Some(log),
                path,
            },
            Err(e) => {
                println!(
                    "==> cannot write {} ({e}): showing every test's output instead",
                    path.display()
                );
                Self {
                    verbose: true,
                    log: None,
                    path,
                }
            }
        }
    }

    /// The log, as a person would type its path.
    pub fn log_shown(&self) -> Option<String> {
        self.log.as_ref()?;
        let shown = self
            .path
            .strip_prefix(run::root())
            .unwrap_or(&self.path)
            .display()
            .to_string();
        Some(shown)
    }

    fn log(&mut self, text: &str) {
        if let Some(log) = self.log.as_mut() {
            let _ = writeln!(log, "{text}");
        }
    }

    fn capture(&mut self, command: Command) -> Result<run::Captured> {
        let log = self.log.as_mut().map(|l| l as &mut dyn Write);
        run::capture_with(command, self.verbose, log)
    }

    fn start_row(&mut self, at: usize, total: usize, width: usize, name: &str) {
        let head = format!(
            "[{at:>w$}/{total}] {name:<width$} ",
            w = total.to_string().len()
        );
        self.log(&format!("\n==> {}", head.trim_end()));
        if self.verbose {
            println!("\n==> {head}");
        } else {
            print!("{head}");
            let _ = std::io::stdout().flush();
        }
    }

    fn end_row(&mut self, counts: &Counts, at: usize, total: usize) {
        let outcome = counts.outcome();
        self.log(&format!("==> [{at}/{total}] {}: {outcome}", counts.name));
        for detail in counts.details() {
            self.log(&format!("    {detail}"));
        }
        if self.verbose {
            println!("==> [{at}/{total}] {}: {outcome}", counts.name);
        } else {
            println!("{outcome}");
        }
        let indent = " ".repeat(total.to_string().len() * 2 + 4);
        for detail in counts.details() {
            println!("{indent}{detail}");
        }
        if !self.verbose {
            // The failures in full: the verbose stream has shown them.
            for failure in &counts.failures {
                println!("\n---- FAILED: {} ----", failure.name);
                for line in &failure.lines {
                    println!("{line}");
                }
                println!("---- end of {} ----\n", failure.name);
            }
        }
    }
}

/// Run the chosen groups from `built` and return a row for each, with a
/// line for each as it ends.
///
/// # Errors
///
/// When a runner cannot be started, or the backend is unknown.
pub fn run(options: &Options, built: &Built, out: &mut Output) -> Result<Vec<Counts>> {
    let reuse = (options.nextest && built.ok)
        .then(|| reuse(options.release))
        .flatten();
    let groups = groups(options.backend)?;
    let probed = if groups.iter().any(|g| g.needs.is_some()) {
        crate::matrix::probe_all(built.demo_binary())
    } else {
        Vec::new()
    };
    let total = groups.len() + usize::from(options.doctests);
    let width = groups
        .iter()
        .map(|g| g.name.len())
        .chain(options.doctests.then_some("doctests".len()))
        .max()
        .unwrap_or(0);
    if !out.verbose
        && let Some(log) = out.log_shown()
    {
        println!("\n==> running {total} rows; every test's output goes to {log}");
    }
    let mut rows = Vec::new();
    for (i, group) in groups.iter().enumerate() {
        out.start_row(i + 1, total, width, &group.name);
        let start = Instant::now();
        let mut counts = run_group(group, built, reuse.as_ref(), &probed, out)?;
        counts.secs = start.elapsed().as_secs_f64();
        out.end_row(&counts, i + 1, total);
        rows.push(counts);
    }
    if options.doctests {
        out.start_row(total, total, width, "doctests");
        let start = Instant::now();
        let mut counts = doctests(options.release, out)?;
        counts.secs = start.elapsed().as_secs_f64();
        out.end_row(&counts, total, total);
        rows.push(counts);
    }
    Ok(rows)
}

/// One row: its runner invocations, counted.
fn run_group(
    group: &Group,
    built: &Built,
    reuse: Option<&Reuse>,
    probed: &[crate::matrix::Row],
    out: &mut Output,
) -> Result<Counts> {
    let mut counts = Counts::new(&group.name);
    if let Some(missing) = &group.missing {
        counts.note = missing.clone();
        if group.require.is_some() {
            counts.failed += 1;
        }
    }
    // With `SCOPE_REQUIRE` set, the row's tests decide whether a missing device
    // fails them, so the row runs instead of being skipped here.
    let tests_decide = std::env::var_os("SCOPE_REQUIRE").is_some_and(|v| !v.is_empty());
    if group.missing.is_none()
        && !tests_decide
        && let Some(why) = no_device(group, probed)
    {
        if let Some(require) = &group.require {
            counts.failed += 1;
            let why = why.trim_start_matches("skipped: ");
            counts.note = format!("{why}, and --backend {require} requires one");
        } else {
            counts.skipped += 1;
            counts.note = why;
        }
        return Ok(counts);
    }
    let unbuilt: Vec<&str> = group
        .packages
        .iter()
        .filter(|p| !built.has_tests(p))
        .map(String::as_str)
        .collect();
    if group.packages.is_empty() {
        // Nothing of it exists yet; `missing` says so.
    } else if !unbuilt.is_empty() {
        // Its tests did not build: nothing of it can run.
        counts.failed += 1;
        counts.note = format!(
            "{} did not build (see the build output above)",
            unbuilt.join(", ")
        );
    } else if let Some(reuse) = reuse {
        let mut cmd = nextest(reuse, group);
        if let Some(require) = &group.require {
            cmd.env("SCOPE_REQUIRE", require);
        }
        cmd.envs(group.env.iter().copied());
        let what = run::show(&cmd);
        let captured = out.capture(cmd)?;
        counts.add(&what, captured.success, &captured.lines, true);
        note_ptx_isa(&mut counts, &captured.lines);
    } else {
        // No nextest, or a build broken elsewhere (nextest needs all of it): run the
        // row's binaries as `cargo test` does, each test's output shown on its own.
        for artifact in built
            .artifacts
            .iter()
            .filter(|a| a.test && !a.bench && group.packages.contains(&a.package))
            .filter(|a| group.binaries.runs(&a.target))
        {
            let mut cmd = artifacts::command(artifact);
            cmd.arg("--show-output");
            cmd.envs(group.env.iter().copied());
            if let Some(b) = &group.only_backend
                && artifact.package == "tiny-runtime"
                && artifact.target == "backends"
            {
                cmd.arg(format!("{b}::"));
            }
            if let Some(require) = &group.require {
                cmd.env("SCOPE_REQUIRE", require);
            }
            let what = run::show(&cmd);
            let captured = out.capture(cmd)?;
            counts.add(&what, captured.success, &captured.lines, false);
            note_ptx_isa(&mut counts, &captured.lines);
        }
    }
    Ok(counts)
}

/// The PTX ISA versions a toolchain row's NVRTC wrote, as its groups print them
/// (`…: PTX ISA written: 8.2 (NVRTC 12.2, …)`). They go in the row's note, to say
/// which drivers can load what it compiled; a note the row has already stays.
fn note_ptx_isa(counts: &mut Counts, lines: &[String]) {
    if let Some(isa) = ptx_isa_written(lines)
        && counts.note.is_empty()
    {
        counts.note = isa;
    }
}

/// `PTX ISA written: 8.2 (NVRTC 12.2, …)` from the first line of `lines`
/// that says it, and every distinct ISA any line names.
fn ptx_isa_written(lines: &[String]) -> Option<String> {
    const SAID: &str = "PTX ISA written: ";
    let mut first: Option<&str> = None;
    let mut isas: Vec<&str> = Vec::new();
    for line in lines {
        let Some(at) = line.find(SAID) else {
            continue;
        };
        let rest = &line[at + SAID.len()..];
        if rest.starts_with("none") {
            // A group whose every compile was refused (on purpose) wrote nothing.
            continue;
        }
        first.get_or_insert(rest);
        for isa in rest.split(" (").next().unwrap_or("").split(", ") {
            if !isa.is_empty() && !isas.contains(&isa) {
                isas.push(isa);
            }
        }
    }
    let first = first?;
    let why = first.split_once(" (").map_or("", |(_, why)| why);
    Some(format!("PTX ISA written: {} ({why}", isas.join(", ")))
}

/// Doc tests, which neither nextest nor the test binaries run.
///
/// # Errors
///
/// When cargo cannot be started.
fn doctests(release: bool, out: &mut Output) -> Result<Counts> {
    let mut cmd = run::cargo();
    cmd.args(["test", "--doc"]).args(artifacts::SELECT);
    if release {
        cmd.arg("--release");
    }
    cmd.args(["--", "--show-output"]);
    let what = run::show(&cmd);
    let captured = out.capture(cmd)?;
    let mut counts = Counts::new("doctests");
    counts.add(&what, captured.success, &captured.lines, false);
    Ok(counts)
}

/// The summary table with the build's time and each row's, and the runners'
/// closing lines in the log. Also whether everything passed, the build included:
/// a broken example fails no row, but fails this.
pub fn summary(rows: &[Counts], built: &Built, out: &mut Output) -> (String, bool) {
    out.log(
        "\nrunner closing lines (a nextest \"skipped\" there is a test outside the row's filter):",
    );
    for row in rows {
        for line in &row.closing {
            out.log(&format!("  [{}] {line}", row.name));
        }
    }
    let log = out.log_shown();
    let build_note = if built.ok {
        "compiling the test binaries"
    } else {
        "FAILED: see the build output above (what did build has run)"
    };
    let (mut text, ok) =
        report::summary(rows, &[("build", built.secs, build_note)], log.as_deref());
    if !built.ok {
        text.push_str("the build failed\n");
    }
    out.log(&text);
    (text, ok && built.ok)
}

#[cfg(test)]
mod checks {
    use super::*;

    #[test]
    fn the_toolchain_rows_note_is_the_ptx_isa_its_nvrtc_wrote() {
        let lines: Vec<String> = [
            "the check: PTX ISA written: none (every compile was refused) (NVRTC 12.2, which every driver from CUDA 12.2 on JITs)",
            "    ok  #[cube] kernels: PTX ISA written: 8.2 (NVRTC 12.2, which every driver from CUDA 12.2 on JITs)",
            "cubecl: PTX ISA written: 8.2 (NVRTC 12.2, which every driver from CUDA 12.2 on JITs)",
            "test cube_kernels ... ok",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(
            ptx_isa_written(&lines).as_deref(),
            Some("PTX ISA written: 8.2 (NVRTC 12.2, which every driver from CUDA 12.2 on JITs)")
        );
        let mixed = vec![
            "a: PTX ISA written: 8.2 (NVRTC 12.2, x)".to_owned(),
            "b: PTX ISA written: 8.2, 9.0 (NVRTC 12.2, x)".to_owned(),
        ];
        assert_eq!(
            ptx_isa_written(&mixed).as_deref(),
            Some("PTX ISA written: 8.2, 9.0 (NVRTC 12.2, x)")
        );
        assert_eq!(ptx_isa_written(&lines[3..]), None);
    }

    #[test]
    fn a_backend_row_runs_its_server_and_only_its_runtime_tests() {
        let group = backend_group(BackendKind::Wgpu, true);
        assert_eq!(
            filterset(&group),
            "package(=server-wgpu) | (package(=tiny-runtime) & (not binary(=backends) | test(/^wgpu::/)))"
        );
        // The CUDA row leaves its toolchain binary to the toolchain row.
        assert_eq!(
            filterset(&backend_group(BackendKind::Cuda, false)),
            "(package(=server-cuda)) & not binary(=toolchain)"
        );
    }

    #[test]
    fn cubecl_rows_run_one_binary_each_whole() {
        // A test that does not hold on a device is marked in the binary,
        // which says `not run: <reason>`: the row filters out nothing.
        let gl = cubecl_group(&cubecl::ROWS[1], false);
        assert_eq!(
            filterset(&gl),
            "(package(=scope-cubecl)) & binary(=runtime_wgpu)"
        );
        assert_eq!(
            filterset(&plain("scope-cubecl")),
            "(package(=scope-cubecl)) & not binary(=runtime_wgpu) & not binary(=runtime_vulkan) \
             & not binary(=runtime_cuda) & not binary(=runtime_hip) & not binary(=collectives)"
        );
        let probed = |detail: &str| crate::matrix::Row {
            backend: BackendKind::Wgpu,
            device: "llvmpipe".to_owned(),
            kind: Some(crate::matrix::Kind::Software),
            detail: detail.to_owned(),
            why_not: String::new(),
            probed: true,
        };
        assert_eq!(no_device(&gl, &[probed("gl, Cpu")]), None);
        assert_eq!(
            no_device(&gl, &[probed("vulkan, Cpu")]).as_deref(),
            Some("skipped: no wgpu gl device")
        );
        let names = |groups: &[Group]| groups.iter().map(|g| g.name.clone()).collect::<Vec<_>>();
        let one = |kind| groups(Some(Choice::One(kind))).unwrap();
        let with_vulkan = one(BackendKind::Vulkan);
        assert_eq!(
            names(&with_vulkan),
            [BackendKind::Vulkan.name(), "cubecl on vulkan"]
        );
        let with_cuda = one(BackendKind::Cuda);
        assert_eq!(
            names(&with_cuda),
            [BackendKind::Cuda.name(), "cubecl on cuda"]
        );
        assert_eq!(
            no_device(&with_cuda[1], &[]).as_deref(),
            Some("skipped: no cuda device")
        );
        let with_hip = one(BackendKind::Hip);
        assert_eq!(names(&with_hip), [BackendKind::Hip.name(), "cubecl on hip"]);
        assert_eq!(
            no_device(&with_hip[1], &[]).as_deref(),
            Some("skipped: no hip device")
        );
    }
}
