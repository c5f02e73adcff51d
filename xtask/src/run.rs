//! Running cargo: shown to the user as it happens, and kept for parsing.
//!
//! Test and bench output is both a progress report and data: the summary
//! counts pass, fail and skip lines. So a child's stdout and stderr are read
//! line by line on two threads and collected in order of arrival. Each line
//! is echoed to its stream (benches, `test --verbose`) or only logged (`test`).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;

use anyhow::{Context, Result};

/// The workspace root: xtask lives one level below it.
pub fn root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

/// `cargo` as the user invoked it (`$CARGO`), in the workspace root, with
/// the environment every child gets (see [`program`]).
pub fn cargo() -> Command {
    let mut command = program(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.current_dir(root());
    command
}

/// `program`, with the environment every child gets: a private
/// `XDG_RUNTIME_DIR` when there is none (Mesa's drivers warn without one).
pub fn program(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new(program);
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        let dir = std::env::temp_dir().join(format!("xdg-{}", whoami()));
        if std::fs::create_dir_all(&dir).is_ok() {
            set_private(&dir);
            command.env("XDG_RUNTIME_DIR", dir);
        }
    }
    command
}

fn set_private(dir: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    }
    #[cfg(not(unix))]
    let _ = dir;
}

/// The user's name, or their uid, for per-user paths.
pub fn whoami() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .or_else(|| output_of("id", &["-u"]))
        .unwrap_or_else(|| "user".to_owned())
}

/// The trimmed stdout of `program args`, when it succeeds.
pub fn output_of(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A command line as a person would type it: `cargo …`, or the program's
/// path relative to the workspace root.
pub fn show(command: &Command) -> String {
    let mut parts = Vec::new();
    for (key, value) in command.get_envs() {
        if let Some(value) = value {
            let key = key.to_string_lossy();
            if !["XDG_RUNTIME_DIR", "CARGO_MANIFEST_DIR", "CARGO_PKG_NAME"].contains(&&*key) {
                parts.push(format!("{key}={}", value.to_string_lossy()));
            }
        }
    }
    let program = Path::new(command.get_program());
    let is_cargo = std::env::var_os("CARGO").is_some_and(|c| c == program.as_os_str())
        || program == Path::new("cargo");
    parts.push(if is_cargo {
        "cargo".to_owned()
    } else {
        program
            .strip_prefix(root())
            .unwrap_or(program)
            .display()
            .to_string()
    });
    parts.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// What a finished command said and how it ended.
#[derive(Debug, Default)]
pub struct Captured {
    /// Whether it exited with status zero.
    pub success: bool,
    /// Its stdout and stderr lines, interleaved as they arrived.
    pub lines: Vec<String>,
}

fn pump(
    stream: impl Read + Send + 'static,
    to_stderr: bool,
    tx: mpsc::Sender<(bool, String)>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let reader = BufReader::new(stream);
        for line in reader.split(b'\n') {
            let Ok(bytes) = line else { break };
            let line = String::from_utf8_lossy(&bytes)
                .trim_end_matches('\r')
                .to_owned();
            if tx.send((to_stderr, line)).is_err() {
                break;
            }
        }
    })
}

/// Run `command`, echoing and collecting its output.
///
/// # Errors
///
/// When it cannot be started.
pub fn capture(command: Command) -> Result<Captured> {
    capture_with(command, true, None)
}

/// Run `command` and collect its output, without ANSI colour codes. Each line
/// goes to the terminal when `echo`, and to `log` when given, as it arrives.
/// The command line goes where the output goes.
///
/// # Errors
///
/// When it cannot be started.
pub fn capture_with(
    mut command: Command,
    echo: bool,
    mut log: Option<&mut dyn Write>,
) -> Result<Captured> {
    let shown = show(&command);
    if echo {
        println!("==> {shown}");
    }
    if let Some(log) = log.as_mut() {
        let _ = writeln!(log, "==> {shown}");
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {shown}"))?;
    let (tx, rx) = mpsc::channel();
    let mut pumps = Vec::new();
    if let Some(out) = child.stdout.take() {
        pumps.push(pump(out, false, tx.clone()));
    }
    if let Some(err) = child.stderr.take() {
        pumps.push(pump(err, true, tx.clone()));
    }
    drop(tx);
    let mut lines = Vec::new();
    for (to_stderr, line) in rx {
        if echo {
            if to_stderr {
                let _ = writeln!(std::io::stderr().lock(), "{line}");
            } else {
                let _ = writeln!(std::io::stdout().lock(), "{line}");
            }
        }
        let line = crate::report::strip_ansi(&line);
        if let Some(log) = log.as_mut() {
            let _ = writeln!(log, "{line}");
        }
        lines.push(line);
    }
    for pump in pumps {
        let _ = pump.join();
    }
    let status = child.wait().context("waiting for cargo")?;
    if let Some(log) = log.as_mut() {
        let _ = writeln!(log, "==> exit: {status}");
    }
    Ok(Captured {
        success: status.success(),
        lines,
    })
}

/// Run `command` with its output going straight to the terminal.
///
/// # Errors
///
/// When it cannot be started.
pub fn status(mut command: Command) -> Result<bool> {
    println!("==> {}", show(&command));
    let status = command
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("starting {}", show(&command)))?;
    Ok(status.success())
}
