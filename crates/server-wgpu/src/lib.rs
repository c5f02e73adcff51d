//! A scope compute server over wgpu: WGSL kernels on Vulkan or GL (and, in a
//! build that enables them, Metal or D3D12).
//!
//! The core (scope-core's `Server<B>`) keeps every rule of the failure model.
//! This crate is only the device calls of [`Backend`] for wgpu. Three facts
//! about wgpu give it its shape:
//!
//! 1. **Errors go to a sink, and the default sink panics.** Every fallible
//!    call runs inside error scopes (`error.rs`), so its error is its return
//!    value. Device loss is a sticky fault (see [below](#device-loss-and-recovery)).
//! 2. **One queue, and passes are what cost.** Logical streams are ordering
//!    domains on the one queue. Each batches its launches into one open pass
//!    (`stream.rs`), so a launch costs about what a raw dispatch costs.
//! 3. **No replayable command buffers.** A capture records dispatches and
//!    copies as values. It encodes once to validate, and again per replay
//!    (`capture.rs`).
//!
//! Memory is one pooled buffer per allocation (`memory.rs`). Kernels compile
//! with a reflected layout (`compile.rs`) and launch into the open pass
//! (`launch.rs`). Host copies are queue writes, staged mapped reads
//! (`staging.rs`) and encoder copies (`copy.rs`).
//!
//! Copies, launches and replays are functions of a stream's batch and the
//! submitter it goes through, so each stands on the stream. Only this file
//! sees every part: it chooses whether a capture window records the work.
//!
//! # Launch checks and indirect counts
//!
//! `Backend::check_launch` refuses what the device's limits refuse, before
//! the core opens the launch's scope (see `launch.rs`). The answer is an
//! [`Error::InvalidArgument`] naming the binding, which claims nothing.
//!
//! **An indirect count past the device's limit runs nothing.** The instance
//! always enables wgpu's indirect-call validation, which makes such a
//! dispatch a no-op (see `device.rs`). The launch still succeeds: the host
//! cannot know the count when it returns.
//!
//! # Device loss and recovery
//!
//! A lost device is a sticky fault (`DEVICE_LOST`), which poisons the client.
//! wgpu learns a loss late, so every caught error first lets a loss speak
//! (`error.rs`).
//!
//! [`Client::recover`] opens the device again (`Backend::reopen`). The server
//! drops everything it made on the lost device, destroys it, and asks **the
//! same adapter** for a new one with the features and limits of
//! [`Wgpu::new`]. wgpu has no process-fatal fault, so every loss is
//! recoverable. An adapter that gives no device is
//! [`Error::BackendUnavailable`]; the client stays poisoned, and a later
//! `recover` asks again.
//!
//! `tests/recover.rs` loses the device for real; the conformance group
//! injects a sticky fault on a healthy device.
//!
//! # Collectives
//!
//! Neither Vulkan nor WebGPU has a collective library, so a `Group` of these
//! clients is host-staged (rule 45). Each round reads every rank's input to
//! the host and writes the result back. Its rounds drain the caller's stream,
//! and none can be captured (rule 50). Only a device transport (NCCL, RCCL)
//! overlaps its rounds with compute (rule 47).
//!
//! # Choosing the adapter
//!
//! Hardware first, then software. `SCOPE_WGPU_BACKEND` (`vulkan`, `gl`,
//! `metal`, `dx12`) and `SCOPE_WGPU_ADAPTER` (a name substring) override.
//! See `device.rs` and [`Options`].

mod capture;
mod compile;
mod copy;
mod device;
mod error;
mod launch;
mod memory;
mod staging;
mod stream;

use std::sync::Arc;

use scope_core::backend::Launch;
use scope_core::{Backend, Client, Error, Kernel, Kind, Language, Result, StreamId};

pub use capture::Graph;
pub use compile::Pipeline;
pub use device::{Api, OPTIONAL, Options, adapter_count, first_api, probe};
pub use memory::Memory;
pub use stream::{BATCH_LIMIT, StreamWait};

use crate::capture::Recording;
use crate::device::Gpu;
use crate::error::{NAME, message, out_of_memory, scoped};
use crate::launch::BindGroups;
use crate::memory::Pool;
use crate::staging::Staging;
use crate::stream::{Batch, Submissions, Submitter};

/// A logical stream: an index into the backend's batches.
#[derive(Debug)]
pub struct Stream(usize);

