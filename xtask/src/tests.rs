//! `cargo xtask test`: the tests of each backend, and one summary.
//!
//! Each backend's tests run as their own cargo invocation, so the counts
//! are per backend without parsing test names, and one backend that fails
//! to build does not hide the others' results. A device test with no device
//! passes after printing `skipped: no <backend> device (...)`; the runner
//! counts those lines (tests run with their output shown) so the summary
//! can tell "passed" from "passed because there was nothing to run on". With
//! `--backend X`, `SCOPE_REQUIRE=X` reaches the tests and a missing device
//! fails them instead.

use std::process::Command;

use anyhow::Result;

use crate::run::{self, Captured};

/// What `test` was asked for.
#[derive(Clone, Debug)]
pub struct Options {
    /// One backend, or every one.
    pub backend: Option<String>,
    /// Build with `--release`.
    pub release: bool,
    /// Use `cargo nextest` (when installed).
    pub nextest: bool,
}

/// One group of tests: a row of the summary.
#[derive(Clone, Debug)]
struct Group {
    name: String,
    /// Cargo invocations: package and feature arguments.
    runs: Vec<(String, Vec<String>)>,
    /// `SCOPE_REQUIRE` for it, if any.
    require: Option<String>,
    /// Why it did not run, when it did not.
    missing: Option<String>,
}

/// The counts of one row.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    /// The row.
    pub name: String,
    /// Tests that ran on a device (or needed none) and passed.
    pub passed: u64,
    /// Tests that failed, or 1 for a run that failed without a count (a
    /// build error).
    pub failed: u64,
    /// Tests that passed after printing `skipped: no <backend> device`.
    pub skipped: u64,
    /// Why the row did not run, or a note.
    pub note: String,
    /// The runner's closing lines, verbatim.
    pub closing: Vec<String>,
}

fn crate_exists(name: &str) -> bool {
    run::root()
        .join("crates")
        .join(name)
        .join("Cargo.toml")
        .is_file()
}

fn backend_group(backend: &str, require: bool) -> Group {
    let server = format!("server-{backend}");
    let mut runs = Vec::new();
    let missing =
        (!crate_exists(&server)).then(|| format!("crate not built yet (crates/{server})"));
    if missing.is_none() {
        runs.push((server, Vec::new()));
    }
    if require && crate_exists("tiny-runtime") {
        runs.push((
            "tiny-runtime".to_owned(),
            vec![
                "--no-default-features".to_owned(),
                "--features".to_owned(),
                backend.to_owned(),
            ],
        ));
    }
    Group {
        name: backend.to_owned(),
        runs,
        require: require.then(|| backend.to_owned()),
        missing,
    }
}

fn groups(backend: Option<&str>) -> Result<Vec<Group>> {
    let core = Group {
        name: "core".to_owned(),
        runs: vec![("scope-core".to_owned(), vec!["--all-features".to_owned()])],
        require: None,
        missing: None,
    };
    Ok(match backend {
        None | Some("all") => {
            let mut all = vec![core];
            all.extend(
                crate::matrix::BACKENDS
                    .iter()
                    .map(|b| backend_group(b, false)),
            );
            if crate_exists("tiny-runtime") {
                // Every server linked at once: its per-backend tests run or
                // skip, and its host-server tests always run.
                all.push(Group {
                    name: "tiny-runtime".to_owned(),
                    runs: vec![("tiny-runtime".to_owned(), vec!["--all-features".to_owned()])],
                    require: None,
                    missing: None,
                });
            }
            all.extend(other_crates().into_iter().map(|name| Group {
                name: name.clone(),
                runs: vec![(name, vec!["--all-features".to_owned()])],
                require: None,
                missing: None,
            }));
            all
        }
        Some("core") => vec![core],
        Some(b) if crate::matrix::BACKENDS.contains(&b) => vec![backend_group(b, true)],
        Some(other) => {
            anyhow::bail!("unknown backend `{other}`: cuda, hip, vulkan, wgpu, core or all")
        }
    })
}

