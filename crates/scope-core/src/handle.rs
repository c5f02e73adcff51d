//! What a runtime holds: ids and sizes, never memory. A handle may drop under
//! the lock, so a drop queues what it named ([`FreeQueue`]) for the next call.

use std::ops::{Bound as RangeBound, RangeBounds};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::backend::Access;
use crate::id::{BufferId, ByteRange, GraphId, ServerId, StreamId};

/// A handle dropped without its server being told.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Dropped {
    /// The last clone of a buffer.
    Buffer(BufferId),
    /// A capture neither ended nor aborted: its window is aborted.
    Capture { stream: StreamId, epoch: u64 },
    /// The last clone of a graph: it is destroyed (after its replays).
    Graph(GraphId),
}

/// Handles dropped since the server last looked.
#[derive(Default)]
pub(crate) struct FreeQueue {
    pending: AtomicBool,
    dropped: Mutex<Vec<Dropped>>,
}

impl FreeQueue {
    fn push(&self, dropped: Dropped) {
        self.dropped.lock().push(dropped);
        self.pending.store(true, Ordering::Release);
    }

    /// Whether anything may be queued: a plain load, cheaper than a swap.
    #[inline]
    pub(crate) fn pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// The queued handles, or none without touching the lock when none are.
    pub(crate) fn take(&self) -> Vec<Dropped> {
        if !self.pending() || !self.pending.swap(false, Ordering::Acquire) {
            return Vec::new();
        }
        std::mem::take(&mut *self.dropped.lock())
    }
}

struct BufferInner {
    id: BufferId,
    server: ServerId,
    size: u64,
    queue: Arc<FreeQueue>,
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        self.queue.push(Dropped::Buffer(self.id));
    }
}

/// A device buffer. Clones share it; the last one to drop frees it.
#[derive(Clone)]
pub struct Buffer {
    inner: Arc<BufferInner>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({} bytes)", self.inner.id, self.inner.size)
    }
}

impl Buffer {
    pub(crate) fn new(id: BufferId, server: ServerId, size: u64, queue: Arc<FreeQueue>) -> Self {
        Self {
            inner: Arc::new(BufferInner {
                id,
                server,
                size,
                queue,
            }),
        }
    }

    /// Its id, as reports name it.
    pub fn id(&self) -> BufferId {
        self.inner.id
    }

    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.inner.size
    }

    pub(crate) fn server(&self) -> ServerId {
        self.inner.server
    }

    /// All of it.
    pub fn all(&self) -> Slice<'_> {
        Slice {
            buffer: self,
            range: ByteRange::new(0, self.size()),
        }
    }

    /// Bytes `range` of it; checked when used, not here.
    pub fn slice(&self, range: impl RangeBounds<u64>) -> Slice<'_> {
        let start = match range.start_bound() {
            RangeBound::Included(&s) => s,
            RangeBound::Excluded(&s) => s.saturating_add(1),
            RangeBound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            RangeBound::Included(&e) => e.saturating_add(1),
            RangeBound::Excluded(&e) => e,
            RangeBound::Unbounded => self.size(),
        };
        Slice {
            buffer: self,
            // Kept as given (even reversed) so validation can name it.
            range: ByteRange { start, end },
        }
    }
}

/// Bytes of a buffer.
#[derive(Clone, Copy, Debug)]
pub struct Slice<'a> {
    /// The buffer.
    pub buffer: &'a Buffer,
    /// The bytes.
    pub range: ByteRange,
}

impl<'a> From<&'a Buffer> for Slice<'a> {
    fn from(buffer: &'a Buffer) -> Self {
        buffer.all()
    }
}

impl<'a> Slice<'a> {
    /// Bound for reading.
    pub fn read(self) -> Binding<'a> {
        Binding {
            slice: self,
            access: Access::Read,
        }
    }

    /// Bound for writing.
    pub fn write(self) -> Binding<'a> {
        Binding {
            slice: self,
            access: Access::Write,
        }
    }

    /// Bound for reading and writing.
    pub fn read_write(self) -> Binding<'a> {
        Binding {
            slice: self,
            access: Access::ReadWrite,
        }
    }
}

/// One binding of a launch: bytes of a buffer and how the kernel uses them.
#[derive(Clone, Copy, Debug)]
pub struct Binding<'a> {
    /// The bytes.
    pub slice: Slice<'a>,
    /// How they are used.
    pub access: Access,
}

impl<'a> Binding<'a> {
    /// All of `buffer`, read.
    pub fn read(buffer: &'a Buffer) -> Self {
        buffer.all().read()
    }

    /// All of `buffer`, written.
    pub fn write(buffer: &'a Buffer) -> Self {
        buffer.all().write()
    }

    /// All of `buffer`, read and written.
    pub fn read_write(buffer: &'a Buffer) -> Self {
        buffer.all().read_write()
    }
}

/// How many workgroups a launch runs.
#[derive(Clone, Copy, Debug)]
pub enum Dispatch<'a> {
    /// Known on the host. A zero in any dimension runs and heals nothing.
    Groups([u32; 3]),
    /// Three `u32` counts in device memory; a failed count skips the launch.
    Indirect(Slice<'a>),
}

impl Dispatch<'_> {
    /// `x` workgroups in one dimension.
    pub fn linear(x: u32) -> Self {
        Dispatch::Groups([x, 1, 1])
    }
}

/// An open capture window, to end or abort; dropped, it aborts.
#[must_use = "a capture must be ended or aborted; dropping it aborts it"]
pub struct Capture {
    pub(crate) stream: StreamId,
    pub(crate) server: ServerId,
    pub(crate) epoch: u64,
    /// Where to say it was dropped; `None` once ended or aborted.
    armed: Option<Arc<FreeQueue>>,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Capture({}, window {})", self.stream, self.epoch)
    }
}

impl Capture {
    pub(crate) fn open(
        stream: StreamId,
        server: ServerId,
        epoch: u64,
        queue: Arc<FreeQueue>,
    ) -> Self {
        Self {
            stream,
            server,
            epoch,
            armed: Some(queue),
        }
    }

    /// The stream that opened it.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    #[cfg(test)]
    pub(crate) fn stale(stream: StreamId, server: ServerId) -> Self {
        Self {
            stream,
            server,
            epoch: 0,
            armed: None,
        }
    }

    /// Ended or aborted by its server: nothing is left for `Drop` to do.
    pub(crate) fn disarm(&mut self) {
        self.armed = None;
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Some(queue) = self.armed.take() {
            queue.push(Dropped::Capture {
                stream: self.stream,
                epoch: self.epoch,
            });
        }
    }
}

struct GraphInner {
    id: GraphId,
    queue: Arc<FreeQueue>,
}

impl Drop for GraphInner {
    fn drop(&mut self) {
        self.queue.push(Dropped::Graph(self.id));
    }
}

/// A captured graph; the last clone's drop destroys it (rule 35).
#[derive(Clone)]
pub struct Graph {
    pub(crate) id: GraphId,
    pub(crate) server: ServerId,
    _inner: Arc<GraphInner>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph({})", self.id)
    }
}

impl PartialEq for Graph {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.server == other.server
    }
}

impl Eq for Graph {}

impl Graph {
    pub(crate) fn new(id: GraphId, server: ServerId, queue: Arc<FreeQueue>) -> Self {
        Self {
            id,
            server,
            _inner: Arc::new(GraphInner { id, queue }),
        }
    }

    /// Its id.
    pub fn id(&self) -> GraphId {
        self.id
    }
}
