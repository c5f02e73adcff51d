//! Device memory's blocks, and the stream-ordered pool they come from.
//!
//! A [`CudaMemory`] remembers the stream that used it last, so its free can follow every use.
//! Streams mark what they touch (`device.rs`), so blocks stand below them. Allocating and freeing
//! on a stream (`memory.rs`) stands above.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use cudarc::driver::{CudaContext, CudaStream, result, sys};
use scope_core::Result;

use crate::error::{Doing, driver as driver_error};

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
    /// A block just allocated, used by no stream yet.
    pub(crate) fn new(ptr: sys::CUdeviceptr, size: u64) -> Self {
        Self(Arc::new(Block {
            ptr,
            size,
            last_user: AtomicU32::new(NO_USER),
        }))
    }

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

    /// The stream that used it last, if any did.
    pub(crate) fn last_user(&self) -> Option<u32> {
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
