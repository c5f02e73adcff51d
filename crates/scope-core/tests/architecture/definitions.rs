//! What the workspace's code defines, read from its source text: each
//! type, trait, module and crate with the names inside it. The documents'
//! paths resolve against this, so a name the code dropped fails the
//! documents' test.
//!
//! Source text rather than rustdoc's JSON: it needs no nightly toolchain
//! and no build of every crate, and it reads tests and benches too. The
//! price is a reader that knows items, not types: same-named owners share
//! one set of members.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::common::{code, files};
use crate::root;

/// The names that own members (types, traits, modules, crates), each with
/// the names defined in it: fields, variants, methods, associated items,
/// a module's items and re-exports. Same-named owners share one set.
#[derive(Default)]
pub(super) struct Defined {
    pub(super) members: BTreeMap<String, BTreeSet<String>>,
    /// The crates the workspace depends on (`std` among them), and the
    /// names its code brings in from them: a path that starts with one is
    /// another crate's to keep true.
    pub(super) foreign: BTreeSet<String>,
    /// The crates the workspace depends on.
    pub(super) crates: BTreeSet<String>,
    /// The names a type, trait or module of the workspace takes: another
    /// crate's type is not the workspace's for an `impl` of it here.
    pub(super) types: BTreeSet<String>,
    /// The modules whose every name an owner takes by a glob (`pub use
    /// rounds::*`).
    globs: BTreeMap<String, BTreeSet<String>>,
}

/// What a block of code is, for what is defined inside it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    Owner,
    Enum,
    Struct,
    /// A function body, an expression, a macro: its items are not members.
    Other,
}

/// The tokens of blanked code: identifiers (with `r#` dropped) and single
/// punctuation characters.
fn tokens(code: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(c) = rest.chars().next() {
        let len = if c.is_alphanumeric() || c == '_' {
            rest.find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len())
        } else {
            c.len_utf8()
        };
        if !c.is_whitespace() {
            out.push(&rest[..len]);
        }
        rest = &rest[len..];
    }
    out
}

fn is_identifier(token: &str) -> bool {
    token.starts_with(|c: char| c.is_alphabetic() || c == '_')
}

impl Defined {
    fn add(&mut self, owners: &[String], name: &str) {
        for owner in owners {
            self.members
                .entry(owner.clone())
                .or_default()
                .insert(name.to_owned());
        }
    }

    /// Read one file whose top-level items belong to `module` (its name,
    /// and the crate's name for a crate root).
    fn read(&mut self, code: &str, module: &[String]) {
        for owner in module {
            self.members.entry(owner.clone()).or_default();
        }
        let tokens = tokens(code);
        for (i, _) in tokens.iter().enumerate().filter(|(_, t)| **t == "use") {
            let end = tokens[i..].iter().position(|t| *t == ";").unwrap_or(0);
            let tree = tokens[i + 1..i + end].join(" ").replace(" : : ", "::");
            let from = tree
                .trim_start_matches("::")
                .split("::")
                .next()
                .unwrap_or("");
            if self.foreign.contains(from.trim()) {
                self.foreign.extend(used_names(&tree));
            }
        }
        // Open blocks: kind, owners.
        let mut stack: Vec<(Block, Vec<String>)> = Vec::new();
        let mut pending: Option<(Block, Vec<String>)> = None;
        let mut i = 0;
        while i < tokens.len() {
            let token = tokens[i];
            let next = tokens.get(i + 1).copied().unwrap_or("");
            let owners: Vec<String> = match stack.last() {
                None => module.to_vec(),
                Some((Block::Other, _)) => Vec::new(),
                Some((_, owners)) => owners.clone(),
            };
            match token {
                "{" => {
                    let opened = pending.take().unwrap_or((Block::Other, Vec::new()));
                    for owner in &opened.1 {
                        self.members.entry(owner.clone()).or_default();
                    }
                    stack.push(opened);
                    // A variant or a field right after the brace.
                    self.member_after(&tokens, i, stack.last());
                }
                "}" => {
                    stack.pop();
                }
                ";" => pending = None,
                "," => self.member_after(&tokens, i, stack.last()),
                "fn" | "const" | "static" | "type" | "macro_rules"
                    if is_identifier(next) || next == "!" =>
                {
                    let name = if next == "!" {
                        tokens.get(i + 2).copied().unwrap_or("")
                    } else {
                        next
                    };
                    if name != "_" && !owners.is_empty() {
                        self.add(&owners, name);
                    }
                    if token == "macro_rules" {
                        pending = Some((Block::Other, Vec::new()));
                    }
                }
                "struct" | "enum" | "trait" | "union" | "mod" if is_identifier(next) => {
                    if !owners.is_empty() {
                        self.add(&owners, next);
                    }
                    let kind = match token {
                        "enum" => Block::Enum,
                        "struct" | "union" => Block::Struct,
                        _ => Block::Owner,
                    };
                    self.types.insert(next.to_owned());
                    pending = Some((kind, vec![next.to_owned()]));
                    self.members.entry(next.to_owned()).or_default();
                }
                "impl" => {
                    pending = Some((Block::Owner, vec![implemented(&tokens[i + 1..])]));
                }
                "use" if !owners.is_empty() && stack.last().is_none_or(|b| b.0 == Block::Owner) => {
                    let end = tokens[i..].iter().position(|t| *t == ";").unwrap_or(0);
                    let tree = tokens[i + 1..i + end].join(" ").replace(" : : ", "::");
                    for name in used_names(&tree) {
                        self.add(&owners, &name);
                    }
                    for module in globbed(&tree) {
                        for owner in &owners {
                            self.globs
                                .entry(owner.clone())
                                .or_default()
                                .insert(module.clone());
                        }
                    }
                }

                _ => {}
            }
            i += 1;
        }
    }

