//! The doors under the contract: a server crate's own extras reach the
//! backend through these, under the server's lock, and the calls that
//! change what the core tracks stay behind an `unsafe` promise.

use crate::backend::Backend;
use crate::error::Result;
use crate::handle::Buffer;

use super::Client;

impl<B: Backend> Client<B> {
    /// Run `f` with the backend and `buffer`'s memory, under the server's
    /// lock — for what only one backend offers (a Vulkan buffer's device
    /// address, say). The failure model does not see what `f` does: a
    /// runtime that writes through this must rewrite through the contract
    /// to heal.
    ///
    /// The backend is handed out shared: its [`Backend`] calls take `&mut self`
    /// and keep tables the core relies on (a stream created behind the
    /// core's back would desynchronise them), so they stay out of reach.
    ///
    /// `f` may call back into any client of this server: a call that only
    /// looks (a count, the poison, `with_backend` again) is answered at
    /// once; one that would change the server — a launch, a read, a new
    /// stream — is an [`Error::InvalidArgument`](crate::Error::InvalidArgument) saying it was made inside
    /// this closure, never a deadlock.
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

    /// Run `f` with the backend, shared, under the server's lock — for a
    /// server crate's own extras (its device limits, its raw handles for a
    /// raw-API baseline in a bench). See [`with_memory`](Self::with_memory)
    /// for why it is shared: the calls that change what the core tracks do
    /// not compile through it,
    ///
    /// ```compile_fail
    /// fn behind_the_cores_back<B: scope_core::Backend>(c: &scope_core::Client<B>) {
    ///     c.with_backend(|b| drop(b.create_stream(scope_core::StreamId(1))));
    /// }
    /// ```
    ///
    /// and only [`with_backend_mut`](Self::with_backend_mut)'s promise
    /// reaches them:
    ///
    /// ```no_run
    /// fn trimmed<B: scope_core::Backend>(c: &scope_core::Client<B>) {
    ///     // SAFETY: trimming releases caches; it creates or destroys
    ///     // nothing the core tracks.
    ///     let _ = unsafe { c.with_backend_mut(|b| b.trim()) };
    /// }
    /// ```
    ///
    /// `f` may call back into clients of this server as
    /// [`with_memory`](Self::with_memory)'s may.
    pub fn with_backend<R>(&self, f: impl FnOnce(&B) -> R) -> R {
        self.look(true, |server| f(server.backend()))
    }

    /// Run `f` with the backend, exclusively, under the server's lock.
    ///
    /// # Safety
    ///
    /// `f` must leave the backend as the core expects it: it must not call
    /// [`Backend`] methods that create or destroy streams, memory, kernels or
    /// graphs the core tracks, nor begin or end a capture, nor leave work on
    /// a stream that writes memory the core has handed out. Calls that only
    /// release caches ([`Backend::trim`]) or issue work on objects `f` made
    /// itself are fine. Breaking this desynchronises the core's tables from
    /// the device, after which a safe call may use freed device memory.
    ///
    /// # Errors
    ///
    /// An [`Error::InvalidArgument`](crate::Error::InvalidArgument) when called from inside a
    /// [`with_backend`](Self::with_backend) or
    /// [`with_memory`](Self::with_memory) closure on the same server, which
    /// still borrows the backend.
    pub unsafe fn with_backend_mut<R>(&self, f: impl FnOnce(&mut B) -> R) -> Result<R> {
        self.call(|server| Ok(f(server.backend_mut())))
    }
}
