//! The buffer table, every server's [`FailureStore`]: slots with generations,
//! so a stale id misses and a lookup is an index. [`Ledger`] and [`Memories`]
//! share the slots: a launch borrows memory while its scope claims.

use crate::error::Error;
use crate::failure::Failures;
use crate::id::{BufferId, BufferRange, FailureId, StreamId};
use crate::store::{FailureStore, TaintSlot};
use crate::taint::{Ranges, Taint};

/// A live buffer, as the failure model sees it.
pub(crate) struct Entry {
    pub(crate) size: u64,
    pub(crate) allocated: bool,
    /// Why the allocation failed, while that is recorded (rule 28).
    pub(crate) record: Option<FailureId>,
    pub(crate) taint: Taint,
    /// The stream that last used it, for cross-stream ordering.
    pub(crate) last_user: StreamId,
}

struct Slot<T> {
    generation: u32,
    entry: Option<T>,
}

/// The failure model's half: each buffer's claims, and the failures.
pub struct Ledger {
    failures: Failures,
    slots: Vec<Slot<Entry>>,
    vacant: Vec<u32>,
    bytes_allocated: u64,
}

/// The memory half, in the [`Ledger`]'s slots and generations.
pub struct Memories<M> {
    slots: Vec<Slot<M>>,
}

impl<M> Memories<M> {
    #[inline]
    pub(crate) fn of(&self, id: BufferId) -> Option<&M> {
        let slot = self.slots.get(id.slot() as usize)?;
        if slot.generation != id.generation() {
            return None;
        }
        slot.entry.as_ref()
    }

    /// The memory of a buffer the [`Ledger`] just found live, by slot alone.
    #[inline]
    pub(crate) fn of_live(&self, id: BufferId) -> Option<&M> {
        self.slots.get(id.slot() as usize)?.entry.as_ref()
    }

    pub(crate) fn get(&self, id: BufferId) -> Result<&M, Error> {
        // `ok_or_else`: an eager `Error` dropped on success costs the launch.
        self.of(id)
            .ok_or_else(|| Error::NeverAllocated { buffer: id })
    }
}

/// The buffers of one server and the device's failures.
pub struct BufferTable<M> {
    pub(crate) ledger: Ledger,
    pub(crate) memory: Memories<M>,
}

impl<M> BufferTable<M> {
    pub(crate) fn new() -> Self {
        Self {
            ledger: Ledger {
                failures: Failures::new(),
                slots: Vec::new(),
                vacant: Vec::new(),
                bytes_allocated: 0,
            },
            memory: Memories { slots: Vec::new() },
        }
    }

    pub(crate) fn insert(
        &mut self,
        size: u64,
        memory: Option<M>,
        record: Option<FailureId>,
        stream: StreamId,
    ) -> BufferId {
        let ledger = &mut self.ledger;
        if memory.is_some() {
            ledger.bytes_allocated += size;
        }
        if let Some(f) = record {
            ledger.failures.acquire(f);
        }
        let entry = Entry {
            size,
            allocated: memory.is_some(),
            record,
            taint: Taint::new(),
            last_user: stream,
        };
        match ledger.vacant.pop() {
            Some(slot) => {
                let s = &mut ledger.slots[slot as usize];
                s.entry = Some(entry);
                let m = &mut self.memory.slots[slot as usize];
                m.generation = s.generation;
                m.entry = memory;
                BufferId::from_parts(slot, s.generation)
            }
            None => {
                let slot = u32::try_from(ledger.slots.len()).unwrap_or(u32::MAX);
                ledger.slots.push(Slot {
                    generation: 0,
                    entry: Some(entry),
                });
                self.memory.slots.push(Slot {
                    generation: 0,
                    entry: memory,
                });
                BufferId::from_parts(slot, 0)
            }
        }
    }

    pub(crate) fn memory(&self, id: BufferId) -> Result<&M, Error> {
        self.memory.get(id)
    }

    pub(crate) fn memory_of(&self, id: BufferId) -> Option<&M> {
        self.memory.of(id)
    }

    /// A lost device's buffer memory, out until [`give_memory`](Self::give_memory).
    pub(crate) fn take_memory(&mut self, id: BufferId) -> Option<M> {
        let Ledger {
            failures,
            slots,
            bytes_allocated,
            ..
        } = &mut self.ledger;
        let slot = slots.get_mut(id.slot() as usize)?;
        if slot.generation != id.generation() {
            return None;
        }
        let entry = slot.entry.as_mut()?;
        if !entry.allocated {
            return None;
        }
        entry.allocated = false;
        entry.taint.release_all(failures);
        *bytes_allocated -= entry.size;
        self.memory.slots.get_mut(id.slot() as usize)?.entry.take()
    }

