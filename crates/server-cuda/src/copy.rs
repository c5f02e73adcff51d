//! Host writes, host reads and device copies.
//!
//! A write stages the caller's bytes in pinned memory and issues an async DMA, so it returns
//! without waiting (`staging.rs` has the belt). In a capture the bytes go to a pinned
//! buffer the graph keeps, which every replay reads. A read waits for the stream, where an earlier
//! fault surfaces: a [`Fault`](scope_core::Error::Fault) the core lays on the work in flight
//! (rule 23).

use std::ffi::c_void;

use cudarc::driver::sys;
use scope_core::{Error, Result};

use crate::Cuda;
use crate::device::CudaStreamState;
use crate::error::{Doing, classify, driver as driver_error};
use crate::pool::CudaMemory;
use crate::staging::{Pinned, STAGING_CHUNK};

impl Cuda {
    /// [`Backend::write`](scope_core::Backend::write), under its safety contract: `stream` and
    /// `dst` are this backend's and alive, and `offset..offset + data.len()` lies inside `dst`.
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
            // Pageable: the driver stages it before the call returns.
            data.as_ptr()
        };
        // SAFETY: the contract puts the range inside live `dst`; `source` outlives the copy.
        unsafe { sys::cuMemcpyHtoDAsync_v2(target, source.cast::<c_void>(), data.len(), cu) }
            .result()
            .map_err(|e| fail(e.0))?;
        stream.touch(dst);
        Ok(())
    }

    /// [`Backend::read`](scope_core::Backend::read), under its safety contract: `stream` and `src`
    /// are this backend's and alive, and `offset..offset + out.len()` lies inside `src`.
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
        // Small reads land in staging, large ones in `out`: one copy, one sync.
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
        // SAFETY: the range lies inside live `src`; `target` is untouched until the sync.
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

    /// [`Backend::copy`](scope_core::Backend::copy), under its safety contract: `stream`, `src` and
    /// `dst` are this backend's and alive; both ranges lie inside their memory and do not overlap.
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
        // SAFETY: `Backend::copy`'s contract: both ranges lie in live memory, disjoint.
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
