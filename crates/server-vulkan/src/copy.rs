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

use crate::memory::{ALIGN, VulkanMemory};
use crate::stream::OpenStream;

/// The most `vkCmdUpdateBuffer` takes in one command.
const INLINE_WRITE: usize = 65536;

/// Write `data` at `offset` of `dst`, ordered on `stream`.
///
/// # Safety
///
/// As for `Backend::write`: `dst` was allocated on `stream`'s device and is
/// alive, and `offset..offset + data.len()` lies inside it, both multiples
/// of 4.
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
            // SAFETY: `cmd` is recording. The Backend contract of `write`:
            // `offset..offset + data.len()` lies inside `dst`, which is that
            // many bytes at `dst.offset` of its live block buffer, and both
            // are multiples of 4; the length is at most 64 KiB.
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
        // SAFETY: as above for the destination (the Backend contract of
        // `write`); the staging range holds the bytes and its chunk stays
        // alive until the submission (or graph) using it is gone.
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
/// As for `Backend::copy`: `src` and `dst` were allocated on `stream`'s
/// device and are alive, each range lies inside its memory, and the two do
/// not overlap when they are one memory.
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
        // SAFETY: the command buffer is recording. The Backend contract of
        // `copy`: `src_offset..src_offset + len` lies inside `src` and
        // `dst_offset..dst_offset + len` inside `dst`, so both lie in their
        // live block buffers, and they do not overlap within one memory;
        // distinct live allocations are disjoint ranges of a block.
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
/// As for `Backend::read`: `src` was allocated on `stream`'s device and is
/// alive, `offset..offset + out.len()` lies inside it, and `stream` is not
/// recording (so the staging copy goes into the batch submitted here).
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
            // SAFETY: the command buffer is recording. The Backend contract
            // of `read`: `offset..offset + len` lies inside `src`, so in its
            // live block buffer; the staging range of `len` bytes was just
            // reserved.
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
        // SAFETY: the stream is not recording (this function's contract),
        // so the staging chunk went with the stream's last submission and
        // was at most recycled since (if the stream found that submission
        // done), which leaves it mapped until the arena's next `reserve` or
        // `take`; nothing was recorded or submitted after the copy into it.
        Some(staged) => Some(unsafe { staged.host() }),
        // SAFETY: the Backend contract of `read`: `src` is alive and
        // `offset` is inside it.
        None => unsafe { src.host(offset) },
    };
    let Some(from) = from else {
        return Err(Error::internal("memory is neither mapped nor staged"));
    };
    // SAFETY: the stream's work is complete and its last barrier made the
    // writes visible to the host; `from` points at `len` mapped bytes (the
    // Backend contract of `read` puts `offset..offset + len` inside `src`;
    // a staging reservation is `len` long) that nothing on the device
    // touches until more work is submitted, which needs the backend that
    // `Backend::read`'s caller holds by `&mut`; `out` is the caller's
    // slice, outside every mapping.
    unsafe { std::ptr::copy_nonoverlapping(from, out.as_mut_ptr(), out.len()) };
    stream.reclaim();
    Ok(())
}
