//! A scope server over AMD HIP, loaded at run time.
//!
//! **This server has not run on AMD hardware.** It was written and built on
//! machines without ROCm or an AMD GPU: its loader, its error
//! classification and its struct layouts are unit-tested, and every rule of
//! the failure model it relies on is tested through the core on the
//! reference server, and the whole server runs the conformance suite
//! against a mock HIP runtime (`tests/mock/mock_hip.c`) — but no test has
//! launched a kernel on real HIP. Its device
//! tests print `skipped: no hip device (...)` until they run on a machine
//! with ROCm 6 or later and a supported GPU (`SCOPE_REQUIRE=hip` makes them
//! fail instead of skip).
//!
//! # Shape
//!
//! The server is `scope_core::Server<Hip>`: the core does everything the
//! servers share (taint, scopes, capture windows, cross-stream ordering,
//! late-fault attribution, poison, fault injection at every device call
//! site), and [`Hip`] makes the device calls, one file per subject:
//!
//! - `loader.rs`: the table of HIP and hiprtc entry points, loaded with
//!   `dlopen`; `ffi.rs`: the C types and constants it uses.
//! - `api.rs`: every `unsafe` call, and owned handles that destroy
//!   themselves.
//! - `device.rs`: the device, streams, cross-stream order, waits (on an
//!   event, without the server's lock).
//! - `memory.rs`: the pooled device memory and pinned staging.
//! - `copy.rs`: host writes (and recorded ones), reads, device copies.
//! - `launch.rs`: hiprtc compile for the device's `gcnArchName`, launch,
//!   under the launch rules HIP shares with CUDA
//!   ([`scope_native`]) with HIP's numbers.
//! - `collective.rs`: the collectives on the devices through RCCL
//!   (`DeviceCollectives`, for `Group::over_device`), loaded at run time;
//!   the communicator is the core's, shared with CUDA's NCCL.
//! - `capture.rs`: stream capture into HIP graphs (which keep the modules
//!   of the kernels they launch loaded), replay, destroy.
//! - `reopen.rs`: a lost device opened again — refused with
//!   `RestartRequired` after the codes CUDA's documentation calls
//!   process-fatal (HIP's says nothing, so it follows CUDA's rule for the
//!   codes they share), `hipDeviceReset` after the others, and never a
//!   reset under another client of the same device. Tested on the mock
//!   runtime only (`tests/mock_recover.rs`, and the conformance suite's
//!   recovery behaviours in `tests/mock.rs`).
//! - `error.rs`: HIP's codes classified into the core's error.
//! - `backend.rs`: the `Backend` impl, routing to the above.
//!
//! # Binding to HIP: a table of our own, loaded at run time
//!
//! The server must build, and its tests must run (and skip), on machines
//! without ROCm, and `cargo build --workspace --all-features` must work
//! there. That rules out a link-time binding: the crates that bind HIP at
//! build time need the ROCm headers to build and `libamdhip64` to start.
//!
//! Of the run-time loaders, `cubecl-hip-sys` is maintained and has ROCm 6/7
//! bindings, but its generated wrappers panic inside `extern "C"` functions
//! when the library is missing — which aborts the process — so every call
//! would have to sit behind an availability check that nothing enforces.
//! The server needs about forty-one entry points, so it owns a table of them
//! instead (`loader.rs`): `libloading` opens the library, every symbol is
//! resolved up front, and the loader answers `Result` — a missing library
//! is [`LoadError::LibraryNotFound`], a missing symbol is
//! [`LoadError::MissingSymbol`] naming it — which [`client`] turns into
//! `Error::BackendUnavailable`. Nothing in this crate can panic or abort for
//! want of ROCm. The price is that the types and constants the table uses
//! are transcribed by hand (`ffi.rs`), each checked against the ROCm 6/7
//! headers; the device-properties layout is pinned by a unit test.
//!
//! ROCm 6 or later is required (`hipGetDevicePropertiesR0600`). hiprtc is
//! found as `libhiprtc` (or, failing that, inside the runtime); without it
//! the server still copies and captures, and compiling fails with the
//! reason.
//!
//! ROCm 5's runtime is refused, typed: `libamdhip64.so.5` has no
//! `hipGetDevicePropertiesR0600`, so loading it answers
//! [`LoadError::MissingSymbol`] (`BackendUnavailable` from [`client`])
//! before any call. Its `hipDeviceProp_t` is another layout (792 bytes,
//! `totalGlobalMem` at 256 and `gcnArchName` at 396, where ROCm 6's put a
//! UUID and LUID first and have them at 288 and 1160 of 1472), so it could
//! not be read through this crate's struct in any case.
//!
//! # Checked against the real compiler
//!
//! `tests/toolchain.rs` compiles every HIP kernel the project emits (this
//! crate's test kernels, tiny-runtime's, scope-cube's translations) through
//! [`hiprtc_code`] — the server's own hiprtc call, with no runtime or
//! device — on a real hiprtc, for `gfx90a` and `gfx942`, and checks each
//! code object defines the entry point. CI can install only Debian's ROCm
//! 5.2 (`ci/install-hip-toolchain.sh`), whose hiprtc compiles for gfx90a
//! but predates gfx942 and aborts the process when asked for it; the test
//! reports gfx942 skipped there.
//!
//! # What differs from CUDA
//!
//! - HIP has no indirect launch: an indirect dispatch reads its counts back
//!   first, and fails inside a capture.
//! - HIP defines fewer sticky codes than CUDA (no misaligned-address or
//!   illegal-instruction codes); see `error.rs`. On ROCm a GPU memory fault
//!   is often fatal to the *process* (the HSA runtime's default queue-error
//!   handler aborts), in which case no error ever reaches the server; the
//!   poison path runs only where the runtime reports the fault instead.

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
pub use reopen::PROCESS_FATAL;

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
