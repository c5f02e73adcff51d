//! Collectives on the devices, through RCCL: what HIP states as an
//! [`NcclDevice`], which makes it a
//! [`DeviceCollectives`](scope_core::collective::device::DeviceCollectives)
//! for [`Group::over_device`](scope_core::collective::Group::over_device).
//!
//! **Untested on AMD hardware and on the real RCCL**, like the rest of this
//! crate: it runs against a mock RCCL (the mock NCCL server-cuda's tests
//! build, with this crate's mock runtime underneath).
//!
//! RCCL is NCCL's API under NCCL's names, so the communicator — non-blocking,
//! abortable from any thread, never called after an abort — and the order
//! a call is issued in are the core's ([`scope_native::nccl`]),
//! shared with CUDA's NCCL. What is HIP's here is where the library comes
//! from (`librccl`, loaded at run time as the runtime is, a typed
//! [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable)
//! where it is missing) and which device a rank runs on (the server's, made
//! current on the joining thread with `hipSetDevice`, where RCCL reads it
//! from).
//!
//! As on CUDA, a call on a capturing stream is recorded into the HIP graph
//! (RCCL captures its kernels — opt-in through `RCCL_ENABLE_HIPGRAPH` in
//! the releases that first supported it; where a release refuses, the
//! ranks' windows are doomed and the group breaks as for any failed
//! call), replayed with
//! [`Rank::replay`](scope_core::collective::Rank::replay); and ranks in
//! other processes join with
//! [`Rank::join`](scope_core::collective::Rank::join), deciding by a
//! ballot all-gathered through RCCL, on a communicator split from the
//! rounds' one (`ncclCommSplit`) where RCCL has it. None of this has run
//! on AMD hardware: it runs against the mock RCCL.

use std::ffi::c_void;
use std::sync::OnceLock;

use scope_core::{Error, Result};
use scope_native::nccl::{NcclDevice, NcclLibrary, NcclTable};

use crate::{Hip, HipMemory, HipStream, HipWaiter};

static RCCL: OnceLock<std::result::Result<NcclLibrary, String>> = OnceLock::new();

/// Where RCCL is looked for, most specific first: `ROCM_PATH` and
/// `HIP_PATH`, the loader's path, `/opt/rocm`.
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

/// Load RCCL from the first of `names` that opens, for the rest of the
/// process, instead of the usual places — for a test's mock. Only before
/// RCCL is first used.
///
/// # Errors
///
/// [`Error::InvalidArgument`] once RCCL was loaded already (from elsewhere,
/// or these names); the loading error otherwise.
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

/// Load RCCL now, as the first collective would, and keep it loaded: a
/// runtime that needs collectives learns at start-up, not at its first
/// all-reduce, that the library is missing.
///
/// # Errors
///
/// [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable)
/// (`rccl`) naming every place tried, or the entry point the library
/// found lacks.
pub fn load_rccl() -> Result<()> {
    rccl().map(drop)
}

// The collectives through the library, in the order of steps scope-native
// writes once for CUDA and HIP.
scope_native::nccl_collectives!(Hip);

// SAFETY: the table is RCCL's, loaded for the process (`rccl`);
// `make_current` sets this server's device on the thread (`hipSetDevice`);
// a block's address at an offset inside it is that byte's device address;
// the stream's `hipStream_t` is this server's, on its device.
unsafe impl NcclDevice for Hip {
    fn table() -> Result<NcclTable> {
        rccl()
    }

    fn bind_device(&mut self) -> Result<()> {
        self.make_current()
    }

    unsafe fn address(memory: &HipMemory, offset: u64) -> u64 {
        // SAFETY: `offset` lies inside the live block (the caller's
        // promise).
        unsafe { memory.block.at(offset) as u64 }
    }

    fn library_stream(stream: &HipStream) -> *mut c_void {
        stream.shared.stream.raw()
    }

    fn waiter_done(waiter: &HipWaiter) -> Result<bool> {
        Hip::finished(waiter)
    }
}
