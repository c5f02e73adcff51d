//! Pinned host memory, and each stream's belt of it for staging host transfers.
//!
//! A host write copies the caller's bytes into a pinned chunk and returns at once. A chunk is
//! reused once the event after its last copy completed, or once a wait finished every copy taken
//! from it ([`StagingMark`]). In a capture the bytes get a [`Pinned`] buffer the graph keeps. A
//! stream's state holds the belt (`device.rs`), so it stands below the streams.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, result};
use scope_core::{Error, Result};

use crate::error::{BACKEND, Doing, driver as driver_error};

/// Page-locked host memory from `cuMemHostAlloc`.
pub(crate) struct Pinned {
    ptr: NonNull<u8>,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: owned memory like a `Box<[u8]>`; the context handle is thread-safe.
unsafe impl Send for Pinned {}

impl Pinned {
    pub(crate) fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        // SAFETY: a fresh allocation, written before it is read.
        let raw = unsafe { result::malloc_host(len.max(1), 0) }
            .map_err(|e| driver_error(e, Doing::Allocate { bytes: len as u64 }))?;
        let ptr = NonNull::new(raw.cast::<u8>()).ok_or_else(|| Error::OutOfMemory {
            backend: BACKEND,
            requested: len as u64,
            detail: "cuMemHostAlloc returned null".to_owned(),
        })?;
        Ok(Self {
            ptr,
            len,
            ctx: ctx.clone(),
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// `len` bytes at `at`, which must lie inside the buffer.
    pub(crate) fn slice_mut(&mut self, at: usize, len: usize) -> &mut [u8] {
        assert!(at + len <= self.len, "pinned slice out of bounds");
        // SAFETY: in bounds (asserted), exclusively borrowed, allocated `len` bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(at), len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the pointer came from `cuMemHostAlloc` and is freed once.
        if let Err(e) = unsafe { result::free_host(self.ptr.as_ptr().cast::<c_void>()) } {
            tracing::warn!("cuda: freeing pinned memory: {e}");
        }
    }
}

/// Host transfers up to this size are staged; larger ones the driver stages itself.
pub(crate) const STAGING_CHUNK: usize = 1 << 20;

/// Chunks a stream keeps; past this a write waits for the oldest.
const KEEP_CHUNKS: usize = 8;

struct Chunk {
    memory: Pinned,
    used: usize,
    /// Recorded on the stream after the chunk's last copy was issued.
    done: CudaEvent,
}

/// A stream's belt of pinned chunks.
#[derive(Default)]
pub(crate) struct Staging {
    current: Option<Chunk>,
    retired: VecDeque<Chunk>,
    /// Regions handed out, ever: a wait notes it ([`mark`](Self::mark)) and frees the chunk only if
    /// none was taken since ([`settled_at`](Self::settled_at)).
    taken: u64,
}

/// How much staging a stream had handed out when a wait began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StagingMark(u64);

impl Staging {
    /// Room for `len` (≤ [`STAGING_CHUNK`]) bytes whose copy is about to go on `stream`.
    pub(crate) fn region(
        &mut self,
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
        len: usize,
    ) -> Result<&mut [u8]> {
        let wait = |e| {
            driver_error(
                e,
                Doing::Wait {
                    stream: None,
                    what: "pinned staging",
                },
            )
        };
        if let Some(full) = self.current.take_if(|c| c.used + len > c.memory.len()) {
            full.done.record(stream).map_err(wait)?;
            self.retired.push_back(full);
        }
        let chunk = match self.current.take() {
            Some(chunk) => chunk,
            None => {
                let reusable = match self.retired.front() {
                    Some(front) => {
                        self.retired.len() >= KEEP_CHUNKS
                            || front.done.try_is_complete().map_err(wait)?
                    }
                    None => false,
                };
                match self.retired.pop_front() {
                    Some(mut chunk) if reusable => {
                        // Complete already, or the oldest of too many: wait.
                        chunk.done.synchronize().map_err(wait)?;
                        chunk.used = 0;
                        chunk
                    }
                    other => {
                        if let Some(chunk) = other {
                            self.retired.push_front(chunk);
                        }
                        Chunk {
                            memory: Pinned::new(ctx, STAGING_CHUNK)?,
                            used: 0,
                            done: ctx.new_event(None).map_err(wait)?,
                        }
                    }
                }
            }
        };
        let chunk = self.current.insert(chunk);
        self.taken += 1;
        let at = chunk.used;
        // Keep regions 16-byte aligned, as DMA prefers.
        chunk.used += len.div_ceil(16) * 16;
        Ok(chunk.memory.slice_mut(at, len))
    }

    /// The stream has finished all its work: the current chunk is free.
    pub(crate) fn settled(&mut self) {
        if let Some(chunk) = &mut self.current {
            chunk.used = 0;
        }
    }

    /// Where the belt stands, for a wait covering the copies issued so far.
    pub(crate) fn mark(&self) -> StagingMark {
        StagingMark(self.taken)
    }

    /// A wait begun at `mark` finished its work, which covers every region up to `mark`. If none
    /// was taken since, the chunk is free; else another copy may be in flight.
    pub(crate) fn settled_at(&mut self, mark: StagingMark) {
        if mark.0 == self.taken {
            self.settled();
        }
    }
}
