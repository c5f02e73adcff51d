//! A scope server over raw Vulkan, through `ash` with a runtime-loaded `libvulkan`.
//!
//! The core's `Server<B>` keeps the failure model; this crate is the device calls, split as
//! the contract reads:
//!
//! - `device` ([`Config`]): the loader, instance, device choice, features and validation.
//! - `timeline`: a timeline semaphore per stream, and bounded host waits on them.
//! - `memory`: large blocks sub-allocated by offset; a free waits for the work using it.
//! - `command`: command buffers being recorded, and the sealed buffer a graph replays.
//! - `stream`: a command pool, a command buffer and a timeline semaphore, batched.
//! - `copy`: host writes in stream order, reads and device copies.
//! - `compile`: WGSL through naga to bounds-checked SPIR-V, pipelines cached by module.
//! - `launch`: the launch checks, descriptors or device addresses, and the dispatch.
//! - `capture`: a window records a command buffer that a replay resubmits.
//! - `error`: `VkResult` into the core's [`Error`](scope_core::Error), by call site.
//!
//! # What a kernel can reach
//!
//! WGSL is lowered with every index bounds-checked, and the device opens with
//! `robustBufferAccess` when offered. Otherwise a write past a binding could land in a
//! neighbour in the pool's shared `VkBuffer`, which the failure model believes untouched.
//! A SPIR-V kernel is the caller's promise, so building one is `unsafe`.
//!
//! # Launch checks and indirect counts
//!
//! `Backend::check_launch` refuses what the device's limits refuse, before the launch's scope
//! opens. The [`Error::InvalidArgument`](scope_core::Error::InvalidArgument) claims nothing.
//! **An indirect count past the device's limit runs nothing.** A guard kernel copies the counts
//! into a scratch slot, zeroed if any is past the limit, as wgpu's indirect validation does.
//!
//! # Bounded memory and bounded waits
//!
//! A stream keeps at most eight submissions in flight ([`Vulkan::batches_in_flight`]).
//! A host wait gives up after 120 s, or `SCOPE_VULKAN_WAIT_TIMEOUT_MS`, with a non-sticky
//! [`Error::Fault`](scope_core::Error::Fault). The work may still run, so the device is
//! marked hung: teardown leaks what the work may use rather than destroy it under the device.
//!
//! # Collectives
//!
//! Vulkan has no collective library, so a `Group` of these clients is host-staged (rule 45).
//! Its rounds drain the caller's stream, and none can be captured (rule 50).
//! Only a device transport overlaps its rounds with compute (rule 47).
//!
//! # Recovery
//!
//! `Client::recover` gives the lost device up, then calls `Backend::reopen`:
//!
//! 1. Wait, bounded, for each stream's submitted work.
//! 2. Destroy everything made on the device, in a valid order.
//! 3. Open a new `VkDevice` as the first was opened, then destroy the lost one.
//! 4. Give every stream a new command pool, timeline semaphore and arena.
//!
//! The lost device goes last, so the new handle always differs. Opening and destroying a device
//! take a process-wide lock: the Khronos loader corrupts its device list when two threads race.
//! A failed reopen leaves the backend closed until the next recovery.
//! The tests lose a device by an injected sticky fault; all that follows is real.
//!
//! # Validation
//!
//! [`Config::validation`] enables `VK_LAYER_KHRONOS_validation`, and
//! [`Vulkan::validation_messages`] returns what it reports. [`client`] enables it when
//! `SCOPE_VULKAN_VALIDATION=1`. Where the layer is missing the device opens without it,
//! unless CI requires it ([`validation_required_by`]).
//!
//! # What the core does not reach
//!
//! A write through `VulkanMemory::device_address` outside a launch is invisible to the core.

mod capture;
mod command;
mod compile;
mod copy;
mod device;
mod error;
mod launch;
mod memory;
mod stream;
mod timeline;

use std::sync::Arc;

use scope_core::backend::Launch;
use scope_core::{Backend, Client, Kernel, Kind, Language, Probe, Result};

