//! Host writes, host reads and device copies.
//!
//! A write stages the caller's bytes in pinned memory and issues an
//! asynchronous DMA, so it returns without waiting for the device (see
//! [`memory`](crate::memory) for the staging belt). Inside a capture window
//! the bytes are copied to a pinned buffer the graph keeps, and the captured
//! memcpy node reads that buffer on every replay: a host write inside a window
//! writes, at each replay, the bytes given at call time. A read waits for the
//! stream, which is where a fault of earlier work surfaces; it is returned
//! as a [`Fault`](scope_core::Error::Fault) for the core to attribute to the
//! work in flight (rule 23).

use std::ffi::c_void;

use cudarc::driver::sys;
use scope_core::{Error, Result};

use crate::error::{Doing, classify, driver as driver_error};
use crate::memory::{Pinned, STAGING_CHUNK};
use crate::{Cuda, CudaMemory, CudaStreamState};

impl Cuda {
    /// [`Backend::write`](scope_core::Backend::write).
    ///
    /// # Safety
    ///
    /// The contract of `Backend::write`: `stream` and `dst` are this
    /// backend's and alive, and `offset..offset + data.len()` lies inside
    /// `dst`.
    pub(crate) unsafe fn write_bytes(
        &mut self,
        stream: &mut CudaStreamState,
        dst: &CudaMemory,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        self.bind()?;
        let id = stream.id();
        let what = format!("write of {} bytes at offset {offset}", data.len());
        let fail = |code| {
            classify(
                code,
                Doing::Copy {
                    what: &what,
                    stream: id,
                },
            )
        };
        let target = dst.device_ptr() + offset;
        let cu = stream.shared.cu.cu_stream();
        let source: *const u8 = if let Some(recording) = &mut stream.recording {
            let mut pinned = Pinned::new(&self.ctx, data.len())?;
            pinned.slice_mut(0, data.len()).copy_from_slice(data);
            let ptr = pinned.slice_mut(0, data.len()).as_ptr();
            recording.staging.push(pinned);
            ptr
        } else if data.len() <= STAGING_CHUNK {
            let region = stream
                .staging
                .region(&self.ctx, &stream.shared.cu, data.len())?;
            region.copy_from_slice(data);
            region.as_ptr()
        } else {
            // Pageable: the driver copies it to its own staging before the
            // call returns, so `data` may go as soon as it does.
            data.as_ptr()
        };
        // SAFETY: the contract of `Backend::write`: `target..target +
        // data.len()` lies inside `dst`, which is alive. `source` holds
        // `data.len()` bytes that stay valid until the copy has read them:
        // staging outlives the copy (event-guarded belt, or kept by the
        // graph), and a pageable source is staged by the driver before this
        // returns.
        unsafe { sys::cuMemcpyHtoDAsync_v2(target, source.cast::<c_void>(), data.len(), cu) }
            .result()
            .map_err(|e| fail(e.0))?;
        stream.touch(dst);
        Ok(())
    }

    /// [`Backend::read`](scope_core::Backend::read).
    ///
    /// # Safety
    ///
    /// The contract of `Backend::read`: `stream` and `src` are this
    /// backend's and alive, and `offset..offset + out.len()` lies inside
    /// `src`.
    pub(crate) unsafe fn read_bytes(
        &mut self,
        stream: &mut CudaStreamState,
        src: &CudaMemory,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        self.bind()?;
        if stream.recording.is_some() {
            return Err(Error::internal(
                "a host read reached a stream that is capturing",
            ));
        }
        let id = stream.id();
        let what = format!("read of {} bytes at offset {offset}", out.len());
        let source = src.device_ptr() + offset;
        let cu = stream.shared.cu.cu_stream();
        let waited = |e: cudarc::driver::DriverError| {
            driver_error(
                e,
                Doing::Wait {
                    stream: Some(id),
                    what: "the stream before a read",
                },
            )
        };
        stream.touch(src);
        // Small reads land in pinned staging, large ones straight in `out`;
        // either way one copy and one sync.
        let mut region = if out.len() <= STAGING_CHUNK {
            Some(
                stream
                    .staging
                    .region(&self.ctx, &stream.shared.cu, out.len())?,
            )
        } else {
            None
        };
        let target = match &mut region {
            Some(region) => region.as_mut_ptr(),
            None => out.as_mut_ptr(),
        };
        // SAFETY: the contract of `Backend::read`: `source..source +
        // out.len()` lies inside `src`, which is alive. `target` holds
        // `out.len()` bytes (the staging region, or `out` itself) and is not
        // touched until the sync below returns, which completes the copy.
        unsafe { sys::cuMemcpyDtoHAsync_v2(target.cast::<c_void>(), source, out.len(), cu) }
            .result()
            .map_err(|e| {
                classify(
                    e.0,
                    Doing::Copy {
                        what: &what,
                        stream: id,
                    },
                )
            })?;
        stream.shared.cu.synchronize().map_err(waited)?;
        if let Some(region) = region {
            out.copy_from_slice(region);
        }
        stream.staging.settled();
        Ok(())
    }

    /// [`Backend::copy`](scope_core::Backend::copy).
    ///
    /// # Safety
    ///
    /// The contract of `Backend::copy`: `stream`, `src` and `dst` are this
    /// backend's and alive; `src_offset..src_offset + len` lies inside `src`
    /// and `dst_offset..dst_offset + len` inside `dst`, and the two do not
    /// overlap.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn copy_bytes(
        &mut self,
        stream: &mut CudaStreamState,
        src: &CudaMemory,
        src_offset: u64,
        dst: &CudaMemory,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        self.bind()?;
        let id = stream.id();
        let what = format!("copy of {len} bytes");
        let bytes =
            usize::try_from(len).map_err(|_| Error::invalid("copy", "past the address space"))?;
        // SAFETY: the contract of `Backend::copy`: both ranges lie inside
        // their live allocations and do not overlap.
        unsafe {
            sys::cuMemcpyDtoDAsync_v2(
                dst.device_ptr() + dst_offset,
                src.device_ptr() + src_offset,
                bytes,
                stream.shared.cu.cu_stream(),
            )
        }
        .result()
        .map_err(|e| {
            classify(
                e.0,
                Doing::Copy {
                    what: &what,
                    stream: id,
                },
            )
        })?;
        stream.touch(src);
        stream.touch(dst);
        Ok(())
    }
}
