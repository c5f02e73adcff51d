//! A server's device transport through an NCCL API library: the one
//! [`DeviceCollectives`] for every backend whose collectives are NCCL's or
//! RCCL's.
//!
//! The CUDA and HIP servers' transports were one function body each,
//! written twice: load the table, make the device current, turn each range
//! into a device address, issue on the server's stream. They differ in
//! four facts a backend knows and the core does not — where its library
//! comes from, how its device is made current, where a byte of its memory
//! lives, and which native stream a stream is — so a backend states those
//! ([`NcclDevice`]) and the order of the steps, which is what drifts, is
//! written here once.

use std::ffi::c_void;
use std::time::Duration;

use super::{Communicator, NcclTable, UniqueId};
use crate::backend::Backend;
use crate::collective::device::{DeviceCall, DeviceCollectives, DeviceTransfer};
use crate::error::Result;

/// What a backend states for its collectives to run through an NCCL API
/// library; every such backend is then a [`DeviceCollectives`].
///
/// # Safety
///
/// An implementation vouches that [`table`](Self::table) is an NCCL API
/// library's, loaded for the life of the process; that
/// [`bind_device`](Self::bind_device) makes this server's device current on
/// the calling thread, the device the library's calls from that thread
/// take; that [`address`](Self::address) answers the device address of
/// the byte it is asked for; and that [`library_stream`](Self::library_stream)
/// answers the native stream (`cudaStream_t`, `hipStream_t`) the stream
/// issues on, of this server's device.
pub unsafe trait NcclDevice: Backend {
    /// The library's table, loaded on first use;
    /// [`Error::BackendUnavailable`](crate::Error::BackendUnavailable)
    /// where it is missing.
    ///
    /// # Errors
    ///
    /// As above.
    fn table() -> Result<NcclTable>;

    /// Make this server's device current on the calling thread, where the
    /// library reads it from.
    ///
    /// # Errors
    ///
    /// What the API answered.
    fn bind_device(&mut self) -> Result<()>;

    /// The device address of byte `offset` of `memory`.
    ///
    /// # Safety
    ///
    /// `memory` is a live allocation of this backend and `offset` lies
    /// inside it.
    unsafe fn address(memory: &Self::Memory, offset: u64) -> u64;

    /// The native stream `stream` issues on.
    fn library_stream(stream: &Self::Stream) -> *mut c_void;

    /// Note that work just issued on `stream` uses `memory`, where the
    /// backend tracks that (for a free, or a recording). Nothing by default.
    fn used(stream: &mut Self::Stream, memory: &Self::Memory) {
        let _ = (stream, memory);
    }

    /// Whether the work `waiter` stands for has finished, without waiting
    /// (`cuEventQuery`, `hipEventQuery`).
    ///
    /// # Errors
    ///
    /// The work's own failure, as the API reports it.
    fn waiter_done(waiter: &Self::Waiter) -> Result<bool>;
}

impl<B: NcclDevice> DeviceCollectives for B {
    type Communicator = Communicator;
    type Identity = UniqueId;

    fn identity() -> Result<UniqueId> {
        B::table()?.unique_id()
    }

    unsafe fn join(
        &mut self,
        identity: &UniqueId,
        rank: usize,
        ranks: usize,
        patience: Duration,
    ) -> Result<Communicator> {
        let table = B::table()?;
        self.bind_device()?;
        // SAFETY: the table is an NCCL API library's (`NcclDevice`'s
        // contract); this server's device is current on the thread (bound
        // above), which is the device the library takes; every rank joins
        // with this id and count (`join`'s contract).
        unsafe { Communicator::join(table, *identity, rank, ranks, patience) }
    }

    unsafe fn collective(
        &mut self,
        communicator: &Communicator,
        stream: &mut Self::Stream,
        call: &DeviceCall<'_, Self::Memory>,
    ) -> Result<()> {
        self.bind_device()?;
        let (input, output) = (&call.input, &call.output);
        // SAFETY: both ranges lie inside live allocations of this device
        // (the contract of `collective`).
        let (send, recv) = unsafe {
            (
                B::address(input.0, input.1.start),
                B::address(output.0, output.1.start),
            )
        };
        // SAFETY: both addresses are on this device, for as many bytes as
        // their ranges and as long as the call requires (above); the stream
        // is this server's; every rank issues this call next (the group
        // agreed on it).
        unsafe {
            communicator.issue(
                call.call,
                (send, input.1.end - input.1.start),
                (recv, output.1.end - output.1.start),
                call.ranks,
                B::library_stream(stream),
            )
        }?;
        B::used(stream, input.0);
        B::used(stream, output.0);
        Ok(())
    }

    unsafe fn point_to_point(
        &mut self,
        communicator: &Communicator,
        stream: &mut Self::Stream,
        call: &DeviceTransfer<'_, Self::Memory>,
    ) -> Result<()> {
        self.bind_device()?;
        let (memory, range) = &call.data;
        // SAFETY: the range lies inside a live allocation of this device
        // (the contract of `point_to_point`).
        let data = unsafe { B::address(memory, range.start) };
        // SAFETY: the address is on this device, for the range's bytes;
        // the stream is this server's; the peer issues the opposite half
        // next (the ranks exchanged headers and agreed).
        unsafe {
            communicator.point_to_point(
                call.direction,
                call.peer,
                (data, range.end - range.start),
                B::library_stream(stream),
            )
        }?;
        B::used(stream, memory);
        Ok(())
    }

    unsafe fn abort(communicator: &Communicator) {
        communicator.abort();
    }

    unsafe fn finished(waiter: &Self::Waiter) -> Result<bool> {
        B::waiter_done(waiter)
    }

    unsafe fn health(communicator: &Communicator) -> Result<()> {
        communicator.health()
    }
}
