//! Device memory from a stream-ordered pool, and pinned host staging.
//!
//! **The pool.** Where the device supports memory pools (every GPU this crate
//! targets does), allocations come from a pool of the server's own made with
//! `cuMemPoolCreate` and served by `cuMemAllocFromPoolAsync`; frees are
//! `cuMemFreeAsync`. Freed blocks go back to the pool and are reused by later
//! allocations once the driver knows the free has completed — reuse of freed
//! memory is the driver's, which knows what the GPU has finished. The pool's
//! release threshold is "never", so memory stays cached in the pool (and is
//! counted by [`Cuda::reserved`]) until [`Cuda::trim_pool`] gives it back,
//! which the core does before retrying an allocation that ran out (rule 37).
//! Internal dependencies are turned off so that an allocation never silently
//! waits for another stream's work.
//!
//! **Which stream.** An allocation is made in the order of the stream that
//! asked for it ([`Backend::allocate`](scope_core::Backend::allocate) is
//! handed it) and returns without waiting: the memory is valid for that
//! stream's later work at once, and the core records the stream as the
//! buffer's first user, so another stream's first use waits for it
//! (`Backend::order`) like any other cross-stream use. A stream that is
//! recording a capture cannot allocate in its own order — the allocation
//! would become a node of the graph, repeated by every replay — so there
//! the allocation is made on a stream of the pool's own, which is
//! synchronised before the pointer is handed out (valid everywhere, one
//! host round trip). A free is ordered the same way: each block remembers
//! the last stream that used it, and since the core orders every use of a
//! buffer on a new stream after its previous user, the last user's stream
//! is ordered after every use — `cuMemFreeAsync` on it frees after all of
//! them, without a host wait. A free whose last user is recording a capture
//! is deferred to the end of that capture (a free issued on a capturing
//! stream would become a node of the graph).
//!
//! **Without pools** (some virtualised devices), memory is `cuMemAlloc`'d and
//! `cuMemFree`'d after the last user's stream is synchronised; nothing is
//! cached.
//!
//! **Pinned staging.** Host writes copy the caller's bytes into a per-stream
//! belt of pinned chunks and DMA from there, so the call returns at once and
//! the caller's slice is free; a chunk is reused when the event recorded
//! after its last copy has completed, and the chunk being filled starts
//! over when a wait has finished every copy taken from it (a wait that
//! began before another thread took more is not enough). Inside a capture
//! window the bytes go to a pinned buffer of their own that the graph
//! keeps: every replay writes the bytes given at call time.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, result, sys};
use scope_core::{Error, Result};

use crate::error::{Doing, driver as driver_error};
use crate::{Cuda, CudaStreamState};

/// No stream has used a block yet.
const NO_USER: u32 = u32::MAX;

struct Block {
    ptr: sys::CUdeviceptr,
    size: u64,
    /// The stream index of the last work issued on it.
    last_user: AtomicU32,
}

/// A device allocation: the core's [`Backend::Memory`](scope_core::Backend::Memory).
///
/// Clones name the same block: a captured graph keeps clones of what its
/// work touches, to mark them used when it replays. The block is given back
/// by [`Backend::free`](scope_core::Backend::free), never by a drop; the
/// contract of [`Backend::replay`](scope_core::Backend::replay) has every
/// memory a graph recorded work on alive, so a stale clone is never used on
/// the device.
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

/// Where device memory comes from.
pub(crate) enum Pool {
    /// A stream-ordered pool and the stream allocations are made on.
    Ordered {
        pool: sys::CUmemoryPool,
        stream: Arc<CudaStream>,
    },
    /// `cuMemAlloc`/`cuMemFree`, counted here.
    Plain { reserved: u64 },
}

// SAFETY: `CUmemoryPool` is a driver handle, usable from any thread with the
// context current; a pool that is `Send` but not `Sync` is used by one thread
// at a time.
unsafe impl Send for Pool {}

impl Pool {
    /// A pool on `ctx`'s device, or plain allocation where pools are
    /// unsupported.
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
        // SAFETY: `pool` is valid; RELEASE_THRESHOLD takes a `cuuint64_t` and
        // REUSE_ALLOW_INTERNAL_DEPENDENCIES an `int`, each pointed to here.
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

