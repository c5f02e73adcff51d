//! Finding an adapter and opening the device.
//!
//! A runtime should get the machine's best device without configuration, and
//! a person debugging it should be able to force any other. So the choice is
//! a ranking with two overrides:
//!
//! 1. Candidates are the adapters of the allowed APIs that run compute
//!    shaders. `SCOPE_WGPU_BACKEND` picks the API (by default Vulkan and GL,
//!    the two this build carries). `SCOPE_WGPU_ADAPTER` filters by name.
//! 2. Hardware ranks before software, and Vulkan before GL on a tie.
//! 3. The first candidate whose device opens wins. A software fallback is
//!    logged as a warning and shows in
//!    [`Backend::describe`](scope_core::Backend::describe), so a slow run
//!    says why.
//!
//! No candidate is [`Error::BackendUnavailable`], saying what was sought and
//! found, never a panic. wgpu loads the Vulkan and EGL libraries at run time,
//! and answers their absence with an empty adapter list.
//!
//! The device opens with the adapter's own limits, not WebGPU's defaults, so
//! the largest allocation is the adapter's. It enables each feature of
//! [`OPTIONAL`] the adapter offers, as `launch_limits` reports.
//!
//! A lost device is opened again from the same adapter, with the same
//! features and limits ([`Gpu::reopen`]).

use std::sync::Arc;

use scope_core::{DeviceKind, Error, Probe, ProbedDevice};

use crate::error::{NAME, Sink, block_on, no_panic};

/// A graphics API wgpu can drive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// Vulkan (lavapipe in CI).
    Vulkan,
    /// OpenGL / GLES through EGL (llvmpipe in CI).
    Gl,
    /// Metal. Not compiled into this build; asking for it finds nothing.
    Metal,
    /// Direct3D 12. Not compiled into this build; asking for it finds nothing.
    Dx12,
}

impl Api {
    fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "vulkan" | "vk" => Some(Api::Vulkan),
            "gl" | "gles" | "opengl" => Some(Api::Gl),
            "metal" | "mtl" => Some(Api::Metal),
            "dx12" | "d3d12" => Some(Api::Dx12),
            _ => None,
        }
    }

    fn backends(self) -> wgpu::Backends {
        match self {
            Api::Vulkan => wgpu::Backends::VULKAN,
            Api::Gl => wgpu::Backends::GL,
            Api::Metal => wgpu::Backends::METAL,
            Api::Dx12 => wgpu::Backends::DX12,
        }
    }

    /// Its name, as `SCOPE_WGPU_BACKEND` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Api::Vulkan => "vulkan",
            Api::Gl => "gl",
            Api::Metal => "metal",
            Api::Dx12 => "dx12",
        }
    }
}

/// Which adapter to open.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Only this API; `None` tries Vulkan, then GL.
    pub api: Option<Api>,
    /// Only adapters whose name contains this (case-insensitive).
    pub adapter: Option<String>,
    /// Which allowed adapter, numbered `0..`[`adapter_count`] in preference
    /// order. `None` opens the first that works, `Some(i)` only adapter `i`.
    pub index: Option<usize>,
}

impl Options {
    /// The options `SCOPE_WGPU_BACKEND` and `SCOPE_WGPU_ADAPTER` ask for.
    ///
    /// # Errors
    ///
    /// [`Error::BackendUnavailable`] when `SCOPE_WGPU_BACKEND` names no API.
    pub fn from_env() -> Result<Self, Error> {
        let api = match std::env::var("SCOPE_WGPU_BACKEND") {
            Ok(text) if !text.trim().is_empty() => {
                Some(Api::parse(&text).ok_or_else(|| Error::BackendUnavailable {
                    backend: NAME,
                    reason: format!(
                        "SCOPE_WGPU_BACKEND={text} is not one of vulkan, gl, metal, dx12"
                    ),
                })?)
            }
            _ => None,
        };
        let adapter = std::env::var("SCOPE_WGPU_ADAPTER")
            .ok()
            .filter(|s| !s.trim().is_empty());
        Ok(Self {
            api,
            adapter,
            index: None,
        })
    }

