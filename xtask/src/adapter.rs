//! Making sure the machine has what the device tests run on: the Vulkan
//! loader, Mesa's software Vulkan driver (lavapipe) and the Khronos
//! validation layer.
//!
//! Without them a machine with no GPU passes every Vulkan test by skipping
//! it, which reads as green and tests nothing. The demo falls back to wgpu on
//! GL (llvmpipe), or finds nothing at all. So `demo`, `test` and `ci` look for
//! the three pieces **before the build starts** ([`prepare`]). When one is
//! missing and the machine can install it (Debian or Ubuntu, as root or with
//! password-less sudo), they run [`SCRIPT`] and say so in one line. Otherwise
//! they print the command that would, while a build's worth of time remains.
//! `SCOPE_NO_INSTALL=1` turns the install into that message. After the build,
//! [`ensure`] asks the probes what was found.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::Result;

use crate::matrix;
use crate::run;

/// The script that installs the adapter, relative to the workspace root.
pub const SCRIPT: &str = "ci/install-software-adapter.sh";

/// What turns the install into a message.
const NO_INSTALL: &str = "SCOPE_NO_INSTALL";

/// A piece of the Vulkan stack the device tests need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    /// `libvulkan.so.1` (Debian: `libvulkan1`).
    Loader,
    /// Mesa's software Vulkan driver (Debian: `mesa-vulkan-drivers`).
    Lavapipe,
    /// `VK_LAYER_KHRONOS_validation` (Debian: `vulkan-validationlayers`).
    Validation,
}

impl Piece {
    fn describe(self) -> &'static str {
        match self {
            Piece::Loader => "the Vulkan loader (libvulkan.so.1)",
            Piece::Lavapipe => "lavapipe (Mesa's software Vulkan driver)",
            Piece::Validation => "the validation layer (VK_LAYER_KHRONOS_validation)",
        }
    }
}

/// Where the loader looks for libraries, driver manifests and layers.
#[derive(Clone, Debug, Default)]
struct Places {
    /// Folders that may hold `libvulkan.so.1`.
    libraries: Vec<PathBuf>,
    /// `ldconfig -p`, when it answered.
    ldconfig: Option<String>,
    /// Folders of Vulkan driver manifests (`…/vulkan/icd.d`), and
    /// manifests named one by one (`VK_DRIVER_FILES`, `VK_ICD_FILENAMES`).
    drivers: Vec<PathBuf>,
    /// Folders of explicit layer manifests (`…/vulkan/explicit_layer.d`,
    /// `VK_LAYER_PATH`, `VK_ADD_LAYER_PATH`).
    layers: Vec<PathBuf>,
}

fn split_paths(var: &str) -> Vec<PathBuf> {
    std::env::var_os(var)
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default()
}

