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
use scope_core::backend::Backend;

/// What a backend states for its collectives to run through an NCCL API
/// library; [`nccl_collectives!`](crate::nccl_collectives) then makes it a
/// [`DeviceCollectives`].
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
    /// [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable)
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

/// Make `$backend`, an [`NcclDevice`], a
/// [`DeviceCollectives`](scope_core::collective::device::DeviceCollectives)
/// through its NCCL API library.
///
/// A blanket implementation over every [`NcclDevice`] is what this would be
/// in one crate; the trait is scope-core's and the servers are crates of
/// their own, so each server expands this once instead, and every method
/// forwards to the one generic body here that keeps the order of the steps.
#[macro_export]
macro_rules! nccl_collectives {
    ($backend:ty) => {
        impl $crate::nccl::transport::DeviceCollectives for $backend {
            type Communicator = $crate::nccl::Communicator;
            type Identity = $crate::nccl::UniqueId;

            fn identity() -> $crate::nccl::transport::Result<Self::Identity> {
                $crate::nccl::transport::identity::<Self>()
            }

            unsafe fn join(
                &mut self,
                identity: &Self::Identity,
                rank: usize,
                ranks: usize,
                patience: ::std::time::Duration,
            ) -> $crate::nccl::transport::Result<Self::Communicator> {
                // SAFETY: `join`'s contract, passed on unchanged.
                unsafe { $crate::nccl::transport::join(self, identity, rank, ranks, patience) }
            }

            unsafe fn collective(
                &mut self,
                communicator: &Self::Communicator,
                stream: &mut Self::Stream,
                call: &$crate::nccl::transport::DeviceCall<'_, Self::Memory>,
            ) -> $crate::nccl::transport::Result<()> {
                // SAFETY: `collective`'s contract, passed on unchanged.
                unsafe { $crate::nccl::transport::collective(self, communicator, stream, call) }
            }

            unsafe fn point_to_point(
                &mut self,
                communicator: &Self::Communicator,
                stream: &mut Self::Stream,
                call: &$crate::nccl::transport::DeviceTransfer<'_, Self::Memory>,
            ) -> $crate::nccl::transport::Result<()> {
                // SAFETY: `point_to_point`'s contract, passed on unchanged.
                unsafe { $crate::nccl::transport::point_to_point(self, communicator, stream, call) }
            }

            unsafe fn abort(communicator: &Self::Communicator) {
                communicator.abort();
            }

            unsafe fn shrink(
                &mut self,
                communicator: &Self::Communicator,
                exclude: &[usize],
                patience: ::std::time::Duration,
            ) -> $crate::nccl::transport::Result<Option<Self::Communicator>> {
                // SAFETY: `shrink`'s contract, passed on unchanged.
                unsafe { $crate::nccl::transport::shrink(self, communicator, exclude, patience) }
            }

            unsafe fn duplicate(
                &mut self,
                communicator: &Self::Communicator,
                rank: usize,
                patience: ::std::time::Duration,
            ) -> $crate::nccl::transport::Result<Option<Self::Communicator>> {
                // SAFETY: `duplicate`'s contract, passed on unchanged.
                unsafe { $crate::nccl::transport::duplicate(self, communicator, rank, patience) }
            }

            unsafe fn finished(waiter: &Self::Waiter) -> $crate::nccl::transport::Result<bool> {
                <Self as $crate::nccl::NcclDevice>::waiter_done(waiter)
            }

            unsafe fn health(
                communicator: &Self::Communicator,
            ) -> $crate::nccl::transport::Result<()> {
                communicator.health()
            }

            unsafe fn replaying(
                communicator: &Self::Communicator,
                replay: &mut dyn FnMut() -> $crate::nccl::transport::Result<()>,
            ) -> $crate::nccl::transport::Result<()> {
                communicator.while_live(replay)
            }
        }
    };
}

#[doc(hidden)]
pub use scope_core::Result;
#[doc(hidden)]
pub use scope_core::collective::device::{DeviceCall, DeviceCollectives, DeviceTransfer};

/// The library's identity for a new group ([`nccl_collectives!`]).
///
/// # Errors
///
/// A missing library, or what `ncclGetUniqueId` answered.
pub fn identity<B: NcclDevice>() -> Result<UniqueId> {
    B::table()?.unique_id()
}