    /// Only `api`.
    pub fn api(api: Api) -> Self {
        Self {
            api: Some(api),
            ..Self::default()
        }
    }

    fn backends(&self) -> wgpu::Backends {
        match self.api {
            Some(api) => api.backends(),
            None => wgpu::Backends::VULKAN | wgpu::Backends::GL,
        }
    }

    fn describe(&self) -> String {
        let api = self.api.map_or("vulkan or gl", Api::name);
        match &self.adapter {
            Some(name) => format!("{api} adapter named like {name:?}"),
            None => format!("{api} adapter"),
        }
    }
}

/// The optional features enabled where the adapter offers them: `f16`,
/// subgroups and their barriers, and `f32` storage atomics. Each shows in
/// [`LaunchLimits`](scope_core::LaunchLimits)' features.
pub const OPTIONAL: wgpu::Features = wgpu::Features::SHADER_F16
    .union(wgpu::Features::SUBGROUP)
    .union(wgpu::Features::SUBGROUP_BARRIER)
    .union(wgpu::Features::SHADER_FLOAT32_ATOMIC);

/// The opened device and what the server needs to know about it.
pub(crate) struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: wgpu::AdapterInfo,
    /// The limits the device was asked for: the adapter's own.
    pub(crate) limits: wgpu::Limits,
    /// The optional features enabled: [`OPTIONAL`], as the adapter offers them.
    pub(crate) features: wgpu::Features,
    pub(crate) sink: Arc<Sink>,
    /// The adapter a lost device is asked of again ([`Gpu::reopen`]).
    adapter: wgpu::Adapter,
    // Kept so the instance outlives the device on every backend.
    _instance: wgpu::Instance,
}

/// A device just opened, with the server's sink installed.
struct Opened {
    device: wgpu::Device,
    queue: wgpu::Queue,
    sink: Arc<Sink>,
}

/// Ask `adapter` for a device, installing the sink before anything can reach
/// it. Opening and reopening share it. Never panics.
fn request(
    adapter: &wgpu::Adapter,
    features: wgpu::Features,
    limits: &wgpu::Limits,
) -> Result<Opened, String> {
    let desc = wgpu::DeviceDescriptor {
        label: Some("scope"),
        required_features: features,
        required_limits: limits.clone(),
        ..Default::default()
    };
    let asked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        block_on(adapter.request_device(&desc)).map(|(device, queue)| {
            let sink = Sink::install(&device);
            Opened {
                device,
                queue,
                sink,
            }
        })
    }));
    match asked {
        Ok(Ok(opened)) => Ok(opened),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err("wgpu panicked while opening the device".to_owned()),
    }
}

fn instance(backends: wgpu::Backends) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    // API validation layers are for debugging wgpu; `WGPU_VALIDATION=1` enables them.
    // Indirect-call validation is always on: it alone bounds counts in device
    // memory. Without it, lavapipe runs `u32::MAX` workgroups for hours.
    desc.flags =
        wgpu::InstanceFlags::empty().with_env() | wgpu::InstanceFlags::VALIDATION_INDIRECT_CALL;
    wgpu::Instance::new(desc)
}

fn rank(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let kind = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let api = match info.backend {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 => 0,
        _ => 1,
    };
    (kind, api)
}

pub(crate) fn kind(info: &wgpu::AdapterInfo) -> DeviceKind {
    if info.device_type == wgpu::DeviceType::Cpu {
        DeviceKind::Software
    } else {
        DeviceKind::Hardware
    }
}

fn api_name(backend: wgpu::Backend) -> &'static str {
    match backend {
        wgpu::Backend::Vulkan => "vulkan",
        wgpu::Backend::Gl => "gl",
        wgpu::Backend::Metal => "metal",
        wgpu::Backend::Dx12 => "dx12",
        wgpu::Backend::BrowserWebGpu => "webgpu",
        wgpu::Backend::Noop => "noop",
    }
}

