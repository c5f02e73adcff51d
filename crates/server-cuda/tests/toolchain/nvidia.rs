//! NVIDIA's compilers from a folder: NVRTC loaded into this process for
//! the server to compile with, `ptxas` run on what it makes.
//!
//! cudarc opens NVRTC by *name* (`libnvrtc.so`, …, `libnvrtc.so.13`,
//! `libnvrtc.so.12`), and glibc's `dlopen` of a bare name first looks among
//! the libraries already loaded, by their `DT_SONAME`. So the folder's
//! `libnvrtc.so.12` (or `.so.13`; the soname is the file's name) is opened
//! here by path and never closed, and cudarc's own lookup then binds to it
//! — the server's compile path ([`server_cuda::nvrtc_ptx`]) runs on the
//! real NVRTC. NVRTC opens its builtins (`libnvrtc-builtins.so.12.2`) by
//! name too, so they are opened first, the same way. [`Toolchain::find`]
//! checks that the NVRTC the server uses is the folder's, not one installed
//! elsewhere on the machine, that its ptxas is of the same release, and
//! that the PTX ISA version it writes is the one the server's table
//! ([`server_cuda::CudaVersion::ptx_isa`]) gives its release.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use libloading::Library;
use scope_core::{Error, Kernel};
use server_cuda::{CudaVersion, PtxIsa};

/// The architectures every kernel is compiled and assembled for: the
/// oldest and newest data-centre GPUs the server is meant for (A100, H100).
pub const ARCHS: [u32; 2] = [80, 90];

/// Registers one block may use on sm_80 and sm_90.
const REGISTERS_PER_BLOCK: u64 = 64 * 1024;

/// Jobs numbered so far in this process: each job's files in the one
/// scratch folder are named by its number, and tests that compile at the
/// same time must not write (and delete) each other's.
static JOBS: AtomicUsize = AtomicUsize::new(0);

/// NVRTC and ptxas, found and loaded.
pub struct Toolchain {
    /// The folder `SCOPE_CUDA_TOOLCHAIN` named.
    pub dir: PathBuf,
    /// `libnvrtc.so.12` (or `.so.13`), loaded.
    pub nvrtc: PathBuf,
    /// `ptxas`.
    pub ptxas: PathBuf,
    /// NVRTC's release (`nvrtcVersion`).
    pub nvrtc_version: CudaVersion,
    /// The PTX ISA version NVRTC writes (`.version` of its PTX).
    pub ptx_isa: PtxIsa,
    /// "NVRTC 12.2 (PTX ISA 8.2), ptxas 12.2.140".
    pub versions: String,
    /// Where PTX and cubins are written.
    pub scratch: PathBuf,
}

/// One kernel to check, and where it came from.
pub struct Item {
    /// Which of the project's kernels it is ("tiny-runtime native: matmul").
    pub origin: String,
    pub kernel: Kernel,
}

/// What ptxas said of one kernel on one architecture, and the PTX ISA
/// version NVRTC wrote for it.
struct Assembled {
    registers: u64,
    shared: u64,
    isa: Option<PtxIsa>,
}

/// One kernel the real compilers refused.
pub struct Refusal {
    /// The kernel's [`Item::origin`].
    pub origin: String,
    /// The architecture, `80` for sm_80.
    pub arch: u32,
    /// Which compiler refused it, and its log.
    pub what: String,
}

const SKIP: &str =
    "skipped: no cuda toolchain (set SCOPE_CUDA_TOOLCHAIN, see ci/install-cuda-toolchain.sh)";

