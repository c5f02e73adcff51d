//! `docs/ARCHITECTURE.md` as a reference this test keeps true.
//!
//! Every file path the document names must exist. Every source file of
//! scope-core and of the servers must be named in it, as the first cell of
//! a row in its crate's "file by file" table.
//!
//! A heading that names a source folder in backticks, such as
//! `` `crates/scope-core/src` ``, sets the folder its section's names are
//! relative to. Outside such a section a path is relative to the
//! repository, to `crates/` or to `docs/`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The file extensions that make a backticked word a path.
const EXTENSIONS: &[&str] = &["rs", "md", "toml", "c", "h", "sh", "yml"];

/// The source folders whose every file the document must name.
const COVERED: &[&str] = &["crates/scope-core/src", "crates/server-"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The words in backticks on `line`.
fn quoted(line: &str) -> impl Iterator<Item = &str> {
    line.split('`').skip(1).step_by(2)
}

/// Whether `word` reads as a file path.
fn is_path(word: &str) -> bool {
    let name = word.rsplit('/').next().unwrap_or(word);
    !word.contains(char::is_whitespace)
        && name.rsplit_once('.').is_some_and(|(stem, ext)| {
            !stem.is_empty() && EXTENSIONS.contains(&ext) && !stem.contains(':')
        })
}

/// The targets of markdown links on `line`, when they are local files.
fn links(line: &str) -> impl Iterator<Item = &str> {
    line.split("](").skip(1).filter_map(|rest| {
        let target = rest.split(')').next()?;
        let target = target.split('#').next()?;
        (!target.is_empty() && !target.contains("://")).then_some(target)
    })
}

/// Every source file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("read a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// What the document names: files its tables list, and paths it refers to
/// that do not exist.
struct Named {
    listed: BTreeSet<PathBuf>,
    missing: Vec<String>,
}

fn read(document: &str) -> Named {
    let root = root();
    let mut named = Named {
        listed: BTreeSet::new(),
        missing: Vec::new(),
    };
    let mut base: Option<String> = None;
    let mut fenced = false;
    for (index, line) in document.lines().enumerate() {
        let number = index + 1;
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if fenced {
            continue;
        }
        if line.starts_with('#') {
            base = quoted(line)
                .find(|w| w.starts_with("crates/") && w.ends_with("src"))
                .map(str::to_owned);
            continue;
        }
        let first_cell = line
            .strip_prefix('|')
            .and_then(|rest| rest.split('|').next())
            .map(str::trim);
        for word in quoted(line).filter(|w| is_path(w)) {
            let mut candidates = Vec::new();
            if let Some(base) = &base {
                candidates.push(root.join(base).join(word));
            }
            if base.is_none() || word.contains('/') {
                candidates.push(root.join(word));
                candidates.push(root.join("crates").join(word));
                candidates.push(root.join("docs").join(word));
            }
            match candidates.iter().find(|c| c.is_file()) {
                Some(found) => {
                    let listed = first_cell == Some(&format!("`{word}`")[..]);
                    if listed && base.is_some() {
                        named
                            .listed
                            .insert(found.canonicalize().expect("canonical path"));
                    }
                }
                None => named.missing.push(format!("line {number}: `{word}`")),
            }
        }
        for target in links(line) {
            if !root.join("docs").join(target).exists() {
                named.missing.push(format!("line {number}: link {target}"));
            }
        }
    }
    named
}

#[test]
fn architecture_names_what_exists_and_every_source_file() {
    let root = root();
    let path = root.join("docs/ARCHITECTURE.md");
    let document = std::fs::read_to_string(&path).expect("read docs/ARCHITECTURE.md");
    let named = read(&document);

    let mut files = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).expect("read crates/") {
        let dir = entry.expect("read a crate").path();
        let src = dir.join("src");
        let relative = src.strip_prefix(&root).unwrap_or(&src).to_string_lossy();
        if COVERED.iter().any(|c| relative.starts_with(c)) {
            sources(&src, &mut files);
        }
    }
    assert!(
        files.len() > 40,
        "found only {} source files to check",
        files.len()
    );
    let mut unnamed: Vec<String> = files
        .iter()
        .filter(|f| {
            !named
                .listed
                .contains(&f.canonicalize().expect("canonical path"))
        })
        .map(|f| f.strip_prefix(&root).unwrap_or(f).display().to_string())
        .collect();
    unnamed.sort();

    assert!(
        named.missing.is_empty(),
        "docs/ARCHITECTURE.md names paths that do not exist:\n  {}",
        named.missing.join("\n  ")
    );
    assert!(
        unnamed.is_empty(),
        "docs/ARCHITECTURE.md's file tables do not name:\n  {}",
        unnamed.join("\n  ")
    );
}

/// The reading itself: a section's base, a table row, a path that is not there.
#[test]
fn a_document_is_read_as_its_sections_say() {
    let document = "\
## scope-core (`crates/scope-core/src`)

| file | holds |
|---|---|
| `lib.rs` | The crate, beside `client/lend.rs` and `nowhere.rs`. |

## Elsewhere

See `crates/scope-core/Cargo.toml`, `lib.rs` and [the model](ERROR_MODEL.md).
";
    let named = read(document);
    let lib = root().join("crates/scope-core/src/lib.rs");
    assert_eq!(
        named.listed.iter().collect::<Vec<_>>(),
        [&lib.canonicalize().unwrap()]
    );
    assert_eq!(named.missing, ["line 5: `nowhere.rs`", "line 9: `lib.rs`"]);
}