pub use capture::VulkanGraph;
pub use compile::VulkanKernel;
pub use device::{
    Config, VALIDATION_LAYER_MISSING, device_count, validation_layer_installed,
    validation_required_by,
};
pub use memory::VulkanMemory;
pub use stream::{StreamWait, VulkanStream};

use compile::Pipelines;
use device::{Adapter, Gpu};
use memory::Pool;
use timeline::{Track, stamp_now};

/// The Vulkan backend: the device calls behind a [`Client<Vulkan>`].
pub struct Vulkan {
    /// The device and what was made on it; `None` while a failed recovery left it closed.
    open: Option<Open>,
    facts: Facts,
    config: Config,
    adapter: Arc<Adapter>,
    fail_reopen: Option<usize>,
}

/// An open device and the objects made on it. Field order is drop order: the device goes last.
struct Open {
    pipelines: Pipelines,
    pool: Pool,
    tracks: Vec<Arc<Track>>,
    gpu: Arc<Gpu>,
}

impl Open {
    fn new(gpu: Arc<Gpu>) -> Self {
        Self {
            pipelines: Pipelines::new(gpu.clone()),
            pool: Pool::new(gpu.clone()),
            tracks: Vec::new(),
            gpu,
        }
    }
}

struct Facts {
    launch: scope_core::LaunchLimits,
    max_allocation: u64,
    binding_alignment: u64,
    max_storage_range: u64,
    robust: bool,
}

impl Facts {
    fn of(open: &Open) -> Self {
        Self {
            launch: compile::launch_limits(&open.gpu),
            max_allocation: open.pool.largest(),
            binding_alignment: open.gpu.limits.min_storage_offset,
            max_storage_range: open.gpu.limits.max_storage_range,
            robust: open.gpu.robust,
        }
    }
}

impl Vulkan {
    /// Open a device as `config` says.
    ///
    /// # Errors
    ///
    /// [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable) without a usable
    /// device; [`Error::Refused`](scope_core::Error::Refused) when a required layer is missing.
    pub fn new(config: Config) -> Result<Self> {
        let adapter = Adapter::open(&config)?;
        let open = Open::new(Gpu::open(&adapter, &config)?);
        Ok(Self {
            facts: Facts::of(&open),
            open: Some(open),
            config,
            adapter,
            fail_reopen: None,
        })
    }

    fn open(&self) -> Result<&Open> {
        self.open.as_ref().ok_or_else(error::closed)
    }

    fn open_mut(&mut self) -> Result<&mut Open> {
        self.open.as_mut().ok_or_else(error::closed)
    }

    /// Every message the validation layer sent so far, draining them.
    pub fn validation_messages(&self) -> Vec<String> {
        std::mem::take(&mut *self.adapter.instance.messages.lock())
    }

    /// Whether the validation layer is asked for and installed.
    pub fn validating(&self) -> bool {
        self.adapter.instance.validation
    }

    /// The device's `maxComputeWorkGroupCount`.
    pub fn max_workgroups(&self) -> [u32; 3] {
        self.facts.launch.max_workgroups
    }

    /// The device's `maxStorageBufferRange`: the most bytes one binding may span.
    pub fn max_storage_buffer_range(&self) -> u64 {
        self.facts.max_storage_range
    }

    /// Whether `robustBufferAccess` is on, keeping stray accesses inside their binding.
    pub fn robust_buffer_access(&self) -> bool {
        self.facts.robust
    }

