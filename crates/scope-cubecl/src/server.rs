//! cubecl's `Server`, over a scope client.
//!
//! Every call resolves cubecl's handles to scope slices and asks scope. The server keeps
//! translation tables ([`MemoryTable`], [`Streams`], [`Kernels`], graphs) and no failure of its
//! own. A failure found here goes to scope with [`Client::fail_writing`], so it lands on the
//! bytes as a failed launch's does.
//!
//! This file holds state and look-ups. The work is in `copy.rs`, `launch.rs`, `capture.rs`
//! and `collective.rs`.

mod capture;
mod collective;
mod copy;
mod launch;

use std::collections::HashMap;
use std::sync::Arc;

use cubecl_common::bytes::Bytes;
use cubecl_common::device::DeviceId;
use cubecl_common::profile::ProfileDuration;
use cubecl_environment::backtrace::BackTrace;
use cubecl_environment::future::DynFut;
use cubecl_environment::stream::StreamId;
use cubecl_environment::time::Instant;
use cubecl_runtime::execution::LaunchMode;
use cubecl_runtime::id::GraphId;
use cubecl_runtime::kernel::CubeKernel as CubeclKernel;
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::{
    ManagedMemoryHandle, MemoryAllocationMode, StreamMemoryReport,
};
use cubecl_runtime::server::{
    BufferBinding, CopyDescriptor, CubeCount, DeviceCaptures, IoError, KernelArguments,
    ProfileError, ProfilingToken, Server, ServerError, ServerStorage, ServerUtilities,
};
use cubecl_runtime::storage::ManagedResource;
use scope_core::{Client, Error};
use scope_cube::Translation;

use crate::backend::CubeBackend;
use crate::communication::Communication;
use crate::compile::{CompileTarget, Kernels};
use crate::error::{external, to_server_error};
use crate::graphs::Graphs;
use crate::memory::{MemoryTable, scope_size};
use crate::storage::{ScopeResource, ScopeStorage};
use crate::streams::Streams;

/// The cubecl server of one scope device.
pub struct ScopeServer<B: CubeBackend> {
    streams: Streams<B>,
    memory: MemoryTable,
    kernels: Kernels,
    graphs: Graphs,
    /// The scalar blob of the launch being made, kept to reuse its buffer.
    blob: Vec<u8>,
    profiles: HashMap<u64, Profile>,
    next_profile: u64,
    utilities: Arc<ServerUtilities>,
    logger: Arc<ServerLogger>,
    /// Collectives and transfers to other devices, and the parts later calls wait for.
    communication: Communication<B>,
}

/// A profiling window: its start, and the failures scope had seen then.
struct Profile {
    start: Instant,
    failures: u64,
}

impl<B: CubeBackend> std::fmt::Debug for ScopeServer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScopeServer")
            .field("client", self.streams.base())
            .field("memory", &self.memory.len())
            .field("kernels", &self.kernels)
            .finish()
    }
}

fn validation(message: impl Into<String>) -> ServerError {
    ServerError::Validation {
        message: message.into(),
        backtrace: BackTrace::capture(),
    }
}

fn ready<T: Send + 'static>(value: T) -> DynFut<T> {
    Box::pin(std::future::ready(value))
}

fn unsupported_strides() -> ServerError {
    ServerError::Io(IoError::UnsupportedStrides {
        backtrace: BackTrace::capture(),
    })
}

impl<B: CubeBackend> ScopeServer<B> {
    pub(crate) fn new(
        device: DeviceId,
        client: Client<B>,
        utilities: ServerUtilities,
        captures: DeviceCaptures,
    ) -> Self {
        let kernels = Kernels::new(CompileTarget {
            target: B::target(),
            translation: Translation::for_device(&client.limits()),
            properties: utilities.properties.clone(),
        });
        let logger = utilities.logger.clone();
        Self {
            streams: Streams::new(client, captures),
            memory: MemoryTable::default(),
            kernels,
            graphs: Graphs::default(),
            blob: Vec::new(),
            profiles: HashMap::new(),
            next_profile: 0,
            utilities: Arc::new(utilities),
            logger,
            communication: Communication::new(device),
        }
    }

    /// The scope client of stream 0, for scope-native work on the same device.
    pub fn scope_client(&self) -> Client<B> {
        self.streams.base().clone()
    }

    fn client(&mut self, stream: StreamId) -> Result<Client<B>, ServerError> {
        self.streams.client(stream)
    }

