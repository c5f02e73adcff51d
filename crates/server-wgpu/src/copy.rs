//! Host copies and device copies.
//!
//! - **Write**: `queue.write_buffer`. wgpu stages the bytes at once (so the
//!   caller's slice is only borrowed) and copies them at the start of the
//!   next submission — before that submission's commands. So a write first
//!   submits the stream's open batch: the stream's earlier launches must not
//!   see the new bytes.
//! - **Read**: a copy into a mapped-read staging buffer is appended to the
//!   stream's batch, the batch is submitted, the staging buffer is mapped
//!   with `map_async`, and the device is polled until that submission is
//!   done. The staging buffer is kept and reused while reads fit in it.
//! - **Copy**: `copy_buffer_to_buffer` in the stream's open encoder, which
//!   closes the open compute pass (a pass cannot hold copies) but does not
//!   submit. wgpu refuses a copy within one buffer, so that one goes through
//!   a [`bounce`] buffer of its own.
//!
//! Each is inside error scopes; the core has already checked ranges and
//! 4-byte alignment, which is all wgpu asks of a buffer copy.

use std::sync::Arc;

use parking_lot::Mutex;
use scope_core::Error;

use crate::error::{late_fault, message, out_of_memory, scoped};
use crate::memory::{Memory, mark, tag_value};

/// Staging buffers up to this size are kept for the next read.
const KEEP_STAGING: u64 = 64 << 20;

/// A buffer for a copy within one buffer to pass through: wgpu refuses a
/// copy whose source and destination are the same buffer, and the contract
/// allows one whose ranges do not overlap. The encoder keeps it alive until
/// the copies have run.
pub(crate) fn bounce(device: &wgpu::Device, len: u64) -> wgpu::Buffer {
    device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("scope copy within a buffer"),
        size: len,
        usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    })
}

impl crate::Wgpu {
    fn copy_error(&self, s: usize, what: String, error: &wgpu::Error, len: u64) -> Error {
        out_of_memory(error, len).unwrap_or_else(|| Error::Copy {
            what,
            stream: self.streams[s].stream,
            detail: message(error),
        })
    }

    /// Write `data` at `offset` of `dst` on stream `s`.
    pub(crate) fn write_now(
        &mut self,
        s: usize,
        dst: &Memory,
        offset: u64,
        data: &[u8],
    ) -> Result<(), Error> {
        self.gpu.sink.check_lost()?;
        if self.streams[s].recording.is_some() {
            self.record_write(s, dst, offset, data);
            return Ok(());
        }
        if self.streams[s].is_open() {
            self.flush_stream(s)?;
        }
        let queue = &self.gpu.queue;
        let ((), error) = scoped(&self.gpu.device, || {
            queue.write_buffer(&dst.buffer, offset, data)
        });
        if let Some(error) = error {
            let what = format!("write of {} bytes at offset {offset}", data.len());
            return Err(self.copy_error(s, what, &error, data.len() as u64));
        }
        self.streams[s].writes_pending = true;
        Ok(())
    }

    /// Copy `len` bytes on stream `s`.
    pub(crate) fn copy_now(
        &mut self,
        s: usize,
        src: &Memory,
        src_offset: u64,
        dst: &Memory,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), Error> {
        self.gpu.sink.check_lost()?;
        if self.streams[s].recording.is_some() {
            self.record_copy(s, src, src_offset, dst, dst_offset, len);
            return Ok(());
        }
        let device = &self.gpu.device;
        let batch = &mut self.streams[s];
        let ((), error) = scoped(device, || {
            let bounce = (src.id == dst.id).then(|| bounce(device, len));
            let encoder = batch.encoder(device);
            match &bounce {
                None => encoder.copy_buffer_to_buffer(
                    &src.buffer,
                    src_offset,
                    &dst.buffer,
                    dst_offset,
                    len,
                ),
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
            return Err(self.copy_error(s, what, &error, len));
        }
        Ok(())
    }

    /// The staging buffer for a read of `len` bytes.
    fn staging(&mut self, len: u64) -> Result<wgpu::Buffer, Error> {
        if let Some((buffer, size)) = &self.staging
            && *size >= len
        {
            return Ok(buffer.clone());
        }
        let size = len.next_power_of_two().max(64 << 10);
        let device = &self.gpu.device;
        let (buffer, error) = scoped(device, || {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("scope read-back"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        if let Some(error) = error {
            return Err(out_of_memory(&error, size)
                .unwrap_or_else(|| late_fault("wgpu validation", message(&error))));
        }
        if size <= KEEP_STAGING {
            self.staging = Some((buffer.clone(), size));
        }
        Ok(buffer)
    }

    /// Read `out.len()` bytes at `offset` of `src` after stream `s`'s work.
    pub(crate) fn read_now(
        &mut self,
        s: usize,
        src: &Memory,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), Error> {
        self.gpu.sink.check_lost()?;
        let len = out.len() as u64;
        if len == 0 {
            return Ok(());
        }
        let staging = self.staging(len)?;
        let device = &self.gpu.device;
        let batch = &mut self.streams[s];
        let ((), error) = scoped(device, || {
            batch
                .encoder(device)
                .copy_buffer_to_buffer(&src.buffer, offset, &staging, 0, len);
        });
        if let Some(error) = error {
            return Err(self.copy_error(
                s,
                format!("read of {len} bytes at offset {offset}"),
                &error,
                len,
            ));
        }
        let (mut submitter, streams) = self.submitter();
        let batch = &mut streams[s];
        submitter.flush(batch)?;
        let mapped: Arc<Mutex<Option<Result<(), wgpu::BufferAsyncError>>>> = Arc::default();
        let answer = mapped.clone();
        let device = &submitter.gpu.device;
        let ((), error) = scoped(device, || {
            staging.map_async(wgpu::MapMode::Read, 0..len, move |result| {
                *answer.lock() = Some(result);
            });
        });
        let waited = submitter.wait(batch.last_submission.clone());
        // Whatever else surfaced belongs to the batch, and so to this read.
        let surfaced = submitter.surfaced(batch);
        let result = mapped.lock().take();
        let unmap = |staging: &wgpu::Buffer| {
            if matches!(result, Some(Ok(()))) {
                staging.unmap();
            }
        };
        if let Some(error) = error {
            unmap(&staging);
            return Err(late_fault("wgpu map", message(&error)));
        }
        if let Err(error) = waited.and(surfaced) {
            unmap(&staging);
            return Err(error);
        }
        match result {
            Some(Ok(())) => {}
            Some(Err(error)) => return Err(late_fault("wgpu map", error.to_string())),
            None => {
                return Err(late_fault(
                    "wgpu map",
                    "the read-back never mapped".to_owned(),
                ));
            }
        }
        let copied = match staging.get_mapped_range(0..len) {
            Ok(view) => {
                out.copy_from_slice(&view);
                Ok(())
            }
            Err(error) => Err(late_fault("wgpu map", error.to_string())),
        };
        staging.unmap();
        copied
    }
}
