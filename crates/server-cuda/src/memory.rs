//! Allocations and frees ordered on the streams, and trims.
//!
//! An allocation is ordered on the stream that asked for it; the core orders other streams' uses
//! after it (`Backend::order`). A free goes on the block's last user's stream, which follows
//! every use. A capturing stream would record either into the graph, run by every replay. So its
//! allocations go on the pool's own stream, synchronised, and its frees wait for the capture's
//! end. Without pools, a free waits for the last user's stream.
//!
//! Freed memory stays cached (counted by [`Cuda::reserved`]) until [`Cuda::trim_pool`], which the
//! core calls before retrying an allocation that ran out (rule 37).

use std::ffi::c_void;

use cudarc::driver::{result, sys};
use scope_core::{Error, Result};

use crate::Cuda;
use crate::device::CudaStreamState;
use crate::error::{Doing, driver as driver_error};
use crate::pool::{CudaMemory, Pool};

impl Cuda {
    pub(crate) fn allocate_block(
        &mut self,
        user: &CudaStreamState,
        size: u64,
    ) -> Result<CudaMemory> {
        self.bind()?;
        let bytes = usize::try_from(size)
            .map_err(|_| Error::invalid("allocation size", "past the address space"))?;
        let doing = || Doing::Allocate { bytes: size };
        let in_order = user.recording.is_none();
        let ptr = match &mut self.pool {
            Pool::Ordered { pool, .. } if in_order => {
                // SAFETY: valid pool and stream, not capturing; the memory is used in its order.
                unsafe { result::mem_pool::alloc_async(*pool, bytes, user.shared.cu.cu_stream()) }
                    .map_err(|e| driver_error(e, doing()))?
            }
            Pool::Ordered { pool, stream } => {
                // SAFETY: valid pool and stream; the contents are unspecified until written.
                let ptr =
                    unsafe { result::mem_pool::alloc_async(*pool, bytes, stream.cu_stream()) }
                        .map_err(|e| driver_error(e, doing()))?;
                // Valid on every stream once the allocation stream reaches it.
                if let Err(e) = stream.synchronize() {
                    // SAFETY: `ptr` came from this pool on this stream, freed once here.
                    let _ = unsafe { result::free_async(ptr, stream.cu_stream()) };
                    return Err(driver_error(e, doing()));
                }
                ptr
            }
            Pool::Plain { reserved } => {
                // SAFETY: a plain allocation; contents unspecified.
                let ptr =
                    unsafe { result::malloc_sync(bytes) }.map_err(|e| driver_error(e, doing()))?;
                *reserved += size;
                ptr
            }
        };
        let memory = CudaMemory::new(ptr, size);
        if in_order {
            // Its free must be ordered after the allocation, too.
            memory.used_by(user.shared.index);
        }
        Ok(memory)
    }

    /// [`Backend::free`](scope_core::Backend::free): release `memory` after its last user. Safety:
    /// its contract, that `memory` is this backend's, given back once, then never named.
    pub(crate) unsafe fn free_block(&mut self, memory: CudaMemory) {
        if let Err(e) = self.bind() {
            tracing::warn!("cuda: free of {} bytes skipped: {e}", memory.size());
            return;
        }
        let last = memory.last_user();
        if let Some(index) = last
            && self.is_capturing(index)
        {
            self.deferred.push((index, memory));
            return;
        }
        // SAFETY: this function's contract is `release`'s.
        unsafe { self.release(last, memory) };
    }

    /// Give `memory` back after its last user. Safety: as for [`free_block`](Self::free_block).
    pub(crate) unsafe fn release(&mut self, last: Option<u32>, memory: CudaMemory) {
        let ptr = memory.device_ptr();
        let outcome = match &mut self.pool {
            Pool::Ordered { stream, .. } => {
                let on = last
                    .and_then(|i| self.streams.get(i as usize))
                    .map(|s| s.cu.cu_stream())
                    .unwrap_or_else(|| stream.cu_stream());
                // SAFETY: from this pool, freed once (the contract); `on` follows every use.
                unsafe { result::free_async(ptr, on) }
            }
            Pool::Plain { reserved } => {
                *reserved = reserved.saturating_sub(memory.size());
                let waited = match last.and_then(|i| self.streams.get(i as usize)) {
                    Some(shared) => shared.cu.synchronize(),
                    None => Ok(()),
                };
                // SAFETY: the last user finished (waited above); `ptr` is freed once.
                waited.and_then(|()| unsafe { result::free_sync(ptr) })
            }
        };
        if let Err(e) = outcome {
            tracing::warn!("cuda: freeing {} bytes at {ptr:#x}: {e}", memory.size());
        }
    }

    /// Frees deferred while stream `index` was capturing.
    pub(crate) fn release_deferred(&mut self, index: u32) {
        let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|(i, _)| *i == index);
        self.deferred = later;
        for (i, memory) in now {
            // SAFETY: `deferred` holds freed memory nothing names again; released once.
            unsafe { self.release(Some(i), memory) };
        }
    }

    pub(crate) fn trim_pool(&mut self) {
        if self.bind().is_err() {
            return;
        }
        // Let pending frees complete, so the trim can release them too.
        for i in 0..self.streams.len() as u32 {
            if let Err(e) = self.finish_on_host(i) {
                tracing::warn!("cuda: trim could not wait for stream {i}: {e}");
            }
        }
        if let Pool::Ordered { pool, stream } = &self.pool {
            // A block is held until its free is seen done: wait on the pool's stream too.
            if let Err(e) = stream.synchronize() {
                tracing::warn!("cuda: trim could not wait for the pool's stream: {e}");
            }
            // SAFETY: the pool is valid.
            if let Err(e) = unsafe { result::mem_pool::trim_to(*pool, 0) } {
                tracing::warn!("cuda: trimming the pool: {e}");
            }
        }
    }

    pub(crate) fn reserved(&self) -> u64 {
        match &self.pool {
            Pool::Ordered { pool, .. } => {
                if self.bind().is_err() {
                    return 0;
                }
                let mut bytes: u64 = 0;
                // SAFETY: the pool is valid; RESERVED_MEM_CURRENT writes a `cuuint64_t`.
                let read = unsafe {
                    result::mem_pool::get_attribute(
                        *pool,
                        sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                        (&mut bytes as *mut u64).cast::<c_void>(),
                    )
                };
                read.map(|()| bytes).unwrap_or(0)
            }
            Pool::Plain { reserved } => *reserved,
        }
    }
}
