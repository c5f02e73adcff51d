//! `cargo xtask`: the project's tasks, for people and for CI.
//!
//! ```text
//! cargo xtask matrix [--json]            which backends have a device here
//! cargo xtask test [--backend B] [--release] [--verbose]
//!                                        tests per backend, with a summary
//! cargo xtask ci [--verbose]             what CI runs
//! cargo xtask bench [--backend B]        benches, figures printed together
//! cargo xtask demo [--backend B] [--release] [-- ARGS]
//!                                        the tiny-runtime demo on the best backend
//! cargo xtask fuzz [--backend B] [--minutes M]
//!                                        the contract fuzzer on fresh seeds
//! cargo xtask stress [--seeds N] [--rounds M]
//!                                        the random rounds in flight on N seeds
//! cargo xtask soak [--backend B]         the soak at a million launches
//! cargo xtask flaky [--runs N] [--jobs J] [--only NAME] [--timeout S]
//!                                        the tests that race, N times under load
//! cargo xtask bundle [--backend B] [--max-mib N]
//!                                        B's device tests and bench, built here
//!                                        to run on a GPU machine without Rust
//! ```
//!
//! `B` is one of `cuda`, `hip`, `vulkan`, `wgpu` (and, for `test` and
//! `bench`, `core` or `all`). xtask is a plain binary so the tasks are Rust,
//! run the same on every machine, and need nothing but cargo. It depends on
//! `anyhow` and `serde_json` only, so `cargo xtask` builds in seconds and says
//! what it will build before the long build starts. The servers are reached
//! through the workspace's own binaries, built once ([`artifacts`]).

mod adapter;
mod artifacts;
mod backends;
mod bundle;
mod cubecl;
mod flaky;
mod matrix;
mod report;
mod run;
mod stress;
mod tests;

use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::backends::{BackendKind, Choice};

/// The environment variable benches honour to run a few iterations only,
/// so `ci` can check that every bench still builds and runs.
const BENCH_SMOKE: &str = "SCOPE_BENCH_SMOKE";

const USAGE: &str = "\
usage: cargo xtask <command> [options]

  matrix [--json]                      probe CUDA, HIP, Vulkan and wgpu for devices
  test [--backend B] [--release] [--verbose]
                                       run the tests of backend B (cuda|hip|vulkan|wgpu|core|all);
                                       with --backend X a missing device for X is a failure; a line
                                       per row and the failures in full, everything else in
                                       target/xtask/test.log (--verbose: shown as it runs too)
  ci [--verbose]                       fmt, clippy, doc, every test that can run here, bench smoke runs
  bench [--backend B]                  run the benches and print their figures together
  demo [--backend B] [--release] [-- ARGS]
                                       run tiny-runtime on the best backend found (or B)
  fuzz [--backend B] [--minutes M]     the property test with its invalid calls and device losses
                                       on fresh seeds for M minutes (default core, 5); a failure
                                       prints its seed
  stress [--seeds N] [--rounds M]      the random rounds of collectives, rounds in flight among
                                       them, then with membership changes and failed library
                                       calls, on seeds 0 to N - 1 (default 2000), M rounds each
                                       (default 20), over the host server's loopback and the timed
                                       CUDA and HIP mocks
  soak [--backend B]                   the soak alone at SCOPE_SOAK_LAUNCHES (default 1,000,000)
                                       launches, printing the footprint it samples
  flaky [--runs N] [--jobs J] [--only NAME] [--timeout S]
                                       run each test binary that races (processes, deadlines,
                                       threads) N times (default 200), J at once (default: the
                                       cores) beside a busy loop; NAME picks binaries by
                                       `package::target`, whole or in part (several: a,b);
                                       a run past S seconds (default 600) hangs
  bundle [--backend B] [--max-mib N]   build B's device tests and bench (default cuda) into
                                       .device/ with a run.sh, to run on a GPU machine without
                                       Rust; with --max-mib, fail if the bundle is larger

demo, test and ci first install the Vulkan loader, lavapipe and the validation layer where
they are missing and this machine can (Debian/Ubuntu, root or password-less sudo), else print
the command that would; SCOPE_NO_INSTALL=1 makes them print it only.";

