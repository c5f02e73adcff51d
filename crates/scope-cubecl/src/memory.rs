//! cubecl's memory handles, each backed by one scope buffer.
//!
//! cubecl mints a [`ManagedMemoryHandle`] per base allocation; tensors are byte ranges of it.
//! There is no free call: memory is free when the server holds the last handle
//! ([`ManagedMemoryHandle::is_free`]). So the table sweeps entries whose handle is free,
//! dropping the [`Buffer`]. Graphs and lazy reads hold bindings, so nothing they name is swept.
//! A sweep runs when the table has doubled, when the device is full, and on `memory_cleanup`.
//!
//! The table holds no failure state: whether bytes were written is asked of scope.

use std::ops::Range;

use cubecl_runtime::memory_management::{
    ManagedMemoryHandle, ManagedMemoryId, MemoryAllocationMode, MemoryPoolKind, MemoryPoolReport,
    MemoryPoolsReport, MemoryUsage,
};
use cubecl_runtime::server::{BufferBinding, ServerError};
use scope_core::id::IdMap;
use scope_core::{Buffer, Slice};

/// Bytes scope binds at a time: whole words.
const WORD: u64 = 4;

/// One cubecl base allocation.
#[derive(Debug)]
struct Entry {
    handle: ManagedMemoryHandle,
    buffer: Buffer,
    /// The size cubecl asked for; the buffer rounds up to whole words.
    size: u64,
    /// The stream slot and mode it was made under, where `memory_report` counts it.
    owner: u64,
    mode: MemoryAllocationMode,
}

/// cubecl memory ids → scope buffers.
#[derive(Debug, Default)]
pub(crate) struct MemoryTable {
    entries: IdMap<ManagedMemoryId, Entry>,
    /// Entries after the last sweep; doubling triggers the next, amortised O(1).
    swept_at: usize,
}

impl MemoryTable {
    /// Remember that `handle` is `buffer` (`size` bytes as cubecl sees it).
    pub(crate) fn insert(
        &mut self,
        handle: ManagedMemoryHandle,
        buffer: Buffer,
        size: u64,
        owner: u64,
        mode: MemoryAllocationMode,
    ) {
        if self.entries.len() >= (2 * self.swept_at).max(64) {
            self.sweep();
        }
        let id = handle.descriptor().id;
        let entry = Entry {
            handle,
            buffer,
            size,
            owner,
            mode,
        };
        self.entries.insert(id, entry);
    }

    /// The live allocations of slot `owner`, by mode. scope has one allocator, so only the
    /// dynamic pool reports `reserved`.
    pub(crate) fn report(&self, owner: u64, reserved: u64) -> MemoryPoolsReport {
        let mut usage: [MemoryUsage; 3] = std::array::from_fn(|_| MemoryUsage::default());
        for entry in self.entries.values() {
            if entry.owner != owner || entry.handle.is_free() {
                continue;
            }
            let pool = match entry.mode {
                MemoryAllocationMode::Persistent => 1,
                MemoryAllocationMode::Dedicated => 2,
                _ => 0,
            };
            usage[pool].number_allocs += 1;
            usage[pool].bytes_in_use += entry.size;
            usage[pool].bytes_padding += entry.buffer.size() - entry.size;
        }
        usage[0].bytes_reserved = reserved;
        let pool = |kind, usage: MemoryUsage| MemoryPoolReport {
            kind,
            usage,
            pages: 0,
            pages_peak: 0,
            pages_unmapped: 0,
            largest_alloc: 0,
        };
        let [dynamic, persistent, dedicated] = usage;
        MemoryPoolsReport {
            dynamic: vec![pool(MemoryPoolKind::Direct, dynamic)],
            persistent: pool(MemoryPoolKind::Persistent, persistent),
            dedicated: pool(MemoryPoolKind::Direct, dedicated),
        }
    }

    /// Drop every entry whose handle nobody but the table holds.
    pub(crate) fn sweep(&mut self) {
        self.entries.retain(|_, entry| !entry.handle.is_free());
        self.swept_at = self.entries.len();
    }

