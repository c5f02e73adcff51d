//! What a runtime or a test asks beside its work; each question only looks.

use std::sync::Arc;

use crate::backend::Backend;
use crate::error::Error;
use crate::id::StreamId;

use super::Client;

impl<B: Backend> Client<B> {
    /// Call `hook` on every skip and failed exit (rule 39), replacing any
    /// earlier hook. It runs unlocked, so it may call a client; hold a
    /// [`WeakClient`](super::WeakClient), or the server lives for good.
    pub fn on_failure(&self, hook: impl FnMut(StreamId, &Error) + Send + 'static) {
        self.shared.hooks.install(Box::new(hook));
    }

    /// How many failures this stream has seen; a measurement over a change is void.
    pub fn failures_seen(&self) -> u64 {
        self.look(false, |server| server.failures_seen(self.stream))
    }

    /// How many times the host waited for this stream (rule 47).
    pub fn drains(&self) -> u64 {
        self.look(false, |server| server.drains(self.stream))
    }

    /// Every failure held and every claim, to explain a broken invariant.
    #[cfg(feature = "fault-injection")]
    #[doc(hidden)]
    pub fn dump_failures(&self) -> String {
        self.look(false, |server| server.dump_failures())
    }

    /// How many failures the device holds (rule 7).
    pub fn failures_held(&self) -> usize {
        self.look(false, |server| server.failures_held())
    }

    /// How many (buffer, failure) claims are live (rule 7).
    pub fn failure_claims(&self) -> usize {
        self.look(false, |server| server.failure_claims())
    }

    /// Check that every failure's carrier count matches its claims.
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

    /// Install `plan`: the device calls it names fail from now on.
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

    /// The bytes of `src` whatever claims them, for tests only.
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