struct Args {
    command: String,
    backend: Option<Choice>,
    release: bool,
    verbose: bool,
    json: bool,
    max_mib: Option<f64>,
    minutes: Option<f64>,
    runs: Option<usize>,
    jobs: Option<usize>,
    only: Option<String>,
    timeout: Option<u64>,
    seeds: Option<usize>,
    rounds: Option<usize>,
    rest: Vec<String>,
}

fn parse() -> Result<Args> {
    let mut it = std::env::args().skip(1);
    let command = it.next().unwrap_or_else(|| "help".to_owned());
    let mut args = Args {
        command,
        backend: None,
        release: false,
        verbose: false,
        json: false,
        max_mib: None,
        minutes: None,
        runs: None,
        jobs: None,
        only: None,
        timeout: None,
        seeds: None,
        rounds: None,
        rest: Vec::new(),
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--backend" => {
                let name = it.next().context("--backend needs a value")?;
                args.backend = Some(Choice::parse(&name.to_ascii_lowercase())?);
            }
            "--release" => args.release = true,
            "--verbose" | "-v" => args.verbose = true,
            "--max-mib" => {
                let value = it.next().context("--max-mib needs a number")?;
                args.max_mib = Some(
                    value
                        .parse()
                        .with_context(|| format!("--max-mib {value}: a number of MiB"))?,
                );
            }
            "--minutes" => {
                let value = it.next().context("--minutes needs a number")?;
                args.minutes = Some(
                    value
                        .parse()
                        .with_context(|| format!("--minutes {value}: a number of minutes"))?,
                );
            }
            "--runs" => args.runs = Some(count(it.next(), "--runs")?),
            "--jobs" => args.jobs = Some(count(it.next(), "--jobs")?),
            "--timeout" => args.timeout = Some(count(it.next(), "--timeout")? as u64),
            "--seeds" => args.seeds = Some(count(it.next(), "--seeds")?),
            "--rounds" => args.rounds = Some(count(it.next(), "--rounds")?),
            "--only" => args.only = Some(it.next().context("--only needs a name")?),
            "--json" => args.json = true,
            "--" => args.rest.extend(it.by_ref()),
            other => match other.strip_prefix("--backend=") {
                Some(b) => args.backend = Some(Choice::parse(&b.to_ascii_lowercase())?),
                None => bail!("unknown option `{other}`\n{USAGE}"),
            },
        }
    }
    Ok(args)
}

/// A whole number for `flag`, at least 1.
fn count(value: Option<String>, flag: &str) -> Result<usize> {
    let value = value.with_context(|| format!("{flag} needs a number"))?;
    match value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => bail!("{flag} {value}: a whole number, at least 1"),
    }
}

fn main() {
    let outcome = parse().and_then(|args| match args.command.as_str() {
        "matrix" => matrix(&args),
        "test" => test(&args),
        "ci" => ci(&args),
        "bench" => bench(&args),
        "demo" => demo(&args),
        "fuzz" => stress::fuzz(
            args.backend.unwrap_or(Choice::Core),
            args.minutes.unwrap_or(5.0),
            args.release,
        ),
        "stress" => stress::rounds(
            args.seeds.unwrap_or(2000),
            args.rounds.unwrap_or(20),
            args.release,
        ),
        "soak" => stress::soak(args.backend.unwrap_or(Choice::Core), args.release),
        "flaky" => flaky::flaky(&flaky::Options {
            runs: args.runs.unwrap_or(200),
            jobs: args.jobs.unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get)
            }),
            only: args.only.clone(),
            timeout: std::time::Duration::from_secs(args.timeout.unwrap_or(600)),
            release: args.release,
        }),
        "bundle" => bundle::bundle(
            args.backend.unwrap_or(Choice::One(BackendKind::Cuda)),
            args.max_mib,
        ),
        "help" | "-h" | "--help" => {
            println!("{USAGE}");
            Ok(true)
        }
        other => bail!("unknown command `{other}`\n{USAGE}"),
    });
    match outcome {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(error) => {
            eprintln!("xtask: {error:#}");
            std::process::exit(2);
        }
    }
}

