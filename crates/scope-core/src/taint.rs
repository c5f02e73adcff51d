//! Which bytes of an allocation carry which failure: a claim is a failure over
//! sorted, disjoint ranges (rules 8, 10), so a partial write stays honest.
//! Lists hold one element inline (rule 14): success never touches the heap.

use smallvec::SmallVec;

use crate::failure::Failures;
use crate::id::{ByteRange, FailureId};

/// Sorted, disjoint, non-touching ranges (rule 10).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ranges(SmallVec<[ByteRange; 1]>);

impl Ranges {
    /// The ranges, in order.
    pub fn iter(&self) -> impl Iterator<Item = ByteRange> + '_ {
        self.0.iter().copied()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Merge `range` in, fusing any range it overlaps or touches.
    #[inline]
    pub fn insert(&mut self, range: ByteRange) {
        if range.is_empty() {
            return;
        }
        if self.0.is_empty() {
            self.0.push(range);
            return;
        }
        // Ranges before the first that ends at or after our start are untouched.
        let first = self.0.partition_point(|r| r.end < range.start);
        let mut merged = range;
        let mut last = first;
        while last < self.0.len() && self.0[last].start <= merged.end {
            merged.start = merged.start.min(self.0[last].start);
            merged.end = merged.end.max(self.0[last].end);
            last += 1;
        }
        match last - first {
            0 => self.0.insert(first, merged),
            1 => self.0[first] = merged,
            _ => {
                self.0[first] = merged;
                self.0.drain(first + 1..last);
            }
        }
    }

    /// Remove `range`, splitting a range it falls strictly inside (rule 11).
    #[inline]
    pub fn remove(&mut self, range: ByteRange) {
        if range.is_empty() {
            return;
        }
        if let [only] = self.0.as_slice()
            && range.start <= only.start
            && only.end <= range.end
        {
            self.0.clear();
            return;
        }
        let mut i = self.0.partition_point(|r| r.end <= range.start);
        while i < self.0.len() && self.0[i].start < range.end {
            let r = self.0[i];
            let left = ByteRange::new(r.start, range.start.min(r.end));
            let right = ByteRange::new(range.end.max(r.start), r.end);
            match (left.is_empty(), right.is_empty()) {
                (true, true) => {
                    self.0.remove(i);
                }
                (false, true) => {
                    self.0[i] = left;
                    i += 1;
                }
                (true, false) => {
                    self.0[i] = right;
                    i += 1;
                }
                (false, false) => {
                    self.0[i] = left;
                    self.0.insert(i + 1, right);
                    i += 2;
                }
            }
        }
    }

    /// Whether any range shares a byte with `range` (rule 12).
    pub fn intersects(&self, range: ByteRange) -> bool {
        if range.is_empty() {
            return false;
        }
        let i = self.0.partition_point(|r| r.end <= range.start);
        i < self.0.len() && self.0[i].start < range.end
    }
}

/// One failure's claim on an allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The failure.
    pub failure: FailureId,
    /// The bytes it claims.
    pub ranges: Ranges,
}

/// The claims on one allocation, changed only through [`Failures`] (rule 3).
#[derive(Clone, Debug, Default)]
pub struct Taint {
    claims: SmallVec<[Claim; 1]>,
}

impl Taint {
    /// No claims.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether no failure claims any byte.
    #[inline]
    pub fn is_clean(&self) -> bool {
        self.claims.is_empty()
    }

    /// The claims, in the order they were made.
    pub fn claims(&self) -> &[Claim] {
        &self.claims
    }

    /// Point `range` at `failure` alone: its one writer has one failure (rule 9).
    #[inline]
    pub fn set(&mut self, range: ByteRange, failure: FailureId, failures: &mut Failures) {
        if range.is_empty() {
            return;
        }
        if self.claims.is_empty() {
            // The success path: a clean allocation gains its first claim.
            let mut ranges = Ranges::default();
            ranges.0.push(range);
            self.claims.push(Claim { failure, ranges });
            failures.acquire(failure);
            return;
        }
        self.clear_except(range, Some(failure), failures);
        match self.claims.iter_mut().find(|c| c.failure == failure) {
            Some(claim) => claim.ranges.insert(range),
            None => {
                let mut ranges = Ranges::default();
                ranges.insert(range);
                self.claims.push(Claim { failure, ranges });
                failures.acquire(failure);
            }
        }
    }

    /// Remove `range` from every claim: the bytes were written (rule 11).
    #[inline]
    pub fn clear(&mut self, range: ByteRange, failures: &mut Failures) {
        if range.is_empty() || self.claims.is_empty() {
            return;
        }
        if let [only] = self.claims.as_slice()
            && let [claimed] = only.ranges.0.as_slice()
            && range.start <= claimed.start
            && claimed.end <= range.end
        {
            // The success path: the one claim, wholly rewritten.
            let failure = only.failure;
            // `pop`, not `clear`, which stays out of line on the launch path.
            drop(self.claims.pop());
            failures.release(failure);
            return;
        }
        self.clear_except(range, None, failures);
    }

