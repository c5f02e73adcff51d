//! The device's failures, each held exactly while an allocation carries it (rule 7).
//!
//! Every write mints a *provisional* failure (rules 16, 20) that a clean exit
//! releases. A hash map would charge every launch an insert and a remove,
//! so the newest mint lives in a one-slot *nursery*.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;

use crate::id::IdHasher;
use std::sync::Arc;

use crate::error::{Chain, Error, Hop, UnwrittenBytes};
use crate::id::{BufferRange, FailureId, StreamId};

/// How many skip records a failure keeps: the newest (rule 26).
pub const MAX_SKIP_RECORDS: usize = 16;

/// What a provisional failure was minted for; eight bytes, to fit a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Work {
    /// What kind of work.
    pub kind: WorkKind,
    /// The stream it was issued on.
    pub stream: StreamId,
}

/// The kinds of device work a scope covers (rule 15).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkKind {
    /// A kernel launch.
    Launch,
    /// A host-to-device write.
    Write,
    /// A replay of a captured graph.
    Replay,
    /// An allocation.
    Allocate,
    /// Work attributed at a sync, a fence or a capture's end.
    Settle,
}

impl Work {
    /// Work of `kind` on `stream`.
    pub fn new(kind: WorkKind, stream: StreamId) -> Self {
        Self { kind, stream }
    }

    fn describe(&self, kernel: Option<&Arc<str>>) -> String {
        let what = match self.kind {
            WorkKind::Launch => "launch",
            WorkKind::Write => "host write",
            WorkKind::Replay => "graph replay",
            WorkKind::Allocate => "allocation",
            WorkKind::Settle => "device work",
        };
        match kernel {
            Some(kernel) => format!("{what} of `{kernel}` on {}", self.stream),
            None => format!("{what} on {}", self.stream),
        }
    }
}

/// A launch that did not run because of a failure (rule 18).
#[derive(Clone, Debug)]
pub struct SkipRecord {
    /// The kernel.
    pub kernel: Arc<str>,
    /// The stream it was issued on.
    pub stream: StreamId,
    /// The input that stopped it.
    pub input: BufferRange,
    /// What it would have written.
    pub outputs: Vec<BufferRange>,
}

/// One failure (rule 2).
#[derive(Debug)]
pub struct FailureNode {
    /// `None` while provisional: the work that minted it has not ended.
    error: Option<Arc<Error>>,
    work: Work,
    kernel: Option<Arc<str>>,
    carriers: u32,
    /// Absent until the first skip, so the nursery's node stays small.
    history: Option<Box<History>>,
}

#[derive(Debug, Default)]
struct History {
    skips: VecDeque<SkipRecord>,
    total: u64,
}

impl FailureNode {
    fn new(work: Work, kernel: Option<Arc<str>>) -> Self {
        Self {
            error: None,
            work,
            kernel,
            carriers: 0,
            history: None,
        }
    }

    /// The error every carrier reports.
    pub fn error(&self) -> Arc<Error> {
        match &self.error {
            Some(error) => error.clone(),
            None => Arc::new(Error::NeverFinished {
                work: self.work.describe(self.kernel.as_ref()),
            }),
        }
    }

    /// How many allocations carry it.
    #[cfg(any(test, feature = "internals", feature = "fault-injection"))]
    pub fn carriers(&self) -> u32 {
        self.carriers
    }

    /// How many skips it has caused in all, kept or dropped.
    pub fn total_skips(&self) -> u64 {
        self.history.as_ref().map_or(0, |h| h.total)
    }

    /// The skip records it keeps, oldest first.
    #[cfg(any(test, feature = "internals"))]
    pub fn skips(&self) -> impl Iterator<Item = &SkipRecord> {
        self.history.iter().flat_map(|h| h.skips.iter())
    }
}

/// The failures of one device (rules 1–7).
#[derive(Debug)]
pub struct Failures {
    next: u64,
    nursery: Option<(FailureId, FailureNode)>,
    nodes: HashMap<FailureId, FailureNode, BuildHasherDefault<IdHasher>>,
}

impl Default for Failures {
    fn default() -> Self {
        Self::new()
    }
}

