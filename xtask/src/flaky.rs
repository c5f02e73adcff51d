//! `cargo xtask flaky`: the tests that race, run many times under load.
//!
//! A test that spawns processes, waits on a deadline or races threads can
//! pass alone and fail when the machine is busy. A peer process starts late,
//! a watchdog polls after the fault surfaced elsewhere, a counter sees another
//! test's work. CI runs each once on two cores, so a test that fails one run
//! in a hundred fails a submission in a few dozen. Here each such binary runs
//! `--runs` times, `--jobs` copies at once (the machine's cores by default).
//! Beside them a busy loop keeps one more core's worth of work waiting, as on
//! a 2-core CI machine that builds and tests. A run past `--timeout` is killed
//! and counts as a hang.
//!
//! The binaries are named in [`RACING`], each with what makes it race. A unit
//! test below checks that every test file that makes groups, spawns processes
//! or threads, or waits on a deadline is there or in [`CALM`] with the reason
//! it does not race. So the list cannot fall behind the tests.

use std::io::Read;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::artifacts::{self, Artifact};

/// A test binary that races: package, target (`lib` for the unit tests),
/// and what it races on.
pub struct Racing {
    pub package: &'static str,
    pub target: &'static str,
    pub why: &'static str,
}

const fn racing(package: &'static str, target: &'static str, why: &'static str) -> Racing {
    Racing {
        package,
        target,
        why,
    }
}

/// Every binary whose tests spawn processes, wait on deadlines or race
/// threads.
pub const RACING: &[Racing] = &[
    racing(
        "scope-core",
        "lib",
        "the watchdog, meetings and ballots: threads and deadlines",
    ),
    racing("scope-core", "waits", "bounded waits against the clock"),
    racing(
        "scope-launch",
        "launch",
        "the launcher and its workers as processes: exits, lapsed leases, a launcher killed",
    ),
    racing(
        "scope-test",
        "conformance",
        "the kit's collectives, membership and survival on the reference server: a thread a rank, deadlines",
    ),
    racing(
        "scope-test",
        "joined",
        "ranks joined alone: ballots with deadlines",
    ),
    racing(
        "server-cuda",
        "mock",
        "the suite over the mock driver and NCCL: ranks on threads, deadlines",
    ),
    racing(
        "server-cuda",
        "mock_launched",
        "four launched worker processes on the mock NCCL; one killed, admitted back and healed",
    ),
    racing(
        "server-cuda",
        "mock_fault_across_processes",
        "four processes, a fault in one",
    ),
    racing(
        "server-cuda",
        "mock_fault_in_flight",
        "a fault after issue, found by the watchdog",
    ),
    racing(
        "server-cuda",
        "mock_fault_in_flight_alone",
        "a fault after issue, ranks joined alone",
    ),
    racing(
        "server-cuda",
        "mock_nccl_shrink",
        "a missing rank found at the deadline, then NCCL's shrink",
    ),
    racing(
        "server-cuda",
        "mock_nccl_dead_peer",
        "a process killed holding the mock NCCL's shared clique",
    ),
    racing(
        "server-cuda",
        "mock_timed_collectives",
        "the timed mock: modelled times against the clock",
    ),
    racing(
        "server-cuda",
        "mock_timed",
        "rounds late past the deadline or faulted after issue on the timed mock, \
         failed by the watchdog",
    ),
    racing(
        "server-cuda",
        "mock_old_driver",
        "an older driver's waits and deadlines",
    ),
    racing(
        "server-hip",
        "mock",
        "the suite over the mock HIP runtime and RCCL: ranks on threads, deadlines",
    ),
    racing(
        "server-hip",
        "mock_launched",
        "four launched worker processes on the mock RCCL; one killed, admitted back and healed",
    ),
    racing(
        "server-hip",
        "mock_timed_collectives",
        "the timed mock: modelled times against the clock",
    ),
    racing(
        "server-hip",
        "mock_timed_late",
        "a round late past the deadline on the timed mock, failed by the watchdog",
    ),
    racing(
        "server-vulkan",
        "hung",
        "a hung dispatch against the device's timeout",
    ),
];

/// Test files that name a group, a thread, a process or a deadline and
/// still do not race, with the reason; [`RACING`] holds the rest.
pub const CALM: &[(&str, &str, &str)] = &[
    (
        "scope-core",
        "prose",
        "reads doc comments; 'deadline' is a word it counts",
    ),
    (
        "scope-cube",
        "conformance",
        "one kernel's results a server; no groups",
    ),
    (
        "scope-cubecl",
        "collectives",
        "cubecl's collectives on four logical devices of one software adapter, one test at a time: their rounds are the core's, raced in scope-test and the mocks; too slow for hundreds of runs",
    ),
    (
        "server-cuda",
        "collectives",
        "needs an NVIDIA device: skipped here",
    ),
    (
        "server-cuda",
        "conformance",
        "needs an NVIDIA device: skipped here",
    ),
    (
        "server-cuda",
        "toolchain",
        "compiles kernels; no device, no group",
    ),
    (
        "server-hip",
        "collectives",
        "needs an AMD device: skipped here",
    ),
    (
        "server-hip",
        "toolchain",
        "compiles kernels with hiprtc; its one child process probes an architecture, waited for with no deadline; no device, no group",
    ),
    (
        "server-hip",
        "conformance",
        "needs an AMD device: skipped here",
    ),
    (
        "server-vulkan",
        "conformance",
        "the suite on lavapipe: its collectives are the kit's, raced in scope-test and the mocks; too slow for hundreds of runs",
    ),
    (
        "server-vulkan",
        "vulkan",
        "lavapipe's own behaviour; its deadlines are the device's",
    ),
    (
        "server-wgpu",
        "conformance",
        "the suite on llvmpipe: as server-vulkan's",
    ),
];

