//! cubecl's `Server`, over a scope client.
//!
//! Every call resolves cubecl's handles to scope slices and asks scope. The
//! server keeps translation tables — memory ids to buffers
//! ([`MemoryTable`]), stream ids to scope streams ([`Streams`]), kernel ids
//! to compiled kernels ([`Kernels`]), graph ids to graphs — and no failure
//! of its own: a failure found here (a compiler refusal, a limit, a binding
//! scope cannot take) is handed to scope with [`Client::fail_writing`], so
//! it lands on the bytes exactly as a failed launch's does, and cubecl's
//! questions about those bytes are answered from scope's store.

use std::collections::HashMap;
use std::sync::Arc;

use cubecl_common::bytes::Bytes;
use cubecl_common::device::DeviceId;
use cubecl_common::profile::ProfileDuration;
use cubecl_environment::backtrace::BackTrace;
use cubecl_environment::future::DynFut;
use cubecl_environment::stream::StreamId;
use cubecl_environment::time::Instant;
use cubecl_runtime::compiler::CompilationError;
use cubecl_runtime::execution::LaunchMode;
use cubecl_runtime::id::GraphId;
use cubecl_runtime::kernel::{BufferIOAttr, CubeKernel as CubeclKernel};
use cubecl_runtime::logging::ServerLogger;
use cubecl_runtime::memory_management::{
    ManagedMemoryHandle, MemoryAllocationMode, StreamMemoryReport,
};
use cubecl_runtime::server::{
    BufferBinding, ComputeWait, CopyDescriptor, CubeCount, DeviceCaptures, Handle, IoError,
    KernelArguments, KernelResource, LaunchError, ProfileError, ProfilingToken, Reduction, Server,
    ServerCommunication, ServerError, ServerStorage, ServerUtilities,
};
use cubecl_runtime::storage::ManagedResource;
use scope_core::{Access, Binding, Client, Dispatch, Error, Slice};
use scope_cube::Translation;
use smallvec::SmallVec;

use crate::backend::CubeBackend;
use crate::communication::{Communication, Kind, Owned, reduction};
use crate::compile::{CompileTarget, Kernels};
use crate::error::{external, to_server_error};
use crate::memory::{MemoryTable, contiguous, scope_size};
use crate::storage::{ScopeResource, ScopeStorage};
use crate::streams::Streams;

/// The cubecl server of one scope device.
pub struct ScopeServer<B: CubeBackend> {
    streams: Streams<B>,
    memory: MemoryTable,
    kernels: Kernels,
    graphs: HashMap<GraphId, Captured>,
    /// The scalar blob of the launch being made, kept to reuse its buffer.
    blob: Vec<u8>,
    profiles: HashMap<u64, Profile>,
    next_profile: u64,
    utilities: Arc<ServerUtilities>,
    logger: Arc<ServerLogger>,
    /// Collectives and transfers to other devices, and the parts of them
    /// later calls wait for.
    communication: Communication<B>,
}

/// A sealed graph, and the buffers only it keeps alive.
struct Captured {
    graph: scope_core::Graph,
    /// Tensor metadata staged by the recorded launches ([`Slot::pinned`]):
    /// every replay reads them, and scope's windows never keep a buffer
    /// alive.
    ///
    /// [`Slot::pinned`]: crate::streams::Slot::pinned
    _pinned: Vec<scope_core::Buffer>,
}

