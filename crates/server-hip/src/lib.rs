//! A scope server over AMD HIP, loaded at run time.
//!
//! **This server has not run on AMD hardware.** It was written without
//! ROCm or an AMD GPU. Its loader, error classification and struct
//! layouts are unit-tested. The whole server runs the conformance suite
//! against a mock HIP runtime (`tests/mock/mock_hip.c`). No test has
//! launched a kernel on real HIP. Device tests print `skipped: no hip
//! device (...)` without ROCm 6 and a GPU; `SCOPE_REQUIRE=hip` fails them.
//!
//! # Shape
//!
//! The server is `scope_core::Server<Hip>`: the core does everything the
//! servers share, and [`Hip`] makes the device calls, a file per subject:
//!
//! - `loader.rs`: the table of HIP and hiprtc entry points, loaded with
//!   `dlopen`; `ffi.rs`: the C types and constants it uses.
//! - `api.rs`: every `unsafe` call, and owned handles that destroy
//!   themselves.
//! - `device.rs`: the device, streams, cross-stream order, waits on an
//!   event without the server's lock.
//! - `memory.rs`: the pooled device memory and pinned staging.
//! - `copy.rs`: host writes (and recorded ones), reads, device copies.
//! - `launch.rs`: hiprtc compile for the device's `gcnArchName`, and
//!   launch, under the rules HIP shares with CUDA ([`scope_native`]).
//! - `collective.rs`: collectives through RCCL (`DeviceCollectives`),
//!   loaded at run time.
//! - `capture.rs`: stream capture into HIP graphs, which keep their
//!   kernels' modules loaded; replay; destroy.
//! - `reopen.rs`: HIP's calls for reopening a lost device
//!   ([`scope_native::reopen`]): `hipDeviceReset`, never under another
//!   client of the device. Tested on the mock runtime only.
//! - `error.rs`: HIP's codes classified into the core's error, with each
//!   fault's class. The codes CUDA calls process-fatal are, for HIP too.
//! - `backend.rs`: the `Backend` impl, routing to the above.
//!
//! # Binding to HIP: a table of our own, loaded at run time
//!
//! The server must build, and its tests run (and skip), without ROCm. That
//! rules out a link-time binding, which needs ROCm's headers and library.
//!
//! `cubecl-hip-sys` loads at run time, but its wrappers panic inside
//! `extern "C"` functions when the library is missing: the process aborts.
//! So the server owns a table of its forty-one entry points (`loader.rs`).
//! `libloading` opens the library and resolves every symbol up front. A
//! missing library is [`LoadError::LibraryNotFound`], a missing symbol
//! [`LoadError::MissingSymbol`]; [`client`] answers
//! `Error::BackendUnavailable`. Nothing here panics for want of ROCm. The
//! price: types and constants are transcribed by hand (`ffi.rs`), checked
//! against ROCm 6/7's headers, the properties layout pinned by a test.
//!
//! ROCm 6 or later is required (`hipGetDevicePropertiesR0600`). hiprtc is
//! found as `libhiprtc`, or inside the runtime. Without it the server
//! still copies and captures; compiling fails with the reason.
//!
//! ROCm 5's runtime is refused, typed: it lacks
//! `hipGetDevicePropertiesR0600`, so loading answers
//! [`LoadError::MissingSymbol`]. Its `hipDeviceProp_t` has another layout
//! (792 bytes, against ROCm 6's 1472) in any case.
//!
//! # Checked against the real compiler
//!
//! `tests/toolchain.rs` compiles every HIP kernel the project emits
//! through [`hiprtc_code`] on a real hiprtc, for `gfx90a` and `gfx942`. It
//! checks each code object defines the entry point. CI installs Debian's
//! ROCm 5.2 (`ci/install-hip-toolchain.sh`), whose hiprtc predates gfx942:
//! the test reports gfx942 skipped there.
//!
//! # What differs from CUDA
//!
//! - HIP has no indirect launch: an indirect dispatch reads its counts
//!   back first, and fails inside a capture.
//! - HIP defines fewer sticky codes than CUDA; see `error.rs`. On ROCm a
//!   GPU memory fault often aborts the *process* (the HSA runtime's
//!   default handler). The poison path runs only where the runtime
//!   reports the fault instead.

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
mod reopen;

pub use capture::HipGraph;
pub use collective::{load_rccl, load_rccl_from};
pub use device::{DeviceInfo, Hip, HipStream, HipWaiter};
pub use launch::{HipKernel, compile_options, hiprtc_code};
pub use loader::LoadError;
pub use memory::HipMemory;

use scope_core::{Client, DeviceKind, Probe, ProbedDevice, Result};

/// A client of a new server on HIP device 0.
///
/// # Errors
///
/// `Error::BackendUnavailable` when the HIP runtime cannot be loaded, lacks
/// an entry point, or finds no device — never a panic.
pub fn client() -> Result<Client<Hip>> {
    client_on(0)
}

/// A client of a new server on HIP device `ordinal`.
///
/// # Errors
///
/// As [`client`].
pub fn client_on(ordinal: usize) -> Result<Client<Hip>> {
    Client::new(Hip::open(ordinal)?)
}

/// A client of a new server on device `ordinal` of the HIP runtime at the
/// first of `runtime` that loads, with hiprtc from the first of `rtc` (see
/// [`Hip::open_from`]).
///
/// # Errors
///
/// As [`client`].
pub fn client_from(runtime: &[String], rtc: &[String], ordinal: usize) -> Result<Client<Hip>> {
    Client::new(Hip::open_from(runtime, rtc, ordinal)?)
}

/// What HIP finds on this machine: whether the runtime loads, and each
/// device's name, architecture and memory. Never panics or aborts.
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

    /// Here (no ROCm) the probe answers with a reason; where ROCm is
    /// installed it lists devices. Either way it returns.
    #[test]
    fn probe_answers_without_panicking() {
        let probe = probe();
        assert_eq!(probe.backend, "hip");
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

    /// Without a device, `client()` is `BackendUnavailable`, never a panic
    /// and never another error.
    #[test]
    fn client_is_unavailable_or_works() {
        match client() {
            Ok(client) => assert_eq!(client.backend(), "hip"),
            Err(scope_core::Error::BackendUnavailable { backend, reason }) => {
                assert_eq!(backend, "hip");
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