    pub(crate) fn give_memory(&mut self, id: BufferId, memory: M) {
        let Some(entry) = self.ledger.get_mut(id) else {
            return;
        };
        entry.allocated = true;
        let (size, record) = (entry.size, entry.record.take());
        if let Some(record) = record {
            self.ledger.failures.release(record);
        }
        self.ledger.bytes_allocated += size;
        if let Some(slot) = self.memory.slots.get_mut(id.slot() as usize) {
            slot.entry = Some(memory);
        }
    }

    /// Record why a live buffer has no memory, replacing any record (rule 28).
    pub(crate) fn record_unallocated(&mut self, id: BufferId, record: FailureId) {
        let Some(entry) = self.ledger.get_mut(id) else {
            return;
        };
        if entry.allocated {
            return;
        }
        let old = entry.record.replace(record);
        self.ledger.failures.acquire(record);
        if let Some(old) = old {
            self.ledger.failures.release(old);
        }
    }

    /// Remove a buffer, releasing its claims (rule 13); a stale id does nothing.
    pub(crate) fn remove(&mut self, id: BufferId) -> Option<M> {
        let ledger = &mut self.ledger;
        let slot = ledger.slots.get_mut(id.slot() as usize)?;
        if slot.generation != id.generation() {
            return None;
        }
        let mut entry = slot.entry.take()?;
        // Retire a slot whose generation would wrap: one per 2^32 reuses.
        if let Some(next) = slot.generation.checked_add(1) {
            slot.generation = next;
            ledger.vacant.push(id.slot());
        }
        entry.taint.release_all(&mut ledger.failures);
        if let Some(f) = entry.record.take() {
            ledger.failures.release(f);
        }
        if entry.allocated {
            ledger.bytes_allocated -= entry.size;
        }
        let memory = self.memory.slots.get_mut(id.slot() as usize)?;
        // The next generation misses here too, retired or not.
        memory.generation = memory.generation.wrapping_add(1);
        memory.entry.take()
    }
}

impl Ledger {
    #[inline]
    pub(crate) fn get(&self, id: BufferId) -> Option<&Entry> {
        let slot = self.slots.get(id.slot() as usize)?;
        if slot.generation != id.generation() {
            return None;
        }
        slot.entry.as_ref()
    }

    pub(crate) fn get_mut(&mut self, id: BufferId) -> Option<&mut Entry> {
        let slot = self.slots.get_mut(id.slot() as usize)?;
        if slot.generation != id.generation() {
            return None;
        }
        slot.entry.as_mut()
    }

    pub(crate) fn is_live(&self, id: BufferId) -> bool {
        self.get(id).is_some()
    }

    pub(crate) fn unclaimed(&self, r: BufferRange, out: &mut Vec<BufferRange>) {
        let Some(entry) = self.get(r.buffer) else {
            return;
        };
        if !entry.allocated {
            return;
        }
        if entry.taint.is_clean() {
            out.push(r);
            return;
        }
        let mut clean = Ranges::default();
        clean.insert(r.range);
        for claim in entry.taint.claims() {
            for claimed in claim.ranges.iter() {
                clean.remove(claimed);
            }
        }
        out.extend(clean.iter().map(|range| BufferRange {
            buffer: r.buffer,
            range,
        }));
    }

    pub(crate) fn ids(&self) -> Vec<BufferId> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.entry.is_some())
            .map(|(i, s)| BufferId::from_parts(i as u32, s.generation))
            .collect()
    }

    pub(crate) fn bytes_allocated(&self) -> u64 {
        self.bytes_allocated
    }

    /// How many (buffer, failure) claims are live: the bound of rule 7.
    pub(crate) fn claims(&self) -> usize {
        self.slots
            .iter()
            .filter_map(|s| s.entry.as_ref())
            .map(|e| e.taint.claims().len() + usize::from(e.record.is_some()))
            .sum()
    }

    /// Whether carrier counts match claims exactly (rule 3), none is held
    /// without a carrier (rules 4, 5), and every claimed failure is held.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn audit(&self) -> Result<(), String> {
        use std::collections::HashMap;
        let mut counted: HashMap<FailureId, u32> = HashMap::new();
        for entry in self.slots.iter().filter_map(|s| s.entry.as_ref()) {
            for claim in entry.taint.claims() {
                *counted.entry(claim.failure).or_default() += 1;
            }
            if let Some(f) = entry.record {
                *counted.entry(f).or_default() += 1;
            }
        }
        for (id, node) in self.failures.held() {
            let claimed = counted.remove(&id).unwrap_or(0);
            if node.carriers() != claimed || claimed == 0 {
                return Err(format!(
                    "{id:?} counts {} carriers but {claimed} buffers claim it",
                    node.carriers()
                ));
            }
        }
        match counted.into_keys().next() {
            Some(orphan) => Err(format!(
                "a buffer claims {orphan:?}, which the store does not hold"
            )),
            None => Ok(()),
        }
    }

    pub(crate) fn unallocated_error(&self, id: BufferId) -> Error {
        match self
            .get(id)
            .and_then(|e| e.record)
            .and_then(|f| self.failures.error(f))
        {
            Some(error) => (*error).clone(),
            None => Error::NeverAllocated { buffer: id },
        }
    }
}