    /// Destroy the pool. Blocks still allocated or frees still pending are
    /// released by the driver when they complete.
    pub(crate) fn destroy(&mut self) {
        if let Pool::Ordered { pool, .. } = self {
            // SAFETY: the pool is valid and destroyed once: it is replaced
            // by `Plain` right after.
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
                // SAFETY: the pool and the user's stream are valid and the
                // stream is not capturing; the memory is used in that
                // stream's order, or after it (module docs).
                unsafe { result::mem_pool::alloc_async(*pool, bytes, user.shared.cu.cu_stream()) }
                    .map_err(|e| driver_error(e, doing()))?
            }
            Pool::Ordered { pool, stream } => {
                // SAFETY: the pool and stream are valid; the memory is not
                // read before something writes it (contents are unspecified
                // by the contract).
                let ptr =
                    unsafe { result::mem_pool::alloc_async(*pool, bytes, stream.cu_stream()) }
                        .map_err(|e| driver_error(e, doing()))?;
                // Valid on every stream once the allocation stream has
                // reached it (see the module docs).
                if let Err(e) = stream.synchronize() {
                    // SAFETY: `ptr` came from this pool on this stream and
                    // is freed once, here.
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

    /// [`Backend::free`](scope_core::Backend::free): release `memory` after
    /// its last user, or when that user's capture ends.
    ///
    /// # Safety
    ///
    /// The contract of `Backend::free`: `memory` is this backend's and is
    /// given back once — no clone of it is freed again — and no later call
    /// names it.
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

    /// Give `memory` back, ordered after its last user.
    ///
    /// # Safety
    ///
    /// As for [`free_block`](Self::free_block): `memory` is this backend's,
    /// released once, and named by no later call.
    pub(crate) unsafe fn release(&mut self, last: Option<u32>, memory: CudaMemory) {
        let ptr = memory.device_ptr();
        let outcome = match &mut self.pool {
            Pool::Ordered { stream, .. } => {
                let on = last
                    .and_then(|i| self.streams.get(i as usize))
                    .map(|s| s.cu.cu_stream())
                    .unwrap_or_else(|| stream.cu_stream());
                // SAFETY: `ptr` came from this pool and is freed once (this
                // function's contract); `on` is ordered after every use of it
                // (module docs).
                unsafe { result::free_async(ptr, on) }
            }
            Pool::Plain { reserved } => {
                *reserved = reserved.saturating_sub(memory.size());
                let waited = match last.and_then(|i| self.streams.get(i as usize)) {
                    Some(shared) => shared.cu.synchronize(),
                    None => Ok(()),
                };
                // SAFETY: the last user's work is finished (waited above), and
                // `ptr` is freed once (this function's contract).
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
            // SAFETY: `deferred` holds only memory `free_block` was given,
            // whose contract is that nothing names it again; taken out of
            // the list, it is released here once.
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
            // Frees of blocks no logical stream used went on the pool's own
            // stream; the driver keeps a freed block until the host has seen
            // its free complete, so wait for that stream too.
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
                // SAFETY: the pool is valid; RESERVED_MEM_CURRENT writes a
                // `cuuint64_t`.
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

// SAFETY: the buffer is owned memory like a `Box<[u8]>`; the context handle
// is thread-safe.
unsafe impl Send for Pinned {}

impl Pinned {
    pub(crate) fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        // SAFETY: a fresh allocation of `len` bytes with default flags; its
        // contents are written before they are read.
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
        // SAFETY: in bounds (asserted); the buffer is exclusively borrowed
        // and was allocated `len` bytes long.
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

/// Host writes and reads up to this size go through pinned staging; larger
/// ones copy from (to) the caller's memory directly, which the driver stages
/// itself before the call returns.
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
    /// Regions handed out so far, ever: a wait notes it when it begins
    /// ([`mark`](Self::mark)), and may free the current chunk when it ends
    /// only if no region was taken in between ([`settled_at`](Self::settled_at)).
    taken: u64,
}

/// How much staging a stream had handed out when a wait began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StagingMark(u64);

impl Staging {
    /// Room for `len` (≤ [`STAGING_CHUNK`]) bytes whose copy is about to be
    /// issued on `stream`.
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

    /// Where the belt stands now, for a wait that covers the copies issued
    /// so far.
    pub(crate) fn mark(&self) -> StagingMark {
        StagingMark(self.taken)
    }

    /// A wait begun at `mark` has finished the work it covers. Every region
    /// taken up to `mark` had its copy issued before the wait began (a
    /// region is taken right before its copy, under the server's lock), so
    /// if none was taken since, the whole current chunk is free. If one
    /// was — another thread's write or read while this wait ran without
    /// the lock — its copy may still be in flight and the chunk is left as
    /// it is: the next wait that covers it frees it, or it fills up and
    /// retires behind its event.
    pub(crate) fn settled_at(&mut self, mark: StagingMark) {
        if mark.0 == self.taken {
            self.settled();
        }
    }
}
