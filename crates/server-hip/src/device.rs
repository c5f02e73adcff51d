//! The device and its streams.
//!
//! A [`Hip`] backend is one HIP device: its name and `gcnArchName`, memory pool, pinned
//! staging, and a weak registry of streams, so freeing memory fences each without owning one.
//! A stream is a non-blocking HIP stream, an *order* event for others to wait on, and a
//! *pre-capture* fence while it records: waiting on the stream itself would pull the waiter
//! into the capture.
//!
//! The device holds the pool (`pool.rs`), staging (`staging.rs`) and the parameter table, so
//! those stand below it. HIP's launch rules ([`API_RULES`]) live here, beside the geometry.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use scope_core::{Error, LaunchLimits, Result, StreamId};
use scope_native::{ApiRules, LaunchGeometry, ParamTable, c_chars};

use crate::api::{Event, Module, Pinned, Stream};
use crate::error::{BACKEND, Doing, HipError};
use crate::ffi::DevicePropR0600;
use crate::loader::Api;
use crate::pool::Pool;
use crate::staging::Staging;

/// What a stream shares with the device's registry.
pub(crate) struct StreamShared {
    pub(crate) stream: Stream,
    /// Set while the stream records: the fence recorded just before.
    pub(crate) pre_capture: Mutex<Option<Arc<Event>>>,
}

/// A logical stream's device state.
pub struct HipStream {
    pub(crate) id: StreamId,
    pub(crate) shared: Arc<StreamShared>,
    pub(crate) order_event: Event,
    /// Pinned copies of host writes recorded into the open capture; the graph takes them.
    pub(crate) retained: Vec<Pinned>,
    /// Modules the open capture launches, once each; the graph takes them, keeping them loaded.
    pub(crate) modules: Vec<Arc<Module>>,
    /// Events of ended waits, for reuse; more are made while threads wait at once.
    spare_wait_events: Vec<Event>,
}

/// Spare wait events a stream keeps; past this, an ended wait's event is destroyed.
const SPARE_WAIT_EVENTS: usize = 4;

/// What a wait stands on.
enum WaitOn {
    /// The waiter's own event, recorded at the stream's end; back to the spares after.
    Own(Event),
    /// A recording stream's pre-capture fence: the work before the capture, all that runs.
    Fence(Arc<Event>),
}

/// A wait ([`Backend::Waiter`](scope_core::Backend::Waiter)) run without the server's lock;
/// its own event covers only the work submitted before it began.
pub struct HipWaiter {
    on: WaitOn,
    stream: StreamId,
}

impl HipWaiter {
    fn event(&self) -> &Event {
        match &self.on {
            WaitOn::Own(event) => event,
            WaitOn::Fence(fence) => fence,
        }
    }
}

impl HipStream {
    pub(crate) fn stream(&self) -> &Stream {
        &self.shared.stream
    }

    pub(crate) fn is_capturing(&self) -> bool {
        self.shared.pre_capture.lock().is_some()
    }

    /// Keep `module` loaded while the graph the open capture seals lives.
    pub(crate) fn keep_module(&mut self, module: &Arc<Module>) {
        if !self.modules.iter().any(|m| Arc::ptr_eq(m, module)) {
            self.modules.push(module.clone());
        }
    }
}

impl std::fmt::Debug for HipStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HipStream({}, {:?})", self.id, self.shared.stream)
    }
}

/// What a device is, as found by a probe or an open.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// The ordinal.
    pub ordinal: i32,
    /// The marketing name.
    pub name: String,
    /// `gcnArchName`, with its target features: `gfx90a:sramecc+:xnack-`.
    pub arch: String,
    /// Bytes of device memory.
    pub total_memory: u64,
}

pub(crate) fn device_info(api: &Api, ordinal: i32) -> std::result::Result<DeviceInfo, HipError> {
    read_device(api, ordinal).map(|(info, _)| info)
}

/// What device `ordinal` is, and its launch limits, from one `hipGetDevicePropertiesR0600`.
pub(crate) fn read_device(
    api: &Api,
    ordinal: i32,
) -> std::result::Result<(DeviceInfo, LaunchGeometry), HipError> {
    let props = api.device_properties(ordinal)?;
    let total_memory = api
        .device_total_mem(ordinal)
        .map(|b| b as u64)
        .unwrap_or(props.props.totalGlobalMem as u64);
    let info = DeviceInfo {
        ordinal,
        name: c_chars(&props.props.name),
        arch: c_chars(&props.props.gcnArchName),
        total_memory,
    };
    Ok((info, launch_geometry(&props.props)))
}

