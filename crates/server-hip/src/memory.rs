//! Device memory for the core: allocations from the pool, frees fenced on every stream.
//!
//! A free cannot know which streams still use its block. So it records a fence on every live
//! stream, and the pool (`pool.rs`) cools the block until they pass. That fencing puts this file
//! above the streams (`device.rs`).

use scope_core::Result;

use crate::api::DeviceAlloc;
use crate::device::Hip;
use crate::error::Doing;
use crate::pool::size_class;

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
        self.pool.holds(class);
        Ok(HipMemory { block, size })
    }

    pub(crate) fn free(&mut self, memory: HipMemory) {
        match self.fence_all_streams() {
            Ok(fences) => self.pool.cool(memory.block, fences),
            Err(e) => {
                // Without fences there is no telling when the block is idle.
                tracing::warn!("could not fence a freed block, leaking it: {e}");
                self.pool.leak(memory.block);
            }
        }
    }
}
