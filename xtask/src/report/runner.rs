//! The runners' framing: which test each block of output belongs to, and
//! whether it passed, under nextest and under a plain libtest binary; and
//! whether a passing test's own output makes it a skip.

use super::lines::{number_before, skip_reason, strip_ansi_ref};

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
