//! A scope server over raw Vulkan, through `ash` with a runtime-loaded
//! `libvulkan`.
//!
//! The core's `Server<B>` keeps every rule of the
//! failure model; this crate is the device calls, split the way the
//! contract reads:
//!
//! - `device` ([`Config`]): the loader, instance, device choice
//!   (discrete > integrated > virtual > CPU, or `SCOPE_VULKAN_DEVICE` by
//!   index or name) — kept for the server's life, so that a recovery opens
//!   the same device again — the compute queue, `bufferDeviceAddress` when offered,
//!   the optional kernel features when offered (`f64`, `i64`, `f16` with
//!   16-bit storage, subgroup operations, `f32` atomics through
//!   `VK_EXT_shader_atomic_float`; reported in `launch_limits`), and the
//!   validation layer's messages.
//! - `memory`: a pool of large blocks, each one `VkDeviceMemory` under one
//!   `VkBuffer`, sub-allocated by offset, with frees held back until the
//!   work using them completed; host-visible arenas for staging and scalar
//!   blobs.
//! - `stream`: a logical stream is a command pool, a current command buffer
//!   and a timeline semaphore on the device's one queue; work is batched
//!   and submitted on sync, on read, at a batch limit, or when another
//!   stream must wait for it; a replay is batched like other work (the
//!   core flushes every stream before a graph is destroyed). The module
//!   docs argue the mapping.
//! - `copy`: host writes (inline or staged, always in stream order), reads
//!   and device copies.
//! - `compile`: WGSL through naga 30 to SPIR-V (bounds-checked), SPIR-V to
//!   pipelines with push-descriptor layouts, cached by module. SPIR-V that
//!   reaches its buffers by device address (what cubecl emits; see
//!   `scope-cube`) is recognised from the module, and its kernel told to
//!   take addresses instead of descriptors.
//! - `launch`: the launch checks and the recording of a launch — pushed
//!   descriptors, or for a device-address kernel the bindings' and the
//!   scalar blob's addresses as push constants or, when they do not fit
//!   there, as a uniform table staged with the launch (same bindings, same
//!   access, so the same read and write sets) — and the dispatch.
//! - `capture`: a window records into a simultaneous-use command buffer
//!   that a replay resubmits without re-recording; a host write inside a
//!   window keeps its bytes for every replay.
//! - `error`: `VkResult` into the core's [`Error`](scope_core::Error), by
//!   call site: out-of-memory is not sticky, device loss is.
//!
//! # What a kernel can reach
//!
//! A WGSL kernel is lowered with every index bounds-checked (naga's
//! `Restrict` policy) and the device is opened with `robustBufferAccess`
//! when it offers it, so an out-of-bounds index stays inside the kernel's
//! own binding: the pool sub-allocates many buffers from one `VkBuffer`,
//! and a write past a binding would otherwise land in a neighbour that the
//! failure model believes untouched. A SPIR-V kernel is the caller's
//! promise (building one is `unsafe`): invalid SPIR-V is undefined
//! behaviour in Vulkan, and no server can check arbitrary SPIR-V.
//!
//! # Launch checks and indirect counts
//!
//! A launch the device's limits refuse — a binding count that does not
//! match the kernel's layout, a binding past `maxStorageBufferRange`, a
//! host-side workgroup count past `maxComputeWorkGroupCount` — is refused
//! by `Backend::check_launch` before the core opens the launch's scope: an
//! [`Error::InvalidArgument`](scope_core::Error::InvalidArgument) naming
//! what was wrong, which claims nothing. A kernel whose layout is past
//! `maxPushDescriptors` does not compile.
//!
//! **An indirect count past the device's limit runs nothing.** Counts in
//! device memory are bounded on the device, before the dispatch reads
//! them: a one-invocation guard kernel copies them into a scratch slot,
//! zeroing all three if any is past `maxComputeWorkGroupCount`, and the
//! dispatch reads the slot. This is what wgpu's indirect validation does,
//! so the two servers agree.
//!
//! # Memory in a loop that only launches
//!
//! A stream keeps at most eight submissions in flight: each submission
//! recycles the command buffers and staging chunks of those that completed,
//! and a ninth waits for the oldest. A runtime that launches millions of
//! times without a sync runs in bounded memory
//! ([`Vulkan::batches_in_flight`]).
//!
//! # Waits and a device that never finishes
//!
//! A host wait (a sync, a read, a stream throttled at eight submissions, a
//! graph's destruction) gives up after 120 s, or after
//! `SCOPE_VULKAN_WAIT_TIMEOUT_MS`, with a non-sticky
//! [`Error::Fault`](scope_core::Error::Fault) (`VK_TIMEOUT`) that the core
//! attributes to the work in flight. The work may still be running then, so
//! the device is marked hung: dropping the server afterwards leaks what that
//! work may use — command pools, staging, graphs, pipelines, pooled memory,
//! the device itself — with an error in the log, instead of destroying it
//! under the device or blocking forever in `vkDeviceWaitIdle`.
//!
//! # Collectives
//!
//! Neither Vulkan nor WebGPU has a collective library, so a `Group` of
//! these clients is host-staged (rule 45): each round reads every rank's
//! input to the host, waiting for the work that wrote it, and writes the
//! result back. Its rounds drain the caller's stream, and none can be
//! recorded into a capture (rule 50). Only a device transport (NCCL,
//! RCCL) overlaps its rounds with compute (rule 47).
//!
//! # Recovery: the device destroyed and opened again
//!
//! `Client::recover` gives a lost device up (the core frees every
//! allocation, destroys every graph, drops every kernel) and then asks the
//! backend to open it again (`Backend::reopen`). Here that is:
//!
//! 1. **Wait**, with the server's own bounded wait, for each stream's
//!    submitted work: a lost device answers `VK_ERROR_DEVICE_LOST` at once;
//!    a healthy one finishes. A wait that gives up marks the device hung,
//!    and what follows leaks instead of destroying, as at any teardown.
//! 2. **Destroy everything made on the device**, in a valid order: each
//!    stream's command pool (its batch command buffers), the staging chunks
//!    and replayed graphs its submissions held, its arena; then the pool's
//!    blocks, the ranges whose frees were deferred behind work among them;
//!    then the pipelines and their layouts; then the timeline semaphores.
//! 3. **Open a new `VkDevice`** on the same physical device, with the same
//!    queue family, features and extensions, by the function that opened
//!    the first (the limits and features are asked again), and only then
//!    destroy the lost one: the two are never one object, so the new
//!    handle differs (a `VkDevice` is a pointer, which the allocator could
//!    otherwise hand out again).
//! 4. **Give every stream new state** in place: a command pool, a timeline
//!    semaphore and an arena on the new device, not recording. Kernels
//!    compile again on first use, the indirect-count guard too.
//!
//! The instance, the validation layer's messenger and the messages it
//! collected carry over. Creating the new device and destroying the lost
//! one take a process-wide lock, so a recovery never runs either beside
//! another server's open or drop on another thread: the Khronos loader
//! corrupts its device list when two threads do (and, while the validation
//! layer is loaded, every call of the crate holds the same lock's read
//! side, because the layer's handle lookup races with both; see
//! `device/lifecycle.rs`). If the new device cannot be opened, or a stream
//! cannot get its state on it, what was made is destroyed again, the error
//! is returned, and the backend stays closed — no device, no stream state,
//! `Vulkan::raw` answers `None` — until the next recovery opens it.
//! Meanwhile the core asks it nothing but that recovery's flush of every
//! stream, which a closed stream answers with nothing to submit.
//!
//! **What is real and what is injected.** Lavapipe cannot lose a device on
//! demand, so the tests lose it with an injected sticky fault: the core's
//! fault plan poisons the server while the device itself is fine, and its
//! work in flight finishes. Everything after that is real: the wait, the
//! teardown, `vkDestroyDevice`, `vkCreateDevice` and the work that runs on
//! the new device, under the validation layer, which reports any object
//! left on a device when it is destroyed and fails the test
//! (`tests/recover.rs`; the core's `recover_tests!` behaviours in
//! `tests/conformance.rs`; `tests/hung_recover.rs` for a device whose
//! kernel never finishes, which is leaked after the wait gives up). A real
//! `VK_ERROR_DEVICE_LOST` takes the same path, but what a driver answers on
//! a device it really lost (every wait failing at once) is not exercised
//! here.
//!
//! # Validation
//!
//! [`Config::validation`] enables `VK_LAYER_KHRONOS_validation` and
//! collects every warning and error it reports;
//! [`Vulkan::validation_messages`] returns them. The crate's tests run with
//! it and [`Config::fail_on_validation`], so any message fails the test.
//! [`client`] enables it only when `SCOPE_VULKAN_VALIDATION=1`.
//!
//! Where the layer is not installed, asking for it opens the device
//! without it ([`Vulkan::validating`] is false), and the tests that promise
//! validation print `skipped: VK_LAYER_KHRONOS_validation is not installed
//! (apt-get install vulkan-validationlayers)` instead of passing. Under CI
//! (`CI=true`) or with `SCOPE_REQUIRE` naming vulkan the layer is a
//! requirement: asking for it where it is missing is
//! [`Error::Refused`](scope_core::Error::Refused), naming the layer and the
//! package, so those tests — and the cubecl row that sets
//! `SCOPE_VULKAN_VALIDATION=1` — fail rather than run unvalidated
//! ([`validation_required_by`]).
//!
//! One test runs without it on purpose: garbage SPIR-V. The layer (1.3.239
//! here) reports the module and then fails on it itself — a C++ exception
//! through the Vulkan call, which aborts the process, or unbounded
//! allocation — so the driver's own rejection (`VK_ERROR_UNKNOWN` from
//! lavapipe, mapped to `Error::Compile`) is tested with the layer off.
//!
//! # What the core does not reach
//!
//! `VulkanMemory::device_address` gives a buffer device address, which a
//! runtime reaches through `Client::with_memory`. Writes made through such
//! an address outside a launch are invisible to the failure model; inside a
//! launch, the device-address interface keeps every address a binding.

