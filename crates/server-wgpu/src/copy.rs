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
//! Each runs inside error scopes. The `Backend` contract keeps every range in
//! its memory at 4-byte alignment, all wgpu asks of a copy. wgpu checks it
//! again, so a broken promise is a typed error, not undefined behaviour.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use scope_core::Error;

use crate::error::{late_fault, lost_first, message, out_of_memory, scoped};
use crate::memory::{Memory, mark, tag_value};
use crate::stream::StreamWait;

/// Staging buffers up to this size are kept for the next read.
const KEEP_STAGING: u64 = 64 << 20;

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

impl crate::Wgpu {
    fn copy_error(&self, s: usize, what: String, error: &wgpu::Error, len: u64) -> Error {
        if let Err(lost) = lost_first(&self.gpu.device, &self.gpu.sink) {
            return lost;
        }
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

    /// A staging buffer of at least `len` bytes, and its size: the kept one if it fits.
    fn take_staging(&mut self, len: u64) -> Result<(wgpu::Buffer, u64), Error> {
        if let Some((buffer, size)) = self.staging.take() {
            if size >= len {
                return Ok((buffer, size));
            }
            self.staging = Some((buffer, size));
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
            lost_first(device, &self.gpu.sink)?;
            return Err(out_of_memory(&error, size)
                .unwrap_or_else(|| late_fault("wgpu validation", message(&error))));
        }
        Ok((buffer, size))
    }

    /// Keep an unmapped staging buffer of a keeping size, if larger than the kept one.
    fn keep_staging(&mut self, buffer: wgpu::Buffer, size: u64) {
        if size <= KEEP_STAGING && self.staging.as_ref().is_none_or(|(_, kept)| *kept < size) {
            self.staging = Some((buffer, size));
        }
    }

    /// Begin a read of `len` bytes at `offset` of `src` after stream `s`'s
    /// work: copy into staging, submit, and map. The waiter waits for that
    /// submission; [`end_read_now`](Self::end_read_now) copies the bytes.
    pub(crate) fn begin_read_now(
        &mut self,
        s: usize,
        src: &Memory,
        offset: u64,
        len: u64,
    ) -> Result<Option<StreamWait>, Error> {
        self.gpu.sink.check_lost()?;
        if len == 0 {
            let (mut submitter, streams) = self.submitter();
            return submitter.begin_wait(&mut streams[s]);
        }
        let (staging, size) = self.take_staging(len)?;
        let device = &self.gpu.device;
        let batch = &mut self.streams[s];
        let ((), error) = scoped(device, || {
            batch
                .encoder(device)
                .copy_buffer_to_buffer(&src.buffer, offset, &staging, 0, len);
        });
        if let Some(error) = error {
            self.keep_staging(staging, size);
            return Err(self.copy_error(
                s,
                format!("read of {len} bytes at offset {offset}"),
                &error,
                len,
            ));
        }
        let (mut submitter, streams) = self.submitter();
        let batch = &mut streams[s];
        // A failed flush drops the staging: the copy into it may have been submitted.
        submitter.flush(batch)?;
        let mapped: Arc<Mutex<Option<Result<(), wgpu::BufferAsyncError>>>> = Arc::default();
        let answer = mapped.clone();
        let device = &submitter.gpu.device;
        let ((), map_error) = scoped(device, || {
            staging.map_async(wgpu::MapMode::Read, 0..len, move |result| {
                *answer.lock() = Some(result);
            });
        });
        Ok(Some(submitter.waiter(
            batch,
            Some(ReadBack {
                staging,
                size,
                len,
                mapped,
                map_error: map_error.map(|e| late_fault("wgpu map", message(&e))),
            }),
        )))
    }

    /// Finish a read begun by [`begin_read_now`](Self::begin_read_now) once its
    /// wait succeeded: report what surfaced, then copy the bytes into `out`.
    pub(crate) fn end_read_now(
        &mut self,
        s: usize,
        waiter: Option<StreamWait>,
        out: &mut [u8],
    ) -> Result<(), Error> {
        let (submitter, streams) = self.submitter();
        let surfaced = submitter.surfaced(&mut streams[s]);
        let Some(read) = waiter.and_then(StreamWait::into_read) else {
            return surfaced.and(if out.is_empty() {
                Ok(())
            } else {
                Err(Error::internal("a wgpu read ended that never began"))
            });
        };
        let copied = surfaced.and_then(|()| {
            read.copy_into(out).map_err(|error| {
                // A map that failed may be a device that went.
                lost_first(&self.gpu.device, &self.gpu.sink)
                    .err()
                    .unwrap_or(error)
            })
        });
        if let Some((staging, size)) = read.give_back() {
            self.keep_staging(staging, size);
        }
        copied
    }

    /// Recycle what an abandoned read's waiter holds (`Backend::end_wait`).
    pub(crate) fn abandon_read(&mut self, read: ReadBack) {
        if let Some((staging, size)) = read.give_back() {
            self.keep_staging(staging, size);
        }
    }

    /// A whole read of `out.len()` bytes at `offset` of `src`, waiting under the lock.
    pub(crate) fn read_now(
        &mut self,
        s: usize,
        src: &Memory,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), Error> {
        let Some(waiter) = self.begin_read_now(s, src, offset, out.len() as u64)? else {
            return self.end_read_now(s, None, out);
        };
        match waiter.wait() {
            Ok(()) => self.end_read_now(s, Some(waiter), out),
            Err(error) => {
                if let Some(read) = waiter.into_read() {
                    self.abandon_read(read);
                }
                Err(error)
            }
        }
    }
}

/// How long a finished read waits for its map callback ([`ReadBack::until_mapped`]).
const MAP_GRACE: Duration = Duration::from_secs(10);

/// A read's copy into staging, submitted and mapped by
/// [`Wgpu::begin_read_now`]; the waiter holds it while it waits.
pub struct ReadBack {
    staging: wgpu::Buffer,
    size: u64,
    len: u64,
    mapped: Arc<Mutex<Option<Result<(), wgpu::BufferAsyncError>>>>,
    map_error: Option<Error>,
}

impl ReadBack {
    /// Once its submission finished, wait for the map's callback. wgpu runs
    /// callbacks on whichever thread polls, so this thread's poll can return
    /// before another thread ran ours. So poll again until it ran, for at
    /// most [`MAP_GRACE`]; past it, [`copy_into`](Self::copy_into) reports no map.
    pub(crate) fn until_mapped(
        &self,
        device: &wgpu::Device,
        sink: &crate::error::Sink,
    ) -> Result<(), Error> {
        if self.map_error.is_some() {
            return Ok(());
        }
        let until = Instant::now() + MAP_GRACE;
        while self.mapped.lock().is_none() && Instant::now() < until {
            let _ = crate::error::no_panic(sink, "a device poll", || {
                device.poll(wgpu::PollType::Poll)
            })?;
            // A lost device runs no more callbacks: say so now.
            sink.check_lost()?;
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(())
    }

    /// Copy the mapped bytes into `out`.
    fn copy_into(&self, out: &mut [u8]) -> Result<(), Error> {
        if let Some(error) = &self.map_error {
            return Err(error.clone());
        }
        if out.len() as u64 != self.len {
            return Err(Error::internal(format!(
                "a {}-byte wgpu read finished into {} bytes",
                self.len,
                out.len()
            )));
        }
        match self.mapped.lock().as_ref() {
            Some(Ok(())) => {}
            Some(Err(error)) => return Err(late_fault("wgpu map", error.to_string())),
            None => {
                return Err(late_fault(
                    "wgpu map",
                    "the read-back never mapped".to_owned(),
                ));
            }
        }
        match self.staging.get_mapped_range(0..self.len) {
            Ok(view) => {
                out.copy_from_slice(&view);
                Ok(())
            }
            Err(error) => Err(late_fault("wgpu map", error.to_string())),
        }
    }

    /// The staging buffer, unmapped, unless a pending or failed map spoiled it.
    fn give_back(self) -> Option<(wgpu::Buffer, u64)> {
        if self.map_error.is_some() || !matches!(self.mapped.lock().as_ref(), Some(Ok(()))) {
            return None;
        }
        self.staging.unmap();
        Some((self.staging, self.size))
    }
}