fn matrix(args: &Args) -> Result<bool> {
    let binary = artifacts::demo_binary(args.release)?;
    let rows = matrix::probe_all(binary.as_deref());
    if args.json {
        println!("{}", matrix::json(&rows));
    } else {
        println!("{}", matrix::table(&rows));
        match matrix::best(&rows) {
            Some(best) => println!("\ndemo backend: {best}"),
            None => println!(
                "\nno device for any backend: `sudo {}` installs a software one",
                adapter::SCRIPT
            ),
        }
    }
    Ok(true)
}

fn test(args: &Args) -> Result<bool> {
    tests::check_backend(args.backend)?;
    adapter::prepare()?;
    let nextest = tests::nextest_installed();
    if !nextest {
        println!(
            "==> cargo-nextest is not installed; running the test binaries as cargo test does"
        );
    }
    let built = tests::build(args.release)?;
    adapter::ensure(built.demo_binary())?;
    let options = tests::Options {
        backend: args.backend,
        release: args.release,
        nextest,
        doctests: matches!(args.backend, None | Some(Choice::All)),
    };
    let mut out = tests::Output::new(args.verbose);
    let rows = tests::run(&options, &built, &mut out)?;
    let (summary, ok) = tests::summary(&rows, &built, &mut out);
    print!("{summary}");
    Ok(ok)
}

struct Step {
    name: &'static str,
    ok: bool,
    secs: f64,
}

/// The steps of `ci`, for its progress lines.
const CI_STEPS: usize = 5;

fn step(steps: &mut Vec<Step>, name: &'static str, command: std::process::Command) -> Result<()> {
    println!("\n==> ci [{}/{CI_STEPS}] {name}", steps.len() + 1);
    let start = Instant::now();
    let ok = run::status(command)?;
    steps.push(Step {
        name,
        ok,
        secs: start.elapsed().as_secs_f64(),
    });
    if !ok {
        println!("==> {name}: FAILED");
    }
    Ok(())
}

/// The build's footprint and the room left beside it, as a line for the log.
/// A CI run out of disk fails in whichever compile it was in; this says how
/// close the last one came.
fn disk_line() -> String {
    let target = run::root().join("target");
    let target = target.to_string_lossy();
    let kib = |text: Option<String>, column: usize| {
        text.and_then(|t| {
            t.lines()
                .last()?
                .split_whitespace()
                .nth(column)?
                .parse::<f64>()
                .ok()
        })
    };
    let gib = |k: Option<f64>| k.map_or("?".to_owned(), |k| format!("{:.1}", k / 1048576.0));
    let used = kib(run::output_of("du", &["-sk", &target]), 0);
    let free = kib(run::output_of("df", &["-Pk", &target]), 3)
        .or_else(|| kib(run::output_of("df", &["-Pk", "."]), 3));
    format!("disk: target/ {} GiB, {} GiB free", gib(used), gib(free))
}

fn ci(args: &Args) -> Result<bool> {
    let started = Instant::now();
    let mut steps = Vec::new();
    println!("{}", disk_line());
    adapter::prepare()?;

    let mut fmt = run::cargo();
    fmt.args(["fmt", "--all", "--check"]);
    step(&mut steps, "fmt", fmt)?;

    let mut clippy = run::cargo();
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ]);
    step(&mut steps, "clippy", clippy)?;

    let mut doc = run::cargo();
    doc.args(["doc", "--workspace", "--no-deps", "--all-features"])
        .env("RUSTDOCFLAGS", "-D warnings");
    step(&mut steps, "doc", doc)?;

    println!("\n==> ci [{}/{CI_STEPS}] tests", steps.len() + 1);
    let start = Instant::now();
    let nextest = tests::nextest_installed();
    let options = tests::Options {
        backend: None,
        release: false,
        nextest,
        doctests: true,
    };
    let built = tests::build(false)?;
    let devices = adapter::ensure(built.demo_binary())?;
    println!("{}", matrix::table(&devices));
    let mut out = tests::Output::new(args.verbose);
    let rows = tests::run(&options, &built, &mut out)?;
    steps.push(Step {
        name: "tests",
        ok: built.ok && rows.iter().all(|r| r.failed == 0),
        secs: start.elapsed().as_secs_f64(),
    });

    // Each bench target, built as the test profile and run once with the
    // smoke variable set: benches honour it by running a few iterations.
    let mut smoke = run::cargo();
    smoke
        .args(["test", "--workspace", "--all-features", "--bench", "*"])
        .env(BENCH_SMOKE, "1");
    step(&mut steps, "bench smoke", smoke)?;

    println!("\nci steps");
    for s in &steps {
        println!(
            "  {:<12} {:<6} {:>7.1} s",
            s.name,
            if s.ok { "ok" } else { "FAILED" },
            s.secs
        );
    }
    println!("  total {:.1} min", started.elapsed().as_secs_f64() / 60.0);
    println!("  {}", disk_line());
    let (summary, tests_ok) = tests::summary(&rows, &built, &mut out);
    print!("{summary}");
    let ok = tests_ok && steps.iter().all(|s| s.ok);
    println!("ci: {}", if ok { "ok" } else { "FAILED" });
    Ok(ok)
}

