//! What a backend supplies: the device calls, and nothing else.
//!
//! Every server is the core's `Server<B>` for some `B: Backend`. The core
//! keeps what the servers share: the buffer table, scopes, capture windows,
//! ordering, attribution of late faults, poison, fault injection. A backend
//! answers only what differs between APIs: how to allocate, copy, compile,
//! launch, wait, record and replay. The split follows wgpu-hal's `Api`
//! trait. A rule a backend kept itself would be one the others do not keep.
//!
//! Methods return the core's [`Error`](crate::Error). The backend
//! classifies each fault once, from its own code, when it surfaces
//! ([`FaultClass`](crate::FaultClass)). The core poisons on a sticky one
//! and refuses to reopen after a process-fatal one. A backend never panics
//! on a driver error.
//!
//! The device calls are an `unsafe` contract, as wgpu-hal's are: see
//! [`Backend`].

use crate::error::Result;
use crate::id::StreamId;
use crate::kernel::{Kernel, Language};
use crate::limits::LaunchLimits;

/// How a launch uses a binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Read only: in the launch's read set.
    Read,
    /// Written only: in the launch's write set.
    Write,
    /// Read and written: in both.
    ReadWrite,
}

impl Access {
    /// Whether the launch reads it.
    pub fn reads(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }

    /// Whether the launch writes it.
    pub fn writes(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

/// One binding of a launch, resolved to backend memory.
#[derive(Debug)]
pub struct Bound<'a, M> {
    /// The memory.
    pub memory: &'a M,
    /// First byte bound.
    pub offset: u64,
    /// Bytes bound.
    pub len: u64,
    /// How the launch uses it.
    pub access: Access,
}

// `Copy` whatever `M` is: a binding holds a reference to the memory, never
// the memory (a derive would ask `M: Copy`).
impl<M> Clone for Bound<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M> Copy for Bound<'_, M> {}

/// How many workgroups a launch runs, resolved to backend memory.
#[derive(Debug)]
pub enum BoundDispatch<'a, M> {
    /// A count known on the host. Never zero in any dimension: the core does
    /// not call the backend for a launch that runs nothing.
    Groups([u32; 3]),
    /// Three `u32` counts read from device memory at `offset`.
    Indirect {
        /// The memory holding the counts.
        memory: &'a M,
        /// Where they start.
        offset: u64,
    },
}

/// Whether host-given workgroup counts `groups` fit a grid of `max`.
///
/// If not, an [`Error::InvalidArgument`](crate::Error::InvalidArgument)
/// naming the axis. The core asks it of every launch, against
/// [`LaunchLimits::max_workgroups`], before the backend's own checks.
#[inline(always)]
pub(crate) fn grid_within(name: &str, groups: [u32; 3], max: [u32; 3]) -> crate::Result<()> {
    if groups[0] <= max[0] && groups[1] <= max[1] && groups[2] <= max[2] {
        return Ok(());
    }
    past_the_grid(name, groups, max)
}

/// The error of [`grid_within`], out of the launch's way.
#[cold]
#[inline(never)]
fn past_the_grid(name: &str, groups: [u32; 3], max: [u32; 3]) -> crate::Result<()> {
    match groups
        .iter()
        .zip(max)
        .enumerate()
        .find(|(_, (g, m))| **g > *m)
    {
        Some((axis, (count, max))) => Err(crate::Error::invalid(
            format!("dispatch of `{name}`"),
            format!("{count} workgroups along axis {axis} is past the device's {max}"),
        )),
        None => Ok(()),
    }
}

/// A launch, resolved: what [`Backend::launch`] gets.
#[derive(Debug)]
pub struct Launch<'a, M> {
    /// The kernel's name, for error messages.
    pub name: &'a str,
    /// The bindings, in order.
    pub bindings: &'a [Bound<'a, M>],
    /// The scalar blob; may be empty.
    pub scalars: &'a [u8],
    /// How many workgroups.
    pub dispatch: BoundDispatch<'a, M>,
}

