//! HIP C++ kernels for the conformance suite and the device tests.
//!
//! The binding convention: device pointers of the bindings in order, then
//! the scalar blob by value as a struct. Blocks of 64, one word each. The
//! entry points carry a prefix so they cannot meet a name from a header
//! hiprtc includes on its own; the kernels keep the suite's names for
//! reports.

#![allow(dead_code)]

pub mod cases;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use scope_core::Kernel;
use scope_test::clib::CLibrary;

/// How many `hipDeviceReset`s the mock runtime has done.
pub fn mock_resets() -> u64 {
    // SAFETY: the mock library, already loaded by the server under test;
    // opening it again only takes a reference, and it is never unloaded
    // while the process runs (the handle is leaked).
    let library = Box::leak(Box::new(
        unsafe { libloading::Library::new(mock_library()) }.expect("the mock HIP runtime"),
    ));
    // SAFETY: the mock declares `unsigned long long scope_mock_resets(void)`.
    let resets = unsafe { library.get::<unsafe extern "C" fn() -> u64>(b"scope_mock_resets\0") }
        .expect("the mock's reset counter");
    // SAFETY: reads a counter.
    unsafe { resets() }
}

/// The mock HIP runtime (`tests/mock/mock_hip.c`), built once for every
/// test process ([`scope_test::clib`]); its path.
pub fn mock_library() -> String {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| {
        let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mock/mock_hip.c");
        CLibrary {
            source: &source,
            stem: "libscope_mock_hip",
            ..CLibrary::default()
        }
        .build(Path::new(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("the mock HIP runtime: {e}"))
        .to_string_lossy()
        .into_owned()
    })
    .clone()
}

const BLOCK: [u32; 3] = [64, 1, 1];

const FILL: &str = r#"
struct FillArgs { unsigned int n; unsigned int value; };
extern "C" __global__ void scope_fill(unsigned int* out, FillArgs args) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < args.n) out[i] = args.value;
}
"#;

const COPY: &str = r#"
struct CopyArgs { unsigned int n; };
extern "C" __global__ void scope_copy(const unsigned int* in, unsigned int* out, CopyArgs args) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < args.n) out[i] = in[i];
}
"#;

const ADD: &str = r#"
struct AddArgs { unsigned int n; };
extern "C" __global__ void scope_add(const unsigned int* a, const unsigned int* b, unsigned int* out, AddArgs args) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < args.n) out[i] = a[i] + b[i];
}
"#;

const BROKEN: &str = r#"
extern "C" __global__ void scope_broken(unsigned int* out) {
    out[threadIdx.x] = this_name_is_not_declared_anywhere;
}
"#;

fn hip(name: &str, entry: &str, source: &str) -> Kernel {
    // SAFETY: the test kernels guard every access with the sizes their
    // launches pass, and the tests pass sizes no larger than the bindings;
    // the poison tests, which fault through a wild pointer on purpose, run
    // in a process of their own, where no other buffer's bytes are at stake.
    unsafe { Kernel::hip(name, source) }
        .entry(entry)
        .block(BLOCK)
}

/// `out[i] = value` for `i < n`; bindings `[out]`; scalars `[n, value]`.
pub fn fill() -> Kernel {
    hip("fill", "scope_fill", FILL)
}

/// `out[i] = in[i]` for `i < n`; bindings `[in, out]`; scalars `[n]`.
pub fn copy() -> Kernel {
    hip("copy", "scope_copy", COPY)
}

/// `out[i] = a[i] + b[i]` for `i < n`; bindings `[a, b, out]`; scalars `[n]`.
pub fn add() -> Kernel {
    hip("add", "scope_add", ADD)
}

/// A kernel that does not compile: it names an undeclared identifier.
pub fn broken() -> Kernel {
    hip("broken", "scope_broken", BROKEN)
}

/// A suite's ranks: the mock runtime's four devices over the mock RCCL,
/// each made after `$ready`, every test ending with no call the mock
/// refused; they recover as the mock's plain client does.
#[allow(unused_macros)] // the binaries without a collectives suite
macro_rules! over_mock_rccl {
    ($ready:expr) => {
        fn capabilities() -> &'static [scope_test::Capability] {
            &[
                scope_test::Capability::DeviceCollectives,
                scope_test::Capability::Reopen,
            ]
        }

        fn rank_client(rank: usize) -> scope_core::Result<scope_core::Client<server_hip::Hip>> {
            $ready;
            let path = vec![common::mock_library()];
            server_hip::client_from(&path, &path, rank)
        }

        fn group(
            clients: Vec<scope_core::Client<server_hip::Hip>>,
            deadline: std::time::Duration,
        ) -> scope_core::Result<scope_core::collective::Group<server_hip::Hip>> {
            $ready;
            scope_core::collective::Group::over_device(clients, deadline)
        }

        fn finished() {
            let (count, last) = common::rccl_violations();
            assert_eq!(
                count, 0,
                "a call real RCCL refuses or mis-handles; the last: {last}"
            );
        }
    };
}

/// `struct $name`, a conformance `Suite` over this file's HIP kernels whose
/// clients come from `$client` and whose oversized allocation is
/// `$oversized`: the real-device and mock binaries differ only in those. A
/// last `{ ... }` adds `Suite` methods: a collectives suite's ranks and
/// group.
#[allow(unused_macros)] // the binaries that include `common` without a suite
macro_rules! hip_suite {
    ($name:ident, $client:expr, $oversized:expr) => {
        hip_suite!($name, $client, $oversized, {});
    };
    ($name:ident, $client:expr, $oversized:expr, { $($more:tt)* }) => {
        struct $name;

        impl scope_test::Suite for $name {
            type Backend = server_hip::Hip;

            fn client() -> scope_core::Result<scope_core::Client<server_hip::Hip>> {
                $client
            }

            fn fill() -> scope_core::Kernel {
                common::fill()
            }

            fn copy() -> scope_core::Kernel {
                common::copy()
            }

            fn add() -> scope_core::Kernel {
                common::add()
            }

            fn broken() -> scope_core::Kernel {
                common::broken()
            }

            fn oversized() -> Option<u64> {
                $oversized
            }

            $($more)*
        }
    };
}

