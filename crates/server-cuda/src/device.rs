//! The driver, the context and the streams.
//!
//! cudarc loads `libcuda` lazily and **panics** on the first driver call when
//! the library is missing, so nothing here calls the driver before
//! [`driver()`] has answered: it asks `is_culib_present()` (which only tries
//! to `dlopen` the candidate names) and then `cuInit`, once per process, and
//! remembers the answer. Every entry point — [`client`](crate::client),
//! [`probe`](crate::probe) — goes through it, so a machine without CUDA gets
//! [`Error::BackendUnavailable`] and never a panic, with no `catch_unwind` on
//! any path.
//!
//! One [`CudaContext`] (the device's primary context) per server; one
//! non-blocking cudarc stream per logical stream. Cross-stream ordering is an
//! event recorded on the earlier stream and waited on by the later one
//! ([`Cuda::order_streams`]). cudarc's own per-slice event tracking is turned
//! off: this backend never makes a `CudaSlice`, and the core already decides
//! which stream must wait for which.
//!
//! A caller's sync or read waits for a stream without the server's lock
//! ([`Backend::begin_wait`](scope_core::Backend::begin_wait)): an event of
//! the waiter's own is recorded on the stream under the lock, synchronised
//! without it, and kept for reuse when the wait ends. The waited work's
//! pinned staging is freed only if no other thread took staging on the
//! stream meanwhile (see `memory.rs`).

use std::ffi::c_char;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaEvent, CudaStream, result, sys};
use scope_core::{DeviceKind, Error, Probe, ProbedDevice, Result, StreamId};
use scope_native::{LaunchGeometry, c_chars};

use crate::error::{BACKEND, Doing, classify, driver as driver_error, mark_driver_loaded};
use crate::launch::Module;
use crate::memory::{Pinned, Staging, StagingMark};
use crate::{Cuda, CudaMemory};

static DRIVER: OnceLock<Result<()>> = OnceLock::new();
static NVRTC: OnceLock<bool> = OnceLock::new();

/// Whether the CUDA driver is loaded and initialised here; asked once per
/// process. Never panics.
pub(crate) fn driver() -> Result<()> {
    DRIVER
        .get_or_init(|| {
            // SAFETY: `is_culib_present` only tries to open each candidate
            // library name and drops it; it calls no symbol.
            if !unsafe { sys::is_culib_present() } {
                let mut searched = cudarc::get_lib_name_candidates("cuda");
                let mut seen = std::collections::HashSet::new();
                searched.retain(|name| seen.insert(name.clone()));
                return Err(Error::BackendUnavailable {
                    backend: BACKEND,
                    reason: format!(
                        "the CUDA driver library was not found (searched {})",
                        searched.join(", ")
                    ),
                });
            }
            result::init().map_err(|e| driver_error(e, Doing::Start { what: "cuInit" }))?;
            mark_driver_loaded();
            Ok(())
        })
        .clone()
}

/// Whether NVRTC can be loaded here; asked once per process.
pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: as for the driver, this only tries to open the library.
    *NVRTC.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
}

/// What the driver says about one device.
#[derive(Clone, Debug)]
pub(crate) struct DeviceInfo {
    pub(crate) ordinal: usize,
    pub(crate) name: String,
    /// Compute capability, `(major, minor)`.
    pub(crate) capability: (i32, i32),
    pub(crate) total_memory: u64,
}

/// The warp every CUDA device has.
const WARP: u32 = 32;

/// What every device this crate can run on has (compute capability 3.0
/// and later; CUDA 12 dropped everything older): a `2^31 - 1 x 65,535 x
/// 65,535` grid, `1024 x 1024 x 64` blocks of at most 1,024 threads, 48 KiB
/// of static shared memory per block (this server passes no dynamic shared
/// memory, and so never opts into more), 32-thread warps. An attribute the
/// driver will not read falls back to its value here, so a server still
/// opens — every figure is one each supported architecture has, never a
/// guess past what the device can do.
pub(crate) const ARCHITECTURAL_GEOMETRY: LaunchGeometry = LaunchGeometry {
    grid: [i32::MAX as u32, 65_535, 65_535],
    block: [1024, 1024, 64],
    threads: 1024,
    shared_memory: 48 << 10,
    subgroup: Some(WARP),
};