/// The most scalar bytes a launch passes, and zero padding behind them: the largest segment.
const PARAM_SLACK: usize = 4096;
/// One slot per parameter the largest segment could declare (a byte each), so a kernel
/// declaring more than a launch passes finds zeros, never the array's end.
const PARAM_SLOTS: usize = PARAM_SLACK;

/// HIP's numbers for the launch rules it shares with CUDA ([`scope_native`]): [`PARAM_SLOTS`]
/// parameters, [`PARAM_SLACK`] scalar bytes, and per grid axis no more blocks than keep the
/// threads within `u32::MAX`, as `hipModuleLaunchKernel` demands. hiprtc gives every ROCm 6
/// kernel `_Float16`/`__half`.
pub(crate) const API_RULES: ApiRules = ApiRules {
    max_params: PARAM_SLOTS,
    max_scalar_bytes: PARAM_SLACK,
    max_param_bytes: PARAM_SLACK,
    grid_threads_within_u32: true,
    f16: true,
};

/// What every GPU ROCm 6 supports (GCN 5, CDNA, RDNA) has, for fields read as zero or less (a
/// struct unlike `ffi.rs`): blocks up to `1024 x 1024 x 1024` and 1,024 threads, 64 KiB LDS.
pub(crate) const ARCHITECTURAL_GEOMETRY: LaunchGeometry = LaunchGeometry {
    grid: [i32::MAX as u32, 65_535, 65_535],
    block: [1024; 3],
    threads: 1024,
    shared_memory: 64 << 10,
    subgroup: None,
};

/// What one launch may ask of the device, read once at open so the check agrees with a runtime
/// sizing its grid (a constant would let a device fail the launch instead of refusing it). A
/// field not positive falls back to [`ARCHITECTURAL_GEOMETRY`], with a warning.
pub(crate) fn launch_geometry(props: &DevicePropR0600) -> LaunchGeometry {
    let f = ARCHITECTURAL_GEOMETRY;
    let axes = |what: &str, values: [i32; 3], fallback: [u32; 3]| {
        [0, 1, 2].map(|i| match values[i] {
            // UINT32_MAX ("no limit") in the `int`; `API_RULES` bound the grid by the block.
            -1 if what == "maxGridSize" => u32::MAX,
            value => positive(&format!("{what}[{i}]"), value.into(), fallback[i]),
        })
    };
    let wavefront = u32::try_from(props.warpSize).ok().filter(|&w| w > 0);
    if wavefront.is_none() {
        tracing::warn!(
            "hip: warpSize reads {}; subgroup operations are not reported",
            props.warpSize
        );
    }
    LaunchGeometry {
        grid: axes("maxGridSize", props.maxGridSize, f.grid),
        block: axes("maxThreadsDim", props.maxThreadsDim, f.block),
        threads: positive(
            "maxThreadsPerBlock",
            props.maxThreadsPerBlock.into(),
            f.threads,
        ),
        shared_memory: positive(
            "sharedMemPerBlock",
            u32::try_from(props.sharedMemPerBlock)
                .unwrap_or(u32::MAX)
                .into(),
            f.shared_memory,
        ),
        subgroup: wavefront,
    }
}

/// `value` when positive; otherwise `fallback`, with a warning naming the property.
fn positive(what: &str, value: i64, fallback: u32) -> u32 {
    match u32::try_from(value) {
        Ok(value) if value > 0 => value,
        _ => {
            tracing::warn!(
                "hip: {what} reads {value}; using {fallback}, which every supported architecture has"
            );
            fallback
        }
    }
}

/// Load HIP and initialise it: the API, or why this backend is unavailable.
pub(crate) fn load() -> Result<Arc<Api>> {
    initialised(Api::get())
}

/// `hipInit` on a loaded API; a failed load or init is [`Error::BackendUnavailable`].
pub(crate) fn initialised(
    api: std::result::Result<Arc<Api>, crate::loader::LoadError>,
) -> Result<Arc<Api>> {
    let unavailable = |reason: String| Error::BackendUnavailable {
        backend: BACKEND,
        reason,
    };
    let api = api.map_err(|e| unavailable(e.to_string()))?;
    api.init().map_err(|e| unavailable(e.to_string()))?;
    Ok(api)
}

