//! The failure rules, once: [`FailureStore`] asks a server only where claims
//! live ([`locate`](FailureStore::locate)), so no rule drifts four ways.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::failure::{Failures, SkipRecord, Work};
use crate::id::{BufferId, BufferRange, FailureId, StreamId};
use crate::taint::Taint;

/// Where the claims on one buffer live.
pub enum TaintSlot<'a> {
    /// The buffer has memory; these are the claims on it.
    Allocated(&'a mut Taint),
    /// The allocation failed, for this reason if any (rule 28); only a free ends it.
    Unallocated(Option<FailureId>),
    /// No such buffer: claims on it are dropped (rule 32).
    Gone,
}

/// [`Failures`] and each buffer's taint; servers should not override the defaults.
pub trait FailureStore {
    /// The device's failures.
    fn failures(&mut self) -> &mut Failures;

    /// The failures and the claims on `buffer`, split-borrowed.
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

    /// Remove `written` from every claim (rules 11, 19).
    #[inline(always)]
    fn heal(&mut self, written: &[BufferRange]) {
        for target in written {
            if let (failures, TaintSlot::Allocated(taint)) = self.locate(target.buffer) {
                taint.clear(target.range, failures);
            }
        }
    }

    /// The first failed input, and its failure (rule 17).
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

    /// Claim `written` for work about to run (rule 16).
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

    /// Settle the claim [`enter_write`](Self::enter_write) made: heal, or
    /// give the provisional failure its real error (rule 19).
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

    /// A skipped launch: record the hop, point its outputs at `root` (rule 18).
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

    /// Claim `written` for a new failure; `None` if pruned (rules 21, 23, 33).
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
    /// [`Error::Unwritten`], [`Error::SeveralUnwritten`] or
    /// [`Error::NeverAllocated`]; nothing clears until rewritten (rule 27).
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