/// "llvmpipe (LLVM 15.0.6, 256 bits), software, vulkan, llvmpipe Mesa 22.3.6".
pub(crate) fn describe(info: &wgpu::AdapterInfo) -> String {
    let mut text = format!("{}, {}, {}", info.name, kind(info), api_name(info.backend));
    let driver = [info.driver.as_str(), info.driver_info.as_str()]
        .iter()
        .filter(|s| !s.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
    if !driver.is_empty() {
        text.push_str(", ");
        text.push_str(&driver);
    }
    text
}

impl Gpu {
    /// Open the best adapter `options` allow.
    pub(crate) fn open(options: &Options) -> Result<Self, Error> {
        let unavailable = |reason: String| Error::BackendUnavailable {
            backend: NAME,
            reason,
        };
        let instance = instance(options.backends());
        let (found, mut candidates) = candidates(&instance, options);
        if let Some(index) = options.index {
            let count = candidates.len();
            candidates = candidates.into_iter().skip(index).take(1).collect();
            if candidates.is_empty() {
                return Err(unavailable(format!(
                    "adapter {index} does not exist: {count} {} here",
                    options.describe()
                )));
            }
        }
        let mut refused = Vec::new();
        for adapter in candidates {
            let info = adapter.get_info();
            let limits = adapter.limits();
            let features = adapter.features() & OPTIONAL;
            match request(&adapter, features, &limits) {
                Ok(Opened {
                    device,
                    queue,
                    sink,
                }) => {
                    let text = describe(&info);
                    if kind(&info) == DeviceKind::Software {
                        tracing::warn!(backend = NAME, adapter = %text, "no hardware adapter; using a software one");
                    } else {
                        tracing::info!(backend = NAME, adapter = %text, "adapter chosen");
                    }
                    tracing::info!(backend = NAME, ?features, "optional features enabled");
                    return Ok(Self {
                        device,
                        queue,
                        info,
                        limits,
                        features,
                        sink,
                        adapter,
                        _instance: instance,
                    });
                }
                Err(error) => {
                    tracing::warn!(backend = NAME, adapter = %describe(&info), "device refused: {error}");
                    refused.push(format!("{}: {error}", describe(&info)));
                }
            }
        }
        let mut reason = format!("no {} with compute shaders", options.describe());
        if found.is_empty() {
            reason.push_str(" (wgpu found no adapter at all");
            if matches!(options.api, Some(Api::Metal | Api::Dx12)) {
                reason.push_str("; this build carries only vulkan and gl");
            }
            reason.push(')');
        } else {
            reason.push_str(&format!(" (found: {})", found.join("; ")));
        }
        if !refused.is_empty() {
            reason.push_str(&format!("; device refused: {}", refused.join("; ")));
        }
        Err(unavailable(reason))
    }

    /// Give the device up and ask the same adapter for a new one, as first asked.
    /// The old sink is retired first, so teardown never reads as a fault. The
    /// old device is destroyed, so nothing naming it runs beside the new one.
    /// Every object made on it must be gone. On a refusal the old device stays
    /// given up, and a later call tries again.
    pub(crate) fn reopen(&mut self) -> Result<(), Error> {
        self.sink.retire();
        let device = &self.device;
        let _ = no_panic(&self.sink, "giving the lost device up", || {
            device.destroy();
            let _ = device.poll(wgpu::PollType::Poll);
        });
        let opened = request(&self.adapter, self.features, &self.limits).map_err(|error| {
            Error::BackendUnavailable {
                backend: NAME,
                reason: format!(
                    "{} gave no new device for the lost one: {error}",
                    describe(&self.info)
                ),
            }
        })?;
        let old = (
            std::mem::replace(&mut self.queue, opened.queue),
            std::mem::replace(&mut self.device, opened.device),
        );
        let retired = std::mem::replace(&mut self.sink, opened.sink);
        // The queue's drop waits for the old device to go idle; a real loss answers at once.
        let _ = no_panic(&retired, "dropping the lost device", move || drop(old));
        tracing::info!(backend = NAME, adapter = %self.describe(), "device opened again");
        Ok(())
    }

    /// The description `Backend::describe` gives.
    /// The alignment of a scalar blob in an arena, bound as storage or uniform.
    pub(crate) fn scalar_alignment(&self) -> u64 {
        u64::from(
            self.limits
                .min_storage_buffer_offset_alignment
                .max(self.limits.min_uniform_buffer_offset_alignment),
        )
    }

    pub(crate) fn describe(&self) -> String {
        describe(&self.info)
    }
}

/// The adapters `options` allow, in the order the server prefers them,
/// and a description of every adapter found (for the error when none fits).
fn candidates(instance: &wgpu::Instance, options: &Options) -> (Vec<String>, Vec<wgpu::Adapter>) {
    let adapters = block_on(instance.enumerate_adapters(options.backends()));
    let found: Vec<String> = adapters.iter().map(|a| describe(&a.get_info())).collect();
    let wanted = options.adapter.as_deref().map(str::to_ascii_lowercase);
    let mut allowed: Vec<wgpu::Adapter> = adapters
        .into_iter()
        .filter(|a| {
            let info = a.get_info();
            let named = wanted
                .as_deref()
                .is_none_or(|w| info.name.to_ascii_lowercase().contains(w));
            let compute = a
                .get_downlevel_capabilities()
                .flags
                .contains(wgpu::DownlevelFlags::COMPUTE_SHADERS);
            named && compute
        })
        .collect();
    allowed.sort_by_key(|a| rank(&a.get_info()));
    (found, allowed)
}

/// The API of the adapter [`client_with`](crate::client_with) would open first.
/// A program's devices should share it: kernel features differ between APIs.
pub fn first_api(options: &Options) -> Option<Api> {
    let (_, allowed) = candidates(&instance(options.backends()), options);
    match allowed.first()?.get_info().backend {
        wgpu::Backend::Vulkan => Some(Api::Vulkan),
        wgpu::Backend::Gl => Some(Api::Gl),
        wgpu::Backend::Metal => Some(Api::Metal),
        wgpu::Backend::Dx12 => Some(Api::Dx12),
        _ => None,
    }
}

/// How many adapters `options` allow, as [`Options::index`] numbers them.
pub fn adapter_count(options: &Options) -> usize {
    candidates(&instance(options.backends()), options).1.len()
}

/// Every adapter wgpu finds, per API, with its type; never panics.
pub fn probe() -> Probe {
    let run = || {
        let mut devices = Vec::new();
        for api in [Api::Vulkan, Api::Gl] {
            let instance = instance(api.backends());
            for adapter in block_on(instance.enumerate_adapters(api.backends())) {
                let info = adapter.get_info();
                let compute = adapter
                    .get_downlevel_capabilities()
                    .flags
                    .contains(wgpu::DownlevelFlags::COMPUTE_SHADERS);
                let mut detail = format!("{}, {:?}", api.name(), info.device_type);
                if !info.driver.is_empty() || !info.driver_info.is_empty() {
                    detail.push_str(&format!(", {} {}", info.driver, info.driver_info));
                }
                if !compute {
                    detail.push_str(", no compute shaders");
                }
                devices.push(ProbedDevice {
                    name: info.name.clone(),
                    kind: kind(&info),
                    detail: detail.trim_end().to_owned(),
                });
            }
        }
        devices
    };
    match std::panic::catch_unwind(run) {
        Ok(devices) if devices.is_empty() => {
            Probe::none(NAME, "wgpu found no vulkan or gl adapter")
        }
        Ok(devices) => Probe::found(NAME, devices),
        Err(_) => Probe::none(NAME, "wgpu panicked while enumerating adapters"),
    }
}
