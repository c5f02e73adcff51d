//! The backends, from scope-core's table, and what CI knows of each.
//!
//! xtask reads the table's source file by path rather than depending on
//! scope-core: the file uses nothing but `core`, and xtask stays a build
//! of seconds. The table says what a backend is; where CI finds its tools
//! is here, in [`ci`]. A `--backend` value is read once, into a [`Choice`].
//! The tests below keep the table and the tree in step. Every
//! `crates/server-*` crate, and every cargo feature that links one, is a row
//! of it, and every row has its lines in the per-backend tests.

use std::fmt;

use anyhow::{Result, bail};

#[path = "../../crates/scope-core/src/probe/kind.rs"]
#[allow(dead_code)]
mod table;

pub use table::{BackendKind, Drivers, Kind};

/// What CI needs of a backend, beyond what the backend is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ci {
    /// Its server's conformance test binary: a mock driver's where CI has no GPU.
    pub suite_test: &'static str,
    /// Its server's `toolchain` test, if any: (variable, where CI installs it).
    pub toolchain: Option<(&'static str, &'static str)>,
}

/// `kind`'s row of CI's table; `ci/run.sh` installs the toolchains.
pub const fn ci(kind: BackendKind) -> Ci {
    match kind {
        BackendKind::Cuda => Ci {
            suite_test: "mock",
            toolchain: Some(("SCOPE_CUDA_TOOLCHAIN", "target/cuda-toolchain")),
        },
        BackendKind::Hip => Ci {
            suite_test: "mock",
            toolchain: Some((
                "SCOPE_HIP_TOOLCHAIN",
                "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5",
            )),
        },
        BackendKind::Vulkan | BackendKind::Wgpu => Ci {
            suite_test: "conformance",
            toolchain: None,
        },
    }
}

/// What `--backend` names: one backend of the table, the reference host
/// server, the core's crates, or all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    All,
    Core,
    Host,
    One(BackendKind),
}

impl Choice {
    /// `name` as a choice, backends through [`BackendKind::from_name`].
    ///
    /// # Errors
    ///
    /// When `name` is no backend, `core` or `all`.
    pub fn parse(name: &str) -> Result<Self> {
        let choice = match name {
            "all" => Self::All,
            "core" => Self::Core,
            host if host == Kind::Host.name() => Self::Host,
            other => match BackendKind::from_name(other) {
                Some(kind) => Self::One(kind),
                None => bail!(
                    "unknown backend `{other}`: {}",
                    list(&[Kind::Host.name(), "core", "all"])
                ),
            },
        };
        Ok(choice)
    }

    /// Its name, as `--backend` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::Core => "core",
            Self::Host => Kind::Host.name(),
            Self::One(kind) => kind.name(),
        }
    }

    /// Whether it takes `kind`'s server.
    pub fn takes(self, kind: BackendKind) -> bool {
        self == Self::All || self == Self::One(kind)
    }

    /// The error for a command that does not take it; `takes` lists what it does.
    pub fn refused<T>(self, takes: &[&str]) -> Result<T> {
        bail!("unknown backend `{self}`: {}", list(takes))
    }
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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
            [(
                BackendKind::Wgpu.feature().to_owned(),
                vec!["server-wgpu".to_owned()]
            )]
        );
    }
}
