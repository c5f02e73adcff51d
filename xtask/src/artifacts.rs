//! The one build that `demo`, `matrix`, `test` and `bench` share.
//!
//! Nearly all of a cold build is the servers' dependencies (wgpu, naga, ash,
//! cudarc, cubecl). Cargo keys what it compiles by profile and by each crate's
//! features, which depend on the packages a command selects. `-p server-wgpu`,
//! `-p server-vulkan` and `-p tiny-runtime --all-features` each give naga
//! other features, so each compiles naga, and all above it, again. So every
//! build here selects `--workspace --all-features`, in the dev profile
//! (`--release` and `bench` use their own). Each command takes what it needs:
//!
//! - `demo` and `matrix`: `cargo build --workspace --all-features --bin
//!   tiny-runtime`, the demo binary, which also answers `--probe`;
//! - `test`: `cargo test --workspace --all-features --no-run`, which builds
//!   that binary and every test binary; each summary row runs from it;
//! - `bench`: `cargo bench --workspace --all-features --no-run`, then each
//!   bench binary. `bench --backend X` builds only X's package, so one
//!   backend's benches wait for no other server's optimised build.
//!
//! Whichever runs first pays for the dependencies; the next compiles only the
//! units it adds. xtask itself links no server, so `cargo xtask` starts in
//! seconds and says what it will build before the long part.
//!
//! Cargo's JSON messages name every executable with its package and target,
//! which is how the rows and benches find theirs. Diagnostics and progress go
//! to stderr as usual.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result};

use crate::run;

/// The selection every build here uses, so that they share artifacts.
pub const SELECT: [&str; 2] = ["--workspace", "--all-features"];

/// What a cold build costs, for the line printed before one. On a 2-core
/// machine with the crates downloaded, the demo's build took 9.0 minutes from
/// an empty target folder, and the test binaries 2.3 more.
pub const COLD: &str = "about 9 minutes on a 2-core machine once the crates are downloaded (downloading them adds more)";

/// One executable cargo built.
#[derive(Clone, Debug)]
pub struct Artifact {
    /// Its package.
    pub package: String,
    /// Its target's name (`backends` for `tests/backends.rs`).
    pub target: String,
    /// Whether it is a test harness (unit or integration tests, or a bench
    /// built by `cargo test`), rather than a plain binary.
    pub test: bool,
    /// Whether its target is a bench.
    pub bench: bool,
    /// The executable.
    pub path: PathBuf,
    /// Its package's folder: tests and benches run from there, as under
    /// `cargo test`.
    pub package_dir: PathBuf,
}

/// What one build made.
#[derive(Debug, Default)]
pub struct Built {
    /// Whether cargo succeeded.
    pub ok: bool,
    /// The executables it made, or found fresh.
    pub artifacts: Vec<Artifact>,
    /// How long it took.
    pub secs: f64,
}

impl Built {
    /// The demo binary, which also answers `--probe`.
    pub fn demo_binary(&self) -> Option<&Path> {
        self.artifacts
            .iter()
            .find(|a| a.package == "tiny-runtime" && a.target == "tiny-runtime" && !a.test)
            .map(|a| a.path.as_path())
    }

    /// Whether `package` has at least one test executable: every package
    /// here has a lib or bin target with tests, so one without any did not
    /// build.
    pub fn has_tests(&self, package: &str) -> bool {
        self.artifacts
            .iter()
            .any(|a| a.package == package && a.test)
    }
}

/// Print what is about to be built and what a cold build costs, then run
/// `cargo <args> --workspace --all-features` with its progress on the
/// terminal, and collect the executables.
///
/// # Errors
///
/// When cargo cannot be started.
pub fn build(what: &str, args: &[&str], release: bool) -> Result<Built> {
    build_selected(what, args, &SELECT, release)
}

/// [`build`], with another selection than [`SELECT`].
///
/// # Errors
///
/// When cargo cannot be started.
pub fn build_selected(what: &str, args: &[&str], select: &[&str], release: bool) -> Result<Built> {
    let mut command = run::cargo();
    command.args(args).args(select);
    if release {
        command.arg("--release");
    }
    command
        .arg("--message-format=json-render-diagnostics")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // Progress goes to stderr, beside cargo's, so that stdout stays the
    // command's answer (`matrix --json`).
    eprintln!("==> building {what}");
    eprintln!(
        "    {} ({}): a cold build takes {COLD}; an up-to-date one, seconds",
        run::show(&command).replace(" --message-format=json-render-diagnostics", ""),
        profile(args, release),
    );
    let start = Instant::now();
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {}", run::show(&command)))?;
    let mut artifacts = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if let Some(artifact) = parse(&line) {
                artifacts.push(artifact);
            }
        }
    }
    let status = child.wait().context("waiting for cargo")?;
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "==> build {} in {secs:.0} s",
        if status.success() { "done" } else { "FAILED" },
    );
    Ok(Built {
        ok: status.success(),
        artifacts,
        secs,
    })
}

