//! The failure rules, written once, over wherever a server keeps its taint.
//!
//! A server knows only where a buffer's claims live.
//! [`FailureStore`] asks exactly that ([`locate`](FailureStore::locate))
//! and carries every rule as a default method. A rule written into a
//! server would drift four ways; here there is one place to read and test.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::failure::{Failures, SkipRecord, Work};
use crate::id::{BufferId, BufferRange, FailureId, StreamId};
use crate::taint::Taint;

/// Where the claims on one buffer live.
pub enum TaintSlot<'a> {
    /// The buffer has memory; these are the claims on it.
    Allocated(&'a mut Taint),
    /// The allocation failed, for this recorded reason if any (rule 28). It
    /// cannot be tainted or healed; only freeing it ends it.
    Unallocated(Option<FailureId>),
    /// No such buffer here: claims on it are dropped, as a weakly held
    /// recording wants (rule 32).
    Gone,
}

/// A device's failure bookkeeping: a [`Failures`] store and each
/// buffer's taint. Implementors supply two methods; every rule is a
/// default method servers should not override.
pub trait FailureStore {
    /// The device's failures.
    fn failures(&mut self) -> &mut Failures;

    /// The failures and the claims on `buffer`, split-borrowed so a claim can
    /// acquire and release failures.
    fn locate(&mut self, buffer: BufferId) -> (&mut Failures, TaintSlot<'_>);

    /// Point every range of `written` at `failure` (rules 9, 22).
    #[inline(always)]
    fn taint(&mut self, written: &[BufferRange], failure: FailureId) {
        for target in written {
            if let (failures, TaintSlot::Allocated(taint)) = self.locate(target.buffer) {
                taint.set(target.range, failure, failures);
            }
        }
    }

    /// Remove every range of `written` from every claim: it was written
    /// (rules 11, 19).
    #[inline(always)]
    fn heal(&mut self, written: &[BufferRange]) {
        for target in written {
            if let (failures, TaintSlot::Allocated(taint)) = self.locate(target.buffer) {
                taint.clear(target.range, failures);
            }
        }
    }

    /// The first input whose range carries a failure, and that failure (rule
    /// 17). An unallocated input with a recorded failure counts.
    #[inline(always)]
    fn read_failure<'b>(
        &mut self,
        reads: impl IntoIterator<Item = &'b BufferRange>,
    ) -> Option<(FailureId, BufferRange)> {
        for input in reads {
            let found = match self.locate(input.buffer).1 {
                TaintSlot::Allocated(taint) => taint.query(input.range),
                TaintSlot::Unallocated(record) => record,
                TaintSlot::Gone => None,
            };
            if let Some(failure) = found {
                return Some((failure, *input));
            }
        }
        None
    }

    /// Claim `written` for work about to run (rule 16). An empty write set
    /// mints nothing. `kernel` names a launch in "never finished".
    #[inline(always)]
    fn enter_write(
        &mut self,
        written: &[BufferRange],
        work: Work,
        kernel: Option<&Arc<str>>,
    ) -> Option<FailureId> {
        if written.is_empty() {
            return None;
        }
        let provisional = self.failures().mint_for(work, kernel);
        self.taint(written, provisional);
        Some(provisional)
    }

    /// Settle the claim [`enter_write`](Self::enter_write) made (rule 19).
    ///
    /// A clean exit releases every claim on the written ranges: a rewrite
    /// heals. A failed exit gives the provisional failure its real error.
    #[inline(always)]
    fn exit_write(
        &mut self,
        provisional: Option<FailureId>,
        written: &[BufferRange],
        error: Option<&Error>,
    ) {
        let Some(provisional) = provisional else {
            return;
        };
        match error {
            None => self.heal(written),
            Some(error) => self.failures().set_error(provisional, error.clone()),
        }
        self.failures().prune(provisional);
    }

    /// A launch of `kernel` was skipped because `input` carries `root` (rule
    /// 18): record the hop and point its outputs at the root.
    fn propagate(
        &mut self,
        root: FailureId,
        kernel: &Arc<str>,
        stream: StreamId,
        input: BufferRange,
        written: &[BufferRange],
    ) {
        self.failures().record_skip(
            root,
            SkipRecord {
                kernel: kernel.clone(),
                stream,
                input,
                outputs: written.to_vec(),
            },
        );
        self.taint(written, root);
    }

    /// Claim `written` for a new failure with `error` (rules 21, 23, 33).
    /// `None` when it claimed nothing and was pruned.
    fn claim_failed(
        &mut self,
        written: &[BufferRange],
        work: Work,
        error: Error,
    ) -> Option<FailureId> {
        let failure = self.failures().mint_failed(work, error);
        self.taint(written, failure);
        self.failures().prune(failure);
        self.failures().get(failure).map(|_| failure)
    }

    /// Whether every byte of `reads` is readable (rules 24–28).
    ///
    /// # Errors
    ///
    /// [`Error::Unwritten`] for one failure, [`Error::SeveralUnwritten`] for
    /// each distinct one, [`Error::NeverAllocated`] for a buffer without
    /// memory or record. Nothing is cleared until rewritten (rule 27).
    fn check(&mut self, reads: &[BufferRange]) -> Result<()> {
        let mut found: Vec<(FailureId, BufferRange)> = Vec::new();
        for read in reads {
            match self.locate(read.buffer).1 {
                TaintSlot::Allocated(taint) => {
                    if taint.is_clean() {
                        continue;
                    }
                    for failure in taint.query_all(read.range) {
                        if !found.iter().any(|(f, _)| *f == failure) {
                            found.push((failure, *read));
                        }
                    }
                }
                TaintSlot::Unallocated(Some(failure)) => {
                    if !found.iter().any(|(f, _)| *f == failure) {
                        found.push((failure, *read));
                    }
                }
                TaintSlot::Unallocated(None) => {
                    return Err(Error::NeverAllocated {
                        buffer: read.buffer,
                    });
                }
                TaintSlot::Gone => {}
            }
        }
        let failures = self.failures();
        let mut reports: Vec<_> = found
            .into_iter()
            .filter_map(|(failure, read)| failures.report(failure, read))
            .collect();
        match reports.len() {
            0 => Ok(()),
            1 => Err(Error::Unwritten(Box::new(reports.remove(0)))),
            _ => Err(Error::SeveralUnwritten(reports)),
        }
    }
}
