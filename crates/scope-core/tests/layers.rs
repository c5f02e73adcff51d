//! scope-core's modules form layers (design decision 11 in `lib.rs`): a
//! module names only modules of its own layer or lower ones.
//!
//! The test reads the sources, not the compiler's view: `use crate::…`,
//! `use super::…`, `use self::…`, `crate::x::` and `super::` paths in code,
//! and a parent's paths into its own children. Comments are skipped. It
//! also prints the largest set of modules that reach each other (run with
//! `--nocapture`). `SCOPE_CORE_SRC` points it at another source tree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

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

fn source_root() -> PathBuf {
    std::env::var_os("SCOPE_CORE_SRC").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        PathBuf::from,
    )
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the source tree reads") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `collective/round.rs` is `collective::round`; `lib.rs` is the root, "".
fn module_of(root: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(root).expect("under the root");
    let name = rel.with_extension("").to_string_lossy().replace('/', "::");
    if name == "lib" { String::new() } else { name }
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
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
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

/// The code of a file with comments and string literals blanked.
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("//") {
            out.push('\n');
            continue;
        }
        let line = line.split(" // ").next().unwrap_or(line);
        let mut in_string = false;
        let mut escaped = false;
        for c in line.chars() {
            if in_string {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == '"' {
                    in_string = false;
                }
                continue;
            }
            if c == '"' {
                in_string = true;
            }
            out.push(c);
        }
        out.push('\n');
    }
    out
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

fn read_modules(root: &Path) -> BTreeMap<String, Module> {
    let mut paths = Vec::new();
    files(root, &mut paths);
    let known: BTreeSet<String> = paths.iter().map(|p| module_of(root, p)).collect();
    let mut modules = BTreeMap::new();
    for file in &paths {
        let module = module_of(root, file);
        let text = std::fs::read_to_string(file).expect("a source file reads");
        let code = code(&text);
        let inline = inline_modules(&code);
        // The module a position of the file is in, inline modules included.
        let within = |at: usize| {
            inline
                .iter()
                .filter(|(_, span)| span.contains(&at))
                .fold(module.clone(), |m, (name, _)| join(&m, name))
        };
        let mut targets: Vec<(usize, String)> = Vec::new();
        // `use` trees, whole (they may span lines).
        for (start, _) in paths_from(&code, "use ") {
            let tail = &code[start + 4..];
            let end = tail.find(';').unwrap_or(tail.len());
            targets.extend(expand(&tail[..end]).into_iter().map(|t| (start, t)));
        }
        for root_word in ["crate::", "super::", "self::"] {
            let found = paths_from(&code, root_word);
            targets.extend(found.into_iter().map(|(at, p)| (at, p.to_owned())));
        }
        // A parent's paths into its children: `compute::compute(…)`.
        for child in known
            .iter()
            .filter(|m| parent(m) == module && !m.is_empty())
        {
            let name = child.rsplit("::").next().unwrap_or(child);
            if let Some(&(at, _)) = paths_from(&code, &format!("{name}::")).first() {
                targets.push((at, format!("self::{name}")));
            }
        }
        let mut uses = BTreeSet::new();
        for (at, target) in targets {
            let here = within(at);
            let mut base = here.clone();
            let mut rest = target.as_str();
            let absolute = if let Some(r) = rest.strip_prefix("crate::") {
                r.to_owned()
            } else if rest.starts_with("super::") || rest.starts_with("self::") {
                while let Some(r) = rest.strip_prefix("super::") {
                    base = parent(&base);
                    rest = r;
                }
                join(&base, rest.trim_start_matches("self::"))
            } else if here.is_empty() {
                target.clone()
            } else {
                continue;
            };
            if let Some(used) = resolve(&known, &absolute)
                && used != module
            {
                uses.insert(used);
            }
        }
        modules.insert(
            module,
            Module {
                lines: text.lines().count(),
                uses,
            },
        );
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

#[test]
fn no_module_names_a_higher_layer() {
    let root = source_root();
    let modules = read_modules(&root);
    assert!(
        modules.len() > 20,
        "read {} modules under {root:?}",
        modules.len()
    );
    let knots = knots(&modules);
    let largest = &knots[0];
    let lines: usize = largest.iter().map(|m| modules[m].lines).sum();
    println!(
        "largest knot: {} modules, {lines} lines: {largest:?}",
        largest.len()
    );
    for knot in knots.iter().filter(|k| k.len() > 1) {
        println!("knot: {knot:?}");
    }
    let mut wrong = Vec::new();
    for (name, module) in modules.iter().filter(|(n, _)| !n.is_empty()) {
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
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