    /// Submissions on all streams not recycled yet: at most eight per stream.
    pub fn batches_in_flight(&self) -> usize {
        self.tracks()
            .iter()
            .map(|t| t.in_flight.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }

    /// How many streams have work the device has not finished. For tests.
    #[doc(hidden)]
    pub fn streams_with_work_outstanding(&self) -> usize {
        self.tracks()
            .iter()
            .filter(|t| !t.reached(t.covering.load(std::sync::atomic::Ordering::Acquire)))
            .count()
    }

    fn tracks(&self) -> &[Arc<Track>] {
        self.open.as_ref().map_or(&[], |open| &open.tracks)
    }

    /// The open device's handles for a raw baseline; `None` while it is closed.
    #[doc(hidden)]
    pub fn raw(&self) -> Option<RawDevice<'_>> {
        self.open.as_ref().map(|open| {
            let (device, push) = open.gpu.unguarded();
            RawDevice {
                device,
                push,
                queue: open.gpu.queue,
                family: open.gpu.family,
            }
        })
    }

    /// The pipeline and layout of a compiled kernel, for the raw baseline.
    #[doc(hidden)]
    pub fn raw_kernel(
        &mut self,
        kernel: &Kernel,
    ) -> Result<(ash::vk::Pipeline, ash::vk::PipelineLayout)> {
        let compiled = self.open_mut()?.pipelines.compile(kernel)?;
        Ok(compiled.raw())
    }

    fn close(&mut self, streams: &mut [&mut VulkanStream]) {
        if let Some(gpu) = self.give_up(streams) {
            Self::destroy(gpu);
        }
    }

    /// Wait, bounded, for the streams' work, then destroy all made on the device but the device.
    fn give_up(&mut self, streams: &mut [&mut VulkanStream]) -> Option<Arc<Gpu>> {
        let Some(open) = self.open.take() else {
            for stream in streams.iter_mut() {
                stream.close();
            }
            return None;
        };
        let waits: Vec<(Arc<Track>, u64)> = open
            .tracks
            .iter()
            .map(|t| {
                (
                    t.clone(),
                    t.submitted.load(std::sync::atomic::Ordering::Acquire),
                )
            })
            .collect();
        if let Err(error) = timeline::wait_tracks(&open.gpu, &waits) {
            tracing::warn!("waiting for the device before destroying it: {error}");
        }
        drop(waits);
        let Open {
            pipelines,
            mut pool,
            tracks,
            gpu,
        } = open;
        for stream in streams.iter_mut() {
            stream.close();
        }
        pool.reclaim();
        drop(pool);
        drop(pipelines);
        drop(tracks);
        Some(gpu)
    }

    fn destroy(gpu: Arc<Gpu>) {
        match Arc::try_unwrap(gpu) {
            Ok(gpu) => drop(gpu),
            Err(gpu) => tracing::error!(
                references = Arc::strong_count(&gpu),
                "an object of the lost device outlived its teardown; the device is destroyed \
                 when the last one goes"
            ),
        }
    }

    /// Make the next recovery fail: at `0` opening the device, at `n` on the `n`-th stream.
    /// Lavapipe never fails a recovery by itself.
    #[doc(hidden)]
    pub fn fail_next_reopen(&mut self, at: usize) {
        self.fail_reopen = Some(at);
    }

    fn open_again(&mut self, streams: &mut [&mut VulkanStream]) -> Result<()> {
        let fail = self.fail_reopen.take();
        let injected = |what: &str| {
            error::unavailable(format!(
                "{what} failed: injected by `Vulkan::fail_next_reopen`"
            ))
        };
        let gpu = match fail {
            Some(0) => Err(injected("opening the device again")),
            _ => Gpu::open(&self.adapter, &self.config),
        };
        let mut open = Open::new(gpu?);
        for index in 0..streams.len() {
            let made = if fail == Some(index + 1) {
                Err(injected("a stream's state on the new device"))
            } else {
                streams[index].open_on(&open.gpu)
            };
            match made {
                Ok(track) => open.tracks.push(track),
                Err(error) => {
                    self.open = Some(open);
                    self.close(streams);
                    return Err(error);
                }
            }
        }
        self.facts = Facts::of(&open);
        self.open = Some(open);
        Ok(())
    }
}

