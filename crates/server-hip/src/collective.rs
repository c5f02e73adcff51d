//! Collectives on the devices, through RCCL: the HIP answer to
//! [`DeviceCollectives`], for
//! [`Group::over_device`](scope_core::collective::Group::over_device).
//!
//! **Untested on AMD hardware and on the real RCCL**, like the rest of this
//! crate: it runs against a mock RCCL (the mock NCCL server-cuda's tests
//! build, with this crate's mock runtime underneath).
//!
//! RCCL is NCCL's API under NCCL's names, so the communicator — non-blocking,
//! abortable from any thread, never called after an abort — is the core's
//! ([`scope_core::native::nccl`]), shared with CUDA's NCCL. What is HIP's
//! here is where the library comes from (`librccl`, loaded at run time as
//! the runtime is, a typed [`Error::BackendUnavailable`] where it is
//! missing) and which device a rank runs on (the server's, made current on
//! the joining thread with `hipSetDevice`, where RCCL reads it from).
//!
//! As on CUDA, a call on a capturing stream is recorded into the HIP graph
//! (RCCL captures its kernels — opt-in through `RCCL_ENABLE_HIPGRAPH` in
//! the releases that first supported it; where a release refuses, the
//! ranks' windows are doomed and the group breaks as for any failed
//! call), replayed with
//! [`Rank::replay`](scope_core::collective::Rank::replay); and ranks in
//! other processes join with
//! [`Rank::join`](scope_core::collective::Rank::join), deciding by a
//! ballot all-gathered through RCCL. None of this has run on AMD
//! hardware: it runs against the mock RCCL.

use std::ffi::c_void;
use std::sync::OnceLock;

use libloading::Library;
use scope_core::collective::device::{DeviceCall, DeviceCollectives, DeviceTransfer};
use scope_core::native::nccl::{Communicator, NcclTable, UniqueId};
use scope_core::{Error, Result};

use crate::{Hip, HipMemory, HipStream, HipWaiter};

/// The loaded RCCL: its table, and the library the table points into.
struct Rccl {
    table: NcclTable,
    _library: Library,
}

static RCCL: OnceLock<std::result::Result<Rccl, String>> = OnceLock::new();

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

fn load(names: &[String]) -> std::result::Result<Rccl, String> {
    // SAFETY: every name is RCCL's (`librccl`), whose initialisers only set
    // up its own state; symbols are looked up by name in the library
    // opened, which `Rccl` keeps loaded with the table.
    let (table, library) = unsafe {
        NcclTable::load_first(
            "rccl",
            names,
            |name| Library::new(name).map_err(|e| e.to_string()),
            |library: &Library, symbol| {
                library
                    .get::<*const c_void>(symbol.as_bytes())
                    .ok()
                    .map(|s| *s)
            },
        )
    }?;
    Ok(Rccl {
        table,
        _library: library,
    })
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
    loaded
        .as_ref()
        .map(drop)
        .map_err(|reason| Error::BackendUnavailable {
            backend: "rccl",
            reason: reason.clone(),
        })
}

fn rccl() -> Result<NcclTable> {
    match RCCL.get_or_init(|| load(&candidates())) {
        Ok(rccl) => Ok(rccl.table),
        Err(reason) => Err(Error::BackendUnavailable {
            backend: "rccl",
            reason: reason.clone(),
        }),
    }
}

/// Load RCCL now, as the first collective would, and keep it loaded: a
/// runtime that needs collectives learns at start-up, not at its first
/// all-reduce, that the library is missing.
///
/// # Errors
///
/// [`Error::BackendUnavailable`] (`rccl`) naming every place tried, or the
/// entry point the library found lacks.
pub fn load_rccl() -> Result<()> {
    rccl().map(drop)
}

impl DeviceCollectives for Hip {
    type Communicator = Communicator;
    type Identity = UniqueId;

    fn identity() -> Result<UniqueId> {
        rccl()?.unique_id()
    }

    unsafe fn join(
        &mut self,
        identity: &UniqueId,
        rank: usize,
        ranks: usize,
        patience: std::time::Duration,
    ) -> Result<Communicator> {
        let table = rccl()?;
        self.make_current()?;
        // SAFETY: the table is RCCL's; this server's device is current on
        // the thread (above), which is the device RCCL takes; every rank
        // joins with this id and count (`join`'s contract).
        unsafe { Communicator::join(table, *identity, rank, ranks, patience) }
    }

    unsafe fn collective(
        &mut self,
        communicator: &Communicator,
        stream: &mut HipStream,
        call: &DeviceCall<'_, HipMemory>,
    ) -> Result<()> {
        self.make_current()?;
        let (input, output) = (&call.input, &call.output);
        // SAFETY: both ranges lie inside their live allocations (the
        // contract of `collective`), so each offset is within its block.
        let (send, recv) = unsafe {
            (
                input.0.block.at(input.1.start) as u64,
                output.0.block.at(output.1.start) as u64,
            )
        };
        // SAFETY: both addresses are on this device, as long as the call
        // requires (above); the stream is this server's; every rank issues
        // this call next (the group agreed on it).
        unsafe {
            communicator.issue(
                call.call,
                (send, input.1.end - input.1.start),
                (recv, output.1.end - output.1.start),
                call.ranks,
                stream.shared.stream.raw(),
            )
        }
    }

    unsafe fn point_to_point(
        &mut self,
        communicator: &Communicator,
        stream: &mut HipStream,
        call: &DeviceTransfer<'_, HipMemory>,
    ) -> Result<()> {
        self.make_current()?;
        let (memory, range) = &call.data;
        // SAFETY: the range lies inside its live allocation (the contract
        // of `point_to_point`), so the offset is within its block.
        let data = unsafe { memory.block.at(range.start) } as u64;
        // SAFETY: the address is on this device, as long as the range;
        // the stream is this server's; the peer issues the opposite half
        // next (the ranks exchanged headers and agreed).
        unsafe {
            communicator.point_to_point(
                call.direction,
                call.peer,
                (data, range.end - range.start),
                stream.shared.stream.raw(),
            )
        }
    }

    unsafe fn abort(communicator: &Communicator) {
        communicator.abort();
    }

    unsafe fn finished(waiter: &HipWaiter) -> Result<bool> {
        Hip::finished(waiter)
    }

    unsafe fn health(communicator: &Communicator) -> Result<()> {
        communicator.health()
    }
}