fn bench(args: &Args) -> Result<bool> {
    let backend = args.backend.unwrap_or(Choice::All);
    let mut wanted: Vec<(String, String)> = Vec::new();
    if matches!(backend, Choice::All | Choice::Core) {
        wanted.push(("core".into(), "scope-core".into()));
    }
    for &kind in BackendKind::ALL {
        let b = kind.name();
        if backend.takes(kind) {
            let krate = kind.server_crate();
            if run::root()
                .join("crates")
                .join(krate)
                .join("Cargo.toml")
                .is_file()
            {
                wanted.push((b.into(), krate.into()));
            } else if backend == Choice::One(kind) {
                bail!("crates/{krate} is not built yet");
            } else {
                println!("==> {b}: crate not built yet");
            }
        }
    }
    // scope's servers as cubecl runtimes, against cubecl-wgpu: the bench
    // needs both of these.
    let cubecl = [BackendKind::Wgpu, BackendKind::Vulkan];
    if cubecl.iter().any(|&kind| backend.takes(kind))
        && run::root().join("crates/scope-cubecl/Cargo.toml").is_file()
    {
        wanted.push(("cubecl".into(), "scope-cubecl".into()));
    }
    // The collectives' all-reduce over four devices, against the same
    // reduction written directly.
    if backend == Choice::All && run::root().join("crates/tiny-runtime/Cargo.toml").is_file() {
        wanted.push(("runtime".into(), "tiny-runtime".into()));
    }
    // What a launched worker's heartbeat costs a step.
    if backend == Choice::All && run::root().join("crates/scope-launch/Cargo.toml").is_file() {
        wanted.push(("launch".into(), "scope-launch".into()));
    }
    if wanted.is_empty() {
        return backend.refused(&["core", "all"]);
    }
    // Every bench from one build; one backend's from its packages alone.
    let select: Vec<&str> = if backend == Choice::All {
        artifacts::SELECT.to_vec()
    } else {
        let mut select: Vec<&str> = wanted
            .iter()
            .flat_map(|(_, package)| ["-p", package.as_str()])
            .collect();
        select.push("--all-features");
        select
    };
    let built = artifacts::build_selected("the benches", &["bench", "--no-run"], &select, false)?;
    let runs: Vec<(&str, &artifacts::Artifact)> = wanted
        .iter()
        .flat_map(|(name, package)| {
            built
                .artifacts
                .iter()
                .filter(move |a| a.bench && &a.package == package)
                .map(move |a| (name.as_str(), a))
        })
        .collect();
    let mut ok = built.ok;
    let mut figures = Vec::new();
    for (i, (name, artifact)) in runs.iter().enumerate() {
        println!(
            "\n==> [{}/{}] {name}: {} bench `{}`",
            i + 1,
            runs.len(),
            artifact.package,
            artifact.target
        );
        let mut cmd = artifacts::command(artifact);
        cmd.arg("--bench");
        if std::env::var_os("LP_NUM_THREADS").is_none() {
            // lavapipe's own threads fight the bench for two cores.
            cmd.env("LP_NUM_THREADS", "0");
        }
        let captured = run::capture(cmd)?;
        ok &= captured.success;
        let lines: Vec<String> = captured
            .lines
            .into_iter()
            .filter(|l| is_figure(l))
            .collect();
        figures.push((
            format!("{name}: {}", artifact.target),
            lines,
            captured.success,
        ));
    }
    // The collectives' overlap, on the timed mock of CUDA and NCCL: its
    // figures are modelled, and say so beside each.
    let cuda = BackendKind::Cuda;
    if backend.takes(cuda) && wanted.iter().any(|(_, p)| p == cuda.server_crate()) {
        println!("\n==> {cuda}: ddp_step over the timed mock (tests/mock_timed.rs)");
        let mut cmd = run::cargo();
        cmd.args([
            "test",
            "--release",
            "-p",
            cuda.server_crate(),
            "--test",
            "mock_timed",
        ])
        .args(["the_table", "--", "--nocapture"])
        .env("SCOPE_MOCK_BENCH_FULL", "1");
        let captured = run::capture(cmd)?;
        ok &= captured.success;
        let lines: Vec<String> = captured
            .lines
            .into_iter()
            .filter(|l| is_figure(l) || l.contains("-class"))
            .collect();
        figures.push((
            format!("{cuda}: ddp_step over the timed mock"),
            lines,
            captured.success,
        ));
    }
    let mut without = Vec::new();
    for (name, package) in &wanted {
        if !runs.iter().any(|(n, _)| n == name) {
            if built.ok {
                // A crate without a bench: nothing failed.
                without.push(format!("{name} ({package})"));
            } else {
                // It may have one that did not build; the build failed.
                figures.push((
                    format!("{name}: {package} built no bench (the build failed)"),
                    Vec::new(),
                    false,
                ));
            }
        }
    }
    println!("\nbench figures");
    if !without.is_empty() {
        println!("(no bench: {})", without.join(", "));
    }
    for (name, lines, success) in figures {
        println!("[{name}]{}", if success { "" } else { " (bench FAILED)" });
        if lines.is_empty() {
            println!("  (no figures printed)");
        }
        for line in lines {
            println!("  {}", line.trim());
        }
    }
    Ok(ok)
}

