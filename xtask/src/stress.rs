//! `cargo xtask fuzz`, `cargo xtask stress` and `cargo xtask soak`: the
//! contract fuzzer, the rounds in flight against their oracle, and the soak,
//! longer than a test run affords.
//!
//! Both already run small in every test run. The property test, with its
//! invalid calls (`scope-test/src/property/abuse.rs`) and device losses
//! (`property/loss.rs`), runs five fixed seeds; the soak, a few thousand
//! launches. Here they run from the build `test` makes, for as long as asked.
//! `fuzz` tries fresh seeds until the minutes are up, and stops at the first
//! failure with the line that replays it. `stress` runs the random rounds,
//! rounds left in flight among them, on thousands of seeds where rounds take
//! time: the host server's loopback transport and the timed CUDA and HIP
//! mocks. `soak` runs alone in its process at
//! a million launches, so its resident-memory check means something.

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};

use crate::artifacts::{self, Artifact};
use crate::backends::{Choice, ci};

/// Which test binary holds a backend's conformance suite, and so its property
/// test and soak. For core it is the host server's; for a server, the table's.
fn suite_binary(backend: Choice) -> Result<(&'static str, &'static str)> {
    match backend {
        Choice::Core | Choice::Host => Ok(("scope-test", "conformance")),
        Choice::One(kind) => Ok((kind.server_crate(), ci(kind).suite_test)),
        Choice::All => backend.refused(&[Choice::Host.name(), Choice::Core.name()]),
    }
}

fn find(backend: Choice, release: bool) -> Result<Artifact> {
    let (package, target) = suite_binary(backend)?;
    let built = artifacts::build(
        "the conformance tests",
        &["test", "--no-run", "--no-fail-fast"],
        release,
    )?;
    built
        .artifacts
        .into_iter()
        .find(|a| a.package == package && a.target == target && a.test)
        .with_context(|| format!("{package}'s `{target}` tests did not build"))
}

/// What a run said, without echoing it: a fuzz run prints its own
/// progress, and the output of a passing seed is noise.
struct Quiet {
    success: bool,
    lines: Vec<String>,
}

fn quiet(mut command: std::process::Command) -> Result<Quiet> {
    let output = command
        .stdin(std::process::Stdio::null())
        .output()
        .context("starting the test binary")?;
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let lines = text(&output.stdout)
        .lines()
        .chain(text(&output.stderr).lines())
        .map(str::to_owned)
        .collect();
    Ok(Quiet {
        success: output.status.success(),
        lines,
    })
}

