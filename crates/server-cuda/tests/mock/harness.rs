//! Building and loading the mock CUDA driver, NVRTC and NCCL (`mock_cuda.c`,
//! `mock_nvrtc.c`, and the kit's [`MOCK_NCCL`]), for the test binaries that
//! run the server against them: `mock.rs`, `mock_poison.rs`,
//! `mock_old_driver.rs` (the driver built as an older one),
//! `mock_driver_failures.rs` (failures planted with [`Mock::fail_next`]),
//! and `toolchain.rs`, which builds them for its child processes. The
//! real-device binaries (`device.rs`, `conformance.rs`, `poison.rs`) never
//! include this file, so the mock cannot leak into them.
//!
//! cudarc finds its libraries by *name* (`libcuda.so`, then versioned
//! names) with `dlopen`, and the loader's search path cannot change once
//! the process runs. But glibc's `dlopen` of a bare name first looks among
//! the objects already loaded, matching their `DT_SONAME`. So each mock is
//! linked with `-Wl,-soname,libcuda.so` (`libnvrtc.so`), opened here by
//! absolute path and never closed; cudarc's own `dlopen("libcuda.so")` then
//! returns the mock. [`mock`] checks that this holds before any test
//! relies on it: a bare-name open must yield a library with the mock's own
//! hook.
//!
//! Each test process compiles its own copy (nextest runs every test in a
//! process of its own, concurrently, and one process loading a library
//! another is still writing gets a truncated file).

// Each binary that includes this uses a different part of it.
#![allow(dead_code)]

use std::ffi::{CStr, c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::Library;
use scope_core::Client;
use scope_test::clib::MOCK_NCCL;
use server_cuda::Cuda;

/// The loaded mocks and their test hooks.
pub struct Mock {
    cuda: &'static Library,
    nvrtc: &'static Library,
    nccl: &'static Library,
}

/// Compile the mock `source` (a file of `tests/mock`, or a path) into a
/// shared library whose `DT_SONAME` is `soname`; its path. `toolchain.rs`
/// also puts copies named by their sonames on a child process's
/// `LD_LIBRARY_PATH`.
pub fn build(source: &str, soname: &str, defines: &[&str]) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mock")
        .join(source);
    let stem = format!("{}-scope-mock", soname.trim_end_matches(".so"));
    let defines: Vec<String> = defines.iter().map(|d| (*d).to_owned()).collect();
    scope_test::clib::CLibrary {
        source: &path,
        stem: &stem,
        soname: Some(soname),
        defines: &defines,
        flags: &["-Wextra"],
        libs: &["pthread", "dl"],
    }
    .build(Path::new(env!("CARGO_TARGET_TMPDIR")))
    .unwrap_or_else(|e| panic!("the mock {source}: {e}"))
}

/// Open `path` and keep it loaded for the life of the process.
fn load_forever(path: &PathBuf) -> &'static Library {
    // SAFETY: the library is our mock, whose initialisers do nothing; it is
    // never unloaded (leaked), so no symbol taken from it outlives it.
    let library =
        unsafe { Library::new(path) }.unwrap_or_else(|e| panic!("loading the mock {path:?}: {e}"));
    Box::leak(Box::new(library))
}

static MOCK: OnceLock<(Mock, &'static [&'static str])> = OnceLock::new();

/// The mocks, built and loaded once per process, before any driver call:
/// the variant a binary asked for with [`mock_built_with`], or the default.
pub fn mock() -> &'static Mock {
    &MOCK.get_or_init(|| load(&[])).0
}

/// The mocks, the driver and NVRTC built with `defines`
/// (`SCOPE_MOCK_OLD_DRIVER`, `SCOPE_MOCK_DRIVER_VERSION=12020`,
/// `SCOPE_MOCK_NVRTC_VERSION=122`).
/// One variant per process: the first call builds and loads it, and cudarc
/// binds to whatever was loaded first, so a binary uses one variant only.
pub fn mock_built_with(defines: &'static [&'static str]) -> &'static Mock {
    let (mock, built) = MOCK.get_or_init(|| load(defines));
    assert_eq!(
        *built, defines,
        "one mock variant per process: this one was built with {built:?}"
    );
    mock
}

