//! Reading the workspace's sources as text, for the tests that keep the
//! code and its documents true: which files there are, and their code with
//! comments and literals blanked.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The workspace's folder.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every crate's source folder: `crates/*/src` and `xtask/src`.
pub fn crates() -> Vec<PathBuf> {
    let root = workspace();
    let mut found: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .expect("the crates folder reads")
        .map(|e| e.expect("a directory entry").path().join("src"))
        .filter(|src| src.is_dir())
        .collect();
    found.push(root.join("xtask/src"));
    found.sort();
    found
}

/// Every `.rs` file under `dir`.
pub fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the source tree reads") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file with comments, strings and character literals
/// blanked; lines are kept, so positions still fall in their module.
pub fn code(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    // What keeps a newline and drops everything else up to `end`.
    let blank = |out: &mut String, from: &[char]| {
        out.extend(from.iter().filter(|&&c| c == '\n'));
    };
    while i < chars.len() {
        let rest = &chars[i..];
        let starts = |s: &str| s.chars().zip(rest).filter(|(a, b)| a == *b).count() == s.len();
        let len = if starts("//") {
            rest.iter().position(|&c| c == '\n').unwrap_or(rest.len())
        } else if starts("/*") {
            (2..rest.len())
                .find(|&j| rest[j - 2..j] == ['*', '/'])
                .unwrap_or(rest.len())
        } else if starts("r\"") || starts("r#") {
            let hashes = rest[1..].iter().take_while(|&&c| c == '#').count();
            let close: String = std::iter::once('"')
                .chain("#".repeat(hashes).chars())
                .collect();
            let body: String = rest.iter().collect();
            body[2 + hashes..].find(&close).map_or(rest.len(), |e| {
                body[..2 + hashes + e + close.len()].chars().count()
            })
        } else if rest[0] == '"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != '"' {
                j += if rest[j] == '\\' { 2 } else { 1 };
            }
            (j + 1).min(rest.len())
        } else if rest[0] == '\'' && rest.get(1) == Some(&'\\') {
            rest[2..]
                .iter()
                .position(|&c| c == '\'')
                .map_or(2, |e| e + 3)
        } else if rest[0] == '\'' && rest.get(2) == Some(&'\'') {
            3
        } else {
            0
        };
        let before = i.checked_sub(1).map(|b| chars[b]);
        let in_word = before.is_some_and(|c| c.is_alphanumeric() || c == '_');
        if len == 0 || (in_word && rest[0] == 'r') {
            out.push(chars[i]);
            i += 1;
        } else {
            blank(&mut out, &rest[..len]);
            out.push(' ');
            i += len;
        }
    }
    out
}