/// The HIP backend: one device.
pub struct Hip {
    pub(crate) api: Arc<Api>,
    pub(crate) info: DeviceInfo,
    /// Read once; `launch_limits` reports and `check_launch` enforces this copy, so they agree.
    pub(crate) limits: LaunchLimits,
    pub(crate) runtime_version: i32,
    pub(crate) pool: Pool,
    pub(crate) staging: Staging,
    /// The launch-parameter array, padded with zeros (see `launch.rs`).
    pub(crate) params: ParamTable,
    pub(crate) streams: Vec<Weak<StreamShared>>,
    /// This server's hold on the device, which a reset must not pull from under another's.
    pub(crate) holding: scope_native::Holding,
}

fn still_waited_on(id: StreamId) -> Error {
    Error::refused(format!(
        "{id} of the lost device is still waited on; recover once the wait ends"
    ))
}

impl Hip {
    /// Open device `ordinal`, or [`Error::BackendUnavailable`] if HIP cannot load or lacks it.
    pub fn open(ordinal: usize) -> Result<Self> {
        Self::on(load()?, ordinal)
    }

    /// Open device `ordinal` of the first of `runtime` that loads, with hiprtc from the first of
    /// `rtc` (or the runtime), for an install the search misses or a test; errors as [`Hip::open`].
    pub fn open_from(runtime: &[String], rtc: &[String], ordinal: usize) -> Result<Self> {
        Self::on(
            initialised(Api::load_from(runtime, rtc).map(Arc::new))?,
            ordinal,
        )
    }

    fn on(api: Arc<Api>, ordinal: usize) -> Result<Self> {
        let unavailable = |reason: String| Error::BackendUnavailable {
            backend: BACKEND,
            reason,
        };
        let count = api.device_count().map_err(|e| unavailable(e.to_string()))?;
        let Some(ordinal) = i32::try_from(ordinal).ok().filter(|&o| o < count) else {
            return Err(unavailable(format!(
                "no device {ordinal}: HIP reports {count} device(s)"
            )));
        };
        // Held before the device is touched: another server's reset refuses, or ends before
        // this one makes anything (`scope_native::reopen`).
        let holding = scope_native::Holding::new(BACKEND, ordinal as usize);
        api.set_device(ordinal)
            .map_err(|e| unavailable(e.to_string()))?;
        let (info, geometry) =
            read_device(&api, ordinal).map_err(|e| unavailable(e.to_string()))?;
        let limits = scope_native::launch_limits(&geometry, info.total_memory, &API_RULES);
        let runtime_version = api.runtime_version().unwrap_or(0);
        if let Err(why) = crate::api::rtc_status(&api) {
            tracing::warn!("hiprtc unavailable, kernels will not compile: {why}");
        }
        tracing::info!(device = %info.name, arch = %info.arch, "HIP device open");
        Ok(Self {
            api,
            info,
            limits,
            runtime_version,
            pool: Pool::default(),
            staging: Staging::default(),
            params: ParamTable::new(&API_RULES),
            streams: Vec::new(),
            holding,
        })
    }