fn load(defines: &'static [&'static str]) -> (Mock, &'static [&'static str]) {
    let cuda = load_forever(&build("mock_cuda.c", "libcuda.so", defines));
    // The driver's defines reach the mock NVRTC too: it reads
    // `SCOPE_MOCK_NVRTC_VERSION` and ignores the driver's.
    let nvrtc = load_forever(&build("mock_nvrtc.c", "libnvrtc.so", defines));
    let nccl = load_forever(&build(MOCK_NCCL, "libnccl.so", &[]));
    // What cudarc will do: open the first candidate name. It must get
    // the mock, not a real driver elsewhere on the machine.
    for (name, hook) in [
        ("libcuda.so", &b"scope_mock_violations\0"[..]),
        ("libnvrtc.so", &b"scope_mock_nvrtc_violations\0"[..]),
        ("libnccl.so", &b"scope_mock_nccl_violations\0"[..]),
    ] {
        // SAFETY: the name resolves to the mock already loaded (or the
        // assertion below fails); looking a symbol up calls nothing.
        let by_name = unsafe { Library::new(name) }
            .unwrap_or_else(|e| panic!("{name} did not resolve to the loaded mock: {e}"));
        // SAFETY: as above.
        let found = unsafe { by_name.get::<unsafe extern "C" fn() -> u64>(hook) }.is_ok();
        assert!(found, "{name} resolved to a library that is not the mock");
    }
    (Mock { cuda, nvrtc, nccl }, defines)
}

impl Mock {
    /// Make the next call of the driver entry point `call` return `code`:
    /// a failure where the mock would not make one by itself.
    pub fn fail_next(&self, call: &str, code: i32) {
        let f: unsafe extern "C" fn(*const c_char, i32) =
            self.hook(self.cuda, b"scope_mock_fail_next\0");
        let call = std::ffi::CString::new(call).expect("an entry point name");
        // SAFETY: the mock copies the name under its lock before returning.
        unsafe { f(call.as_ptr(), code) }
    }

    /// Leave a sticky `code` pending, as a wild kernel leaves an illegal
    /// address: the next sync surfaces it, and every call after answers it
    /// until a reset clears it (one that is not process-fatal).
    pub fn fault_next_sync(&self, code: i32) {
        let f: unsafe extern "C" fn(i32) = self.hook(self.cuda, b"scope_mock_fault_next_sync\0");
        // SAFETY: sets two values under the mock's lock.
        unsafe { f(code) }
    }

    /// Switch the timed mode on or off (with no work in flight): streams
    /// run their work in modelled time, and host waits sleep until it is
    /// done.
    pub fn timing(&self, on: bool) {
        let f: unsafe extern "C" fn(i32) = self.hook(self.cuda, b"scope_mock_timing\0");
        // SAFETY: sets a flag under the mock's lock.
        unsafe { f(i32::from(on)) }
    }

