//! The doors under the contract, for a server crate's own extras; the
//! calls that change what the core tracks stay behind an `unsafe` promise.

use crate::backend::Backend;
use crate::error::Result;
use crate::handle::Buffer;

use super::Client;

impl<B: Backend> Client<B> {
    /// Run `f` with the backend and `buffer`'s memory, under the server's lock,
    /// for what only one backend offers. The failure model does not see what
    /// `f` does; a call back that would change this server is an
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument), never a deadlock.
    ///
    /// # Errors
    ///
    /// A foreign or freed buffer; one without memory.
    pub fn with_memory<R>(
        &self,
        buffer: &Buffer,
        f: impl FnOnce(&B, &B::Memory) -> R,
    ) -> Result<R> {
        self.look(true, |server| server.with_memory(buffer, f))
    }

    /// Run `f` with the backend, shared, under the server's lock. Calls that
    /// change what the core tracks need [`with_backend_mut`](Self::with_backend_mut)
    /// and its promise; through this one they do not compile:
    ///
    /// ```compile_fail
    /// fn behind_the_cores_back<B: scope_core::Backend>(c: &scope_core::Client<B>) {
    ///     c.with_backend(|b| drop(b.create_stream(scope_core::StreamId(1))));
    /// }
    /// ```
    pub fn with_backend<R>(&self, f: impl FnOnce(&B) -> R) -> R {
        self.look(true, |server| f(server.backend()))
    }

    /// Run `f` with the backend, exclusively, under the server's lock.
    ///
    /// # Safety
    ///
    /// `f` must not create or destroy streams, memory, kernels or graphs the
    /// core tracks, begin or end a capture, nor leave work writing memory the
    /// core handed out, or a later safe call may use freed memory.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) inside a
    /// `with_backend` or `with_memory` closure on the same server.
    pub unsafe fn with_backend_mut<R>(&self, f: impl FnOnce(&mut B) -> R) -> Result<R> {
        self.call(|server| Ok(f(server.backend_mut())))
    }
}
