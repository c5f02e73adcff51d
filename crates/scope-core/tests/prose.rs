//! The prose of every crate's sources, measured against its budget.
//!
//! Run it with `cargo test -p scope-core --test prose -- --nocapture`: it
//! prints each crate's figures, then its three worst files.
//!
//! A doc sentence is counted in `///` and `//!` comments only. Code blocks,
//! tables, headings and link definitions are skipped; a list item, a blank
//! line or a sentence's final `.`, `?` or `!` ends a sentence. A word is a
//! whitespace-separated token with a letter or digit in it. A comment line
//! is any line whose trimmed start is `//`.

use std::fmt::Write as _;
use std::path::Path;

mod common;

/// The most words a doc sentence may average, in any crate.
const MAX_MEAN_WORDS: f64 = 15.0;
/// The most words any one doc sentence may have.
const MAX_SENTENCE_WORDS: usize = 40;
/// The largest share of lines that may be comments, in any crate.
const MAX_COMMENT_SHARE: f64 = 0.15;

/// Each crate's budget: the most words a doc sentence may average, and the
/// largest share of comment lines. Lower a row as the docs shrink; never
/// raise one past the house targets above.
const BUDGETS: &[(&str, f64, f64)] = &[
    ("scope-core", 10.5, 0.15),
    ("scope-cube", 12.0, 0.15),
    ("scope-cubecl", 11.0, 0.135),
    ("scope-launch", 12.5, 0.15),
    ("scope-native", 13.5, 0.15),
    ("scope-test", 12.0, 0.14),
    ("server-cuda", 12.0, 0.15),
    ("server-hip", 12.5, 0.15),
    ("server-vulkan", 12.5, 0.145),
    ("server-wgpu", 12.0, 0.15),
    ("tiny-runtime", 11.5, 0.15),
    ("xtask", 14.0, 0.145),
];

/// Tokens that end in a full stop without ending a sentence.
const ABBREVIATIONS: &[&str] = &["e.g.", "i.e.", "etc.", "cf.", "vs.", "approx."];

/// One doc sentence: where it starts and how many words it has.
struct Sentence {
    line: usize,
    words: usize,
}

/// The figures of one file.
struct Figures {
    path: String,
    lines: usize,
    comments: usize,
    sentences: Vec<Sentence>,
}

impl Figures {
    fn words(&self) -> usize {
        self.sentences.iter().map(|s| s.words).sum()
    }

    fn mean(&self) -> f64 {
        ratio(self.words(), self.sentences.len())
    }

    fn share(&self) -> f64 {
        ratio(self.comments, self.lines)
    }

    fn longest(&self) -> usize {
        self.sentences.iter().map(|s| s.words).max().unwrap_or(0)
    }

    fn over(&self) -> usize {
        self.sentences
            .iter()
            .filter(|s| s.words > MAX_SENTENCE_WORDS)
            .count()
    }