/// A seed from the clock, so that each run of `fuzz` tries new ones.
fn fresh_seed(round: u64) -> u64 {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ round.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Run the property tests on fresh seeds for `minutes`, each seed through both:
/// the contract's (`random_sequences`) and the collectives' (`random_rounds`).
///
/// # Errors
///
/// When the build or a run cannot be started.
pub fn fuzz(backend: Choice, minutes: f64, release: bool) -> Result<bool> {
    const STEPS: u64 = 5_000;
    let binary = find(backend, release)?;
    let deadline = Instant::now() + Duration::from_secs_f64(minutes * 60.0);
    let (mut rounds, mut operations, mut invalid, mut collectives) = (0u64, 0u64, 0u64, 0u64);
    let mut lost = 0u64;
    println!("==> fuzzing {backend} for {minutes} min, {STEPS} operations a seed");
    while Instant::now() < deadline {
        let seed = fresh_seed(rounds);
        let mut command = artifacts::command(&binary);
        command
            .args([
                "random_sequences",
                "random_rounds",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("SCOPE_PROPERTY_SEED", seed.to_string())
            .env("SCOPE_PROPERTY_STEPS", STEPS.to_string());
        let captured = quiet(command)?;
        rounds += 1;
        // One line per adapter the binary runs the property test on:
        // "<backend>: N operations over 1 seeds; …; K invalid".
        operations += captured
            .lines
            .iter()
            .filter_map(|l| {
                l.split(" operations over ")
                    .next()?
                    .rsplit(' ')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum::<u64>();
        invalid += captured
            .lines
            .iter()
            .filter_map(|l| {
                l.split("; ")
                    .last()?
                    .strip_suffix(" invalid")?
                    .parse::<u64>()
                    .ok()
            })
            .sum::<u64>();
        // "…; L devices lost and R opened again (…); K invalid".
        lost += captured
            .lines
            .iter()
            .filter_map(|l| {
                l.split("; ")
                    .find(|part| part.contains(" devices lost"))?
                    .split(' ')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum::<u64>();
        // One line per group the rounds ran on, after libtest's own
        // "test … ": "random rounds: seed S, N rounds on …".
        collectives += captured
            .lines
            .iter()
            .filter_map(|l| {
                l.split("random rounds: ")
                    .nth(1)?
                    .split(", ")
                    .nth(1)?
                    .split(' ')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum::<u64>();
        if !captured.success {
            for line in &captured.lines {
                println!("{line}");
            }
            println!(
                "fuzz: FAILED on {backend} at seed {seed}; replay it alone with\n  \
                 SCOPE_PROPERTY_SEED={seed} SCOPE_PROPERTY_STEPS={STEPS} cargo test -p {} --all-features \
                 --test {} random_sequences random_rounds",
                binary.package, binary.target
            );
            return Ok(false);
        }
        if rounds % 10 == 0 {
            println!(
                "==> {rounds} seeds, {} operations, {invalid} invalid, {lost} devices lost",
                rounds * STEPS
            );
        }
    }
    println!(
        "fuzz: {backend}: {rounds} seeds, {operations} operations ({invalid} invalid calls, \
         {lost} devices lost), {collectives} rounds of collectives, no disagreement"
    );
    Ok(true)
}

/// Run the soak alone at `SCOPE_SOAK_LAUNCHES` (a million by default) and
/// print its samples.
///
/// # Errors
///
/// When the build or the run cannot be started.
pub fn soak(backend: Choice, release: bool) -> Result<bool> {
    let binary = find(backend, release)?;
    let launches = std::env::var("SCOPE_SOAK_LAUNCHES").unwrap_or_else(|_| "1000000".to_owned());
    println!("==> soaking {backend}: {launches} launches, 4 threads x 2 streams");
    let start = Instant::now();
    let mut command = artifacts::command(&binary);
    command
        .args(["soak", "--nocapture", "--test-threads=1"])
        .env("SCOPE_SOAK_LAUNCHES", &launches);
    let captured = quiet(command)?;
    for line in captured
        .lines
        .iter()
        .filter(|l| l.starts_with("soak:") || l.contains("panicked") || l.contains("skipped:"))
    {
        println!("{line}");
    }
    println!(
        "soak: {backend}: {} in {:.0} s",
        if captured.success { "flat" } else { "FAILED" },
        start.elapsed().as_secs_f64()
    );
    Ok(captured.success)
}

/// The test binaries whose suites run the random rounds over a device
/// transport that takes time. The host server's loopback is one. The CUDA
/// and HIP mocks in timed mode are the others: a round there is still in
/// flight when its caller goes on.
const IN_FLIGHT: [(&str, &str); 3] = [
    ("scope-test", "conformance"),
    ("server-cuda", "mock_timed_collectives"),
    ("server-hip", "mock_timed_collectives"),
];

/// What the report lines of the random rounds add up to.
#[derive(Default)]
struct Rounds {
    programs: u64,
    rounds: u64,
    ran: u64,
    failed: u64,
    refused: u64,
    recorded: u64,
    in_flight: u64,
    words: u64,
    lost: u64,
    reformed: u64,
    rotated: u64,
    issues: u64,
    twice: u64,
}

impl Rounds {
    /// Add one report line of the random rounds (`report` in
    /// `scope-test/src/rounds.rs`). Each count is the number just before its
    /// words: "N rounds on", "A ran", "W words read".
    fn add(&mut self, line: &str) {
        let Some(line) = line.split("random rounds: ").nth(1) else {
            return;
        };
        // The number just before `word` in `line`.
        let before = |word: &str| -> u64 {
            line.split(word)
                .next()
                .and_then(|head| head.rsplit([' ', ',', '(']).find(|w| !w.is_empty()))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        self.programs += 1;
        self.rounds += before(" rounds on ");
        self.ran += before(" ran, ");
        self.failed += before(" failed on an input");
        self.refused += before(" refused; ");
        self.recorded += before(" rounds recorded");
        self.in_flight = self.in_flight.max(before(" rounds in flight"));
        self.words += before(" words read");
        self.lost += before(" devices lost");
        self.reformed += before(" shrinks of every rank");
        self.rotated += before(" ranks lost, shrunk");
        self.issues += before(" library calls failed");
        self.twice += before(" on two ranks at once");
    }
}

/// Run the random rounds of [`IN_FLIGHT`]'s binaries on seeds `0..seeds`,
/// `rounds` rounds each, and print what they checked.
///
/// # Errors
///
/// When the build or a run cannot be started, or a binary did not build.
pub fn rounds(seeds: usize, rounds: usize, release: bool) -> Result<bool> {
    let built = artifacts::build(
        "the conformance tests",
        &["test", "--no-run", "--no-fail-fast"],
        release,
    )?;
    println!(
        "==> random rounds in flight: seeds 0 to {}, {rounds} rounds each",
        seeds - 1
    );
    let mut ok = true;
    for (package, target) in IN_FLIGHT {
        let binary = built
            .artifacts
            .iter()
            .find(|a| a.package == package && a.target == target && a.test)
            .with_context(|| format!("{package}'s `{target}` tests did not build"))?;
        for (test, mode) in MODES {
            ok &= run_rounds(binary, (package, target), (test, mode), seeds, rounds)?;
        }
    }
    Ok(ok)
}

/// The random rounds' two tests: rounds left in flight, and rounds between
/// membership changes, where one rank's library call sometimes fails.
const MODES: [(&str, &str); 2] = [
    ("random_rounds_of_collectives_match_the_oracle", "in flight"),
    (
        "random_rounds_with_losses_and_changes_match_the_oracle",
        "with changes",
    ),
];

/// One binary's test `test` on seeds `0..seeds`: print what it checked, and
/// whether every seed agreed with the oracle.
fn run_rounds(
    binary: &Artifact,
    (package, target): (&str, &str),
    (test, mode): (&str, &str),
    seeds: usize,
    rounds: usize,
) -> Result<bool> {
    let start = Instant::now();
    let mut command = artifacts::command(binary);
    command
        .args([test, "--nocapture", "--test-threads=1"])
        .env("SCOPE_ROUND_SEEDS", seeds.to_string())
        .env("SCOPE_ROUNDS", rounds.to_string());
    let captured = quiet(command)?;
    let mut sum = Rounds::default();
    for line in &captured.lines {
        sum.add(line);
    }
    let changes = if mode == "with changes" {
        format!(
            "; {} devices lost and recovered, {} shrinks of every rank, {} ranks lost and \
             admitted back, {} library calls failed ({} on two ranks at once)",
            sum.lost, sum.reformed, sum.rotated, sum.issues, sum.twice
        )
    } else {
        String::new()
    };
    println!(
        "{package}::{target} ({mode}): {} programs, {} rounds: rank 0's calls {} ran, {} failed \
         on an input, {} refused; {} recorded and replayed{changes}; at most {} rounds in flight \
         at a read; {} words read; {}, {:.0} s",
        sum.programs,
        sum.rounds,
        sum.ran,
        sum.failed,
        sum.refused,
        sum.recorded,
        sum.in_flight,
        sum.words,
        if captured.success {
            "no disagreement"
        } else {
            "FAILED"
        },
        start.elapsed().as_secs_f64()
    );
    if !captured.success {
        for line in captured
            .lines
            .iter()
            .filter(|l| l.contains("panicked") || l.starts_with("seed ") || l.starts_with("  "))
        {
            println!("  {line}");
        }
        println!(
            "  replay one seed with SCOPE_PROPERTY_SEED=<seed> SCOPE_ROUNDS={rounds} cargo test \
             -p {package} --all-features --test {target} {test}"
        );
    }
    Ok(captured.success)
}
