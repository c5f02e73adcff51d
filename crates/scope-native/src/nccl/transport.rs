//! A server's device transport through an NCCL API library ([`DeviceCollectives`]).
//!
//! The CUDA and HIP transports differ only in four facts a backend states ([`NcclDevice`]):
//! its library, how its device is made current, where a byte of its memory lives, and its
//! native streams. The order of the steps, which is what drifts, is written here once.

use std::ffi::c_void;
use std::time::Duration;

use super::{Communicator, NcclTable, UniqueId};
use scope_core::backend::Backend;

/// What a backend states for its collectives to run through an NCCL API library;
/// [`nccl_collectives!`](crate::nccl_collectives) then makes it a [`DeviceCollectives`].
///
/// # Safety
/// [`table`](Self::table) is an NCCL API library's, loaded for the process.
/// [`bind_device`](Self::bind_device) makes this device current on the calling thread.
/// [`address`](Self::address) answers the device address of the byte asked for.
/// [`library_stream`](Self::library_stream) answers the native stream a stream issues on.
pub unsafe trait NcclDevice: Backend {
    /// The library's table, loaded on first use; `Error::BackendUnavailable` where missing.
    fn table() -> Result<NcclTable>;

    /// Make this server's device current on the calling thread, where the library reads it.
    fn bind_device(&mut self) -> Result<()>;

    /// The device address of byte `offset` of `memory`.
    ///
    /// # Safety
    /// `memory` is a live allocation of this backend, with `offset` inside it.
    unsafe fn address(memory: &Self::Memory, offset: u64) -> u64;

    /// The native stream `stream` issues on.
    fn library_stream(stream: &Self::Stream) -> *mut c_void;

    /// Note that work just issued on `stream` uses `memory`, where the backend tracks that.
    fn used(stream: &mut Self::Stream, memory: &Self::Memory) {
        let _ = (stream, memory);
    }

    /// Whether `waiter`'s work has finished, without waiting (`cuEventQuery`, `hipEventQuery`).
    fn waiter_done(waiter: &Self::Waiter) -> Result<bool>;
}

/// Make `$backend`, an [`NcclDevice`], a `DeviceCollectives`. A blanket implementation would
/// need the trait and the servers in one crate, so each server expands this once, and every
/// method forwards to one generic body here.
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
pub fn identity<B: NcclDevice>() -> Result<UniqueId> {
    B::table()?.unique_id()
}

/// [`DeviceCollectives::join`] through the library ([`nccl_collectives!`]).
///
/// # Safety
/// [`DeviceCollectives::join`]'s contract.
pub unsafe fn join<B: NcclDevice>(
    backend: &mut B,
    identity: &UniqueId,
    rank: usize,
    ranks: usize,
    patience: Duration,
) -> Result<Communicator> {
    let table = B::table()?;
    backend.bind_device()?;
    // SAFETY: the table is an NCCL API library's (`NcclDevice`'s contract); this server's
    // device is current (bound above); every rank joins with this id and count (`join`).
    unsafe { Communicator::join(table, *identity, rank, ranks, patience) }
}

/// [`DeviceCollectives::shrink`] through the library: `ncclCommShrink` where it has one.
///
/// # Safety
/// [`DeviceCollectives::shrink`]'s contract.
pub unsafe fn shrink<B: NcclDevice>(
    backend: &mut B,
    communicator: &Communicator,
    exclude: &[usize],
    patience: Duration,
) -> Result<Option<Communicator>> {
    backend.bind_device()?;
    // SAFETY: this rank's device is current (bound above); the rest is `shrink`'s contract.
    unsafe { communicator.shrink(exclude, patience) }
}

/// [`DeviceCollectives::duplicate`] through the library: `ncclCommSplit` where it has one.
///
/// # Safety
/// [`DeviceCollectives::duplicate`]'s contract.
pub unsafe fn duplicate<B: NcclDevice>(
    backend: &mut B,
    communicator: &Communicator,
    rank: usize,
    patience: Duration,
) -> Result<Option<Communicator>> {
    backend.bind_device()?;
    // SAFETY: this rank's device is current (bound above); the rest is `duplicate`'s contract.
    unsafe { communicator.duplicate(rank, patience) }
}

/// [`DeviceCollectives::collective`] through the library ([`nccl_collectives!`]).
///
/// # Safety
/// [`DeviceCollectives::collective`]'s contract.
pub unsafe fn collective<B: NcclDevice>(
    backend: &mut B,
    communicator: &Communicator,
    stream: &mut B::Stream,
    call: &DeviceCall<'_, B::Memory>,
) -> Result<()> {
    backend.bind_device()?;
    let (input, output) = (&call.input, &call.output);
    // SAFETY: both ranges lie in live allocations of this device (`collective`'s contract).
    let (send, recv) = unsafe {
        (
            B::address(input.0, input.1.start),
            B::address(output.0, output.1.start),
        )
    };
    // SAFETY: both addresses are on this device for their ranges, as long as the call needs;
    // the stream is this server's; every rank issues this call next (the group agreed).
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

/// [`DeviceCollectives::point_to_point`] through the library ([`nccl_collectives!`]).
///
/// # Safety
/// [`DeviceCollectives::point_to_point`]'s contract.
pub unsafe fn point_to_point<B: NcclDevice>(
    backend: &mut B,
    communicator: &Communicator,
    stream: &mut B::Stream,
    call: &DeviceTransfer<'_, B::Memory>,
) -> Result<()> {
    backend.bind_device()?;
    let (memory, range) = &call.data;
    // SAFETY: the range lies in a live allocation of this device (`point_to_point`'s contract).
    let data = unsafe { B::address(memory, range.start) };
    // SAFETY: the address is on this device for the range's bytes; the stream is this
    // server's; the peer issues the opposite half next (the ranks agreed on headers).
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