/// What `flaky` was asked.
pub struct Options {
    pub runs: usize,
    pub jobs: usize,
    pub only: Option<String>,
    pub timeout: Duration,
    pub release: bool,
}

/// One binary's runs.
struct Tally {
    passes: usize,
    /// Passing runs that printed a `skipped:` line: a test in them did
    /// nothing here (no device, say), so their pass proves less.
    skipping: usize,
    hangs: usize,
    first_failure: Option<String>,
}

/// Run every racing binary (or those whose name holds `only`) `runs` times
/// under load, print a table, and say whether every run passed.
///
/// # Errors
///
/// When the build cannot be started, or a binary named in [`RACING`] did
/// not build.
pub fn flaky(options: &Options) -> Result<bool> {
    let built = artifacts::build(
        "the racing tests",
        &["test", "--no-run", "--no-fail-fast"],
        options.release,
    )?;
    let chosen: Vec<&Racing> = RACING
        .iter()
        .filter(|r| {
            let name = format!("{}::{}", r.package, r.target);
            options
                .only
                .as_deref()
                .is_none_or(|o| o.split(',').any(|o| picks(o, &name)))
        })
        .collect();
    let mut binaries = Vec::new();
    for racing in &chosen {
        let artifact = built
            .artifacts
            .iter()
            .find(|a| {
                a.test
                    && a.package == racing.package
                    && (a.target == racing.target
                        || (racing.target == "lib" && a.target == a.package.replace('-', "_")))
            })
            .with_context(|| {
                format!(
                    "{}'s `{}` tests did not build",
                    racing.package, racing.target
                )
            })?;
        binaries.push((*racing, artifact.clone()));
    }
    println!(
        "==> flaky: {} binaries, {} runs each, {} at once, beside a busy loop; a run past {} s is a hang",
        binaries.len(),
        options.runs,
        options.jobs,
        options.timeout.as_secs()
    );
    let busy = BusyLoop::start();
    let mut all_passed = true;
    let mut rows = Vec::new();
    for (racing, artifact) in &binaries {
        println!("--> {}::{}: {}", racing.package, racing.target, racing.why);
        let started = Instant::now();
        let tally = run_many(artifact, options);
        let name = format!("{}::{}", racing.package, racing.target);
        let secs = started.elapsed().as_secs_f64();
        println!(
            "{name:<48} {:>5} runs {:>5} passed {:>3} hung {:>5} with skips {secs:>7.0} s",
            options.runs, tally.passes, tally.hangs, tally.skipping
        );
        if let Some(failure) = &tally.first_failure {
            println!("---- {name}: its first failure ----\n{failure}\n----");
        }
        all_passed &= tally.passes == options.runs;
        rows.push((name, tally.passes, tally.skipping, secs));
    }
    drop(busy);
    println!(
        "\n| binary | runs | passes | of them with skips | seconds |\n|---|---:|---:|---:|---:|"
    );
    for (name, passes, skipping, secs) in &rows {
        println!(
            "| {name} | {} | {passes} | {skipping} | {secs:.0} |",
            options.runs
        );
    }
    if options.only.is_none() {
        println!("\nnot run here, though they name a group, a thread or a deadline:");
        for (package, target, why) in CALM {
            println!("  {package}::{target}: {why}");
        }
    }
    println!(
        "flaky: {}",
        if all_passed {
            "every run passed"
        } else {
            "FAILED"
        }
    );
    Ok(all_passed)
}

/// Whether `--only`'s `pattern` picks binary `name`: a whole name picks
/// that binary alone (`server-cuda::mock`, not `server-cuda::mock_timed`),
/// anything else every name that holds it.
fn picks(pattern: &str, name: &str) -> bool {
    let whole = RACING
        .iter()
        .any(|r| format!("{}::{}", r.package, r.target) == pattern);
    if whole {
        pattern == name
    } else {
        name.contains(pattern)
    }
}