mod capture;
mod compile;
mod copy;
mod device;
mod error;
mod launch;
mod memory;
mod stream;

use std::sync::Arc;

use scope_core::backend::Launch;
use scope_core::{Backend, Client, Kernel, Language, Probe, Result};

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
use memory::{Pool, stamp_now};
use stream::Track;

/// The Vulkan backend: the device calls behind a [`Client<Vulkan>`].
pub struct Vulkan {
    /// The device and what was made on it; `None` while it is closed: a
    /// recovery destroyed the lost device and could not open another
    /// (`Backend::reopen`), and the next recovery tries again.
    open: Option<Open>,
    /// What the device last opened reports, asked through `Backend` and
    /// the accessors below; kept while it is closed.
    facts: Facts,
    config: Config,
    adapter: Arc<Adapter>,
    /// Where the next recovery fails on purpose ([`Vulkan::fail_next_reopen`]).
    fail_reopen: Option<usize>,
}

/// An open device and the objects made on it, all of which must go before
/// it. Field order is drop order: pipelines and the pool wait for the
/// device and release their objects, then the streams' semaphores, then
/// (with the last `Arc<Gpu>`, once every stream let go of its own) the
/// device.
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

/// The device's answers the core and the accessors ask for, from the
/// device last opened.
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

/// What a call needing the device answers while it is closed. The core
/// asks nothing of a server whose recovery failed but the next recovery,
/// so only a caller outside it meets this.
fn closed() -> scope_core::Error {
    scope_core::Error::refused(
        "the Vulkan device is closed: a recovery destroyed the lost device and could not open \
         another; recover again",
    )
}

