//! The write scope: one unit of device work, and what its bytes owe.
//! Written by hand in each server, one early return forgets a step and a
//! buffer reads as healthy garbage; [`ExecuteScope`] is the bookkeeping, once.
//!
//! The constructor decides whether a scope *enters* (claiming its write
//! set) or *skips*: later, a skip could mint a failure nothing prunes.
//!
//! The body is a closure: a guard settling in `Drop` cannot tell a clean
//! end from an unwind. A scope dropped unexecuted leaves its bytes claimed.

use std::sync::Arc;

use crate::capture::CaptureWindow;
use crate::error::{Error, Result};
use crate::failure::{Work, WorkKind};
use crate::id::{BufferRange, FailureId, StreamId};
use crate::store::FailureStore;

/// A server whose device work runs inside an [`ExecuteScope`].
pub trait WriteScoped: Sized {
    /// The server's failure bookkeeping.
    type Store: FailureStore;

    /// The bookkeeping, split-borrowed from the body's rest of the server.
    fn store(&mut self) -> &mut Self::Store;

    /// Hears each skip and failed exit: no failed autotune candidate wins (rule 39).
    #[allow(unused_variables)]
    fn on_failure(&mut self, stream: StreamId, error: &Error) {}

    /// `stream`'s capture window while it records; the scope is its only informant.
    #[allow(unused_variables)]
    fn capturing(&mut self, stream: StreamId) -> Option<&mut CaptureWindow> {
        None
    }

    /// An empty write set from a pool, so success does not allocate.
    fn write_set(&mut self) -> Vec<BufferRange> {
        Vec::new()
    }

    /// A write set the scope is done with, back to the pool.
    #[allow(unused_variables)]
    fn recycle(&mut self, write_set: Vec<BufferRange>) {}
}

/// What a scope's work did.
#[derive(Debug)]
#[must_use = "a failed or skipped outcome is the caller's to report"]
pub enum ScopedOutcome<R> {
    /// It ran; its write set is written.
    Executed(R),
    /// It did not run: an input's failure is now its outputs'.
    Skipped {
        /// The kernel that did not run.
        kernel: Arc<str>,
        /// The stream.
        stream: StreamId,
    },
    /// It ran and failed; its write set carries the error.
    Failed(Error),
}

impl<R> ScopedOutcome<R> {
    /// The result.
    ///
    /// # Errors
    ///
    /// The work's error, or a payload-free [`Error::Skipped`] (rule 18).
    pub fn into_result(self) -> Result<R> {
        match self {
            ScopedOutcome::Executed(r) => Ok(r),
            ScopedOutcome::Failed(error) => Err(error),
            ScopedOutcome::Skipped { kernel, stream, .. } => Err(Error::Skipped { kernel, stream }),
        }
    }

    /// Whether the work did not run because of an input.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_skipped(&self) -> bool {
        matches!(self, ScopedOutcome::Skipped { .. })
    }
}

enum Opened {
    /// Claimed by a provisional failure (none for an empty write set).
    Entered { provisional: Option<FailureId> },
    /// Pointed at the failure that stopped it.
    Skipped { kernel: Arc<str> },
}

/// One unit of device work that writes memory (rule 15).
pub struct ExecuteScope<'a, S: WriteScoped> {
    server: &'a mut S,
    stream: StreamId,
    written: Vec<BufferRange>,
    read: &'a [BufferRange],
    opened: Opened,
    /// Whether the work may write less than its write set (indirect).
    maybe: bool,
}

impl<'a, S: WriteScoped> ExecuteScope<'a, S> {
    /// A scope over work that reads nothing it must trust; enters (rule 16).
    pub fn over(server: &'a mut S, work: Work, written: Vec<BufferRange>) -> Self {
        Self::enter(server, work, None, written)
    }

    #[inline(always)]
    fn enter(
        server: &'a mut S,
        work: Work,
        kernel: Option<&Arc<str>>,
        written: Vec<BufferRange>,
    ) -> Self {
        let stream = work.stream;
        let provisional = server.store().enter_write(&written, work, kernel);
        Self {
            server,
            stream,
            written,
            read: &[],
            opened: Opened::Entered { provisional },
            maybe: false,
        }
    }

