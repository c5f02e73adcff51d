//! Host copies and device copies.
//!
//! - **Write**: `queue.write_buffer`. wgpu stages the bytes at once, so the
//!   caller's slice is only borrowed. They land at the start of the next
//!   submission, before its commands. So a write first submits the stream's
//!   open batch, whose launches must not see the new bytes.
//! - **Read**: `Backend::begin_read` appends a copy into a mapped-read
//!   staging buffer, submits and maps it, under the lock. `Backend::wait`
//!   polls without the lock, and `Backend::end_read` copies the bytes out.
//!   One submission and one wait carry the stream's work and the read. A
//!   read in flight owns its staging buffer, which is kept for the next read.
//! - **Copy**: `copy_buffer_to_buffer` in the open encoder, which closes the
//!   compute pass but does not submit. wgpu refuses a copy within one
//!   buffer, so that one goes through a [`bounce`] buffer.
//!
//! Each is a function of the stream's batch and the [`Submitter`] it submits
//! through, so the copies stand on the stream and name nothing above it. A
//! capture window's copies never come here: the `Backend` impl records them.
//!
//! Each runs inside error scopes. The `Backend` contract keeps every range in
//! its memory at 4-byte alignment, all wgpu asks of a copy. wgpu checks it
//! again, so a broken promise is a typed error, not undefined behaviour.

use scope_core::{Error, StreamId};

use crate::device::Gpu;
use crate::error::{lost_first, message, out_of_memory, scoped};
use crate::memory::{Memory, mark, tag_value};
use crate::staging::{ReadBack, Staging};
use crate::stream::{Batch, StreamWait, Submitter};

/// A buffer for a copy within one buffer to pass through, which wgpu
/// otherwise refuses. The encoder keeps it alive until the copies run.
pub(crate) fn bounce(device: &wgpu::Device, len: u64) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("scope copy within a buffer"),
        size: len,
        usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

fn copy_error(gpu: &Gpu, stream: StreamId, what: String, error: &wgpu::Error, len: u64) -> Error {
    if let Err(lost) = lost_first(&gpu.device, &gpu.sink) {
        return lost;
    }
    out_of_memory(error, len).unwrap_or_else(|| Error::Copy {
        what,
        stream,
        detail: message(error),
    })
}

/// Write `data` at `offset` of `dst` after `batch`'s work.
pub(crate) fn write(
    submitter: &mut Submitter<'_>,
    batch: &mut Batch,
    dst: &Memory,
    offset: u64,
    data: &[u8],
) -> Result<(), Error> {
    let gpu = submitter.gpu;
    gpu.sink.check_lost()?;
    if batch.is_open() {
        submitter.flush(batch)?;
    }
    let queue = &gpu.queue;
    let ((), error) = scoped(&gpu.device, || {
        queue.write_buffer(&dst.buffer, offset, data)
    });
    if let Some(error) = error {
        let what = format!("write of {} bytes at offset {offset}", data.len());
        return Err(copy_error(
            gpu,
            batch.stream,
            what,
            &error,
            data.len() as u64,
        ));
    }
    batch.writes_pending = true;
    Ok(())
}

/// Copy `len` bytes in `batch`, stream `s`'s.
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy(
    gpu: &Gpu,
    batch: &mut Batch,
    s: usize,
    src: &Memory,
    src_offset: u64,
    dst: &Memory,
    dst_offset: u64,
    len: u64,
) -> Result<(), Error> {
    gpu.sink.check_lost()?;
    let device = &gpu.device;
    let ((), error) = scoped(device, || {
        let bounce = (src.id == dst.id).then(|| bounce(device, len));
        let encoder = batch.encoder(device);
        match &bounce {
            None => {
                encoder.copy_buffer_to_buffer(&src.buffer, src_offset, &dst.buffer, dst_offset, len)
            }
            Some(bounce) => {
                encoder.copy_buffer_to_buffer(&src.buffer, src_offset, bounce, 0, len);
                encoder.copy_buffer_to_buffer(bounce, 0, &dst.buffer, dst_offset, len);
            }
        }
    });
    let tag = tag_value(s, batch.number);
    mark(&src.tag, tag);
    mark(&dst.tag, tag);
    if let Some(error) = error {
        let what = format!("copy of {len} bytes");
        return Err(copy_error(gpu, batch.stream, what, &error, len));
    }
    Ok(())
}

/// Begin a read of `len` bytes at `offset` of `src` after `batch`'s work:
/// copy into staging, submit, and map. The waiter waits for that
/// submission; [`end_read`] copies the bytes.
pub(crate) fn begin_read(
    submitter: &mut Submitter<'_>,
    batch: &mut Batch,
    staging: &mut Staging,
    src: &Memory,
    offset: u64,
    len: u64,
) -> Result<Option<StreamWait>, Error> {
    let gpu = submitter.gpu;
    gpu.sink.check_lost()?;
    if len == 0 {
        return submitter.begin_wait(batch);
    }
    let (buffer, size) = staging.take(gpu, len)?;
    let device = &gpu.device;
    let ((), error) = scoped(device, || {
        batch
            .encoder(device)
            .copy_buffer_to_buffer(&src.buffer, offset, &buffer, 0, len);
    });
    if let Some(error) = error {
        staging.keep(buffer, size);
        let what = format!("read of {len} bytes at offset {offset}");
        return Err(copy_error(gpu, batch.stream, what, &error, len));
    }
    // A failed flush drops the staging: the copy into it may have been submitted.
    submitter.flush(batch)?;
    let read = ReadBack::map(device, buffer, size, len);
    Ok(Some(submitter.waiter(batch, Some(read))))
}

/// Finish a read begun by [`begin_read`] once its wait succeeded: report
/// what surfaced, then copy the bytes into `out`.
pub(crate) fn end_read(
    submitter: &Submitter<'_>,
    batch: &mut Batch,
    staging: &mut Staging,
    waiter: Option<StreamWait>,
    out: &mut [u8],
) -> Result<(), Error> {
    let surfaced = submitter.surfaced(batch);
    let Some(read) = waiter.and_then(StreamWait::into_read) else {
        return surfaced.and(if out.is_empty() {
            Ok(())
        } else {
            Err(Error::internal("a wgpu read ended that never began"))
        });
    };
    let gpu = submitter.gpu;
    let copied = surfaced.and_then(|()| {
        read.copy_into(out).map_err(|error| {
            // A map that failed may be a device that went.
            lost_first(&gpu.device, &gpu.sink).err().unwrap_or(error)
        })
    });
    staging.keep_back(read);
    copied
}

/// A whole read of `out.len()` bytes at `offset` of `src`, waiting under the lock.
pub(crate) fn read(
    submitter: &mut Submitter<'_>,
    batch: &mut Batch,
    staging: &mut Staging,
    src: &Memory,
    offset: u64,
    out: &mut [u8],
) -> Result<(), Error> {
    let Some(waiter) = begin_read(submitter, batch, staging, src, offset, out.len() as u64)? else {
        return end_read(submitter, batch, staging, None, out);
    };
    match waiter.wait() {
        Ok(()) => end_read(submitter, batch, staging, Some(waiter), out),
        Err(error) => {
            if let Some(read) = waiter.into_read() {
                staging.keep_back(read);
            }
            Err(error)
        }
    }
}
