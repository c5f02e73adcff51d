//! The reference host server: the contract's executable specification.
//!
//! Memory is host bytes, kernels are Rust closures registered by name, and a capture records the
//! stream's operations as values and replays them. It goes through exactly the core's `Server<B>`
//! code the GPU servers go through; only the device calls differ. So the conformance suite run
//! against it tests every rule on every CI run, without a GPU.
//!
//! It is deliberately simple rather than fast. A launch copies each binding into a scratch vector,
//! runs the closure, and copies the written bindings back. That also makes aliasing (one buffer
//! bound twice) well defined: bindings are written back in order.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use smallvec::SmallVec;

mod loopback;
mod memory;

pub use loopback::{Loopback, LoopbackId};
pub use memory::HostMemory;

use memory::range;

use scope_core::LaunchLimits;
use scope_core::StreamId;
use scope_core::backend::{Access, Backend, BoundDispatch, Launch};
use scope_core::collective::device::{DeviceCall, DeviceCollectives, DeviceTransfer};
use scope_core::kernel::{Kernel, KernelSource, Language};
use scope_core::{Error, Kind, Result};

/// What a host kernel gets.
pub struct HostArgs<'a> {
    /// Each binding's bytes, in order. Written bindings are copied back after the closure returns
    /// `Ok`.
    pub bindings: &'a mut [Vec<u8>],
    /// The scalar blob.
    pub scalars: &'a [u8],
    /// The workgroup count.
    pub groups: [u32; 3],
}

impl HostArgs<'_> {
    /// Scalar `index` of the blob read as a little-endian `u32`, or 0.
    pub fn scalar_u32(&self, index: usize) -> u32 {
        self.scalars
            .get(index * 4..index * 4 + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .unwrap_or(0)
    }
}

impl HostArgs<'_> {
    /// Binding `index`'s bytes, or an error naming the binding a kernel expected and was not given.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when there is no binding `index`.
    pub fn binding(&mut self, index: usize) -> Result<&mut Vec<u8>> {
        let given = self.bindings.len();
        self.bindings.get_mut(index).ok_or_else(|| {
            Error::invalid(
                format!("binding {index}"),
                format!("the kernel reads binding {index} and {given} were given"),
            )
        })
    }
}

