//! The backends, from scope-core's table.
//!
//! xtask reads the table's source file by path rather than depending on
//! scope-core: the file uses nothing but `core`, and xtask stays a build
//! of seconds. The tests below keep the table and the tree in step. Every
//! `crates/server-*` crate, and every cargo feature that links one, is a row
//! of it, and every row has its lines in the per-backend tests.

#[path = "../../crates/scope-core/src/probe/kind.rs"]
#[allow(dead_code)]
mod table;

pub use table::{BackendKind, Drivers};

/// The backends' names and then `extra`, as a sentence's list: "cuda,
/// hip, vulkan or wgpu".
pub fn list(extra: &[&str]) -> String {
    let names: Vec<&str> = BackendKind::ALL
        .iter()
        .map(|kind| kind.name())
        .chain(extra.iter().copied())
        .collect();
    match names.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run;

    #[test]
    fn the_lists_in_messages_name_every_backend() {
        assert_eq!(list(&[]), "cuda, hip, vulkan or wgpu");
        assert_eq!(
            list(&["core", "all"]),
            "cuda, hip, vulkan, wgpu, core or all"
        );
    }

    #[test]
    fn every_server_crate_is_a_backend_of_the_table() {
        let crates = run::root().join("crates");
        let mut servers: Vec<String> = std::fs::read_dir(&crates)
            .expect("crates/ is readable")
            .flatten()
            .filter(|d| d.path().join("Cargo.toml").is_file())
            .filter_map(|d| d.file_name().into_string().ok())
            .filter(|name| name.starts_with("server-"))
            .collect();
        servers.sort();
        let mut listed: Vec<String> = BackendKind::ALL
            .iter()
            .map(|kind| kind.server_crate().to_owned())
            .collect();
        listed.sort();
        assert_eq!(
            servers, listed,
            "each crates/server-* is a row of BackendKind (crates/scope-core/src/probe/kind.rs)"
        );
    }

    /// The features of `manifest` whose value links a server crate
    /// (`name = ["dep:server-…"]`), with the crates they link.
    fn linking_features(manifest: &str) -> Vec<(String, Vec<String>)> {
        let mut in_features = false;
        let mut found = Vec::new();
        for line in manifest.lines().map(str::trim) {
            if line.starts_with('[') {
                in_features = line == "[features]";
                continue;
            }
            let Some((name, value)) = line.split_once('=').filter(|_| in_features) else {
                continue;
            };
            let servers: Vec<String> = value
                .split('"')
                .filter_map(|part| part.strip_prefix("dep:"))
                .filter(|dep| dep.starts_with("server-"))
                .map(str::to_owned)
                .collect();
            if !servers.is_empty() {
                found.push((name.trim().to_owned(), servers));
            }
        }
        found
    }

    #[test]
    fn every_feature_that_links_a_server_is_named_by_the_table() {
        let crates = run::root().join("crates");
        let mut linkers = Vec::new();
        for dir in std::fs::read_dir(&crates)
            .expect("crates/ is readable")
            .flatten()
        {
            let Ok(manifest) = std::fs::read_to_string(dir.path().join("Cargo.toml")) else {
                continue;
            };
            let features = linking_features(&manifest);
            for (feature, servers) in &features {
                let kind = BackendKind::ALL.iter().find(|k| k.feature() == feature);
                let kind = kind.unwrap_or_else(|| {
                    panic!(
                        "{dir:?}: feature `{feature}` links {servers:?}, a backend the table lacks"
                    )
                });
                assert_eq!(
                    servers,
                    &[kind.server_crate()],
                    "{dir:?}: feature `{feature}`"
                );
            }
            if !features.is_empty() {
                linkers.push((dir.file_name(), features.len()));
            }
        }
        // The crates that link servers by feature have one for each backend.
        linkers.sort();
        assert_eq!(
            linkers,
            [
                ("scope-cubecl".into(), BackendKind::ALL.len()),
                ("tiny-runtime".into(), BackendKind::ALL.len()),
            ]
        );
    }

    /// The test files with a line a backend: a backend missing there has
    /// no tests on its server.
    #[test]
    fn every_backend_has_its_lines_in_the_per_backend_tests() {
        let root = run::root();
        for &kind in BackendKind::ALL {
            let (name, feature) = (kind.name(), kind.feature());
            let module = kind.server_crate().replace('-', "_");
            for (file, line) in [
                (
                    "crates/tiny-runtime/tests/backends.rs",
                    format!("backend_tests!(\"{feature}\", {name}, {module});"),
                ),
                (
                    "crates/scope-cubecl/tests/cubek.rs",
                    format!("on_server!({name}, \"{feature}\", {module}::"),
                ),
            ] {
                let text = std::fs::read_to_string(root.join(file)).expect(file);
                assert!(text.contains(&line), "{file} lacks `{line}`");
            }
        }
    }

    #[test]
    fn the_features_are_read_from_a_manifest() {
        let manifest = "[package]\nname = \"x\"\n\n[features]\ndefault = [\"wgpu\"]\n\
                        wgpu = [\"dep:server-wgpu\"]\nother = [\"dep:half\"]\n\n\
                        [dependencies]\nserver-wgpu = { path = \"../server-wgpu\" }\n";
        assert_eq!(
            linking_features(manifest),
            [("wgpu".to_owned(), vec!["server-wgpu".to_owned()])]
        );
    }
}