/// The wgpu backend.
pub struct Wgpu {
    gpu: Gpu,
    pool: Pool,
    streams: Vec<Batch>,
    /// Per stream, the capture window's recording while one is open. Work
    /// goes here instead of into the batch: this file chooses which.
    recordings: Vec<Option<Recording>>,
    submissions: Submissions,
    bind_groups: BindGroups,
    /// The launch last checked, which a launch just like it need not be.
    checked: launch::Checked,
    /// The read-back buffer, reused while reads fit in it.
    staging: Staging,
    /// Ids for buffers, arenas, pipelines and bind groups.
    next_id: u64,
    /// Numbers for batches, unique across streams.
    next_batch: u64,
}

impl std::fmt::Debug for Wgpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Wgpu({})", self.gpu.describe())
    }
}

impl Wgpu {
    /// Open the adapter `options` choose.
    ///
    /// # Errors
    ///
    /// [`Error::BackendUnavailable`] when no adapter fits.
    pub fn new(options: &Options) -> Result<Self> {
        Ok(Self {
            gpu: Gpu::open(options)?,
            pool: Pool::default(),
            streams: Vec::new(),
            recordings: Vec::new(),
            submissions: Submissions::default(),
            bind_groups: BindGroups::default(),
            checked: launch::Checked::default(),
            staging: Staging::default(),
            next_id: 0,
            next_batch: 0,
        })
    }

    /// Drop everything made on the device, then ask the adapter for a new one
    /// ([`Gpu::reopen`]) and give every stream a fresh batch. Safe to call
    /// again after a failure: what it drops is already empty.
    fn reopen_now(&mut self, fault: &Error, streams: &[&mut Stream]) -> Result<()> {
        tracing::warn!(backend = NAME, "opening the device again after: {fault}");
        if let Some(stray) = streams.iter().find(|s| s.0 >= self.streams.len()) {
            return Err(Error::internal(format!(
                "reopen was given stream {} of {}",
                stray.0,
                self.streams.len()
            )));
        }
        let sink = self.gpu.sink.clone();
        // Retired first, so nothing dropped below reports a fault.
        sink.retire();
        let mut batches = Vec::with_capacity(self.streams.len());
        for batch in &self.streams {
            self.next_batch += 1;
            batches.push(Batch::new(batch.stream, self.next_batch));
        }
        let recordings = self.recordings.iter().map(|_| None).collect();
        let old = (
            std::mem::replace(&mut self.streams, batches),
            std::mem::replace(&mut self.recordings, recordings),
            std::mem::take(&mut self.submissions),
            std::mem::take(&mut self.bind_groups),
            std::mem::take(&mut self.checked),
            std::mem::take(&mut self.staging),
            std::mem::take(&mut self.pool),
        );
        let _ = error::no_panic(&sink, "dropping the lost device's objects", move || {
            drop(old)
        });
        self.gpu.reopen()?;
        Ok(())
    }

    /// The device's limits, as opened.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.gpu.limits
    }

    /// The adapter's information.
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.gpu.info
    }

    /// The device and queue, for a raw-wgpu baseline; work here is outside
    /// every scope. A `Device::destroy` is a real loss; [`Client::recover`] repairs it.
    pub fn raw(&self) -> (&wgpu::Device, &wgpu::Queue) {
        (&self.gpu.device, &self.gpu.queue)
    }

    /// Whether any stream has work encoded or in flight. For tests.
    #[doc(hidden)]
    pub fn work_outstanding(&self) -> bool {
        let completed = self
            .submissions
            .completed
            .load(std::sync::atomic::Ordering::Acquire);
        self.streams.iter().any(Batch::is_open) || completed < self.submissions.issued
    }

    fn submitter(&mut self) -> (Submitter<'_>, &mut Vec<Batch>) {
        (
            Submitter {
                gpu: &self.gpu,
                submissions: &mut self.submissions,
                next_batch: &mut self.next_batch,
                next_id: &mut self.next_id,
            },
            &mut self.streams,
        )
    }

    /// Stream `s`'s batch, what it submits through, and the read-back staging.
    fn stream(&mut self, s: usize) -> (Submitter<'_>, &mut Batch, &mut Staging) {
        let submitter = Submitter {
            gpu: &self.gpu,
            submissions: &mut self.submissions,
            next_batch: &mut self.next_batch,
            next_id: &mut self.next_id,
        };
        (submitter, &mut self.streams[s], &mut self.staging)
    }

    fn flush_stream(&mut self, s: usize) -> Result<()> {
        let (mut submitter, batch, _) = self.stream(s);
        submitter.flush(batch)
    }

    /// Submit the open batch that last used buffer tag `tag`, so a new owner
    /// may take the buffer.
    fn release_tag(&mut self, tag: u64) -> Result<()> {
        if tag == 0 {
            return Ok(());
        }
        let s = (tag >> 48) as usize;
        if let Some(batch) = self.streams.get(s)
            && batch.is_open()
            && memory::tag_value(s, batch.number) == tag
        {
            self.flush_stream(s)?;
        }
        Ok(())
    }
}

