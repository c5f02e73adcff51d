//! Reading what a test runner printed: which tests passed, failed or
//! skipped, and why; and the lines a person reads about it.
//!
//! A device test with nothing to run on passes after printing one line,
//! `skipped: <reason>` (`skipped: no vulkan device (…)`, `skipped:
//! VK_LAYER_KHRONOS_validation is not installed`). The runner counts it as a
//! pass; this module finds those lines **in each test's own output** and
//! counts the test once as skipped, with its reason, whatever the reason
//! says. A test that goes on to print something of its own after its skip
//! lines ran something (a test that compares every server present and skips
//! the absent ones): it stays a pass, and its skip reasons are listed as
//! parts skipped.
//!
//! A test that ran but did nothing on its device says so too, and is counted
//! apart, as **not exercised**, never as passed: `not exercised: <reason>`
//! (cubecl's runtime tests print `not exercised: nothing reached the device
//! [<test>]` when they returned early for a feature the device lacks; see
//! `crates/scope-cubecl/tests/common/mod.rs`), or `not run: <reason>` for a
//! test its binary marks as not holding on this device. The first is
//! printed (to stderr) as the test's thread ends, after libtest stopped
//! capturing its output, so under plain libtest it stands outside the
//! test's block, and under nextest in its stderr: the name in brackets says
//! whose it is.
//!
//! Each test's output is found in the runner's own framing:
//!
//! - nextest, with `--success-output immediate --failure-output immediate`:
//!   a status line (`PASS [ 0.004s] (1/5) crate::binary test`) followed by
//!   its `stdout ───` and `stderr ───` blocks (older nextest: `──── STDOUT:
//!   crate::binary test`), and a closing `Summary [ … ] N tests run: …`;
//! - a libtest binary with `--show-output`: `test name ... ok` lines, then
//!   one `---- name stdout ----` block per test that printed anything, in
//!   its `successes:` and `failures:` sections, and `test result: …`.

/// The reason in a skip line: `skipped: <reason>` at the start of a line
/// (after indentation), with a reason. Case-insensitive in `skipped`; a
/// `skipped:` later in a line (a log message, an assertion's text) is not
/// one.
pub fn skip_reason(line: &str) -> Option<String> {
    let line = strip_ansi_ref(line);
    let trimmed = line.trim();
    let head = trimmed.get(..8)?;
    if !head.eq_ignore_ascii_case("skipped:") {
        return None;
    }
    let reason = trimmed[8..].trim();
    (!reason.is_empty()).then(|| reason.to_owned())
}

/// A line that says its test did nothing on the device: `not exercised:
/// <reason>`, optionally ending in the test's name in brackets
/// (`not exercised: nothing reached the device [wgpu::plane::sum]`), at the
/// start of a line (after indentation) → (reason, name).
pub fn not_exercised(line: &str) -> Option<(String, Option<String>)> {
    let line = strip_ansi_ref(line);
    let rest = after_label(line.trim(), "not exercised:")?;
    if let Some(open) = rest.rfind('[')
        && let Some(name) = rest[open + 1..].strip_suffix(']')
        && !name.is_empty()
    {
        let reason = rest[..open].trim();
        return (!reason.is_empty()).then(|| (reason.to_owned(), Some(name.to_owned())));
    }
    Some((rest.to_owned(), None))
}

/// The reason in a `not run: <reason>` line: a test its binary marks as not
/// holding on this device.
pub fn not_run_reason(line: &str) -> Option<String> {
    let line = strip_ansi_ref(line);
    after_label(line.trim(), "not run:").map(str::to_owned)
}

/// What follows `label` (any case) at the start of `trimmed`, when there is
/// something.
fn after_label<'a>(trimmed: &'a str, label: &str) -> Option<&'a str> {
    let head = trimmed.get(..label.len())?;
    if !head.eq_ignore_ascii_case(label) {
        return None;
    }
    let rest = trimmed[label.len()..].trim();
    (!rest.is_empty()).then_some(rest)
}

/// `line` without its ANSI colour and style sequences (a runner told to
/// colour its output through `CARGO_TERM_COLOR=always`).
pub fn strip_ansi(line: &str) -> String {
    if !line.contains('\u{1b}') {
        return line.to_owned();
    }
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'[') {
            chars.next();
            // Parameters and intermediates, up to the final byte.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else {
            chars.next();
        }
    }
    out
}

