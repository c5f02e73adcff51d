//! Host writes, host reads and device copies, each ordered on a stream.
//!
//! A host write is never a `memcpy` into mapped memory: batched work not yet run may touch
//! those bytes, so the write takes its place in stream order. Up to 64 KiB it goes inline
//! with `vkCmdUpdateBuffer`; larger ones are staged in the stream's arena and copied.
//! A read submits the batch, waits for it, and copies out of the mapping or a staging chunk.

use ash::vk;
use scope_core::{Error, Result};

use crate::memory::{ALIGN, VulkanMemory};
use crate::stream::OpenStream;

const INLINE_WRITE: usize = 65536;

/// Write `data` at `offset` of `dst`, ordered on `stream`.
///
/// As for `Backend::write`: `dst` is alive on this device, and the range inside it, aligned to 4.
pub(crate) unsafe fn write(
    stream: &mut OpenStream,
    dst: &VulkanMemory,
    offset: u64,
    data: &[u8],
) -> Result<()> {
    stream.record(|rec| {
        let target = dst.offset + offset;
        let cmd = rec.encoder.cmd;
        if data.len() <= INLINE_WRITE {
            // SAFETY: `cmd` is recording. The Backend contract of `write` puts the range inside
            // `dst`'s live block buffer, aligned to 4; the length is at most 64 KiB.
            unsafe {
                rec.gpu
                    .vk()
                    .cmd_update_buffer(cmd, dst.buffer, target, data)
            };
            return Ok(());
        }
        let staged = rec.arena.push(data, data.len() as u64, ALIGN)?;
        let region = vk::BufferCopy {
            src_offset: staged.offset(),
            dst_offset: target,
            size: data.len() as u64,
        };
        // SAFETY: as above for the destination; the staging chunk outlives the submission.
        unsafe {
            rec.gpu
                .vk()
                .cmd_copy_buffer(cmd, staged.buffer(), dst.buffer, &[region])
        };
        Ok(())
    })
}

/// Copy `len` bytes between pooled ranges, ordered on `stream`.
///
/// # Safety
///
/// As for `Backend::copy`: both memories alive on this device, each range inside its memory,
/// and no overlap within one memory.
pub(crate) unsafe fn copy(
    stream: &mut OpenStream,
    src: &VulkanMemory,
    src_offset: u64,
    dst: &VulkanMemory,
    dst_offset: u64,
    len: u64,
) -> Result<()> {
    stream.record(|rec| {
        let region = vk::BufferCopy {
            src_offset: src.offset + src_offset,
            dst_offset: dst.offset + dst_offset,
            size: len,
        };
        // SAFETY: the command buffer is recording. The Backend contract of `copy` puts both
        // ranges inside their live block buffers, not overlapping.
        unsafe {
            rec.gpu
                .vk()
                .cmd_copy_buffer(rec.encoder.cmd, src.buffer, dst.buffer, &[region])
        };
        Ok(())
    })
}

/// Read `out.len()` bytes at `offset` of `src` after the stream's work.
///
/// # Safety
///
/// As for `Backend::read`: `src` is alive on this device, the range inside it, and `stream`
/// not recording.
pub(crate) unsafe fn read(
    stream: &mut OpenStream,
    src: &VulkanMemory,
    offset: u64,
    out: &mut [u8],
) -> Result<()> {
    let len = out.len() as u64;
    let staged = if src.is_mapped() {
        None
    } else {
        Some(stream.record(|rec| {
            let staged = rec.arena.reserve(len, ALIGN)?;
            let region = vk::BufferCopy {
                src_offset: src.offset + offset,
                dst_offset: staged.offset(),
                size: len,
            };
            // SAFETY: the command buffer is recording; the Backend contract of `read` puts the
            // range inside `src`'s live buffer, and the staging range was just reserved.
            unsafe {
                rec.gpu.vk().cmd_copy_buffer(
                    rec.encoder.cmd,
                    src.buffer,
                    staged.buffer(),
                    &[region],
                )
            };
            Ok(staged)
        })?)
    };
    stream.flush()?;
    let waited = stream.wait_submitted();
    if let Some(deferred) = stream.take_deferred() {
        stream.reclaim();
        return Err(deferred);
    }
    if let Err(error) = waited {
        stream.reclaim();
        return Err(error);
    }
    let from = match &staged {
        // SAFETY: the stream is not recording, so the staging chunk went with its last
        // submission and stays mapped until the arena's next `reserve` or `take`.
        Some(staged) => Some(unsafe { staged.host() }),
        // SAFETY: the Backend contract of `read`: `src` is alive and `offset` inside it.
        None => unsafe { src.host(offset) },
    };
    let Some(from) = from else {
        return Err(Error::internal("memory is neither mapped nor staged"));
    };
    // SAFETY: the stream's work is complete and visible to the host. `from` points at `len`
    // mapped bytes nothing on the device touches until the next submission; `out` is disjoint.
    unsafe { std::ptr::copy_nonoverlapping(from, out.as_mut_ptr(), out.len()) };
    stream.reclaim();
    Ok(())
}