    /// A launch's scope, skipping at a failed input (rule 17): a skip tells the
    /// hook, dooms a recording, records the hop, claims outputs (rule 18).
    pub fn launching(
        server: &'a mut S,
        kernel: &Arc<str>,
        stream: StreamId,
        read: &'a [BufferRange],
        written: Vec<BufferRange>,
    ) -> Self {
        let Some((root, input)) = server.store().read_failure(read) else {
            let mut scope = Self::enter(
                server,
                Work::new(WorkKind::Launch, stream),
                Some(kernel),
                written,
            );
            scope.read = read;
            return scope;
        };
        let error =
            server.store().failures().error(root).unwrap_or_else(|| {
                Arc::new(Error::internal("an input's failure is no longer held"))
            });
        server.on_failure(stream, &error);
        if let Some(window) = server.capturing(stream) {
            window.fail(&Error::Skipped {
                kernel: kernel.clone(),
                stream,
            });
        }
        server
            .store()
            .propagate(root, kernel, stream, input, &written);
        tracing::debug!(%kernel, %stream, %input, "skipped: input carries {root}");
        Self {
            server,
            stream,
            written,
            read,
            opened: Opened::Skipped {
                kernel: kernel.clone(),
            },
            maybe: false,
        }
    }

    /// [`launching`](Self::launching) for inputs the caller found unclaimed,
    /// already running, as [`run`](Self::run) gives it.
    #[inline(always)]
    pub(crate) fn entering(
        server: &'a mut S,
        kernel: &Arc<str>,
        stream: StreamId,
        read: &'a [BufferRange],
        written: Vec<BufferRange>,
        maybe: bool,
    ) -> Running<'a, S> {
        debug_assert!(
            server.store().read_failure(read).is_none(),
            "entering: an input carries a failure"
        );
        let provisional =
            server
                .store()
                .enter_write(&written, Work::new(WorkKind::Launch, stream), Some(kernel));
        Running {
            server,
            stream,
            written,
            read,
            provisional,
            maybe,
        }
    }

    /// Work whose extent only the device knows: a clean exit heals nothing.
    pub fn writing_at_most(mut self) -> Self {
        self.maybe = true;
        self
    }

    /// Whether the body will not run.
    #[cfg(any(test, feature = "internals"))]
    pub fn skipped(&self) -> bool {
        matches!(self.opened, Opened::Skipped { .. })
    }

    /// What the work writes.
    #[cfg(any(test, feature = "internals"))]
    pub fn written(&self) -> &[BufferRange] {
        &self.written
    }

    /// Run `body` unless skipped, and settle the write set (rule 19): heal
    /// it, or doom a recording, give it the error and tell the hook.
    pub fn execute<R>(
        self,
        body: impl FnOnce(&mut S, &[BufferRange]) -> Result<R>,
    ) -> ScopedOutcome<R> {
        match self.run() {
            Ok(mut running) => {
                let (server, written) = running.parts();
                let result = body(server, written);
                running.finish(result)
            }
            Err(skipped) => skipped,
        }
    }

    /// [`execute`](Self::execute), halved: launches store no closure captures.
    #[inline(always)]
    pub(crate) fn run<R>(self) -> std::result::Result<Running<'a, S>, ScopedOutcome<R>> {
        let Self {
            server,
            stream,
            written,
            read,
            opened,
            maybe,
        } = self;
        match opened {
            Opened::Entered { provisional } => Ok(Running {
                server,
                stream,
                written,
                read,
                provisional,
                maybe,
            }),
            Opened::Skipped { kernel } => {
                server.recycle(written);
                Err(ScopedOutcome::Skipped { kernel, stream })
            }
        }
    }
}

/// A running scope; dropped unfinished, its write set stays claimed (rule 20).
pub(crate) struct Running<'a, S: WriteScoped> {
    server: &'a mut S,
    stream: StreamId,
    written: Vec<BufferRange>,
    read: &'a [BufferRange],
    provisional: Option<FailureId>,
    maybe: bool,
}

