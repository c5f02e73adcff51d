//! Which servers are linked: the one place the runtime names them.
//!
//! A cargo feature links a server crate; the rest of the crate is generic
//! over `B: Backend`. A new backend costs one arm of `on_linked`, an
//! exhaustive `match` over [`BackendKind`]. A generic function cannot be a
//! closure argument, so the work to run is an [`OnClient`] value.

use scope_core::{Backend, BackendKind, Client, DeviceKind, Error, Probe, Result};

/// Work to run on a client of whichever backend was chosen.
pub trait OnClient {
    /// What it returns.
    type Output;
    /// Run on `client`.
    fn run<B: Backend>(self, client: Client<B>) -> Self::Output;
}

/// Work to run on several servers of whichever backend was chosen.
pub trait OnClients {
    /// What it returns.
    type Output;
    /// Run on `clients`.
    fn run<B: Backend>(self, clients: Vec<Client<B>>) -> Self::Output;
}

/// A linked server crate's two entry points.
struct Linked<B: Backend> {
    client: fn() -> Result<Client<B>>,
    probe: fn() -> Probe,
}

/// Work on a linked server crate, whichever it is.
trait OnLinked {
    type Output;
    fn run<B: Backend>(self, server: Linked<B>) -> Self::Output;
}

/// `fn $name(work)`: `work` run on `$server` if the feature links it.
macro_rules! linked {
    ($name:ident, $feature:literal, $server:ident) => {
        #[cfg(feature = $feature)]
        fn $name<W: OnLinked>(work: W) -> Option<W::Output> {
            Some(work.run(Linked {
                client: $server::client,
                probe: $server::probe,
            }))
        }

        #[cfg(not(feature = $feature))]
        fn $name<W: OnLinked>(_: W) -> Option<W::Output> {
            None
        }
    };
}

linked!(on_cuda, "cuda", server_cuda);
linked!(on_hip, "hip", server_hip);
linked!(on_vulkan, "vulkan", server_vulkan);
linked!(on_wgpu, "wgpu", server_wgpu);

/// Run `work` on `kind`'s server crate; `None` when this build lacks it.
fn on_linked<W: OnLinked>(kind: BackendKind, work: W) -> Option<W::Output> {
    match kind {
        BackendKind::Cuda => on_cuda(work),
        BackendKind::Hip => on_hip(work),
        BackendKind::Vulkan => on_vulkan(work),
        BackendKind::Wgpu => on_wgpu(work),
    }
}

/// The backends this build links, in order of preference.
pub fn linked() -> Vec<BackendKind> {
    struct Nothing;
    impl OnLinked for Nothing {
        type Output = ();
        fn run<B: Backend>(self, _: Linked<B>) {}
    }
    BackendKind::ALL
        .iter()
        .copied()
        .filter(|&kind| on_linked(kind, Nothing).is_some())
        .collect()
}

/// The probe of a linked backend; `None` for one not linked.
pub fn probe(backend: &str) -> Option<Probe> {
    struct Probing;
    impl OnLinked for Probing {
        type Output = Probe;
        fn run<B: Backend>(self, server: Linked<B>) -> Probe {
            (server.probe)()
        }
    }
    on_linked(BackendKind::from_name(backend)?, Probing)
}

/// The linked backend to use: hardware first, in the table's order.
pub fn best() -> std::result::Result<&'static str, String> {
    let probes: Vec<(&'static str, Probe)> = linked()
        .into_iter()
        .filter_map(|kind| probe(kind.name()).map(|p| (kind.name(), p)))
        .collect();
    let hardware = probes
        .iter()
        .find(|(_, p)| p.devices.iter().any(|d| d.kind == DeviceKind::Hardware));
    let any = probes.iter().find(|(_, p)| p.has_device());
    match hardware.or(any) {
        Some((name, _)) => Ok(name),
        None if probes.is_empty() => {
            let features: Vec<&str> = BackendKind::ALL.iter().map(|k| k.feature()).collect();
            Err(format!(
                "this build links no server: enable a feature ({})",
                features.join(", ")
            ))
        }
        None => Err(probes
            .iter()
            .map(|(name, p)| format!("{name}: {}", p.why_not.as_deref().unwrap_or("no device")))
            .collect::<Vec<_>>()
            .join("; ")),
    }
}

/// The error for a backend this build does not link.
fn unlinked(backend: &str) -> Error {
    let linked: Vec<&str> = linked().iter().map(|k| k.name()).collect();
    Error::BackendUnavailable {
        backend: "tiny-runtime",
        reason: format!(
            "`{backend}` is not linked into this build (linked: {}); build with --features {backend}",
            if linked.is_empty() {
                "none".to_owned()
            } else {
                linked.join(", ")
            }
        ),
    }
}

/// Make a client of `backend` and run `work` on it. Fails with
/// [`Error::BackendUnavailable`] when the backend has no device here or is not linked.
pub fn with_client<W: OnClient>(backend: &str, work: W) -> Result<W::Output> {
    struct One<W>(W);
    impl<W: OnClient> OnLinked for One<W> {
        type Output = Result<W::Output>;
        fn run<B: Backend>(self, server: Linked<B>) -> Self::Output {
            Ok(self.0.run((server.client)()?))
        }
    }
    match BackendKind::from_name(backend) {
        Some(kind) => on_linked(kind, One(work)),
        None => None,
    }
    .unwrap_or_else(|| Err(unlinked(backend)))
}

/// Run `work` on `count` servers of `backend`, each its own `client()` call:
/// logical devices on one adapter. Errors as [`with_client`], for any of them.
pub fn with_clients<W: OnClients>(backend: &str, count: usize, work: W) -> Result<W::Output> {
    struct Several<W>(usize, W);
    impl<W: OnClients> OnLinked for Several<W> {
        type Output = Result<W::Output>;
        fn run<B: Backend>(self, server: Linked<B>) -> Self::Output {
            let clients = (0..self.0.max(1)).map(|_| (server.client)());
            Ok(self.1.run(clients.collect::<Result<Vec<_>>>()?))
        }
    }
    match BackendKind::from_name(backend) {
        Some(kind) => on_linked(kind, Several(count, work)),
        None => None,
    }
    .unwrap_or_else(|| Err(unlinked(backend)))
}

/// Lose `client`'s device for act four's survival: for real where the server can,
/// else by [`demo::inject_loss`](crate::demo::inject_loss). Fails when nothing was lost.
pub fn lose_device<B: Backend>(client: &Client<B>) -> Result<(String, bool)> {
    #[cfg(feature = "wgpu")]
    if let Some(wgpu) = (client as &dyn std::any::Any).downcast_ref::<Client<server_wgpu::Wgpu>>() {
        return destroy_wgpu_device(wgpu);
    }
    crate::demo::inject_loss(client)
}

/// `wgpu::Device::destroy` behind the server's back, a real loss even on lavapipe,
/// then a read, where wgpu reports it. [`Error::Internal`] when the read finds no loss.
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