impl Vulkan {
    /// Open a device as `config` says.
    ///
    /// # Errors
    ///
    /// [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable)
    /// when there is no loader, no instance or no usable device;
    /// [`Error::Refused`](scope_core::Error::Refused) when validation is
    /// asked for, the layer is missing and [`validation_required_by`] says
    /// it is a requirement here.
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

    /// The open device, or why there is none.
    fn open(&self) -> Result<&Open> {
        self.open.as_ref().ok_or_else(closed)
    }

    /// As [`open`](Self::open), to change it.
    fn open_mut(&mut self) -> Result<&mut Open> {
        self.open.as_mut().ok_or_else(closed)
    }

    /// Every message the validation layer sent so far, draining them.
    pub fn validation_messages(&self) -> Vec<String> {
        std::mem::take(&mut *self.adapter.instance.messages.lock())
    }

    /// Whether the validation layer is on and listening (asked for, and
    /// installed).
    pub fn validating(&self) -> bool {
        self.adapter.instance.validation
    }

    /// The device's `maxComputeWorkGroupCount`: the most workgroups one
    /// launch may run per dimension.
    pub fn max_workgroups(&self) -> [u32; 3] {
        self.facts.launch.max_workgroups
    }

    /// The device's `maxStorageBufferRange`: the most bytes one binding may
    /// span.
    pub fn max_storage_buffer_range(&self) -> u64 {
        self.facts.max_storage_range
    }