impl Places {
    /// The Vulkan loader's own search order on Linux, near enough.
    fn here() -> Self {
        let mut libraries = split_paths("LD_LIBRARY_PATH");
        for dir in ["/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib"] {
            libraries.push(PathBuf::from(dir));
            // Debian's multiarch folders: /usr/lib/x86_64-linux-gnu, …
            if let Ok(entries) = std::fs::read_dir(dir) {
                libraries.extend(
                    entries
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| p.to_string_lossy().ends_with("-linux-gnu")),
                );
            }
        }
        let ldconfig = ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"]
            .iter()
            .find_map(|program| run::output_of(program, &["-p"]));
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let mut roots: Vec<PathBuf> = Vec::new();
        match std::env::var_os("XDG_CONFIG_HOME") {
            Some(c) => roots.push(PathBuf::from(c)),
            None => roots.extend(home.as_ref().map(|h| h.join(".config"))),
        }
        roots.push("/etc/xdg".into());
        roots.push("/etc".into());
        match std::env::var_os("XDG_DATA_HOME") {
            Some(d) => roots.push(PathBuf::from(d)),
            None => roots.extend(home.as_ref().map(|h| h.join(".local/share"))),
        }
        let data = split_paths("XDG_DATA_DIRS");
        if data.is_empty() {
            roots.push("/usr/local/share".into());
            roots.push("/usr/share".into());
        } else {
            roots.extend(data);
        }
        let mut drivers = split_paths("VK_DRIVER_FILES");
        drivers.extend(split_paths("VK_ICD_FILENAMES"));
        drivers.extend(roots.iter().map(|r| r.join("vulkan/icd.d")));
        let mut layers = split_paths("VK_LAYER_PATH");
        layers.extend(split_paths("VK_ADD_LAYER_PATH"));
        layers.extend(roots.iter().map(|r| r.join("vulkan/explicit_layer.d")));
        Self {
            libraries,
            ldconfig,
            drivers,
            layers,
        }
    }

    /// The file names in `places` (a place that is a file counts as
    /// itself).
    fn names(places: &[PathBuf]) -> impl Iterator<Item = String> + '_ {
        places.iter().flat_map(|place| {
            let own = place
                .is_file()
                .then(|| place.file_name().map(|n| n.to_string_lossy().into_owned()))
                .flatten();
            let inside = std::fs::read_dir(place)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned());
            own.into_iter().chain(inside)
        })
    }

    fn has(&self, piece: Piece) -> bool {
        match piece {
            Piece::Loader => {
                self.ldconfig
                    .as_deref()
                    .is_some_and(|l| l.contains("libvulkan.so.1"))
                    || self
                        .libraries
                        .iter()
                        .any(|dir| dir.join("libvulkan.so.1").exists())
            }
            // Mesa installs lavapipe's manifest as lvp_icd.<arch>.json.
            Piece::Lavapipe => {
                Self::names(&self.drivers).any(|n| n.starts_with("lvp_icd") && n.ends_with(".json"))
            }
            Piece::Validation => Self::names(&self.layers)
                .any(|n| n.eq_ignore_ascii_case("VkLayer_khronos_validation.json")),
        }
    }

    fn missing(&self) -> Vec<Piece> {
        [Piece::Loader, Piece::Lavapipe, Piece::Validation]
            .into_iter()
            .filter(|p| !self.has(*p))
            .collect()
    }
}

/// The pieces this machine lacks (none off Linux, where the loader and
/// drivers come another way).
pub fn missing() -> Vec<Piece> {
    if cfg!(target_os = "linux") {
        Places::here().missing()
    } else {
        Vec::new()
    }
}

fn list(pieces: &[Piece]) -> String {
    let names: Vec<&str> = pieces.iter().map(|p| p.describe()).collect();
    match names.as_slice() {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

fn is_debian() -> bool {
    Path::new("/etc/debian_version").is_file()
        && run::output_of("apt-get", &["--version"]).is_some()
}

/// `Some(prefix)` to run a command as root (`[]` when already root,
/// `["sudo", "-n"]` with password-less sudo), `None` when we cannot.
fn root_prefix() -> Option<Vec<&'static str>> {
    if run::output_of("id", &["-u"]).as_deref() == Some("0") {
        return Some(Vec::new());
    }
    let sudo_ok = Command::new("sudo")
        .args(["-n", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    sudo_ok.then(|| vec!["sudo", "-n"])
}

/// The script as the user would type it: relative when they are in the
/// workspace root.
fn script_shown() -> String {
    let script = run::root().join(SCRIPT);
    if std::env::current_dir().is_ok_and(|d| d == run::root()) {
        SCRIPT.to_owned()
    } else {
        script.display().to_string()
    }
}

/// The one command that installs what is missing, or what to do where
/// there is no such command.
fn how_to_install() -> String {
    if is_debian() {
        let root = run::output_of("id", &["-u"]).as_deref() == Some("0");
        format!("{}{}", if root { "" } else { "sudo " }, script_shown())
    } else {
        "your distribution's Vulkan loader, Mesa Vulkan drivers and Vulkan validation layers"
            .to_owned()
    }
}

/// What a run without `missing` loses.
fn consequence(missing: &[Piece]) -> &'static str {
    if missing.iter().any(|p| *p != Piece::Validation) {
        "Vulkan tests will skip, and the demo may run on GL"
    } else {
        "the tests that need it will skip"
    }
}

/// Before the build: when a piece is missing, install it if this machine
/// can (saying so in one line), else print the command that would.
/// A failed install is reported and the run carries on: the tests that
/// need the piece then skip, and say why.
///
/// # Errors
///
/// Never as yet; the `Result` is for the callers' `?`.
pub fn prepare() -> Result<()> {
    let missing = missing();
    if missing.is_empty() {
        return Ok(());
    }
    let what = list(&missing);
    let opted_out = std::env::var_os(NO_INSTALL).is_some_and(|v| !v.is_empty() && v != "0");
    let prefix = (is_debian() && !opted_out).then(root_prefix).flatten();
    let Some(prefix) = prefix else {
        println!(
            "==> missing here: {what}; {}. To install: {}",
            consequence(&missing),
            how_to_install()
        );
        return Ok(());
    };
    print!("==> installing {what} with {SCRIPT} (missing here; {NO_INSTALL}=1 not to) ...");
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let script = run::root().join(SCRIPT);
    let mut command = match prefix.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(&script);
            c
        }
        None => Command::new(&script),
    };
    let start = Instant::now();
    let output = command.stdin(Stdio::null()).output();
    match output {
        Ok(out) if out.status.success() => {
            println!(" done in {:.0} s", start.elapsed().as_secs_f64());
            let still = self::missing();
            if !still.is_empty() {
                println!(
                    "==> installed, but still not found: {}; {}",
                    list(&still),
                    consequence(&still)
                );
            }
        }
        Ok(out) => {
            println!(" FAILED ({})", out.status);
            for line in String::from_utf8_lossy(&out.stdout)
                .lines()
                .chain(String::from_utf8_lossy(&out.stderr).lines())
            {
                println!("    {line}");
            }
            println!("==> carrying on without {what}: {}", consequence(&missing));
        }
        Err(e) => {
            println!(" could not start it ({e})");
            println!("==> carrying on without {what}: {}", consequence(&missing));
        }
    }
    Ok(())
}

