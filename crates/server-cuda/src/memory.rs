//! Device memory from a stream-ordered pool, and pinned host staging.
//!
//! **The pool.** Memory comes from a pool of the server's own (`cuMemAllocFromPoolAsync`,
//! `cuMemFreeAsync`). The driver reuses a freed block once the free completed, since it knows what
//! the GPU has finished. Freed memory stays cached (counted by [`Cuda::reserved`]) until
//! [`Cuda::trim_pool`], which the core calls before retrying an allocation that ran out (rule 37).
//! Internal dependencies are off: an allocation never waits on another stream.
//!
//! **Which stream.** An allocation is ordered on the stream that asked for it, and the core orders
//! other streams' uses after it (`Backend::order`). A free goes on the block's last user's stream,
//! which follows every use. A capturing stream would record either into the graph, run by every
//! replay. So its allocations go on the pool's own stream, synchronised, and its frees wait for the
//! capture's end. Without pools, memory is `cuMemAlloc`'d, and freed after the last user's stream
//! is synchronised.
//!
//! **Pinned staging.** A host write copies the caller's bytes into the stream's belt of pinned
//! chunks and returns at once. A chunk is reused once the event after its last copy completed, or
//! once a wait finished every copy taken from it. In a capture the bytes get a pinned buffer the
//! graph keeps, so every replay writes the bytes given at call time.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, result, sys};
use scope_core::{Error, Result};

use crate::error::{Doing, driver as driver_error};
use crate::{Cuda, CudaStreamState};

const NO_USER: u32 = u32::MAX;

struct Block {
    ptr: sys::CUdeviceptr,
    size: u64,
    /// The stream index of the last work issued on it.
    last_user: AtomicU32,
}

/// A device allocation: the core's [`Backend::Memory`](scope_core::Backend::Memory).
///
/// Clones name one block; a graph keeps clones to mark them used at replay. Only
/// [`Backend::free`](scope_core::Backend::free) gives it back, never a drop.
#[derive(Clone)]
pub struct CudaMemory(Arc<Block>);

impl CudaMemory {
    /// The device address.
    pub fn device_ptr(&self) -> u64 {
        self.0.ptr
    }

    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.0.size
    }

    pub(crate) fn used_by(&self, stream: u32) {
        self.0.last_user.store(stream, Ordering::Relaxed);
    }

    fn last_user(&self) -> Option<u32> {
        match self.0.last_user.load(Ordering::Relaxed) {
            NO_USER => None,
            index => Some(index),
        }
    }
}

pub(crate) enum Pool {
    /// A stream-ordered pool and the stream allocations are made on.
    Ordered {
        pool: sys::CUmemoryPool,
        stream: Arc<CudaStream>,
    },
    /// `cuMemAlloc`/`cuMemFree`, counted here.
    Plain { reserved: u64 },
}

// SAFETY: a pool handle works on any thread with its context current; not `Sync`.
unsafe impl Send for Pool {}

impl Pool {
    /// A pool on `ctx`'s device, or plain allocation without pool support.
    pub(crate) fn new(ctx: &Arc<CudaContext>, ordinal: usize) -> Result<Self> {
        if !ctx.has_async_alloc() {
            tracing::info!("cuda: the device has no memory pools; using cuMemAlloc");
            return Ok(Pool::Plain { reserved: 0 });
        }
        let start = |what| move |e| driver_error(e, Doing::Start { what });
        let props = sys::CUmemPoolProps {
            allocType: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: i32::try_from(ordinal).unwrap_or(0),
            },
            win32SecurityAttributes: std::ptr::null_mut(),
            maxSize: 0,
            usage: 0,
            reserved: [0; 54],
        };
        ctx.bind_to_thread().map_err(start("binding the context"))?;
        // SAFETY: `props` is a valid, fully initialised pool description.
        let pool = unsafe { result::mem_pool::create(&props) }.map_err(start("cuMemPoolCreate"))?;
        let mut never: u64 = u64::MAX;
        let mut no: i32 = 0;
        // SAFETY: `pool` is valid; each attribute points at its type (`cuuint64_t`, `int`).
        unsafe {
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut never as *mut u64).cast::<c_void>(),
            )
            .and_then(|()| {
                result::mem_pool::set_attribute(
                    pool,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                    (&mut no as *mut i32).cast::<c_void>(),
                )
            })
        }
        .map_err(start("configuring the memory pool"))?;
        let stream = ctx.new_stream().map_err(start("cuStreamCreate"))?;
        Ok(Pool::Ordered { pool, stream })
    }

    /// Destroy the pool; the driver releases blocks still out when they complete.
    pub(crate) fn destroy(&mut self) {
        if let Pool::Ordered { pool, .. } = self {
            // SAFETY: destroyed once: `Plain` replaces it right after.
            if let Err(e) = unsafe { result::mem_pool::destroy(*pool) } {
                tracing::warn!("cuda: destroying the memory pool: {e}");
            }
            *self = Pool::Plain { reserved: 0 };
        }
    }
}

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
        let memory = CudaMemory(Arc::new(Block {
            ptr,
            size,
            last_user: AtomicU32::new(NO_USER),
        }));
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
            backend: crate::error::BACKEND,
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