impl Drop for Wgpu {
    fn drop(&mut self) {
        self.gpu.sink.retire();
        // Finish submitted work here, not in wgpu's drop: a lost device cannot answer.
        let _ = error::no_panic(&self.gpu.sink, "the final wait", || {
            self.gpu.device.poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
        });
    }
}

impl Backend for Wgpu {
    type Memory = Memory;
    type Stream = Stream;
    type Kernel = Arc<Pipeline>;
    type Graph = Graph;
    type Waiter = StreamWait;

    const KIND: Kind = Kind::Server(error::KIND);

    fn describe(&self) -> String {
        self.gpu.describe()
    }

    fn accepts(&self, language: Language) -> bool {
        language == Language::Wgsl
    }

    fn max_allocation(&self) -> u64 {
        // One allocation is one buffer, bound whole: both limits apply.
        self.gpu
            .limits
            .max_buffer_size
            .min(self.gpu.limits.max_storage_buffer_binding_size)
    }

    fn binding_alignment(&self) -> u64 {
        u64::from(self.gpu.limits.min_storage_buffer_offset_alignment)
    }

    /// wgpu's limits for the device as opened. Bindings are storage buffers.
    /// The arena and the storage binding size bound the scalar blob, and the
    /// uniform size a `var<uniform>` blob. The features are those of
    /// [`OPTIONAL`] the adapter offered.
    fn launch_limits(&self) -> scope_core::LaunchLimits {
        let limits = &self.gpu.limits;
        let mut launch = scope_core::LaunchLimits::default();
        launch.max_bindings = limits.max_storage_buffers_per_shader_stage;
        launch.max_binding_size = limits.max_storage_buffer_binding_size;
        launch.max_scalar_bytes =
            u32::try_from(stream::ARENA_BYTES.min(limits.max_storage_buffer_binding_size))
                .unwrap_or(u32::MAX);
        launch.max_workgroups = [limits.max_compute_workgroups_per_dimension; 3];
        launch.max_workgroup_size = [
            limits.max_compute_workgroup_size_x,
            limits.max_compute_workgroup_size_y,
            limits.max_compute_workgroup_size_z,
        ];
        launch.max_invocations = limits.max_compute_invocations_per_workgroup;
        launch.max_workgroup_memory = limits.max_compute_workgroup_storage_size;
        let info = &self.gpu.info;
        launch.native_width = (info.subgroup_min_size > 0)
            .then_some((info.subgroup_min_size, info.subgroup_max_size));
        let features = self.gpu.features;
        launch.features.f16 = features.contains(wgpu::Features::SHADER_F16);
        launch.features.subgroups = features.contains(wgpu::Features::SUBGROUP);
        launch.features.f32_atomic_add = features.contains(wgpu::Features::SHADER_FLOAT32_ATOMIC);
        launch.subgroup_size = if launch.features.subgroups {
            launch.native_width
        } else {
            None
        };
        launch
    }

    unsafe fn create_stream(&mut self, id: StreamId) -> Result<Stream> {
        self.gpu.sink.check_lost()?;
        let index = id.0 as usize;
        debug_assert_eq!(
            index,
            self.streams.len(),
            "the core numbers streams in creation order"
        );
        if index >= 1 << 16 {
            return Err(Error::refused("too many streams"));
        }
        self.next_batch += 1;
        self.streams.push(Batch::new(id, self.next_batch));
        self.recordings.push(None);
        Ok(Stream(index))
    }

