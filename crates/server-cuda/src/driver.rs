//! The driver before any server: loading, versions, device facts, probe, the primary context.
//!
//! cudarc **panics** on the first driver call when `libcuda` is missing. So nothing here calls the
//! driver before [`driver()`] has tried to `dlopen` it and run `cuInit`, once per process. Every
//! entry point ([`client`](crate::client), [`probe`]) goes through it: a machine without CUDA gets
//! [`Error::BackendUnavailable`], never a panic. Every other file stands on this one.

use std::ffi::c_char;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, result, sys};
use scope_core::{DeviceKind, Error, Probe, ProbedDevice, Result};
use scope_native::{LaunchGeometry, c_chars};

use crate::error::{BACKEND, Doing, driver as driver_error, mark_driver_loaded};
use crate::nvrtc::nvrtc_present;
use crate::ptx::CudaVersion;

static DRIVER: OnceLock<Result<()>> = OnceLock::new();

/// Whether the CUDA driver is loaded and initialised; asked once, never panics.
pub(crate) fn driver() -> Result<()> {
    DRIVER
        .get_or_init(|| {
            // SAFETY: `is_culib_present` only opens and drops candidate libraries.
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

#[derive(Clone, Debug)]
pub(crate) struct DeviceInfo {
    pub(crate) ordinal: usize,
    pub(crate) name: String,
    pub(crate) capability: (i32, i32),
    pub(crate) total_memory: u64,
}

const WARP: u32 = 32;

/// What every supported device (compute capability 3.0+) has. An attribute the driver will not read
/// falls back to it: never a guess past the device.
pub(crate) const ARCHITECTURAL_GEOMETRY: LaunchGeometry = LaunchGeometry {
    grid: [i32::MAX as u32, 65_535, 65_535],
    block: [1024, 1024, 64],
    threads: 1024,
    shared_memory: 48 << 10,
    subgroup: Some(WARP),
};

/// What one launch on `ctx`'s device may ask for, read once so the runtime and the check agree. A
/// constant would let a launch past a smaller grid fail on the device. An attribute the driver does
/// not answer takes its [`ARCHITECTURAL_GEOMETRY`] value.
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

/// The driver's CUDA version, asked without `cuInit` so it answers with no device. It decides the
/// PTX the driver JITs ([`CudaVersion::ptx_isa`]).
///
/// # Errors
///
/// [`Error::BackendUnavailable`] when the driver library is missing or silent.
pub fn cuda_driver_version() -> Result<CudaVersion> {
    // SAFETY: `is_culib_present` only opens and drops candidate libraries.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::BackendUnavailable {
            backend: BACKEND,
            reason: "the CUDA driver library (libcuda) was not found here".to_owned(),
        });
    }
    let mut version = 0;
    // SAFETY: the library is here; `cuDriverGetVersion` needs no `cuInit`; one int.
    let status = unsafe { sys::cuDriverGetVersion(&mut version) };
    status.result().map_err(|e| Error::BackendUnavailable {
        backend: BACKEND,
        reason: format!("cuDriverGetVersion: {e:?}"),
    })?;
    CudaVersion::from_driver(version).ok_or_else(|| Error::BackendUnavailable {
        backend: BACKEND,
        reason: format!("cuDriverGetVersion answered {version}"),
    })
}

/// The driver's CUDA version, `(major, minor)`.
pub(crate) fn driver_version() -> Result<(i32, i32)> {
    let mut version = 0;
    // SAFETY: callers ran `driver()` first; `version` holds one int.
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
    // SAFETY: the driver writes at most `len` chars, NUL-terminated.
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

/// Device `ordinal`'s memory in bytes: the largest allocation accepted.
///
/// # Errors
///
/// [`Error::BackendUnavailable`] with no driver here; the driver's error.
pub fn total_memory(ordinal: usize) -> Result<u64> {
    driver()?;
    device_info(ordinal).map(|info| info.total_memory)
}

/// What this machine has, for `cargo xtask matrix`; never panics.
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
    // SAFETY: tracking orders `CudaSlice`s; this backend makes none and orders streams itself.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}