impl Toolchain {
    /// The toolchain `SCOPE_CUDA_TOOLCHAIN` names, loaded once per
    /// process; `None` after printing why the test is skipped (a failure
    /// when `SCOPE_REQUIRE` names `cuda-toolchain`).
    pub fn find() -> Option<&'static Toolchain> {
        static FOUND: OnceLock<Result<Option<Toolchain>, String>> = OnceLock::new();
        match FOUND.get_or_init(load) {
            Ok(Some(toolchain)) => Some(toolchain),
            Ok(None) => {
                assert!(
                    !scope_core::required("cuda-toolchain"),
                    "SCOPE_REQUIRE names cuda-toolchain, and SCOPE_CUDA_TOOLCHAIN is not set \
                     (ci/install-cuda-toolchain.sh installs one into target/cuda-toolchain)"
                );
                println!("{SKIP}");
                None
            }
            Err(why) => panic!("the CUDA toolchain in SCOPE_CUDA_TOOLCHAIN is not usable: {why}"),
        }
    }

    /// [`refusals`](Self::refusals), failing with every kernel refused,
    /// named, with the compiler's log. How many distinct kernels were
    /// checked.
    pub fn check(&self, what: &str, items: Vec<Item>) -> usize {
        let (checked, refusals) = self.refusals(what, items);
        if !refusals.is_empty() {
            let mut report = format!(
                "{} of {} compiles were refused by the real CUDA toolchain ({}):\n",
                refusals.len(),
                checked * ARCHS.len(),
                self.versions
            );
            for r in &refusals {
                let _ = write!(
                    report,
                    "\n---- {} on sm_{} ----\n{}\n",
                    r.origin, r.arch, r.what
                );
            }
            panic!("{report}");
        }
        checked
    }

    /// Compile every kernel of `items` with NVRTC, through the server's own
    /// compile path, for each of [`ARCHS`], and assemble each PTX with
    /// ptxas for the same architecture; print a line per kernel and a
    /// count per architecture. Kernels with the same source and entry point
    /// are checked once. How many distinct kernels were checked, and what
    /// the compilers refused.
    pub fn refusals(&self, what: &str, items: Vec<Item>) -> (usize, Vec<Refusal>) {
        let items = distinct(items);
        let jobs: Vec<(usize, u32)> = (0..items.len())
            .flat_map(|i| ARCHS.map(|arch| (i, arch)))
            .collect();
        let next = AtomicUsize::new(0);
        let first_job = JOBS.fetch_add(jobs.len(), Ordering::Relaxed);
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
        let mut results: Vec<(usize, u32, Result<Assembled, String>)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    s.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            let at = next.fetch_add(1, Ordering::Relaxed);
                            let Some(&(i, arch)) = jobs.get(at) else {
                                break done;
                            };
                            let job = first_job + at;
                            done.push((i, arch, self.compile(&items[i].kernel, arch, job)));
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("a compile worker panicked"))
                .collect()
        });
        results.sort_by_key(|(i, arch, _)| (*i, *arch));
        let mut refusals = Vec::new();
        println!(
            "{what}: {} distinct kernels, {}",
            items.len(),
            self.versions
        );
        for (i, arch, result) in &results {
            let item = &items[*i];
            match result {
                Ok(a) => println!(
                    "  ok      sm_{arch}  PTX ISA {}  {:>3} registers  {:>6} B shared  {}",
                    a.isa.map_or_else(|| "?".to_owned(), |v| v.to_string()),
                    a.registers,
                    a.shared,
                    item.origin
                ),
                Err(what) => {
                    println!("  FAILED  sm_{arch}  {}", item.origin);
                    refusals.push(Refusal {
                        origin: item.origin.clone(),
                        arch: *arch,
                        what: what.clone(),
                    });
                }
            }
        }
        for arch in ARCHS {
            let passed = results
                .iter()
                .filter(|(_, a, r)| *a == arch && r.is_ok())
                .count();
            println!(
                "{what}: sm_{arch}: {passed} of {} distinct kernels compiled by NVRTC (compute_{arch}) and assembled by ptxas (sm_{arch})",
                items.len()
            );
        }
        // The PTX ISA versions written: what a driver must JIT to load
        // these kernels.
        let written: std::collections::BTreeSet<String> = results
            .iter()
            .filter_map(|(_, _, r)| r.as_ref().ok())
            .map(|a| {
                a.isa
                    .map_or_else(|| "none declared".to_owned(), |v| v.to_string())
            })
            .collect();
        let mut written: Vec<String> = written.into_iter().collect();
        if written.is_empty() {
            written.push("none (every compile was refused)".to_owned());
        }
        let driver = CudaVersion::oldest_for(self.ptx_isa).map_or_else(String::new, |v| {
            format!(", which every driver from CUDA {v} on JITs")
        });
        println!(
            "{what}: PTX ISA written: {} (NVRTC {}{driver})",
            written.join(", "),
            self.nvrtc_version
        );
        (items.len(), refusals)
    }

    /// `kernel` through the server's NVRTC path for `compute_{arch}`, then
    /// ptxas for `sm_{arch}`; the registers and static shared memory ptxas
    /// reports, or what refused it and why.
    fn compile(&self, kernel: &Kernel, arch: u32, job: usize) -> Result<Assembled, String> {
        let ptx = server_cuda::nvrtc_ptx(kernel, &format!("compute_{arch}")).map_err(|e| {
            let options = server_cuda::nvrtc_options(&format!("compute_{arch}")).join(" ");
            let source = self.keep_source(kernel, job);
            match e {
                Error::Compile { log, .. } => {
                    format!("NVRTC ({options}) refused it; the source is in {source}:\n{log}")
                }
                other => format!("NVRTC ({options}) failed: {other}"),
            }
        })?;
        let stem = self.scratch.join(format!("job{job}-sm_{arch}"));
        let ptx_path = stem.with_extension("ptx");
        std::fs::write(&ptx_path, &ptx).map_err(|e| format!("writing {ptx_path:?}: {e}"))?;
        let out = Command::new(&self.ptxas)
            .arg(format!("-arch=sm_{arch}"))
            .arg("--verbose")
            .arg("-o")
            .arg(stem.with_extension("cubin"))
            .arg(&ptx_path)
            .output()
            .map_err(|e| format!("running {:?}: {e}", self.ptxas))?;
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            let source = self.keep_source(kernel, job);
            return Err(format!(
                "ptxas -arch=sm_{arch} refused NVRTC's PTX ({ptx_path:?}; the source is in {source}):\n{said}"
            ));
        }
        let _ = std::fs::remove_file(&ptx_path);
        let _ = std::fs::remove_file(stem.with_extension("cubin"));
        let isa = PtxIsa::of(&ptx);
        if isa != Some(self.ptx_isa) {
            return Err(format!(
                "NVRTC {} wrote PTX declaring ISA {isa:?}, not the {} of its release: \
                 a driver would need a different version than the bundle promises",
                self.nvrtc_version, self.ptx_isa
            ));
        }
        let assembled = Assembled {
            registers: number_before(&said, " registers").unwrap_or(0),
            shared: number_before(&said, " bytes smem").unwrap_or(0),
            isa,
        };
        // What the driver checks at launch: a block needs its threads'
        // registers, allocated per warp in units of 256.
        let threads: u64 = kernel.block_size().iter().map(|&d| u64::from(d)).product();
        let per_warp = (assembled.registers * 32).div_ceil(256) * 256;
        let needed = per_warp * threads.div_ceil(32);
        if needed > REGISTERS_PER_BLOCK {
            return Err(format!(
                "ptxas gave it {} registers a thread: a block of {threads} threads needs {needed}, \
                 more than the {REGISTERS_PER_BLOCK} an SM has, so every launch would fail with \
                 CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES\n{said}",
                assembled.registers
            ));
        }
        Ok(assembled)
    }

    /// Write `kernel`'s source into the scratch folder for a person to
    /// read; its path.
    fn keep_source(&self, kernel: &Kernel, job: usize) -> String {
        let path = self.scratch.join(format!("job{job}.cu"));
        let text = kernel.source().text().unwrap_or_default();
        match std::fs::write(&path, text) {
            Ok(()) => path.display().to_string(),
            Err(e) => format!("(not kept: {e})"),
        }
    }
}