/// Little-endian `u32` scalars.
pub fn scalars(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Bytes as little-endian `u32` words.
pub fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A client of the mock HIP runtime's first device.
pub fn mock_client() -> scope_core::Result<scope_core::Client<server_hip::Hip>> {
    let path = vec![mock_library()];
    server_hip::client_from(&path, &path, 0)
}

/// The mock RCCL: the kit's mock NCCL (RCCL is NCCL's API), built
/// over this process's mock HIP runtime and loaded as the server's RCCL,
/// once per process; its path.
pub fn mock_rccl() -> &'static libloading::Library {
    static RCCL: OnceLock<libloading::Library> = OnceLock::new();
    RCCL.get_or_init(|| {
        let out = CLibrary {
            source: Path::new(scope_test::clib::MOCK_NCCL),
            stem: "libscope_mock_rccl",
            defines: &[format!("SCOPE_MOCK_DRIVER=\"{}\"", mock_library())],
            libs: &["pthread", "dl"],
            ..CLibrary::default()
        }
        .build(Path::new(env!("CARGO_TARGET_TMPDIR")))
        .unwrap_or_else(|e| panic!("the mock RCCL: {e}"));
        // The runtime first: the mock RCCL asks it for the current device.
        drop(mock_client().expect("the mock HIP runtime loads"));
        let path = out.to_string_lossy().into_owned();
        server_hip::load_rccl_from(std::slice::from_ref(&path)).expect("the mock RCCL loads");
        // SAFETY: the mock's initialisers do nothing; it is loaded already
        // (above), so this only takes another reference to it.
        unsafe { libloading::Library::new(&path) }.expect("the mock RCCL is loaded")
    })
}

/// The mock runtime's and the mock RCCL's timed mode for the process:
/// each of `kernels` takes its time, a collective `latency` plus its
/// bytes at `bytes_per_second` (0: no time for bytes).
#[allow(dead_code)] // the binaries without timed tests
pub fn timed(
    kernels: &[(&std::ffi::CStr, std::time::Duration)],
    latency: std::time::Duration,
    bytes_per_second: f64,
) {
    let rccl = mock_rccl();
    // SAFETY: the mock runtime, loaded by `mock_rccl` already; opening it
    // again only takes a reference, leaked so it is never unloaded.
    let hip = Box::leak(Box::new(
        unsafe { libloading::Library::new(mock_library()) }.expect("the mock runtime"),
    ));
    // SAFETY: the hooks are declared in the mocks with these signatures,
    // and set values under their locks.
    unsafe {
        let timing = hip
            .get::<unsafe extern "C" fn(i32)>(b"scope_mock_timing\0")
            .expect("the mock's hook");
        let kernel_time = hip
            .get::<unsafe extern "C" fn(*const std::ffi::c_char, u64)>(b"scope_mock_kernel_time\0")
            .expect("the mock's hook");
        let model = rccl
            .get::<unsafe extern "C" fn(u64, f64)>(b"scope_mock_nccl_model\0")
            .expect("the mock's hook");
        timing(1);
        for (kind, time) in kernels {
            kernel_time(kind.as_ptr(), time.as_nanos() as u64);
        }
        model(latency.as_nanos() as u64, bytes_per_second);
    }
}

/// Calls the mock RCCL refused because real RCCL would refuse, hang or move
/// the wrong bytes; and the last.
pub fn rccl_violations() -> (u64, String) {
    let rccl = mock_rccl();
    // SAFETY: the hooks are declared in the mock with these signatures;
    // the library stays loaded for the process.
    unsafe {
        let count = rccl
            .get::<unsafe extern "C" fn() -> u64>(b"scope_mock_nccl_violations\0")
            .expect("the mock's hook");
        let last = rccl
            .get::<unsafe extern "C" fn() -> *const std::ffi::c_char>(
                b"scope_mock_nccl_last_violation\0",
            )
            .expect("the mock's hook");
        (
            count(),
            std::ffi::CStr::from_ptr(last())
                .to_string_lossy()
                .into_owned(),
        )
    }
}

/// A unique id of the mock RCCL's shared mode: its clique a file of `dir`,
/// which ranks in other processes join.
pub fn shared_rccl_id(dir: &std::path::Path) -> scope_native::nccl::UniqueId {
    use scope_native::nccl::UniqueId;
    let rccl = mock_rccl();
    let dir = std::ffi::CString::new(dir.to_string_lossy().as_bytes())
        .expect("a folder path without NUL");
    let mut id = UniqueId([0; 128]);
    // SAFETY: the hook is declared in the mock with this signature; it
    // reads the path and writes the 128 bytes of `id` (`ncclUniqueId`'s
    // layout, which `UniqueId` is); the library stays loaded.
    let made = unsafe {
        let make = rccl
            .get::<unsafe extern "C" fn(*const std::ffi::c_char, *mut UniqueId) -> i32>(
                b"scope_mock_nccl_shared_id\0",
            )
            .expect("the mock's hook");
        make(dir.as_ptr(), &mut id)
    };
    assert_eq!(made, 0, "the mock made no shared id");
    id
}