/// A host kernel. Returning an error fails the launch with it; return a sticky [`Error::Fault`] to
/// model a device fault. A kernel that panics fails its launch as a trapped GPU kernel would. The
/// panic is caught, and its outputs carry an [`Error::Launch`] that quotes it.
pub type HostFn = Arc<dyn Fn(&mut HostArgs<'_>) -> Result<()> + Send + Sync>;

/// A registered host kernel: its closure and, when registered with one, the number of bindings it
/// takes. [`Backend::check_launch`] holds a launch to that number before anything runs.
#[derive(Clone)]
pub struct HostKernel(Arc<KernelInner>);

struct KernelInner {
    run: HostFn,
    bindings: Option<usize>,
    /// The kernel's name, for the error a panic becomes.
    name: Arc<str>,
}

impl HostKernel {
    fn new(run: HostFn, bindings: Option<usize>, name: Arc<str>) -> Self {
        Self(Arc::new(KernelInner {
            run,
            bindings,
            name,
        }))
    }
}

/// The most workgroups a host launch runs in each dimension, as a GPU has a grid limit. A
/// host-given count past it is an invalid argument, and an indirect one runs nothing.
pub const MAX_GROUPS: u32 = 65_535;

/// Read `bytes` as little-endian `u32` words.
pub fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Write `words` as little-endian bytes.
pub fn bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[derive(Clone)]
enum Op {
    Write {
        dst: HostMemory,
        offset: u64,
        data: Arc<[u8]>,
    },
    Copy {
        src: HostMemory,
        src_offset: u64,
        dst: HostMemory,
        dst_offset: u64,
        len: u64,
    },
    Launch {
        kernel: HostKernel,
        stream: StreamId,
        bindings: Vec<(HostMemory, u64, u64, Access)>,
        scalars: Arc<[u8]>,
        groups: Result<[u32; 3], (HostMemory, u64)>,
    },
    /// A rank's part of a loopback collective.
    Collective(loopback::Exchange),
}

impl Op {
    fn run(&self) -> Result<()> {
        match self {
            Op::Collective(exchange) => exchange.run(),
            Op::Write { dst, offset, data } => {
                dst.lock()[range(*offset, data.len() as u64)].copy_from_slice(data);
                Ok(())
            }
            Op::Copy {
                src,
                src_offset,
                dst,
                dst_offset,
                len,
            } => {
                let bytes = src.lock()[range(*src_offset, *len)].to_vec();
                dst.lock()[range(*dst_offset, *len)].copy_from_slice(&bytes);
                Ok(())
            }
            Op::Launch {
                kernel,
                stream,
                bindings,
                scalars,
                groups,
            } => {
                let bindings: SmallVec<[Binding<'_>; 4]> = bindings
                    .iter()
                    .map(|(m, offset, len, access)| (m, *offset, *len, *access))
                    .collect();
                run_launch(
                    kernel,
                    *stream,
                    &bindings,
                    scalars,
                    groups
                        .as_ref()
                        .map_err(|(memory, offset)| (memory, *offset)),
                )
            }
        }
    }
}

/// A binding as a launch runs it: memory, offset, length, access.
type Binding<'a> = (&'a HostMemory, u64, u64, Access);

/// Run a launch now: each binding copied into a scratch vector, the closure run, the written ones
/// copied back. A panic is caught and made its launch's error.
fn run_launch(
    kernel: &HostKernel,
    stream: StreamId,
    bindings: &[Binding<'_>],
    scalars: &[u8],
    groups: std::result::Result<&[u32; 3], (&HostMemory, u64)>,
) -> Result<()> {
    let groups = match groups {
        Ok(groups) => *groups,
        Err((memory, offset)) => {
            let w = words(&memory.lock()[range(offset, 12)]);
            [w[0], w[1], w[2]]
        }
    };
    if groups.contains(&0) || groups.iter().any(|&g| g > MAX_GROUPS) {
        // A zero runs nothing, as does an indirect count past the limit (a host-given one was
        // refused).
        return Ok(());
    }
    let mut scratch: SmallVec<[Vec<u8>; 4]> = bindings
        .iter()
        .map(|(m, offset, len, _)| m.lock()[range(*offset, *len)].to_vec())
        .collect();
    let ran = catch_unwind(AssertUnwindSafe(|| {
        (kernel.0.run)(&mut HostArgs {
            bindings: &mut scratch,
            scalars,
            groups,
        })
    }));
    match ran {
        Ok(result) => result?,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            return Err(Error::Launch {
                kernel: kernel.0.name.clone(),
                stream,
                detail: format!("the host kernel panicked: {message}"),
            });
        }
    }
    for ((m, offset, len, access), bytes) in bindings.iter().zip(&scratch) {
        if access.writes() && bytes.len() as u64 == *len {
            m.lock()[range(*offset, *len)].copy_from_slice(bytes);
        }
    }
    Ok(())
}

/// A host stream: runs work at once, or records it while capturing.
pub struct HostStream {
    id: StreamId,
    recording: Option<Vec<Op>>,
}

impl HostStream {
    fn issue(&mut self, op: Op) -> Result<()> {
        match &mut self.recording {
            Some(ops) => {
                ops.push(op);
                Ok(())
            }
            None => op.run(),
        }
    }
}

/// A recorded host graph.
pub struct HostGraph(Vec<Op>);

/// The reference backend.
pub struct Host {
    kernels: HashMap<Arc<str>, HostKernel>,
    reserved: u64,
    max_allocation: u64,
    limit: Option<u64>,
    /// The largest allocation the device has once it is opened again
    /// ([`reopens_smaller`](Self::reopens_smaller)).
    reopened_max_allocation: Option<u64>,
    /// Whether a lost device can be opened again ([`cannot_reopen`](Self::cannot_reopen)).
    reopens: bool,
}

impl Default for Host {
    fn default() -> Self {
        Self::new()
    }
}

impl Host {
    /// A host backend with the built-in kernels registered:
    ///
    /// - `fill`: `out[i] = scalar 1` for `i < scalar 0`; bindings `[out]`.
    /// - `copy`: `out[i] = in[i]` for `i < scalar 0`; bindings `[in, out]`.
    /// - `add`: `out[i] = a[i] + b[i]` (wrapping) for `i < scalar 0`;
    ///   bindings `[a, b, out]`.
    ///
    /// All work on `u32` words.
    pub fn new() -> Self {
        let mut host = Self {
            kernels: HashMap::new(),
            reserved: 0,
            max_allocation: 1 << 40,
            // Reserving more than the machine has would succeed under overcommit, then be killed
            // when touched. A device has a fixed amount, and so does the reference.
            limit: Some(8 << 30),
            reopened_max_allocation: None,
            reopens: true,
        };
        // The built-ins stop at the shortest binding: a count past its end writes what fits, as on
        // a GPU.
        host.register_taking("fill", 1, |args| {
            let n = args.scalar_u32(0) as usize;
            let value = args.scalar_u32(1);
            for chunk in args.binding(0)?.chunks_exact_mut(4).take(n) {
                chunk.copy_from_slice(&value.to_le_bytes());
            }
            Ok(())
        });
        host.register_taking("copy", 2, |args| {
            let input = words(args.binding(0)?);
            let n = (args.scalar_u32(0) as usize).min(input.len());
            let out = args.binding(1)?;
            for (chunk, word) in out.chunks_exact_mut(4).zip(&input[..n]) {
                chunk.copy_from_slice(&word.to_le_bytes());
            }
            Ok(())
        });
        host.register_taking("add", 3, |args| {
            let n = args.scalar_u32(0) as usize;
            let a = words(args.binding(0)?);
            let b = words(args.binding(1)?);
            let out = args.binding(2)?;
            for (i, chunk) in out.chunks_exact_mut(4).take(n).enumerate() {
                let sum = a
                    .get(i)
                    .copied()
                    .unwrap_or(0)
                    .wrapping_add(b.get(i).copied().unwrap_or(0));
                chunk.copy_from_slice(&sum.to_le_bytes());
            }
            Ok(())
        });
        host
    }

    /// The next time the device is opened again ([`Client::recover`](scope_core::Client::recover)),
    /// its largest allocation is `max_allocation`. A device that comes back smaller, for a test of
    /// what no longer fits.
    pub fn reopens_smaller(mut self, max_allocation: u64) -> Self {
        self.reopened_max_allocation = Some(max_allocation);
        self
    }

    /// A device that, once lost, cannot be opened again in this process (rule 52).
    /// [`Client::recover`](scope_core::Client::recover) is refused with [`Error::RestartRequired`],
    /// and the client stays poisoned. A backend with no [`Backend::reopen`] of its own (CUDA's and
    /// HIP's) acts the same.
    pub fn cannot_reopen(mut self) -> Self {
        self.reopens = false;
        self
    }

    /// Register `kernel` under `name`, for [`Kernel::host`].
    pub fn register(
        &mut self,
        name: &str,
        kernel: impl Fn(&mut HostArgs<'_>) -> Result<()> + Send + Sync + 'static,
    ) {
        self.kernels.insert(
            Arc::from(name),
            HostKernel::new(Arc::new(kernel), None, Arc::from(name)),
        );
    }

    /// Register `kernel` under `name`, taking exactly `bindings` bindings. A launch with any other
    /// number is refused before it runs. A GPU server refuses one that does not match the kernel's
    /// layout the same way.
    pub fn register_taking(
        &mut self,
        name: &str,
        bindings: usize,
        kernel: impl Fn(&mut HostArgs<'_>) -> Result<()> + Send + Sync + 'static,
    ) {
        self.kernels.insert(
            Arc::from(name),
            HostKernel::new(Arc::new(kernel), Some(bindings), Arc::from(name)),
        );
    }

    /// Make allocations past `bytes` in all fail with out-of-memory, as a device with that much
    /// memory would. 8 GiB by default.
    pub fn with_memory_limit(mut self, bytes: u64) -> Self {
        self.limit = Some(bytes);
        self
    }
}

impl Backend for Host {
    type Memory = HostMemory;
    type Stream = HostStream;
    type Kernel = HostKernel;
    type Graph = HostGraph;
    /// Nothing: the reference server runs work as it is issued, so a stream never has any pending.
    type Waiter = ();

    const KIND: Kind = Kind::Host;

    fn describe(&self) -> String {
        "host memory (reference server)".to_owned()
    }

    fn accepts(&self, language: Language) -> bool {
        language == Language::Host
    }

    /// A host kernel is one closure per launch that sees the workgroup count. It has no workgroup
    /// of invocations, no workgroup memory and no shader types. So those are reported as one
    /// invocation and none. It takes any number of bindings and any scalar blob, each as large as
    /// memory allows. Only the grid is bounded.
    fn launch_limits(&self) -> LaunchLimits {
        let mut limits = LaunchLimits::default();
        limits.max_bindings = u32::MAX;
        limits.max_binding_size = self.max_allocation();
        limits.max_scalar_bytes = u32::MAX;
        limits.max_workgroups = [MAX_GROUPS; 3];
        limits.max_workgroup_size = [1; 3];
        limits.max_invocations = 1;
        limits.max_workgroup_memory = 0;
        limits
    }

    fn max_allocation(&self) -> u64 {
        // A request past all the memory there is can never fit. The core refuses it as an invalid
        // argument, as every server does, and keeps out-of-memory for "not now".
        self.limit
            .map_or(self.max_allocation, |limit| limit.min(self.max_allocation))
    }

    fn binding_alignment(&self) -> u64 {
        4
    }

    unsafe fn create_stream(&mut self, id: scope_core::StreamId) -> Result<HostStream> {
        Ok(HostStream {
            id,
            recording: None,
        })
    }

    unsafe fn allocate(&mut self, _stream: &mut HostStream, size: u64) -> Result<HostMemory> {
        let len = usize::try_from(size)
            .map_err(|_| Error::invalid("allocation size", "past the address space"))?;
        if let Some(limit) = self.limit
            && self.reserved + size > limit
        {
            return Err(Error::OutOfMemory {
                backend: Self::NAME,
                requested: size,
                detail: format!("{} of {limit} bytes in use", self.reserved),
            });
        }
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(len)
            .map_err(|e| Error::OutOfMemory {
                backend: Self::NAME,
                requested: size,
                detail: e.to_string(),
            })?;
        bytes.resize(len, 0);
        self.reserved += size;
        Ok(Arc::new(Mutex::new(bytes)))
    }

    unsafe fn free(&mut self, memory: HostMemory) {
        self.reserved -= memory.lock().len() as u64;
    }

    fn bytes_reserved(&self) -> u64 {
        self.reserved
    }

    unsafe fn write(
        &mut self,
        stream: &mut HostStream,
        dst: &HostMemory,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        stream.issue(Op::Write {
            dst: dst.clone(),
            offset,
            data: Arc::from(data),
        })
    }

    unsafe fn read(
        &mut self,
        _stream: &mut HostStream,
        src: &HostMemory,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        out.copy_from_slice(&src.lock()[range(offset, out.len() as u64)]);
        Ok(())
    }

    unsafe fn copy(
        &mut self,
        stream: &mut HostStream,
        src: &HostMemory,
        src_offset: u64,
        dst: &HostMemory,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        stream.issue(Op::Copy {
            src: src.clone(),
            src_offset,
            dst: dst.clone(),
            dst_offset,
            len,
        })
    }

    fn compile(&mut self, kernel: &Kernel) -> Result<HostKernel> {
        let KernelSource::Host(name) = kernel.source() else {
            return Err(Error::Compile {
                backend: Self::NAME,
                kernel: kernel.name().clone(),
                log: "the host server runs registered closures only".to_owned(),
            });
        };
        self.kernels
            .get(name)
            .map(|registered| {
                HostKernel::new(
                    registered.0.run.clone(),
                    registered.0.bindings,
                    kernel.name().clone(),
                )
            })
            .ok_or_else(|| Error::Compile {
                backend: Self::NAME,
                kernel: kernel.name().clone(),
                log: format!("no host kernel is registered as `{name}`"),
            })
    }

    fn check_launch(&self, kernel: &HostKernel, launch: &Launch<'_, HostMemory>) -> Result<()> {
        match kernel.0.bindings {
            Some(taken) if taken != launch.bindings.len() => Err(Error::invalid(
                format!("bindings of `{}`", launch.name),
                format!("it takes {taken} and {} were given", launch.bindings.len()),
            )),
            _ => Ok(()),
        }
    }

    unsafe fn launch(
        &mut self,
        stream: &mut HostStream,
        kernel: &HostKernel,
        launch: &Launch<'_, HostMemory>,
    ) -> Result<()> {
        let id = stream.id;
        if stream.recording.is_none() {
            // Run now: nothing outlives the call, so nothing is boxed or shared.
            let bindings: SmallVec<[Binding<'_>; 4]> = launch
                .bindings
                .iter()
                .map(|b| (b.memory, b.offset, b.len, b.access))
                .collect();
            let groups = match &launch.dispatch {
                BoundDispatch::Groups(groups) => Ok(groups),
                BoundDispatch::Indirect { memory, offset } => Err((*memory, *offset)),
            };
            return run_launch(kernel, id, &bindings, launch.scalars, groups);
        }
        let bindings = launch
            .bindings
            .iter()
            .map(|b| (b.memory.clone(), b.offset, b.len, b.access))
            .collect();
        let groups = match &launch.dispatch {
            BoundDispatch::Groups(groups) => Ok(*groups),
            BoundDispatch::Indirect { memory, offset } => Err(((*memory).clone(), *offset)),
        };
        stream.issue(Op::Launch {
            kernel: kernel.clone(),
            stream: id,
            bindings,
            scalars: Arc::from(launch.scalars),
            groups,
        })
    }

    unsafe fn begin_wait(&mut self, _stream: &mut HostStream) -> Result<Option<()>> {
        Ok(None)
    }

    unsafe fn wait((): &()) -> Result<()> {
        Ok(())
    }

    unsafe fn end_wait(&mut self, _stream: &mut HostStream, (): ()) -> Result<()> {
        Ok(())
    }

    unsafe fn order(&mut self, _first: &mut HostStream, _then: &mut HostStream) -> Result<()> {
        Ok(())
    }

    unsafe fn begin_capture(&mut self, stream: &mut HostStream) -> Result<()> {
        stream.recording = Some(Vec::new());
        Ok(())
    }

    unsafe fn end_capture(&mut self, stream: &mut HostStream) -> Result<HostGraph> {
        stream.recording.take().map(HostGraph).ok_or_else(|| {
            Error::internal("the host stream was asked to end a capture it was not recording")
        })
    }

    unsafe fn abort_capture(&mut self, stream: &mut HostStream) {
        stream.recording = None;
    }

    unsafe fn replay(&mut self, stream: &mut HostStream, graph: &HostGraph) -> Result<()> {
        for op in &graph.0 {
            stream.issue(op.clone())?;
        }
        Ok(())
    }

    unsafe fn destroy_graph(&mut self, _graph: HostGraph) -> Result<()> {
        Ok(())
    }

    /// Host memory is never lost, so opening the "device" again forgets what the streams recorded
    /// and reserved. The core gave every allocation back first. It takes the smaller largest
    /// allocation a test asked for ([`Host::reopens_smaller`]). A host built not to
    /// ([`Host::cannot_reopen`]) refuses.
    unsafe fn reopen(&mut self, fault: &Error, streams: &mut [&mut HostStream]) -> Result<()> {
        if !self.reopens {
            return Err(Error::restart_required(
                Self::NAME,
                fault,
                "built not to open a lost device again (Host::cannot_reopen)",
            ));
        }
        for stream in streams {
            stream.recording = None;
        }
        self.reserved = 0;
        if let Some(max) = self.reopened_max_allocation.take() {
            self.max_allocation = max;
        }
        Ok(())
    }
}

/// A client of a new reference host server.
///
/// # Errors
///
/// None in practice; the signature matches the GPU servers'.
pub fn client() -> Result<scope_core::Client<Host>> {
    scope_core::Client::new(Host::new())
}

/// The loopback transport as the host backend's device collectives. Every step is the
/// communicator's own (`loopback.rs`); this only hands it the stream work and the memory.
impl DeviceCollectives for Host {
    type Communicator = Loopback;
    type Identity = LoopbackId;

    fn identity() -> Result<LoopbackId> {
        Ok(LoopbackId::new())
    }

    unsafe fn join(
        &mut self,
        identity: &LoopbackId,
        rank: usize,
        ranks: usize,
        patience: Duration,
    ) -> Result<Loopback> {
        Loopback::join(identity, rank, ranks, patience)
    }

    unsafe fn collective(
        &mut self,
        communicator: &Loopback,
        stream: &mut HostStream,
        call: &DeviceCall<'_, HostMemory>,
    ) -> Result<()> {
        stream.issue(Op::Collective(communicator.exchange(call)))
    }

    unsafe fn point_to_point(
        &mut self,
        communicator: &Loopback,
        _stream: &mut HostStream,
        call: &DeviceTransfer<'_, HostMemory>,
    ) -> Result<()> {
        communicator.transfer(call)
    }

    unsafe fn abort(communicator: &Loopback) {
        communicator.abort();
    }

    /// The host runs work as it is issued: a call that returned finished.
    unsafe fn finished((): &()) -> Result<bool> {
        Ok(true)
    }

    unsafe fn health(communicator: &Loopback) -> Result<()> {
        communicator.health()
    }
}