/// [`DeviceCollectives::join`] through the library ([`nccl_collectives!`]).
///
/// # Safety
///
/// [`DeviceCollectives::join`]'s contract.
///
/// # Errors
///
/// As [`DeviceCollectives::join`].
pub unsafe fn join<B: NcclDevice>(
    backend: &mut B,
    identity: &UniqueId,
    rank: usize,
    ranks: usize,
    patience: Duration,
) -> Result<Communicator> {
    let table = B::table()?;
    backend.bind_device()?;
    // SAFETY: the table is an NCCL API library's (`NcclDevice`'s contract);
    // this server's device is current on the thread (bound above), which is
    // the device the library takes; every rank joins with this id and count
    // (`join`'s contract).
    unsafe { Communicator::join(table, *identity, rank, ranks, patience) }
}

/// [`DeviceCollectives::shrink`] through the library
/// ([`nccl_collectives!`]): `ncclCommShrink` where it has one.
///
/// # Safety
///
/// [`DeviceCollectives::shrink`]'s contract.
///
/// # Errors
///
/// As [`DeviceCollectives::shrink`].
pub unsafe fn shrink<B: NcclDevice>(
    backend: &mut B,
    communicator: &Communicator,
    exclude: &[usize],
    patience: Duration,
) -> Result<Option<Communicator>> {
    backend.bind_device()?;
    // SAFETY: this server's device is current on the thread (bound above),
    // the device of its rank; the rest is `shrink`'s contract.
    unsafe { communicator.shrink(exclude, patience) }
}

/// [`DeviceCollectives::duplicate`] through the library
/// ([`nccl_collectives!`]): `ncclCommSplit` where it has one.
///
/// # Safety
///
/// [`DeviceCollectives::duplicate`]'s contract.
///
/// # Errors
///
/// As [`DeviceCollectives::duplicate`].
pub unsafe fn duplicate<B: NcclDevice>(
    backend: &mut B,
    communicator: &Communicator,
    rank: usize,
    patience: Duration,
) -> Result<Option<Communicator>> {
    backend.bind_device()?;
    // SAFETY: this server's device is current on the thread (bound above),
    // the device of its rank; the rest is `duplicate`'s contract.
    unsafe { communicator.duplicate(rank, patience) }
}

/// [`DeviceCollectives::collective`] through the library
/// ([`nccl_collectives!`]).
///
/// # Safety
///
/// [`DeviceCollectives::collective`]'s contract.
///
/// # Errors
///
/// As [`DeviceCollectives::collective`].
pub unsafe fn collective<B: NcclDevice>(
    backend: &mut B,
    communicator: &Communicator,
    stream: &mut B::Stream,
    call: &DeviceCall<'_, B::Memory>,
) -> Result<()> {
    backend.bind_device()?;
    let (input, output) = (&call.input, &call.output);
    // SAFETY: both ranges lie inside live allocations of this device (the
    // contract of `collective`).
    let (send, recv) = unsafe {
        (
            B::address(input.0, input.1.start),
            B::address(output.0, output.1.start),
        )
    };
    // SAFETY: both addresses are on this device, for as many bytes as their
    // ranges and as long as the call requires (above); the stream is this
    // server's; every rank issues this call next (the group agreed on it).
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

/// [`DeviceCollectives::point_to_point`] through the library
/// ([`nccl_collectives!`]).
///
/// # Safety
///
/// [`DeviceCollectives::point_to_point`]'s contract.
///
/// # Errors
///
/// As [`DeviceCollectives::point_to_point`].
pub unsafe fn point_to_point<B: NcclDevice>(
    backend: &mut B,
    communicator: &Communicator,
    stream: &mut B::Stream,
    call: &DeviceTransfer<'_, B::Memory>,
) -> Result<()> {
    backend.bind_device()?;
    let (memory, range) = &call.data;
    // SAFETY: the range lies inside a live allocation of this device (the
    // contract of `point_to_point`).
    let data = unsafe { B::address(memory, range.start) };
    // SAFETY: the address is on this device, for the range's bytes; the
    // stream is this server's; the peer issues the opposite half next (the
    // ranks exchanged headers and agreed).
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
