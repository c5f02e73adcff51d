//! The Rust paths and test binaries a document names in backticks.
//!
//! A path is read wherever code would have one, so a call, a macro, a
//! generic type or a group of names is checked as a bare path is; what
//! looks like a path but follows a hyphen, a dot or a slash is a test
//! binary, a method call or a file.

use crate::root;

/// The backticked spans of a document outside fenced blocks, each with
/// the line it opens on. A span may go on over a line break, as markdown's
/// do, but not past a paragraph's end.
fn spans(document: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut fenced = false;
    let mut open: Option<(usize, String)> = None;
    for (index, line) in document.lines().enumerate() {
        if line.starts_with("```") {
            fenced = !fenced;
            open = None;
        }
        if fenced || line.trim().is_empty() {
            open = None;
            continue;
        }
        for (i, piece) in line.split('`').enumerate() {
            if i > 0 {
                match open.take() {
                    Some(span) => found.push(span),
                    None => open = Some((index + 1, String::new())),
                }
            }
            if let Some((_, span)) = &mut open {
                span.push_str(piece);
            }
        }
        if let Some((_, span)) = &mut open {
            span.push(' ');
        }
    }
    found
}

/// The backticked Rust paths of a document, each with its line: every run
/// of names joined by `::` in a span, so a call (`Backend::order(first,
/// then)`), a macro (`scope_test::conformance_tests!`) and a generic type
/// (`scope_core::Client<B>`) are read for their paths. A run that follows
/// a `-`, `.`, `/`, `>` or `:` is not one: a test binary
/// (`server-cuda::mock`), a method call, a file, a turbofish's tail.
pub(super) fn rust_paths(document: &str) -> Vec<(usize, String)> {
    spans(document)
        .into_iter()
        .flat_map(|(line, span)| runs(&span).into_iter().map(move |run| (line, run)))
        .collect()
}

/// The runs of two or more names joined by `::` in `span`, each starting
/// where a path may.
fn runs(span: &str) -> Vec<String> {
    let name_char = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = Vec::new();
    let mut rest = span;
    let mut before = ' ';
    while let Some(c) = rest.chars().next() {
        if !(c.is_alphabetic() || c == '_') || name_char(before) {
            before = c;
            rest = &rest[c.len_utf8()..];
            continue;
        }
        let mut segments = Vec::new();
        let mut end = 0;
        loop {
            let tail = &rest[end..];
            let len = tail.find(|c: char| !name_char(c)).unwrap_or(tail.len());
            if len == 0 || !tail.starts_with(|c: char| c.is_alphabetic() || c == '_') {
                break;
            }
            segments.push(&tail[..len]);
            end += len;
            if !rest[end..].starts_with("::") {
                break;
            }
            end += 2;
        }
        let run = segments.join("::");
        let starts = !matches!(before, '-' | '.' | '/' | '>' | ':');
        if segments.len() > 1 && starts {
            found.push(run.clone());
        }
        // A group (`KernelSource::{Wgsl, SpirV}`) names each of its members.
        let group = rest[end..]
            .strip_prefix('{')
            .filter(|_| starts && rest[..end].ends_with("::"));
        if let Some(members) = group.and_then(|g| g.split_once('}')).map(|g| g.0) {
            let members = members.split(',').map(str::trim);
            found.extend(
                members
                    .filter(|m| !m.is_empty() && *m != "self" && m.chars().all(name_char))
                    .map(|m| format!("{run}::{m}")),
            );
        }
        before = rest[..end].chars().last().unwrap_or(before);
        rest = &rest[end.max(1)..];
    }
    found
}

/// The test binaries a document names as `crate-name::target` (a crate's
/// hyphenated name, then a file of its `tests/`), each with its line.
fn test_binaries(document: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (line, span) in spans(document) {
        for word in span.split_whitespace() {
            let Some((package, target)) = word.split_once("::") else {
                continue;
            };
            let named = |s: &str| {
                !s.is_empty()
                    && s.chars().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-'
                    })
            };
            if package.contains('-') && named(package) && named(target) {
                found.push((line, word.to_owned()));
            }
        }
    }
    found
}

/// The test binaries of `document` that no crate's `tests/` holds.
pub(super) fn missing_binaries(document: &str) -> Vec<String> {
    let crates = root().join("crates");
    test_binaries(document)
        .into_iter()
        .filter(|(_, word)| {
            let (package, target) = word.split_once("::").unwrap_or_default();
            let tests = crates.join(package).join("tests");
            !tests.join(format!("{target}.rs")).is_file()
                && !tests.join(target).join("main.rs").is_file()
        })
        .map(|(line, word)| format!("line {line}: `{word}` (no such test binary)"))
        .collect()
}