    /// Whether `robustBufferAccess` is on: the device offered it, and a
    /// kernel's out-of-bounds descriptor access then stays inside its own
    /// binding even where the compiled code had no check.
    pub fn robust_buffer_access(&self) -> bool {
        self.facts.robust
    }

    /// Submissions on all streams whose command buffers and staging are
    /// not recycled yet. A stream that submits a ninth waits for its
    /// oldest first, so each holds at most eight: a loop that only
    /// launches holds a bounded number however long it runs.
    pub fn batches_in_flight(&self) -> usize {
        self.tracks()
            .iter()
            .map(|t| t.in_flight.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }

    /// How many streams have work recorded or submitted that the device
    /// has not finished (asking the device, without waiting). For tests.
    #[doc(hidden)]
    pub fn streams_with_work_outstanding(&self) -> usize {
        self.tracks()
            .iter()
            .filter(|t| !t.reached(t.covering.load(std::sync::atomic::Ordering::Acquire)))
            .count()
    }

    /// The streams' timelines on the open device; none while it is closed.
    fn tracks(&self) -> &[Arc<Track>] {
        self.open.as_ref().map_or(&[], |open| &open.tracks)
    }

    /// Raw access for a crate-local baseline (the bench's raw-ash path) and
    /// for tests: the open device's handles, `None` while it is closed. A
    /// recovery destroys the device these name and opens another.
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

    /// Close the device: [`give_up`](Self::give_up) what was made on it,
    /// then [`destroy`](Self::destroy) the device itself.
    fn close(&mut self, streams: &mut [&mut VulkanStream]) {
        if let Some(gpu) = self.give_up(streams) {
            Self::destroy(gpu);
        }
    }

    /// Wait for every stream's submitted work on the open device, bounded
    /// by its wait timeout, then destroy everything made on it; the streams
    /// are left closed, and the device, which nothing names any more, is
    /// returned for [`destroy`](Self::destroy). A wait that gives up marks
    /// the device hung, and then everything is leaked instead (what the
    /// work still running may use), as at any teardown.
    ///
    /// The order: each stream's command pool (its batch command buffers),
    /// the staging chunks and replayed graphs its submissions held, its
    /// arena and its waits on other streams; then the pool — the ranges
    /// whose frees were deferred rejoin their blocks, and every block goes;
    /// then the pipelines, their layouts and descriptor-set layouts; then
    /// the timeline semaphores, which nothing names any more.
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
        if let Err(error) = stream::wait_tracks(&open.gpu, &waits) {
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

    /// Destroy a device that nothing made on it names any more: its last
    /// `Arc` goes, and with it the `VkDevice` (`Gpu`'s `Drop`).
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

    /// Make the next recovery fail after it gave the lost device up: at
    /// `0`, where it opens the new device; at `n`, where it gives the
    /// `n`-th stream (from 1, in id order) its state on the new one. For
    /// tests of a recovery that fails, which lavapipe never does by itself;
    /// it creates or destroys nothing the core tracks.
    #[doc(hidden)]
    pub fn fail_next_reopen(&mut self, at: usize) {
        self.fail_reopen = Some(at);
    }

    /// Open a new device on the same adapter, as `Vulkan::new` did, and
    /// give every stream new state on it; on an error, everything made is
    /// destroyed again and the device stays closed.
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

    const NAME: &'static str = error::NAME;

    fn describe(&self) -> String {
        self.adapter.describe()
    }

    fn accepts(&self, language: Language) -> bool {
        matches!(language, Language::Wgsl | Language::SpirV)
    }

    /// What the device could ever give one allocation: its heap,
    /// `maxMemoryAllocationSize` and `maxBufferSize`, whichever is least
    /// (rounded down to the pool's alignment, which every request is
    /// rounded up to). A larger request is "never", an invalid argument
    /// with no buffer, as on every server; within it, memory the device
    /// cannot give now is out-of-memory (rule 37).
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
        // Memory outlives no device: a closed backend has none to free.
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
        // SAFETY: the Backend contract of `write`: `dst` is alive and
        // `offset..offset + data.len()` lies inside it, both multiples of 4.
        unsafe { copy::write(stream.state()?, dst, offset, data) }
    }

    unsafe fn read(
        &mut self,
        stream: &mut VulkanStream,
        src: &VulkanMemory,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        // SAFETY: the Backend contract of `read`: `src` is alive and
        // `offset..offset + out.len()` lies inside it.
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
        // SAFETY: the Backend contract of `copy`: both memories are alive,
        // each range lies inside its memory, and they do not overlap when
        // `src` and `dst` are one memory.
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
        // SAFETY: the Backend contract of `launch`: the kernel and every
        // memory are alive, every binding's range lies inside its memory at
        // a `binding_alignment` offset (this device's
        // minStorageBufferOffsetAlignment), the indirect counts' 12 bytes
        // inside theirs, and host-given counts within `launch_limits`'
        // `max_workgroups`; the guard is this backend's, alive in
        // `pipelines`.
        unsafe { launch::launch(stream.state()?, kernel, guard.as_ref(), launch) }
    }

    unsafe fn flush(&mut self, stream: &mut VulkanStream) -> Result<()> {
        // A closed stream has nothing batched. The core flushes every
        // stream before it gives a device up, a closed one's too when a
        // recovery comes again after one that failed.
        stream.state().map_or(Ok(()), |state| state.flush())
    }

    unsafe fn begin_wait(&mut self, stream: &mut VulkanStream) -> Result<Option<StreamWait>> {
        stream.state()?.begin_wait()
    }

    unsafe fn wait(waiter: &StreamWait) -> Result<()> {
        waiter.wait()
    }

    unsafe fn end_wait(&mut self, stream: &mut VulkanStream, _waiter: StreamWait) -> Result<()> {
        // A waiter ends before its device can close (`reopen` is called
        // with none outstanding), so both are open here.
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

    /// Destroy the device and open a new one on the same physical device,
    /// with the same queue family, features and extensions (see the crate
    /// docs, "Recovery"). The lost device's work is waited for with the
    /// server's own bounded wait: a lost device answers at once, a device
    /// poisoned by an injected fault finishes its work. Everything made on
    /// it is destroyed in a valid order; the device is opened as
    /// `Vulkan::new` opened it, the lost `VkDevice` destroyed
    /// (`vkDestroyDevice`), and every stream gets a new command pool,
    /// timeline semaphore and arena, not recording.
    ///
    /// If the new device cannot be opened the error is returned and the
    /// backend stays closed, every stream with it; a later call opens it.
    unsafe fn reopen(
        &mut self,
        fault: &scope_core::Error,
        streams: &mut [&mut VulkanStream],
    ) -> Result<()> {
        tracing::info!(device = %self.adapter.name, "destroying the lost device to open it again: {fault}");
        let lost = self.give_up(streams);
        // The lost `VkDevice` goes once the new one is open (or failed to
        // open): the two are never one object, whatever the allocator
        // would hand out after a free.
        let opened = self.open_again(streams);
        if let Some(lost) = lost {
            Self::destroy(lost);
        }
        opened
    }
}

/// A client of a new Vulkan server on the chosen device. Validation is on
/// when `SCOPE_VULKAN_VALIDATION=1`.
///
/// # Errors
///
/// [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable)
/// when there is no loader or no usable device; with
/// `SCOPE_VULKAN_VALIDATION=1`, [`Error::Refused`](scope_core::Error::Refused)
/// when the layer is missing where it is required ([`Config::validation`]).
/// Never a panic.
pub fn client() -> Result<Client<Vulkan>> {
    client_with(Config {
        validation: validation_from_env(),
        ..Config::default()
    })
}

/// Whether `SCOPE_VULKAN_VALIDATION=1` asks [`client`] for the validation
/// layer.
pub fn validation_from_env() -> bool {
    std::env::var("SCOPE_VULKAN_VALIDATION").is_ok_and(|v| v == "1")
}

/// A client of a new Vulkan server on device `index` (of
/// [`device_count`]; device 0 is what [`client`] opens), with the
/// validation layer as [`client`] decides it.
///
/// # Errors
///
/// As [`client`]; [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable)
/// for an index past the devices.
pub fn client_on(index: usize) -> Result<Client<Vulkan>> {
    client_with(Config {
        validation: validation_from_env(),
        device: Some(index),
        ..Config::default()
    })
}

/// A client of a new Vulkan server opened as `config` says.
///
/// # Errors
///
/// As [`client`].
pub fn client_with(config: Config) -> Result<Client<Vulkan>> {
    Client::new(Vulkan::new(config)?)
}

/// The physical devices the loader sees, usable or not, without opening
/// one. Never panics: a missing loader is an answer.
pub fn probe() -> Probe {
    device::probe()
}
