//! The rows of the summary: each runner invocation's tests counted as
//! passed, failed, skipped, not exercised or not applicable, with their
//! reasons, and the table a person reads.
//!
//! "Not exercised" is a test that could have run here and did nothing: a
//! device or a toolchain would change it. "Not applicable" is a behaviour
//! its suite cannot have on any machine, by the suite's design. Kept
//! apart, the first is a short list a person can act on.

use super::lines::{not_applicable, not_exercised, not_run_reason, skip_reason, strip_ansi};
use super::runner::{Skip, classify, parse_libtest, parse_nextest};

/// A failed test (or a run that failed as a whole), with everything it
/// printed.
#[derive(Clone, Debug, Default)]
pub struct Failure {
    /// The test, or what ran.
    pub name: String,
    /// Its output, as the runner printed it.
    pub lines: Vec<String>,
}

/// The counts of one row of the summary.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    /// The row.
    pub name: String,
    /// Tests that ran on a device (or needed none) and passed.
    pub passed: u64,
    /// Tests that failed, or 1 for a run that failed without a count (a
    /// build error, a crash).
    pub failed: u64,
    /// Tests that printed `skipped: <reason>` and returned (or 1 for a
    /// row that did not run for want of a device).
    pub skipped: u64,
    /// Skip reasons, each with how many tests gave it.
    pub skips: Vec<(String, u64)>,
    /// Reasons for parts of passing tests skipped, with counts.
    pub partly: Vec<(String, u64)>,
    /// Tests that passed having done nothing on the device: they said `not
    /// exercised: <reason>` (returned early for a feature the device lacks)
    /// or `not run: <reason>` (marked as not holding on it).
    pub not_exercised: u64,
    /// `not exercised` reasons, each with how many tests gave it.
    pub unexercised: Vec<(String, u64)>,
    /// The tests marked not run, as `not run: <test> (<reason>)`.
    pub not_run: Vec<String>,
    /// Tests that said `not applicable: <reason>`: their suite cannot have
    /// what they need, by design.
    pub not_applicable: u64,
    /// `not applicable` reasons, each with how many tests gave it.
    pub inapplicable: Vec<(String, u64)>,
    /// Why the row did not run, or a note.
    pub note: String,
    /// Failures, in full.
    pub failures: Vec<Failure>,
    /// The runner's closing lines, verbatim.
    pub closing: Vec<String>,
    /// Its wall time.
    pub secs: f64,
}

fn bump(list: &mut Vec<(String, u64)>, reason: &str) {
    match list.iter_mut().find(|(r, _)| r == reason) {
        Some((_, n)) => *n += 1,
        None => list.push((reason.to_owned(), 1)),
    }
}

