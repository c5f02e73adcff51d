//! Device memory: one wgpu buffer per allocation, pooled by size class.
//!
//! Why size classes rather than sub-allocating big slabs:
//!
//! - A binding's offset must be a multiple of
//!   `min_storage_buffer_offset_alignment` (32 bytes on lavapipe and on
//!   llvmpipe-GL, 256 on most hardware) and a binding may not exceed
//!   `max_storage_buffer_binding_size` (128 MiB on both software adapters).
//!   With one buffer per allocation every allocation starts at offset 0, so
//!   the core's binding-alignment rule is the only alignment a runtime sees,
//!   and any allocation up to the binding limit can be bound whole.
//! - Bind groups are cached by (buffer, offset, size). A pooled buffer keeps
//!   its identity across free and re-allocation, so a runtime that frees and
//!   re-allocates the same shapes every step hits the bind-group cache too;
//!   slab offsets would scatter the keys.
//! - What pooling has to buy is the cost of `create_buffer` (measured here:
//!   7–10 µs per buffer on lavapipe and llvmpipe-GL, plus wgpu's lazy
//!   zero-fill on first use) against a free-list pop. Size classes buy
//!   all of it; sub-allocation would buy nothing more for that cost and add
//!   fragmentation. Classes are four per octave, so no more than 25% of a
//!   buffer is slack.
//!
//! Reuse is safe without waiting for the device because wgpu has one queue:
//! whatever the new owner submits runs after everything submitted before.
//! The one hazard is work *not yet submitted* — encoded into some stream's
//! open batch — that still names the buffer; each buffer carries the batch
//! that last used it ([`Tag`]), and the allocator submits that batch before
//! handing the buffer out.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The smallest buffer the pool makes.
const MIN_CLASS: u64 = 256;

/// The most bytes the pool keeps cached for reuse; past this a freed buffer
/// is destroyed instead.
const MAX_CACHED: u64 = 1 << 30;

/// The usages every allocation gets: bound as storage, copied both ways, and
/// read as indirect dispatch counts.
pub(crate) const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST)
    .union(wgpu::BufferUsages::INDIRECT);

/// The open batch that last used a buffer: `stream << 48 | batch`, or 0.
pub(crate) type Tag = Arc<AtomicU64>;

/// Pack a stream index and a batch number into a tag value.
#[inline]
pub(crate) fn tag_value(stream: usize, batch: u64) -> u64 {
    ((stream as u64) << 48) | (batch & ((1 << 48) - 1))
}

/// Record that the batch `value` uses the buffer tagged `tag`.
#[inline]
pub(crate) fn mark(tag: &Tag, value: u64) {
    tag.store(value, Ordering::Relaxed);
}

/// A device allocation: a whole wgpu buffer, possibly larger than asked.
pub struct Memory {
    pub(crate) buffer: wgpu::Buffer,
    /// Unique for the backend's life; the bind-group cache's key.
    pub(crate) id: u64,
    /// The buffer's size (the size class), not the request.
    pub(crate) capacity: u64,
    pub(crate) tag: Tag,
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "wgpu buffer #{} ({} bytes)", self.id, self.capacity)
    }
}

/// The size class `size` is served from: four classes per octave, whole
/// 256-byte blocks, never past `max`.
pub(crate) fn class(size: u64, max: u64) -> u64 {
    let class = if size <= MIN_CLASS {
        MIN_CLASS
    } else {
        let octave = 63 - (size - 1).leading_zeros();
        let step = (1u64 << octave.saturating_sub(2)).max(MIN_CLASS);
        size.div_ceil(step) * step
    };
    class.min(max).max(size)
}

/// Freed buffers by size class, and the byte counts introspection reports.
#[derive(Default)]
pub(crate) struct Pool {
    free: HashMap<u64, Vec<Memory>>,
    /// Bytes of every buffer the pool made and has not destroyed.
    reserved: u64,
    /// Bytes of those waiting in `free`.
    cached: u64,
}

impl Pool {
    /// A cached buffer of class `class`.
    pub(crate) fn take(&mut self, class: u64) -> Option<Memory> {
        let memory = self.free.get_mut(&class)?.pop()?;
        self.cached -= memory.capacity;
        Some(memory)
    }

    /// Count a buffer the allocator just made.
    pub(crate) fn made(&mut self, capacity: u64) {
        self.reserved += capacity;
    }

    /// Take `memory` back; returns it when the cache is full, for the caller
    /// to destroy.
    pub(crate) fn put(&mut self, memory: Memory) -> Option<Memory> {
        if self.cached + memory.capacity > MAX_CACHED {
            self.reserved -= memory.capacity;
            return Some(memory);
        }
        self.cached += memory.capacity;
        self.free.entry(memory.capacity).or_default().push(memory);
        None
    }

    /// Empty the cache; returns what it held, for the caller to destroy.
    pub(crate) fn drain(&mut self) -> Vec<Memory> {
        let all: Vec<Memory> = self.free.drain().flat_map(|(_, v)| v).collect();
        for memory in &all {
            self.reserved -= memory.capacity;
        }
        self.cached = 0;
        all
    }

    /// Bytes of device memory held for allocations, in use or cached.
    pub(crate) fn reserved(&self) -> u64 {
        self.reserved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_the_request_and_waste_at_most_a_quarter() {
        let max = 1 << 31;
        for size in [
            1,
            4,
            255,
            256,
            257,
            1000,
            4096,
            4097,
            65_537,
            1 << 20,
            (1 << 27) + 3,
        ] {
            let c = class(size, max);
            assert!(c >= size, "{size} -> {c}");
            assert!(c.is_multiple_of(4));
            if size > MIN_CLASS {
                assert!(c - size <= size / 4 + MIN_CLASS, "{size} -> {c}");
            }
        }
        assert_eq!(class(1000, 600), 1000, "never below the request");
        assert_eq!(
            class(1 << 20, 1 << 31),
            1 << 20,
            "powers of two are classes"
        );
    }

    #[test]
    fn tags_keep_stream_and_batch_apart() {
        assert_ne!(tag_value(1, 5), tag_value(0, 5));
        assert_eq!(tag_value(2, 7) >> 48, 2);
    }
}