    unsafe fn allocate(&mut self, _stream: &mut Stream, size: u64) -> Result<Memory> {
        self.gpu.sink.check_lost()?;
        let class = memory::class(size, self.gpu.limits.max_buffer_size);
        if let Some(memory) = self.pool.take(class) {
            let tag = memory.tag.load(std::sync::atomic::Ordering::Relaxed);
            self.release_tag(tag)?;
            return Ok(memory);
        }
        let device = &self.gpu.device;
        let (buffer, error) = scoped(device, || {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: class,
                usage: memory::USAGE,
                mapped_at_creation: false,
            })
        });
        if let Some(error) = error {
            error::lost_first(device, &self.gpu.sink)?;
            return Err(out_of_memory(&error, size).unwrap_or_else(|| {
                Error::invalid(
                    "allocation size",
                    format!("wgpu refused {size} bytes: {}", message(&error)),
                )
            }));
        }
        self.pool.made(class);
        self.next_id += 1;
        Ok(Memory {
            buffer,
            id: self.next_id,
            capacity: class,
            tag: Arc::default(),
        })
    }

    unsafe fn free(&mut self, memory: Memory) {
        if let Some(gone) = self.pool.put(memory) {
            self.bind_groups.evict(gone.id);
        }
    }

    fn trim(&mut self) {
        let gone = self.pool.drain();
        if !gone.is_empty() {
            self.bind_groups.clear();
        }
        self.staging = Staging::default();
        self.submissions.trim();
    }

    fn bytes_reserved(&self) -> u64 {
        // Allocation buffers only: staging and scalar arenas are not counted.
        self.pool.reserved()
    }

    unsafe fn write(
        &mut self,
        stream: &mut Stream,
        dst: &Memory,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        if let Some(recording) = &mut self.recordings[stream.0] {
            self.gpu.sink.check_lost()?;
            recording.write(self.gpu.scalar_alignment(), dst, offset, data);
            return Ok(());
        }
        let (mut submitter, batch, _) = self.stream(stream.0);
        copy::write(&mut submitter, batch, dst, offset, data)
    }

    unsafe fn read(
        &mut self,
        stream: &mut Stream,
        src: &Memory,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let (mut submitter, batch, staging) = self.stream(stream.0);
        copy::read(&mut submitter, batch, staging, src, offset, out)
    }

    unsafe fn copy(
        &mut self,
        stream: &mut Stream,
        src: &Memory,
        src_offset: u64,
        dst: &Memory,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        if let Some(recording) = &mut self.recordings[stream.0] {
            self.gpu.sink.check_lost()?;
            recording.copy(src, src_offset, dst, dst_offset, len);
            return Ok(());
        }
        let s = stream.0;
        let (submitter, batch, _) = self.stream(s);
        copy::copy(
            submitter.gpu,
            batch,
            s,
            src,
            src_offset,
            dst,
            dst_offset,
            len,
        )
    }

    fn compile(&mut self, kernel: &Kernel) -> Result<Arc<Pipeline>> {
        self.next_id += 1;
        compile::compile(&self.gpu, kernel, self.next_id)
    }

    #[inline(always)]
    fn check_launch(&self, kernel: &Arc<Pipeline>, launch: &Launch<'_, Memory>) -> Result<()> {
        if self.checked.is_last(kernel, launch) {
            return Ok(());
        }
        self.checked.check_anew(&self.gpu.limits, kernel, launch)
    }

    unsafe fn launch(
        &mut self,
        stream: &mut Stream,
        kernel: &Arc<Pipeline>,
        launch: &Launch<'_, Memory>,
    ) -> Result<()> {
        let s = stream.0;
        if let Some(recording) = &mut self.recordings[s] {
            self.gpu.sink.check_lost()?;
            recording.launch(self.gpu.scalar_alignment(), kernel, launch);
            return Ok(());
        }
        let mut submitter = Submitter {
            gpu: &self.gpu,
            submissions: &mut self.submissions,
            next_batch: &mut self.next_batch,
            next_id: &mut self.next_id,
        };
        launch::launch(
            &mut submitter,
            &mut self.streams[s],
            s,
            &mut self.bind_groups,
            kernel,
            launch,
        )
    }

    unsafe fn flush(&mut self, stream: &mut Stream) -> Result<()> {
        self.flush_stream(stream.0)
    }

    unsafe fn begin_wait(&mut self, stream: &mut Stream) -> Result<Option<StreamWait>> {
        let (mut submitter, streams) = self.submitter();
        submitter.begin_wait(&mut streams[stream.0])
    }

    unsafe fn wait(waiter: &StreamWait) -> Result<()> {
        waiter.wait()
    }

    unsafe fn end_wait(&mut self, stream: &mut Stream, waiter: StreamWait) -> Result<()> {
        let (submitter, batch, staging) = self.stream(stream.0);
        if let Some(read) = waiter.into_read() {
            staging.keep_back(read);
        }
        submitter.surfaced(batch)
    }

    unsafe fn begin_read(
        &mut self,
        stream: &mut Stream,
        src: &Memory,
        offset: u64,
        len: u64,
    ) -> Result<Option<StreamWait>> {
        let (mut submitter, batch, staging) = self.stream(stream.0);
        copy::begin_read(&mut submitter, batch, staging, src, offset, len)
    }

    unsafe fn end_read(
        &mut self,
        stream: &mut Stream,
        waiter: Option<StreamWait>,
        _src: &Memory,
        _offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let (submitter, batch, staging) = self.stream(stream.0);
        copy::end_read(&submitter, batch, staging, waiter, out)
    }

    unsafe fn order(&mut self, first: &mut Stream, _then: &mut Stream) -> Result<()> {
        // One queue: what `first` submits now runs before `then`'s later work.
        self.flush_stream(first.0)
    }

    unsafe fn begin_capture(&mut self, stream: &mut Stream) -> Result<()> {
        self.gpu.sink.check_lost()?;
        self.recordings[stream.0] = Some(Recording::default());
        Ok(())
    }

    unsafe fn end_capture(&mut self, stream: &mut Stream) -> Result<Graph> {
        self.gpu.sink.check_lost()?;
        let Some(recording) = self.recordings[stream.0].take() else {
            return Err(Error::internal(
                "the stream was asked to end a capture it was not recording",
            ));
        };
        let on = self.streams[stream.0].stream;
        recording.seal(&self.gpu, on, &mut self.next_id)
    }

    unsafe fn abort_capture(&mut self, stream: &mut Stream) {
        self.recordings[stream.0] = None;
    }

    unsafe fn replay(&mut self, stream: &mut Stream, graph: &Graph) -> Result<()> {
        let (mut submitter, batch, _) = self.stream(stream.0);
        capture::replay(&mut submitter, batch, stream.0, graph)
    }

    unsafe fn destroy_graph(&mut self, graph: Graph) -> Result<()> {
        let (mut submitter, batches) = self.submitter();
        capture::destroy(&mut submitter, batches, graph)
    }

    /// A new device from the same adapter, with fresh batches. A refusal is
    /// [`Error::BackendUnavailable`], and a later call retries.
    unsafe fn reopen(&mut self, fault: &Error, streams: &mut [&mut Stream]) -> Result<()> {
        self.reopen_now(fault, streams)
    }
}