/// `items` with later duplicates (same source and entry point) dropped.
fn distinct(items: Vec<Item>) -> Vec<Item> {
    let mut seen = std::collections::HashSet::new();
    items
        .into_iter()
        .filter(|item| {
            let source = item.kernel.source().text().unwrap_or_default().to_owned();
            seen.insert((source, item.kernel.entry_point().to_string()))
        })
        .collect()
}

/// The number just before the first `unit` in `text` ("12 registers").
fn number_before(text: &str, unit: &str) -> Option<u64> {
    let at = text.find(unit)?;
    let digits: String = text[..at]
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.chars().rev().collect::<String>().parse().ok()
}

/// The first of `candidates` (relative to `dir`) that exists.
fn first_in(dir: &Path, candidates: &[&str]) -> Option<PathBuf> {
    candidates.iter().map(|c| dir.join(c)).find(|p| p.exists())
}

/// Find the toolchain `SCOPE_CUDA_TOOLCHAIN` names and load its NVRTC.
/// `Ok(None)` when the variable is not set.
fn load() -> Result<Option<Toolchain>, String> {
    let Some(named) = std::env::var_os("SCOPE_CUDA_TOOLCHAIN").filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    // Relative to the workspace root, where `cargo xtask` and the install
    // script run; cargo runs a test binary in its package's folder.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = root.join(&named);
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    // The wheels' layouts (nvidia/cuda_nvrtc/… for 12.x, nvidia/cu13/…
    // for 13.x), then a CUDA toolkit's; 12.x first, the NVRTC the bundle
    // carries.
    let nvrtc = first_in(
        &dir,
        &[
            "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
            "nvidia/cu13/lib/libnvrtc.so.13",
            "lib64/libnvrtc.so.12",
            "lib64/libnvrtc.so.13",
            "lib/libnvrtc.so.12",
            "lib/libnvrtc.so.13",
            "targets/x86_64-linux/lib/libnvrtc.so.12",
            "targets/x86_64-linux/lib/libnvrtc.so.13",
        ],
    )
    .ok_or_else(|| format!("no libnvrtc.so.12 or .so.13 in {}", dir.display()))?;
    let ptxas = first_in(
        &dir,
        &[
            "nvidia/cuda_nvcc/bin/ptxas",
            "nvidia/cu13/bin/ptxas",
            "bin/ptxas",
        ],
    )
    .ok_or_else(|| format!("no ptxas in {}", dir.display()))?;
    let major = nvrtc
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default()
        .to_owned();
    let lib_dir = nvrtc.parent().expect("a file has a folder");
    let builtins = std::fs::read_dir(lib_dir)
        .map_err(|e| format!("{}: {e}", lib_dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("libnvrtc-builtins.so.{major}")))
        })
        .min()
        .ok_or_else(|| {
            format!(
                "no libnvrtc-builtins.so.{major}.* beside {}",
                nvrtc.display()
            )
        })?;
    for library in [&builtins, &nvrtc] {
        // SAFETY: NVIDIA's NVRTC and its builtins, whose initialisers only
        // set up their own state; leaked, so never unloaded while a symbol
        // taken from them (by cudarc, by NVRTC) is in use.
        let loaded = unsafe { Library::new(library) }
            .map_err(|e| format!("loading {}: {e}", library.display()))?;
        Box::leak(Box::new(loaded));
    }
    let version = nvrtc_version(&nvrtc)?;
    let ptxas_version = Command::new(&ptxas)
        .arg("--version")
        .output()
        .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
    // "Cuda compilation tools, release 12.2, V12.2.140"
    let ptxas_version = String::from_utf8_lossy(&ptxas_version.stdout)
        .split_whitespace()
        .rfind(|w| w.starts_with('V'))
        .map_or_else(|| "(version unknown)".to_owned(), |w| w[1..].to_owned());
    // PTX assembled by the ptxas of NVRTC's own release: an older one would
    // refuse the PTX's ISA, a newer one would accept what the driver's JIT
    // of NVRTC's release might not.
    if !ptxas_version.starts_with(&format!("{version}.")) {
        return Err(format!(
            "ptxas {ptxas_version} ({}) is not of NVRTC {version}'s release; \
             install both from one CUDA release (ci/install-cuda-toolchain.sh)",
            ptxas.display()
        ));
    }
    let scratches = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cuda-toolchain");
    forget_finished(&scratches);
    let scratch = scratches.join(std::process::id().to_string());
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let nvrtc_version = version
        .split_once('.')
        .and_then(|(major, minor)| Some(CudaVersion::new(major.parse().ok()?, minor.parse().ok()?)))
        .ok_or_else(|| format!("nvrtcVersion answered {version}"))?;
    let ptx_isa = probe_isa()?;
    // The server's table of which driver JITs which PTX must agree with
    // what NVRTC writes, or its errors and run.sh's verdicts would be
    // wrong.
    if nvrtc_version.ptx_isa() != Some(ptx_isa) {
        return Err(format!(
            "NVRTC {nvrtc_version} writes PTX ISA {ptx_isa}, but server-cuda's table \
             (CudaVersion::ptx_isa) says {:?}: correct the table (src/ptx.rs)",
            nvrtc_version.ptx_isa()
        ));
    }
    let toolchain = Toolchain {
        dir,
        nvrtc,
        ptxas,
        nvrtc_version,
        ptx_isa,
        versions: format!("NVRTC {version} (PTX ISA {ptx_isa}), ptxas {ptxas_version}"),
        scratch,
    };
    toolchain.check_binding()?;
    Ok(Some(toolchain))
}