    /// Claim `written` with `error`: the exit for a failure found before scope saw the work.
    fn fail_outputs<'a>(
        &mut self,
        stream: StreamId,
        written: impl Iterator<Item = &'a BufferBinding>,
        error: ServerError,
    ) {
        let client = match self.client(stream) {
            Ok(client) => client,
            Err(_) => self.streams.base().clone(),
        };
        let mut slices = Vec::new();
        for binding in written {
            match self.memory.resolve(binding) {
                Ok(Some(resolved)) => slices.push(resolved.slice()),
                Ok(None) => {}
                Err(e) => tracing::warn!(%e, "a failed launch's output is not known here"),
            }
        }
        if slices.is_empty() {
            return;
        }
        if let Err(e) = client.fail_writing(&slices, external(error)) {
            tracing::warn!(%e, "could not claim a failed launch's outputs");
        }
    }
}

impl<B: CubeBackend> Server for ScopeServer<B> {
    fn initialize_memory(
        &mut self,
        memory: ManagedMemoryHandle,
        size: u64,
        stream_id: StreamId,
    ) -> Result<(), ServerError> {
        let client = self.client(stream_id)?;
        let scope_bytes = scope_size(size);
        let (buffer, error) = if scope_bytes > client.limits().max_allocation {
            let error = ServerError::Io(IoError::BufferTooBig {
                size,
                backtrace: BackTrace::capture(),
            });
            let buffer = client
                .failed_allocation(scope_bytes, external(error.clone()))
                .map_err(|e| to_server_error(&e))?;
            (buffer, Some(error))
        } else {
            // Memory freed since the last sweep may be what is missing: sweep, then retry.
            let mut allocated = client.try_allocate(scope_bytes);
            if allocated.as_ref().is_err_and(Error::is_out_of_memory) {
                self.memory.sweep();
                allocated = client.try_allocate(scope_bytes);
            }
            match allocated {
                Ok(buffer) => (buffer, None),
                Err(e) if e.is_out_of_memory() => {
                    let buffer = client
                        .failed_allocation(scope_bytes, e.clone())
                        .map_err(|e| to_server_error(&e))?;
                    (buffer, Some(to_server_error(&e)))
                }
                Err(e) => return Err(to_server_error(&e)),
            }
        };
        let mode = self.streams.slot(stream_id)?.mode;
        self.memory
            .insert(memory, buffer, size, self.streams.key(stream_id), mode);
        error.map_or(Ok(()), Err)
    }
    fn logger(&self) -> Arc<ServerLogger> {
        self.logger.clone()
    }

    fn utilities(&self) -> Arc<ServerUtilities> {
        self.utilities.clone()
    }
    fn read(
        &mut self,
        descriptors: Vec<CopyDescriptor>,
        stream_id: StreamId,
    ) -> DynFut<Result<Vec<Bytes>, ServerError>> {
        self.read_copies(descriptors, stream_id)
    }

    fn write(&mut self, descriptors: Vec<(CopyDescriptor, Bytes)>, stream_id: StreamId) {
        self.write_copies(descriptors, stream_id);
    }

    fn sync(
        &mut self,
        handles: Vec<BufferBinding>,
        stream_id: StreamId,
    ) -> DynFut<Result<(), ServerError>> {
        self.sync_bindings(handles, stream_id)
    }

    fn check(
        &mut self,
        handles: Vec<BufferBinding>,
        stream_id: StreamId,
    ) -> Result<(), ServerError> {
        self.settle(&handles);
        self.check_bindings(&handles, stream_id)
    }

    unsafe fn launch(
        &mut self,
        kernel: Box<dyn CubeclKernel>,
        count: CubeCount,
        args: KernelArguments,
        stream_id: StreamId,
        mode: LaunchMode,
    ) {
        // SAFETY: the caller keeps `Server::launch`'s contract, which is `launch_kernel`'s.
        unsafe { self.launch_kernel(kernel, count, args, stream_id, mode) };
    }

    fn flush(&mut self, stream_id: StreamId) -> Result<(), ServerError> {
        self.client(stream_id)?
            .flush()
            .map_err(|e| to_server_error(&e))
    }

    fn compile_queued(&mut self) {
        self.kernels.compile_queued();
    }

    fn graph_prepare(&mut self, stream_id: StreamId) -> Result<(), ServerError> {
        self.streams.slot(stream_id)?.phase.prepare(stream_id)
    }