    /// How far the file is from its worst target: 1.0 meets them all.
    fn badness(&self) -> f64 {
        (self.mean() / MAX_MEAN_WORDS)
            .max(self.share() / MAX_COMMENT_SHARE)
            .max(self.longest() as f64 / MAX_SENTENCE_WORDS as f64)
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Counts the words of a paragraph's sentences into `out`.
fn split(paragraph: &[(usize, String)], out: &mut Vec<Sentence>) {
    let mut words = 0;
    let mut start = None;
    for (line, text) in paragraph {
        for token in text.split_whitespace() {
            if token.chars().any(char::is_alphanumeric) {
                words += 1;
                start.get_or_insert(*line);
            }
            let bare = token.trim_end_matches([')', '"', '\'', '`', '*', '_', ']']);
            let lower = bare.to_lowercase();
            let stops = bare.ends_with(['.', '?', '!']) && !bare.ends_with("..");
            if stops && !ABBREVIATIONS.contains(&lower.as_str()) && words > 0 {
                out.push(Sentence {
                    line: start.take().unwrap_or(*line),
                    words,
                });
                words = 0;
            }
        }
    }
    if words > 0 {
        out.push(Sentence {
            line: start.unwrap_or(0),
            words,
        });
    }
}

/// Whether a doc line opens a list item; returns the text after the marker.
fn list_item(text: &str) -> Option<&str> {
    for marker in ["- ", "* ", "+ "] {
        if let Some(rest) = text.strip_prefix(marker) {
            return Some(rest);
        }
    }
    let digits = text.len() - text.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    if digits > 0 {
        let rest = &text[digits..];
        if let Some(rest) = rest.strip_prefix(". ").or(rest.strip_prefix(") ")) {
            return Some(rest);
        }
    }
    None
}

/// The figures of one source file.
fn measure(path: String, source: &str) -> Figures {
    let mut figures = Figures {
        path,
        lines: 0,
        comments: 0,
        sentences: Vec::new(),
    };
    let mut paragraph: Vec<(usize, String)> = Vec::new();
    let mut fenced = false;
    for (index, line) in source.lines().enumerate() {
        let number = index + 1;
        figures.lines += 1;
        let trimmed = line.trim_start();
        if trimmed.starts_with("//") {
            figures.comments += 1;
        }
        let doc = ["///", "//!"]
            .iter()
            .find_map(|prefix| trimmed.strip_prefix(prefix))
            .filter(|_| !trimmed.starts_with("////"));
        let Some(doc) = doc else {
            split(&paragraph, &mut figures.sentences);
            paragraph.clear();
            fenced = false;
            continue;
        };
        let text = doc.strip_prefix(' ').unwrap_or(doc);
        let bare = text.trim();
        if bare.starts_with("```") {
            split(&paragraph, &mut figures.sentences);
            paragraph.clear();
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let skipped = bare.is_empty()
            || bare.starts_with('|')
            || bare.starts_with('#')
            || (bare.starts_with('[') && bare.contains("]: "))
            || text.starts_with("    ");
        if skipped {
            split(&paragraph, &mut figures.sentences);
            paragraph.clear();
            continue;
        }
        let text = match list_item(bare) {
            Some(rest) => {
                split(&paragraph, &mut figures.sentences);
                paragraph.clear();
                rest
            }
            None => bare,
        };
        paragraph.push((number, text.to_owned()));
    }
    split(&paragraph, &mut figures.sentences);
    figures
}

/// A line of the report: a file's figures, or the crate's.
fn row(out: &mut String, name: &str, f: &Figures) {
    let _ = writeln!(
        out,
        "{name:<28} {:>6} {:>5.1}% {:>5} {:>6.1} {:>5} {:>5.1}% {:>4}",
        f.lines,
        100.0 * f.share(),
        f.sentences.len(),
        f.mean(),
        f.over(),
        100.0 * ratio(f.over(), f.sentences.len()),
        f.longest(),
    );
}

/// The figures of every `.rs` file under `src`, named from `src`.
fn measure_tree(src: &Path) -> Vec<Figures> {
    let mut paths = Vec::new();
    common::files(src, &mut paths);
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let source = std::fs::read_to_string(path).expect("read a source file");
            let name = path.strip_prefix(src).unwrap_or(path);
            measure(name.display().to_string(), &source)
        })
        .collect()
}

/// The figures of a crate: its files' lines and sentences together.
fn total(name: &str, files: &[Figures]) -> Figures {
    Figures {
        path: name.to_owned(),
        lines: files.iter().map(|f| f.lines).sum(),
        comments: files.iter().map(|f| f.comments).sum(),
        sentences: files
            .iter()
            .flat_map(|f| &f.sentences)
            .map(|s| Sentence {
                line: s.line,
                words: s.words,
            })
            .collect(),
    }
}

/// How much looser than its figure a crate's budget may stay: past this
/// the budget is lowered, so a crate never grows back into slack.
const SLACK_WORDS: f64 = 1.0;
const SLACK_SHARE: f64 = 0.01;

/// The crate a `src` folder belongs to.
fn crate_name(src: &Path) -> String {
    let folder = src
        .parent()
        .and_then(Path::file_name)
        .expect("a crate folder");
    folder.to_string_lossy().into_owned()
}

#[test]
fn every_crates_prose_meets_its_budget() {
    let header = format!(
        "{:<28} {:>6} {:>6} {:>5} {:>6} {:>5} {:>6} {:>4}",
        "crate or file", "lines", "comm", "sent", "mean", ">40", ">40%", "max"
    );
    let mut report = format!("{header}\n");
    let mut failures = Vec::new();
    let crates = common::crates();
    for src in &crates {
        let name = crate_name(src);
        let mut files = measure_tree(src);
        let all = total(&name, &files);
        row(&mut report, &name, &all);
        let Some(&(_, words, share)) = BUDGETS.iter().find(|b| b.0 == name) else {
            failures.push(format!("{name}: no row in BUDGETS"));
            continue;
        };
        assert!(
            words <= MAX_MEAN_WORDS && share <= MAX_COMMENT_SHARE,
            "{name}'s budget is looser than the house targets"
        );
        if all.mean() > words {
            failures.push(format!(
                "{name}: sentences average {:.1} words, over {words}",
                all.mean()
            ));
        }
        if all.share() > share {
            failures.push(format!(
                "{name}: comments are {:.1}% of lines, over {:.1}%",
                100.0 * all.share(),
                100.0 * share
            ));
        }
        if all.mean() + SLACK_WORDS < words || all.share() + SLACK_SHARE < share {
            failures.push(format!(
                "{name}: its budget ({words} words, {:.1}%) is looser than its figures need: lower it",
                100.0 * share
            ));
        }
        for f in &files {
            for s in f.sentences.iter().filter(|s| s.words > MAX_SENTENCE_WORDS) {
                failures.push(format!("{name}/{}:{}: {} words", f.path, s.line, s.words));
            }
        }
        files.sort_by(|a, b| b.badness().total_cmp(&a.badness()));
        for f in files.iter().take(3) {
            row(&mut report, &format!("  {}", f.path), f);
        }
    }
    assert_eq!(
        BUDGETS.len(),
        crates.len(),
        "every row of BUDGETS names a crate of the workspace"
    );
    println!("{report}");
    assert!(
        failures.is_empty(),
        "prose over budget:\n{}",
        failures.join("\n")
    );
}

/// The splitting itself, on a doc comment with every construct it skips.
#[test]
fn sentences_split_as_prose_reads() {
    let source = "\
//! One short sentence. Another, e.g. this one, is longer?
//!
//! # Heading
//! - a list item
//! - another item
//!
//! ```
//! let code = not_prose();
//! ```
//! | a | table |
// a plain comment
fn f() {}
";
    let f = measure("t.rs".into(), source);
    let words: Vec<usize> = f.sentences.iter().map(|s| s.words).collect();
    assert_eq!(words, [3, 6, 3, 2]);
    assert_eq!(f.comments, 11);
    assert_eq!(f.lines, 12);
}
