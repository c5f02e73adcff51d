//! Timelines: a timeline semaphore per stream, and bounded waits on several at once.
//!
//! A freed range ([`Stamp`]), a graph's replays, a stream's throttle and a recovery all wait
//! on these values. So the timeline sits below them all: the pool never names the stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use ash::vk;
use scope_core::{Error, Result};
use smallvec::SmallVec;

use crate::device::Gpu;
use crate::error::{Site, classify, fault};

/// One stream's timeline, shared with the pool so freed memory can wait for it.
pub(crate) struct Track {
    gpu: Arc<Gpu>,
    pub semaphore: vk::Semaphore,
    pub covering: AtomicU64,
    /// The value the last accepted submission signals; nothing may wait past it.
    pub submitted: AtomicU64,
    completed: AtomicU64,
    pub in_flight: AtomicUsize,
}

impl Track {
    /// A new timeline semaphore at 0 on `gpu`, with nothing submitted.
    pub(crate) fn new(gpu: &Arc<Gpu>) -> Result<Arc<Self>> {
        let mut kind = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let info = vk::SemaphoreCreateInfo::default().push_next(&mut kind);
        // SAFETY: valid create info on a live device.
        let semaphore = unsafe { gpu.vk().create_semaphore(&info, None) }
            .map_err(|e| classify(e, Site::Create, "timeline semaphore", 0))?;
        Ok(Arc::new(Self {
            gpu: gpu.clone(),
            semaphore,
            covering: AtomicU64::new(0),
            submitted: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }))
    }

    /// Whether the semaphore has reached `value`, asking the device only when needed.
    pub(crate) fn reached(&self, value: u64) -> bool {
        self.reached_cached(value) || self.refresh() >= value
    }

    pub(crate) fn reached_cached(&self, value: u64) -> bool {
        self.completed.load(Ordering::Acquire) >= value
    }

    /// Where the semaphore is now. A lost device answers 0, keeping waiters waiting.
    pub(crate) fn refresh(&self) -> u64 {
        // SAFETY: the semaphore is a live timeline semaphore of this device.
        let now = unsafe { self.gpu.vk().get_semaphore_counter_value(self.semaphore) }.unwrap_or(0);
        self.completed.fetch_max(now, Ordering::AcqRel).max(now)
    }
}

impl Drop for Track {
    fn drop(&mut self) {
        if self.gpu.is_hung() {
            return;
        }
        // SAFETY: its stream is gone and its work waited for (the device is not hung), so no
        // pending submission signals or waits on it.
        unsafe { self.gpu.vk().destroy_semaphore(self.semaphore, None) };
    }
}

/// Wait on the host until every track reaches its submitted value, bounded by the device's
/// wait timeout. Giving up on running work marks the device hung.
pub(crate) fn wait_tracks(gpu: &Gpu, waits: &[(Arc<Track>, u64)]) -> Result<()> {
    let (semaphores, values): (SmallVec<[vk::Semaphore; 2]>, SmallVec<[u64; 2]>) = waits
        .iter()
        .filter(|(track, value)| !track.reached(*value))
        .map(|(track, value)| (track.semaphore, *value))
        .unzip();
    if semaphores.is_empty() {
        return Ok(());
    }
    let info = vk::SemaphoreWaitInfo::default()
        .semaphores(&semaphores)
        .values(&values);
    let timeout = gpu.wait_timeout_ns;
    // SAFETY: live timeline semaphores, each waited to a value a submission signals.
    let result = match unsafe { gpu.vk().wait_semaphores(&info, timeout) } {
        Ok(()) => Ok(()),
        Err(vk::Result::TIMEOUT) => Err(fault(
            vk::Result::TIMEOUT,
            format!(
                "the work waited for did not finish within {} ms",
                timeout / 1_000_000
            ),
        )),
        Err(code) => Err(classify(code, Site::Wait, "vkWaitSemaphores", 0)),
    };
    if let Err(Error::Fault(fault)) = &result
        && !fault.class.poisons()
    {
        gpu.mark_hung();
    }
    result
}

/// The timeline values a freed range waits for, one per stream with work outstanding.
pub(crate) type Stamp = SmallVec<[(Arc<Track>, u64); 2]>;

/// What a range freed now must wait for: each stream's covering value not yet reached.
pub(crate) fn stamp_now(tracks: &[Arc<Track>]) -> Stamp {
    tracks
        .iter()
        .filter_map(|t| {
            let covering = t.covering.load(Ordering::Acquire);
            (!t.reached_cached(covering)).then(|| (t.clone(), covering))
        })
        .collect()
}
