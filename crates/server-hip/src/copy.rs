//! Host writes, host reads and device copies.
//!
//! A write outside a capture goes through the staging slots in
//! `memory.rs`: the bytes are copied into pinned memory, the DMA is queued,
//! and a fence after it tells when the slot may be refilled. A write inside
//! a capture window follows the rule every server keeps: it is recorded
//! with a copy of the bytes given *at call time*, and every replay writes
//! those same bytes. The copy is a pinned buffer of its own that the stream
//! retains until the capture ends and the graph then owns until it is
//! destroyed, because the recorded copy node reads it at every replay.
//!
//! A read is a DMA into a pinned buffer, a stream sync, and a copy out, in
//! chunks of [`STAGING_CHUNK`](crate::memory::STAGING_CHUNK).

use scope_core::Result;

use crate::device::{Hip, HipStream};
use crate::error::Doing;
use crate::memory::{HipMemory, STAGING_CHUNK};

fn copying(what: String, stream: &HipStream) -> Doing {
    Doing::Copying {
        what,
        stream: stream.id,
    }
}

impl Hip {
    /// [`Backend::write`](scope_core::Backend::write).
    ///
    /// # Safety
    ///
    /// The contract of `Backend::write`: `stream` and `dst` are this
    /// backend's and alive, and `offset..offset + data.len()` lies inside
    /// `dst`.
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
            // SAFETY: `copy` is retained by the stream and then by the graph
            // until the graph is destroyed, after its last replay; the
            // contract of `Backend::write`: `offset..offset + len` lies
            // inside `dst`, which is alive.
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
                .staging_slot(chunk.len())
                .map_err(|e| e.into_error(copying(what(), stream)))?;
            let (buffer, fence) = self.staging_parts(slot);
            buffer.as_mut_slice()[..chunk.len()].copy_from_slice(chunk);
            // SAFETY: the slot is not refilled until `fence`, recorded right
            // after this copy, has passed; the contract of `Backend::write`:
            // the whole range, and so this chunk of it, lies inside `dst`,
            // which is alive.
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

    /// [`Backend::read`](scope_core::Backend::read).
    ///
    /// # Safety
    ///
    /// The contract of `Backend::read`: `stream` and `src` are this
    /// backend's and alive, and `offset..offset + out.len()` lies inside
    /// `src`.
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
            let buffer = self.read_buffer(len).map_err(|e| e.into_error(waiting()))?;
            // SAFETY: the buffer is owned by the backend and not touched
            // until the stream sync below returns; the contract of
            // `Backend::read`: the whole range, and so this chunk of it, lies
            // inside `src`, which is alive.
            unsafe {
                stream.stream().copy_to_host(
                    buffer.as_mut_ptr(),
                    src.block.at(offset + done as u64),
                    len,
                )
            }
            .map_err(|e| e.into_error(waiting()))?;
            // A fault in earlier work surfaces here; the core attributes it
            // to the work in flight (rule 23).
            stream
                .stream()
                .synchronize()
                .map_err(|e| e.into_error(waiting()))?;
            out[done..done + len].copy_from_slice(&buffer.as_slice()[..len]);
            done += len;
        }
        Ok(())
    }

    /// [`Backend::copy`](scope_core::Backend::copy).
    ///
    /// # Safety
    ///
    /// The contract of `Backend::copy`: `stream`, `src` and `dst` are this
    /// backend's and alive; `src_offset..src_offset + len` lies inside `src`
    /// and `dst_offset..dst_offset + len` inside `dst`.
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
        // SAFETY: the contract of `Backend::copy`: both ranges lie inside
        // their allocations, which are alive (and the pool keeps freed ones
        // until their fences pass).
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
