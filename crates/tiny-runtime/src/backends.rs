//! Which servers are linked, and the one place the runtime names them.
//!
//! A cargo feature links a server crate (`wgpu` by default). Everything
//! else in the crate is generic over `B: Backend`, so this module is the
//! whole cost of supporting a backend: one `match` arm here. With several
//! features on (clippy builds `--all-features`), [`best`] picks at run time
//! in the order a user would want — a hardware device before a software
//! one, CUDA, HIP, Vulkan, wgpu — and `--backend` overrides it.
//!
//! A generic function cannot be a closure argument, so the work to run on
//! the chosen client is a [`OnClient`] value ([`OnClients`] for work on
//! several devices of one backend: each `client()` call of a server crate
//! opens a server of its own, on the same adapter).

use scope_core::{Backend, Client, DeviceKind, Error, Probe, Result};

/// Work to run on a client of whichever backend was chosen.
pub trait OnClient {
    /// What it returns.
    type Output;
    /// Run on `client`.
    fn run<B: Backend>(self, client: Client<B>) -> Self::Output;
}

/// Work to run on several clients of whichever backend was chosen, each a
/// server of its own.
pub trait OnClients {
    /// What it returns.
    type Output;
    /// Run on `clients`.
    fn run<B: Backend>(self, clients: Vec<Client<B>>) -> Self::Output;
}

/// The backends this build links, in order of preference.
pub const LINKED: &[&str] = &[
    #[cfg(feature = "cuda")]
    "cuda",
    #[cfg(feature = "hip")]
    "hip",
    #[cfg(feature = "vulkan")]
    "vulkan",
    #[cfg(feature = "wgpu")]
    "wgpu",
];

/// The probe of a linked backend; `None` for one not linked.
pub fn probe(backend: &str) -> Option<Probe> {
    match backend {
        #[cfg(feature = "cuda")]
        "cuda" => Some(server_cuda::probe()),
        #[cfg(feature = "hip")]
        "hip" => Some(server_hip::probe()),
        #[cfg(feature = "vulkan")]
        "vulkan" => Some(server_vulkan::probe()),
        #[cfg(feature = "wgpu")]
        "wgpu" => Some(server_wgpu::probe()),
        _ => None,
    }
}

/// The linked backend to use: the first with a hardware device, else the
/// first with any device, else `None` with each backend's reason.
pub fn best() -> std::result::Result<&'static str, String> {
    let probes: Vec<(&'static str, Probe)> = LINKED
        .iter()
        .filter_map(|name| probe(name).map(|p| (*name, p)))
        .collect();
    let hardware = probes
        .iter()
        .find(|(_, p)| p.devices.iter().any(|d| d.kind == DeviceKind::Hardware));
    let any = probes.iter().find(|(_, p)| p.has_device());
    match hardware.or(any) {
        Some((name, _)) => Ok(name),
        None if probes.is_empty() => {
            Err("this build links no server: enable a feature (wgpu, vulkan, cuda, hip)".to_owned())
        }
        None => Err(probes
            .iter()
            .map(|(name, p)| format!("{name}: {}", p.why_not.as_deref().unwrap_or("no device")))
            .collect::<Vec<_>>()
            .join("; ")),
    }
}

/// Make a client of `backend` and run `work` on it.
///
/// # Errors
///
/// [`Error::BackendUnavailable`] when the backend has no device here or is
/// not linked into this build.
pub fn with_client<W: OnClient>(backend: &str, work: W) -> Result<W::Output> {
    match backend {
        #[cfg(feature = "cuda")]
        "cuda" => Ok(work.run(server_cuda::client()?)),
        #[cfg(feature = "hip")]
        "hip" => Ok(work.run(server_hip::client()?)),
        #[cfg(feature = "vulkan")]
        "vulkan" => Ok(work.run(server_vulkan::client()?)),
        #[cfg(feature = "wgpu")]
        "wgpu" => Ok(work.run(server_wgpu::client()?)),
        other => {
            // Keeps `work` used in a build that links nothing.
            drop(work);
            Err(Error::BackendUnavailable {
                backend: "tiny-runtime",
                reason: format!(
                    "`{other}` is not linked into this build (linked: {}); build with --features {other}",
                    if LINKED.is_empty() {
                        "none".to_owned()
                    } else {
                        LINKED.join(", ")
                    }
                ),
            })
        }
    }
}

#[cfg_attr(
    not(any(
        feature = "cuda",
        feature = "hip",
        feature = "vulkan",
        feature = "wgpu"
    )),
    allow(dead_code)
)]
/// `count` clients (at least one) of `backend`, each from its own `client()`
/// call, so each its own server: logical devices on one adapter, or as
/// many contexts on one GPU.
fn open<B: Backend>(count: usize, client: fn() -> Result<Client<B>>) -> Result<Vec<Client<B>>> {
    (0..count.max(1)).map(|_| client()).collect()
}

/// Make `count` clients of `backend`, each a server of its own, and run
/// `work` on them.
///
/// # Errors
///
/// As [`with_client`]; the first error opening any of them.
pub fn with_clients<W: OnClients>(backend: &str, count: usize, work: W) -> Result<W::Output> {
    match backend {
        #[cfg(feature = "cuda")]
        "cuda" => Ok(work.run(open(count, server_cuda::client)?)),
        #[cfg(feature = "hip")]
        "hip" => Ok(work.run(open(count, server_hip::client)?)),
        #[cfg(feature = "vulkan")]
        "vulkan" => Ok(work.run(open(count, server_vulkan::client)?)),
        #[cfg(feature = "wgpu")]
        "wgpu" => Ok(work.run(open(count, server_wgpu::client)?)),
        other => {
            struct Unlinked<W>(W);
            impl<W: OnClients> OnClient for Unlinked<W> {
                type Output = W::Output;
                fn run<B: Backend>(self, client: Client<B>) -> Self::Output {
                    self.0.run(vec![client])
                }
            }
            with_client(other, Unlinked(work))
        }
    }
}

/// Lose `client`'s device for act four's survival: for real where the
/// server can lose one on demand, else by an injected sticky fault
/// ([`demo::inject_loss`](crate::demo::inject_loss)).
///
/// # Errors
///
/// As the loss: a device that was not lost.
pub fn lose_device<B: Backend>(client: &Client<B>) -> Result<(String, bool)> {
    #[cfg(feature = "wgpu")]
    if let Some(wgpu) = (client as &dyn std::any::Any).downcast_ref::<Client<server_wgpu::Wgpu>>() {
        return destroy_wgpu_device(wgpu);
    }
    crate::demo::inject_loss(client)
}

/// `wgpu::Device::destroy` on the server's own device, behind its back —
/// a real loss on lavapipe and llvmpipe as on a GPU — and a read, which is
/// where wgpu lets a destroyed device be learned.
///
/// # Errors
///
/// [`Error::Internal`] when the read did not find the device lost.
#[cfg(feature = "wgpu")]
fn destroy_wgpu_device(client: &Client<server_wgpu::Wgpu>) -> Result<(String, bool)> {
    let probe = client.upload(&[0; 4])?;
    client.with_backend(|wgpu| wgpu.raw().0.destroy());
    let seen = client.read(&probe);
    if client.poison().is_none() {
        return Err(Error::internal(format!(
            "a destroyed wgpu device was not seen lost: the read answered {seen:?}"
        )));
    }
    Ok(("wgpu::Device::destroy on its device".to_owned(), true))
}
