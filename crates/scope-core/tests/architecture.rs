//! The documents as references these tests keep true.
//!
//! Every file path `docs/ARCHITECTURE.md` names must exist. Every source
//! file of every crate must be named in it, as the first cell of a row in
//! its crate's "file by file" table. Every Rust path the documents name in
//! backticks (`Client::recover`, `scope_test::random_rounds`) must name
//! what the code defines: a type, trait or module and, after it, one of its
//! fields, variants, methods, items or re-exports. A path from another
//! crate is that crate's to keep true. A hyphenated crate's name before
//! `::` (`server-cuda::mock`) names a test binary, which must exist.
//!
//! How a document's paths are found is in `paths.rs`, what the code
//! defines in `definitions.rs`, both beside this file in `architecture/`.
//!
//! A heading that names a source folder in backticks, such as
//! `` `crates/scope-core/src` ``, sets the folder its section's names are
//! relative to. Outside such a section a path is relative to the
//! repository, to `crates/` or to `docs/`.

mod common;
#[path = "architecture/definitions.rs"]
mod definitions;
#[path = "architecture/paths.rs"]
mod paths;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use definitions::{Defined, FOREIGN, defined};
use paths::{missing_binaries, rust_paths};

/// The file extensions that make a backticked word a path.
const EXTENSIONS: &[&str] = &["rs", "md", "toml", "c", "h", "sh", "yml"];

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
                .find(|w| {
                    (w.starts_with("crates/") || w.starts_with("xtask/")) && w.ends_with("src")
                })
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
    for src in common::crates() {
        common::files(&src, &mut files);
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

/// The paths of `document` that name nothing the workspace defines.
fn wrong_paths(defined: &Defined, document: &str) -> Vec<String> {
    rust_paths(document)
        .into_iter()
        .filter_map(|(line, path)| {
            // A path from `crate`, `self` or `super` is read from the name
            // after it, which some module of the workspace must define.
            let relative = ["crate::", "self::", "super::"]
                .iter()
                .find_map(|root| path.strip_prefix(root));
            if let Some(rest) = relative {
                let name = rest.split("::").next().unwrap_or(rest);
                let known = defined.members.values().any(|m| m.contains(name));
                return match defined.resolves(rest) {
                    Some(true) => None,
                    None if known => None,
                    _ => Some(format!("line {line}: `{path}`")),
                };
            }
            let first = path.split("::").next().unwrap_or("");
            let foreign = (defined.foreign.contains(first) && !defined.types.contains(first))
                || FOREIGN.iter().any(|(name, _)| *name == first);
            match defined.resolves(&path) {
                _ if defined.crates.contains(first) => None,
                Some(true) => None,
                // A name both define is the workspace's unless a crate's
                // path says otherwise.
                _ if foreign => None,
                Some(false) => Some(format!("line {line}: `{path}`")),
                None => Some(format!(
                    "line {line}: `{path}` (`{first}` is defined nowhere here)"
                )),
            }
        })
        .collect()
}

#[test]
fn documents_name_only_what_the_code_defines() {
    let root = root();
    let defined = defined();
    let mut documents: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .map(|e| e.expect("a document").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    documents.push(root.join("README.md"));
    documents.sort();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for document in documents {
        let text = std::fs::read_to_string(&document).expect("a document reads");
        checked += rust_paths(&text).len();
        let name = document
            .strip_prefix(&root)
            .unwrap_or(&document)
            .display()
            .to_string();
        wrong.extend(
            wrong_paths(&defined, &text)
                .into_iter()
                .chain(missing_binaries(&text))
                .map(|w| format!("{name} {w}")),
        );
    }
    println!("{checked} Rust paths checked");
    assert!(checked > 200, "found only {checked} Rust paths");
    assert!(
        wrong.is_empty(),
        "names the code does not define:\n  {}",
        wrong.join("\n  ")
    );
}

/// What the documents' check must catch: a name that is gone, a method
/// that never was, a type defined nowhere, each also as a call, in a
/// group, across a line break, from `crate`, and a test binary no crate
/// has; and what it must let through: a re-export by glob, another
/// crate's path, a generic type, a test binary that exists.
#[test]
fn must_fail_a_planted_wrong_name() {
    let document = "\
`Client::recover`, `scope_test::random_rounds`, `wgpu::Device::destroy`,
`scope_core::Client<B>`, `--only server-cuda::mock`, `crate::not_run`.

`Suite::reopens`, `Client::no_such_call`, `Nowhere::at_all`,
`Suite::nothing_here(client)`, `Error::{InvalidArgument, Nothing}`, `Backend::order(first,
then)` and `Backend::not_here(first,
then)`, `crate::nothing_here`, `cargo test -p scope-test --test nothing`
and `server-cuda::nothing`.
";
    let defined = defined();
    let wrong: Vec<String> = wrong_paths(&defined, document)
        .into_iter()
        .chain(missing_binaries(document))
        .collect();
    assert_eq!(
        wrong,
        [
            "line 4: `Suite::reopens`",
            "line 4: `Client::no_such_call`",
            "line 4: `Nowhere::at_all` (`Nowhere` is defined nowhere here)",
            "line 5: `Suite::nothing_here`",
            "line 5: `Error::Nothing`",
            "line 6: `Backend::not_here`",
            "line 7: `crate::nothing_here`",
            "line 8: `server-cuda::nothing` (no such test binary)",
        ]
    );
}
