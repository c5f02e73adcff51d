//! The device memory pool: freed blocks cached by size class, cooling behind fences.
//!
//! `hipFree` waits for the whole device, so freed blocks are reused within their size class
//! (powers of two to 1 MiB, then 2 MiB steps). Work in flight may still use a freed block, so
//! it first *cools* until one fence per stream, recorded at the free, passes. [`Pool::trim`]
//! gives the cache back before the core retries an allocation (rule 37). The device holds the
//! pool (`device.rs`); the free that fences (`memory.rs`) stands above.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::api::{DeviceAlloc, Event};

/// The size class `size` is served from.
pub fn size_class(size: u64) -> u64 {
    const SMALL: u64 = 1 << 20;
    const STEP: u64 = 2 << 20;
    if size <= SMALL {
        size.max(256).next_power_of_two()
    } else {
        size.div_ceil(STEP).saturating_mul(STEP)
    }
}

struct Cooling {
    block: DeviceAlloc,
    fences: Vec<Arc<Event>>,
}

/// The device memory pool.
#[derive(Default)]
pub struct Pool {
    free: HashMap<u64, Vec<DeviceAlloc>>,
    cooling: VecDeque<Cooling>,
    /// Bytes of every block this pool holds: in use, cooling or free.
    reserved: u64,
}

impl Pool {
    /// Bytes held from the device.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Count `bytes` of a block just allocated from the device for this pool.
    pub(crate) fn holds(&mut self, bytes: u64) {
        self.reserved += bytes;
    }

    /// A freed block, reused once every fence in `fences` has passed.
    pub(crate) fn cool(&mut self, block: DeviceAlloc, fences: Vec<Arc<Event>>) {
        self.cooling.push_back(Cooling { block, fences });
    }

    /// A block no fence vouches for: leaked, since work may still use it, and no longer counted.
    pub(crate) fn leak(&mut self, block: DeviceAlloc) {
        self.reserved -= block.bytes() as u64;
        std::mem::forget(block);
    }

    /// Move blocks whose fences all passed to the free lists. A failed fence keeps its block
    /// cooling: the stream reports the error at its next sync.
    fn warm_up(&mut self) {
        let mut still = VecDeque::with_capacity(self.cooling.len());
        while let Some(entry) = self.cooling.pop_front() {
            if entry.fences.iter().all(|f| matches!(f.is_done(), Ok(true))) {
                self.free
                    .entry(entry.block.bytes() as u64)
                    .or_default()
                    .push(entry.block);
            } else {
                still.push_back(entry);
            }
        }
        self.cooling = still;
    }

    /// A cached block of size class `class`, if one is free.
    pub(crate) fn take(&mut self, class: u64) -> Option<DeviceAlloc> {
        if let Some(block) = self.free.get_mut(&class).and_then(Vec::pop) {
            return Some(block);
        }
        self.warm_up();
        self.free.get_mut(&class).and_then(Vec::pop)
    }

    /// Wait for every cooling block and give every cached block back.
    pub fn trim(&mut self) {
        for entry in std::mem::take(&mut self.cooling) {
            let bytes = entry.block.bytes() as u64;
            self.reserved -= bytes;
            if let Some(error) = entry.fences.iter().find_map(|f| f.synchronize().err()) {
                // Faulted work may still use the block: leaking it is safe, freeing might not be.
                tracing::warn!("a freed block's fence failed, leaking it: {error}");
                std::mem::forget(entry.block);
            }
        }
        for (_, blocks) in self.free.drain() {
            for block in blocks {
                self.reserved -= block.bytes() as u64;
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_round_up_and_never_shrink() {
        assert_eq!(size_class(1), 256);
        assert_eq!(size_class(256), 256);
        assert_eq!(size_class(257), 512);
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), 2 << 20);
        assert_eq!(size_class(5 << 20), 6 << 20);
        for size in [1u64, 255, 4096, 100_000, 3 << 20, 1 << 33] {
            assert!(size_class(size) >= size);
            assert_eq!(
                size_class(size_class(size)),
                size_class(size),
                "classes are fixed points"
            );
        }
    }
}