/// Workspace crates that no row above covers, so that a new crate's tests
/// are never silently left out.
fn other_crates() -> Vec<String> {
    let known = [
        "scope-core",
        "server-cuda",
        "server-hip",
        "server-vulkan",
        "server-wgpu",
        "tiny-runtime",
    ];
    let Ok(dirs) = std::fs::read_dir(run::root().join("crates")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = dirs
        .flatten()
        .filter(|d| d.path().join("Cargo.toml").is_file())
        .filter_map(|d| d.file_name().into_string().ok())
        .filter(|n| !known.contains(&n.as_str()))
        .collect();
    names.sort();
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

fn command(
    options: &Options,
    package: &str,
    features: &[String],
    require: Option<&str>,
) -> Command {
    let mut cmd = run::cargo();
    if options.nextest {
        cmd.args(["nextest", "run", "--no-fail-fast", "--no-tests=pass"]);
        cmd.args([
            "--success-output",
            "immediate",
            "--failure-output",
            "immediate",
        ]);
    } else {
        cmd.args(["test", "--no-fail-fast"]);
    }
    cmd.args(["-p", package]).args(features);
    if options.release {
        cmd.arg("--release");
    }
    if !options.nextest {
        cmd.args(["--", "--nocapture"]);
    }
    if let Some(require) = require {
        cmd.env("SCOPE_REQUIRE", require);
    }
    cmd
}

/// The number before `word` in `text` ("12 passed" → 12).
fn number_before(text: &str, word: &str) -> Option<u64> {
    let at = text.find(word)?;
    text[..at]
        .split(|c: char| !c.is_ascii_digit())
        .rev()
        .find(|s| !s.is_empty())?
        .parse()
        .ok()
}

/// Add what one invocation printed to `counts`.
fn tally(counts: &mut Counts, captured: &Captured, nextest: bool) {
    let mut passed = 0;
    let mut failed = 0;
    let mut found = false;
    for line in &captured.lines {
        let trimmed = line.trim();
        if trimmed.contains("skipped: no ") && trimmed.contains(" device") {
            counts.skipped += 1;
        }
        if nextest {
            // "Summary [  1.2s] 40 tests run: 39 passed, 1 failed, 2 skipped"
            if trimmed.starts_with("Summary") && trimmed.contains("run:") {
                let tail = &trimmed[trimmed.find("run:").unwrap_or(0)..];
                passed += number_before(tail, " passed").unwrap_or(0);
                failed += number_before(tail, " failed").unwrap_or(0)
                    + number_before(tail, " timed out").unwrap_or(0);
                found = true;
                counts.closing.push(trimmed.to_owned());
            }
        } else if let Some(rest) = trimmed.strip_prefix("test result:") {
            // "test result: ok. 5 passed; 0 failed; 1 ignored; ..."
            passed += number_before(rest, " passed").unwrap_or(0);
            failed += number_before(rest, " failed").unwrap_or(0);
            found = true;
            counts.closing.push(trimmed.to_owned());
        }
    }
    if !captured.success && (!found || failed == 0) {
        // A build error, or a runner that died before its summary.
        failed += 1;
        counts.note = "cargo failed (see its output above)".to_owned();
    }
    counts.passed += passed;
    counts.failed += failed;
}

/// Run the chosen groups and return a row for each.
///
/// # Errors
///
/// When cargo cannot be started, or the backend is unknown.
pub fn run(options: &Options) -> Result<Vec<Counts>> {
    let mut rows = Vec::new();
    for group in groups(options.backend.as_deref())? {
        let mut counts = Counts {
            name: group.name.clone(),
            ..Counts::default()
        };
        if let Some(missing) = &group.missing {
            println!("==> {}: {missing}", group.name);
            counts.note = missing.clone();
            if group.require.is_some() {
                counts.failed += 1;
            }
        }
        for (package, features) in &group.runs {
            let captured = run::capture(command(
                options,
                package,
                features,
                group.require.as_deref(),
            ))?;
            tally(&mut counts, &captured, options.nextest);
        }
        // A test that skipped also passed; count it once, as a skip.
        counts.passed = counts.passed.saturating_sub(counts.skipped);
        rows.push(counts);
    }
    Ok(rows)
}

/// Doc tests, which nextest does not run.
///
/// # Errors
///
/// When cargo cannot be started.
pub fn doctests(release: bool) -> Result<Counts> {
    let mut cmd = run::cargo();
    cmd.args(["test", "--workspace", "--all-features", "--doc"]);
    if release {
        cmd.arg("--release");
    }
    let captured = run::capture(cmd)?;
    let mut counts = Counts {
        name: "doctests".to_owned(),
        ..Counts::default()
    };
    tally(&mut counts, &captured, false);
    Ok(counts)
}

/// The summary table, the runners' closing lines, and the plain total.
pub fn summary(rows: &[Counts]) -> (String, bool) {
    let mut out = String::new();
    out.push_str("\ntest summary\n");
    out.push_str(&format!(
        "{:<14} {:>7} {:>7} {:>8}  {}\n",
        "backend", "passed", "failed", "skipped", "note"
    ));
    out.push_str(&format!(
        "{:-<14} {:->7} {:->7} {:->8}  {:-<4}\n",
        "", "", "", "", ""
    ));
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for row in rows {
        out.push_str(&format!(
            "{:<14} {:>7} {:>7} {:>8}  {}\n",
            row.name, row.passed, row.failed, row.skipped, row.note
        ));
        passed += row.passed;
        failed += row.failed;
        skipped += row.skipped;
    }
    out.push_str(
        "(skipped: passed after printing `skipped: no <backend> device`; not counted as passed)\n",
    );
    out.push_str("\nrunner closing lines:\n");
    for row in rows {
        for line in &row.closing {
            out.push_str(&format!("  [{}] {line}\n", row.name));
        }
    }
    out.push_str(&format!(
        "\n{passed} passed, {failed} failed, {skipped} skipped\n"
    ));
    (out, failed == 0)
}