/// The device calls of one GPU API.
///
/// Calls take `&mut self` and their stream: the core holds the server
/// behind one lock, so a backend needs no locking of its own. Only
/// [`wait`](Self::wait) runs without the lock; it has no `self`.
///
/// Within a capture window ([`begin_capture`](Self::begin_capture) to
/// [`end_capture`](Self::end_capture)) a stream's writes, copies and
/// launches are recorded, not run. A host write records its bytes as given
/// then. A graph keeps alive what its replays use: its kernels, and any
/// staging they read. A kernel the core drops must not leave a graph
/// pointing at an unloaded module.
///
/// # An `unsafe` contract, as wgpu-hal's
///
/// The calls that touch device memory or the backend's objects are `unsafe
/// fn`s. A backend trusts what it is handed: an offset inside the
/// allocation, a stream it made, a live graph. Checking again in every
/// server would write one rule four times. The checks live once, in the
/// core's `Server<B>` (`server/handles.rs`), the only caller. Each call
/// there has a `SAFETY` comment citing its validation. A safe caller
/// outside the core cannot reach them:
///
/// ```compile_fail
/// fn behind_the_cores_back<B: scope_core::Backend>(b: &mut B, s: &mut B::Stream) {
///     // error[E0133]: call to unsafe function requires an unsafe block
///     let _ = b.allocate(s, 4);
/// }
/// ```
///
/// What every `unsafe` method asks, besides its own `# Safety` section:
///
/// 1. **Objects are this backend's and alive.** Every stream, memory,
///    kernel, graph and waiter came from this backend value. None was given
///    back (`free`, `destroy_graph`, `end_wait`/`end_read`).
/// 2. **Ranges are inside.** Every `offset`/`len` pair lies inside its
///    memory's size. A slice is as long as the range it stands for.
/// 3. **One stream, one state.** A stream records exactly between a
///    successful `begin_capture` and its `end_capture` or `abort_capture`.
///    Neither is called on a stream in the wrong state.
///
/// Implementing the trait stays safe outside this crate: the `unsafe` is
/// on the caller's side. A backend may do raw pointer arithmetic on these
/// promises; its `SAFETY` comments cite the contract.
pub trait Backend: Send + 'static {
    /// A device allocation.
    type Memory: Send + 'static;
    /// A logical stream's device state.
    type Stream: Send + 'static;
    /// A compiled kernel.
    type Kernel: Send + 'static;
    /// A captured, replayable graph.
    type Graph: Send + 'static;
    /// What waiting for a stream's work needs without the server's lock
    /// ([`begin_wait`](Self::begin_wait)): a semaphore value, an event.
    type Waiter: Send + 'static;

    /// The backend's name: `cuda`, `hip`, `vulkan`, `wgpu`, `host`.
    const NAME: &'static str;

    /// Why its process-fatal faults ([`FaultClass::ProcessFatal`]) need
    /// a new process: the reason [`Error::RestartRequired`] gives.
    ///
    /// [`FaultClass::ProcessFatal`]: crate::FaultClass::ProcessFatal
    /// [`Error::RestartRequired`]: crate::Error::RestartRequired
    const RESTART: &'static str = "the driver says the process must restart after this fault";

    /// The device, for a person: name, kind, driver.
    fn describe(&self) -> String;

    /// Whether it compiles kernels written in `language`.
    fn accepts(&self, language: Language) -> bool;

    /// The largest allocation it can make. A larger request is an invalid
    /// argument, not an out-of-memory.
    fn max_allocation(&self) -> u64;

    /// The alignment a binding's offset must have.
    fn binding_alignment(&self) -> u64 {
        256
    }

    /// What one launch may ask for, and the optional features enabled.
    ///
    /// [`check_launch`](Self::check_launch) enforces the same values. A
    /// launch inside them must not be refused; one past the grid must be
    /// (rule 38). Asked when the server starts and after a reopen.
    fn launch_limits(&self) -> LaunchLimits;

    /// A new logical stream, which the core calls `id`.
    ///
    /// # Safety
    ///
    /// `id` is the number of streams this backend created successfully so
    /// far. A backend may index its own tables by it.
    unsafe fn create_stream(&mut self, id: StreamId) -> Result<Self::Stream>;

    /// `size` bytes of device memory for work on `stream`, contents
    /// unspecified.
    ///
    /// The core records `stream` as the buffer's first user. Any other
    /// stream's first use is ordered after it ([`order`](Self::order)). So
    /// a stream-ordered pool (CUDA's, HIP's) may allocate in `stream`'s
    /// order and return at once. `stream` may be recording: the allocation
    /// must not become part of the recorded work.
    ///
    /// # Safety
    ///
    /// `stream` is this backend's and alive. `size` is non-zero and at most
    /// [`max_allocation`](Self::max_allocation).
    unsafe fn allocate(&mut self, stream: &mut Self::Stream, size: u64) -> Result<Self::Memory>;

    /// Give memory back. Work in flight may still use it: the backend keeps
    /// it until that work is done.
    ///
    /// # Safety
    ///
    /// `memory` is this backend's, and no later call names it, nor any
    /// graph a later replay runs.
    unsafe fn free(&mut self, memory: Self::Memory);

    /// Release memory the backend caches for reuse, before the core retries
    /// an allocation that ran out (rule 37).
    fn trim(&mut self) {}

    /// Bytes of device memory the backend holds, in use or cached.
    fn bytes_reserved(&self) -> u64;

    /// Write `data` at `offset` of `dst`, ordered on `stream`. `data` is
    /// only borrowed for the call.
    ///
    /// # Safety
    ///
    /// `stream` and `dst` are this backend's and alive;
    /// `offset..offset + data.len()` lies inside `dst`, and both are
    /// multiples of 4.
    unsafe fn write(
        &mut self,
        stream: &mut Self::Stream,
        dst: &Self::Memory,
        offset: u64,
        data: &[u8],
    ) -> Result<()>;

    /// Read `out.len()` bytes at `offset` of `src` after the stream's
    /// earlier work, waiting for them.
    ///
    /// # Safety
    ///
    /// `stream` and `src` are this backend's and alive;
    /// `offset..offset + out.len()` lies inside `src`, and both are
    /// multiples of 4. `stream` is not recording.
    unsafe fn read(
        &mut self,
        stream: &mut Self::Stream,
        src: &Self::Memory,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()>;

    /// Begin a host read of `len` bytes at `offset` of `src`, after the
    /// stream's earlier work.
    ///
    /// A read takes three steps: `begin_read` under the lock,
    /// [`wait`](Self::wait) without it, [`end_read`](Self::end_read) under
    /// it again. The default waits for the stream and copies in `end_read`:
    /// a second, short trip to the device. A backend that can copy into
    /// staging in the same submission returns a waiter holding the staging.
    ///
    /// # Safety
    ///
    /// As for [`read`](Self::read), with `len` for `out.len()`; the waiter
    /// returned is ended exactly once, by `end_read` or `end_wait` on the
    /// same stream.
    unsafe fn begin_read(
        &mut self,
        stream: &mut Self::Stream,
        src: &Self::Memory,
        offset: u64,
        len: u64,
    ) -> Result<Option<Self::Waiter>> {
        let _ = (src, offset, len);
        // SAFETY: the caller's promises for `begin_read` include
        // `begin_wait`'s: `stream` is this backend's, alive and not
        // recording.
        unsafe { self.begin_wait(stream) }
    }

    /// Finish a read [`begin_read`](Self::begin_read) began: copy the bytes
    /// into `out` and recycle what the waiter held.
    ///
    /// Called once [`wait`](Self::wait) succeeded and the core checked the
    /// read again. A read the core gives up on ends with
    /// [`end_wait`](Self::end_wait) instead, which must recycle it too.
    ///
    /// # Safety
    ///
    /// `waiter` is what `begin_read` returned for this same `stream`, `src`,
    /// `offset` and `out.len()`, and [`wait`](Self::wait) on it returned
    /// `Ok`; the range still lies inside `src`, which is still alive.
    unsafe fn end_read(
        &mut self,
        stream: &mut Self::Stream,
        waiter: Option<Self::Waiter>,
        src: &Self::Memory,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        if let Some(waiter) = waiter {
            // SAFETY: the waiter came from `begin_wait` on this stream (the
            // default `begin_read`) and is ended here, once.
            unsafe { self.end_wait(stream, waiter)? };
        }
        // SAFETY: `end_read`'s caller promises `read`'s conditions for this
        // range.
        unsafe { self.read(stream, src, offset, out) }
    }

    /// Copy `len` bytes, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// `stream`, `src` and `dst` are this backend's and alive. Both ranges
    /// lie inside their memories, all multiples of 4. They do not overlap
    /// when `src` and `dst` are one memory.
    #[allow(clippy::too_many_arguments)]
    unsafe fn copy(
        &mut self,
        stream: &mut Self::Stream,
        src: &Self::Memory,
        src_offset: u64,
        dst: &Self::Memory,
        dst_offset: u64,
        len: u64,
    ) -> Result<()>;

    /// Compile `kernel`. A source the compiler rejects is
    /// [`Error::Compile`](crate::Error::Compile) with its log.
    fn compile(&mut self, kernel: &Kernel) -> Result<Self::Kernel>;

    /// Check `launch` against this backend's own limits before the core
    /// opens its scope: binding counts and sizes, block sizes, push-constant
    /// room. The core has checked the grid already.
    ///
    /// A refusal is the caller's mistake, not a device failure. It must be
    /// an [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming
    /// what was wrong; it claims nothing and fires no hook (rule 38). Inside
    /// [`launch`](Self::launch) the same check would claim outputs and read
    /// as a device failure.
    ///
    /// Called only when every binding has memory, also for host counts
    /// holding a zero. An indirect dispatch's counts are not in `bindings`.
    fn check_launch(&self, kernel: &Self::Kernel, launch: &Launch<'_, Self::Memory>) -> Result<()> {
        let _ = (kernel, launch);
        Ok(())
    }

    /// Launch, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// `stream`, `kernel` and every memory in `launch` are this backend's
    /// and alive. Every binding's range lies inside its memory, its offset
    /// a multiple of [`binding_alignment`](Self::binding_alignment). An
    /// indirect dispatch's 12 bytes lie inside theirs. Host counts are
    /// non-zero and within the grid. [`check_launch`](Self::check_launch)
    /// accepted this launch.
    unsafe fn launch(
        &mut self,
        stream: &mut Self::Stream,
        kernel: &Self::Kernel,
        launch: &Launch<'_, Self::Memory>,
    ) -> Result<()>;

    /// Submit what the stream has batched, without waiting.
    ///
    /// # Safety
    ///
    /// `stream` is this backend's and alive.
    unsafe fn flush(&mut self, stream: &mut Self::Stream) -> Result<()> {
        let _ = stream;
        Ok(())
    }

    /// Wait for all of the stream's work. The core attributes a fault that
    /// surfaces here to the work in flight (rule 23).
    ///
    /// The core calls this only where it must wait with the lock held. A
    /// caller's sync and read go through [`begin_wait`](Self::begin_wait).
    /// The default is that sequence, under the lock.
    ///
    /// # Safety
    ///
    /// `stream` is this backend's and alive.
    unsafe fn sync(&mut self, stream: &mut Self::Stream) -> Result<()> {
        // SAFETY: `sync`'s promises are `begin_wait`'s, but for recording,
        // which a backend's `begin_wait` must then answer.
        let Some(waiter) = (unsafe { self.begin_wait(stream)? }) else {
            return Ok(());
        };
        // SAFETY: the waiter was just made by this backend and is ended
        // below, after the wait.
        let waited = unsafe { Self::wait(&waiter) };
        // SAFETY: as above: this stream's waiter, ended once.
        unsafe { self.end_wait(stream, waiter) }.and(waited)
    }

    /// Submit what the stream has batched, and say how to wait for its work
    /// so far without the backend: `None` when nothing is pending.
    ///
    /// The first of three steps that let a wait run without the server's
    /// lock: `begin_wait` and [`end_wait`](Self::end_wait) under it,
    /// [`wait`](Self::wait) outside. Otherwise a long kernel would stall
    /// every thread. Meanwhile other threads may issue work on any stream.
    /// The waiter covers the work submitted before it. The backend must
    /// not recycle anything a waiter still names.
    ///
    /// # Safety
    ///
    /// `stream` is this backend's and alive, and not recording; the waiter
    /// returned is ended exactly once, by `end_wait` on the same stream.
    unsafe fn begin_wait(&mut self, stream: &mut Self::Stream) -> Result<Option<Self::Waiter>>;

    /// Wait for what `waiter` covers, bounded by the backend's wait timeout.
    ///
    /// Called with no lock held, while other threads may call the backend.
    /// It touches only what `waiter` holds and the API lets threads share.
    /// The core attributes a fault here to the work covered (rule 23).
    ///
    /// # Safety
    ///
    /// `waiter` came from this backend type's `begin_wait` or `begin_read`
    /// on a backend that is still alive, and has not been ended yet.
    unsafe fn wait(waiter: &Self::Waiter) -> Result<()>;

    /// Under the lock again, after [`wait`](Self::wait) returned.
    ///
    /// Recycle what completed work held, and report a fault the stream kept
    /// for its next wait (a lost batch). Runs whether or not the wait
    /// succeeded; its error is reported before the wait's.
    ///
    /// # Safety
    ///
    /// `waiter` came from `begin_wait` or `begin_read` on this `stream`,
    /// and is ended here once.
    unsafe fn end_wait(&mut self, stream: &mut Self::Stream, waiter: Self::Waiter) -> Result<()>;

    /// Make `then`'s later work wait for `first`'s earlier work.
    ///
    /// Never asked while `first` records. While `then` records, the core
    /// finishes `first` with [`sync`](Self::sync) instead.
    ///
    /// # Safety
    ///
    /// Both streams are this backend's, alive and distinct.
    unsafe fn order(&mut self, first: &mut Self::Stream, then: &mut Self::Stream) -> Result<()>;

    /// Start recording the stream's work into a graph.
    ///
    /// # Safety
    ///
    /// `stream` is this backend's, alive and not recording.
    unsafe fn begin_capture(&mut self, stream: &mut Self::Stream) -> Result<()>;

    /// Stop recording and seal what was recorded. A refusal (an invalidated
    /// capture, a failed instantiation) is the error.
    ///
    /// # Safety
    ///
    /// `stream` is this backend's, alive and recording; every memory the
    /// recording names stays alive while the graph does.
    unsafe fn end_capture(&mut self, stream: &mut Self::Stream) -> Result<Self::Graph>;

    /// Stop recording and throw the recording away.
    ///
    /// # Safety
    ///
    /// `stream` is this backend's, alive, and recording or just refused by
    /// [`end_capture`](Self::end_capture).
    unsafe fn abort_capture(&mut self, stream: &mut Self::Stream);

    /// Replay a graph, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// `stream` and `graph` are this backend's and alive, `stream` is not
    /// recording, and every memory the graph recorded work on is alive.
    unsafe fn replay(&mut self, stream: &mut Self::Stream, graph: &Self::Graph) -> Result<()>;

    /// Open the device again in place, after `fault` poisoned the server
    /// ([`Client::recover`](crate::Client::recover)).
    ///
    /// The backend tears down what is left of the lost device, never
    /// waiting past its wait timeout. It opens the same device anew: a new
    /// `VkDevice`, a new wgpu device, a reset CUDA context. Each of
    /// `streams` gets new device state in place, not recording. The core
    /// then asks the limits again and remakes every allocation.
    ///
    /// Never asked after a process-fatal fault: the core refuses it first.
    /// A backend that cannot reopen (the default) answers
    /// [`Error::RestartRequired`](crate::Error::RestartRequired) (rule 52).
    ///
    /// # Safety
    ///
    /// Every memory, kernel and graph this backend made was given back. No
    /// capture is open and no waiter outstanding. `streams` are every
    /// stream this backend made, in id order; nothing else names their old
    /// state.
    unsafe fn reopen(
        &mut self,
        fault: &crate::Error,
        streams: &mut [&mut Self::Stream],
    ) -> Result<()> {
        let _ = streams;
        Err(crate::Error::restart_required(
            Self::NAME,
            fault,
            "this backend cannot open a lost device again",
        ))
    }

    /// Destroy a graph, waiting for its replays in flight first (rule 35).
    ///
    /// The core [`flush`](Self::flush)es every stream not recording just
    /// before, so a batched replay has been submitted.
    ///
    /// # Safety
    ///
    /// `graph` is this backend's, and no later call names it.
    unsafe fn destroy_graph(&mut self, graph: Self::Graph) -> Result<()>;
}
