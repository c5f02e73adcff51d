//! Backends are known by type: no source names a server by a string
//! literal outside its table, `crates/scope-core/src/probe/kind.rs`.
//!
//! Every `.rs` file under each crate's `src/` and `xtask/src` is read as
//! text; comments are skipped. A literal equal to a server's name
//! (`BackendKind::name`) is an error unless it is a cargo feature in a
//! `cfg` or a row of [`ALLOWED`], which says why. `must_fail` plants one.

mod common;

use std::path::Path;

use scope_core::BackendKind;

/// The table: the one file that spells the names.
const TABLE: &str = "crates/scope-core/src/probe/kind.rs";

/// Literals that are a backend's name by coincidence: (file, literal, why).
const ALLOWED: &[(&str, &str, &str)] = &[
    (
        "crates/scope-core/src/probe.rs",
        "vulkan",
        "`SCOPE_REQUIRE` values as a person types them",
    ),
    (
        "crates/scope-core/src/probe.rs",
        "wgpu",
        "`SCOPE_REQUIRE` values as a person types them",
    ),
    (
        "crates/scope-core/src/probe.rs",
        "cuda",
        "`SCOPE_REQUIRE` values as a person types them",
    ),
    (
        "crates/scope-core/src/probe.rs",
        "hip",
        "`SCOPE_REQUIRE` values as a person types them",
    ),
    (
        "crates/server-cuda/src/driver.rs",
        "cuda",
        "the driver library's stem, as cudarc searches for it",
    ),
    (
        "crates/server-wgpu/src/device.rs",
        "vulkan",
        "wgpu's Vulkan API, as `SCOPE_WGPU_BACKEND` spells it",
    ),
    (
        "xtask/src/cubecl.rs",
        "vulkan",
        "wgpu's Vulkan API, as `SCOPE_WGPU_BACKEND` spells it",
    ),
    (
        "xtask/src/matrix.rs",
        "vulkan",
        "wgpu's Vulkan API, as a probe's detail starts",
    ),
    (
        "xtask/src/flaky.rs",
        "vulkan",
        "a test binary, crates/server-vulkan/tests/vulkan.rs",
    ),
    (
        "crates/tiny-runtime/src/backends.rs",
        "cuda",
        "cargo features, which `cfg` takes only as literals",
    ),
    (
        "crates/tiny-runtime/src/backends.rs",
        "hip",
        "cargo features, which `cfg` takes only as literals",
    ),
    (
        "crates/tiny-runtime/src/backends.rs",
        "vulkan",
        "cargo features, which `cfg` takes only as literals",
    ),
    (
        "crates/tiny-runtime/src/backends.rs",
        "wgpu",
        "cargo features, which `cfg` takes only as literals",
    ),
    (
        "crates/tiny-runtime/src/main.rs",
        "cuda",
        "`--target`: a kernel language, CUDA C++",
    ),
    (
        "crates/tiny-runtime/src/main.rs",
        "hip",
        "`--target`: a kernel language, HIP C++",
    ),
];

/// The string literals of `text` outside comments: (line, value, what
/// comes before it on its line).
fn literals(text: &str) -> Vec<(usize, String, String)> {
    let chars: Vec<char> = text.chars().collect();
    let (mut found, mut line, mut i, mut line_start) = (Vec::new(), 1, 0, 0);
    while i < chars.len() {
        let rest = &chars[i..];
        let starts = |s: &str| s.chars().zip(rest).filter(|(a, b)| a == *b).count() == s.len();
        let after_word = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        let (end, body) = if starts("//") {
            (
                rest.iter().position(|&c| c == '\n').unwrap_or(rest.len()),
                None,
            )
        } else if starts("/*") {
            let close = (2..rest.len()).find(|&j| rest[j - 2..j] == ['*', '/']);
            (close.unwrap_or(rest.len()), None)
        } else if !after_word && (starts("r\"") || starts("r#\"") || starts("r##\"")) {
            let hashes = rest[1..].iter().take_while(|&&c| c == '#').count();
            let open = 2 + hashes;
            let close: Vec<char> = std::iter::once('"')
                .chain("#".repeat(hashes).chars())
                .collect();
            let at = (open..rest.len()).find(|&j| rest[j..].starts_with(&close));
            let at = at.unwrap_or(rest.len());
            (at + close.len(), Some(rest[open..at].iter().collect()))
        } else if rest[0] == '"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != '"' {
                j += if rest[j] == '\\' { 2 } else { 1 };
            }
            (j + 1, Some(rest[1..j.min(rest.len())].iter().collect()))
        } else if rest[0] == '\'' && rest.get(1) == Some(&'\\') {
            (
                rest[2..]
                    .iter()
                    .position(|&c| c == '\'')
                    .map_or(2, |e| e + 3),
                None,
            )
        } else if rest[0] == '\'' && rest.get(2) == Some(&'\'') {
            (3, None)
        } else {
            (1, None)
        };
        let end = end.clamp(1, rest.len());
        if let Some(body) = body {
            let before: String = chars[line_start..i].iter().collect();
            found.push((line, body, before));
        }
        for (k, &c) in rest[..end].iter().enumerate() {
            if c == '\n' {
                line += 1;
                line_start = i + k + 1;
            }
        }
        i += end;
    }
    found
}