/// `options.runs` runs of one binary, `options.jobs` at once.
fn run_many(artifact: &Artifact, options: &Options) -> Tally {
    let next = AtomicUsize::new(0);
    let tally = Mutex::new(Tally {
        passes: 0,
        skipping: 0,
        hangs: 0,
        first_failure: None,
    });
    std::thread::scope(|s| {
        for _ in 0..options.jobs.max(1) {
            s.spawn(|| {
                while next.fetch_add(1, Ordering::Relaxed) < options.runs {
                    let outcome = run_once(artifact, options.timeout);
                    let mut tally = tally.lock().unwrap_or_else(|p| p.into_inner());
                    match outcome {
                        Outcome::Passed { skipped } => {
                            tally.passes += 1;
                            tally.skipping += usize::from(skipped);
                        }
                        Outcome::Failed(output) => {
                            tally.first_failure.get_or_insert(output);
                        }
                        Outcome::Hung(output) => {
                            tally.hangs += 1;
                            tally.first_failure.get_or_insert(output);
                        }
                    }
                }
            });
        }
    });
    tally.into_inner().unwrap_or_else(|p| p.into_inner())
}

enum Outcome {
    Passed { skipped: bool },
    Failed(String),
    Hung(String),
}

/// One run of `artifact`, its output in a file of its own, killed past
/// `timeout`.
fn run_once(artifact: &Artifact, timeout: Duration) -> Outcome {
    let log = log_file();
    let Ok(file) = std::fs::File::create(&log) else {
        return Outcome::Failed(format!("flaky: cannot write {}", log.display()));
    };
    let Ok(err) = file.try_clone() else {
        return Outcome::Failed(format!("flaky: cannot share {}", log.display()));
    };
    let mut command = artifacts::command(artifact);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::from(file))
        .stderr(Stdio::from(err));
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => return Outcome::Failed(format!("flaky: cannot start the binary: {error}")),
    };
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(_) => break None,
        }
    };
    let mut output = String::new();
    if let Ok(mut file) = std::fs::File::open(&log) {
        let _ = file.read_to_string(&mut output);
    }
    let _ = std::fs::remove_file(&log);
    match status {
        Some(status) if status.success() => Outcome::Passed {
            skipped: output.lines().any(|l| l.contains("skipped: ")),
        },
        Some(status) => Outcome::Failed(format!("{status}\n{}", tail(&output, 80))),
        None => Outcome::Hung(format!(
            "flaky: killed past its timeout of {} s\n{}",
            timeout.as_secs(),
            tail(&output, 80)
        )),
    }
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn log_file() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = crate::run::root()
        .join("target")
        .join("xtask")
        .join("flaky");
    let _ = std::fs::create_dir_all(&dir);
    dir.join(format!(
        "run-{}-{}.log",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A thread that spins until dropped: the load the runs share the cores with.
struct BusyLoop {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BusyLoop {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let spinning = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut x = 0u64;
            while !spinning.load(Ordering::Relaxed) {
                x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for BusyLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What marks a test file as one that may race.
    const MARKERS: &[&str] = &[
        "ranks_in_separate_processes",
        "Group::",
        "thread::spawn",
        "deadline",
        "conformance_tests!",
        "cuda_suite!",
        "hip_suite!",
        "Command::new",
        "Launcher::",
    ];

    /// Every integration-test file with a marker is in [`RACING`] or
    /// [`CALM`], and each name in either is a file that exists.
    #[test]
    fn only_picks_a_whole_name_alone_and_else_every_name_that_holds_it() {
        assert!(picks("server-cuda::mock", "server-cuda::mock"));
        assert!(!picks("server-cuda::mock", "server-cuda::mock_timed"));
        assert!(picks("timed", "server-cuda::mock_timed"));
        assert!(picks("timed", "server-hip::mock_timed_late"));
        assert!(!picks("timed", "scope-test::joined"));
    }

    #[test]
    fn every_test_file_that_may_race_is_run_by_flaky_or_says_why_not() {
        let crates = crate::run::root().join("crates");
        let mut unlisted = Vec::new();
        let listed = |package: &str, target: &str| {
            RACING
                .iter()
                .any(|r| r.package == package && r.target == target)
                || CALM.iter().any(|c| c.0 == package && c.1 == target)
        };
        for package in std::fs::read_dir(&crates).unwrap().flatten() {
            let name = package.file_name().to_string_lossy().into_owned();
            let Ok(tests) = std::fs::read_dir(package.path().join("tests")) else {
                continue;
            };
            for file in tests.flatten() {
                let path = file.path();
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let target = path.file_stem().unwrap().to_string_lossy().into_owned();
                if MARKERS.iter().any(|m| text.contains(m)) && !listed(&name, &target) {
                    unlisted.push(format!("{name}::{target}"));
                }
            }
        }
        assert!(
            unlisted.is_empty(),
            "test files that may race, in neither RACING nor CALM: {unlisted:?}"
        );
        for (package, target) in RACING
            .iter()
            .map(|r| (r.package, r.target))
            .chain(CALM.iter().map(|c| (c.0, c.1)))
        {
            let path = if target == "lib" {
                crates.join(package).join("src/lib.rs")
            } else {
                crates
                    .join(package)
                    .join("tests")
                    .join(format!("{target}.rs"))
            };
            assert!(path.exists(), "{package}::{target}: no {}", path.display());
        }
    }
}
