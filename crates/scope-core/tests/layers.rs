//! Every crate of the workspace stands in layers: no module of a crate
//! names a module that names it back, however far round (no circle), and
//! scope-core's modules keep the order of design decision 11 in `lib.rs`.
//!
//! A circle makes two files one idea: neither can be read, tested or
//! moved without the other. cudarc stacks `sys`, `result` and the safe
//! layer, each naming only those below it; every crate here does the same.
//!
//! The test reads the sources, not the compiler's view: `use` trees,
//! `crate::`, `super::` and `self::` paths in code, and a parent's paths
//! into its own children. A path through the root's `use` lines, such as
//! `crate::Client`, counts as naming the module it re-exports. The root
//! itself only gathers, so it is no member of a circle. Comments and
//! strings are skipped. `must_fail` plants a circle and a wrong layer.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::{code, crates, files, workspace};

/// Lowest first. A module's layer is its top-level module's.
const LAYERS: &[&[&str]] = &[
    &["id", "kernel", "limits", "few"],
    &["error"],
    &["taint", "failure", "store", "table", "scope", "capture"],
    &["backend", "handle", "hooks", "fault", "probe", "null"],
    &["server"],
    &["client"],
    &["collective"],
];

struct Module {
    lines: usize,
    uses: BTreeSet<String>,
}

/// `collective/round.rs` is `collective::round`; `lib.rs` (or a binary's
/// `main.rs` when there is no `lib.rs`) is the root, "".
fn module_of(root: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(root).expect("under the root");
    let name = rel.with_extension("").to_string_lossy().replace('/', "::");
    let root_file = if root.join("lib.rs").is_file() {
        "lib"
    } else {
        "main"
    };
    if name == root_file {
        String::new()
    } else {
        name
    }
}

fn parent(module: &str) -> String {
    module
        .rsplit_once("::")
        .map_or(String::new(), |(p, _)| p.to_owned())
}

fn join(base: &str, rest: &str) -> String {
    if base.is_empty() {
        rest.to_owned()
    } else {
        format!("{base}::{rest}")
    }
}

/// The longest known module `path` starts with.
fn resolve(known: &BTreeSet<String>, path: &str) -> Option<String> {
    let segments: Vec<&str> = path.split("::").collect();
    (1..=segments.len())
        .rev()
        .map(|n| segments[..n].join("::"))
        .find(|m| known.contains(m))
}

/// Every `use` tree's paths, braces expanded: `a::{b, c::d}` → `a::b`, `a::c::d`.
fn expand(tree: &str) -> Vec<String> {
    // `x as y` keeps its alias as `x@y`.
    let tree: String = tree
        .replace(" as ", "@")
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let Some(open) = tree.find('{') else {
        return vec![tree.trim_end_matches("::*").to_owned()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(&format!("{prefix}{p}")))
        .collect()
}

/// Paths in `code` that begin with `root`, with where each begins.
fn paths_from<'a>(code: &'a str, root: &str) -> Vec<(usize, &'a str)> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(i) = code[at..].find(root) {
        let start = at + i;
        at = start + root.len();
        let before = code[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let end = code[start..]
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .map_or(code.len(), |e| start + e);
        found.push((start, &code[start..end]));
    }
    found
}

