//! Collectives on the devices, through NCCL: the CUDA answer to
//! [`DeviceCollectives`], for
//! [`Group::over_device`](scope_core::collective::Group::over_device).
//!
//! The group decides every round before a byte moves
//! (`scope_core::collective::device`), and the communicator that keeps NCCL
//! from hanging or being called after an abort is the core's
//! ([`scope_core::native::nccl`], shared with HIP's RCCL). What is CUDA's
//! here is where the library comes from and which device it runs on:
//!
//! - **The library, by both its names.** NCCL is opened on first use as
//!   `libnccl.so` or, failing that, by its soname `libnccl.so.2` — the only
//!   name NCCL's runtime packages and NVIDIA's wheel install, and one
//!   cudarc's loader does not try — and the entry points are taken from
//!   that library (so a test's mock, loaded under `libnccl.so` first, is
//!   what runs). Without it [`identity`](DeviceCollectives::identity)
//!   answers [`Error::BackendUnavailable`] naming every name tried.
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
//! ([`UniqueId::to_bytes`], handed out by the launcher): they decide by a
//! ballot all-gathered through NCCL itself, and poll every wait with
//! [`finished`](DeviceCollectives::finished) (`cuEventQuery`) and
//! [`health`](DeviceCollectives::health) (`ncclCommGetAsyncError`) up to
//! the deadline (`scope_core::collective::remote`).

use std::ffi::c_void;
use std::sync::OnceLock;

use libloading::Library;

use scope_core::collective::device::{DeviceCall, DeviceCollectives, DeviceTransfer};
use scope_core::native::nccl::{Communicator, NcclTable, UniqueId};
use scope_core::{Error, Result};

use crate::{Cuda, CudaMemory, CudaStreamState, CudaWaiter};

/// The loaded NCCL: its table, and the library the table points into.
struct Nccl {
    table: NcclTable,
    _library: Library,
}

/// Where NCCL is looked for: its development name (`libnccl.so`, a
/// toolkit's or `libnccl-dev`'s), then its soname (`libnccl.so.2`), which is
/// all NCCL's runtime packages and NVIDIA's wheel install — a name cudarc's
/// own loader never tries.
const NCCL_NAMES: [&str; 2] = ["libnccl.so", "libnccl.so.2"];

/// NCCL's entry points, from the first of [`NCCL_NAMES`] the loader opens
/// (so a test's mock, loaded under `libnccl.so` first, is what runs), once
/// per process; why not, where it is missing or lacks one.
fn nccl() -> Result<NcclTable> {
    static NCCL: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
    let loaded = NCCL.get_or_init(|| {
        let names = NCCL_NAMES.map(String::from);
        // SAFETY: every name is NCCL's, whose initialisers only set up its
        // own state; symbols are looked up by name in the library opened,
        // which `Nccl` keeps loaded with the table, for the process.
        let (table, library) = unsafe {
            NcclTable::load_first(
                "nccl",
                &names,
                |name| Library::new(name).map_err(|e| e.to_string()),
                |library: &Library, symbol| {
                    library
                        .get::<*const c_void>(symbol.as_bytes())
                        .ok()
                        .map(|s| *s)
                },
            )
        }
        .map_err(|why| {
            format!("{why} (install NCCL, or the nvidia-nccl-cu13 wheel, on the library path)")
        })?;
        Ok(Nccl {
            table,
            _library: library,
        })
    });
    match loaded {
        Ok(nccl) => Ok(nccl.table),
        Err(reason) => Err(Error::BackendUnavailable {
            backend: "nccl",
            reason: reason.clone(),
        }),
    }
}

/// Load NCCL now, as the first collective would, and keep it loaded: a
/// runtime that needs collectives learns at start-up, not at its first
/// all-reduce, that the library is missing.
///
/// # Errors
///
/// [`Error::BackendUnavailable`] (`nccl`) naming every name tried, or the
/// entry point the library found lacks.
pub fn load_nccl() -> Result<()> {
    nccl().map(drop)
}

impl DeviceCollectives for Cuda {
    type Communicator = Communicator;
    type Identity = UniqueId;

    fn identity() -> Result<UniqueId> {
        nccl()?.unique_id()
    }

    unsafe fn join(
        &mut self,
        identity: &UniqueId,
        rank: usize,
        ranks: usize,
        patience: std::time::Duration,
    ) -> Result<Communicator> {
        let table = nccl()?;
        self.bind()?;
        // SAFETY: the table is NCCL's; this server's context is current on
        // the thread (bound above), which is the device NCCL takes; every
        // rank joins with this id and count (`join`'s contract).
        unsafe { Communicator::join(table, *identity, rank, ranks, patience) }
    }

    unsafe fn collective(
        &mut self,
        communicator: &Communicator,
        stream: &mut CudaStreamState,
        call: &DeviceCall<'_, CudaMemory>,
    ) -> Result<()> {
        self.bind()?;
        let (input, output) = (&call.input, &call.output);
        let cu = stream.raw().cu_stream().cast::<c_void>();
        // SAFETY: both ranges lie inside live allocations of this device
        // (the contract of `collective`), as long as the call requires;
        // `cu` is this server's stream; every rank issues this call next
        // (the group agreed on it).
        unsafe {
            communicator.issue(
                call.call,
                (
                    input.0.device_ptr() + input.1.start,
                    input.1.end - input.1.start,
                ),
                (
                    output.0.device_ptr() + output.1.start,
                    output.1.end - output.1.start,
                ),
                call.ranks,
                cu,
            )
        }?;
        stream.touch(input.0);
        stream.touch(output.0);
        Ok(())
    }

    unsafe fn point_to_point(
        &mut self,
        communicator: &Communicator,
        stream: &mut CudaStreamState,
        call: &DeviceTransfer<'_, CudaMemory>,
    ) -> Result<()> {
        self.bind()?;
        let (memory, range) = &call.data;
        let cu = stream.raw().cu_stream().cast::<c_void>();
        // SAFETY: the range lies inside a live allocation of this device
        // (the contract of `point_to_point`); `cu` is this server's
        // stream; the peer issues the opposite half next (the ranks
        // exchanged headers and agreed).
        unsafe {
            communicator.point_to_point(
                call.direction,
                call.peer,
                (memory.device_ptr() + range.start, range.end - range.start),
                cu,
            )
        }?;
        stream.touch(memory);
        Ok(())
    }

    unsafe fn abort(communicator: &Communicator) {
        communicator.abort();
    }

    unsafe fn finished(waiter: &CudaWaiter) -> Result<bool> {
        Cuda::finished(waiter)
    }

    unsafe fn health(communicator: &Communicator) -> Result<()> {
        communicator.health()
    }
}