    /// How many base allocations are alive.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The scope bytes `binding` names, rounded out to whole words; `None` if empty. Tensors
    /// start 256-byte aligned, so rounding never reaches a neighbour.
    pub(crate) fn resolve(
        &self,
        binding: &BufferBinding,
    ) -> Result<Option<Resolved<'_>>, ServerError> {
        let entry = self
            .entries
            .get(&binding.memory.id())
            .ok_or_else(|| ServerError::Generic {
                reason: format!(
                    "memory {:?} is not known to this server: it was never initialised here, or \
                     it was freed",
                    binding.memory.id()
                ),
                backtrace: cubecl_environment::backtrace::BackTrace::capture(),
            })?;
        let range = binding.range();
        if range.start >= range.end {
            return Ok(None);
        }
        let words = round_out(range.clone(), entry.buffer.size());
        Ok(Some(Resolved {
            buffer: &entry.buffer,
            words,
            range,
        }))
    }
}

impl MemoryTable {
    /// The word an empty range starts in, or the last word: what an empty tensor binds.
    pub(crate) fn first_word(&self, binding: &BufferBinding) -> Option<Slice<'_>> {
        let entry = self.entries.get(&binding.memory.id())?;
        let size = entry.buffer.size();
        let start = (binding.range().start / WORD * WORD).min(size - WORD);
        Some(entry.buffer.slice(start..start + WORD))
    }
}

/// A cubecl range, as scope bytes.
pub(crate) struct Resolved<'a> {
    pub(crate) buffer: &'a Buffer,
    /// The word-rounded range scope is asked about.
    pub(crate) words: Range<u64>,
    /// The range cubecl asked for.
    pub(crate) range: Range<u64>,
}

impl<'a> Resolved<'a> {
    /// The scope slice.
    pub(crate) fn slice(&self) -> Slice<'a> {
        self.buffer.slice(self.words.clone())
    }

    /// Where cubecl's bytes start within the words read back.
    pub(crate) fn skip(&self) -> usize {
        (self.range.start - self.words.start) as usize
    }

    /// How many bytes cubecl asked for.
    pub(crate) fn len(&self) -> usize {
        (self.range.end - self.range.start) as usize
    }
}

/// Whether `strides` lay `shape` out row-major with no gaps: the only layout scope copies.
pub(crate) fn contiguous(shape: &[usize], strides: &[usize]) -> bool {
    let mut expected = 1usize;
    for (&dim, &stride) in shape.iter().zip(strides).rev() {
        if dim > 1 && stride != expected {
            return false;
        }
        expected *= dim;
    }
    shape.len() == strides.len()
}

/// `range` widened to whole words, never past `size`.
fn round_out(range: Range<u64>, size: u64) -> Range<u64> {
    let start = range.start / WORD * WORD;
    let end = range.end.div_ceil(WORD) * WORD;
    start..end.min(size)
}

/// The size to allocate: whole words, at least one, since scope refuses empty buffers.
pub(crate) fn scope_size(size: u64) -> u64 {
    size.max(1).div_ceil(WORD) * WORD
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_round_out_to_words_inside_the_buffer() {
        assert_eq!(round_out(0..3, 256), 0..4);
        assert_eq!(round_out(5..9, 256), 4..12);
        assert_eq!(round_out(250..255, 254), 248..254);
        assert_eq!(scope_size(0), 4);
        assert_eq!(scope_size(5), 8);
    }

    #[test]
    fn only_row_major_without_gaps_is_contiguous() {
        assert!(contiguous(&[2, 3], &[3, 1]));
        assert!(
            contiguous(&[2, 1, 3], &[3, 7, 1]),
            "a unit axis's stride is free"
        );
        assert!(!contiguous(&[2, 3], &[1, 2]), "column-major");
        assert!(!contiguous(&[2, 3], &[4, 1]), "a gap between rows");
        assert!(!contiguous(&[2, 3], &[3]), "a stride missing");
    }
}