    fn begin_capture(&mut self, stream_id: StreamId) -> Result<(), ServerError> {
        self.begin_window(stream_id)
    }

    fn end_capture(&mut self, stream_id: StreamId) -> Result<GraphId, ServerError> {
        self.end_window(stream_id)
    }

    fn replay(&mut self, graph: GraphId, stream_id: StreamId) -> Result<(), ServerError> {
        let client = self.client(stream_id)?;
        let sealed = self
            .graphs
            .get(&graph)
            .ok_or_else(|| ServerError::graph_state(format!("replay: no graph {graph:?}")))?;
        client.replay(sealed).map_err(|e| to_server_error(&e))
    }

    fn graph_destroy(&mut self, graph: GraphId, stream_id: StreamId) {
        // Pinned metadata goes after the graph, whose destruction waits for its replays.
        if let Some(captured) = self.graphs.remove(&graph)
            && let Ok(client) = self.client(stream_id)
            && let Err(error) = client.destroy_graph(&captured.graph)
        {
            tracing::warn!(%error, "destroying a graph");
        }
    }

    fn memory_report(&mut self, stream_id: StreamId) -> Option<StreamMemoryReport> {
        let key = self.streams.key(stream_id);
        let pools = self
            .memory
            .report(key, self.streams.base().bytes_reserved());
        Some(StreamMemoryReport {
            stream: stream_id,
            pools,
            auxiliary: Vec::new(),
        })
    }

    fn stream_ids(&self) -> Vec<StreamId> {
        self.streams.ids()
    }

    fn memory_cleanup(&mut self, stream_id: StreamId) -> Result<(), ServerError> {
        let _ = stream_id;
        if self.streams.any_capture() {
            return Err(ServerError::graph_state(
                "memory_cleanup: a graph capture is active",
            ));
        }
        self.memory.sweep();
        Ok(())
    }

    fn start_profile(&mut self, stream_id: StreamId) -> Result<ProfilingToken, ServerError> {
        let client = self.client(stream_id)?;
        client.sync().map_err(|e| to_server_error(&e))?;
        let id = self.next_profile;
        self.next_profile += 1;
        self.profiles.insert(
            id,
            Profile {
                start: Instant::now(),
                failures: client.failures_seen(),
            },
        );
        Ok(ProfilingToken { id })
    }

    fn end_profile(
        &mut self,
        stream_id: StreamId,
        token: ProfilingToken,
    ) -> Result<ProfileDuration, ProfileError> {
        let profile =
            self.profiles
                .remove(&token.id)
                .ok_or_else(|| ProfileError::NotRegistered {
                    backtrace: BackTrace::capture(),
                })?;
        let client = self
            .client(stream_id)
            .map_err(|e| ProfileError::Server(Box::new(e)))?;
        client
            .sync()
            .map_err(|e| ProfileError::Server(Box::new(to_server_error(&e))))?;
        let end = Instant::now();
        if client.failures_seen() != profile.failures {
            return Err(ProfileError::Server(Box::new(ServerError::Generic {
                reason: "a failure happened inside the profiled window, so it is not a timing"
                    .to_owned(),
                backtrace: BackTrace::capture(),
            })));
        }
        Ok(ProfileDuration::new_system_time(profile.start, end))
    }

    fn abandon_profile(&mut self, _stream_id: StreamId, token: ProfilingToken) {
        self.profiles.remove(&token.id);
    }

    /// Recorded for `memory_report` only: scope has one allocator.
    fn allocation_mode(&mut self, mode: MemoryAllocationMode, stream_id: StreamId) {
        if let Ok(slot) = self.streams.slot(stream_id) {
            slot.mode = mode;
        }
    }
}
impl<B: CubeBackend> ServerStorage for ScopeServer<B> {
    type Storage = ScopeStorage<B>;

    fn get_resource(
        &mut self,
        binding: BufferBinding,
        stream_id: StreamId,
    ) -> Result<ManagedResource<ScopeResource<B>>, ServerError> {
        self.settle(std::iter::once(&binding));
        self.check_bindings(std::slice::from_ref(&binding), stream_id)?;
        let resolved = self
            .memory
            .resolve(&binding)?
            .ok_or_else(|| validation("get_resource of an empty range"))?;
        let resource = ScopeResource {
            buffer: resolved.buffer.clone(),
            range: resolved.range.clone(),
            client: self.streams.base().clone(),
        };
        Ok(ManagedResource::new(binding.memory, resource))
    }
}