/// A profiling window: when it started, and how many failures scope had
/// seen then (a window a failure fell in is not a timing).
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
            translation: Translation::for_device(client.limits()),
            properties: utilities.properties.clone(),
        });
        let logger = utilities.logger.clone();
        Self {
            streams: Streams::new(client, captures),
            memory: MemoryTable::default(),
            kernels,
            graphs: HashMap::new(),
            blob: Vec::new(),
            profiles: HashMap::new(),
            next_profile: 0,
            utilities: Arc::new(utilities),
            logger,
            communication: Communication::new(device),
        }
    }

    /// Wait for the collectives and transfers that touch `bindings`.
    fn settle<'a>(&mut self, bindings: impl IntoIterator<Item = &'a BufferBinding>) {
        self.communication
            .settle(bindings.into_iter().map(|binding| binding.memory.id()));
    }

    /// `binding`'s bytes, owned, for a part that outlives the call.
    fn owned(&self, binding: &BufferBinding) -> Result<Owned, ServerError> {
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

    /// Queue this device's part of `kind`; a part refused here leaves its
    /// destination carrying the refusal, since cubecl queued it
    /// fire-and-forget.
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

    /// The scope client of stream 0, for mixing scope-native work with
    /// cubecl's on the same device.
    pub fn scope_client(&self) -> Client<B> {
        self.streams.base().clone()
    }

    fn client(&mut self, stream: StreamId) -> Result<Client<B>, ServerError> {
        self.streams.client(stream)
    }

    /// Claim `written` with `error` on `stream`'s scope stream: the exit a
    /// failure found before scope saw the work takes.
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

    /// The check a read makes, without the read.
    fn check_bindings(
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

    /// What a read of `descriptors` reads, resolved now for a read made
    /// later.
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

    /// One host write on `stream`; a refusal fails the destination's bytes
    /// on the writer's stream, where the next read reports it.
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
            // The tail word's other bytes are the allocation's slack (the
            // layout policy starts every tensor on its own aligned boundary).
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

/// A reduction scope's collectives carry, or why not.
fn reduced(reduction_: Reduction) -> Result<Kind, ServerError> {
    reduction(reduction_.dtype, reduction_.op)
        .map(|(element, op)| Kind::AllReduce(element, op))
        .ok_or_else(|| {
            validation(format!(
                "scope's collectives reduce f32, i32 and u32, not {:?}",
                reduction_.dtype
            ))
        })
}

/// cubecl's communication, over `scope_core::collective` (see
/// `communication.rs`): every part is queued to the device's collectives or
/// transfers thread, and returns at once.
impl<B: CubeBackend> ServerCommunication for ScopeServer<B> {
    /// Nothing to do: every later call on a part's buffers waits for the
    /// part already, and a part keeps its buffers alive until it is done.
    fn sync_collective(&mut self, _stream_id: StreamId) -> Result<(), ServerError> {
        Ok(())
    }

    fn comm_init(&mut self, device_ids: Vec<DeviceId>) -> Result<(), ServerError> {
        self.communication.init(&device_ids)
    }

    /// Under either [`ComputeWait`], later calls on `dst` wait for it, so
    /// `AtSync` is kept too (it only allows the wait to come later).
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

    /// Hands the source to the peer's receive, which reads it through this
    /// device's client. A refused send still reaches the receive, whose
    /// destination then carries the refusal: no receive waits for a send
    /// that will not come.
    fn send(
        &mut self,
        desc: CopyDescriptor,
        stream_id: StreamId,
        device_id_dst: DeviceId,
    ) -> Result<(), ServerError> {
        let src = if contiguous(&desc.shape, &desc.strides) {
            self.owned(&desc.handle)
                .map(|src| (src, self.streams.base().clone()))
        } else {
            Err(unsupported_strides())
        };
        let refused = src.as_ref().err().cloned();
        self.communication.send(src, device_id_dst, stream_id);
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
            // Memory cubecl freed since the last sweep may be what this
            // allocation is missing: give it back and ask once more before
            // calling the device full.
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
        let memory = descriptors
            .iter()
            .map(|descriptor| descriptor.handle.memory.id());
        let waits = self.communication.waits(memory, None);
        if waits.is_empty() {
            return ready(self.read_now(descriptors, stream_id));
        }
        // A collective or transfer still to land in these bytes: the caller
        // waits for it, not the device thread, whose other streams go on
        // (a peer's part may be queued behind them).
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

    fn write(&mut self, descriptors: Vec<(CopyDescriptor, Bytes)>, stream_id: StreamId) {
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

    fn sync(
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
        if mode == LaunchMode::Queue {
            self.kernels.enqueue(kernel);
            return;
        }
        let compiled = match self.kernels.get(&*kernel) {
            Ok(compiled) => compiled,
            Err(error) => {
                if !mode.discards_launch() {
                    let written: Vec<_> = args.buffers_written(None).cloned().collect();
                    self.fail_outputs(stream_id, written.iter(), ServerError::Launch(error));
                }
                return;
            }
        };
        if mode.discards_launch() {
            return;
        }
        let buffers = args.resources.iter().filter_map(|resource| match resource {
            KernelResource::Buffer(binding) => Some(binding),
            _ => None,
        });
        let count_buffer = match &count {
            CubeCount::Dynamic(binding) => Some(binding),
            CubeCount::Static(..) => None,
        };
        let memory: SmallVec<[_; 8]> = buffers
            .chain(count_buffer)
            .map(|binding| binding.memory.id())
            .collect();
        self.communication.settle(memory);
        let io = compiled.buffer_io();
        if let Err(error) = self.launch_compiled(&compiled, io, &count, &args, stream_id) {
            let written: Vec<_> = args.buffers_written(Some(io)).cloned().collect();
            self.fail_outputs(stream_id, written.iter(), error);
        }
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
        let slot = self.streams.slot(stream_id)?;
        slot.phase.begin()?;
        match slot.client.begin_capture() {
            Ok(window) => {
                slot.window = Some(window);
                slot.pinned.clear();
                Ok(())
            }
            Err(e) => {
                slot.phase.abort();
                Err(to_server_error(&e))
            }
        }
    }

    fn end_capture(&mut self, stream_id: StreamId) -> Result<GraphId, ServerError> {
        let slot = self.streams.slot(stream_id)?;
        let end = match slot.phase.end(stream_id) {
            Ok(end) => end,
            Err(error) => {
                // A capture prepared but never begun still holds the stream,
                // and closing it is the only call left to a caller whose
                // warmup failed: unwind it rather than hold it forever.
                if slot.phase.is_active() {
                    slot.phase.abort();
                }
                return Err(error);
            }
        };
        let window = slot
            .window
            .take()
            .ok_or_else(|| ServerError::graph_state("end_capture: no scope window is open"))?;
        let pinned = std::mem::take(&mut slot.pinned);
        if end.is_abandoned() {
            let _ = slot.client.abort_capture(window);
            return Err(end.abandoned_error(stream_id, None));
        }
        let graph = slot
            .client
            .end_capture(window)
            .map_err(|e| to_server_error(&e))?;
        let id = GraphId::new();
        self.graphs.insert(
            id,
            Captured {
                graph,
                _pinned: pinned,
            },
        );
        Ok(id)
    }

    fn replay(&mut self, graph: GraphId, stream_id: StreamId) -> Result<(), ServerError> {
        let client = self.client(stream_id)?;
        let captured = self
            .graphs
            .get(&graph)
            .ok_or_else(|| ServerError::graph_state(format!("replay: no graph {graph:?}")))?;
        client
            .replay(&captured.graph)
            .map_err(|e| to_server_error(&e))
    }

    fn graph_destroy(&mut self, graph: GraphId, stream_id: StreamId) {
        // The pinned metadata goes after the graph: destroying it waits
        // for its replays in flight, and a backend keeps freed memory until
        // the work using it is done.
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

    /// Recorded for `memory_report` only: scope has one allocator, so the
    /// mode changes where an allocation is counted, not where it lives.
    fn allocation_mode(&mut self, mode: MemoryAllocationMode, stream_id: StreamId) {
        if let Ok(slot) = self.streams.slot(stream_id) {
            slot.mode = mode;
        }
    }
}

impl<B: CubeBackend> ScopeServer<B> {
    /// Bind and launch a compiled kernel. An error returned here is one
    /// scope did not claim for (a refusal before the launch); the caller
    /// claims the outputs with it.
    fn launch_compiled(
        &mut self,
        compiled: &scope_cube::CubeKernel,
        io: &[BufferIOAttr],
        count: &CubeCount,
        args: &KernelArguments,
        stream_id: StreamId,
    ) -> Result<(), ServerError> {
        let client = self.client(stream_id)?;
        let (info, metadata) =
            compiled.split_info(&args.info.data, args.info.dynamic_metadata_offset);
        let metadata = match metadata {
            Some(words) => Some(self.stage_metadata(&client, words, stream_id)?),
            None => None,
        };
        let mut blob = std::mem::take(&mut self.blob);
        blob.clear();
        blob.extend(info.iter().flat_map(|w| w.to_le_bytes()));
        let staged = Staged {
            blob: &blob,
            metadata: metadata.as_ref(),
        };
        let launched = self.launch_with(&client, compiled, io, count, args, staged);
        self.blob = blob;
        launched
    }

    /// A device buffer holding a launch's tensor metadata (shapes and
    /// strides), for a kernel that reads it through a binding of its own
    /// (see [`scope_cube::CubeKernel::binds_tensor_metadata`]).
    ///
    /// Written on the launch's own stream, so the launch is ordered after
    /// the write; the handle may drop as soon as the launch is made, since a
    /// backend keeps freed memory until the work using it is done. While
    /// the stream records, the write is recorded with its bytes and the
    /// buffer is pinned to the graph-to-be: every replay reads it again.
    fn stage_metadata(
        &mut self,
        client: &Client<B>,
        words: &[u64],
        stream_id: StreamId,
    ) -> Result<scope_core::Buffer, ServerError> {
        // An empty area still takes its parameter: one word the kernel never
        // reads.
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        if bytes.is_empty() {
            bytes.resize(8, 0);
        }
        let buffer = client.upload(&bytes).map_err(|e| to_server_error(&e))?;
        let slot = self.streams.slot(stream_id)?;
        if slot.window.is_some() {
            slot.pinned.push(buffer.clone());
        }
        Ok(buffer)
    }

    fn launch_with(
        &self,
        client: &Client<B>,
        compiled: &scope_cube::CubeKernel,
        io: &[BufferIOAttr],
        count: &CubeCount,
        args: &KernelArguments,
        staged: Staged<'_>,
    ) -> Result<(), ServerError> {
        let mut bindings: SmallVec<[Binding<'_>; 8]> = SmallVec::new();
        for (index, resource) in args.resources.iter().enumerate() {
            let KernelResource::Buffer(binding) = resource else {
                return Err(refusal("tensor maps are not supported by scope servers"));
            };
            let access = io
                .get(index)
                .copied()
                .or_else(|| args.declared_io.get(index).copied())
                .map_or(Access::ReadWrite, io_access);
            let slice = self.binding_slice(binding)?;
            bindings.push(Binding { slice, access });
        }
        if let Some(metadata) = staged.metadata {
            bindings.push(Binding::read(metadata));
        }
        let dispatch = match count {
            CubeCount::Static(x, y, z) => Dispatch::Groups([*x, *y, *z]),
            CubeCount::Dynamic(binding) => Dispatch::Indirect(self.binding_slice(binding)?),
        };
        // SAFETY: `Server::launch` is an unsafe contract: its caller (cubecl's
        // launcher, for `launch_unchecked`) promises that the info struct —
        // each buffer's length among it — describes the buffers bound, and
        // that a kernel without checks stays inside them; every binding here
        // covers at least the bytes the caller's handle names (rounded out to
        // whole words), so the kernel stays inside its bindings.
        let kernel = unsafe { compiled.kernel() };
        match client.launch(kernel, &bindings, staged.blob, dispatch) {
            Err(e @ Error::InvalidArgument { .. }) => Err(ServerError::Launch(
                LaunchError::CompilationError(CompilationError::Validation {
                    reason: e.to_string(),
                    backtrace: BackTrace::capture(),
                }),
            )),
            // Anything else is on the outputs already (or was poison).
            _ => Ok(()),
        }
    }

    /// The scope slice a kernel binding covers: whole words, and at least
    /// one (an empty tensor still takes a binding slot; its length in the
    /// info struct is zero, so the kernel touches none of it).
    fn binding_slice(&self, binding: &BufferBinding) -> Result<Slice<'_>, ServerError> {
        match self.memory.resolve(binding)? {
            Some(resolved) => Ok(resolved.slice()),
            None => self
                .memory
                .first_word(binding)
                .ok_or_else(|| validation("an empty binding of unknown memory")),
        }
    }
}

/// What the adapter made for a launch beside cubecl's arguments.
struct Staged<'a> {
    /// The scalar blob: cubecl's info struct, less any metadata bound apart.
    blob: &'a [u8],
    /// The tensor metadata binding, for a kernel that takes one.
    metadata: Option<&'a scope_core::Buffer>,
}

fn refusal(reason: &str) -> ServerError {
    ServerError::Launch(LaunchError::CompilationError(
        CompilationError::Validation {
            reason: reason.to_owned(),
            backtrace: BackTrace::capture(),
        },
    ))
}

fn io_access(io: BufferIOAttr) -> Access {
    match io {
        BufferIOAttr::ReadOnly | BufferIOAttr::Dead => Access::Read,
        BufferIOAttr::WriteOnly => Access::Write,
        BufferIOAttr::ReadWrite => Access::ReadWrite,
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