impl<S: WriteScoped> Running<'_, S> {
    #[inline(always)]
    pub(crate) fn parts(&mut self) -> (&mut S, &[BufferRange]) {
        (self.server, &self.written)
    }

    #[inline]
    pub(crate) fn finish<R>(self, result: Result<R>) -> ScopedOutcome<R> {
        match result {
            Ok(r) => {
                self.finish_ok();
                ScopedOutcome::Executed(r)
            }
            Err(error) => self.finish_failed(error),
        }
    }

    /// [`finish`](Self::finish) for success, so the launch path moves no result.
    #[inline]
    pub(crate) fn finish_ok(self) {
        let Self {
            server,
            stream,
            written,
            read,
            provisional,
            maybe,
        } = self;
        if let Some(window) = server.capturing(stream) {
            if maybe {
                window.record_maybe(&written, read);
            } else {
                window.record(&written, read);
            }
        }
        server.store().exit_write(provisional, &written, None);
        server.recycle(written);
    }

    #[cold]
    #[inline(never)]
    fn finish_failed<R>(self, error: Error) -> ScopedOutcome<R> {
        let Self {
            server,
            stream,
            written,
            provisional,
            ..
        } = self;
        if let Some(window) = server.capturing(stream) {
            window.fail(&error);
        }
        server
            .store()
            .exit_write(provisional, &written, Some(&error));
        server.recycle(written);
        tracing::warn!(%stream, "device work failed: {error}");
        server.on_failure(stream, &error);
        ScopedOutcome::Failed(error)
    }
}

