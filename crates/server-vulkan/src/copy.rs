//! Host writes, host reads and device copies, each ordered on a stream.
//!
//! A host write is never a `memcpy` into mapped memory, even where memory is
//! mapped (lavapipe, unified memory): the stream may have batched work that
//! reads or writes those bytes and has not run yet, so the write must take
//! its place in the stream's order. Small writes (≤ 64 KiB) go into the
//! command buffer itself with `vkCmdUpdateBuffer`; larger ones are staged in
//! the stream's arena and copied. Either way a write inside a capture window
//! keeps its bytes for every replay.
//!
//! A read submits the stream's batch, waits for its timeline value, and then
//! copies out of the mapping — or, when device memory is not host-visible,
//! first copies the range into a staging chunk on the device.

use ash::vk;
use scope_core::{Error, Result};

use crate::memory::{ALIGN, Staged, VulkanMemory};
use crate::stream::VulkanStream;

/// The most `vkCmdUpdateBuffer` takes in one command.
const INLINE_WRITE: usize = 65536;

/// Write `data` at `offset` of `dst`, ordered on `stream`.
pub(crate) fn write(
    stream: &mut VulkanStream,
    dst: &VulkanMemory,
    offset: u64,
    data: &[u8],
) -> Result<()> {
    stream.record(|rec| {
        let target = dst.offset + offset;
        let cmd = rec.encoder.cmd;
        if data.len() <= INLINE_WRITE {
            // SAFETY: `cmd` is recording; the destination range lies in the
            // block buffer (the core checked it against the allocation),
            // offset and length are multiples of 4 (the core's copy
            // alignment) and the length is at most 64 KiB.
            unsafe {
                rec.gpu
                    .device
                    .cmd_update_buffer(cmd, dst.buffer, target, data)
            };
            return Ok(());
        }
        let staged = rec.arena.push(data, data.len() as u64, ALIGN)?;
        let region = vk::BufferCopy {
            src_offset: staged.offset,
            dst_offset: target,
            size: data.len() as u64,
        };
        // SAFETY: as above; the staging range holds the bytes and stays
        // alive until the submission (or graph) using it is gone.
        unsafe {
            rec.gpu
                .device
                .cmd_copy_buffer(cmd, staged.buffer, dst.buffer, &[region])
        };
        Ok(())
    })
}

/// Copy `len` bytes between pooled ranges, ordered on `stream`.
pub(crate) fn copy(
    stream: &mut VulkanStream,
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
        // SAFETY: the command buffer is recording; both ranges lie in their
        // block buffers (checked by the core) and do not overlap (the core
        // refuses overlapping copies within one buffer, and distinct
        // allocations are disjoint ranges of a block).
        unsafe {
            rec.gpu
                .device
                .cmd_copy_buffer(rec.encoder.cmd, src.buffer, dst.buffer, &[region])
        };
        Ok(())
    })
}

/// Read `out.len()` bytes at `offset` of `src` after the stream's work.
pub(crate) fn read(
    stream: &mut VulkanStream,
    src: &VulkanMemory,
    offset: u64,
    out: &mut [u8],
) -> Result<()> {
    let len = out.len() as u64;
    let staged = match src.host(offset) {
        Some(_) => None,
        None => Some(stream.record(|rec| {
            let staged = rec.arena.reserve(len, ALIGN)?;
            let region = vk::BufferCopy {
                src_offset: src.offset + offset,
                dst_offset: staged.offset,
                size: len,
            };
            // SAFETY: the command buffer is recording; the source range is
            // in the block (checked by the core), the staging range was just
            // reserved.
            unsafe {
                rec.gpu.device.cmd_copy_buffer(
                    rec.encoder.cmd,
                    src.buffer,
                    staged.buffer,
                    &[region],
                )
            };
            Ok(staged)
        })?),
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
    let Some(from) = staged
        .as_ref()
        .map(Staged::host)
        .or_else(|| src.host(offset))
    else {
        return Err(Error::internal("memory is neither mapped nor staged"));
    };
    // SAFETY: the stream's work is complete and its last barrier made the
    // writes visible to the host; `from` points at `len` mapped bytes (the
    // core checked the range; a staging reservation is `len` long) that
    // nothing on the device touches until more work is submitted, which
    // needs the server's lock we hold.
    unsafe { std::ptr::copy_nonoverlapping(from, out.as_mut_ptr(), out.len()) };
    stream.reclaim();
    Ok(())
}
