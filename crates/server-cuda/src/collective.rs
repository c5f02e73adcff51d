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
//! - **The library cudarc loads.** cudarc's `nccl` finds `libnccl.so` by
//!   name on first use; the entry points are taken from that same library
//!   (so a test's mock, loaded under that name first, is what runs), and
//!   without it [`identity`](DeviceCollectives::identity) answers
//!   [`Error::BackendUnavailable`] instead of cudarc's panic.
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

use scope_core::collective::device::{DeviceCall, DeviceCollectives, DeviceTransfer};
use scope_core::native::nccl::{Communicator, NcclTable, UniqueId};
use scope_core::{Error, Result};

use crate::{Cuda, CudaMemory, CudaStreamState, CudaWaiter};

/// NCCL's entry points, from the library cudarc loads, once per process;
/// why not, where it is missing or lacks one.
fn nccl() -> Result<NcclTable> {
    static TABLE: OnceLock<std::result::Result<NcclTable, String>> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        // SAFETY: opening the library by name runs its initialisers, as any
        // use of it would; nothing is called.
        if !unsafe { cudarc::nccl::sys::is_culib_present() } {
            return Err(
                "libnccl.so was not found (install NCCL, or the nvidia-nccl-cu13 \
                        wheel, on the library path)"
                    .to_owned(),
            );
        }
        // SAFETY: present (above), so cudarc's loader returns the library,
        // which it keeps loaded for the life of the process.
        let library = unsafe { cudarc::nccl::sys::culib() };
        // SAFETY: every address is looked up by its NCCL name in NCCL
        // itself, loaded for the life of the process.
        unsafe {
            NcclTable::resolve("nccl", |name| {
                library
                    .get::<*const c_void>(name.as_bytes())
                    .ok()
                    .map(|symbol| *symbol)
            })
        }
        .map_err(|missing| format!("libnccl.so has no `{missing}` (NCCL 2.19 or later is needed)"))
    });
    table.clone().map_err(|reason| Error::BackendUnavailable {
        backend: "nccl",
        reason,
    })
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
