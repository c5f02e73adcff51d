//! Host writes, host reads and device copies.
//!
//! A write goes through pinned staging (`staging.rs`). Inside a capture it records the bytes
//! given *at call time*, as every server does, in a pinned copy the graph keeps, since each
//! replay reads it. A read is a DMA into pinned memory, a sync, and a copy out, in chunks of
//! [`STAGING_CHUNK`](crate::staging::STAGING_CHUNK).

use scope_core::Result;

use crate::device::{Hip, HipStream};
use crate::error::Doing;
use crate::memory::HipMemory;
use crate::staging::STAGING_CHUNK;

fn copying(what: String, stream: &HipStream) -> Doing {
    Doing::Copying {
        what,
        stream: stream.id,
    }
}

impl Hip {
    /// [`Backend::write`](scope_core::Backend::write). Safety: `stream` and `dst` are this
    /// backend's and alive; the written range lies inside `dst`.
    pub(crate) unsafe fn write(
        &mut self,
        stream: &mut HipStream,
        dst: &HipMemory,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        let what = || format!("write of {} bytes at offset {offset}", data.len());
        if stream.is_capturing() {
            let mut copy = self
                .api
                .pinned(data.len())
                .map_err(|e| e.into_error(copying(what(), stream)))?;
            copy.as_mut_slice().copy_from_slice(data);
            // SAFETY: stream, then graph, keep `copy` past the last replay; the range is in `dst`.
            unsafe {
                stream
                    .stream()
                    .copy_to_device(dst.block.at(offset), copy.as_ptr(), data.len())
            }
            .map_err(|e| e.into_error(copying(what(), stream)))?;
            stream.retained.push(copy);
            return Ok(());
        }
        let mut done = 0usize;
        while done < data.len() {
            let chunk = &data[done..(done + STAGING_CHUNK).min(data.len())];
            let slot = self
                .staging
                .slot(&self.api, chunk.len())
                .map_err(|e| e.into_error(copying(what(), stream)))?;
            let (buffer, fence) = self.staging.parts(slot);
            buffer.as_mut_slice()[..chunk.len()].copy_from_slice(chunk);
            // SAFETY: the slot waits for `fence`, recorded right after this copy, to refill;
            // `Backend::write`'s contract puts the whole range, so this chunk, in the live `dst`.
            unsafe {
                stream.stream().copy_to_device(
                    dst.block.at(offset + done as u64),
                    buffer.as_ptr(),
                    chunk.len(),
                )
            }
            .map_err(|e| e.into_error(copying(what(), stream)))?;
            fence
                .record(stream.stream())
                .map_err(|e| e.into_error(copying(what(), stream)))?;
            done += chunk.len();
        }
        Ok(())
    }

    /// [`Backend::read`](scope_core::Backend::read). Safety: `stream` and `src` are this
    /// backend's and alive; the read range lies inside `src`.
    pub(crate) unsafe fn read(
        &mut self,
        stream: &mut HipStream,
        src: &HipMemory,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let total = out.len();
        let mut done = 0usize;
        while done < total {
            let len = STAGING_CHUNK.min(total - done);
            let id = stream.id;
            let waiting = || Doing::Waiting(Some(id));
            let buffer = self
                .staging
                .read_buffer(&self.api, len)
                .map_err(|e| e.into_error(waiting()))?;
            // SAFETY: the backend's buffer is untouched until the sync below returns;
            // `Backend::read`'s contract puts the whole range, so this chunk, in the live `src`.
            unsafe {
                stream.stream().copy_to_host(
                    buffer.as_mut_ptr(),
                    src.block.at(offset + done as u64),
                    len,
                )
            }
            .map_err(|e| e.into_error(waiting()))?;
            // Earlier work's fault surfaces here; the core blames the work in flight (rule 23).
            stream
                .stream()
                .synchronize()
                .map_err(|e| e.into_error(waiting()))?;
            out[done..done + len].copy_from_slice(&buffer.as_slice()[..len]);
            done += len;
        }
        Ok(())
    }

    /// [`Backend::copy`](scope_core::Backend::copy). Safety: `stream`, `src` and `dst` are this
    /// backend's and alive; each range lies inside its memory.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn copy(
        &mut self,
        stream: &mut HipStream,
        src: &HipMemory,
        src_offset: u64,
        dst: &HipMemory,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let what = || format!("copy of {len} bytes");
        let bytes = usize::try_from(len)
            .map_err(|_| scope_core::Error::invalid("copy", "past the address space"))?;
        // SAFETY: both ranges lie in live allocations (freed ones stay pooled until fences pass).
        unsafe {
            stream.stream().copy_on_device(
                dst.block.at(dst_offset),
                src.block.at(src_offset),
                bytes,
            )
        }
        .map_err(|e| e.into_error(copying(what(), stream)))
    }
}
