//! Collectives and transfers: cubecl's `ServerCommunication`, over `scope_core::collective`.
//! Every part is queued to a device thread and returns at once.

use cubecl_common::device::DeviceId;
use cubecl_environment::stream::StreamId;
use cubecl_runtime::server::{
    BufferBinding, ComputeWait, CopyDescriptor, Handle, Reduction, Server, ServerCommunication,
    ServerError,
};

use super::{ScopeServer, unsupported_strides, validation};
use crate::backend::CubeBackend;
use crate::communication::{Kind, Owned, reduction};
use crate::memory::contiguous;

impl<B: CubeBackend> ScopeServer<B> {
    /// Wait for the collectives and transfers that touch `bindings`.
    pub(super) fn settle<'a>(&mut self, bindings: impl IntoIterator<Item = &'a BufferBinding>) {
        self.communication
            .settle(bindings.into_iter().map(|binding| binding.memory.id()));
    }

    /// `binding`'s bytes, owned, for a part that outlives the call.
    pub(super) fn owned(&self, binding: &BufferBinding) -> Result<Owned, ServerError> {
        let resolved = self
            .memory
            .resolve(binding)?
            .ok_or_else(|| validation("an empty buffer between devices"))?;
        Ok(Owned {
            buffer: resolved.buffer.clone(),
            words: resolved.words.clone(),
            skip: resolved.skip(),
            len: resolved.len(),
            memory: binding.memory.id(),
        })
    }

    /// Queue this device's part of `kind`. A refused part leaves its destination carrying the
    /// refusal: cubecl queued it fire-and-forget.
    fn queue_part(
        &mut self,
        kind: Result<Kind, ServerError>,
        src: Option<BufferBinding>,
        dst: BufferBinding,
        stream_id: StreamId,
        device_ids: &[DeviceId],
    ) -> Result<(), ServerError> {
        let queued = kind.and_then(|kind| {
            let src = src.as_ref().map(|src| self.owned(src)).transpose()?;
            let owned = self.owned(&dst)?;
            let client = self.streams.base().clone();
            self.communication
                .collective(kind, src, owned, device_ids, client, stream_id)
        });
        if let Err(error) = &queued {
            self.fail_outputs(stream_id, std::iter::once(&dst), error.clone());
        }
        queued
    }
}

/// A reduction scope's collectives carry, or why not.
fn reduced(reduction_: Reduction) -> Result<Kind, ServerError> {
    reduction(reduction_.dtype, reduction_.op)
        .map(|(element, op)| Kind::AllReduce(element, op))
        .ok_or_else(|| {
            validation(format!(
                "scope's collectives reduce 16-, 32- and 64-bit floats and 8-, 32- and 64-bit integers, not {:?}",
                reduction_.dtype
            ))
        })
}

/// cubecl's communication, over `scope_core::collective` (see `communication.rs`).
impl<B: CubeBackend> ServerCommunication for ScopeServer<B> {
    /// Nothing to do: later calls on a part's buffers already wait for it.
    fn sync_collective(&mut self, _stream_id: StreamId) -> Result<(), ServerError> {
        Ok(())
    }

    fn comm_init(&mut self, device_ids: Vec<DeviceId>) -> Result<(), ServerError> {
        self.communication.init(&device_ids)
    }

    /// Under either [`ComputeWait`], later calls on `dst` wait for it.
    fn all_reduce(
        &mut self,
        src: BufferBinding,
        dst: BufferBinding,
        reduction: Reduction,
        stream_id: StreamId,
        device_ids: Vec<DeviceId>,
        _wait: ComputeWait,
    ) -> Result<(), ServerError> {
        let kind = reduced(reduction);
        self.queue_part(kind, Some(src), dst, stream_id, &device_ids)
    }

    fn all_gather(
        &mut self,
        src: BufferBinding,
        dst: BufferBinding,
        stream_id: StreamId,
        device_ids: Vec<DeviceId>,
    ) -> Result<(), ServerError> {
        self.queue_part(Ok(Kind::AllGather), Some(src), dst, stream_id, &device_ids)
    }

    fn reduce_scatter(
        &mut self,
        src: BufferBinding,
        dst: BufferBinding,
        reduction: Reduction,
        stream_id: StreamId,
        device_ids: Vec<DeviceId>,
    ) -> Result<(), ServerError> {
        let kind = reduced(reduction).map(|kind| match kind {
            Kind::AllReduce(element, op) => Kind::ReduceScatter(element, op),
            other => other,
        });
        self.queue_part(kind, Some(src), dst, stream_id, &device_ids)
    }

    fn broadcast(
        &mut self,
        src: Option<BufferBinding>,
        dst: BufferBinding,
        stream_id: StreamId,
        root: DeviceId,
        device_ids: Vec<DeviceId>,
    ) -> Result<(), ServerError> {
        let kind = device_ids
            .iter()
            .position(|id| *id == root)
            .map(|root| Kind::Broadcast { root })
            .ok_or_else(|| validation(format!("broadcast root {root:?} is no member")));
        self.queue_part(kind, src, dst, stream_id, &device_ids)
    }

    fn all_to_all(
        &mut self,
        src: BufferBinding,
        dst: BufferBinding,
        stream_id: StreamId,
        device_ids: Vec<DeviceId>,
    ) -> Result<(), ServerError> {
        self.queue_part(Ok(Kind::AllToAll), Some(src), dst, stream_id, &device_ids)
    }

    /// Hands the source to the peer's receive. A refused send still reaches it, carrying the
    /// refusal, so no receive waits for a send that will not come.
    fn send(
        &mut self,
        desc: CopyDescriptor,
        stream_id: StreamId,
        device_id_dst: DeviceId,
    ) -> Result<(), ServerError> {
        let src = if contiguous(&desc.shape, &desc.strides) {
            self.owned(&desc.handle)
        } else {
            Err(unsupported_strides())
        };
        let refused = src.as_ref().err().cloned();
        self.communication.send(src, device_id_dst, stream_id)?;
        refused.map_or(Ok(()), Err)
    }

    fn recv(
        &mut self,
        handle: Handle,
        stream_id: StreamId,
        device_id_src: DeviceId,
    ) -> Result<(), ServerError> {
        let size = handle.size();
        let made = self
            .initialize_memory(handle.memory.clone(), size, stream_id)
            .and_then(|()| self.owned(&handle.binding()));
        let client = self.streams.base().clone();
        match made {
            Ok(dst) => {
                self.communication
                    .recv(Some(dst), device_id_src, client, stream_id);
                Ok(())
            }
            Err(error) => {
                self.communication
                    .recv(None, device_id_src, client, stream_id);
                Err(error)
            }
        }
    }
}