    /// A variant or a field that starts after the token at `at`.
    fn member_after(&mut self, tokens: &[&str], at: usize, block: Option<&(Block, Vec<String>)>) {
        let Some((kind @ (Block::Enum | Block::Struct), owners)) = block else {
            return;
        };
        let mut i = at + 1;
        // Skip attributes and visibility.
        loop {
            match tokens.get(i).copied() {
                Some("#") => {
                    let mut depth = 0;
                    while let Some(t) = tokens.get(i) {
                        i += 1;
                        match *t {
                            "[" => depth += 1,
                            "]" => {
                                depth -= 1;
                                if depth == 0 {
                                    break;
                                }
                            }
                            _ => {}
                        }
                    }
                }
                Some("pub") => {
                    i += 1;
                    if tokens.get(i) == Some(&"(") {
                        i += tokens[i..].iter().position(|t| *t == ")").unwrap_or(0) + 1;
                    }
                }
                _ => break,
            }
        }
        let Some(name) = tokens.get(i).filter(|t| is_identifier(t)) else {
            return;
        };
        let after = tokens.get(i + 1).copied().unwrap_or("");
        let field = after == ":" && tokens.get(i + 2) != Some(&":");
        if *kind == Block::Enum || field {
            let owners = owners.clone();
            self.add(&owners, name);
        }
    }

    /// Whether `path` (`Type::item`, `module::Type::item`) names what the
    /// workspace defines; `None` when its first name is not the
    /// workspace's at all.
    pub(super) fn resolves(&self, path: &str) -> Option<bool> {
        let mut segments = path.split("::");
        let first = segments.next()?;
        self.members.get(first)?;
        let mut owner = first;
        for segment in segments {
            if !self.has(owner, segment, 4) {
                return Some(false);
            }
            owner = segment;
        }
        Some(true)
    }

    /// Whether `owner` defines or brings in `name`, through up to `depth`
    /// globs.
    fn has(&self, owner: &str, name: &str, depth: usize) -> bool {
        self.members.get(owner).is_some_and(|m| m.contains(name))
            || (depth > 0
                && self
                    .globs
                    .get(owner)
                    .is_some_and(|modules| modules.iter().any(|m| self.has(m, name, depth - 1))))
    }
}

/// The type an `impl` block's tokens (after `impl`) are for: the last name
/// before its `{` or `where`, outside angle brackets.
fn implemented(tokens: &[&str]) -> String {
    let mut depth = 0i32;
    let mut last = String::new();
    let mut previous = "";
    for token in tokens {
        match *token {
            "{" | "where" if depth == 0 => break,
            "<" => depth += 1,
            ">" if previous != "-" => depth -= 1,
            t if depth == 0 && is_identifier(t) && t != "for" && t != "dyn" && t != "unsafe" => {
                last = t.to_owned();
            }
            _ => {}
        }
        previous = token;
    }
    last
}