impl Counts {
    /// A row named `name`, nothing counted yet.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            ..Self::default()
        }
    }

    /// Add one runner invocation: `what` (the command, for a failure that
    /// is not one test's), whether it exited successfully, and its lines.
    pub fn add(&mut self, what: &str, success: bool, lines: &[String], nextest: bool) {
        let parsed = if nextest {
            parse_nextest(lines)
        } else {
            parse_libtest(lines)
        };
        let mut skipped = 0;
        let mut unexercised = 0;
        let mut inapplicable = 0;
        if parsed.tests.is_empty() && parsed.passed > 0 {
            // The runner's framing was not recognised: count the skip and
            // not-exercised lines themselves, as an older xtask did, and
            // say so.
            for reason in lines.iter().filter_map(|l| skip_reason(l)) {
                skipped += 1;
                bump(&mut self.skips, &reason);
            }
            for (reason, _) in lines.iter().filter_map(|l| not_exercised(l)) {
                unexercised += 1;
                bump(&mut self.unexercised, &reason);
            }
            if skipped + unexercised > 0 {
                self.note = "counted by line: the runner's output was not recognised".into();
            }
        }
        // Verdicts that name their test, wherever they stand.
        let named: Vec<(String, String)> = lines
            .iter()
            .filter_map(|l| not_exercised(l))
            .filter_map(|(reason, name)| Some((name?, reason)))
            .collect();
        let mut failures = Vec::new();
        for test in &parsed.tests {
            if !test.passed {
                failures.push(Failure {
                    name: test.name.clone(),
                    lines: test.raw.clone(),
                });
                continue;
            }
            match classify(&test.stdout) {
                Skip::None => {}
                Skip::Whole(reason) => {
                    skipped += 1;
                    bump(&mut self.skips, &reason);
                    continue;
                }
                Skip::Partly(reasons) => {
                    for reason in reasons {
                        bump(&mut self.partly, &reason);
                    }
                }
            }
            if let Some(why) = test.stdout.iter().find_map(|l| not_applicable(l)) {
                inapplicable += 1;
                bump(&mut self.inapplicable, &why);
            } else if let Some(why) = test.stdout.iter().find_map(|l| not_run_reason(l)) {
                unexercised += 1;
                self.not_run
                    .push(format!("not run: {} ({why})", short_name(&test.name)));
            } else if let Some(reason) = test
                .stdout
                .iter()
                .filter_map(|l| not_exercised(l))
                .map(|(reason, _)| reason)
                .next()
                .or_else(|| {
                    named
                        .iter()
                        .find(|(name, _)| is_named(&test.name, name))
                        .map(|(_, reason)| reason.clone())
                })
            {
                unexercised += 1;
                bump(&mut self.unexercised, &reason);
            }
        }
        let mut failed = parsed.failed;
        if !success && (!parsed.summary_found || failed == 0) {
            // A build error, or a runner that died before its summary.
            failed += 1;
            self.note = "the run failed before its summary".to_owned();
        }
        if (failed > 0 && failures.is_empty()) || (!success && !parsed.summary_found) {
            // Nothing pins it to a test: all of it is the failure.
            failures = vec![Failure {
                name: what.to_owned(),
                lines: lines.iter().map(|l| strip_ansi(l)).collect(),
            }];
        }
        self.passed += parsed
            .passed
            .saturating_sub(skipped + unexercised + inapplicable);
        self.skipped += skipped.min(parsed.passed);
        self.not_exercised += unexercised.min(parsed.passed.saturating_sub(skipped));
        self.not_applicable +=
            inapplicable.min(parsed.passed.saturating_sub(skipped + unexercised));
        self.failed += failed;
        self.failures.extend(failures);
        self.closing.extend(parsed.closing);
    }

    /// The counts and time, for the row's progress line.
    pub fn outcome(&self) -> String {
        format!(
            "{:>5} passed {:>3} failed {:>4} skipped {:>4} not exercised {:>4} n/a {:>8}{}",
            self.passed,
            self.failed,
            self.skipped,
            self.not_exercised,
            self.not_applicable,
            seconds(self.secs),
            if self.failed > 0 { "  FAILED" } else { "" }
        )
    }

    /// The lines under the row's progress line: why it skipped, why tests
    /// were not exercised, which were not run, and its note.
    pub fn details(&self) -> Vec<String> {
        let mut out = Vec::new();
        const SHOWN: usize = 6;
        for (reason, n) in self.skips.iter().take(SHOWN) {
            out.push(format!("skipped {n:>3} × {}", clip(reason, 110)));
        }
        if self.skips.len() > SHOWN {
            out.push(format!(
                "skipped for {} other reasons (see the log)",
                self.skips.len() - SHOWN
            ));
        }
        for (reason, n) in self.partly.iter().take(SHOWN) {
            out.push(format!(
                "{n} passing test{} skipped a part: {}",
                if *n == 1 { "" } else { "s" },
                clip(reason, 90)
            ));
        }
        for (reason, n) in self.unexercised.iter().take(SHOWN) {
            out.push(format!("not exercised {n:>3} × {}", clip(reason, 100)));
        }
        if self.unexercised.len() > SHOWN {
            out.push(format!(
                "not exercised for {} other reasons (see the log)",
                self.unexercised.len() - SHOWN
            ));
        }
        out.extend(self.not_run.iter().cloned());
        for (reason, n) in self.inapplicable.iter().take(SHOWN) {
            out.push(format!("not applicable {n:>3} × {}", clip(reason, 100)));
        }
        if !self.note.is_empty() {
            out.push(self.note.clone());
        }
        out
    }
}