/// Ask the driver what one launch on `ctx`'s device may ask for, in
/// `cuDeviceGetAttribute`'s words (`MAX_GRID_DIM_*`, `MAX_BLOCK_DIM_*`,
/// `MAX_THREADS_PER_BLOCK`, `MAX_SHARED_MEMORY_PER_BLOCK`, `WARP_SIZE`):
/// read once, when the server opens, so that a runtime sizing its grid and
/// the check refusing one past it use the same figures (a constant would be
/// wrong for a device with a smaller grid, which would then fail the launch
/// on the device, claiming its outputs, instead of refusing it as an
/// invalid argument). Never fails: an attribute the driver does not answer
/// with a positive number takes its [`ARCHITECTURAL_GEOMETRY`] value, with
/// a warning.
pub(crate) fn launch_geometry(ctx: &CudaContext) -> LaunchGeometry {
    use sys::CUdevice_attribute as A;
    let read = |attribute: A, fallback: u32| -> u32 {
        match ctx.attribute(attribute) {
            Ok(value) if value > 0 => value.unsigned_abs(),
            answer => {
                tracing::warn!(
                    "cuda: {attribute:?} reads {answer:?}; using {fallback}, which every supported architecture has"
                );
                fallback
            }
        }
    };
    let f = ARCHITECTURAL_GEOMETRY;
    LaunchGeometry {
        grid: [
            read(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, f.grid[0]),
            read(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, f.grid[1]),
            read(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, f.grid[2]),
        ],
        block: [
            read(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, f.block[0]),
            read(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, f.block[1]),
            read(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, f.block[2]),
        ],
        threads: read(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f.threads),
        shared_memory: read(
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
            f.shared_memory,
        ),
        subgroup: Some(read(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE, WARP)),
    }
}

/// The CUDA version of the driver here (`cuDriverGetVersion`), asked
/// without initialising it, so that it answers on a machine whose driver
/// finds no device too: what decides which PTX it JITs
/// ([`CudaVersion::ptx_isa`](crate::CudaVersion::ptx_isa)).
///
/// # Errors
///
/// [`Error::BackendUnavailable`] when the driver library cannot be loaded
/// here or does not answer.
pub fn cuda_driver_version() -> Result<crate::CudaVersion> {
    // SAFETY: `is_culib_present` only tries to open each candidate library
    // name and drops it; it calls no symbol.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::BackendUnavailable {
            backend: BACKEND,
            reason: "the CUDA driver library (libcuda) was not found here".to_owned(),
        });
    }
    let mut version = 0;
    // SAFETY: the library is present (above); cuDriverGetVersion may be
    // called before cuInit, and `version` is a valid place for one int.
    let status = unsafe { sys::cuDriverGetVersion(&mut version) };
    status.result().map_err(|e| Error::BackendUnavailable {
        backend: BACKEND,
        reason: format!("cuDriverGetVersion: {e:?}"),
    })?;
    crate::CudaVersion::from_driver(version).ok_or_else(|| Error::BackendUnavailable {
        backend: BACKEND,
        reason: format!("cuDriverGetVersion answered {version}"),
    })
}

/// The driver's CUDA version, `(major, minor)`.
pub(crate) fn driver_version() -> Result<(i32, i32)> {
    let mut version = 0;
    // SAFETY: the driver is loaded (callers go through `driver()` first) and
    // `version` is a valid place for one int.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(|e| {
            driver_error(
                e,
                Doing::Start {
                    what: "cuDriverGetVersion",
                },
            )
        })?;
    Ok((version / 1000, (version % 1000) / 10))
}

fn device_name(device: sys::CUdevice) -> Result<String> {
    let mut buf = [0 as c_char; 256];
    // SAFETY: the buffer holds `len` chars; the driver writes at most that
    // many, NUL-terminated.
    unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, device) }
        .result()
        .map_err(|e| {
            driver_error(
                e,
                Doing::Start {
                    what: "cuDeviceGetName",
                },
            )
        })?;
    Ok(c_chars(&buf))
}

