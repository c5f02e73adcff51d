//! Collectives through NCCL: CUDA as an [`NcclDevice`], and so a
//! [`DeviceCollectives`](scope_core::collective::device::DeviceCollectives) for
//! [`Group::over_device`](scope_core::collective::Group::over_device).
//!
//! The core decides every round; the communicator and the call order are [`scope_native::nccl`]'s,
//! shared with RCCL. CUDA's part is the library, the device and where the bytes live. NCCL opens as
//! `libnccl.so`, then as `libnccl.so.2`, the soname packages install and cudarc never tries. The
//! joining thread has the server's context current: NCCL reads the device there.
//!
//! A captured collective joins the CUDA graph. Ranks replay such graphs together with
//! [`Rank::replay`](scope_core::collective::Rank::replay), which meets first (rule 50). The server
//! refuses a lone replay.
//!
//! Remote ranks join with [`Rank::join`](scope_core::collective::Rank::join) and NCCL's id
//! ([`UniqueId::to_bytes`](scope_native::nccl::UniqueId::to_bytes)). Their ballot runs on a split
//! communicator (`ncclCommSplit`, NCCL 2.18+): on the rounds' one it would queue behind the round
//! in flight. Waits poll `cuEventQuery` and `ncclCommGetAsyncError` up to the deadline
//! (`scope_core::collective::remote`).

use std::ffi::c_void;
use std::sync::OnceLock;

use scope_core::Result;
use scope_native::nccl::{NcclDevice, NcclLibrary, NcclTable};

use crate::Cuda;
use crate::device::{CudaStreamState, CudaWaiter};
use crate::pool::CudaMemory;

/// Where NCCL is looked for: the development name, then the installed soname.
const NCCL_NAMES: [&str; 2] = ["libnccl.so", "libnccl.so.2"];

/// NCCL's entry points from the first of [`NCCL_NAMES`] that opens, once per process.
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

/// Load NCCL now, so a missing library shows at start-up, not at the first all-reduce.
///
/// # Errors
///
/// [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable) (`nccl`), naming every name
/// tried or the missing entry point.
pub fn load_nccl() -> Result<()> {
    nccl().map(drop)
}

/// Whether this NCCL has `ncclCommShrink` (2.27+), which survivors in one process shrink through.
/// Without it they join a fresh identity.
///
/// # Errors
///
/// As [`load_nccl`].
pub fn nccl_can_shrink() -> Result<bool> {
    Ok(nccl()?.comm_shrink.is_some())
}

// The collectives, in the step order scope-native writes for CUDA and HIP.
scope_native::nccl_collectives!(Cuda);

// SAFETY: the table is NCCL's (`nccl`); `bind` makes this device current; a memory's pointer plus
// an in-bounds offset is a device address; the stream is this server's.
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

    /// The stream uses it (a free waits for it), and a recording graph holds it.
    fn used(stream: &mut CudaStreamState, memory: &CudaMemory) {
        stream.touch(memory);
    }

    fn waiter_done(waiter: &CudaWaiter) -> Result<bool> {
        Cuda::finished(waiter)
    }
}