fn strip_ansi_ref(line: &str) -> std::borrow::Cow<'_, str> {
    if line.contains('\u{1b}') {
        std::borrow::Cow::Owned(strip_ansi(line))
    } else {
        std::borrow::Cow::Borrowed(line)
    }
}

/// One test, as its runner reported it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Test {
    /// Its name (nextest: binary id and test name).
    pub name: String,
    /// Whether it passed.
    pub passed: bool,
    /// What it printed to stdout, without the runner's indentation.
    pub stdout: Vec<String>,
    /// Its status line and output blocks as the runner printed them, for
    /// a failure shown in full.
    pub raw: Vec<String>,
}

/// What one runner invocation printed, read.
#[derive(Clone, Debug, Default)]
pub struct Parsed {
    /// The tests whose status line was found.
    pub tests: Vec<Test>,
    /// Passed, by the runner's closing counts.
    pub passed: u64,
    /// Failed (and timed out), by the runner's closing counts.
    pub failed: u64,
    /// Whether a closing count was found at all.
    pub summary_found: bool,
    /// The closing lines, verbatim.
    pub closing: Vec<String>,
}

impl Parsed {
    fn upsert(&mut self, name: &str, passed: bool, status: &str) -> usize {
        // A retried test reports again: its last attempt counts.
        let test = Test {
            name: name.to_owned(),
            passed,
            stdout: Vec::new(),
            raw: vec![status.to_owned()],
        };
        match self.tests.iter().position(|t| t.name == name) {
            Some(i) => {
                self.tests[i] = test;
                i
            }
            None => {
                self.tests.push(test);
                self.tests.len() - 1
            }
        }
    }
}

/// The number before `word` in `text` ("12 passed" → 12).
pub fn number_before(text: &str, word: &str) -> Option<u64> {
    let at = text.find(word)?;
    text[..at]
        .split(|c: char| !c.is_ascii_digit())
        .rev()
        .find(|s| !s.is_empty())?
        .parse()
        .ok()
}

/// nextest's status words that do not end a test (progress, retries
/// about to start, setup scripts).
const NOT_FINAL: [&str; 10] = [
    "SLOW",
    "START",
    "RETRY",
    "SETUP",
    "TERMINATING",
    "KILLING",
    "CANCEL",
    "INFO",
    "RUNNING",
    "SKIP",
];

/// A nextest status line: `PASS [   0.004s] (1/5) crate::binary test` (the
/// counter is absent in older nextest) → (`PASS`, `crate::binary test`).
fn nextest_status(trimmed: &str) -> Option<(&str, &str)> {
    let open = trimmed.find('[')?;
    let word = trimmed[..open].trim();
    if word.is_empty()
        || !word
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == ' ' || c == '-')
        || !word.chars().next().is_some_and(|c| c.is_ascii_uppercase())
    {
        return None;
    }
    let close = open + trimmed[open..].find(']')?;
    let mut rest = trimmed[close + 1..].trim_start();
    if let Some(counter) = rest.strip_prefix('(')
        && let Some(end) = counter.find(')')
        && counter[..end]
            .chars()
            .all(|c| c.is_ascii_digit() || c == '/' || c == ' ')
    {
        rest = counter[end + 1..].trim_start();
    }
    let name = rest.trim();
    (!name.is_empty()).then_some((word, name))
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Stream {
    Stdout,
    Stderr,
}

/// A nextest output block's header: `stdout ───` / `stderr ───` (current),
/// `──── STDOUT:  crate::binary test` (older), or a combined `output ───`.
fn nextest_block(trimmed: &str) -> Option<Stream> {
    let lower = trimmed.to_ascii_lowercase();
    let word = if lower.starts_with('─') {
        // "──── STDOUT:   name"
        let label = lower.trim_start_matches('─').trim_start();
        label.split(':').next().filter(|_| label.contains(':'))?
    } else {
        // "stdout ───"
        let (word, bar) = lower.split_once(' ')?;
        if !bar.trim().starts_with('─') {
            return None;
        }
        word
    };
    match word {
        "stdout" | "output" => Some(Stream::Stdout),
        "stderr" => Some(Stream::Stderr),
        _ => None,
    }
}

fn is_rule(trimmed: &str) -> bool {
    trimmed.chars().count() >= 3 && trimmed.chars().all(|c| c == '─')
}