/// Ask the driver about device `ordinal`.
pub(crate) fn device_info(ordinal: usize) -> Result<DeviceInfo> {
    let start = |what| move |e| driver_error(e, Doing::Start { what });
    let index =
        i32::try_from(ordinal).map_err(|_| Error::invalid("device ordinal", "too large"))?;
    let device = result::device::get(index).map_err(start("cuDeviceGet"))?;
    let name = device_name(device)?;
    // SAFETY: `device` is a valid device handle from `cuDeviceGet`.
    let attribute = |a| unsafe { result::device::get_attribute(device, a) };
    let major = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        .map_err(start("reading the compute capability"))?;
    let minor = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        .map_err(start("reading the compute capability"))?;
    // SAFETY: as above.
    let total = unsafe { result::device::total_mem(device) }.map_err(start("cuDeviceTotalMem"))?;
    Ok(DeviceInfo {
        ordinal,
        name,
        capability: (major, minor),
        total_memory: total as u64,
    })
}

/// Device `ordinal`'s memory in bytes: the largest allocation this backend
/// accepts, and a size it cannot provide (the context holds some).
///
/// # Errors
///
/// [`Error::BackendUnavailable`] with no driver here; the driver's error.
pub fn total_memory(ordinal: usize) -> Result<u64> {
    driver()?;
    device_info(ordinal).map(|info| info.total_memory)
}

/// What this machine has, for `cargo xtask matrix`. Never panics: with no
/// driver it says which library it looked for.
pub fn probe() -> Probe {
    if let Err(error) = driver() {
        return Probe::none(BACKEND, error.to_string());
    }
    let count = match result::device::get_count() {
        Ok(count) => count,
        Err(e) => {
            return Probe::none(
                BACKEND,
                driver_error(
                    e,
                    Doing::Start {
                        what: "cuDeviceGetCount",
                    },
                )
                .to_string(),
            );
        }
    };
    let version = driver_version()
        .map(|(major, minor)| format!("driver CUDA {major}.{minor}"))
        .unwrap_or_else(|e| format!("driver version unknown ({e})"));
    let nvrtc = if nvrtc_present() {
        "NVRTC found"
    } else {
        "no NVRTC (PTX only)"
    };
    let mut devices = Vec::new();
    for ordinal in 0..usize::try_from(count).unwrap_or(0) {
        match device_info(ordinal) {
            Ok(info) => devices.push(ProbedDevice {
                name: info.name,
                kind: DeviceKind::Hardware,
                detail: format!(
                    "sm_{}{}, {:.1} GiB, {version}, {nvrtc}",
                    info.capability.0,
                    info.capability.1,
                    info.total_memory as f64 / (1u64 << 30) as f64
                ),
            }),
            Err(error) => tracing::warn!(ordinal, "cuda probe: {error}"),
        }
    }
    if devices.is_empty() {
        return Probe::none(
            BACKEND,
            format!("the driver reports {count} devices, none usable"),
        );
    }
    Probe::found(BACKEND, devices)
}

/// The device state a logical stream shares with the backend, which needs it
/// to free memory and to wait for graph replays on streams it is not handed.
///
/// Its driver objects sit behind an `Option` so that a reopen
/// (`reopen.rs`) can destroy them on the context they were made
/// on *before* that context is reset: a handle destroyed after the reset
/// could name an object the new context made meanwhile.
pub(crate) struct StreamShared {
    pub(crate) index: u32,
    handles: Option<StreamHandles>,
}

/// The driver objects of one logical stream.
pub(crate) struct StreamHandles {
    pub(crate) cu: Arc<CudaStream>,
    /// Re-recorded for every cross-stream wait on this stream.
    pub(crate) order_event: CudaEvent,
    /// Recorded just before a capture begins: while the stream records, its
    /// real work ends here, so a wait on its earlier work waits on this.
    pub(crate) pre_capture: CudaEvent,
}

impl std::ops::Deref for StreamShared {
    type Target = StreamHandles;