impl FailureStore for Ledger {
    #[inline(always)]
    fn failures(&mut self) -> &mut Failures {
        &mut self.failures
    }

    #[inline(always)]
    fn locate(&mut self, buffer: BufferId) -> (&mut Failures, TaintSlot<'_>) {
        let slot = match self.slots.get_mut(buffer.slot() as usize) {
            Some(s) if s.generation == buffer.generation() => s.entry.as_mut(),
            _ => None,
        };
        let taint = match slot {
            Some(entry) if entry.allocated => TaintSlot::Allocated(&mut entry.taint),
            Some(entry) => TaintSlot::Unallocated(entry.record),
            None => TaintSlot::Gone,
        };
        (&mut self.failures, taint)
    }
}

impl<M> FailureStore for BufferTable<M> {
    fn failures(&mut self) -> &mut Failures {
        self.ledger.failures()
    }

    fn locate(&mut self, buffer: BufferId) -> (&mut Failures, TaintSlot<'_>) {
        self.ledger.locate(buffer)
    }
}

impl Ledger {
    pub(crate) fn failures_len(&self) -> usize {
        self.failures.len()
    }
}

#[cfg(feature = "fault-injection")]
impl Ledger {
    pub(crate) fn dump(&self) -> String {
        let mut out = String::new();
        for (id, node) in self.failures.held() {
            out.push_str(&format!(
                "{id:?}: carriers {} error {}\n",
                node.carriers(),
                node.error()
            ));
        }
        for (i, s) in self.slots.iter().enumerate() {
            if let Some(e) = &s.entry {
                out.push_str(&format!(
                    "slot {i}.{}: record {:?} claims {:?}\n",
                    s.generation,
                    e.record,
                    e.taint.claims()
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::{Work, WorkKind};
    use crate::id::ByteRange;

    #[test]
    fn a_slot_whose_generation_would_wrap_is_retired() {
        let mut table: BufferTable<()> = BufferTable::new();
        let first = table.insert(16, Some(()), None, StreamId(0));
        table.ledger.slots[first.slot() as usize].generation = u32::MAX;
        table.memory.slots[first.slot() as usize].generation = u32::MAX;
        let last = BufferId::from_parts(first.slot(), u32::MAX);
        assert!(table.remove(last).is_some());
        let next = table.insert(16, Some(()), None, StreamId(0));
        assert_ne!(next.slot(), first.slot(), "the wrapped slot is not reused");
        assert!(table.ledger.get(last).is_none());
        assert!(table.memory_of(last).is_none(), "nor its memory");
        assert!(
            table
                .ledger
                .get(BufferId::from_parts(first.slot(), 0))
                .is_none()
        );
        // An ordinary slot is reused under its next generation.
        assert!(table.remove(next).is_some());
        let again = table.insert(16, Some(()), None, StreamId(0));
        assert_eq!(again.slot(), next.slot());
        assert!(
            table.ledger.get(next).is_none(),
            "the stale id names nothing"
        );
    }

    #[test]
    fn unclaimed_leaves_out_what_a_failure_claims() {
        let mut table: BufferTable<()> = BufferTable::new();
        let id = table.insert(64, Some(()), None, StreamId(0));
        let at = |start, end| BufferRange {
            buffer: id,
            range: ByteRange::new(start, end),
        };
        let mut out = Vec::new();
        table.ledger.unclaimed(at(0, 64), &mut out);
        assert_eq!(out, vec![at(0, 64)]);
        table.claim_failed(
            &[at(16, 32)],
            Work::new(WorkKind::Launch, StreamId(0)),
            Error::refused("x"),
        );
        out.clear();
        table.ledger.unclaimed(at(0, 64), &mut out);
        assert_eq!(out, vec![at(0, 16), at(32, 64)]);
        out.clear();
        table.ledger.unclaimed(at(16, 32), &mut out);
        assert!(out.is_empty());
    }
}