/// The profile cargo builds with for `cargo <args>`: `bench` builds the
/// bench profile (optimised, as release), whatever `--release` says;
/// `build` and `test` build dev (`test` is dev's) unless `--release`.
fn profile(args: &[&str], release: bool) -> &'static str {
    match args.first() {
        Some(&"bench") => "bench profile",
        _ if release => "release profile",
        _ => "dev profile",
    }
}

/// The demo binary, built as `demo` and `matrix` need it.
///
/// # Errors
///
/// When cargo cannot be started.
pub fn demo_binary(release: bool) -> Result<Option<PathBuf>> {
    let built = build(
        "tiny-runtime (the demo, and the device probes behind `matrix`)",
        &["build", "--bin", "tiny-runtime"],
        release,
    )?;
    Ok(built.demo_binary().map(Path::to_path_buf))
}

/// One `compiler-artifact` message, when it names an executable.
fn parse(line: &str) -> Option<Artifact> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    if message["reason"] != "compiler-artifact" {
        return None;
    }
    let path = message["executable"].as_str()?;
    let manifest = message["manifest_path"].as_str()?;
    let kinds = message["target"]["kind"].as_array()?;
    let has_kind = |kind: &str| kinds.iter().any(|k| k == kind);
    Some(Artifact {
        package: package_name(message["package_id"].as_str()?)?,
        target: message["target"]["name"].as_str()?.to_owned(),
        test: message["profile"]["test"].as_bool() == Some(true),
        bench: has_kind("bench"),
        path: PathBuf::from(path),
        package_dir: Path::new(manifest).parent()?.to_path_buf(),
    })
}

/// The package name in a cargo package id: `path+file:///…/crates/server-cuda#0.1.0`
/// (a path package), or `…#name@0.1.0` when the folder and the name differ.
fn package_name(id: &str) -> Option<String> {
    let (head, tail) = id.rsplit_once('#')?;
    Some(match tail.split_once('@') {
        Some((name, _)) => name.to_owned(),
        None => head.rsplit('/').next()?.to_owned(),
    })
}

/// Run an executable from a build as cargo would: from its package's
/// folder, with the variables cargo sets for tests and benches.
pub fn command(artifact: &Artifact) -> Command {
    let mut command = run::program(&artifact.path);
    command
        .current_dir(&artifact.package_dir)
        .env("CARGO_MANIFEST_DIR", &artifact.package_dir)
        .env("CARGO_PKG_NAME", &artifact.package);
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_line_names_the_profile_cargo_uses() {
        assert_eq!(profile(&["bench", "--no-run"], false), "bench profile");
        assert_eq!(profile(&["test", "--no-run"], false), "dev profile");
        assert_eq!(profile(&["test", "--no-run"], true), "release profile");
        assert_eq!(
            profile(&["build", "--bin", "tiny-runtime"], false),
            "dev profile"
        );
    }

    #[test]
    fn package_names_come_from_either_id_form() {
        assert_eq!(
            package_name("path+file:///w/crates/server-cuda#0.1.0").as_deref(),
            Some("server-cuda")
        );
        assert_eq!(
            package_name("path+file:///w/xtask-dir#xtask@0.1.0").as_deref(),
            Some("xtask")
        );
    }

    #[test]
    fn an_executable_artifact_is_parsed() {
        let line = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/tiny-runtime#0.1.0","manifest_path":"/w/crates/tiny-runtime/Cargo.toml","target":{"kind":["test"],"name":"backends"},"profile":{"test":true},"executable":"/w/target/debug/deps/backends-1"}"#;
        let a = parse(line).expect("an executable");
        assert_eq!(a.package, "tiny-runtime");
        assert_eq!(a.target, "backends");
        assert!(a.test && !a.bench);
        assert_eq!(a.package_dir, Path::new("/w/crates/tiny-runtime"));
        let lib = line.replace(
            r#""executable":"/w/target/debug/deps/backends-1""#,
            r#""executable":null"#,
        );
        assert!(parse(&lib).is_none());
    }
}