/// Claim `written` with `error` for work that never started (rule 21).
pub fn failed_writing<S: WriteScoped>(
    server: &mut S,
    work: Work,
    written: Vec<BufferRange>,
    error: Error,
) -> Error {
    match ExecuteScope::over(server, work, written).execute(|_, _| Err::<(), _>(error)) {
        ScopedOutcome::Failed(error) => error,
        _ => unreachable!("a body that returns an error fails"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::Failures;
    use crate::id::{BufferId, ByteRange};
    use crate::store::TaintSlot;
    use crate::taint::Taint;

    #[derive(Default)]
    struct Store {
        failures: Failures,
        taints: Vec<Taint>,
        hooked: Vec<String>,
        window: CaptureWindow,
    }

    impl FailureStore for Store {
        fn failures(&mut self) -> &mut Failures {
            &mut self.failures
        }

        fn locate(&mut self, buffer: BufferId) -> (&mut Failures, TaintSlot<'_>) {
            match self.taints.get_mut(buffer.slot() as usize) {
                Some(t) => (&mut self.failures, TaintSlot::Allocated(t)),
                None => (&mut self.failures, TaintSlot::Gone),
            }
        }
    }

    impl WriteScoped for Store {
        type Store = Self;

        fn store(&mut self) -> &mut Self {
            self
        }

        fn on_failure(&mut self, _: StreamId, error: &Error) {
            self.hooked.push(error.to_string());
        }

        fn capturing(&mut self, _: StreamId) -> Option<&mut CaptureWindow> {
            Some(&mut self.window).filter(|w| w.is_recording())
        }
    }

    fn store(buffers: usize) -> Store {
        Store {
            taints: (0..buffers).map(|_| Taint::new()).collect(),
            ..Store::default()
        }
    }

    fn at(slot: u32, start: u64, end: u64) -> BufferRange {
        BufferRange {
            buffer: BufferId::from_parts(slot, 0),
            range: ByteRange::new(start, end),
        }
    }

    const S: StreamId = StreamId(0);

    fn work() -> Work {
        Work::new(WorkKind::Launch, S)
    }

    #[test]
    fn an_empty_write_set_mints_and_claims_nothing() {
        // Rule 16.
        let mut s = store(1);
        let scope = ExecuteScope::over(&mut s, work(), Vec::new());
        assert!(s_failures_empty_after(scope));
    }

    fn s_failures_empty_after(scope: ExecuteScope<'_, Store>) -> bool {
        let outcome = scope.execute(|s, _| Ok(s.failures.len()));
        matches!(outcome, ScopedOutcome::Executed(0))
    }

    #[test]
    fn entering_claims_the_write_set_until_the_exit() {
        // Rules 16, 19.
        let mut s = store(2);
        let outcome = ExecuteScope::over(&mut s, work(), vec![at(0, 0, 8), at(1, 4, 8)]).execute(
            |s, written| {
                assert_eq!(written.len(), 2);
                assert!(
                    s.read_failure(&[at(0, 0, 4)]).is_some(),
                    "tainted unless proven written"
                );
                assert!(
                    s.read_failure(&[at(1, 0, 4)]).is_none(),
                    "only the binding's range"
                );
                Ok(())
            },
        );
        assert!(matches!(outcome, ScopedOutcome::Executed(())));
        assert!(s.failures.is_empty());
        assert!(s.hooked.is_empty(), "success never calls the hook");
    }

    #[test]
    fn a_clean_exit_heals_older_failures_too() {
        // Rule 19: a rewrite is how a buffer heals.
        let mut s = store(1);
        let old = s.claim_failed(&[at(0, 0, 16)], work(), Error::refused("old"));
        assert!(old.is_some());
        ExecuteScope::over(&mut s, work(), vec![at(0, 0, 8)])
            .execute(|_, _| Ok(()))
            .into_result()
            .unwrap();
        assert!(s.read_failure(&[at(0, 0, 8)]).is_none());
        assert_eq!(s.read_failure(&[at(0, 8, 16)]).map(|f| f.0), old);
        ExecuteScope::over(&mut s, work(), vec![at(0, 8, 16)])
            .execute(|_, _| Ok(()))
            .into_result()
            .unwrap();
        assert!(s.failures.is_empty());
    }

    #[test]
    fn a_failed_exit_swaps_in_the_real_error_and_tells_the_hook() {
        // Rules 19, 39.
        let mut s = store(1);
        let outcome = ExecuteScope::over(&mut s, work(), vec![at(0, 0, 8)])
            .execute(|_, _| Err::<(), _>(Error::refused("device said no")));
        assert!(matches!(outcome, ScopedOutcome::Failed(_)));
        let error = s.check(&[at(0, 0, 8)]).unwrap_err();
        assert!(error.to_string().contains("device said no"), "{error}");
        assert_eq!(s.hooked.len(), 1);
    }

    #[test]
    fn a_body_that_panics_leaves_its_bytes_never_finished() {
        // Rule 20.
        let mut s = store(1);
        let kernel: Arc<str> = Arc::from("exploding");
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = ExecuteScope::launching(&mut s, &kernel, S, &[], vec![at(0, 0, 8)])
                .execute(|_, _| -> Result<()> { panic!("mid-launch") });
        }));
        assert!(caught.is_err());
        let error = s.check(&[at(0, 0, 8)]).unwrap_err();
        assert!(
            matches!(&*error.unwritten()[0].root, Error::NeverFinished { .. }),
            "{error}"
        );
        assert!(
            error.to_string().contains("exploding"),
            "names the kernel: {error}"
        );
        // A second scope mints while the first is still claimed.
        ExecuteScope::over(&mut s, work(), vec![at(0, 0, 8)])
            .execute(|_, _| Ok(()))
            .into_result()
            .unwrap();
        assert!(s.check(&[at(0, 0, 8)]).is_ok());
        assert!(
            s.failures.is_empty(),
            "the later write healed it and the store emptied"
        );
    }

    #[test]
    fn an_early_return_is_the_same_as_a_panic() {
        // Rule 20: a scope dropped without `execute`.
        let mut s = store(1);
        drop(ExecuteScope::over(&mut s, work(), vec![at(0, 0, 8)]));
        assert!(s.check(&[at(0, 0, 8)]).is_err());
    }

    #[test]
    fn a_skip_points_outputs_at_the_root_and_never_runs() {
        // Rules 17, 18, 31, 39.
        let mut s = store(3);
        let root = s
            .claim_failed(&[at(0, 0, 8)], work(), Error::refused("root"))
            .unwrap();
        s.window.prepare(S).unwrap();
        s.window.start().unwrap();
        let kernel: Arc<str> = Arc::from("k");
        let reads = [at(1, 0, 8), at(0, 4, 8)];
        let scope = ExecuteScope::launching(&mut s, &kernel, S, &reads, vec![at(2, 0, 8)]);
        assert!(scope.skipped());
        let outcome = scope.execute(|_, _| -> Result<()> { panic!("a skipped body never runs") });
        assert!(outcome.is_skipped());
        assert!(matches!(outcome.into_result(), Err(Error::Skipped { .. })));
        assert_eq!(
            s.read_failure(&[at(2, 0, 8)]).map(|f| f.0),
            Some(root),
            "minting nothing"
        );
        assert_eq!(s.failures.len(), 1);
        assert_eq!(s.failures.get(root).unwrap().carriers(), 2);
        assert!(
            s.hooked[0].contains("root"),
            "the hook hears the root error"
        );
        assert!(s.window.doom().is_some(), "the window is doomed");
        let report = s.check(&[at(2, 0, 8)]).unwrap_err();
        assert_eq!(report.unwritten()[0].chain.hops[0].needed, at(0, 4, 8));
    }

    #[test]
    fn failed_writing_claims_without_running() {
        // Rule 21.
        let mut s = store(1);
        let error = failed_writing(
            &mut s,
            work(),
            vec![at(0, 0, 4)],
            Error::refused("no graph"),
        );
        assert!(error.is_refusal());
        assert!(s.check(&[at(0, 0, 4)]).unwrap_err().is_refusal());
    }
}