/// The PTX ISA version of what the server's NVRTC writes for a trivial
/// kernel.
fn probe_isa() -> Result<PtxIsa, String> {
    // SAFETY: only ever compiled, never launched.
    let probe = unsafe {
        Kernel::cuda(
            "probe",
            r#"extern "C" __global__ void probe(unsigned int* out) { out[threadIdx.x] = 1; }"#,
        )
    };
    let ptx = server_cuda::nvrtc_ptx(&probe, "compute_80")
        .map_err(|e| format!("the server could not compile a trivial kernel: {e}"))?;
    PtxIsa::of(&ptx).ok_or_else(|| format!("NVRTC's PTX declares no .version:\n{ptx}"))
}

/// Remove the scratch folders (named by process id) of test processes that
/// have ended; a failed run's stays until the next run, to be read.
fn forget_finished(scratches: &Path) {
    let Ok(entries) = std::fs::read_dir(scratches) else {
        return;
    };
    for entry in entries.flatten() {
        let pid = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok());
        if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// `major.minor` of the NVRTC at `path` (already loaded).
fn nvrtc_version(path: &Path) -> Result<String, String> {
    // SAFETY: the library is already loaded (and never unloaded); this
    // opens it again by path, which only counts a reference.
    let library = unsafe { Library::new(path) }.map_err(|e| format!("{e}"))?;
    // SAFETY: `nvrtcVersion(int*, int*)` as nvrtc.h declares it.
    let version = unsafe {
        library.get::<unsafe extern "C" fn(*mut i32, *mut i32) -> i32>(b"nvrtcVersion\0")
    }
    .map_err(|e| format!("{e}"))?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two ints for NVRTC to write.
    let status = unsafe { version(&mut major, &mut minor) };
    if status != 0 {
        return Err(format!("nvrtcVersion returned {status}"));
    }
    Ok(format!("{major}.{minor}"))
}

impl Toolchain {
    /// Compile a trivial kernel through the server, then make sure every
    /// NVRTC mapped into this process is this folder's: cudarc tries
    /// `libnvrtc.so` before `libnvrtc.so.13`, and a development symlink
    /// installed elsewhere would win.
    fn check_binding(&self) -> Result<(), String> {
        // SAFETY: only ever compiled, never launched.
        let probe = unsafe {
            Kernel::cuda(
                "probe",
                r#"extern "C" __global__ void probe(unsigned int* out) { out[threadIdx.x] = 1; }"#,
            )
        };
        server_cuda::nvrtc_ptx(&probe, "compute_80")
            .map_err(|e| format!("the server could not compile a trivial kernel: {e}"))?;
        let maps = std::fs::read_to_string("/proc/self/maps")
            .map_err(|e| format!("/proc/self/maps: {e}"))?;
        let folder = self.nvrtc.parent().expect("a file has a folder");
        let foreign: Vec<&str> = maps
            .lines()
            .filter_map(|line| line.split_whitespace().nth(5))
            .filter(|path| {
                Path::new(path)
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libnvrtc"))
            })
            .filter(|path| !Path::new(path).starts_with(folder))
            .collect();
        if foreign.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the server's NVRTC is not the one in {}: {foreign:?} is loaded too",
                self.dir.display()
            ))
        }
    }
}