/// The inline modules of a file (`mod tests { … }`): name and byte span.
fn inline_modules(code: &str) -> Vec<(String, std::ops::Range<usize>)> {
    let mut found = Vec::new();
    for (start, _) in paths_from(code, "mod ") {
        let tail = &code[start + 4..];
        let name_end = tail
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if !tail[name_end..].trim_start().starts_with('{') {
            continue;
        }
        let open = start + 4 + name_end + tail[name_end..].find('{').unwrap_or(0);
        let mut depth = 0;
        let mut end = code.len();
        for (i, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        found.push((tail[..name_end].to_owned(), open..end));
    }
    found
}

/// Whether the `use` at `start` of `code` is a re-export (`pub use`,
/// `pub(crate) use`).
fn re_exports(code: &str, start: usize) -> bool {
    let before = code[..start].trim_end();
    before.ends_with("pub") || before.ends_with("pub(crate)") || before.ends_with("pub(super)")
}

/// A `use` path written in `module`, made absolute; `None` when it leads
/// out of the crate.
fn absolute(known: &BTreeSet<String>, module: &str, path: &str) -> Option<String> {
    if let Some(rest) = path.strip_prefix("crate::") {
        return Some(rest.to_owned());
    }
    if path == "super" || path == "self" {
        // A glob import, `use super::*`: the module takes its parent whole.
        return Some(if path == "super" {
            parent(module)
        } else {
            module.to_owned()
        });
    }
    if path.starts_with("super::") || path.starts_with("self::") {
        let (mut base, mut rest) = (module.to_owned(), path);
        while let Some(r) = rest.strip_prefix("super::") {
            base = parent(&base);
            rest = r;
        }
        return Some(join(&base, rest.trim_start_matches("self::")));
    }
    let first = path.split("::").next().unwrap_or("");
    if known.contains(&join(module, first)) {
        Some(join(module, path))
    } else if module.is_empty() {
        Some(path.to_owned())
    } else {
        None
    }
}

/// The names a module re-exports, each with the absolute path it stands
/// for: in the root, `pub use client::{Client, WeakClient as Weak}` gives
/// `Client` → `client::Client` and `Weak` → `client::WeakClient`. The
/// root's other `use` lines count too: its children may name them.
fn re_exported(known: &BTreeSet<String>, module: &str, code: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    let top_level = code
        .lines()
        .map(|l| {
            if l.starts_with(char::is_whitespace) {
                ""
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    for (start, _) in paths_from(&top_level, "use ") {
        if !module.is_empty() && !re_exports(&top_level, start) {
            continue;
        }
        let tail = &top_level[start + 4..];
        let end = tail.find(';').unwrap_or(tail.len());
        for path in expand(&tail[..end]) {
            let (path, alias) = match path.split_once('@') {
                Some((p, a)) => (p.to_owned(), a.to_owned()),
                None => (
                    path.clone(),
                    path.rsplit("::").next().unwrap_or("").to_owned(),
                ),
            };
            if let Some(path) = absolute(known, module, &path) {
                names.insert(alias, path);
            }
        }
    }
    names
}

/// Where an absolute `path` of the crate leads: the module it names or
/// defines its item, followed through every module's re-exports.
fn locate(
    known: &BTreeSet<String>,
    names: &BTreeMap<String, BTreeMap<String, String>>,
    path: &str,
) -> Option<String> {
    let mut path = path.to_owned();
    for _ in 0..8 {
        let module = resolve(known, &path).unwrap_or_default();
        let rest = path[module.len()..].trim_start_matches("::");
        let (next, after) = rest.split_once("::").unwrap_or((rest, ""));
        match names.get(&module).and_then(|n| n.get(next)) {
            Some(through) if after.is_empty() => path.clone_from(through),
            Some(through) => path = format!("{through}::{after}"),
            None => return (!module.is_empty()).then_some(module),
        }
    }
    None
}

fn read_modules(root: &Path) -> BTreeMap<String, Module> {
    let mut paths = Vec::new();
    files(root, &mut paths);
    let known: BTreeSet<String> = paths
        .iter()
        .map(|p| module_of(root, p))
        .filter(|m| !m.is_empty())
        .collect();
    let sources: Vec<(String, String, usize)> = paths
        .iter()
        .map(|file| {
            let text = std::fs::read_to_string(file).expect("a source file reads");
            (module_of(root, file), code(&text), text.lines().count())
        })
        .collect();
    let names: BTreeMap<String, BTreeMap<String, String>> = sources
        .iter()
        .map(|(module, code, _)| (module.clone(), re_exported(&known, module, code)))
        .collect();
    let mut modules = BTreeMap::new();
    for (module, code, lines) in sources {
        let inline = inline_modules(&code);
        // Unit tests may drive a module through the layers above it: a
        // `#[cfg(test)]` module is not part of the crate it checks.
        let tests: Vec<std::ops::Range<usize>> = inline
            .iter()
            .filter(|(_, span)| {
                let before = code[..span.start].rfind("mod ").unwrap_or(0);
                code[..before].trim_end().ends_with("#[cfg(test)]")
            })
            .map(|(_, span)| span.clone())
            .collect();
        // The module a position of the file is in, inline modules included.
        let within = |at: usize| {
            inline
                .iter()
                .filter(|(_, span)| span.contains(&at))
                .fold(module.clone(), |m, (name, _)| join(&m, name))
        };
        let mut targets: Vec<(usize, String)> = Vec::new();
        // `use` trees, whole (they may span lines). A re-export only
        // gathers; a name it brings in that the module's own code uses is
        // counted below.
        let mut own_code = code.clone();
        for (start, _) in paths_from(&code, "use ") {
            let tail = &code[start + 4..];
            let end = start + 4 + tail.find(';').unwrap_or(tail.len());
            own_code.replace_range(start..end, &" ".repeat(end - start));
            if re_exports(&code, start) {
                continue;
            }
            targets.extend(expand(&tail[..end - start - 4]).into_iter().map(|t| {
                let path = t.split('@').next().unwrap_or(&t).to_owned();
                (start, path)
            }));
        }
        for root_word in ["crate::", "super::", "self::"] {
            let found = paths_from(&own_code, root_word);
            targets.extend(found.into_iter().map(|(at, p)| (at, p.to_owned())));
        }
        for (name, path) in names.get(&module).into_iter().flatten() {
            if let Some(&(at, _)) = paths_from(&own_code, name)
                .iter()
                .find(|(_, found)| found.split("::").next() == Some(name.as_str()))
            {
                targets.push((at, format!("crate::{path}")));
            }
        }
        // A parent's paths into its children: `compute::compute(…)`.
        for child in known
            .iter()
            .filter(|m| parent(m) == module && !m.is_empty())
        {
            let name = child.rsplit("::").next().unwrap_or(child);
            if let Some(&(at, _)) = paths_from(&own_code, &format!("{name}::")).first() {
                targets.push((at, format!("self::{name}")));
            }
        }
        let mut uses = BTreeSet::new();
        for (at, target) in targets {
            if tests.iter().any(|t| t.contains(&at)) {
                continue;
            }
            let Some(absolute) = absolute(&known, &within(at), &target) else {
                continue;
            };
            if let Some(used) = locate(&known, &names, &absolute)
                && used != module
            {
                uses.insert(used);
            }
        }
        if module.is_empty() {
            continue;
        }
        modules.insert(module, Module { lines, uses });
    }
    modules
}

fn layer(module: &str) -> Option<usize> {
    let top = module.split("::").next()?;
    LAYERS.iter().position(|l| l.contains(&top))
}

/// The strongly connected sets of modules (Tarjan), largest first.
fn knots(modules: &BTreeMap<String, Module>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        modules: &'a BTreeMap<String, Module>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in &self.modules[v].uses {
                let w = w.as_str();
                if !self.modules.contains_key(w) {
                    continue;
                }
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut set = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    set.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                self.found.push(set);
            }
        }
    }
    let mut walk = Walk {
        modules,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for m in modules.keys() {
        if !walk.index.contains_key(m.as_str()) {
            walk.visit(m);
        }
    }
    walk.found.sort_by_key(|s| std::cmp::Reverse(s.len()));
    walk.found
}

/// The circles of one crate's modules, each as its modules' names.
fn circles(modules: &BTreeMap<String, Module>) -> Vec<Vec<String>> {
    knots(modules).into_iter().filter(|k| k.len() > 1).collect()
}

/// Every name of a module of a higher layer, in scope-core's order.
fn wrong_layers(modules: &BTreeMap<String, Module>) -> Vec<String> {
    let mut wrong = Vec::new();
    for (name, module) in modules {
        let Some(own) = layer(name) else {
            wrong.push(format!("{name} is in no layer"));
            continue;
        };
        for used in &module.uses {
            if layer(used).is_some_and(|l| l > own) {
                wrong.push(format!("{name} (layer {own}) names {used}"));
            }
        }
    }
    wrong
}

#[test]
fn no_crate_has_a_circle() {
    let mut found = Vec::new();
    for src in crates() {
        let modules = read_modules(&src);
        let name = src
            .parent()
            .and_then(Path::file_name)
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let circles = circles(&modules);
        let lines: usize = circles.iter().flatten().map(|m| modules[m].lines).sum();
        println!(
            "{name}: {} modules, {} in circles ({lines} lines)",
            modules.len(),
            circles.iter().map(Vec::len).sum::<usize>()
        );
        for circle in circles {
            println!("  circle: {}", circle.join(" ⇄ "));
            for from in &circle {
                let to: Vec<&String> = modules[from]
                    .uses
                    .iter()
                    .filter(|m| circle.contains(m))
                    .collect();
                println!("    {from} names {to:?}");
            }
            let mut members = circle.clone();
            members.sort();
            found.push(format!("{name}: {}", members.join(", ")));
        }
    }
    let known: Vec<String> = STILL_CIRCLES
        .iter()
        .map(|(name, members)| format!("{name}: {}", members.join(", ")))
        .collect();
    let new: Vec<&String> = found.iter().filter(|f| !known.contains(f)).collect();
    let gone: Vec<&String> = known.iter().filter(|k| !found.contains(k)).collect();
    assert!(new.is_empty(), "circles not in STILL_CIRCLES: {new:#?}");
    assert!(
        gone.is_empty(),
        "gone, so take them out of STILL_CIRCLES: {gone:#?}"
    );
}

/// The circles not yet taken apart, each crate's modules sorted. The list
/// only shrinks: a new circle fails the test, and so does one listed here
/// that no longer is.
const STILL_CIRCLES: &[(&str, &[&str])] = &[(
    "scope-core",
    &[
        "collective",
        "collective::compute",
        "collective::device",
        "collective::membership",
        "collective::p2p",
        "collective::remote",
        "collective::round",
        "collective::watchdog",
    ],
)];

/// A crate planted in a temporary folder, read as the tests read the
/// workspace's.
fn planted(files: &[(&str, &str)]) -> BTreeMap<String, Module> {
    let dir = std::env::temp_dir().join(format!(
        "scope-layers-{}-{}",
        std::process::id(),
        files.len()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("the folder");
        std::fs::write(path, text).expect("a planted file");
    }
    let modules = read_modules(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    modules
}

/// What the tests above must catch: a circle made through the root's
/// re-export, a lower layer naming a higher one through it, and neither
/// from a unit test's module or a re-export alone.
#[test]
fn must_fail_a_planted_circle_and_a_wrong_layer() {
    let circle = planted(&[
        ("lib.rs", "mod a;\nmod b;\npub use b::Thing;\n"),
        ("a.rs", "pub fn f() -> crate::Thing { todo!() }\n"),
        ("b.rs", "pub struct Thing;\npub fn g() { crate::a::f(); }\n"),
    ]);
    assert_eq!(circles(&circle), [["b", "a"]]);
    let layered = planted(&[
        (
            "lib.rs",
            "mod id;\nmod client;\nmod server;\npub use client::Client;\n",
        ),
        ("id.rs", "pub fn x(_: &crate::Client) {}\n"),
        (
            "server.rs",
            "pub use crate::client::Client as Again;\n#[cfg(test)]\nmod tests {\n    use crate::Client;\n}\n",
        ),
        ("client.rs", "pub struct Client;\n"),
    ]);
    assert_eq!(wrong_layers(&layered), ["id (layer 0) names client"]);
    assert!(circles(&layered).is_empty());
}

#[test]
fn scope_cores_modules_keep_their_layers() {
    let modules = read_modules(&workspace().join("crates/scope-core/src"));
    assert!(modules.len() > 20, "read {} modules", modules.len());
    let wrong = wrong_layers(&modules);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