impl Failures {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            next: 1,
            nursery: None,
            nodes: HashMap::default(),
        }
    }

    /// Mint one for `work` (rule 1), to [`prune`](Self::prune) if unused (rule 5).
    #[inline]
    pub fn mint(&mut self, work: Work) -> FailureId {
        self.mint_for(work, None)
    }

    /// Mint a failure for `work` running `kernel`.
    #[inline]
    pub fn mint_for(&mut self, work: Work, kernel: Option<&Arc<str>>) -> FailureId {
        let Some(id) = FailureId::new(self.next) else {
            unreachable!("the counter starts at one and a u64 does not wrap")
        };
        self.next += 1;
        if let Some((old, node)) = self.nursery.take() {
            // A second mint while the first is still held: the first graduates.
            self.nodes.insert(old, node);
        }
        self.nursery = Some((id, FailureNode::new(work, kernel.cloned())));
        id
    }

    /// Mint a failure that already has its error, such as a late fault.
    pub fn mint_failed(&mut self, work: Work, error: Error) -> FailureId {
        let id = self.mint(work);
        self.set_error(id, error);
        id
    }

    /// The node of `id`, if it is held.
    #[inline]
    pub fn get(&self, id: FailureId) -> Option<&FailureNode> {
        match &self.nursery {
            Some((nursed, node)) if *nursed == id => Some(node),
            _ => self.nodes.get(&id),
        }
    }

    #[inline]
    fn get_mut(&mut self, id: FailureId) -> Option<&mut FailureNode> {
        match &mut self.nursery {
            Some((nursed, node)) if *nursed == id => Some(node),
            _ => self.nodes.get_mut(&id),
        }
    }

    #[inline]
    fn remove(&mut self, id: FailureId) {
        match &self.nursery {
            Some((nursed, _)) if *nursed == id => self.nursery = None,
            _ => {
                self.nodes.remove(&id);
            }
        }
    }

    /// One more allocation carries `id` (rule 3).
    #[inline]
    pub fn acquire(&mut self, id: FailureId) {
        if let Some(node) = self.get_mut(id) {
            node.carriers += 1;
        } else {
            debug_assert!(false, "acquire of unknown {id:?}");
        }
    }

    /// One allocation no longer carries `id`; the last removes it (rule 4).
    #[inline]
    pub fn release(&mut self, id: FailureId) {
        let Some(node) = self.get_mut(id) else {
            debug_assert!(false, "release of unknown {id:?}");
            return;
        };
        debug_assert!(node.carriers > 0, "release of uncarried {id:?}");
        node.carriers = node.carriers.saturating_sub(1);
        if node.carriers == 0 {
            self.remove(id);
        }
    }

    /// Remove `id` if nothing carries it (rule 5).
    #[inline]
    pub fn prune(&mut self, id: FailureId) {
        match &self.nursery {
            Some((nursed, node)) if *nursed == id => {
                if node.carriers == 0 {
                    self.nursery = None;
                }
            }
            // The success path: nothing ever graduated to the map.
            _ if self.nodes.is_empty() => {}
            _ => {
                if self.nodes.get(&id).is_some_and(|node| node.carriers == 0) {
                    self.nodes.remove(&id);
                }
            }
        }
    }

    /// Replace the error of `id`, for every carrier (rule 6).
    pub fn set_error(&mut self, id: FailureId, error: Error) {
        if let Some(node) = self.get_mut(id) {
            node.error = Some(Arc::new(error));
        }
    }

    /// The error `id`'s carriers report.
    pub fn error(&self, id: FailureId) -> Option<Arc<Error>> {
        self.get(id).map(FailureNode::error)
    }

    /// Record a skip because of `root`, keeping the newest [`MAX_SKIP_RECORDS`].
    pub fn record_skip(&mut self, root: FailureId, record: SkipRecord) {
        if let Some(node) = self.get_mut(root) {
            let history = node.history.get_or_insert_default();
            if history.skips.len() == MAX_SKIP_RECORDS {
                history.skips.pop_front();
            }
            history.skips.push_back(record);
            history.total += 1;
        }
    }

    /// How many failures are held, provisional ones included.
    pub fn len(&self) -> usize {
        self.nodes.len() + usize::from(self.nursery.is_some())
    }

    /// Whether none is held.
    #[cfg(any(test, feature = "internals"))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every failure held, with its carrier count.
    #[cfg(any(test, feature = "internals", feature = "fault-injection"))]
    pub fn held(&self) -> impl Iterator<Item = (FailureId, &FailureNode)> {
        self.nursery
            .iter()
            .map(|(id, node)| (*id, node))
            .chain(self.nodes.iter().map(|(id, node)| (*id, node)))
    }

    /// The report a read gets for `id`: its root and chain (rules 25, 26).
    /// Each hop is the newest launch that would have written the previous one's input.
    pub fn report(&self, id: FailureId, read: BufferRange) -> Option<UnwrittenBytes> {
        let node = self.get(id)?;
        let empty = VecDeque::new();
        let skips = node.history.as_ref().map_or(&empty, |h| &h.skips);
        let mut hops = Vec::new();
        let mut wanted = read;
        let mut before = skips.len();
        while let Some(index) = skips.iter().take(before).rposition(|skip| {
            skip.outputs
                .iter()
                .any(|out| out.buffer == wanted.buffer && out.range.intersects(wanted.range))
        }) {
            let skip = &skips[index];
            let wrote = skip
                .outputs
                .iter()
                .find(|out| out.buffer == wanted.buffer && out.range.intersects(wanted.range))
                .copied()
                .unwrap_or(wanted);
            hops.push(Hop {
                kernel: skip.kernel.clone(),
                stream: skip.stream,
                needed: skip.input,
                wrote,
            });
            wanted = skip.input;
            before = index;
        }
        Some(UnwrittenBytes {
            read,
            failure: id,
            carriers: node.carriers,
            root: node.error(),
            chain: Chain {
                hops,
                dropped: node.total_skips() - skips.len() as u64,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work() -> Work {
        Work::new(WorkKind::Write, StreamId(0))
    }

    #[test]
    fn ids_are_minted_from_a_counter_and_never_reused() {
        // Rule 1.
        let mut failures = Failures::new();
        let a = failures.mint(work());
        failures.prune(a);
        let b = failures.mint(work());
        assert_ne!(a, b);
        assert!(b.get() > a.get());
        assert_eq!(size_of::<Option<FailureId>>(), 8);
    }

    #[test]
    fn the_last_carrier_removes_a_failure_and_over_release_floors() {
        // Rule 4.
        let mut failures = Failures::new();
        let f = failures.mint(work());
        failures.acquire(f);
        failures.acquire(f);
        failures.release(f);
        assert_eq!(failures.get(f).unwrap().carriers(), 1);
        failures.release(f);
        assert!(failures.get(f).is_none());
        assert!(failures.is_empty());
    }

    #[test]
    fn pruning_removes_only_an_uncarried_failure() {
        // Rule 5.
        let mut failures = Failures::new();
        let carried = failures.mint(work());
        failures.acquire(carried);
        let idle = failures.mint(work());
        failures.prune(carried);
        failures.prune(idle);
        assert!(failures.get(carried).is_some());
        assert!(failures.get(idle).is_none());
        failures.prune(FailureId::new(999).unwrap());
        assert_eq!(failures.len(), 1);
    }

    #[test]
    fn replacing_the_error_changes_what_is_reported() {
        // Rule 6.
        let mut failures = Failures::new();
        let f = failures.mint(work());
        failures.acquire(f);
        assert!(matches!(
            *failures.error(f).unwrap(),
            Error::NeverFinished { .. }
        ));
        failures.set_error(f, Error::refused("first"));
        failures.set_error(f, Error::refused("second"));
        assert!(failures.error(f).unwrap().to_string().contains("second"));
    }

    #[test]
    fn skip_records_keep_the_newest_sixteen_and_count_the_rest() {
        // Rule 2, 26.
        let mut failures = Failures::new();
        let f = failures.mint_failed(work(), Error::refused("root"));
        failures.acquire(f);
        let buf = |slot| BufferRange {
            buffer: crate::BufferId::from_parts(slot, 0),
            range: crate::ByteRange::new(0, 4),
        };
        for i in 0..20u32 {
            failures.record_skip(
                f,
                SkipRecord {
                    kernel: format!("k{i}").into(),
                    stream: StreamId(0),
                    input: buf(i),
                    outputs: vec![buf(i + 1)],
                },
            );
        }
        let node = failures.get(f).unwrap();
        assert_eq!(node.skips().count(), MAX_SKIP_RECORDS);
        assert_eq!(node.total_skips(), 20);
        let report = failures.report(f, buf(20)).unwrap();
        assert_eq!(report.chain.hops.len(), 16);
        assert_eq!(&*report.chain.hops[0].kernel, "k19");
        assert_eq!(&*report.chain.hops[15].kernel, "k4");
        assert_eq!(report.chain.dropped, 4);
    }
}
