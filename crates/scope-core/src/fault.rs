//! Fault injection: every device call passes a [`Site`] first, where the
//! server consults its [`FaultPlan`], so a test can fail any call on any
//! backend. Without `fault-injection` the check is empty.

use std::collections::HashMap;

use crate::error::{DeviceFault, Error, FaultClass};
use crate::id::StreamId;

/// A device call site.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Site {
    /// An allocation.
    Allocate,
    /// A host-to-device write.
    Write,
    /// A device-to-host read.
    Read,
    /// A device-to-device copy.
    Copy,
    /// A kernel compile.
    Compile,
    /// A kernel launch.
    Launch,
    /// A stream sync.
    Sync,
    /// The end of a capture, sealing a graph.
    Seal,
    /// A graph replay.
    Replay,
    /// A graph's destruction.
    Destroy,
    /// One rank's call into a device transport's collective library.
    Collective,
    /// Opening a lost device again ([`Client::recover`](crate::Client::recover)).
    Reopen,
}

#[derive(Clone, Debug)]
struct Rule {
    site: Site,
    stream: Option<StreamId>,
    nth: u64,
    error: Error,
    fired: bool,
}

/// Which device calls fail; calls count from one, per site and per stream.
#[derive(Clone, Debug, Default)]
pub struct FaultPlan {
    rules: Vec<Rule>,
    poison_at: Option<(u64, Error)>,
    counts: HashMap<(Site, Option<StreamId>), u64>,
    operations: u64,
}

impl FaultPlan {
    /// A plan that fails nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fail the `nth` call at `site`, on any stream, with `error`.
    pub fn fail(mut self, site: Site, nth: u64, error: Error) -> Self {
        self.rules.push(Rule {
            site,
            stream: None,
            nth,
            error,
            fired: false,
        });
        self
    }

    /// Fail the `nth` call at `site` on `stream` with `error`.
    pub fn fail_on(mut self, site: Site, stream: StreamId, nth: u64, error: Error) -> Self {
        self.rules.push(Rule {
            site,
            stream: Some(stream),
            nth,
            error,
            fired: false,
        });
        self
    }

    /// Make the `nth` device call of any kind a sticky fault named `code`.
    pub fn poison_at(mut self, nth: u64, backend: &'static str, code: &str) -> Self {
        self.poison_at = Some((
            nth,
            Error::Fault(DeviceFault {
                backend,
                code: code.to_owned(),
                class: FaultClass::Sticky,
                stream: None,
                detail: "injected".to_owned(),
            }),
        ));
        self
    }

    /// Count a call at `site` on `stream` and say whether it fails.
    #[inline]
    pub fn check(&mut self, site: Site, stream: Option<StreamId>) -> Option<Error> {
        // An empty plan would only cost every device call a hash-map update.
        if self.rules.is_empty() && self.poison_at.is_none() {
            return None;
        }
        self.count(site, stream)
    }

    #[inline(never)]
    fn count(&mut self, site: Site, stream: Option<StreamId>) -> Option<Error> {
        self.operations += 1;
        let any = {
            let n = self.counts.entry((site, None)).or_default();
            *n += 1;
            *n
        };
        let on_stream = match stream {
            Some(s) => {
                let n = self.counts.entry((site, Some(s))).or_default();
                *n += 1;
                *n
            }
            None => 0,
        };
        if let Some((nth, error)) = &self.poison_at
            && *nth == self.operations
        {
            let mut error = error.clone();
            if let Error::Fault(fault) = &mut error {
                fault.stream = stream;
            }
            return Some(error);
        }
        for rule in &mut self.rules {
            if rule.fired || rule.site != site {
                continue;
            }
            let count = match rule.stream {
                None => any,
                Some(s) if Some(s) == stream => on_stream,
                Some(_) => continue,
            };
            if count == rule.nth {
                rule.fired = true;
                return Some(rule.error.clone());
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_site_and_per_stream() {
        let mut plan = FaultPlan::new()
            .fail(Site::Launch, 2, Error::refused("second launch"))
            .fail_on(
                Site::Write,
                StreamId(1),
                1,
                Error::refused("first write on 1"),
            );
        assert!(plan.check(Site::Launch, Some(StreamId(0))).is_none());
        assert!(plan.check(Site::Write, Some(StreamId(0))).is_none());
        assert!(plan.check(Site::Launch, Some(StreamId(1))).is_some());
        assert!(plan.check(Site::Launch, Some(StreamId(0))).is_none());
        assert!(plan.check(Site::Write, Some(StreamId(1))).is_some());
        assert!(plan.check(Site::Write, Some(StreamId(1))).is_none());
    }

    #[test]
    fn poison_at_the_nth_operation_is_sticky() {
        let mut plan = FaultPlan::new().poison_at(3, "host", "ILLEGAL_ADDRESS");
        assert!(plan.check(Site::Allocate, None).is_none());
        assert!(plan.check(Site::Write, None).is_none());
        let error = plan.check(Site::Launch, Some(StreamId(0))).unwrap();
        assert!(error.is_sticky());
    }
}
