//! Host copies: cubecl's reads, writes, syncs and checks, as scope's.
//!
//! A read or sync of bytes a collective has still to land in waits on the caller's future,
//! not the device thread. The peer's part may be queued behind this device's other streams.

use cubecl_common::bytes::Bytes;
use cubecl_environment::future::DynFut;
use cubecl_environment::stream::StreamId;
use cubecl_runtime::server::{BufferBinding, CopyDescriptor, ServerError};
use scope_core::{Client, Error};

use super::{ScopeServer, ready, unsupported_strides, validation};
use crate::backend::CubeBackend;
use crate::communication::Owned;
use crate::error::to_server_error;
use crate::memory::contiguous;

impl<B: CubeBackend> ScopeServer<B> {
    /// cubecl's `Server::read`.
    pub(super) fn read_copies(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        stream_id: StreamId,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        let memory = descriptors
            .iter()
            .map(|descriptor| descriptor.handle.memory.id());
        let waits = self.communication.waits(memory, None);
        if waits.is_empty() {
            return ready(self.read_now(descriptors, stream_id));
        }
        // A collective still to land here: the caller waits, not the device thread.
        let planned = self.plan_read(&descriptors, stream_id);
        Box::pin(async move {
            let (client, plan) = planned?;
            waits.wait();
            plan.iter()
                .map(|owned| match owned {
                    None => Ok(Bytes::from_bytes_vec(Vec::new())),
                    Some(owned) => owned
                        .read(&client)
                        .map(Bytes::from_bytes_vec)
                        .map_err(|e| to_server_error(&e)),
                })
                .collect()
        })
    }

    /// cubecl's `Server::write`, one descriptor at a time: a refusal fails only its own bytes.
    pub(super) fn write_copies(
        &mut self,
        descriptors: Vec<(CopyDescriptor, Bytes)>,
        stream_id: StreamId,
    ) {
        self.settle(descriptors.iter().map(|(descriptor, _)| &descriptor.handle));
        let client = match self.client(stream_id) {
            Ok(client) => client,
            Err(error) => {
                for (descriptor, _) in &descriptors {
                    self.fail_outputs(
                        stream_id,
                        std::iter::once(&descriptor.handle),
                        error.clone(),
                    );
                }
                return;
            }
        };
        for (descriptor, data) in descriptors {
            self.write_one(descriptor, &data, &client, stream_id);
        }
    }

    /// cubecl's `Server::sync`: the stream's work done, then the check of `handles`.
    pub(super) fn sync_bindings(
        &mut self,
        handles: Vec<BufferBinding>,
        stream_id: StreamId,
    ) -> DynFut<Result<(), ServerError>> {
        let memory = handles.iter().map(|binding| binding.memory.id());
        let waits = self.communication.waits(memory, Some(stream_id));
        if !waits.is_empty() {
            // As a read: the caller waits for the parts, not the device thread.
            let planned = self.client(stream_id).and_then(|client| {
                let mut owned = Vec::new();
                for binding in &handles {
                    if self.memory.resolve(binding)?.is_some() {
                        owned.push(self.owned(binding)?);
                    }
                }
                Ok((client, owned))
            });
            return Box::pin(async move {
                let (client, owned) = planned?;
                waits.wait();
                client.sync().map_err(|e| to_server_error(&e))?;
                let slices: Vec<_> = owned.iter().map(Owned::slice).collect();
                if slices.is_empty() {
                    return Ok(());
                }
                client.check(&slices).map_err(|e| to_server_error(&e))
            });
        }
        let result = self.client(stream_id).and_then(|client| {
            client.sync().map_err(|e| to_server_error(&e))?;
            self.check_bindings(&handles, stream_id)
        });
        ready(result)
    }

    /// The check a read makes, without the read.
    pub(super) fn check_bindings(
        &mut self,
        handles: &[BufferBinding],
        stream: StreamId,
    ) -> Result<(), ServerError> {
        let client = self.client(stream)?;
        let mut slices = Vec::with_capacity(handles.len());
        for binding in handles {
            if let Some(resolved) = self.memory.resolve(binding)? {
                slices.push(resolved.slice());
            }
        }
        if slices.is_empty() {
            return Ok(());
        }
        client.check(&slices).map_err(|e| to_server_error(&e))
    }

    fn read_now(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        stream: StreamId,
    ) -> Result<Vec<Bytes>, ServerError> {
        let client = self.client(stream)?;
        let mut out = Vec::with_capacity(descriptors.len());
        for descriptor in descriptors {
            if !contiguous(&descriptor.shape, &descriptor.strides) {
                return Err(unsupported_strides());
            }
            let Some(resolved) = self.memory.resolve(&descriptor.handle)? else {
                out.push(Bytes::from_bytes_vec(Vec::new()));
                continue;
            };
            let words = client
                .read(resolved.slice())
                .map_err(|e| to_server_error(&e))?;
            let skip = resolved.skip();
            out.push(Bytes::from_bytes_vec(
                words[skip..skip + resolved.len()].to_vec(),
            ));
        }
        Ok(out)
    }

    /// What a read of `descriptors` reads, resolved now for a read made later.
    fn plan_read(
        &mut self,
        descriptors: &[CopyDescriptor],
        stream: StreamId,
    ) -> Result<(Client<B>, Vec<Option<Owned>>), ServerError> {
        let client = self.client(stream)?;
        let mut plan = Vec::with_capacity(descriptors.len());
        for descriptor in descriptors {
            if !contiguous(&descriptor.shape, &descriptor.strides) {
                return Err(unsupported_strides());
            }
            plan.push(match self.memory.resolve(&descriptor.handle)? {
                None => None,
                Some(_) => Some(self.owned(&descriptor.handle)?),
            });
        }
        Ok((client, plan))
    }

    /// One host write on `stream`; a refusal fails the destination's bytes for the next read.
    fn write_one(
        &mut self,
        descriptor: CopyDescriptor,
        data: &[u8],
        client: &Client<B>,
        stream: StreamId,
    ) {
        let refuse = |server: &mut Self, error: ServerError| {
            server.fail_outputs(stream, std::iter::once(&descriptor.handle), error);
        };
        if !contiguous(&descriptor.shape, &descriptor.strides) {
            return refuse(self, unsupported_strides());
        }
        let resolved = match self.memory.resolve(&descriptor.handle) {
            Ok(Some(resolved)) => resolved,
            Ok(None) => return,
            Err(error) => return tracing::warn!(%error, "a write to unknown memory"),
        };
        if resolved.skip() != 0 {
            return refuse(
                self,
                validation(format!(
                    "a write starting at byte {} is not word-aligned; scope writes whole words",
                    resolved.range.start
                )),
            );
        }
        let len = data.len().min(resolved.len());
        let words = (resolved.words.end - resolved.words.start) as usize;
        let result = if len == words {
            client.write(resolved.slice(), &data[..len])
        } else {
            // The tail word's other bytes are slack: every tensor starts aligned.
            let mut padded = vec![0u8; words];
            padded[..len].copy_from_slice(&data[..len]);
            client.write(resolved.slice(), &padded)
        };
        if let Err(e @ Error::InvalidArgument { .. }) = result {
            // Refused without a claim; cubecl has no other way to hear it.
            refuse(self, to_server_error(&e));
        }
    }
}