/// The names a `use` tree brings in: each path's last name or its alias;
/// `self` brings the module's own name.
fn used_names(tree: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let flat: Vec<(usize, char)> = tree.char_indices().collect();
    let mut path_prefix: Vec<String> = vec![String::new()];
    let push = |piece: &str, prefix: &str, names: &mut Vec<String>| {
        let piece = piece.trim();
        if piece.is_empty() || piece.ends_with('*') {
            return;
        }
        let name = match piece.split_once(" as ") {
            Some((_, alias)) => alias.trim().to_owned(),
            None if piece == "self" => prefix
                .trim_end_matches("::")
                .rsplit("::")
                .next()
                .unwrap_or("")
                .to_owned(),
            None => piece.rsplit("::").next().unwrap_or(piece).to_owned(),
        };
        names.push(name);
    };
    for &(i, c) in &flat {
        match c {
            '{' => {
                let prefix = format!("{}{}", path_prefix[depth], &tree[start..i]);
                depth += 1;
                path_prefix.truncate(depth);
                path_prefix.push(prefix);
                start = i + 1;
            }
            ',' | '}' => {
                push(&tree[start..i], &path_prefix[depth], &mut names);
                if c == '}' {
                    depth = depth.saturating_sub(1);
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    push(&tree[start..], &path_prefix[depth], &mut names);
    names
}

/// Every workspace crate's files: the source, its tests and benches, and
/// xtask's.
pub(super) fn defined() -> Defined {
    let root = root();
    let mut defined = Defined {
        foreign: dependencies(),
        crates: dependencies(),
        ..Defined::default()
    };
    let mut folders: Vec<(PathBuf, String)> = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).expect("read crates/") {
        let dir = entry.expect("read a crate").path();
        let name = dir
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().replace('-', "_"));
        for part in ["src", "tests", "benches", "examples"] {
            folders.push((dir.join(part), name.clone()));
        }
    }
    folders.push((root.join("xtask/src"), "xtask".to_owned()));
    for (folder, crate_name) in folders {
        if !folder.is_dir() {
            continue;
        }
        let mut paths = Vec::new();
        files(&folder, &mut paths);
        for file in paths {
            let stem = file
                .file_stem()
                .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
            let owners = match stem.as_str() {
                "lib" | "main" => vec![crate_name.clone()],
                "mod" => file
                    .parent()
                    .and_then(Path::file_name)
                    .map(|d| vec![d.to_string_lossy().into_owned()])
                    .unwrap_or_default(),
                _ => vec![stem],
            };
            let text = std::fs::read_to_string(&file).expect("a source file reads");
            defined.read(&code(&text), &owners);
        }
    }
    defined
}

/// The modules a `use` tree takes whole (`rounds::*`).
fn globbed(tree: &str) -> Vec<String> {
    let flat: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    flat.split([',', '{', '}'])
        .filter_map(|piece| piece.strip_suffix("::*"))
        .filter_map(|path| path.rsplit("::").next())
        .map(str::to_owned)
        .collect()
}

/// Names of other code that the documents use bare, though the workspace
/// neither depends on their crate nor brings them in by name, each with
/// whose it is.
pub(super) const FOREIGN: &[(&str, &str)] = &[
    ("runtime_tests", "cubecl-core's runtime tests"),
    ("binary_untyped", "a module of cubecl-core's runtime tests"),
    ("Shared", "cubecl-core's shared memory"),
    ("CaptureEnd", "cubecl-runtime's capture"),
    ("ComputeShader", "cubecl-wgpu's WGSL compiler"),
    ("WgpuArtifactCompiler", "cubecl-wgpu"),
    ("OpaqueType", "cubecl-ir"),
    ("cubecl_ir", "cubecl's IR crate"),
    ("cubecl", "cubecl's umbrella crate"),
    ("MatmulSetupError", "cubek-matmul"),
    ("burn_cubecl", "burn's cubecl backend"),
    ("R", "a cubecl `Runtime`, as generic code names it"),
];

/// The crates any manifest of the workspace names, as code names them,
/// with the language's own.
fn dependencies() -> BTreeSet<String> {
    let root = root();
    let mut manifests = vec![root.join("Cargo.toml"), root.join("xtask/Cargo.toml")];
    for entry in std::fs::read_dir(root.join("crates")).expect("read crates/") {
        manifests.push(entry.expect("read a crate").path().join("Cargo.toml"));
    }
    let mut names: BTreeSet<String> = [
        "std", "core", "alloc", "u8", "u16", "u32", "u64", "usize", "i8", "i16", "i32", "i64",
        "isize", "f32", "f64", "bool", "str",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    let own: Vec<String> = manifests
        .iter()
        .filter_map(|m| m.parent()?.file_name())
        .map(|n| n.to_string_lossy().replace('-', "_"))
        .collect();
    for manifest in manifests.iter().filter(|m| m.is_file()) {
        let text = std::fs::read_to_string(manifest).expect("a manifest reads");
        let mut listing = false;
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with('[') {
                listing = line.contains("dependencies");
                if let Some(name) = line
                    .strip_prefix('[')
                    .and_then(|l| l.split("dependencies.").nth(1))
                {
                    names.insert(name.trim_end_matches(']').replace('-', "_"));
                }
                continue;
            }
            let key = line.split(['=', '.']).next().unwrap_or("").trim();
            if listing && !key.is_empty() && !key.starts_with('#') {
                names.insert(key.trim_matches('"').replace('-', "_"));
            }
        }
    }
    names.retain(|n| !own.contains(n));
    names
}