/// Read `cargo nextest run` output (see the module's documentation).
pub fn parse_nextest(lines: &[String]) -> Parsed {
    let mut parsed = Parsed::default();
    let mut current: Option<usize> = None;
    let mut stream: Option<Stream> = None;
    for line in lines {
        let line = strip_ansi_ref(line);
        let trimmed = line.trim();
        if trimmed.starts_with("Summary") && trimmed.contains("run:") {
            // "Summary [   1.2s] 40 tests run: 39 passed, 1 failed, 2 skipped"
            let tail = &trimmed[trimmed.find("run:").unwrap_or(0)..];
            parsed.passed += number_before(tail, " passed").unwrap_or(0);
            parsed.failed += number_before(tail, " failed").unwrap_or(0)
                + number_before(tail, " timed out").unwrap_or(0);
            parsed.summary_found = true;
            parsed.closing.push(trimmed.to_owned());
            // What follows repeats the failures' status lines.
            current = None;
            stream = None;
            continue;
        }
        if parsed.summary_found {
            continue;
        }
        if let Some((word, name)) = nextest_status(trimmed) {
            stream = None;
            let last = word.rsplit(' ').next().unwrap_or(word);
            current = (!NOT_FINAL.contains(&last))
                .then(|| parsed.upsert(name, matches!(last, "PASS" | "LEAK" | "FLAKY"), &line));
            continue;
        }
        if let Some(s) = nextest_block(trimmed) {
            stream = Some(s);
            if let Some(i) = current {
                parsed.tests[i].raw.push(line.clone().into_owned());
            }
            continue;
        }
        if is_rule(trimmed) {
            current = None;
            stream = None;
            continue;
        }
        if let (Some(i), Some(s)) = (current, stream) {
            let test = &mut parsed.tests[i];
            test.raw.push(line.clone().into_owned());
            if s == Stream::Stdout {
                test.stdout
                    .push(line.strip_prefix("    ").unwrap_or(&line).to_owned());
            }
        }
    }
    parsed
}

/// A libtest status line: `test name ... ok` → (`name`, `ok`).
fn libtest_status(line: &str) -> Option<(&str, &str)> {
    let rest = line.strip_prefix("test ")?;
    let (name, result) = rest.rsplit_once(" ... ")?;
    Some((name.trim(), result.trim()))
}