/// Whether a bench output line is a result rather than progress: a
/// criterion `time:` line, a throughput, a ratio, or a duration.
fn is_figure(line: &str) -> bool {
    let l = line.trim();
    if l.is_empty()
        || l.starts_with("Compiling")
        || l.starts_with("Running")
        || l.starts_with("Finished")
    {
        return false;
    }
    l.chars().any(|c| c.is_ascii_digit())
        && [
            "time:", "thrpt:", " ns", "µs", "us/", " ms", "/s", "ratio", "×", " x ",
        ]
        .iter()
        .any(|m| l.contains(m))
}

fn demo(args: &Args) -> Result<bool> {
    let chosen = match args.backend {
        Some(Choice::One(kind)) => Some(kind),
        Some(other) => return other.refused(&[]),
        None => None,
    };
    // The dev profile, as the tests build it. The device work runs in the
    // driver (Mesa compiles lavapipe's shaders itself), so optimising our
    // crates buys the demo little: on lavapipe with 2 cores the whole demo
    // takes about 30 s in the dev profile, of which the unoptimised f64 CPU
    // reference is about 4 s, while a release build of every dependency is
    // a second cold build of many minutes. `--release` is there for figures.
    adapter::prepare()?;
    let binary = artifacts::demo_binary(args.release)?
        .context("tiny-runtime did not build (see the build output above)")?;
    let rows = adapter::ensure(Some(&binary))?;
    let backend = match chosen {
        Some(b) => b,
        None => {
            println!("{}", matrix::table(&rows));
            match matrix::best(&rows) {
                Some(b) => b,
                None => {
                    let wgpu = BackendKind::Wgpu;
                    println!("==> no backend has a device; trying {wgpu}, which reports why");
                    wgpu
                }
            }
        }
    };
    match matrix::device_of(&rows, backend) {
        Some(row) => println!("==> demo on {backend}: {} ({})", row.device, row.detail),
        None => println!("==> demo on {backend}"),
    }
    let mut cmd = run::program(&binary);
    cmd.args(["--backend", backend.name()]).args(&args.rest);
    run::status(cmd)
}
