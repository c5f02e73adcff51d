//! Pooled device memory and pinned staging.
//!
//! `hipFree` waits for the whole device, so freed blocks are reused within their size class
//! (powers of two to 1 MiB, then 2 MiB steps). Work in flight may still use a freed block, so
//! it first *cools* until one fence per stream, recorded at the free, passes. [`Pool::trim`]
//! gives the cache back before the core retries an allocation (rule 37). Host writes go
//! through pinned staging, so the DMA is asynchronous and the caller's slice free at once;
//! writes past [`STAGING_CHUNK`] go in chunks.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use scope_core::Result;

use crate::api::{DeviceAlloc, Event, Pinned};
use crate::device::Hip;
use crate::error::{Doing, HipError};

/// The largest staging buffer: longer transfers go in chunks of this size.
pub const STAGING_CHUNK: usize = 16 << 20;
/// The smallest staging buffer made, so small writes share slots.
const STAGING_MIN: usize = 64 << 10;
/// Staging slots kept before a write waits for the oldest to drain.
const STAGING_SLOTS: usize = 8;

/// Device memory handed to the core: a pooled block and the size asked for.
#[derive(Debug)]
pub struct HipMemory {
    pub(crate) block: DeviceAlloc,
    pub(crate) size: u64,
}

impl HipMemory {
    /// The bytes asked for; the block behind it may be larger.
    pub fn size(&self) -> u64 {
        self.size
    }
}

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

    fn take(&mut self, class: u64) -> Option<DeviceAlloc> {
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

struct Slot {
    buffer: Pinned,
    fence: Event,
}

/// Pinned buffers for host-to-device writes.
#[derive(Default)]
pub struct Staging {
    slots: Vec<Slot>,
    /// The slot handed out last, so that a full set is reused round-robin.
    next: usize,
}

impl Drop for Staging {
    fn drop(&mut self) {
        // A slot may feed a copy still in flight; wait before freeing.
        for slot in &self.slots {
            let _ = slot.fence.synchronize();
        }
    }
}

impl Hip {
    pub(crate) fn allocate(&mut self, size: u64) -> Result<HipMemory> {
        let class = size_class(size);
        if let Some(block) = self.pool.take(class) {
            return Ok(HipMemory { block, size });
        }
        self.make_current()?;
        let bytes = usize::try_from(class)
            .map_err(|_| scope_core::Error::invalid("allocation size", "past the address space"))?;
        let block = self
            .api
            .device_alloc(bytes)
            .map_err(|e| e.into_error(Doing::Allocating(size)))?;
        self.pool.reserved += class;
        Ok(HipMemory { block, size })
    }

    pub(crate) fn free(&mut self, memory: HipMemory) {
        match self.fence_all_streams() {
            Ok(fences) => self.pool.cooling.push_back(Cooling {
                block: memory.block,
                fences,
            }),
            Err(e) => {
                // Without fences there is no telling when the block is idle.
                tracing::warn!("could not fence a freed block, leaking it: {e}");
                self.pool.reserved -= memory.block.bytes() as u64;
                std::mem::forget(memory.block);
            }
        }
    }

    /// A staging slot of at least `len` bytes whose last copy has finished.
    pub(crate) fn staging_slot(&mut self, len: usize) -> std::result::Result<usize, HipError> {
        let staging = &mut self.staging;
        for (i, slot) in staging.slots.iter().enumerate() {
            if slot.buffer.len() >= len && slot.fence.is_done()? {
                return Ok(i);
            }
        }
        if staging.slots.len() < STAGING_SLOTS {
            let buffer = self.api.pinned(len.max(STAGING_MIN))?;
            let fence = self.api.event()?;
            staging.slots.push(Slot { buffer, fence });
            return Ok(staging.slots.len() - 1);
        }
        let i = staging.next % staging.slots.len();
        staging.next = i + 1;
        staging.slots[i].fence.synchronize()?;
        if staging.slots[i].buffer.len() < len {
            staging.slots[i].buffer = self.api.pinned(len)?;
        }
        Ok(i)
    }

    /// The slot's buffer to fill, and its fence to record after the copy.
    pub(crate) fn staging_parts(&mut self, slot: usize) -> (&mut Pinned, &Event) {
        let slot = &mut self.staging.slots[slot];
        (&mut slot.buffer, &slot.fence)
    }

    /// A pinned read buffer of at least `len` bytes.
    pub(crate) fn read_buffer(&mut self, len: usize) -> std::result::Result<&mut Pinned, HipError> {
        let big_enough = self.read_buffer.as_ref().is_some_and(|b| b.len() >= len);
        if !big_enough {
            self.read_buffer = None;
            self.read_buffer = Some(self.api.pinned(len.max(STAGING_MIN))?);
        }
        self.read_buffer
            .as_mut()
            .ok_or_else(|| HipError::new("hipHostMalloc", crate::ffi::code::OUT_OF_MEMORY))
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
