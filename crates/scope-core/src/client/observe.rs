//! What a runtime or a test may ask of a server beside its work: the
//! failures it saw and holds, the bytes it holds, its poison, and — with
//! `fault-injection` — faults to inject and a look under the failure model.
//! Every question only looks, so it is answered inside a
//! [`with_backend`](Client::with_backend) closure too (`lend.rs`).

use std::sync::Arc;

use crate::backend::Backend;
use crate::error::Error;
use crate::id::StreamId;

use super::Client;

impl<B: Backend> Client<B> {
    /// Call `hook` on every skip (with the root error) and every failed exit
    /// (with the real error), never on success (rule 39); it replaces any
    /// earlier hook.
    ///
    /// The hook runs after the server's lock is released, before the call
    /// that caused the event returns, so it may call back into a client;
    /// the events its own calls cause are delivered after it returns, never
    /// inside it. One hook never runs on two threads at once. A hook that
    /// panics unwinds out of that call, whose bookkeeping is already
    /// complete, and stays installed. A hook that needs a client should
    /// hold a [`WeakClient`](super::WeakClient): the server owns its hook, so a hook that owns
    /// a `Client` keeps the server alive for good.
    pub fn on_failure(&self, hook: impl FnMut(StreamId, &Error) + Send + 'static) {
        self.shared.hooks.install(Box::new(hook));
    }

    /// How many failures this stream has seen (skips, failed work, faults):
    /// a measurement is valid only if this did not change while it ran.
    pub fn failures_seen(&self) -> u64 {
        self.look(false, |server| server.failures_seen(self.stream))
    }

    /// Every failure held and every buffer's claims, for a test that must
    /// explain a broken invariant.
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn dump_failures(&self) -> String {
        self.look(false, |server| server.dump_failures())
    }

    /// How many failures the device holds (rule 7).
    pub fn failures_held(&self) -> usize {
        self.look(false, |server| server.failures_held())
    }

    /// How many (buffer, failure) claims are live, allocation records
    /// included. The store never holds more failures than this (rule 7).
    pub fn failure_claims(&self) -> usize {
        self.look(false, |server| server.failure_claims())
    }

    /// Check the store's books: every failure's carrier count matches the
    /// buffers that claim it, and none is held without a carrier.
    ///
    /// # Errors
    ///
    /// What does not add up, for a test to print.
    #[cfg(feature = "fault-injection")]
    pub fn audit(&self) -> std::result::Result<(), String> {
        self.look(false, |server| server.audit())
    }

    /// Bytes of live buffers.
    pub fn bytes_allocated(&self) -> u64 {
        self.look(false, |server| server.bytes_allocated())
    }

    /// Bytes the backend holds, in use or cached for reuse.
    pub fn bytes_reserved(&self) -> u64 {
        self.look(false, |server| server.bytes_reserved())
    }

    /// The fault that poisoned the device, if one did.
    pub fn poison(&self) -> Option<Arc<Error>> {
        self.look(false, |server| server.poison())
    }

    /// Install `plan`: from now on, the device calls it names fail.
    ///
    /// Called from inside a [`with_backend`](Self::with_backend) or
    /// [`with_memory`](Self::with_memory) closure on the same server, it
    /// takes effect when that closure returns.
    #[cfg(feature = "fault-injection")]
    pub fn inject(&self, plan: crate::FaultPlan) {
        if self.shared.lent.is_here() {
            *self.shared.deferred_plan.lock() = Some(plan);
            return;
        }
        let _ = self.call(|server| {
            server.inject(plan);
            Ok(())
        });
    }

    /// The bytes of `src` whatever claims them: a look under the failure
    /// model, for tests that must see that a skipped kernel left its
    /// outputs untouched. Never for a runtime.
    ///
    /// # Errors
    ///
    /// Bad input; a buffer without memory; a refusal while recording.
    #[cfg(feature = "fault-injection")]
    pub fn peek<'a>(
        &self,
        src: impl Into<crate::handle::Slice<'a>>,
    ) -> crate::error::Result<Vec<u8>> {
        let src = src.into();
        self.call(|server| server.peek_vec(self.stream, src))
    }
}
