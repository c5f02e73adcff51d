//! Kernel launches: cubecl's kernels compiled, bound and launched as scope's. A refusal found
//! first is claimed on the outputs: cubecl launches fire-and-forget, so they alone can hear it.

use cubecl_environment::backtrace::BackTrace;
use cubecl_environment::stream::StreamId;
use cubecl_runtime::compiler::CompilationError;
use cubecl_runtime::execution::LaunchMode;
use cubecl_runtime::kernel::{BufferIOAttr, CubeKernel as CubeclKernel};
use cubecl_runtime::server::{
    BufferBinding, CubeCount, KernelArguments, KernelResource, LaunchError, ServerError,
};
use scope_core::{Access, Binding, Client, Dispatch, Error, Slice};
use smallvec::SmallVec;

use super::{ScopeServer, validation};
use crate::backend::CubeBackend;
use crate::error::to_server_error;

impl<B: CubeBackend> ScopeServer<B> {
    /// cubecl's `Server::launch`.
    ///
    /// # Safety
    ///
    /// `Server::launch`'s: the info struct in `args`, buffer lengths included, describes the
    /// buffers bound, and an unchecked kernel stays inside them.
    pub(super) unsafe fn launch_kernel(
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
        // SAFETY: this function's contract is `launch_compiled`'s.
        let launched = unsafe { self.launch_compiled(&compiled, io, &count, &args, stream_id) };
        if let Err(error) = launched {
            let written: Vec<_> = args.buffers_written(Some(io)).cloned().collect();
            self.fail_outputs(stream_id, written.iter(), error);
        }
    }

    /// Bind and launch a compiled kernel. An error is one scope did not claim; the caller does.
    ///
    /// # Safety
    ///
    /// As [`launch_kernel`](Self::launch_kernel).
    unsafe fn launch_compiled(
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
        // SAFETY: this function's contract is `launch_with`'s.
        let launched = unsafe { self.launch_with(&client, compiled, io, count, args, staged) };
        self.blob = blob;
        launched
    }

    /// A buffer of a launch's tensor metadata, for a kernel that binds it
    /// ([`scope_cube::CubeKernel::binds_tensor_metadata`]).
    ///
    /// Written on the launch's stream, so ordered before it. While the stream records, the
    /// buffer is pinned to the graph, since every replay reads it again.
    fn stage_metadata(
        &mut self,
        client: &Client<B>,
        words: &[u64],
        stream_id: StreamId,
    ) -> Result<scope_core::Buffer, ServerError> {
        // An empty area still takes its parameter: one word never read.
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

    /// Bind `args` and launch `compiled` on `client`.
    ///
    /// # Safety
    ///
    /// As [`launch_kernel`](Self::launch_kernel).
    unsafe fn launch_with(
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
        // SAFETY: by this function's contract the info struct describes the buffers bound, and
        // an unchecked kernel stays inside them. Each binding covers at least its handle's
        // bytes, rounded out to words, so the kernel stays inside its bindings.
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

    /// The scope slice a binding covers: whole words, at least one. An empty tensor's length
    /// is zero, so the kernel touches none of it.
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
