//! The C libraries tests build at run time: the mock CUDA driver, NVRTC, NCCL, HIP runtime and
//! RCCL. Each is built once per content and shared by every test process.
//!
//! A test runner that gives each test a process of its own (nextest does) would otherwise compile
//! every mock once per test. A hundred tests of the CUDA mock were three hundred C compiles, most
//! of that row's time. The library's name is a hash of everything that goes into it: its source,
//! defines, flags and compiler. So a changed source builds anew and an unchanged one is found. It
//! is written under a name of its own process and renamed into place. So a process never loads a
//! file another is still writing.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The mock NCCL's source: server-cuda's tests build it as NCCL, and server-hip's as RCCL (RCCL is
/// NCCL's API).
pub const MOCK_NCCL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/mock/mock_nccl.c");

/// The mocks' shared headers: `timeline.h`, the timed mode of the CUDA and HIP mocks, and `held.h`,
/// their one stream executor. They are on every library's include path, and part of its hash, so a
/// changed header builds anew.
pub const MOCK_INCLUDE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/mock");

/// Every `.h` under [`MOCK_INCLUDE`], by name, with its text.
fn shared_headers() -> Result<Vec<(std::ffi::OsString, Vec<u8>)>, String> {
    let listed =
        std::fs::read_dir(MOCK_INCLUDE).map_err(|e| format!("reading {MOCK_INCLUDE}: {e}"))?;
    let mut headers = Vec::new();
    for entry in listed {
        let path = entry.map_err(|e| format!("{MOCK_INCLUDE}: {e}"))?.path();
        if path.extension().is_some_and(|e| e == "h") {
            let text =
                std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
            headers.push((path.file_name().unwrap_or_default().to_owned(), text));
        }
    }
    headers.sort();
    Ok(headers)
}

/// A shared library to build from one C source.
#[derive(Debug)]
pub struct CLibrary<'a> {
    /// The source file.
    pub source: &'a Path,
    /// A name for the file (`libscope_mock_hip`); the hash follows it.
    pub stem: &'a str,
    /// The library's soname, which `dlopen` of that name then finds.
    pub soname: Option<&'a str>,
    /// `-D` definitions, each `NAME` or `NAME=value`.
    pub defines: &'a [String],
    /// Compiler flags besides `-shared -fPIC -O1 -Wall -Werror`.
    pub flags: &'a [&'a str],
    /// Libraries to link (`pthread`, `dl`).
    pub libs: &'a [&'a str],
}

impl Default for CLibrary<'_> {
    /// No source yet, no soname, no defines, flags or libraries.
    fn default() -> Self {
        Self {
            source: Path::new(""),
            stem: "libscope_mock",
            soname: None,
            defines: &[],
            flags: &[],
            libs: &[],
        }
    }
}

impl CLibrary<'_> {
    /// Build it into `dir` (the test's `CARGO_TARGET_TMPDIR`), or find it built there already; its
    /// path.
    ///
    /// # Errors
    ///
    /// When the source or a shared header cannot be read, the compiler (`$CC`, else `cc`) cannot
    /// run, or it refuses the source.
    pub fn build(&self, dir: &Path) -> Result<PathBuf, String> {
        let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
        let source = std::fs::read(self.source)
            .map_err(|e| format!("reading {}: {e}", self.source.display()))?;
        let mut args: Vec<String> = ["-shared", "-fPIC", "-O1", "-Wall", "-Werror"]
            .iter()
            .chain(self.flags)
            .map(|a| (*a).to_owned())
            .collect();
        if let Some(soname) = self.soname {
            args.push(format!("-Wl,-soname,{soname}"));
        }
        args.extend(self.defines.iter().map(|d| format!("-D{d}")));
        args.push(format!("-I{MOCK_INCLUDE}"));
        let headers = shared_headers()?;
        let mut hasher = DefaultHasher::new();
        (&compiler, &source, &args, self.libs, &headers).hash(&mut hasher);
        let out = dir.join(format!("{}-{:016x}.so", self.stem, hasher.finish()));
        if out.is_file() {
            return Ok(out);
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let partial = out.with_extension(format!("so.{}.partial", std::process::id()));
        let status = Command::new(&compiler)
            .args(&args)
            .arg("-o")
            .arg(&partial)
            .arg(self.source)
            .args(self.libs.iter().map(|l| format!("-l{l}")))
            .status()
            .map_err(|e| format!("running the C compiler `{compiler}`: {e}"))?;
        if !status.success() {
            let _ = std::fs::remove_file(&partial);
            return Err(format!("{} did not compile", self.source.display()));
        }
        // Renaming is atomic: a process that finds `out` finds all of it.
        std::fs::rename(&partial, &out).map_err(|e| format!("{}: {e}", out.display()))?;
        Ok(out)
    }
}
