//! What a backend supplies: the device calls, and nothing else.
//!
//! Every server is the core's `Server<B>` for some `B: Backend`. The
//! core keeps everything the servers share — the buffer table and where
//! taint lives, scopes around every unit of work, capture windows and the
//! graph table, cross-stream ordering, the in-flight attribution of late
//! faults, device poison, fault injection — and a backend answers only the
//! questions that differ between APIs: how to allocate, copy, compile,
//! launch, wait, record and replay. The split follows wgpu-hal's `Api`
//! trait: associated types for the backend's own objects, methods for the
//! calls. A rule of the failure model that a backend implemented itself
//! would be a rule the other three do not keep.
//!
//! Methods return the core's [`Error`](crate::Error), classified by the
//! backend: a fault the driver declares sticky is
//! [`Error::Fault`](crate::Error::Fault) with `sticky: true`, and the core
//! poisons the device when it sees one. A backend never panics on a driver
//! error.
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

/// Whether host-given workgroup counts `groups` fit a grid of `max`: an
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming the axis
/// if not. The core asks it of every launch, against the backend's
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
/// Calls take `&mut self` and the stream they are for: the core holds the
/// server behind one lock, so a backend needs no locking of its own. The one
/// call made without the lock is [`wait`](Self::wait), which has no `self`:
/// it touches only what its waiter holds.
///
/// Within a capture window (between [`begin_capture`](Self::begin_capture)
/// and [`end_capture`](Self::end_capture) on a stream) writes, copies and
/// launches on that stream are recorded into the graph and do not run; a
/// host write records its bytes as given at that moment. A graph keeps
/// alive what its replays use: the kernels it recorded, and any staging a
/// recorded write or launch reads, for as long as the graph lives — a
/// kernel the core drops from its cache must not leave a graph pointing at
/// an unloaded module.
///
/// # An `unsafe` contract, as wgpu-hal's
///
/// The calls that touch device memory or the backend's objects are `unsafe
/// fn`s. A backend trusts what it is handed — an offset inside the
/// allocation, a stream it made, a graph not yet destroyed — because
/// checking again in every server would be the same rule written four times
/// and would still leave a raw pointer's arithmetic one forgotten check
/// from undefined behaviour. The checks live once, in the core's `Server<B>`
/// (`server/handles.rs`), and only the server calls these methods; every
/// call there sits in an `unsafe` block whose `SAFETY` comment cites the
/// validation that made it true. A safe caller outside the core cannot
/// reach them:
///
/// ```compile_fail
/// fn behind_the_cores_back<B: scope_core::Backend>(b: &mut B, s: &mut B::Stream) {
///     // error[E0133]: call to unsafe function requires an unsafe block
///     let _ = b.allocate(s, 4);
/// }
/// ```
///
/// What every `unsafe` method asks of its caller, besides its own `#
/// Safety` section:
///
/// 1. **Objects are this backend's and alive.** Every stream, memory,
///    kernel, graph and waiter passed was returned by this same backend
///    value, and has not been given back (`free`, `destroy_graph`,
///    `end_wait`/`end_read` for a waiter).
/// 2. **Ranges are inside.** Every `offset`/`len` pair named on a memory
///    lies inside the size it was allocated with, and a slice's length is
///    the length of the range it stands for.
/// 3. **One stream, one state.** A stream is recording a capture exactly
///    between a successful `begin_capture` and its `end_capture` or
///    `abort_capture`; `begin_capture` is never called on a recording
///    stream, nor `end_capture`/`abort_capture` on one that is not.
///
/// Implementing the trait stays safe to write outside this crate (a
/// third-party server): the `unsafe` is on the caller's side. A backend that
/// holds these promises may then do raw pointer arithmetic on them, and its
/// own `SAFETY` comments cite the contract, not "the core checked".
pub trait Backend: Send + 'static {
    /// A device allocation.
    type Memory: Send + 'static;
    /// A logical stream's device state.
    type Stream: Send + 'static;
    /// A compiled kernel.
    type Kernel: Send + 'static;
    /// A captured, replayable graph.
    type Graph: Send + 'static;
    /// What waiting for a stream's submitted work needs once the server's
    /// lock is released (see [`begin_wait`](Self::begin_wait)): a timeline
    /// value and its semaphore, an event, a submission index.
    type Waiter: Send + 'static;

    /// The backend's name: `cuda`, `hip`, `vulkan`, `wgpu`, `host`.
    const NAME: &'static str;

    /// The device, for a person: name, kind, driver.
    fn describe(&self) -> String;

    /// Whether it compiles kernels written in `language`.
    fn accepts(&self, language: Language) -> bool;

    /// The largest allocation it can make; a larger request is an invalid
    /// argument, not an out-of-memory.
    fn max_allocation(&self) -> u64;

    /// The alignment a binding's offset must have.
    fn binding_alignment(&self) -> u64 {
        256
    }

    /// What one launch may ask for: the limits
    /// [`check_launch`](Self::check_launch) enforces, read from the same
    /// values, and the optional features the backend enabled. A launch
    /// inside every one of them must not be refused as an invalid argument,
    /// and one past the grid must be (rule 38). Asked once, when the server
    /// starts.
    fn launch_limits(&self) -> LaunchLimits;

    /// A new logical stream, which the core calls `id`. Ids are given in
    /// creation order from 0, counting only streams created successfully,
    /// so a backend may index its own tables by them.
    ///
    /// # Safety
    ///
    /// `id` is the number of streams this backend has created successfully
    /// so far: a backend may index a table by it without a bounds check
    /// beyond its own growth.
    unsafe fn create_stream(&mut self, id: StreamId) -> Result<Self::Stream>;

    /// `size` bytes of device memory for work on `stream`. Contents are
    /// unspecified.
    ///
    /// The core records `stream` as the buffer's first user, so any other
    /// stream's first use of it is ordered after `stream`'s work
    /// ([`order`](Self::order)), exactly as for a buffer `stream` wrote. A
    /// backend with stream-ordered allocation (CUDA's and HIP's memory
    /// pools) may therefore allocate in `stream`'s order and return at once,
    /// instead of synchronising a stream of its own to make the memory valid
    /// everywhere. `stream` may be recording a capture: an allocation must
    /// never become part of the recorded work, which replays.
    ///
    /// # Safety
    ///
    /// `stream` is this backend's and alive. `size` is non-zero and at most
    /// [`max_allocation`](Self::max_allocation).
    unsafe fn allocate(&mut self, stream: &mut Self::Stream, size: u64) -> Result<Self::Memory>;

    /// Give memory back. Work still in flight may use it: the backend keeps
    /// it until that work is done.
    ///
    /// # Safety
    ///
    /// `memory` is this backend's, and no later call names it: no graph
    /// that a later replay runs recorded work on it (the core destroys such
    /// graphs first, or never frees what a live graph uses).
    unsafe fn free(&mut self, memory: Self::Memory);

    /// Release memory the backend caches for reuse, before the core retries
    /// an allocation that ran out (rule 37).
    fn trim(&mut self) {}

    /// Bytes of device memory the backend holds, in use or cached.
    fn bytes_reserved(&self) -> u64;

    /// Write `data` at `offset` of `dst`, ordered on `stream`. `data` is only
    /// borrowed for the call.
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

    /// Read `out.len()` bytes at `offset` of `src` after the stream's earlier
    /// work, waiting for them.
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
    /// stream's earlier work: the first of the three steps a caller's read
    /// takes (`begin_read` under the lock, [`wait`](Self::wait) without it,
    /// [`end_read`](Self::end_read) under it again).
    ///
    /// The default waits for the stream ([`begin_wait`](Self::begin_wait))
    /// and copies in `end_read`, which then costs a second, short trip to
    /// the device. A backend that can issue the copy into staging now, in
    /// the same submission as the stream's work, returns a waiter that
    /// covers it and holds the staging.
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

    /// Finish a read [`begin_read`](Self::begin_read) began, once
    /// [`wait`](Self::wait) returned success and the core checked the read
    /// again: copy the bytes into `out` and recycle what the waiter held.
    /// (A read the core gives up on instead — the wait failed, or the
    /// buffer was freed or failed meanwhile — ends with
    /// [`end_wait`](Self::end_wait), which must recycle a read's waiter
    /// too.)
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
    /// `stream`, `src` and `dst` are this backend's and alive;
    /// `src_offset..src_offset + len` lies inside `src` and
    /// `dst_offset..dst_offset + len` inside `dst`, all multiples of 4, and
    /// the two ranges do not overlap when `src` and `dst` are one memory.
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

    /// Check `launch` against this backend's own limits (binding counts,
    /// binding sizes, block sizes, push-constant room), before the core
    /// opens the launch's scope. Host-given workgroup counts are not among
    /// them: the core has checked those against
    /// [`launch_limits`](Self::launch_limits)' `max_workgroups`, the one
    /// grid rule for every server.
    ///
    /// A launch this refuses is the caller's mistake, not a device failure:
    /// it must be an [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// naming what was wrong, it claims nothing and fires no hook, exactly
    /// like the core's own checks (rule 38). A check made later, inside
    /// [`launch`](Self::launch), would claim the outputs of a launch that
    /// never could have run and report it as a device failure; the same
    /// mistake would then read differently on different servers.
    ///
    /// Called only for a launch whose bindings all have memory, and also for
    /// one whose host-side counts hold a zero (which the core then does not
    /// launch); an indirect dispatch's counts are not among `bindings`, as
    /// in `launch`.
    fn check_launch(&self, kernel: &Self::Kernel, launch: &Launch<'_, Self::Memory>) -> Result<()> {
        let _ = (kernel, launch);
        Ok(())
    }

    /// Launch, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// `stream`, `kernel` and every memory in `launch` are this backend's
    /// and alive. Every binding's `offset..offset + len` lies inside its
    /// memory and `offset` is a multiple of
    /// [`binding_alignment`](Self::binding_alignment); an indirect
    /// dispatch's 12 bytes lie inside theirs. Host-given counts are non-zero
    /// and within [`launch_limits`](Self::launch_limits)' `max_workgroups`,
    /// and [`check_launch`](Self::check_launch) accepted this launch for
    /// this kernel.
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

    /// Wait for all of the stream's work. A fault that surfaces here is
    /// returned, and the core attributes it to the work in flight (rule 23).
    ///
    /// The core calls this only where it must wait with the lock held (to
    /// order a recording stream, to bound an in-flight list); a caller's
    /// sync and read wait through [`begin_wait`](Self::begin_wait) instead.
    /// The default is exactly that sequence, under the lock.
    ///
    /// # Safety
    ///
    /// `stream` is this backend's and alive.
    unsafe fn sync(&mut self, stream: &mut Self::Stream) -> Result<()> {
        // SAFETY: the caller's promise for `sync` is `begin_wait`'s but for
        // recording, which a backend's `begin_wait` must then answer (the
        // default here is the wait the core asks for).
        let Some(waiter) = (unsafe { self.begin_wait(stream)? }) else {
            return Ok(());
        };
        // SAFETY: the waiter was just made by this backend and is ended
        // below, after the wait.
        let waited = unsafe { Self::wait(&waiter) };
        // SAFETY: as above: this stream's waiter, ended once.
        unsafe { self.end_wait(stream, waiter) }.and(waited)
    }

    /// Submit what the stream has batched and say how to wait for all of its
    /// work so far without the backend: `None` when nothing is pending.
    ///
    /// This is the first of three steps that let a wait run without the
    /// server's one lock (`begin_wait` and [`end_wait`](Self::end_wait) under
    /// it, [`wait`](Self::wait) outside): a thread waiting for a long kernel
    /// would otherwise stall every other thread's calls on every stream.
    /// Between the steps other threads may issue work on any stream, this
    /// one included; the waiter covers the work submitted before it was
    /// made, and nothing the backend recycles in the meantime may be
    /// something a waiter still names.
    ///
    /// # Safety
    ///
    /// `stream` is this backend's and alive, and not recording; the waiter
    /// returned is ended exactly once, by `end_wait` on the same stream.
    unsafe fn begin_wait(&mut self, stream: &mut Self::Stream) -> Result<Option<Self::Waiter>>;

    /// Wait for what `waiter` covers, bounded by the backend's wait timeout.
    /// Called with no lock held, perhaps while other threads call the
    /// backend's other methods: it may touch only what `waiter` holds and
    /// what the API lets threads share. A fault that surfaces here is
    /// attributed by the core to the work the waiter covers (rule 23).
    ///
    /// # Safety
    ///
    /// `waiter` came from this backend type's `begin_wait` or `begin_read`
    /// on a backend that is still alive, and has not been ended yet.
    unsafe fn wait(waiter: &Self::Waiter) -> Result<()>;

    /// Under the lock again, after [`wait`](Self::wait) returned: recycle
    /// what completed work held and report a fault the stream kept for its
    /// next wait (a lost batch, an error the API reports late). Runs whether
    /// or not the wait succeeded; its error is reported before the wait's.
    ///
    /// # Safety
    ///
    /// `waiter` came from `begin_wait` or `begin_read` on this `stream`,
    /// and is ended here once.
    unsafe fn end_wait(&mut self, stream: &mut Self::Stream, waiter: Self::Waiter) -> Result<()>;

    /// Make `then`'s later work wait for `first`'s earlier work. The core
    /// never asks while `first` is recording a capture (the work to wait for
    /// has not run), and while `then` is recording it finishes `first` on
    /// the host with [`sync`](Self::sync) instead.
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
    /// capture, a failed instantiation) is returned as the error.
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

    /// Open the device again after it was lost, in place: what
    /// [`Client::recover`](crate::Client::recover) asks once `fault` has
    /// poisoned the server. The backend tears down what is left of the lost
    /// device — never waiting on it past its wait timeout — opens the same
    /// device anew (Vulkan: a new `VkDevice` on the same physical device;
    /// wgpu: a new device from the same adapter; CUDA: a reset of the
    /// primary context), and gives each stream of `streams` new device
    /// state in place, not recording. The core then asks the limits again
    /// and re-creates every allocation.
    ///
    /// A backend whose driver says the process cannot go on after `fault`
    /// (CUDA's and HIP's process-fatal faults) answers
    /// [`Error::RestartRequired`](crate::Error::RestartRequired) and touches
    /// nothing; so does one that cannot reopen at all (the default), as
    /// rule 52 says: the device comes back only with a new process.
    ///
    /// # Safety
    ///
    /// Every memory, kernel and graph this backend made has been given
    /// back (`free`, `destroy_graph`, dropped), no capture is open, and no
    /// waiter is outstanding; `streams` are every stream this backend made,
    /// in id order, and nothing else names their old device state.
    unsafe fn reopen(
        &mut self,
        fault: &crate::Error,
        streams: &mut [&mut Self::Stream],
    ) -> Result<()> {
        let _ = streams;
        Err(crate::Error::RestartRequired {
            backend: Self::NAME,
            fault: std::sync::Arc::new(fault.clone()),
            reason: "this backend cannot open a lost device again".to_owned(),
        })
    }

    /// Destroy a graph, waiting for its replays in flight first (rule 35).
    /// The core [`flush`](Self::flush)es every stream that is not recording
    /// just before, so a backend may batch a replay like any other work:
    /// by now it has been submitted.
    ///
    /// # Safety
    ///
    /// `graph` is this backend's, and no later call names it.
    unsafe fn destroy_graph(&mut self, graph: Self::Graph) -> Result<()>;
}