/// The names `text` (at `file`, from the root) spells as literals, beyond
/// a `cfg`'s feature and `ALLOWED`: "file:line: \"name\"".
fn spelled(file: &str, text: &str) -> Vec<String> {
    let names: Vec<&str> = BackendKind::ALL.iter().map(|k| k.name()).collect();
    literals(text)
        .into_iter()
        .filter(|(_, value, _)| names.contains(&value.as_str()))
        .filter(|(_, _, before)| !before.trim_end().ends_with("feature ="))
        .filter(|(_, value, _)| !ALLOWED.iter().any(|a| a.0 == file && a.1 == value))
        .map(|(line, value, _)| format!("{file}:{line}: \"{value}\""))
        .collect()
}

/// Every source file to read, relative to the root, with its text.
fn sources() -> Vec<(String, String)> {
    let root = common::workspace();
    let mut files = Vec::new();
    for src in common::crates() {
        common::files(&src, &mut files);
    }
    files.sort();
    let relative = |f: &Path| f.strip_prefix(&root).unwrap_or(f).display().to_string();
    files
        .iter()
        .map(|f| {
            (
                relative(f),
                std::fs::read_to_string(f).expect("a source reads"),
            )
        })
        .collect()
}

#[test]
fn no_backend_is_named_by_a_literal_outside_its_table() {
    let sources = sources();
    assert!(sources.len() > 40, "found only {} sources", sources.len());
    let spelled: Vec<String> = sources
        .iter()
        .filter(|(file, _)| file != TABLE)
        .flat_map(|(file, text)| spelled(file, text))
        .collect();
    assert!(
        spelled.is_empty(),
        "backends named by a string literal outside {TABLE} (name them by `BackendKind`):\n  {}",
        spelled.join("\n  ")
    );
    // The table spells every name, and each row of `ALLOWED` still has its literal.
    let (_, table) = sources.iter().find(|(f, _)| f == TABLE).expect("the table");
    assert_eq!(spelled_names(table).len(), BackendKind::ALL.len());
    for (file, value, why) in ALLOWED {
        let text = &sources.iter().find(|(f, _)| f == file).expect(file).1;
        let here = literals(text).into_iter().any(|(_, v, _)| v == *value);
        assert!(
            here,
            "{file} no longer spells \"{value}\" ({why}): drop its row"
        );
    }
}

/// The table's distinct names, as the scan reads them.
fn spelled_names(text: &str) -> Vec<String> {
    let mut names: Vec<String> = spelled("the table", text)
        .into_iter()
        .map(|s| s.rsplit(' ').next().unwrap_or_default().to_owned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A planted literal is caught; comments, a `cfg`'s feature, a longer
/// literal, a raw string and an allowed file's literal are not.
#[test]
fn must_fail_a_planted_name() {
    let planted = r##"
// A comment may say "cuda".
/* So may "hip" in a block. */
#[cfg(feature = "wgpu")]
fn f(c: char) -> &'static str {
    let _ = ('"', '\'', "server-cuda", r#"{"backend": "vulkan"}"#);
    if c == 'x' { "cuda" } else { "vulkan\" or" }
}
"##;
    assert_eq!(spelled("planted.rs", planted), ["planted.rs:7: \"cuda\""]);
    let allowed = "let api = \"vulkan\";";
    assert!(spelled("crates/server-wgpu/src/device.rs", allowed).is_empty());
    assert_eq!(
        spelled("elsewhere.rs", allowed),
        ["elsewhere.rs:1: \"vulkan\""]
    );
}
