//! Collectives through RCCL: HIP as an [`NcclDevice`], hence a
//! [`DeviceCollectives`](scope_core::collective::device::DeviceCollectives) for
//! [`Group::over_device`](scope_core::collective::Group::over_device). **Untested on AMD
//! hardware and the real RCCL**: it runs against server-cuda's mock NCCL over our mock runtime.
//!
//! RCCL is NCCL's API under NCCL's names, so the communicator and call order are the core's
//! ([`scope_native::nccl`]). HIP's part is `librccl`, loaded at run time (missing, a typed
//! [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable)), and each rank's
//! device, made current with `hipSetDevice` for RCCL to read. Capture, replay and
//! [`Rank::join`](scope_core::collective::Rank::join) work as on CUDA; a release that refuses
//! capture dooms the windows and breaks the group.

use std::ffi::c_void;
use std::sync::OnceLock;

use scope_core::{Error, Result};
use scope_native::nccl::{NcclDevice, NcclLibrary, NcclTable};

use crate::{Hip, HipMemory, HipStream, HipWaiter};

static RCCL: OnceLock<std::result::Result<NcclLibrary, String>> = OnceLock::new();

/// Where to look for RCCL, most specific first: `ROCM_PATH`, `HIP_PATH`, the loader, `/opt/rocm`.
fn candidates() -> Vec<String> {
    let mut out = Vec::new();
    for var in ["ROCM_PATH", "HIP_PATH"] {
        if let Ok(root) = std::env::var(var)
            && !root.is_empty()
        {
            out.push(format!("{root}/lib/librccl.so"));
        }
    }
    out.extend(["librccl.so", "librccl.so.1", "/opt/rocm/lib/librccl.so"].map(String::from));
    out
}

fn load(names: &[String]) -> std::result::Result<NcclLibrary, String> {
    // SAFETY: every name is RCCL's (`librccl`).
    unsafe { NcclLibrary::open_first("rccl", names) }
}

/// Load RCCL from the first of `names` that opens, instead of the usual places: for a test's
/// mock. [`Error::InvalidArgument`] once RCCL is loaded already; otherwise the loading error.
pub fn load_rccl_from(names: &[String]) -> Result<()> {
    let mut fresh = false;
    let loaded = RCCL.get_or_init(|| {
        fresh = true;
        load(names)
    });
    if !fresh {
        return Err(Error::invalid("load_rccl_from", "RCCL is loaded already"));
    }
    NcclLibrary::table_of("rccl", loaded).map(drop)
}

fn rccl() -> Result<NcclTable> {
    NcclLibrary::table_of("rccl", RCCL.get_or_init(|| load(&candidates())))
}

/// Load RCCL now and keep it, so a missing library shows at start-up, not the first all-reduce:
/// [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable) (`rccl`), naming every
/// place tried or the entry point the library lacks.
pub fn load_rccl() -> Result<()> {
    rccl().map(drop)
}

// The collectives, in the order of steps scope-native writes once for CUDA and HIP.
scope_native::nccl_collectives!(Hip);

// SAFETY: the table is RCCL's, loaded for the process; `make_current` sets this server's
// device on the thread; a block's address plus an in-block offset is that byte's device
// address; the `hipStream_t` is this server's, on its device.
unsafe impl NcclDevice for Hip {
    fn table() -> Result<NcclTable> {
        rccl()
    }

    fn bind_device(&mut self) -> Result<()> {
        self.make_current()
    }

    unsafe fn address(memory: &HipMemory, offset: u64) -> u64 {
        // SAFETY: `offset` lies inside the live block (the caller's promise).
        unsafe { memory.block.at(offset) as u64 }
    }

    fn library_stream(stream: &HipStream) -> *mut c_void {
        stream.shared.stream.raw()
    }

    fn waiter_done(waiter: &HipWaiter) -> Result<bool> {
        Hip::finished(waiter)
    }
}