    /// The stream's driver objects. Only a reopen takes them away, and it
    /// gives every stream new ones before it returns `Ok`; a reopen that
    /// fails leaves the server detached, and the core names none of a
    /// detached server's streams until a later reopen succeeds (it neither
    /// issues work on a poisoned server nor waits on a detached one's
    /// streams when it drops), so reaching the `expect` is a bug in the
    /// core, not something a caller can do.
    fn deref(&self) -> &StreamHandles {
        self.handles
            .as_ref()
            .expect("a stream of a detached CUDA server is never named")
    }
}

/// What a window records besides the graph itself.
#[derive(Default)]
pub(crate) struct Recording {
    /// Pinned copies of the bytes of host writes inside the window: the
    /// graph's memcpy nodes read them on every replay, so the graph keeps
    /// them.
    pub(crate) staging: Vec<Pinned>,
    /// The memory the window's work touches, so a replay can mark it used on
    /// the replaying stream (frees are ordered after the last user).
    pub(crate) memories: Vec<CudaMemory>,
    /// The modules of the kernels the window launches, once each: the graph
    /// keeps them loaded for its replays.
    pub(crate) modules: Vec<Arc<Module>>,
}

impl Recording {
    /// Keep `module` loaded for as long as the graph recorded here lives.
    pub(crate) fn keep_module(&mut self, module: &Arc<Module>) {
        if !self.modules.iter().any(|m| Arc::ptr_eq(m, module)) {
            self.modules.push(module.clone());
        }
    }
}

/// A logical stream: the core's [`Backend::Stream`](scope_core::Backend::Stream).
pub struct CudaStreamState {
    pub(crate) shared: Arc<StreamShared>,
    pub(crate) staging: Staging,
    pub(crate) recording: Option<Recording>,
    /// Events for waits on this stream, back from the waits that ended;
    /// more are made while several threads wait on it at once.
    spare_wait_events: Vec<CudaEvent>,
}

/// Wait events a stream keeps for reuse; past this, an ended wait's event
/// is destroyed.
const SPARE_WAIT_EVENTS: usize = 4;

/// A wait for a stream's work, run without the server's lock: the core's
/// [`Backend::Waiter`](scope_core::Backend::Waiter).
///
/// The event is recorded on the stream when the wait begins, so it covers
/// exactly the work issued before that — not what other threads issue on
/// the stream while the waiter waits — and nothing else records it until
/// the wait has ended (each waiter has an event of its own).
pub struct CudaWaiter {
    event: CudaEvent,
    stream: StreamId,
    /// The stream's staging when the event was recorded.
    staging: StagingMark,
    /// Set by a wait that returned success: the covered work is finished.
    finished: AtomicBool,
}

impl CudaWaiter {
    fn failed(&self, e: cudarc::driver::DriverError) -> Error {
        driver_error(
            e,
            Doing::Wait {
                stream: Some(self.stream),
                what: "the stream",
            },
        )
    }
}

impl CudaStreamState {
    /// The core's id for it: streams are created in the core's order.
    pub(crate) fn id(&self) -> StreamId {
        StreamId(self.shared.index)
    }

    /// The cudarc stream, for a raw-API baseline.
    pub fn raw(&self) -> &Arc<CudaStream> {
        &self.shared.cu
    }

    /// Destroy this stream's driver objects, pinned staging and spare
    /// events, on the context they were made on; the stream is detached
    /// until [`attach`](Self::attach). Refused when something else still
    /// shares the stream's state (a waiter, which a reopen's contract
    /// rules out).
    pub(crate) fn detach(&mut self) -> Result<()> {
        self.recording = None;
        self.staging = Staging::default();
        self.spare_wait_events.clear();
        let index = self.shared.index;
        let shared = Arc::get_mut(&mut self.shared).ok_or_else(|| still_waited_on(index))?;
        shared.handles = None;
        Ok(())
    }

    /// Give a detached stream new driver objects; the shared state to keep
    /// beside the backend's list.
    pub(crate) fn attach(&mut self, handles: StreamHandles) -> Result<Arc<StreamShared>> {
        let index = self.shared.index;
        let shared = Arc::get_mut(&mut self.shared).ok_or_else(|| still_waited_on(index))?;
        shared.handles = Some(handles);
        Ok(self.shared.clone())
    }