/// The device handles a raw-API baseline needs.
#[doc(hidden)]
pub struct RawDevice<'a> {
    /// The logical device.
    pub device: &'a ash::Device,
    /// The push-descriptor entry points.
    pub push: &'a ash::khr::push_descriptor::Device,
    /// The queue.
    pub queue: ash::vk::Queue,
    /// Its family.
    pub family: u32,
}

impl Drop for Vulkan {
    fn drop(&mut self) {
        if !self.config.fail_on_validation || std::thread::panicking() {
            return;
        }
        let messages = self.validation_messages();
        assert!(
            messages.is_empty(),
            "the Vulkan validation layer reported {} message(s):\n{}",
            messages.len(),
            messages.join("\n")
        );
    }
}

impl Backend for Vulkan {
    type Memory = VulkanMemory;
    type Stream = VulkanStream;
    type Kernel = VulkanKernel;
    type Graph = VulkanGraph;
    type Waiter = StreamWait;

    const KIND: Kind = Kind::Server(error::KIND);

    fn describe(&self) -> String {
        self.adapter.describe()
    }

    fn accepts(&self, language: Language) -> bool {
        matches!(language, Language::Wgsl | Language::SpirV)
    }

    /// The least of the heap, `maxMemoryAllocationSize` and `maxBufferSize`. A larger request
    /// is an invalid argument; within it, memory short now is out-of-memory (rule 37).
    fn max_allocation(&self) -> u64 {
        self.facts.max_allocation
    }

    fn binding_alignment(&self) -> u64 {
        self.facts.binding_alignment
    }

    fn launch_limits(&self) -> scope_core::LaunchLimits {
        self.facts.launch
    }

    unsafe fn create_stream(&mut self, id: scope_core::StreamId) -> Result<VulkanStream> {
        let open = self.open_mut()?;
        let stream = VulkanStream::new(&open.gpu, id)?;
        open.tracks.push(stream.track()?.clone());
        Ok(stream)
    }

    unsafe fn allocate(&mut self, _stream: &mut VulkanStream, size: u64) -> Result<VulkanMemory> {
        self.open_mut()?.pool.allocate(size)
    }

    unsafe fn free(&mut self, memory: VulkanMemory) {
        if let Some(open) = &mut self.open {
            let stamp = stamp_now(&open.tracks);
            open.pool.free(memory, stamp);
        }
    }

    fn trim(&mut self) {
        if let Some(open) = &mut self.open {
            open.pool.trim();
        }
    }

    fn bytes_reserved(&self) -> u64 {
        self.open.as_ref().map_or(0, |open| open.pool.reserved())
    }

    unsafe fn write(
        &mut self,
        stream: &mut VulkanStream,
        dst: &VulkanMemory,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        // SAFETY: the Backend contract of `write`: `dst` is alive and the range inside it.
        unsafe { copy::write(stream.state()?, dst, offset, data) }
    }

    unsafe fn read(
        &mut self,
        stream: &mut VulkanStream,
        src: &VulkanMemory,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        // SAFETY: the Backend contract of `read`: `src` is alive and the range inside it.
        unsafe { copy::read(stream.state()?, src, offset, out) }
    }

    unsafe fn copy(
        &mut self,
        stream: &mut VulkanStream,
        src: &VulkanMemory,
        src_offset: u64,
        dst: &VulkanMemory,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        // SAFETY: the Backend contract of `copy`: both memories alive, each range inside its
        // memory, no overlap within one memory.
        unsafe { copy::copy(stream.state()?, src, src_offset, dst, dst_offset, len) }
    }

    fn compile(&mut self, kernel: &Kernel) -> Result<VulkanKernel> {
        self.open_mut()?.pipelines.compile(kernel)
    }

    fn check_launch(&self, kernel: &VulkanKernel, launch: &Launch<'_, VulkanMemory>) -> Result<()> {
        launch::check(&self.open()?.gpu, kernel, launch)
    }