    /// The modelled time of every kernel of `kind` (`fill`, `copy`, `add`,
    /// `accumulate`) in the timed mode.
    pub fn kernel_time(&self, kind: &str, time: std::time::Duration) {
        let f: unsafe extern "C" fn(*const c_char, u64) =
            self.hook(self.cuda, b"scope_mock_kernel_time\0");
        let kind = std::ffi::CString::new(kind).expect("a kernel kind");
        let ns = u64::try_from(time.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: the mock reads the name under its lock before returning.
        unsafe { f(kind.as_ptr(), ns) }
    }

    /// The mock NCCL's model of a collective in the timed mode: `latency`
    /// plus its bytes over `bytes_per_second`, from the moment the last
    /// rank's part started.
    pub fn nccl_model(&self, latency: std::time::Duration, bytes_per_second: f64) {
        let f: unsafe extern "C" fn(u64, f64) = self.hook(self.nccl, b"scope_mock_nccl_model\0");
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: sets two values under the mock NCCL's lock.
        unsafe { f(ns, bytes_per_second) }
    }

    /// Host waits (stream, event and context synchronizations) the
    /// process made on the mock driver.
    pub fn host_waits(&self) -> u64 {
        let f: unsafe extern "C" fn() -> u64 = self.hook(self.cuda, b"scope_mock_host_waits\0");
        // SAFETY: reads a counter under the mock's lock.
        unsafe { f() }
    }

    /// How many primary-context resets the mock has done.
    pub fn resets(&self) -> u64 {
        let f: unsafe extern "C" fn() -> u64 = self.hook(self.cuda, b"scope_mock_resets\0");
        // SAFETY: reads a counter under the mock's lock.
        unsafe { f() }
    }

    fn hook<T: Copy>(&self, library: &'static Library, name: &[u8]) -> T {
        // SAFETY: every hook is declared in the mock with the signature its
        // caller here names; the library is never unloaded.
        unsafe { *library.get::<T>(name).expect("a mock hook") }
    }

    /// Calls the mock driver refused (or flagged) because real CUDA would
    /// refuse or mis-handle them.
    pub fn violations(&self) -> u64 {
        let f: unsafe extern "C" fn() -> u64 = self.hook(self.cuda, b"scope_mock_violations\0");
        // SAFETY: takes the mock's lock and reads a counter.
        unsafe { f() }
    }

    /// What the last violation was.
    pub fn last_violation(&self) -> String {
        let f: unsafe extern "C" fn() -> *const c_char =
            self.hook(self.cuda, b"scope_mock_last_violation\0");
        // SAFETY: the mock returns its static, NUL-terminated buffer.
        unsafe { CStr::from_ptr(f()) }
            .to_string_lossy()
            .into_owned()
    }

    /// Graph execs destroyed before the host waited for their last replay
    /// (legal CUDA; rule 35 has the server wait).
    pub fn graphs_destroyed_in_flight(&self) -> u64 {
        let f: unsafe extern "C" fn() -> u64 =
            self.hook(self.cuda, b"scope_mock_graphs_destroyed_in_flight\0");
        // SAFETY: reads a counter under the mock's lock.
        unsafe { f() }
    }

    /// Invalidate the capture on the raw stream `stream`, as the driver does
    /// after an illegal call during a capture; whether one was in progress.
    pub fn invalidate_capture(&self, stream: *mut c_void) -> bool {
        let f: unsafe extern "C" fn(*mut c_void) -> i32 =
            self.hook(self.cuda, b"scope_mock_invalidate_capture\0");
        // SAFETY: the mock checks the handle and flips a flag under its lock.
        unsafe { f(stream) != 0 }
    }

    /// Operations issued on the raw stream `stream` that the host has not
    /// waited for.
    pub fn pending(&self, stream: *mut c_void) -> u64 {
        let f: unsafe extern "C" fn(*mut c_void) -> u64 =
            self.hook(self.cuda, b"scope_mock_stream_pending\0");
        // SAFETY: the mock reads two counters of a stream it created.
        unsafe { f(stream) }
    }

    /// Compiles the mock NVRTC refused for a missing or unknown
    /// `--gpu-architecture`, or PTX asked for before a compile.
    pub fn nvrtc_violations(&self) -> u64 {
        let f: unsafe extern "C" fn() -> u64 =
            self.hook(self.nvrtc, b"scope_mock_nvrtc_violations\0");
        // SAFETY: reads an atomic counter.
        unsafe { f() }
    }

    /// A unique id of the mock NCCL's shared mode: its clique a file of
    /// `dir`, which ranks in other processes join.
    pub fn shared_nccl_id(&self, dir: &std::path::Path) -> scope_native::nccl::UniqueId {
        let f: unsafe extern "C" fn(*const c_char, *mut scope_native::nccl::UniqueId) -> i32 =
            self.hook(self.nccl, b"scope_mock_nccl_shared_id\0");
        let dir = std::ffi::CString::new(dir.to_string_lossy().as_bytes())
            .expect("a folder path without NUL");
        let mut id = scope_native::nccl::UniqueId([0; 128]);
        // SAFETY: the mock reads the path and writes the 128 bytes of `id`
        // (`ncclUniqueId`'s layout, which `UniqueId` is).
        let made = unsafe { f(dir.as_ptr(), &mut id) };
        assert_eq!(made, 0, "the mock made no shared id");
        id
    }

    /// Die holding the lock of the shared clique of `id`, as a peer process
    /// killed at the wrong instant: never returns.
    pub fn die_holding_shared_clique(&self, id: &scope_native::nccl::UniqueId) -> ! {
        let f: unsafe extern "C" fn(*const scope_native::nccl::UniqueId) =
            self.hook(self.nccl, b"scope_mock_nccl_die_holding\0");
        // SAFETY: the mock reads the 128 bytes of `id` (`ncclUniqueId`'s
        // layout, which `UniqueId` is), then kills this process.
        unsafe { f(id) };
        unreachable!("the mock kills the process")
    }

    /// Whether the shared clique of `id` locks and unlocks: it waits
    /// forever if a dead process's lock is never taken over.
    pub fn shared_clique_locks(&self, id: &scope_native::nccl::UniqueId) -> bool {
        let f: unsafe extern "C" fn(*const scope_native::nccl::UniqueId) -> i32 =
            self.hook(self.nccl, b"scope_mock_nccl_shared_usable\0");
        // SAFETY: as `die_holding_shared_clique`; the mock maps the clique's
        // file, locks it, unlocks it and unmaps it.
        unsafe { f(id) == 1 }
    }

    /// NCCL calls the mock NCCL refused (or flagged) because real NCCL
    /// would refuse, hang or move the wrong bytes.
    pub fn nccl_violations(&self) -> u64 {
        let f: unsafe extern "C" fn() -> u64 =
            self.hook(self.nccl, b"scope_mock_nccl_violations\0");
        // SAFETY: takes the mock's lock and reads a counter.
        unsafe { f() }
    }

    /// The NCCL id `ncclGetUniqueId` last made on this thread: the root of
    /// the group this thread made last (`Group::over_device`).
    pub fn nccl_id_made_here(&self) -> u64 {
        let f: unsafe extern "C" fn() -> u64 =
            self.hook(self.nccl, b"scope_mock_nccl_last_id_made_here\0");
        // SAFETY: reads a thread-local counter.
        unsafe { f() }
    }

    /// How many ranks shrank a communicator through the mock's
    /// `ncclCommShrink` in the line of cliques that NCCL id `root` began:
    /// the shrinks of one group, whatever other tests shrink meanwhile.
    pub fn nccl_shrinks_from(&self, root: u64) -> u64 {
        let f: unsafe extern "C" fn(u64) -> u64 =
            self.hook(self.nccl, b"scope_mock_nccl_shrinks_from\0");
        // SAFETY: takes the mock's lock and reads the cliques' counters.
        unsafe { f(root) }
    }

    /// What the last NCCL violation was.
    pub fn last_nccl_violation(&self) -> String {
        let f: unsafe extern "C" fn() -> *const c_char =
            self.hook(self.nccl, b"scope_mock_nccl_last_violation\0");
        // SAFETY: the mock returns its static, NUL-terminated buffer.
        unsafe { CStr::from_ptr(f()) }
            .to_string_lossy()
            .into_owned()
    }

    /// Fail, naming the last one, if the server made any call the mocks
    /// refuse, or destroyed a graph under a replay.
    pub fn assert_clean(&self) {
        assert_eq!(
            self.violations(),
            0,
            "the server made a call real CUDA refuses or mis-handles; the last: {}",
            self.last_violation()
        );
        assert_eq!(self.nvrtc_violations(), 0, "an NVRTC call was refused");
        assert_eq!(
            self.nccl_violations(),
            0,
            "the server made an NCCL call real NCCL refuses or mis-handles; the last: {}",
            self.last_nccl_violation()
        );
        // Legal CUDA, but rule 35 has the server wait for a graph's replays
        // before destroying it, on every path (fault injection included).
        assert_eq!(
            self.graphs_destroyed_in_flight(),
            0,
            "a graph was destroyed before the host waited for its replays"
        );
    }
}

/// The raw handle of logical stream `index` of `client`, for the hooks.
pub fn raw_stream(client: &Client<Cuda>, index: u32) -> *mut c_void {
    client.with_backend(|b| {
        b.raw_stream(index)
            .expect("the stream exists")
            .cu_stream()
            .cast::<c_void>()
    })
}

/// A client of the server on the mock device.
pub fn mock_client() -> scope_core::Result<Client<Cuda>> {
    mock();
    server_cuda::client()
}

/// [`mock_client`], which must work.
pub fn client() -> Client<Cuda> {
    mock_client().expect("the server starts on the mock driver")
}

/// What a mock variant says of itself, as the server asks it: the driver's
/// CUDA version (`cuDriverGetVersion`), NVRTC's (`nvrtcVersion`), and the
/// architecture the server compiles for on the mock's device (sm_90).
pub fn assert_versions(
    client: &Client<Cuda>,
    driver: server_cuda::CudaVersion,
    nvrtc: server_cuda::CudaVersion,
    arch: &str,
) {
    assert_eq!(server_cuda::cuda_driver_version().unwrap(), driver);
    assert_eq!(server_cuda::nvrtc_version().unwrap(), nvrtc);
    assert_eq!(
        client
            .with_backend(|b| b.nvrtc_arch().map(str::to_owned))
            .as_deref(),
        Some(arch)
    );
}
