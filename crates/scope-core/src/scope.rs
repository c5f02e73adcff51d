//! The write scope: one unit of device work, and what its bytes owe.
//!
//! Every unit of work that writes device memory — a launch, a host write, a
//! device copy, a graph replay — has the same bookkeeping around it: decide
//! whether its inputs can be trusted, claim what it writes before it runs,
//! release the claim if it finishes, replace it with the real error if it
//! does not, tell a measurement in flight, tell a recording window. Written
//! by hand in each server, one early return forgets one step and a buffer
//! reads as healthy garbage. [`ExecuteScope`] is that bookkeeping, once.
//!
//! A scope is decided in its constructor and cannot change its mind:
//!
//! - [`over`](ExecuteScope::over) and a clean [`launching`](ExecuteScope::launching)
//!   *enter*: the write set is claimed by a provisional failure, so a body
//!   that never reaches its end (an early return, a panic) leaves its bytes
//!   failing with "never finished";
//! - a [`launching`](ExecuteScope::launching) whose input carries a failure
//!   *skips*: the outputs are pointed at that failure, the hop is recorded,
//!   and the body never runs.
//!
//! Deciding later would let a skipped scope mint a provisional failure that
//! the propagated one then overwrites, and that nothing prunes, because the
//! exit that prunes is on the path a skip does not take.
//!
//! The body is a closure and the scope is consumed by
//! [`execute`](ExecuteScope::execute), rather than a guard settling in `Drop`:
//! a `Drop` cannot tell a clean end from an unwind without help, must not
//! panic while one is in progress, and would invite "settle on drop" to mean
//! "succeeded". A scope that is dropped without `execute` — including by a
//! panic inside the body — leaves the write set claimed, which is exactly
//! what a read of those bytes must fail on.

use std::sync::Arc;

use crate::capture::CaptureWindow;
use crate::error::{Error, Result};
use crate::failure::{Work, WorkKind};
use crate::id::{BufferRange, FailureId, StreamId};
use crate::store::FailureStore;

/// A server whose device work runs inside an [`ExecuteScope`].
///
/// It supplies what a scope cannot know — where its failure bookkeeping
/// lives, what a failure means to a measurement in flight, and whether the
/// stream is recording — and gets the scope's guarantees for it.
pub trait WriteScoped: Sized {
    /// The server's failure bookkeeping.
    type Store: FailureStore;

    /// The bookkeeping, split-borrowed from the server so the scope can claim
    /// on the way in and settle on the way out around a body that holds the
    /// rest of it.
    fn store(&mut self) -> &mut Self::Store;

    /// Told about every skip (with the root error) and every failed exit
    /// (with the real error), never about success (rule 39).
    ///
    /// A server uses it to invalidate a measurement in flight: an autotune
    /// candidate that failed, or never ran, finishes in close to no time and
    /// would otherwise win. Defaults to doing nothing.
    #[allow(unused_variables)]
    fn on_failure(&mut self, stream: StreamId, error: &Error) {}

    /// The capture window of `stream` while it is recording, for a server
    /// that captures; `None` otherwise (the default).
    ///
    /// The scope is the window's only informant: clean work hands it the
    /// write set, failed or skipped work dooms it, so "recorded" and "in the
    /// graph" cannot disagree.
    #[allow(unused_variables)]
    fn capturing(&mut self, stream: StreamId) -> Option<&mut CaptureWindow> {
        None
    }

    /// An empty write set to fill, from a pool so the success path does not
    /// allocate. Defaults to a fresh `Vec`.
    fn write_set(&mut self) -> Vec<BufferRange> {
        Vec::new()
    }

    /// A write set the scope is done with, back to the pool. Defaults to
    /// dropping it.
    #[allow(unused_variables)]
    fn recycle(&mut self, write_set: Vec<BufferRange>) {}
}

