//! What a backend supplies: the device calls, and nothing else.
//!
//! Every server is [`Server<B>`](crate::Server) for some `B: Backend`. The
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

impl<M> Launch<'_, M> {
    /// Whether host-given workgroup counts fit a device whose grid is `max`
    /// in each dimension, as every backend's [`Backend::check_launch`]
    /// asks: an [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// naming the axis if not. Indirect counts are not known here.
    ///
    /// # Errors
    ///
    /// A count past `max`.
    pub fn groups_within(&self, max: [u32; 3]) -> crate::Result<()> {
        match &self.dispatch {
            BoundDispatch::Groups(groups) => grid_within(self.name, *groups, max),
            BoundDispatch::Indirect { .. } => Ok(()),
        }
    }
}

/// Whether host-given workgroup counts `groups` fit a grid of `max`: an
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming the axis
/// if not. The core asks it of every launch, against the backend's
/// [`LaunchLimits::max_workgroups`], before the backend's own checks.
pub(crate) fn grid_within(name: &str, groups: [u32; 3], max: [u32; 3]) -> crate::Result<()> {
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
/// host write records its bytes as given at that moment.
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
    fn create_stream(&mut self, id: StreamId) -> Result<Self::Stream>;

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
    fn allocate(&mut self, stream: &mut Self::Stream, size: u64) -> Result<Self::Memory>;

    /// Give memory back. Work still in flight may use it: the backend keeps
    /// it until that work is done.
    fn free(&mut self, memory: Self::Memory);

    /// Release memory the backend caches for reuse, before the core retries
    /// an allocation that ran out (rule 37).
    fn trim(&mut self) {}

    /// Bytes of device memory the backend holds, in use or cached.
    fn bytes_reserved(&self) -> u64;

    /// Write `data` at `offset` of `dst`, ordered on `stream`. `data` is only
    /// borrowed for the call.
    fn write(
        &mut self,
        stream: &mut Self::Stream,
        dst: &Self::Memory,
        offset: u64,
        data: &[u8],
    ) -> Result<()>;

    /// Read `out.len()` bytes at `offset` of `src` after the stream's earlier
    /// work, waiting for them.
    fn read(
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
    fn begin_read(
        &mut self,
        stream: &mut Self::Stream,
        src: &Self::Memory,
        offset: u64,
        len: u64,
    ) -> Result<Option<Self::Waiter>> {
        let _ = (src, offset, len);
        self.begin_wait(stream)
    }

    /// Finish a read [`begin_read`](Self::begin_read) began, once
    /// [`wait`](Self::wait) returned success and the core checked the read
    /// again: copy the bytes into `out` and recycle what the waiter held.
    /// (A read the core gives up on instead — the wait failed, or the
    /// buffer was freed or failed meanwhile — ends with
    /// [`end_wait`](Self::end_wait), which must recycle a read's waiter
    /// too.)
    fn end_read(
        &mut self,
        stream: &mut Self::Stream,
        waiter: Option<Self::Waiter>,
        src: &Self::Memory,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        if let Some(waiter) = waiter {
            self.end_wait(stream, waiter)?;
        }
        self.read(stream, src, offset, out)
    }

    /// Copy `len` bytes, ordered on `stream`.
    #[allow(clippy::too_many_arguments)]
    fn copy(
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
    fn launch(
        &mut self,
        stream: &mut Self::Stream,
        kernel: &Self::Kernel,
        launch: &Launch<'_, Self::Memory>,
    ) -> Result<()>;

    /// Submit what the stream has batched, without waiting.
    fn flush(&mut self, stream: &mut Self::Stream) -> Result<()> {
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
    fn sync(&mut self, stream: &mut Self::Stream) -> Result<()> {
        let Some(waiter) = self.begin_wait(stream)? else {
            return Ok(());
        };
        let waited = Self::wait(&waiter);
        self.end_wait(stream, waiter).and(waited)
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
    fn begin_wait(&mut self, stream: &mut Self::Stream) -> Result<Option<Self::Waiter>>;

    /// Wait for what `waiter` covers, bounded by the backend's wait timeout.
    /// Called with no lock held, perhaps while other threads call the
    /// backend's other methods: it may touch only what `waiter` holds and
    /// what the API lets threads share. A fault that surfaces here is
    /// attributed by the core to the work the waiter covers (rule 23).
    fn wait(waiter: &Self::Waiter) -> Result<()>;

    /// Under the lock again, after [`wait`](Self::wait) returned: recycle
    /// what completed work held and report a fault the stream kept for its
    /// next wait (a lost batch, an error the API reports late). Runs whether
    /// or not the wait succeeded; its error is reported before the wait's.
    fn end_wait(&mut self, stream: &mut Self::Stream, waiter: Self::Waiter) -> Result<()>;

    /// Make `then`'s later work wait for `first`'s earlier work. The core
    /// never asks while `first` is recording a capture (the work to wait for
    /// has not run), and while `then` is recording it finishes `first` on
    /// the host with [`sync`](Self::sync) instead.
    fn order(&mut self, first: &mut Self::Stream, then: &mut Self::Stream) -> Result<()>;

    /// Start recording the stream's work into a graph.
    fn begin_capture(&mut self, stream: &mut Self::Stream) -> Result<()>;

    /// Stop recording and seal what was recorded. A refusal (an invalidated
    /// capture, a failed instantiation) is returned as the error.
    fn end_capture(&mut self, stream: &mut Self::Stream) -> Result<Self::Graph>;

    /// Stop recording and throw the recording away.
    fn abort_capture(&mut self, stream: &mut Self::Stream);

    /// Replay a graph, ordered on `stream`.
    fn replay(&mut self, stream: &mut Self::Stream, graph: &Self::Graph) -> Result<()>;

    /// Destroy a graph, waiting for its replays in flight first (rule 35).
    /// The core [`flush`](Self::flush)es every stream that is not recording
    /// just before, so a backend may batch a replay like any other work:
    /// by now it has been submitted.
    fn destroy_graph(&mut self, graph: Self::Graph) -> Result<()>;
}