    unsafe fn launch(
        &mut self,
        stream: &mut VulkanStream,
        kernel: &VulkanKernel,
        launch: &Launch<'_, VulkanMemory>,
    ) -> Result<()> {
        let open = self.open_mut()?;
        let guard = match launch.dispatch {
            scope_core::backend::BoundDispatch::Indirect { .. } => Some(open.pipelines.guard()?),
            scope_core::backend::BoundDispatch::Groups(_) => None,
        };
        // SAFETY: the Backend contract of `launch`: all is alive, each binding inside its
        // memory at a `binding_alignment` offset, counts within limits; `pipelines` has the guard.
        unsafe { launch::launch(stream.state()?, kernel, guard.as_ref(), launch) }
    }

    unsafe fn flush(&mut self, stream: &mut VulkanStream) -> Result<()> {
        stream.state().map_or(Ok(()), |state| state.flush())
    }

    unsafe fn begin_wait(&mut self, stream: &mut VulkanStream) -> Result<Option<StreamWait>> {
        stream.state()?.begin_wait()
    }

    unsafe fn wait(waiter: &StreamWait) -> Result<()> {
        waiter.wait()
    }

    unsafe fn end_wait(&mut self, stream: &mut VulkanStream, _waiter: StreamWait) -> Result<()> {
        // A waiter ends before its device can close, so both are open here.
        let state = stream.state()?;
        state.reclaim();
        self.open_mut()?.pool.reclaim();
        state.take_deferred().map_or(Ok(()), Err)
    }

    unsafe fn order(&mut self, first: &mut VulkanStream, then: &mut VulkanStream) -> Result<()> {
        stream::OpenStream::order(first.state()?, then.state()?)
    }

    unsafe fn begin_capture(&mut self, stream: &mut VulkanStream) -> Result<()> {
        capture::begin(stream.state()?)
    }

    unsafe fn end_capture(&mut self, stream: &mut VulkanStream) -> Result<VulkanGraph> {
        capture::end(stream.state()?)
    }

    unsafe fn abort_capture(&mut self, stream: &mut VulkanStream) {
        if let Ok(state) = stream.state() {
            capture::abort(state);
        }
    }

    unsafe fn replay(&mut self, stream: &mut VulkanStream, graph: &VulkanGraph) -> Result<()> {
        capture::replay(stream.state()?, graph)
    }

    unsafe fn destroy_graph(&mut self, graph: VulkanGraph) -> Result<()> {
        capture::destroy(graph)
    }

    /// Destroy the device and open a new one (crate docs, "Recovery").
    unsafe fn reopen(
        &mut self,
        fault: &scope_core::Error,
        streams: &mut [&mut VulkanStream],
    ) -> Result<()> {
        tracing::info!(device = %self.adapter.name, "destroying the lost device to open it again: {fault}");
        let lost = self.give_up(streams);
        let opened = self.open_again(streams);
        if let Some(lost) = lost {
            Self::destroy(lost);
        }
        opened
    }
}

/// A client of a new Vulkan server on the chosen device.
///
/// # Errors
///
/// [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable) without a loader or
/// device; [`Error::Refused`](scope_core::Error::Refused) for a required layer missing.
pub fn client() -> Result<Client<Vulkan>> {
    client_with(Config {
        validation: validation_from_env(),
        ..Config::default()
    })
}

/// Whether `SCOPE_VULKAN_VALIDATION=1` asks [`client`] for the validation layer.
pub fn validation_from_env() -> bool {
    std::env::var("SCOPE_VULKAN_VALIDATION").is_ok_and(|v| v == "1")
}

/// A client of a new Vulkan server on device `index` of [`device_count`]; errors as [`client`].
pub fn client_on(index: usize) -> Result<Client<Vulkan>> {
    client_with(Config {
        validation: validation_from_env(),
        device: Some(index),
        ..Config::default()
    })
}

/// A client of a new Vulkan server opened as `config` says; errors as [`client`].
pub fn client_with(config: Config) -> Result<Client<Vulkan>> {
    Client::new(Vulkan::new(config)?)
}

/// The physical devices the loader sees, without opening one. Never panics.
pub fn probe() -> Probe {
    device::probe()
}