/// A client of a wgpu server on the adapter `SCOPE_WGPU_BACKEND` and
/// `SCOPE_WGPU_ADAPTER` choose, or the best one found.
///
/// # Errors
///
/// [`Error::BackendUnavailable`] when there is no usable adapter.
pub fn client() -> Result<Client<Wgpu>> {
    client_with(&Options::from_env()?)
}

/// A client of a wgpu server on the adapter `options` choose.
///
/// # Errors
///
/// [`Error::BackendUnavailable`] when there is no usable adapter.
pub fn client_with(options: &Options) -> Result<Client<Wgpu>> {
    Client::new(Wgpu::new(options)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused reopen leaves the server given up, without a panic, and the
    /// next reopen opens it. Limits past the adapter's own make it refuse.
    #[test]
    fn a_refused_reopen_can_be_tried_again() {
        for api in [Api::Vulkan, Api::Gl] {
            let Ok(mut wgpu) = Wgpu::new(&Options::api(api)) else {
                println!("skipped: no {} adapter", api.name());
                continue;
            };
            let fault = error::device_lost("lost for the test");
            // SAFETY: the first stream, made in id order; nothing is
            // outstanding at either reopen (the one allocation is freed first).
            unsafe {
                let mut stream = wgpu.create_stream(StreamId(0)).unwrap();
                let memory = wgpu.allocate(&mut stream, 1024).unwrap();
                wgpu.write(&mut stream, &memory, 0, &[7; 16]).unwrap();
                wgpu.free(memory);
                let asked = wgpu.gpu.limits.clone();
                wgpu.gpu.limits.max_buffer_size = u64::MAX;
                let refused = wgpu.reopen(&fault, &mut [&mut stream]).unwrap_err();
                assert!(
                    matches!(refused, Error::BackendUnavailable { .. }),
                    "{refused}"
                );
                assert!(wgpu.allocate(&mut stream, 64).unwrap_err().is_sticky());
                assert!(wgpu.flush(&mut stream).unwrap_err().is_sticky());
                assert_eq!(wgpu.bytes_reserved(), 0, "the pool went with the device");
                wgpu.gpu.limits = asked;
                let before = wgpu.gpu.device.clone();
                wgpu.reopen(&fault, &mut [&mut stream]).unwrap();
                assert_ne!(before, wgpu.gpu.device);
                let memory = wgpu.allocate(&mut stream, 1024).unwrap();
                wgpu.write(&mut stream, &memory, 0, &[9; 16]).unwrap();
                let mut out = [0; 16];
                wgpu.read(&mut stream, &memory, 0, &mut out).unwrap();
                assert_eq!(out, [9; 16]);
                wgpu.free(memory);
            }
        }
    }
}
