//! A backend supplies the device calls and nothing else: `Server<B>` keeps
//! every rule, so no backend keeps one alone. It classifies each fault once
//! ([`FaultClass`](crate::FaultClass)) and never panics on a driver error.

use crate::error::Result;
use crate::id::StreamId;
use crate::kernel::{Kernel, Language};
use crate::limits::LaunchLimits;
use crate::probe::Kind;

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

// By hand: a derive would ask `M: Copy`.
impl<M> Clone for Bound<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M> Copy for Bound<'_, M> {}

/// How many workgroups a launch runs, resolved to backend memory.
#[derive(Debug)]
pub enum BoundDispatch<'a, M> {
    /// A count known on the host, never zero in any dimension.
    Groups([u32; 3]),
    /// Three `u32` counts read from device memory at `offset`.
    Indirect {
        /// The memory holding the counts.
        memory: &'a M,
        /// Where they start.
        offset: u64,
    },
}

/// Whether `groups` fits a grid of `max`; if not, an invalid argument.
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

/// The device calls of one GPU API. The core holds the server behind one
/// lock, so a backend needs no locking; only [`wait`](Self::wait) runs
/// without it. A graph keeps alive what its replays use.
///
/// # An `unsafe` contract, as wgpu-hal's
///
/// A backend trusts its arguments; `Server<B>`, the only caller, checks them once:
///
/// ```compile_fail
/// fn behind_the_cores_back<B: scope_core::Backend>(b: &mut B, s: &mut B::Stream) {
///     let _ = b.allocate(s, 4);
/// }
/// ```
///
/// Every `unsafe` method also asks:
///
/// 1. **Objects are this backend's and alive**: none was given back.
/// 2. **Ranges are inside** their memory.
/// 3. **One stream, one state**: a stream records exactly between a
///    successful `begin_capture` and its end or abort.
pub trait Backend: Send + 'static {
    /// A device allocation.
    type Memory: Send + 'static;
    /// A logical stream's device state.
    type Stream: Send + 'static;
    /// A compiled kernel.
    type Kernel: Send + 'static;
    /// A captured, replayable graph.
    type Graph: Send + 'static;
    /// What a wait outside the lock needs: a semaphore value, an event.
    type Waiter: Send + 'static;

    /// What it is, as wgpu-hal's `Api::VARIANT`.
    const KIND: Kind;

    /// Its name, from [`KIND`](Self::KIND); a backend does not set it.
    const NAME: &'static str = Self::KIND.name();

    /// Why its process-fatal faults need a new process.
    const RESTART: &'static str = "the driver says the process must restart after this fault";

    /// The device, for a person: name, kind, driver.
    fn describe(&self) -> String;

    /// Whether it compiles kernels written in `language`.
    fn accepts(&self, language: Language) -> bool;

    /// The largest allocation; past it is an invalid argument.
    fn max_allocation(&self) -> u64;

    /// The alignment a binding's offset must have.
    fn binding_alignment(&self) -> u64 {
        256
    }

    /// A launch's limits: within, never refused; past the grid, refused (rule 38).
    fn launch_limits(&self) -> LaunchLimits;

    /// A new logical stream, which the core calls `id`.
    ///
    /// # Safety
    ///
    /// `id` counts the streams this backend created so far.
    unsafe fn create_stream(&mut self, id: StreamId) -> Result<Self::Stream>;

    /// `size` bytes for work on `stream`, contents unspecified. Other streams
    /// are ordered after `stream`; a recording `stream` must not record it.
    ///
    /// # Safety
    ///
    /// `size` is non-zero and at most [`max_allocation`](Self::max_allocation).
    unsafe fn allocate(&mut self, stream: &mut Self::Stream, size: u64) -> Result<Self::Memory>;

    /// Give memory back, kept until work in flight is done.
    ///
    /// # Safety
    ///
    /// No later call or replayed graph names `memory`.
    unsafe fn free(&mut self, memory: Self::Memory);

    /// Release cached memory before an allocation is retried (rule 37).
    fn trim(&mut self) {}

    /// Bytes of device memory the backend holds, in use or cached.
    fn bytes_reserved(&self) -> u64;

    /// Write `data` at `offset` of `dst`, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// The range lies inside `dst`; offset and length are multiples of 4.
    unsafe fn write(
        &mut self,
        stream: &mut Self::Stream,
        dst: &Self::Memory,
        offset: u64,
        data: &[u8],
    ) -> Result<()>;

    /// Read into `out` from `offset` of `src`, after the stream's work.
    ///
    /// # Safety
    ///
    /// As for [`write`](Self::write); `stream` is not recording.
    unsafe fn read(
        &mut self,
        stream: &mut Self::Stream,
        src: &Self::Memory,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()>;

    /// Begin a read, finished by [`wait`](Self::wait) outside the lock and
    /// [`end_read`](Self::end_read), which copies by default.
    ///
    /// # Safety
    ///
    /// As for [`read`](Self::read); the waiter is ended exactly once.
    unsafe fn begin_read(
        &mut self,
        stream: &mut Self::Stream,
        src: &Self::Memory,
        offset: u64,
        len: u64,
    ) -> Result<Option<Self::Waiter>> {
        let _ = (src, offset, len);
        // SAFETY: `begin_read`'s promises include `begin_wait`'s.
        unsafe { self.begin_wait(stream) }
    }

    /// Finish a [`begin_read`](Self::begin_read): copy into `out`, recycle
    /// the waiter. A read given up on ends with [`end_wait`](Self::end_wait).
    ///
    /// # Safety
    ///
    /// `waiter`, from `begin_read` with these arguments, waited `Ok`; `src` lives.
    unsafe fn end_read(
        &mut self,
        stream: &mut Self::Stream,
        waiter: Option<Self::Waiter>,
        src: &Self::Memory,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        if let Some(waiter) = waiter {
            // SAFETY: the default `begin_read`'s waiter, ended once.
            unsafe { self.end_wait(stream, waiter)? };
        }
        // SAFETY: the caller promises `read`'s conditions.
        unsafe { self.read(stream, src, offset, out) }
    }

    /// Copy `len` bytes, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// Both ranges lie inside their memories, in multiples of 4, disjoint.
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

    /// Compile `kernel`; a rejection is [`Error::Compile`](crate::Error::Compile).
    fn compile(&mut self, kernel: &Kernel) -> Result<Self::Kernel>;

    /// Check `launch` against the limits before a scope opens: inside
    /// [`launch`](Self::launch), a refusal reads as a device failure (rule 38).
    fn check_launch(&self, kernel: &Self::Kernel, launch: &Launch<'_, Self::Memory>) -> Result<()> {
        let _ = (kernel, launch);
        Ok(())
    }

    /// Launch, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// Offsets are multiples of [`binding_alignment`](Self::binding_alignment),
    /// host counts are non-zero and within the grid, and
    /// [`check_launch`](Self::check_launch) accepted the launch.
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
    /// The contract's alone.
    unsafe fn flush(&mut self, stream: &mut Self::Stream) -> Result<()> {
        let _ = stream;
        Ok(())
    }

    /// Wait for the stream's work under the lock; a fault lands on it (rule 23).
    ///
    /// # Safety
    ///
    /// The contract's alone.
    unsafe fn sync(&mut self, stream: &mut Self::Stream) -> Result<()> {
        // SAFETY: `sync`'s promises are `begin_wait`'s.
        let Some(waiter) = (unsafe { self.begin_wait(stream)? }) else {
            return Ok(());
        };
        // SAFETY: this backend's waiter, not yet ended.
        let waited = unsafe { Self::wait(&waiter) };
        // SAFETY: as above: this stream's waiter, ended once.
        unsafe { self.end_wait(stream, waiter) }.and(waited)
    }

    /// Submit the stream's batch; the waiter lets [`wait`](Self::wait) run unlocked.
    ///
    /// # Safety
    ///
    /// `stream` is not recording; the waiter is ended exactly once.
    unsafe fn begin_wait(&mut self, stream: &mut Self::Stream) -> Result<Option<Self::Waiter>>;

    /// Wait, unlocked, for what `waiter` covers, within the wait timeout (rule 23).
    ///
    /// # Safety
    ///
    /// `waiter` came from a live backend and is not ended yet.
    unsafe fn wait(waiter: &Self::Waiter) -> Result<()>;

    /// After any [`wait`](Self::wait): recycle, and report a fault the stream kept.
    ///
    /// # Safety
    ///
    /// `waiter` came from this `stream` and is ended here once.
    unsafe fn end_wait(&mut self, stream: &mut Self::Stream, waiter: Self::Waiter) -> Result<()>;

    /// Order `then`'s later work after `first`'s; never asked while either records.
    ///
    /// # Safety
    ///
    /// The streams are distinct.
    unsafe fn order(&mut self, first: &mut Self::Stream, then: &mut Self::Stream) -> Result<()>;

    /// Start recording the stream's work into a graph.
    ///
    /// # Safety
    ///
    /// `stream` is not recording.
    unsafe fn begin_capture(&mut self, stream: &mut Self::Stream) -> Result<()>;

    /// Stop recording and seal the graph.
    ///
    /// # Safety
    ///
    /// `stream` is recording; what it names outlives the graph.
    unsafe fn end_capture(&mut self, stream: &mut Self::Stream) -> Result<Self::Graph>;

    /// Stop recording and throw the recording away.
    ///
    /// # Safety
    ///
    /// `stream` is recording or was just refused by `end_capture`.
    unsafe fn abort_capture(&mut self, stream: &mut Self::Stream);

    /// Replay a graph, ordered on `stream`.
    ///
    /// # Safety
    ///
    /// `stream` is not recording; what the graph names is alive.
    unsafe fn replay(&mut self, stream: &mut Self::Stream, graph: &Self::Graph) -> Result<()>;

    /// Open the device anew after `fault`, renewing `streams` in place; by
    /// default [`Error::RestartRequired`](crate::Error::RestartRequired) (rule 52).
    ///
    /// # Safety
    ///
    /// Everything this backend made was given back, nothing is open, and
    /// `streams` are all its streams, in id order.
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

    /// Destroy a graph after its replays in flight (rule 35).
    ///
    /// # Safety
    ///
    /// No later call names `graph`.
    unsafe fn destroy_graph(&mut self, graph: Self::Graph) -> Result<()>;
}