/// What a scope's work did.
#[derive(Debug)]
#[must_use = "a failed or skipped outcome is the caller's to report"]
pub enum ScopedOutcome<R> {
    /// It ran; its write set is written.
    Executed(R),
    /// It did not run: an input carried a failure, which its outputs carry
    /// now.
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
    /// The error the work failed with, or a payload-free
    /// [`Error::Skipped`] for a skip (rule 18): the root cause is the read's
    /// to report, not the launch's.
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
    /// Whether the work may write less than its write set (an indirect
    /// launch): a recording window then keeps its writes apart.
    maybe: bool,
}

impl<'a, S: WriteScoped> ExecuteScope<'a, S> {
    /// A scope over work that reads nothing it must trust — a host write, a
    /// device copy whose source was checked, a replay, work that never
    /// started. Always enters (rule 16).
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

    /// A scope over a launch of `kernel` on `stream` that reads `read` and
    /// writes `written`.
    ///
    /// Skips at the first input range that carries a failure (rule 17): a
    /// launch that cannot trust an input must not run, because garbage read
    /// as an index or a dispatch count scatters into bytes that carried no
    /// failure at all. A skip (rule 18) tells the failure hook the root
    /// error, dooms a recording window, records the hop, and points the
    /// outputs at the root failure.
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

    /// [`launching`](Self::launching) for a caller that has seen every
    /// input's claims as it resolved them and found none: no input range
    /// can carry a failure, so the scope enters without looking again. The
    /// launch path resolves each binding once and reads its claims there,
    /// where a second lookup per input here was a tenth of its cost.
    ///
    /// A scope that cannot skip, so it comes back running, as
    /// [`run`](Self::run) would give it, with `maybe` as
    /// [`writing_at_most`](Self::writing_at_most) sets it: built as a scope
    /// and taken apart again, its fields were stored and copied twice on
    /// every launch.
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

    /// Work whose extent only the device knows (an indirect launch): it may
    /// write its write set or none of it. The caller gives it only bytes
    /// that carry no failure, so a clean exit heals nothing; a recording
    /// window keeps these writes apart, so that a replay does not heal them
    /// either ([`CaptureWindow::record_maybe`]).
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

    /// Run `body` unless skipped, and settle the write set (rule 19).
    /// `body` gets the server and the write set.
    ///
    /// A clean exit records the write set into a recording window and heals
    /// it; a failed exit dooms a recording window, gives the provisional
    /// failure the real error, logs it and tells the failure hook.
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

    /// [`execute`](Self::execute) in two halves, for a body written in the
    /// caller's own code rather than a closure: the scope to run it in, or
    /// the outcome of a skip (the body must not run). The launch path runs
    /// its body so: a closure's captures, stored for the call and loaded
    /// again inside it, were near a twentieth of a launch's cost.
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

/// A scope whose body is running ([`ExecuteScope::run`]), settled by
/// [`finish`](Self::finish) with the body's result. Like a scope, it has no
/// `Drop`: one dropped without `finish` (an early return, a panic) leaves
/// its write set claimed, "never finished" (rule 20).
pub(crate) struct Running<'a, S: WriteScoped> {
    server: &'a mut S,
    stream: StreamId,
    written: Vec<BufferRange>,
    read: &'a [BufferRange],
    /// Claimed by it (none for an empty write set).
    provisional: Option<FailureId>,
    maybe: bool,
}

impl<S: WriteScoped> Running<'_, S> {
    /// What the body gets: the server and the write set.
    #[inline(always)]
    pub(crate) fn parts(&mut self) -> (&mut S, &[BufferRange]) {
        (self.server, &self.written)
    }

    /// Settle the write set with what the body returned, as
    /// [`ExecuteScope::execute`] says.
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

    /// [`finish`](Self::finish) for a body that succeeded: the write set
    /// recorded into a recording window and healed. Apart, so that the
    /// launch path, which knows its body succeeded, neither moves a result
    /// in nor an outcome out.
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

    /// [`finish`](Self::finish) for a body that failed with `error`: a
    /// recording window doomed, the provisional failure given the error,
    /// the failure logged and the hook told.
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

/// Claim `written` with `error` for work that never started — a kernel that
/// did not compile, an unknown graph, a refused copy (rule 21). Runs the
/// same exit as a failed body, so the failure hook and a recording window
/// hear of it too.
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

    /// A store that is only a table of taints, and a hook log.
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
