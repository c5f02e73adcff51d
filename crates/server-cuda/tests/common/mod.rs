//! Kernels and helpers the CUDA test binaries share.

#![allow(dead_code)]

#[macro_use]
pub mod cases;

use scope_core::Kernel;
use scope_test::client_or_skip;
use server_cuda::Cuda;

/// `out[i] = value` for `i < n`; scalars `{n, value}`.
pub const FILL: &str = r#"
struct FillArgs { unsigned int n; unsigned int value; };
extern "C" __global__ void fill(unsigned int* out, FillArgs a) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < a.n) out[i] = a.value;
}
"#;

/// `out[i] = in[i]` for `i < n`; scalars `{n}`.
pub const COPY: &str = r#"
struct N { unsigned int n; };
extern "C" __global__ void copy(const unsigned int* in, unsigned int* out, N a) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < a.n) out[i] = in[i];
}
"#;

/// `out[i] = a[i] + b[i]` (wrapping) for `i < n`; scalars `{n}`.
pub const ADD: &str = r#"
struct N { unsigned int n; };
extern "C" __global__ void add(const unsigned int* a, const unsigned int* b, unsigned int* out, N p) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) out[i] = a[i] + b[i];
}
"#;

/// `acc[i] += by[i]` for `i < n`; scalars `{n}`.
pub const ACCUMULATE: &str = r#"
struct N { unsigned int n; };
extern "C" __global__ void accumulate(const unsigned int* by, unsigned int* acc, N p) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) acc[i] += by[i];
}
"#;

/// Writes through a wild pointer: a real `CUDA_ERROR_ILLEGAL_ADDRESS`.
pub const WILD: &str = r#"
extern "C" __global__ void wild(unsigned int* out) {
    unsigned int* nowhere = (unsigned int*)0x10;
    nowhere[threadIdx.x] = out[threadIdx.x];
    out[threadIdx.x] = 1;
}
"#;

/// A kernel that does not compile: NVRTC reports the undeclared name.
pub const BROKEN: &str =
    r#"extern "C" __global__ void broken(unsigned int* out) { out[0] = this_is_not_declared; }"#;

/// A suite's ranks: the mock's four devices over the mock NCCL, each
/// made after `$ready`; they recover as the mock's plain client does.
#[allow(unused_macros)] // the binaries without a collectives suite
macro_rules! over_mock_nccl {
    ($ready:expr) => {
        fn capabilities() -> &'static [scope_test::Capability] {
            &[
                scope_test::Capability::DeviceCollectives,
                scope_test::Capability::Reopen,
            ]
        }

        fn rank_client(rank: usize) -> scope_core::Result<scope_core::Client<server_cuda::Cuda>> {
            $ready;
            server_cuda::client_on(rank)
        }

        fn group(
            clients: Vec<scope_core::Client<server_cuda::Cuda>>,
            deadline: std::time::Duration,
        ) -> scope_core::Result<scope_core::collective::Group<server_cuda::Cuda>> {
            scope_core::collective::Group::over_device(clients, deadline)
        }
    };
}

/// `struct $name`, a conformance `Suite` over this file's CUDA C++ kernels
/// whose clients come from `$client`, whose oversized allocation is
/// `$oversized`, and whose tests each end with `$finished`: the real-device
/// and mock binaries differ only in those. A last `{ ... }` adds (or
/// overrides) `Suite` methods: a collectives suite's ranks and group.
#[allow(unused_macros)] // the binaries that include `common` without a suite
macro_rules! cuda_suite {
    ($name:ident, $client:expr, $oversized:expr, $finished:expr) => {
        cuda_suite!($name, $client, $oversized, $finished, {});
    };
    ($name:ident, $client:expr, $oversized:expr, $finished:expr, { $($more:tt)* }) => {
        struct $name;

        impl scope_test::Suite for $name {
            type Backend = server_cuda::Cuda;

            fn client() -> scope_core::Result<scope_core::Client<server_cuda::Cuda>> {
                $client
            }

            fn fill() -> scope_core::Kernel {
                common::kernel("fill", common::FILL)
            }

            fn copy() -> scope_core::Kernel {
                common::kernel("copy", common::COPY)
            }

            fn add() -> scope_core::Kernel {
                common::kernel("add", common::ADD)
            }

            fn broken() -> scope_core::Kernel {
                common::kernel("broken", common::BROKEN)
            }

            fn oversized() -> Option<u64> {
                $oversized
            }

            fn finished() {
                $finished
            }

            $($more)*
        }
    };
}

/// A CUDA kernel with block 64.
pub fn kernel(name: &str, source: &str) -> Kernel {
    // SAFETY: the test kernels guard every access with the sizes their
    // launches pass, and the tests pass sizes no larger than the bindings;
    // the poison tests, which fault through a wild pointer on purpose, run
    // in a process of their own, where no other buffer's bytes are at stake.
    unsafe { Kernel::cuda(name, source) }.block([64, 1, 1])
}

/// A client of a CUDA server with NVRTC, or `None` after printing
/// `skipped: no cuda device (...)` (a failure with `SCOPE_REQUIRE=cuda`).
pub fn client() -> Option<scope_core::Client<Cuda>> {
    client_or_skip(make)
}

/// A client that can compile CUDA C++; without NVRTC the device is
/// unavailable *for these tests*.
pub fn make() -> scope_core::Result<scope_core::Client<Cuda>> {
    make_on(0)
}

/// [`make`] on device `ordinal`.
pub fn make_on(ordinal: usize) -> scope_core::Result<scope_core::Client<Cuda>> {
    let client = server_cuda::client_on(ordinal)?;
    if !client.with_backend(|b| b.has_nvrtc()) {
        return Err(scope_core::Error::BackendUnavailable {
            backend: "cuda",
            reason: "a device is present but NVRTC (libnvrtc) is not; the tests use CUDA C++"
                .to_owned(),
        });
    }
    Ok(client)
}

/// Little-endian bytes of `words`.
pub fn bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// `bytes` as little-endian words.
pub fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// 256 words of `value`, written by a `fill` kernel: a round's input.
pub fn filled(c: &scope_core::Client<Cuda>, value: u32) -> scope_core::Buffer {
    let input = c.try_allocate(1024).expect("an input");
    c.launch(
        &kernel("fill", FILL),
        &[scope_core::Binding::write(&input)],
        &bytes(&[256, value]),
        scope_core::Dispatch::linear(4),
    )
    .expect("a fill");
    input
}

/// A kernel through a wild pointer after `input`'s writer: the mock's
/// fault, pending until a wait surfaces it, then sticky for the process.
pub fn fault_after(c: &scope_core::Client<Cuda>, input: &scope_core::Buffer) {
    c.launch(
        &kernel("wild", WILD),
        &[scope_core::Binding::read_write(input)],
        &[],
        scope_core::Dispatch::linear(1),
    )
    .expect("a wild kernel launches");
}

/// A read of a round's output after a fault: the device's fault, or the
/// round's failure — never the bytes as clean.
pub fn fails_as_a_faulted_round(rank: usize, read: scope_core::Result<Vec<u8>>) {
    let read = read.expect_err("no rank reads the round's bytes as clean");
    assert!(
        read.is_sticky()
            || read.is_device_poisoned()
            || matches!(read.root(), scope_core::Error::Collective(_)),
        "rank {rank}: {read}"
    );
}
