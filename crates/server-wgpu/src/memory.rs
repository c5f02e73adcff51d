//! Device memory: one wgpu buffer per allocation, pooled by size class.
//!
//! Why size classes rather than sub-allocated slabs:
//!
//! - Every allocation starts at offset 0. The core's binding-alignment rule
//!   is then the only alignment a runtime sees, whatever
//!   `min_storage_buffer_offset_alignment` is. Any allocation up to
//!   `max_storage_buffer_binding_size` binds whole.
//! - Bind groups are cached by (buffer, offset, size). A pooled buffer keeps
//!   its identity across free and re-allocation, so a steady runtime hits the
//!   cache. Slab offsets would scatter the keys.
//! - Pooling buys back `create_buffer` (7–10 µs on software adapters, plus a
//!   lazy zero-fill). Size classes buy all of it; slabs would only add
//!   fragmentation. Four classes per octave cap the slack at 25%.
//!
//! Reuse needs no device wait, because wgpu has one queue: the new owner's
//! work runs after everything submitted before. The one hazard is work still
//! encoded in an open batch that names the buffer. So each buffer carries
//! the batch that last used it ([`Tag`]), and the allocator submits that
//! batch before handing the buffer out.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The smallest buffer the pool makes.
const MIN_CLASS: u64 = 256;

/// The most bytes the pool caches; past this a freed buffer is destroyed.
const MAX_CACHED: u64 = 1 << 30;

/// Every allocation's usages: storage, copies both ways, indirect counts.
pub(crate) const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST)
    .union(wgpu::BufferUsages::INDIRECT);

/// The open batch that last used a buffer: `stream << 48 | batch`, or 0.
pub(crate) type Tag = Arc<AtomicU64>;

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
    pub(crate) fn take(&mut self, class: u64) -> Option<Memory> {
        let memory = self.free.get_mut(&class)?.pop()?;
        self.cached -= memory.capacity;
        Some(memory)
    }

    pub(crate) fn made(&mut self, capacity: u64) {
        self.reserved += capacity;
    }

    /// Take `memory` back; a full cache returns it, for the caller to destroy.
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