    /// The device this backend drives.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub(crate) fn make_current(&self) -> Result<()> {
        self.api
            .set_device(self.info.ordinal)
            .map_err(|e| e.into_error(Doing::Other(None)))
    }

    pub(crate) fn describe(&self) -> String {
        let version = self.runtime_version;
        format!(
            "{} ({}, {} MiB, HIP runtime {}.{}) via {}",
            self.info.name,
            self.info.arch,
            self.info.total_memory >> 20,
            version / 10_000_000,
            (version / 100_000) % 100,
            self.api.runtime_path
        )
    }

    /// Destroy `stream`'s HIP objects on their device before a reset; [`attach`](Self::attach)
    /// gives it new ones. Refused while a waiter still shares its state.
    pub(crate) fn detach(stream: &mut HipStream) -> Result<()> {
        stream.retained.clear();
        stream.modules.clear();
        stream.spare_wait_events.clear();
        stream.order_event.destroy_now();
        let id = stream.id;
        let shared = Arc::get_mut(&mut stream.shared).ok_or_else(|| still_waited_on(id))?;
        *shared.pre_capture.get_mut() = None;
        shared.stream.destroy_now();
        Ok(())
    }

    /// Give a detached stream a new HIP stream and event on the current device.
    pub(crate) fn attach(&mut self, stream: &mut HipStream) -> Result<()> {
        let doing = || Doing::Other(Some(stream.id));
        let new = self.api.stream().map_err(|e| e.into_error(doing()))?;
        let order_event = self.api.event().map_err(|e| e.into_error(doing()))?;
        let id = stream.id;
        let shared = Arc::get_mut(&mut stream.shared).ok_or_else(|| still_waited_on(id))?;
        shared.stream = new;
        stream.order_event = order_event;
        self.streams.push(Arc::downgrade(&stream.shared));
        Ok(())
    }

    pub(crate) fn create_stream(&mut self, id: StreamId) -> Result<HipStream> {
        self.make_current()?;
        let doing = || Doing::Other(Some(id));
        let stream = self.api.stream().map_err(|e| e.into_error(doing()))?;
        let order_event = self.api.event().map_err(|e| e.into_error(doing()))?;
        let shared = Arc::new(StreamShared {
            stream,
            pre_capture: Mutex::new(None),
        });
        self.streams.retain(|s| s.strong_count() > 0);
        self.streams.push(Arc::downgrade(&shared));
        Ok(HipStream {
            id,
            shared,
            order_event,
            retained: Vec::new(),
            modules: Vec::new(),
            spare_wait_events: Vec::new(),
        })
    }

    /// One fence per live stream, marking everything submitted so far that
    /// will really run: memory freed now may be reused once all have passed.
    pub(crate) fn fence_all_streams(&mut self) -> std::result::Result<Vec<Arc<Event>>, HipError> {
        let mut fences = Vec::new();
        for shared in self.streams.iter().filter_map(Weak::upgrade) {
            if let Some(fence) = shared.pre_capture.lock().clone() {
                fences.push(fence);
                continue;
            }
            let event = self.api.event()?;
            event.record(&shared.stream)?;
            fences.push(Arc::new(event));
        }
        Ok(fences)
    }

    /// [`Backend::begin_wait`](scope_core::Backend::begin_wait): record an event at the stream's
    /// end, or take a recording stream's pre-capture fence, as an event would join the capture.
    pub(crate) fn begin_wait(&mut self, stream: &mut HipStream) -> Result<Option<HipWaiter>> {
        let id = stream.id;
        let failed = |e: HipError| e.into_error(Doing::Waiting(Some(id)));
        if let Some(fence) = stream.shared.pre_capture.lock().clone() {
            return Ok(Some(HipWaiter {
                on: WaitOn::Fence(fence),
                stream: id,
            }));
        }
        let event = match stream.spare_wait_events.pop() {
            Some(event) => event,
            None => {
                // Events belong to the current device.
                self.make_current()?;
                self.api.event().map_err(failed)?
            }
        };
        if let Err(e) = event.record(stream.stream()) {
            stream.spare_wait_events.push(event);
            return Err(failed(e));
        }
        Ok(Some(HipWaiter {
            on: WaitOn::Own(event),
            stream: id,
        }))
    }

    /// Whether the waiter's work finished, without blocking (for
    /// [`DeviceCollectives::finished`](scope_core::collective::device::DeviceCollectives::finished)).
    pub(crate) fn finished(waiter: &HipWaiter) -> Result<bool> {
        waiter
            .event()
            .is_done()
            .map_err(|e| e.into_error(Doing::Waiting(Some(waiter.stream))))
    }

    /// [`Backend::wait`](scope_core::Backend::wait), with no lock held: HIP lets any thread
    /// synchronise an event while others submit.
    pub(crate) fn wait(waiter: &HipWaiter) -> Result<()> {
        waiter
            .event()
            .synchronize()
            .map_err(|e| e.into_error(Doing::Waiting(Some(waiter.stream))))
    }

    /// [`Backend::end_wait`](scope_core::Backend::end_wait): keep the event for the next wait.
    pub(crate) fn end_wait(&mut self, stream: &mut HipStream, waiter: HipWaiter) -> Result<()> {
        if let WaitOn::Own(event) = waiter.on
            && stream.spare_wait_events.len() < SPARE_WAIT_EVENTS
        {
            stream.spare_wait_events.push(event);
        }
        Ok(())
    }

    pub(crate) fn order(&mut self, first: &mut HipStream, then: &mut HipStream) -> Result<()> {
        let doing = || Doing::Waiting(Some(then.id));
        let pre_capture = first.shared.pre_capture.lock().clone();
        match pre_capture {
            // `first` records: nothing runs until a replay, so wait for what it submitted.
            Some(fence) => then
                .stream()
                .wait(&fence)
                .map_err(|e| e.into_error(doing())),
            None => {
                first
                    .order_event
                    .record(first.stream())
                    .map_err(|e| e.into_error(doing()))?;
                then.stream()
                    .wait(&first.order_event)
                    .map_err(|e| e.into_error(doing()))
            }
        }
    }
}

impl std::fmt::Debug for Hip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hip({})", self.describe())
    }
}
