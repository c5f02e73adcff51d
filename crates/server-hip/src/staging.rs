//! Pinned buffers for host transfers: write slots behind fences, and one read buffer.
//!
//! A host write goes through a slot, so the DMA is asynchronous and the caller's slice free at
//! once; writes past [`STAGING_CHUNK`] go in chunks. A read syncs before copying out: its buffer
//! needs no fence. The device holds them (`device.rs`), so they stand below it.

use std::sync::Arc;

use crate::api::{Event, Pinned};
use crate::error::{HipError, HipResult};
use crate::loader::Api;

/// The largest staging buffer: longer transfers go in chunks of this size.
pub const STAGING_CHUNK: usize = 16 << 20;
/// The smallest staging buffer made, so small writes share slots.
const STAGING_MIN: usize = 64 << 10;
/// Staging slots kept before a write waits for the oldest to drain.
const STAGING_SLOTS: usize = 8;

struct Slot {
    buffer: Pinned,
    fence: Event,
}

/// Pinned buffers for host-to-device writes, and the one host reads land in.
#[derive(Default)]
pub struct Staging {
    slots: Vec<Slot>,
    /// The slot handed out last, so that a full set is reused round-robin.
    next: usize,
    /// Where reads land before they are copied out; grown on demand.
    read: Option<Pinned>,
}

impl Drop for Staging {
    fn drop(&mut self) {
        // A slot may feed a copy still in flight; wait before freeing.
        for slot in &self.slots {
            let _ = slot.fence.synchronize();
        }
    }
}

impl Staging {
    /// A slot of at least `len` bytes whose last copy has finished.
    pub(crate) fn slot(&mut self, api: &Arc<Api>, len: usize) -> HipResult<usize> {
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.buffer.len() >= len && slot.fence.is_done()? {
                return Ok(i);
            }
        }
        if self.slots.len() < STAGING_SLOTS {
            let buffer = api.pinned(len.max(STAGING_MIN))?;
            let fence = api.event()?;
            self.slots.push(Slot { buffer, fence });
            return Ok(self.slots.len() - 1);
        }
        let i = self.next % self.slots.len();
        self.next = i + 1;
        self.slots[i].fence.synchronize()?;
        if self.slots[i].buffer.len() < len {
            self.slots[i].buffer = api.pinned(len)?;
        }
        Ok(i)
    }

    /// The slot's buffer to fill, and its fence to record after the copy.
    pub(crate) fn parts(&mut self, slot: usize) -> (&mut Pinned, &Event) {
        let slot = &mut self.slots[slot];
        (&mut slot.buffer, &slot.fence)
    }

    /// A pinned read buffer of at least `len` bytes.
    pub(crate) fn read_buffer(&mut self, api: &Arc<Api>, len: usize) -> HipResult<&mut Pinned> {
        let big_enough = self.read.as_ref().is_some_and(|b| b.len() >= len);
        if !big_enough {
            self.read = None;
            self.read = Some(api.pinned(len.max(STAGING_MIN))?);
        }
        self.read
            .as_mut()
            .ok_or_else(|| HipError::new("hipHostMalloc", crate::ffi::code::OUT_OF_MEMORY))
    }
}