    /// Note that the work being issued touches `memory`.
    pub(crate) fn touch(&mut self, memory: &CudaMemory) {
        memory.used_by(self.shared.index);
        if let Some(recording) = &mut self.recording {
            recording.memories.push(memory.clone());
        }
    }
}

fn still_waited_on(index: u32) -> Error {
    Error::refused(format!(
        "stream {index} of the lost device is still waited on; recover once the wait ends"
    ))
}

/// Retain device `ordinal`'s primary context.
pub(crate) fn open_context(ordinal: usize) -> Result<Arc<CudaContext>> {
    driver()?;
    let ctx = CudaContext::new(ordinal).map_err(|e| {
        driver_error(
            e,
            Doing::Start {
                what: "retaining the primary context",
            },
        )
    })?;
    // SAFETY: event tracking orders uses of `CudaSlice`s across streams; this
    // backend never makes one (memory is raw pointers from its own pool) and
    // orders streams itself when the core asks (`Backend::order`).
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

impl Cuda {
    /// Make `ctx` current on this thread: the core's lock may be taken from
    /// any thread, and raw driver calls act on the current context.
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| {
            driver_error(
                e,
                Doing::Wait {
                    stream: None,
                    what: "binding the context",
                },
            )
        })
    }

    pub(crate) fn new_stream(&mut self, id: StreamId) -> Result<CudaStreamState> {
        self.bind()?;
        // The core's ids count successful creations from 0, which is what
        // indexes `streams` and `capturing`.
        let index = id.0;
        debug_assert_eq!(index as usize, self.streams.len());
        let shared = Arc::new(StreamShared {
            index,
            handles: Some(self.stream_handles()?),
        });
        self.streams.push(shared.clone());
        self.capturing.push(false);
        Ok(CudaStreamState {
            shared,
            staging: Staging::default(),
            recording: None,
            spare_wait_events: Vec::new(),
        })
    }

    /// A new driver stream and its two events, on the current context.
    pub(crate) fn stream_handles(&self) -> Result<StreamHandles> {
        let start = |what| move |e| driver_error(e, Doing::Start { what });
        Ok(StreamHandles {
            cu: self.ctx.new_stream().map_err(start("cuStreamCreate"))?,
            order_event: self.ctx.new_event(None).map_err(start("cuEventCreate"))?,
            pre_capture: self.ctx.new_event(None).map_err(start("cuEventCreate"))?,
        })
    }

    pub(crate) fn is_capturing(&self, index: u32) -> bool {
        self.capturing.get(index as usize).copied().unwrap_or(false)
    }

    /// Wait on the host for everything issued on stream `index` that runs:
    /// while it records, that is the work before the capture began.
    pub(crate) fn finish_on_host(&self, index: u32) -> Result<()> {
        let Some(shared) = self.streams.get(index as usize) else {
            return Ok(());
        };
        let stream = Some(StreamId(index));
        if self.is_capturing(index) {
            shared.pre_capture.synchronize().map_err(|e| {
                driver_error(
                    e,
                    Doing::Wait {
                        stream,
                        what: "the work before the capture",
                    },
                )
            })
        } else {
            shared.cu.synchronize().map_err(|e| {
                driver_error(
                    e,
                    Doing::Wait {
                        stream,
                        what: "the stream",
                    },
                )
            })
        }
    }

    /// [`Backend::sync`](scope_core::Backend::sync): a recording stream
    /// waits for the work before its capture, any other stream through the
    /// same three steps as a wait without the lock.
    pub(crate) fn sync_stream(&mut self, stream: &mut CudaStreamState) -> Result<()> {
        if stream.recording.is_some() {
            // The core refuses a caller's sync while recording; it syncs a
            // recording stream only to order another recording stream after
            // it, and what runs of it is the work before its capture.
            self.bind()?;
            return self.finish_on_host(stream.shared.index);
        }
        let Some(waiter) = self.begin_wait_for(stream)? else {
            return Ok(());
        };
        let waited = Self::wait_for(&waiter);
        self.end_wait_for(stream, waiter).and(waited)
    }

    /// [`Backend::begin_wait`](scope_core::Backend::begin_wait): record an
    /// event at the stream's end. Work is issued as it comes (nothing is
    /// batched), so there is nothing to submit first.
    pub(crate) fn begin_wait_for(
        &mut self,
        stream: &mut CudaStreamState,
    ) -> Result<Option<CudaWaiter>> {
        self.bind()?;
        if stream.recording.is_some() {
            return Err(Error::internal(
                "a wait without the lock reached a stream that is capturing",
            ));
        }
        let id = stream.id();
        let failed = |e| {
            driver_error(
                e,
                Doing::Wait {
                    stream: Some(id),
                    what: "the stream",
                },
            )
        };
        let event = match stream.spare_wait_events.pop() {
            Some(event) => event,
            None => self.ctx.new_event(None).map_err(failed)?,
        };
        if let Err(e) = event.record(&stream.shared.cu) {
            stream.spare_wait_events.push(event);
            return Err(failed(e));
        }
        Ok(Some(CudaWaiter {
            event,
            stream: id,
            staging: stream.staging.mark(),
            finished: AtomicBool::new(false),
        }))
    }

    /// Whether the waiter's work finished, without blocking (for
    /// [`DeviceCollectives::finished`](scope_core::collective::device::DeviceCollectives::finished)).
    pub(crate) fn finished(waiter: &CudaWaiter) -> Result<bool> {
        // Any thread may poll (the collectives' watchdog does): bind the
        // event's context first, as cudarc's own waits do.
        waiter
            .event
            .context()
            .bind_to_thread()
            .map_err(|e| waiter.failed(e))?;
        let done = waiter
            .event
            .try_is_complete()
            .map_err(|e| waiter.failed(e))?;
        if done {
            waiter.finished.store(true, Ordering::Release);
        }
        Ok(done)
    }

    /// [`Backend::wait`](scope_core::Backend::wait), with no lock held: only
    /// the waiter's own event is touched (cudarc binds its context to this
    /// thread first), and the driver lets any thread synchronise an event
    /// while others issue work.
    pub(crate) fn wait_for(waiter: &CudaWaiter) -> Result<()> {
        waiter.event.synchronize().map_err(|e| waiter.failed(e))?;
        waiter.finished.store(true, Ordering::Release);
        Ok(())
    }

    /// [`Backend::end_wait`](scope_core::Backend::end_wait): free the
    /// staging the finished work used, and keep the event for the next wait.
    pub(crate) fn end_wait_for(
        &mut self,
        stream: &mut CudaStreamState,
        waiter: CudaWaiter,
    ) -> Result<()> {
        // After a failed wait the copies may still be in flight: staging
        // stays as it is.
        if waiter.finished.load(Ordering::Acquire) {
            stream.staging.settled_at(waiter.staging);
        }
        if stream.spare_wait_events.len() < SPARE_WAIT_EVENTS {
            stream.spare_wait_events.push(waiter.event);
        }
        Ok(())
    }

    /// `then`'s later work waits for `first`'s earlier work.
    pub(crate) fn order_streams(
        &mut self,
        first: &CudaStreamState,
        then: &CudaStreamState,
    ) -> Result<()> {
        self.bind()?;
        let (f, t) = (first.shared.index, then.shared.index);
        if self.is_capturing(t) {
            // A capturing stream may not wait on work outside its graph
            // (CUDA_ERROR_STREAM_CAPTURE_ISOLATION); finish that work first.
            return self.finish_on_host(f);
        }
        let stream = Some(then.id());
        let event = if self.is_capturing(f) {
            // The recorded work does not run until replay; what `then` can
            // wait for is the work before the capture began.
            &first.shared.pre_capture
        } else {
            first
                .shared
                .order_event
                .record(&first.shared.cu)
                .map_err(|e| {
                    classify(
                        e.0,
                        Doing::Wait {
                            stream,
                            what: "an ordering event",
                        },
                    )
                })?;
            &first.shared.order_event
        };
        then.shared.cu.wait(event).map_err(|e| {
            classify(
                e.0,
                Doing::Wait {
                    stream,
                    what: "another stream's work",
                },
            )
        })
    }
}