    fn clear_except(&mut self, range: ByteRange, keep: Option<FailureId>, failures: &mut Failures) {
        let mut i = 0;
        while i < self.claims.len() {
            let claim = &mut self.claims[i];
            if Some(claim.failure) != keep {
                claim.ranges.remove(range);
                if claim.ranges.is_empty() {
                    let gone = self.claims.remove(i).failure;
                    failures.release(gone);
                    continue;
                }
            }
            i += 1;
        }
    }

    /// The first failure sharing a byte with `range` (rule 12).
    pub fn query(&self, range: ByteRange) -> Option<FailureId> {
        self.claims
            .iter()
            .find(|c| c.ranges.intersects(range))
            .map(|c| c.failure)
    }

    /// Every failure whose ranges share a byte with `range`, in claim order.
    pub fn query_all(&self, range: ByteRange) -> impl Iterator<Item = FailureId> + '_ {
        self.claims
            .iter()
            .filter(move |c| c.ranges.intersects(range))
            .map(|c| c.failure)
    }

    /// Release every claim: the allocation is freed or recycled (rule 13).
    pub fn release_all(&mut self, failures: &mut Failures) {
        for claim in self.claims.drain(..) {
            failures.release(claim.failure);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::{Work, WorkKind};
    use crate::id::StreamId;

    fn r(a: u64, b: u64) -> ByteRange {
        ByteRange::new(a, b)
    }

    fn ranges(t: &Taint, f: FailureId) -> Vec<ByteRange> {
        t.claims()
            .iter()
            .find(|c| c.failure == f)
            .map(|c| c.ranges.iter().collect())
            .unwrap_or_default()
    }

    fn mint(failures: &mut Failures) -> FailureId {
        failures.mint_failed(
            Work::new(WorkKind::Write, StreamId(0)),
            crate::Error::refused("test"),
        )
    }

    #[test]
    fn overlapping_and_touching_ranges_fuse() {
        // Rule 10.
        let mut set = Ranges::default();
        set.insert(r(10, 20));
        set.insert(r(30, 40));
        set.insert(r(20, 25));
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![r(10, 25), r(30, 40)]);
        set.insert(r(0, 35));
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![r(0, 40)]);
        set.insert(r(5, 5));
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![r(0, 40)]);
    }

    #[test]
    fn a_write_inside_a_claim_splits_it() {
        // Rule 11.
        let mut set = Ranges::default();
        set.insert(r(0, 100));
        set.remove(r(40, 60));
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![r(0, 40), r(60, 100)]);
        set.remove(r(30, 70));
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![r(0, 30), r(70, 100)]);
        set.remove(r(0, 100));
        assert!(set.is_empty());
    }

    #[test]
    fn queries_need_a_shared_byte() {
        // Rule 12.
        let mut set = Ranges::default();
        set.insert(r(10, 20));
        assert!(set.intersects(r(19, 30)));
        assert!(!set.intersects(r(20, 30)));
        assert!(!set.intersects(r(0, 10)));
        assert!(!set.intersects(r(15, 15)));
    }

    #[test]
    fn tainting_sets_rather_than_adds() {
        // Rule 9, 3.
        let mut failures = Failures::new();
        let a = mint(&mut failures);
        let b = mint(&mut failures);
        let mut t = Taint::new();
        t.set(r(0, 100), a, &mut failures);
        t.set(r(200, 300), a, &mut failures);
        assert_eq!(
            failures.get(a).unwrap().carriers(),
            1,
            "one tag per allocation"
        );
        t.set(r(50, 250), b, &mut failures);
        assert_eq!(ranges(&t, a), vec![r(0, 50), r(250, 300)]);
        assert_eq!(ranges(&t, b), vec![r(50, 250)]);
        t.set(r(0, 300), b, &mut failures);
        assert!(
            failures.get(a).is_none(),
            "a lost its last range, so it is gone"
        );
        assert_eq!(failures.get(b).unwrap().carriers(), 1);
        t.set(r(0, 300), b, &mut failures);
        assert_eq!(ranges(&t, b), vec![r(0, 300)]);
        t.set(r(7, 7), a, &mut failures);
        assert_eq!(t.claims().len(), 1, "an empty range is a no-op");
    }

    #[test]
    fn release_all_empties_the_store() {
        // Rule 13.
        let mut failures = Failures::new();
        let a = mint(&mut failures);
        let b = mint(&mut failures);
        let mut t = Taint::new();
        t.set(r(0, 10), a, &mut failures);
        t.set(r(20, 30), b, &mut failures);
        t.release_all(&mut failures);
        assert!(failures.is_empty());
        assert!(t.is_clean());
    }

    #[test]
    fn one_failure_over_one_range_is_inline() {
        // Rule 14: the inline capacity is what the rule says.
        let mut failures = Failures::new();
        let a = mint(&mut failures);
        let mut t = Taint::new();
        t.set(r(0, 4096), a, &mut failures);
        assert!(!t.claims.spilled());
        assert!(!t.claims[0].ranges.0.spilled());
    }
}
