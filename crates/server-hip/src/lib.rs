//! A scope server over AMD HIP, loaded at run time.
//!
//! **This server has not run on AMD hardware.** Its loader, error classification and layouts
//! are unit-tested, and the whole server runs the conformance suite on a mock HIP runtime
//! (`tests/mock/mock_hip.c`); no test has launched a kernel on real HIP. Without ROCm 6 and a
//! GPU, device tests print `skipped: no hip device (...)`; `SCOPE_REQUIRE=hip` fails them.
//! `tests/toolchain.rs` compiles every HIP kernel the project emits on a real hiprtc
//! ([`hiprtc_code`]), for `gfx90a` and `gfx942` (which CI's ROCm 5.2 predates: skipped).
//!
//! # Shape
//!
//! The server is `scope_core::Server<Hip>`: the core does what servers share, and [`Hip`]
//! makes the device calls, a file per subject, each naming only the files below it. `ffi.rs`
//! has C types; `loader.rs` loads HIP and hiprtc with `dlopen`; `error.rs` maps HIP's codes.
//! `api.rs` holds every `unsafe` call and owned handles. `pool.rs` and `staging.rs` keep freed
//! blocks and pinned buffers. `device.rs` has [`Hip`], streams, order and waits outside the
//! server's lock. `memory.rs` allocates and frees; `copy.rs` writes, reads and copies;
//! `launch.rs` hiprtc and launch ([`scope_native`]); `capture.rs` HIP graphs; `collective.rs`
//! RCCL. `reopen.rs` resets a lost device ([`scope_native::reopen`]) with `hipDeviceReset`,
//! never under another client. `backend.rs` routes `Backend`.
//!
//! # Binding to HIP: a table of our own, loaded at run time
//!
//! The server must build, and its tests run (and skip), without ROCm: no link-time binding.
//! `cubecl-hip-sys` loads at run time, but panics inside `extern "C"` when the library is
//! missing, aborting the process. So the server owns a table of its 41 entry points, resolved
//! up front by `libloading`. A missing library is [`LoadError::LibraryNotFound`], a missing
//! symbol (ROCm 5 lacks `hipGetDevicePropertiesR0600`) [`LoadError::MissingSymbol`];
//! [`client`] answers `Error::BackendUnavailable`. The price: types and constants transcribed
//! by hand (`ffi.rs`), checked against ROCm 6/7's headers, the layout pinned by a test.
//! Without hiprtc (`libhiprtc`, or inside the runtime) the server copies and captures, and
//! compiling fails with the reason.
//!
//! # What differs from CUDA
//!
//! No indirect launch: an indirect dispatch reads its counts back first, failing in a capture.
//! Fewer sticky codes (`error.rs`). On ROCm a GPU memory fault often aborts the *process* (the
//! HSA runtime's default handler); the poison path runs only where the fault is reported.

mod api;
mod backend;
mod capture;
mod collective;
mod copy;
mod device;
mod error;
mod ffi;
mod launch;
mod loader;
mod memory;
mod pool;
mod reopen;
mod staging;

pub use capture::HipGraph;
pub use collective::{load_rccl, load_rccl_from};
pub use device::{DeviceInfo, Hip, HipStream, HipWaiter};
pub use launch::{HipKernel, compile_options, hiprtc_code};
pub use loader::LoadError;
pub use memory::HipMemory;

use scope_core::{Client, DeviceKind, Probe, ProbedDevice, Result};

/// A client of a new server on HIP device 0, or `Error::BackendUnavailable` (never a panic)
/// when HIP cannot load or finds no device.
pub fn client() -> Result<Client<Hip>> {
    client_on(0)
}

/// A client of a new server on HIP device `ordinal`; errors as [`client`].
pub fn client_on(ordinal: usize) -> Result<Client<Hip>> {
    Client::new(Hip::open(ordinal)?)
}

/// A client of a new server on device `ordinal` of the first of `runtime` that loads, with
/// hiprtc from the first of `rtc` (see [`Hip::open_from`]); errors as [`client`].
pub fn client_from(runtime: &[String], rtc: &[String], ordinal: usize) -> Result<Client<Hip>> {
    Client::new(Hip::open_from(runtime, rtc, ordinal)?)
}

/// What HIP finds: whether the runtime loads, and each device; never panics or aborts.
pub fn probe() -> Probe {
    let api = match device::load() {
        Ok(api) => api,
        Err(scope_core::Error::BackendUnavailable { reason, .. }) => {
            return Probe::none(error::BACKEND, reason);
        }
        Err(other) => return Probe::none(error::BACKEND, other.to_string()),
    };
    let count = match api.device_count() {
        Ok(count) => count,
        Err(e) => return Probe::none(error::BACKEND, e.to_string()),
    };
    let rtc = match api::rtc_status(&api) {
        Ok(()) => "hiprtc".to_owned(),
        Err(e) => format!("no hiprtc: {e}"),
    };
    let version = api.runtime_version().unwrap_or(0);
    let mut devices = Vec::new();
    for ordinal in 0..count {
        match device::device_info(&api, ordinal) {
            Ok(info) => devices.push(ProbedDevice {
                name: info.name,
                kind: DeviceKind::Hardware,
                detail: format!(
                    "{}, {} MiB, HIP {}.{}, {rtc}",
                    info.arch,
                    info.total_memory >> 20,
                    version / 10_000_000,
                    (version / 100_000) % 100
                ),
            }),
            Err(e) => tracing::warn!("HIP device {ordinal}: {e}"),
        }
    }
    if devices.is_empty() {
        return Probe::none(
            error::BACKEND,
            format!(
                "{} loaded but reports {count} usable device(s)",
                api.runtime_path
            ),
        );
    }
    Probe::found(error::BACKEND, devices)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without ROCm the probe gives a reason; with it, devices. Either way it returns.
    #[test]
    fn probe_answers_without_panicking() {
        let probe = probe();
        assert_eq!(probe.backend, error::BACKEND);
        if probe.has_device() {
            assert!(probe.why_not.is_none());
            assert!(
                probe.devices.iter().all(|d| d.detail.starts_with("gfx")),
                "{:?}",
                probe.devices
            );
        } else {
            let why = probe.why_not.as_deref().unwrap_or_default();
            assert!(!why.is_empty());
            println!("hip probe: {why}");
        }
    }

    /// Without a device, `client()` is `BackendUnavailable`: no panic, no other error.
    #[test]
    fn client_is_unavailable_or_works() {
        match client() {
            Ok(client) => assert_eq!(client.backend(), error::BACKEND),
            Err(scope_core::Error::BackendUnavailable { backend, reason }) => {
                assert_eq!(backend, error::BACKEND);
                assert!(!reason.is_empty());
            }
            Err(other) => panic!("expected BackendUnavailable, got {other}"),
        }
    }

    #[test]
    fn an_absent_device_ordinal_is_unavailable() {
        match client_on(usize::MAX) {
            Err(scope_core::Error::BackendUnavailable { .. }) => {}
            Err(other) => panic!("expected BackendUnavailable, got {other}"),
            Ok(_) => panic!("device {} exists", usize::MAX),
        }
    }
}
