//! [`ScopeRuntime`]: the type a cubecl program names to run on a scope server.

use std::marker::PhantomData;

use cubecl_common::device::{Device, DeviceId, DeviceService, ServerUtilitiesHandle, ServiceId};
use cubecl_core::ir::TargetProperties;
use cubecl_core::zspace::{Shape, Strides};
use cubecl_runtime::runtime::Runtime;
use cubecl_runtime::server::ServerUtilities;
use cubecl_server::allocator::ContiguousMemoryLayoutPolicy;
use scope_core::Client;

use crate::backend::CubeBackend;
use crate::communication::transport;
use crate::device::ScopeDevice;
use crate::memory::contiguous;
use crate::properties::device_properties;
use crate::server::ScopeServer;

/// A cubecl runtime whose server is a scope server of backend `B`.
pub struct ScopeRuntime<B>(PhantomData<fn() -> B>);

impl<B> Clone for ScopeRuntime<B> {
    fn clone(&self) -> Self {
        Self(PhantomData)
    }
}

impl<B> std::fmt::Debug for ScopeRuntime<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScopeRuntime<{}>", std::any::type_name::<B>())
    }
}

impl<B: CubeBackend> ScopeRuntime<B> {
    /// The scope client under `device`'s cubecl server (stream 0), opening it if need be.
    pub fn scope_client(device: &ScopeDevice) -> Client<B> {
        drop(Self::client(device));
        B::peers()
            .opened(device.to_id())
            .expect("the server registered its client when it opened")
    }
}

impl<B: CubeBackend> DeviceService for ScopeServer<B> {
    /// Opens the scope server. cubecl's registry takes no error, so a missing device panics;
    /// ask [`Runtime::enumerate_all_devices`] first.
    fn init(device_id: DeviceId) -> Self {
        let device = ScopeDevice::from_id(device_id);
        let client = match B::open(&device) {
            Ok(client) => client,
            Err(error) => panic!("{}: {error}", B::RUNTIME_NAME),
        };
        let properties = device_properties(
            &client.limits(),
            B::target(),
            B::RUNTIME_NAME,
            client.describe(),
        );
        let layout = ContiguousMemoryLayoutPolicy::new(client.limits().binding_alignment as usize);
        let (mut utilities, captures) = ServerUtilities::init(
            ServiceId::of::<ScopeServer<B>>(device_id),
            B::RUNTIME_NAME,
            properties,
            TargetProperties::default(),
            Default::default(),
            layout,
        );
        utilities.device_transport = Some(transport());
        B::peers().register(device_id, client.clone());
        ScopeServer::new(device_id, client, utilities, captures)
    }

    fn utilities(&self) -> ServerUtilitiesHandle {
        cubecl_runtime::server::Server::utilities(self) as ServerUtilitiesHandle
    }
}

impl<B: CubeBackend> Runtime for ScopeRuntime<B> {
    type Server = ScopeServer<B>;
    type Device = ScopeDevice;

    /// Contiguous row-major only: scope's copies are linear.
    fn can_read_tensor(shape: &Shape, strides: &Strides) -> bool {
        contiguous(shape, strides)
    }

    fn target_properties() -> TargetProperties {
        TargetProperties::default()
    }

    /// Every device the server can open, or the logical split ([`crate::logical_devices`]).
    fn enumerate_devices(type_id: u16) -> Vec<DeviceId> {
        if type_id == 0 && B::probe().has_device() {
            let logical = B::SPLITS.then(crate::device::logical_devices).flatten();
            let count = logical.unwrap_or_else(B::device_count);
            (0..count).map(|index| DeviceId::new(0, index)).collect()
        } else {
            Vec::new()
        }
    }
}
