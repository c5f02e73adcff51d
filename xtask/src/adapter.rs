//! Making sure something can run the device tests: a GPU, or Mesa's
//! software Vulkan driver (lavapipe).
//!
//! A fresh machine with no GPU would otherwise pass every device test by
//! skipping it, which reads as green and tests nothing. So `test`, `ci` and
//! `demo` ask the matrix (once the demo binary, which probes, is built); when no backend has any device and the
//! machine can install the software adapter (Debian or Ubuntu, as root or
//! with password-less sudo) they install it, saying so; otherwise they print
//! the exact command and carry on.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

use crate::matrix;
use crate::run;

/// The script that installs the adapter, relative to the workspace root.
pub const SCRIPT: &str = "ci/install-software-adapter.sh";

fn is_debian() -> bool {
    std::path::Path::new("/etc/debian_version").is_file()
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
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    sudo_ok.then(|| vec!["sudo", "-n"])
}

/// Probe with the demo binary; when nothing at all is found, install the
/// software adapter if this machine allows it, else print how. Returns the
/// rows found last.
///
/// # Errors
///
/// When the install script cannot be started or fails.
pub fn ensure(binary: Option<&Path>) -> Result<Vec<matrix::Row>> {
    let rows = matrix::probe_all(binary);
    if matrix::any_adapter(&rows) {
        return Ok(rows);
    }
    let script = run::root().join(SCRIPT);
    match (is_debian(), root_prefix()) {
        (true, Some(prefix)) => {
            println!(
                "==> no GPU and no software adapter found: installing Mesa's software Vulkan driver (lavapipe) with {SCRIPT}"
            );
            let mut command = match prefix.split_first() {
                Some((program, rest)) => {
                    let mut c = Command::new(program);
                    c.args(rest).arg(&script);
                    c
                }
                None => Command::new(&script),
            };
            let status = command.stdin(std::process::Stdio::null()).status()?;
            anyhow::ensure!(status.success(), "{SCRIPT} failed ({status})");
            let rows = matrix::probe_all(binary);
            if !matrix::any_adapter(&rows) {
                println!(
                    "==> the software adapter is installed but no backend finds it yet:\n{}",
                    matrix::table(&rows)
                );
            }
            Ok(rows)
        }
        _ => {
            println!("==> no GPU and no software adapter found; device tests will be skipped.");
            println!("    To install Mesa's software Vulkan driver (Debian/Ubuntu), run:");
            println!("        sudo {}", script.display());
            println!(
                "    or: sudo apt-get install -y mesa-vulkan-drivers libvulkan1 vulkan-validationlayers libegl1 libegl-mesa0 libgl1-mesa-dri"
            );
            Ok(rows)
        }
    }
}