/// Read a libtest binary's output, run with `--show-output` (see the
/// module's documentation). Several binaries' outputs one after another
/// (`cargo test --doc`) read as one.
pub fn parse_libtest(lines: &[String]) -> Parsed {
    let mut parsed = Parsed::default();
    // Blocks by test name: (raw, stdout).
    let mut blocks: Vec<(String, Vec<String>)> = Vec::new();
    let mut block: Option<usize> = None;
    for line in lines {
        let line = strip_ansi_ref(line);
        let trimmed = line.trim_end();
        if let Some(name) = trimmed
            .strip_prefix("---- ")
            .and_then(|r| r.strip_suffix(" stdout ----"))
        {
            blocks.push((name.to_owned(), vec![trimmed.to_owned()]));
            block = Some(blocks.len() - 1);
            continue;
        }
        if trimmed == "successes:" || trimmed == "failures:" {
            block = None;
            continue;
        }
        if let Some(i) = block {
            blocks[i].1.push(trimmed.to_owned());
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix("test result:") {
            // "test result: ok. 5 passed; 0 failed; 1 ignored; ..."
            parsed.passed += number_before(rest, " passed").unwrap_or(0);
            parsed.failed += number_before(rest, " failed").unwrap_or(0);
            parsed.summary_found = true;
            parsed.closing.push(trimmed.to_owned());
            continue;
        }
        if let Some((name, result)) = libtest_status(trimmed) {
            if result == "ok" {
                parsed.upsert(name, true, trimmed);
            } else if result.starts_with("FAILED") {
                parsed.upsert(name, false, trimmed);
            }
        }
    }
    for (name, block) in blocks {
        if let Some(test) = parsed.tests.iter_mut().find(|t| t.name == name) {
            // The header stays in `raw` only; a block ends with a blank line.
            test.stdout.extend(block.iter().skip(1).cloned());
            test.raw.extend(block);
        }
    }
    parsed
}

/// What a passing test's output says about skipping.
#[derive(Clone, Debug, PartialEq)]
pub enum Skip {
    /// No skip line: a plain pass.
    None,
    /// It printed its skip lines and nothing of its own after them: a skip,
    /// for these reasons.
    Whole(String),
    /// It printed skip lines and then ran something: a pass, with these
    /// parts skipped.
    Partly(Vec<String>),
}

/// A line a runner prints around a test's own output (nextest shows a
/// test's whole libtest output), or a blank one.
fn is_framing(line: &str) -> bool {
    let t = line.trim();
    t.is_empty()
        || t.starts_with("test result:")
        || t == "successes:"
        || t == "failures:"
        || (t.starts_with("running ") && (t.ends_with(" test") || t.ends_with(" tests")))
        || libtest_status(t).is_some()
}

/// Whether `stdout`, a passing test's output, makes it a skip.
pub fn classify(stdout: &[String]) -> Skip {
    let mut reasons: Vec<String> = Vec::new();
    let mut last = None;
    for (i, line) in stdout.iter().enumerate() {
        if let Some(reason) = skip_reason(line) {
            if !reasons.contains(&reason) {
                reasons.push(reason);
            }
            last = Some(i);
        }
    }
    let Some(last) = last else {
        return Skip::None;
    };
    if stdout[last + 1..].iter().all(|l| is_framing(l)) {
        Skip::Whole(reasons.join("; "))
    } else {
        Skip::Partly(reasons)
    }
}

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
            if let Some(why) = test.stdout.iter().find_map(|l| not_run_reason(l)) {
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
        self.passed += parsed.passed.saturating_sub(skipped + unexercised);
        self.skipped += skipped.min(parsed.passed);
        self.not_exercised += unexercised.min(parsed.passed.saturating_sub(skipped));
        self.failed += failed;
        self.failures.extend(failures);
        self.closing.extend(parsed.closing);
    }

    /// The counts and time, for the row's progress line.
    pub fn outcome(&self) -> String {
        format!(
            "{:>5} passed {:>3} failed {:>4} skipped {:>4} not exercised {:>8}{}",
            self.passed,
            self.failed,
            self.skipped,
            self.not_exercised,
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
    let line = |name: &str, [p, f, s, n]: [&str; 4], t: &str, note: &str| {
        format!("{name:<width$} {p:>7} {f:>7} {s:>8} {n:>14} {t:>9}  {note}")
            .trim_end()
            .to_owned()
            + "\n"
    };
    out.push_str(&line(
        "row",
        ["passed", "failed", "skipped", "not exercised"],
        "time",
        "note",
    ));
    out.push_str(&line(
        &"-".repeat(width),
        ["-------", "-------", "--------", "--------------"],
        "---------",
        "----",
    ));
    let (mut passed, mut failed, mut skipped, mut unexercised, mut secs) = (0, 0, 0, 0, 0.0);
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
            ],
            &seconds(row.secs),
            &note,
        ));
        passed += row.passed;
        failed += row.failed;
        skipped += row.skipped;
        unexercised += row.not_exercised;
        secs += row.secs;
    }
    for (name, t, note) in extra {
        out.push_str(&line(name, ["", "", "", ""], &seconds(*t), note));
        secs += t;
    }
    out.push_str(&line(
        "total",
        [
            &passed.to_string(),
            &failed.to_string(),
            &skipped.to_string(),
            &unexercised.to_string(),
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
    if let Some(log) = log {
        out.push_str(&format!("every test's output: {log}\n"));
    }
    out.push_str(&format!(
        "\n{passed} passed, {failed} failed, {skipped} skipped, {unexercised} not exercised\n"
    ));
    (out, failed == 0)
}

#[cfg(test)]
mod checks {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn skip_lines_are_the_projects_convention_at_the_start_of_a_line() {
        assert_eq!(
            skip_reason("skipped: no vulkan device (no loader)").as_deref(),
            Some("no vulkan device (no loader)")
        );
        assert_eq!(
            skip_reason("    skipped: VK_LAYER_KHRONOS_validation is not installed").as_deref(),
            Some("VK_LAYER_KHRONOS_validation is not installed")
        );
        assert_eq!(
            skip_reason("Skipped: no cuda device").as_deref(),
            Some("no cuda device")
        );
        assert_eq!(
            skip_reason("\u{1b}[1mskipped: no hip device\u{1b}[0m").as_deref(),
            Some("no hip device")
        );
        // Not one: no reason, or `skipped:` inside another message.
        assert_eq!(skip_reason("skipped:").as_deref(), None);
        assert_eq!(skip_reason("skipped: ").as_deref(), None);
        assert_eq!(
            skip_reason("DEBUG scope: skipped: input carries fill failed").as_deref(),
            None
        );
        assert_eq!(
            skip_reason("assertion failed: skipped: 3: copy out of range").as_deref(),
            None
        );
        assert_eq!(skip_reason("vulkan: skipped (no adapter)").as_deref(), None);
        assert_eq!(skip_reason("skip").as_deref(), None);
    }

    #[test]
    fn a_skip_is_a_test_that_printed_its_reason_and_returned() {
        assert_eq!(classify(&lines("hello\nworld")), Skip::None);
        assert_eq!(
            classify(&lines(
                "\nrunning 1 test\nskipped: no vulkan device (x)\ntest a ... ok\n\n\
                 test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 5 filtered out\n"
            )),
            Skip::Whole("no vulkan device (x)".to_owned())
        );
        // Two servers absent, one test: one skip, both reasons.
        assert_eq!(
            classify(&lines("skipped: no cuda device\nskipped: no hip device")),
            Skip::Whole("no cuda device; no hip device".to_owned())
        );
        // It went on to compare what was there: a pass with parts skipped.
        assert_eq!(
            classify(&lines(
                "skipped: no cuda device (x)\nskipped: no hip device (y)\nservers compared: [\"wgpu gl\"]"
            )),
            Skip::Partly(vec![
                "no cuda device (x)".to_owned(),
                "no hip device (y)".to_owned()
            ])
        );
    }

    /// nextest 0.9.143's output, cut down from a real run: a plain pass, a
    /// skip with a reason that names no device, a partial skip, and a
    /// failure with its stdout and stderr.
    const NEXTEST: &str = "\
────────────
 Nextest run ID 6d8cab41 with nextest profile: default
    Starting 5 tests across 1 binary (1 test skipped)
        PASS [   0.004s] (1/5) server-vulkan::vulkan plain
  stdout ───

    running 1 test
    test plain ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 40 filtered out; finished in 0.00s

        PASS [   0.006s] (2/5) server-vulkan::vulkan a_validation_message_is_collected_and_fails_the_test
  stdout ───

    running 1 test
    skipped: VK_LAYER_KHRONOS_validation is not installed
    test a_validation_message_is_collected_and_fails_the_test ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 40 filtered out; finished in 0.00s

  stderr ───
    WARNING: lavapipe is not a conformant vulkan implementation, testing use only.

        PASS [   0.005s] (3/5) server-vulkan::vulkan probe_lists_the_devices
  stdout ───

    running 1 test
    skipped: no vulkan device (Some(\"no loader\"))
    test probe_lists_the_devices ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 40 filtered out; finished in 0.00s

        SLOW [> 60.000s] scope-cube::servers every_server_computes_the_same
        PASS [  61.005s] (4/5) scope-cube::servers every_server_computes_the_same
  stdout ───

    running 1 test
    skipped: no cuda device (libcuda.so.1 not found)
    servers compared: [\"vulkan spir-v\"]
    test every_server_computes_the_same ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 61.00s

        FAIL [   0.094s] (5/5) server-vulkan::vulkan fails
  stdout ───

    running 1 test
    before
    test fails ... FAILED

  stderr ───

    thread 'fails' panicked at tests/vulkan.rs:7:46:
    boom

────────────
     Summary [  61.102s] 5 tests run: 4 passed (1 slow), 1 failed, 1 skipped
        FAIL [   0.094s] (5/5) server-vulkan::vulkan fails
error: test run failed";

    #[test]
    fn nextest_output_is_read_test_by_test() {
        let parsed = parse_nextest(&lines(NEXTEST));
        assert!(parsed.summary_found);
        assert_eq!((parsed.passed, parsed.failed), (4, 1));
        let names: Vec<&str> = parsed.tests.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "server-vulkan::vulkan plain",
                "server-vulkan::vulkan a_validation_message_is_collected_and_fails_the_test",
                "server-vulkan::vulkan probe_lists_the_devices",
                "scope-cube::servers every_server_computes_the_same",
                "server-vulkan::vulkan fails",
            ]
        );
        let validation = &parsed.tests[1];
        assert!(validation.passed);
        assert!(validation.stdout.iter().all(|l| !l.contains("lavapipe")));
        let failure = &parsed.tests[4];
        assert!(!failure.passed);
        assert!(failure.raw[0].contains("FAIL"));
        assert!(failure.raw.iter().any(|l| l.contains("boom")));
        assert!(failure.raw.iter().any(|l| l.contains("before")));

        let mut row = Counts::new("vulkan");
        row.add("cargo nextest run", false, &lines(NEXTEST), true);
        assert_eq!((row.passed, row.failed, row.skipped), (2, 1, 2));
        assert_eq!(
            row.skips,
            [
                ("VK_LAYER_KHRONOS_validation is not installed".to_owned(), 1),
                ("no vulkan device (Some(\"no loader\"))".to_owned(), 1),
            ]
        );
        assert_eq!(
            row.partly,
            [("no cuda device (libcuda.so.1 not found)".to_owned(), 1)]
        );
        assert_eq!(row.failures.len(), 1);
        assert_eq!(row.failures[0].name, "server-vulkan::vulkan fails");
        assert!(row.note.is_empty(), "{}", row.note);
    }

    #[test]
    fn older_nextest_blocks_and_colour_are_read_too() {
        let old = "\
        \u{1b}[32;1mPASS\u{1b}[0m [   0.004s] nxt t::skips
──── STDOUT:             nxt t::skips
skipped: no wgpu device (no adapter)
──── STDERR:             nxt t::skips
skipped: this is stderr and does not count
        PASS [   0.004s] nxt t::plain
────────────
     \u{1b}[1mSummary\u{1b}[0m [   0.102s] 2 tests run: 2 passed, 0 skipped";
        let mut row = Counts::new("wgpu");
        row.add("cargo nextest run", true, &lines(old), true);
        assert_eq!((row.passed, row.failed, row.skipped), (1, 0, 1));
        assert_eq!(row.skips, [("no wgpu device (no adapter)".to_owned(), 1)]);
    }

    /// A test binary run with `--show-output`, as libtest prints it.
    const LIBTEST: &str = "\
running 6 tests
test t::ign ... ignored
test t::noisy ... ok
test t::partial ... ok
test t::plain ... ok
test t::skips ... ok
test t::fails ... FAILED

successes:

---- t::noisy stdout ----
hello
warn

---- t::partial stdout ----
skipped: no cuda device (x)
servers compared: [a]

---- t::skips stdout ----
skipped: no vulkan device (no loader)


successes:
    t::noisy
    t::partial
    t::plain
    t::skips

failures:

---- t::fails stdout ----
before

thread 't::fails' (12286) panicked at src/lib.rs:7:46:
boom
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace


failures:
    t::fails

test result: FAILED. 4 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.10s
";

    #[test]
    fn libtest_output_is_read_test_by_test() {
        let parsed = parse_libtest(&lines(LIBTEST));
        assert_eq!((parsed.passed, parsed.failed), (4, 1));
        assert_eq!(parsed.tests.len(), 5, "{:?}", parsed.tests);
        let skips = parsed.tests.iter().find(|t| t.name == "t::skips").unwrap();
        assert_eq!(
            classify(&skips.stdout),
            Skip::Whole("no vulkan device (no loader)".into())
        );
        let mut row = Counts::new("core");
        row.add("target/debug/deps/core-1", false, &lines(LIBTEST), false);
        assert_eq!((row.passed, row.failed, row.skipped), (3, 1, 1));
        assert_eq!(row.partly, [("no cuda device (x)".to_owned(), 1)]);
        assert_eq!(row.failures.len(), 1);
        let failure = &row.failures[0];
        assert_eq!(failure.name, "t::fails");
        assert_eq!(failure.lines[0], "test t::fails ... FAILED");
        assert!(failure.lines.iter().any(|l| l == "boom"));
    }

    #[test]
    fn a_run_that_died_is_one_failure_shown_whole() {
        let crashed = lines(
            "running 3 tests\ntest a ... ok\nerror: process didn't exit successfully (signal: 11, SIGSEGV)",
        );
        let mut row = Counts::new("wgpu");
        row.add("target/debug/deps/wgpu-1", false, &crashed, false);
        assert_eq!((row.passed, row.failed), (0, 1));
        assert_eq!(row.failures.len(), 1);
        assert_eq!(row.failures[0].name, "target/debug/deps/wgpu-1");
        assert_eq!(row.failures[0].lines.len(), 3);
        assert_eq!(row.note, "the run failed before its summary");
    }

    #[test]
    fn unrecognised_framing_falls_back_to_counting_skip_lines() {
        let odd = lines("skipped: no cuda device (x)\n  Summary [ 1.0s] 3 tests run: 3 passed");
        let mut row = Counts::new("cuda");
        row.add("cargo nextest run", true, &odd, true);
        assert_eq!((row.passed, row.failed, row.skipped), (2, 0, 1));
        assert!(row.note.contains("counted by line"));
    }

    #[test]
    fn long_reasons_are_clipped_for_the_terminal() {
        assert_eq!(clip("no cuda device", 20), "no cuda device");
        assert_eq!(
            clip("no cuda device (searched a, b, c)", 17),
            "no cuda device (…"
        );
        let mut row = Counts::new("cuda");
        row.skips = vec![(
            format!("no cuda device ({})", "libcuda.so, ".repeat(20)),
            53,
        )];
        let details = row.details();
        assert!(details[0].starts_with("skipped  53 × no cuda device (libcuda.so, "));
        assert!(details[0].ends_with('…') && details[0].chars().count() < 130);
    }

    #[test]
    fn the_summary_has_each_rows_time_and_the_totals() {
        let mut core = Counts::new("core");
        core.passed = 412;
        core.secs = 58.25;
        let mut vulkan = Counts::new("vulkan");
        vulkan.passed = 37;
        vulkan.skipped = 3;
        vulkan.secs = 48.0;
        vulkan.skips = vec![("VK_LAYER_KHRONOS_validation is not installed".into(), 3)];
        let (text, ok) = summary(
            &[core, vulkan],
            &[("build", 812.0, "cargo test --no-run")],
            Some("target/xtask/test.log"),
        );
        assert!(ok);
        assert!(
            text.contains("core               412       0        0              0    58.2 s"),
            "{text}"
        );
        assert!(text.contains("skipped: VK_LAYER_KHRONOS_validation is not installed"));
        assert!(
            text.contains(
                "build                                                   13.5 min  cargo test --no-run"
            ),
            "{text}"
        );
        assert!(
            text.contains("total              449       0        3              0  15.3 min"),
            "{text}"
        );
        assert!(text.contains("449 passed, 0 failed, 3 skipped, 0 not exercised"));
        assert!(text.contains("target/xtask/test.log"));
    }

    #[test]
    fn a_not_exercised_line_gives_its_reason_and_may_name_its_test() {
        assert_eq!(
            not_exercised("not exercised: nothing reached the device [wgpu::f32_ty::test_x]"),
            Some((
                "nothing reached the device".to_owned(),
                Some("wgpu::f32_ty::test_x".to_owned())
            ))
        );
        assert_eq!(
            not_exercised("    not exercised: nothing reached the device"),
            Some(("nothing reached the device".to_owned(), None))
        );
        assert_eq!(
            not_exercised("\u{1b}[1mNot exercised: no plane ops [t]\u{1b}[0m"),
            Some(("no plane ops".to_owned(), Some("t".to_owned())))
        );
        // Not one: no reason, or the words inside another message.
        assert_eq!(not_exercised("not exercised:"), None);
        assert_eq!(not_exercised("not exercised: [t]"), None);
        assert_eq!(not_exercised("INFO x: not exercised: y"), None);
        assert_eq!(
            not_run_reason("not run: GLSL's % of a negative operand").as_deref(),
            Some("GLSL's % of a negative operand")
        );
        assert_eq!(not_run_reason("not run:").as_deref(), None);
        assert_eq!(not_run_reason("test a ... not run: x").as_deref(), None);
    }

    /// nextest runs each test in a process of its own, so the verdict a
    /// runtime test prints (to stderr) as its thread ends is in its own
    /// output; one printed by a thread the test spawned is in its stdout.
    const NEXTEST_UNEXERCISED: &str = "\
        PASS [   0.041s] (1/5) scope-cubecl::runtime_wgpu wgpu::f32_ty::test_plane_sum_vec1
  stdout ───

    running 1 test
    test wgpu::f32_ty::test_plane_sum_vec1 ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 388 filtered out; finished in 0.02s

  stderr ───
    not exercised: nothing reached the device [wgpu::f32_ty::test_plane_sum_vec1]

        PASS [   0.043s] (2/5) scope-cubecl::runtime_wgpu wgpu::f32_ty::test_plane_max_vec1
  stdout ───

    running 1 test
    test wgpu::f32_ty::test_plane_max_vec1 ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 388 filtered out; finished in 0.02s

  stderr ───
    not exercised: nothing reached the device [wgpu::f32_ty::test_plane_max_vec1]

        PASS [   0.052s] (3/5) scope-cubecl::runtime_wgpu wgpu::binary_untyped::test_signed_remainder
  stdout ───

    running 1 test
    not run: GLSL leaves % of a negative operand undefined
    test wgpu::binary_untyped::test_signed_remainder ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 388 filtered out; finished in 0.03s

        PASS [   0.061s] (4/5) scope-cubecl::runtime_wgpu wgpu::test_a_group_all_reduce_sums_and_averages
  stdout ───

    running 1 test
    not exercised: nothing reached the device
    test wgpu::test_a_group_all_reduce_sums_and_averages ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 388 filtered out; finished in 0.03s

        PASS [   0.210s] (5/5) scope-cubecl::runtime_wgpu wgpu::f32_ty::test_unary_abs
  stdout ───

    running 1 test
    test wgpu::f32_ty::test_unary_abs ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 388 filtered out; finished in 0.19s

────────────
     Summary [   0.450s] 5 tests run: 5 passed, 0 skipped";

    #[test]
    fn tests_that_did_nothing_on_the_device_are_not_exercised_not_passed() {
        let mut row = Counts::new("cubecl on wgpu (gl)");
        row.add("cargo nextest run", true, &lines(NEXTEST_UNEXERCISED), true);
        assert_eq!(
            (row.passed, row.failed, row.skipped, row.not_exercised),
            (1, 0, 0, 4)
        );
        assert_eq!(
            row.unexercised,
            [("nothing reached the device".to_owned(), 3)]
        );
        assert_eq!(
            row.not_run,
            ["not run: wgpu::binary_untyped::test_signed_remainder \
              (GLSL leaves % of a negative operand undefined)"]
        );
        let details = row.details();
        assert!(
            details.contains(&"not exercised   3 × nothing reached the device".to_owned()),
            "{details:?}"
        );
        assert!(
            row.outcome().contains("4 not exercised"),
            "{}",
            row.outcome()
        );
    }

    /// Plain libtest: the verdict comes as the test's thread ends, after
    /// its output was captured, so it stands outside the test's block,
    /// named; one printed by a thread the test spawned is in its block.
    const LIBTEST_UNEXERCISED: &str = "\
running 5 tests
not exercised: nothing reached the device [wgpu::test_cmma_simple_1]
test wgpu::test_cmma_simple_1 ... ok
test wgpu::test_all_gather_concatenates_in_member_order ... ok
test wgpu::f32_ty::test_unary_abs ... ok
not exercised: nothing reached the device [wgpu::test_fails_early]
test wgpu::test_fails_early ... FAILED
test wgpu::binary_untyped::test_ieee_constant_folds ... ok

successes:

---- wgpu::test_all_gather_concatenates_in_member_order stdout ----
not exercised: nothing reached the device

---- wgpu::binary_untyped::test_ieee_constant_folds stdout ----
not run: WGSL may fold NaN


successes:
    wgpu::binary_untyped::test_ieee_constant_folds
    wgpu::f32_ty::test_unary_abs
    wgpu::test_all_gather_concatenates_in_member_order
    wgpu::test_cmma_simple_1

failures:

---- wgpu::test_fails_early stdout ----

thread 'wgpu::test_fails_early' panicked at src/x.rs:1:1:
boom


failures:
    wgpu::test_fails_early

test result: FAILED. 4 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.10s
";

    #[test]
    fn under_libtest_a_verdict_outside_the_block_is_its_named_tests() {
        let mut row = Counts::new("cubecl on vulkan");
        row.add(
            "target/debug/deps/runtime_vulkan-1",
            false,
            &lines(LIBTEST_UNEXERCISED),
            false,
        );
        // The failure stays a failure whatever it printed.
        assert_eq!(
            (row.passed, row.failed, row.skipped, row.not_exercised),
            (1, 1, 0, 3)
        );
        assert_eq!(
            row.unexercised,
            [("nothing reached the device".to_owned(), 2)]
        );
        assert_eq!(
            row.not_run,
            ["not run: wgpu::binary_untyped::test_ieee_constant_folds (WGSL may fold NaN)"]
        );
    }

    #[test]
    fn the_summary_counts_not_exercised_in_a_column_of_its_own() {
        let mut gl = Counts::new("cubecl on wgpu (gl)");
        gl.passed = 250;
        gl.not_exercised = 134;
        gl.secs = 40.0;
        let mut cuda = Counts::new("cubecl on cuda");
        cuda.skipped = 1;
        cuda.note = "skipped: no cuda device".to_owned();
        let (text, ok) = summary(&[gl, cuda], &[], None);
        assert!(ok);
        assert!(
            text.contains("cubecl on wgpu (gl)     250       0        0            134    40.0 s"),
            "{text}"
        );
        assert!(text.contains("250 passed, 0 failed, 1 skipped, 134 not exercised"));
    }
}