/// A test's name without nextest's binary prefix (`scope-cubecl::runtime_wgpu
/// wgpu::x` → `wgpu::x`).
fn short_name(name: &str) -> &str {
    name.rsplit_once(' ').map_or(name, |(_, test)| test)
}

/// Whether the runner's `name` for a test is the libtest name `test`
/// (nextest puts the binary before it).
fn is_named(name: &str, test: &str) -> bool {
    short_name(name) == test
}

/// `text`, cut to `chars` characters with an ellipsis: a skip reason can
/// list every path a loader tried, which the log keeps whole.
pub fn clip(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(chars.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// `12.3 s`, or minutes past ten of them.
pub fn seconds(secs: f64) -> String {
    if secs >= 600.0 {
        format!("{:.1} min", secs / 60.0)
    } else {
        format!("{secs:.1} s")
    }
}

/// The summary table, with each row's wall time, and whether everything
/// passed. `extra` rows carry a time only (the build).
pub fn summary(rows: &[Counts], extra: &[(&str, f64, &str)], log: Option<&str>) -> (String, bool) {
    let mut out = String::new();
    out.push_str("\ntest summary\n");
    let width = rows
        .iter()
        .map(|r| r.name.len())
        .chain(extra.iter().map(|e| e.0.len()))
        .max()
        .unwrap_or(0)
        .max(14);
    let line = |name: &str, [p, f, s, n, a]: [&str; 5], t: &str, note: &str| {
        format!("{name:<width$} {p:>7} {f:>7} {s:>8} {n:>14} {a:>6} {t:>9}  {note}")
            .trim_end()
            .to_owned()
            + "\n"
    };
    out.push_str(&line(
        "row",
        ["passed", "failed", "skipped", "not exercised", "n/a"],
        "time",
        "note",
    ));
    out.push_str(&line(
        &"-".repeat(width),
        ["-------", "-------", "--------", "--------------", "------"],
        "---------",
        "----",
    ));
    let (mut passed, mut failed, mut skipped, mut unexercised, mut secs) = (0, 0, 0, 0, 0.0);
    let mut inapplicable = 0;
    for row in rows {
        let note = if row.note.is_empty() {
            row.skips
                .first()
                .map(|(reason, _)| {
                    let more = if row.skips.len() > 1 {
                        " (and more)"
                    } else {
                        ""
                    };
                    format!("skipped: {}{more}", clip(reason, 60))
                })
                .unwrap_or_default()
        } else {
            clip(&row.note, 80)
        };
        out.push_str(&line(
            &row.name,
            [
                &row.passed.to_string(),
                &row.failed.to_string(),
                &row.skipped.to_string(),
                &row.not_exercised.to_string(),
                &row.not_applicable.to_string(),
            ],
            &seconds(row.secs),
            &note,
        ));
        passed += row.passed;
        failed += row.failed;
        skipped += row.skipped;
        unexercised += row.not_exercised;
        inapplicable += row.not_applicable;
        secs += row.secs;
    }
    for (name, t, note) in extra {
        out.push_str(&line(name, ["", "", "", "", ""], &seconds(*t), note));
        secs += t;
    }
    out.push_str(&line(
        "total",
        [
            &passed.to_string(),
            &failed.to_string(),
            &skipped.to_string(),
            &unexercised.to_string(),
            &inapplicable.to_string(),
        ],
        &seconds(secs),
        "",
    ));
    out.push_str(
        "(skipped: the test printed `skipped: <reason>` and returned; counted once, not as passed)\n",
    );
    out.push_str(
        "(not exercised: the test printed `not exercised: <reason>` or `not run: <reason>`, \
         having done nothing on its device; not counted as passed)\n",
    );
    out.push_str(
        "(n/a: the test printed `not applicable: <reason>`: its suite cannot have what it needs, \
         by design; not counted as passed)\n",
    );
    if let Some(log) = log {
        out.push_str(&format!("every test's output: {log}\n"));
    }
    out.push_str(&format!(
        "\n{passed} passed, {failed} failed, {skipped} skipped, {unexercised} not exercised, \
         {inapplicable} not applicable\n"
    ));
    (out, failed == 0)
}
