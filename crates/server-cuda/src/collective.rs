//! Collectives on the devices, through NCCL: what CUDA states as an
//! [`NcclDevice`], which makes it a
//! [`DeviceCollectives`](scope_core::collective::device::DeviceCollectives)
//! for [`Group::over_device`](scope_core::collective::Group::over_device).
//!
//! The group decides every round before a byte moves
//! (`scope_core::collective::device`), and the communicator that keeps NCCL
//! from hanging or being called after an abort, and the order in which a
//! call is issued, are the core's ([`scope_native::nccl`], shared
//! with HIP's RCCL). What is CUDA's here is where the library comes from,
//! which device it runs on, and where its bytes and streams are:
//!
//! - **The library, by both its names.** NCCL is opened on first use as
//!   `libnccl.so` or, failing that, by its soname `libnccl.so.2` — the only
//!   name NCCL's runtime packages and NVIDIA's wheel install, and one
//!   cudarc's loader does not try — and the entry points are taken from
//!   that library (so a test's mock, loaded under `libnccl.so` first, is
//!   what runs). Without it a group's join answers
//!   [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable)
//!   naming every name tried.
//! - **The rank's device is the server's**: its context is made current on
//!   the joining thread, where NCCL reads the device from.
//!
//! A collective on a capturing stream is recorded into the CUDA graph, as
//! NCCL captures its kernels. The group's agreement is a host meeting a
//! replay alone would not repeat, so the ranks replay their graphs
//! together with [`Rank::replay`](scope_core::collective::Rank::replay),
//! which meets first (rule 50); the server refuses to replay such a graph
//! alone.
//!
//! Ranks in other processes, or on other machines, join with
//! [`Rank::join`](scope_core::collective::Rank::join) and NCCL's unique id
//! ([`UniqueId::to_bytes`](scope_native::nccl::UniqueId::to_bytes),
//! handed out by the launcher): they decide by a ballot all-gathered
//! through NCCL itself — on a communicator split from the rounds' one
//! (`ncclCommSplit`, NCCL 2.18 and later), since NCCL runs one
//! communicator's kernels in order and a ballot would otherwise wait for
//! the round in flight — and poll every wait with `cuEventQuery` and
//! `ncclCommGetAsyncError` up to the deadline
//! (`scope_core::collective::remote`).

use std::ffi::c_void;
use std::sync::OnceLock;

use scope_core::Result;
use scope_native::nccl::{NcclDevice, NcclLibrary, NcclTable};

use crate::{Cuda, CudaMemory, CudaStreamState, CudaWaiter};

/// Where NCCL is looked for: its development name (`libnccl.so`, a
/// toolkit's or `libnccl-dev`'s), then its soname (`libnccl.so.2`), which is
/// all NCCL's runtime packages and NVIDIA's wheel install — a name cudarc's
/// own loader never tries.
const NCCL_NAMES: [&str; 2] = ["libnccl.so", "libnccl.so.2"];

/// NCCL's entry points, from the first of [`NCCL_NAMES`] the loader opens
/// (so a test's mock, loaded under `libnccl.so` first, is what runs), once
/// per process; why not, where it is missing or lacks one.
fn nccl() -> Result<NcclTable> {
    static NCCL: OnceLock<std::result::Result<NcclLibrary, String>> = OnceLock::new();
    let loaded = NCCL.get_or_init(|| {
        // SAFETY: every name is NCCL's.
        unsafe { NcclLibrary::open_first("nccl", &NCCL_NAMES.map(String::from)) }.map_err(|why| {
            format!("{why} (install NCCL, or the nvidia-nccl-cu13 wheel, on the library path)")
        })
    });
    NcclLibrary::table_of("nccl", loaded)
}

/// Load NCCL now, as the first collective would, and keep it loaded: a
/// runtime that needs collectives learns at start-up, not at its first
/// all-reduce, that the library is missing.
///
/// # Errors
///
/// [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable)
/// (`nccl`) naming every name tried, or the entry point the library
/// found lacks.
pub fn load_nccl() -> Result<()> {
    nccl().map(drop)
}

/// Whether the NCCL here has `ncclCommShrink` (2.27 and later), which the
/// survivors of a group in one process shrink through; without it they
/// join a fresh identity.
///
/// # Errors
///
/// As [`load_nccl`].
pub fn nccl_can_shrink() -> Result<bool> {
    Ok(nccl()?.comm_shrink.is_some())
}

// The collectives through the library, in the order of steps scope-native
// writes once for CUDA and HIP.
scope_native::nccl_collectives!(Cuda);

// SAFETY: the table is NCCL's, loaded for the process (`nccl`); `bind`
// makes this server's context, so its device, current on the thread; a
// memory's device pointer plus an offset inside it is that byte's device
// address; the stream's `CUstream` is this server's, on its device.
unsafe impl NcclDevice for Cuda {
    fn table() -> Result<NcclTable> {
        nccl()
    }

    fn bind_device(&mut self) -> Result<()> {
        self.bind()
    }

    unsafe fn address(memory: &CudaMemory, offset: u64) -> u64 {
        memory.device_ptr() + offset
    }

    fn library_stream(stream: &CudaStreamState) -> *mut c_void {
        stream.raw().cu_stream().cast::<c_void>()
    }

    /// The allocation is used by the stream (a free waits for it) and, on
    /// a recording stream, held by the graph.
    fn used(stream: &mut CudaStreamState, memory: &CudaMemory) {
        stream.touch(memory);
    }

    fn waiter_done(waiter: &CudaWaiter) -> Result<bool> {
        Cuda::finished(waiter)
    }
}