/// After the build: probe with the demo binary and return the rows; when
/// no backend found any device, say so, and how to install one where a
/// piece is missing.
///
/// # Errors
///
/// Never as yet; the `Result` is for the callers' `?`.
pub fn ensure(binary: Option<&Path>) -> Result<Vec<matrix::Row>> {
    let rows = matrix::probe_all(binary);
    if !matrix::any_adapter(&rows) {
        println!("==> no GPU and no software adapter found; device tests will be skipped.");
        let missing = missing();
        if !missing.is_empty() {
            println!(
                "    missing: {}. To install: {}",
                list(&missing),
                how_to_install()
            );
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod checks {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-adapter-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn each_piece_is_looked_for_where_the_loader_looks() {
        let root = scratch("pieces");
        let places = Places {
            libraries: vec![root.join("lib")],
            ldconfig: None,
            drivers: vec![root.join("icd.d")],
            layers: vec![root.join("explicit_layer.d")],
        };
        assert_eq!(
            places.missing(),
            [Piece::Loader, Piece::Lavapipe, Piece::Validation]
        );
        for dir in ["lib", "icd.d", "explicit_layer.d"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        // llvmpipe's GL and another vendor's Vulkan driver are not lavapipe.
        std::fs::write(root.join("icd.d/intel_icd.x86_64.json"), "{}").unwrap();
        std::fs::write(
            root.join("explicit_layer.d/VkLayer_MESA_overlay.json"),
            "{}",
        )
        .unwrap();
        assert_eq!(
            places.missing(),
            [Piece::Loader, Piece::Lavapipe, Piece::Validation]
        );
        std::fs::write(root.join("lib/libvulkan.so.1"), "").unwrap();
        std::fs::write(root.join("icd.d/lvp_icd.x86_64.json"), "{}").unwrap();
        assert_eq!(places.missing(), [Piece::Validation]);
        std::fs::write(
            root.join("explicit_layer.d/VkLayer_khronos_validation.json"),
            "{}",
        )
        .unwrap();
        assert!(places.missing().is_empty());
        // ldconfig's cache answers for the loader; a manifest named on its
        // own (VK_DRIVER_FILES) answers for the driver.
        let elsewhere = Places {
            libraries: Vec::new(),
            ldconfig: Some("\tlibvulkan.so.1 (libc6,x86-64) => /lib/libvulkan.so.1".into()),
            drivers: vec![root.join("icd.d/lvp_icd.x86_64.json")],
            layers: vec![root.join("explicit_layer.d")],
        };
        assert!(elsewhere.missing().is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn the_missing_pieces_read_as_a_list() {
        assert_eq!(list(&[Piece::Validation]), Piece::Validation.describe());
        assert_eq!(
            list(&[Piece::Loader, Piece::Lavapipe, Piece::Validation]),
            format!(
                "{}, {} and {}",
                Piece::Loader.describe(),
                Piece::Lavapipe.describe(),
                Piece::Validation.describe()
            )
        );
    }
}
