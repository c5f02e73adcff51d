//! Read-back staging: the mapped buffer a read copies through, kept for the
//! next read, and a read in flight.
//!
//! A read's waiter owns its staging buffer while it waits without the lock,
//! so the stream's waiter holds a [`ReadBack`]. The stream sits below the
//! copies, so what it holds lives here, below both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use scope_core::Error;

use crate::device::Gpu;
use crate::error::{Sink, late_fault, lost_first, message, no_panic, out_of_memory, scoped};

/// Staging buffers up to this size are kept for the next read.
const KEEP_STAGING: u64 = 64 << 20;

/// The read-back buffer, reused while reads fit in it.
#[derive(Default)]
pub(crate) struct Staging {
    kept: Option<(wgpu::Buffer, u64)>,
}

impl Staging {
    /// A staging buffer of at least `len` bytes, and its size: the kept one if it fits.
    pub(crate) fn take(&mut self, gpu: &Gpu, len: u64) -> Result<(wgpu::Buffer, u64), Error> {
        if let Some((buffer, size)) = self.kept.take() {
            if size >= len {
                return Ok((buffer, size));
            }
            self.kept = Some((buffer, size));
        }
        let size = len.next_power_of_two().max(64 << 10);
        let device = &gpu.device;
        let (buffer, error) = scoped(device, || {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("scope read-back"),
                size,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        if let Some(error) = error {
            lost_first(device, &gpu.sink)?;
            return Err(out_of_memory(&error, size)
                .unwrap_or_else(|| late_fault("wgpu validation", message(&error))));
        }
        Ok((buffer, size))
    }

    /// Keep an unmapped staging buffer of a keeping size, if larger than the kept one.
    pub(crate) fn keep(&mut self, buffer: wgpu::Buffer, size: u64) {
        if size <= KEEP_STAGING && self.kept.as_ref().is_none_or(|(_, kept)| *kept < size) {
            self.kept = Some((buffer, size));
        }
    }

    /// Keep what a finished or abandoned read held, unless its map spoiled it.
    pub(crate) fn keep_back(&mut self, read: ReadBack) {
        if let Some((staging, size)) = read.give_back() {
            self.keep(staging, size);
        }
    }
}

/// How long a finished read waits for its map callback ([`ReadBack::until_mapped`]).
const MAP_GRACE: Duration = Duration::from_secs(10);

/// A read's copy into staging, submitted and mapped by `copy::begin_read`;
/// the waiter holds it while it waits.
pub struct ReadBack {
    staging: wgpu::Buffer,
    size: u64,
    len: u64,
    mapped: Arc<Mutex<Option<Result<(), wgpu::BufferAsyncError>>>>,
    map_error: Option<Error>,
}

impl ReadBack {
    /// Ask for the first `len` bytes of `staging` mapped, once the copy into
    /// it was submitted. A refused map is kept for [`copy_into`](Self::copy_into).
    pub(crate) fn map(device: &wgpu::Device, staging: wgpu::Buffer, size: u64, len: u64) -> Self {
        let mapped: Arc<Mutex<Option<Result<(), wgpu::BufferAsyncError>>>> = Arc::default();
        let answer = mapped.clone();
        let ((), map_error) = scoped(device, || {
            staging.map_async(wgpu::MapMode::Read, 0..len, move |result| {
                *answer.lock() = Some(result);
            });
        });
        Self {
            staging,
            size,
            len,
            mapped,
            map_error: map_error.map(|e| late_fault("wgpu map", message(&e))),
        }
    }

    /// Once its submission finished, wait for the map's callback. wgpu runs
    /// callbacks on whichever thread polls, so this thread's poll can return
    /// before another thread ran ours. So poll again until it ran, for at
    /// most [`MAP_GRACE`]; past it, [`copy_into`](Self::copy_into) reports no map.
    pub(crate) fn until_mapped(&self, device: &wgpu::Device, sink: &Sink) -> Result<(), Error> {
        if self.map_error.is_some() {
            return Ok(());
        }
        let until = Instant::now() + MAP_GRACE;
        while self.mapped.lock().is_none() && Instant::now() < until {
            let _ = no_panic(sink, "a device poll", || device.poll(wgpu::PollType::Poll))?;
            // A lost device runs no more callbacks: say so now.
            sink.check_lost()?;
            std::thread::sleep(Duration::from_micros(20));
        }
        Ok(())
    }

    /// Copy the mapped bytes into `out`.
    pub(crate) fn copy_into(&self, out: &mut [u8]) -> Result<(), Error> {
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
