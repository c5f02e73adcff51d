//! The runtime's contract, [`Client`]: clones share a locked server, each on a
//! stream; dropping a [`Buffer`] queues its id; `with_backend` never deadlocks.

mod capture;
mod lend;
mod observe;
mod raw;
mod recover;

pub use recover::RECOVER_PATIENCE;

use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::handle::{Binding, Buffer, Dispatch, FreeQueue, Slice};
use crate::hooks::Hooks;
use crate::id::{BufferId, ServerId, StreamId};
use crate::kernel::Kernel;
use crate::limits::DeviceLimits;
use crate::server::{Server, host_vec};

use lend::Lent;

/// The error of a call that would change a server lent on this thread.
fn reentrant() -> Error {
    Error::invalid(
        "call",
        "made from inside a `with_backend` or `with_memory` closure on the same server, \
         which holds the server's lock until it returns: make the call after it",
    )
}

pub(crate) struct Shared<B: Backend> {
    pub(crate) server: Mutex<Server<B>>,
    pub(crate) queue: Arc<FreeQueue>,
    pub(crate) hooks: Arc<Hooks>,
    pub(crate) id: ServerId,
    pub(crate) description: String,
    /// Behind their own lock, so reading never waits for the server.
    pub(crate) limits: parking_lot::RwLock<DeviceLimits>,
    /// The server while a `with_backend` or `with_memory` closure has it.
    lent: Lent<Server<B>>,
    /// A plan `inject` got inside a lending closure, installed after it.
    #[cfg(feature = "fault-injection")]
    deferred_plan: Mutex<Option<crate::FaultPlan>>,
}

/// A client on a stream lent by its server, given back on drop.
pub(crate) struct LentStream<B: Backend>(Client<B>);

impl<B: Backend> std::ops::Deref for LentStream<B> {
    type Target = Client<B>;

    fn deref(&self) -> &Client<B> {
        &self.0
    }
}

impl<B: Backend> Drop for LentStream<B> {
    fn drop(&mut self) {
        let stream = self.0.stream;
        // A server lent on this thread cannot take the stream back: it stays spent.
        let _ = self.0.call(|server| {
            server.take_back_stream(stream);
            Ok(())
        });
    }
}

/// A handle on one server, bound to one of its streams.
pub struct Client<B: Backend> {
    shared: Arc<Shared<B>>,
    stream: StreamId,
}

impl<B: Backend> Clone for Client<B> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            stream: self.stream,
        }
    }
}

impl<B: Backend> std::fmt::Debug for Client<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Client({}: {}, {})",
            B::NAME,
            self.shared.description,
            self.stream
        )
    }
}

impl<B: Backend> Client<B> {
    /// A server over `backend`, and a client on its stream 0.
    ///
    /// # Errors
    ///
    /// Whatever the backend's first stream fails with.
    pub fn new(backend: B) -> Result<Self> {
        let id = ServerId::next();
        let description = backend.describe();
        let limits = DeviceLimits {
            max_allocation: backend.max_allocation(),
            binding_alignment: backend.binding_alignment(),
            launch: backend.launch_limits(),
        };
        let queue = Arc::new(FreeQueue::default());
        let hooks = Arc::new(Hooks::default());
        let server = Server::new(backend, id, hooks.clone())?;
        tracing::info!(backend = B::NAME, device = %description, "scope server ready");
        Ok(Self {
            shared: Arc::new(Shared {
                server: Mutex::new(server),
                queue,
                hooks,
                id,
                description,
                limits: parking_lot::RwLock::new(limits),
                lent: Lent::default(),
                #[cfg(feature = "fault-injection")]
                deferred_plan: Mutex::new(None),
            }),
            stream: StreamId(0),
        })
    }

    /// Lock the server after releasing what was dropped; `None` if lent here.
    #[inline(always)]
    fn lock(&self) -> Option<MutexGuard<'_, Server<B>>> {
        let mut server = match self.shared.server.try_lock() {
            Some(server) => server,
            None if self.shared.lent.is_here() => return None,
            None => self.shared.server.lock(),
        };
        if self.shared.queue.pending() {
            self.release_dropped(&mut server);
        }
        Some(server)
    }

    #[inline(never)]
    fn release_dropped(&self, server: &mut Server<B>) {
        for dropped in self.shared.queue.take() {
            server.release(dropped);
        }
    }

    /// Run `f` on the locked server, then deliver its events unlocked.
    ///
    /// # Errors
    ///
    /// `f`'s, or [`reentrant`] inside a closure that holds the lock.
    #[inline]
    fn call<R>(&self, f: impl FnOnce(&mut Server<B>) -> Result<R>) -> Result<R> {
        self.call_boxed(|server| f(server).map_err(Box::new))
    }

    /// [`call`](Self::call) with a boxed error, so success stays small.
    #[inline]
    fn call_boxed<R>(
        &self,
        f: impl FnOnce(&mut Server<B>) -> std::result::Result<R, Box<Error>>,
    ) -> Result<R> {
        let Some(mut server) = self.lock() else {
            return Err(reentrant());
        };
        let result = f(&mut server);
        drop(server);
        self.shared.hooks.deliver();
        result.map_err(|error| *error)
    }

    /// Run `f`, which only looks, on the locked or lent server.
    fn look<R>(&self, lending: bool, f: impl FnOnce(&Server<B>) -> R) -> R {
        let f = match self.shared.server.try_lock() {
            Some(server) => return self.look_locked(server, lending, f),
            None => match self.shared.lent.here(f) {
                Ok(looked) => return looked,
                Err(f) => f,
            },
        };
        self.look_locked(self.shared.server.lock(), lending, f)
    }

    fn look_locked<R>(
        &self,
        mut server: MutexGuard<'_, Server<B>>,
        lending: bool,
        f: impl FnOnce(&Server<B>) -> R,
    ) -> R {
        for dropped in self.shared.queue.take() {
            server.release(dropped);
        }
        let result = if lending {
            let _lent = self.shared.lent.lend(&server);
            f(&server)
        } else {
            f(&server)
        };
        #[cfg(feature = "fault-injection")]
        if lending && let Some(plan) = self.shared.deferred_plan.lock().take() {
            server.inject(plan);
        }
        drop(server);
        self.shared.hooks.deliver();
        result
    }

    /// A handle that does not keep the server alive, for a failure hook.
    pub fn downgrade(&self) -> WeakClient<B> {
        WeakClient {
            shared: Arc::downgrade(&self.shared),
            stream: self.stream,
        }
    }

    /// The backend's name.
    pub fn backend(&self) -> &'static str {
        B::NAME
    }

    /// The device, for a person.
    pub fn describe(&self) -> &str {
        &self.shared.description
    }

    /// What the device can run, as this server opened it (rule 38).
    pub fn limits(&self) -> DeviceLimits {
        *self.shared.limits.read()
    }

    /// Whether `other` is a client of the same server, hence the same device.
    pub fn same_server(&self, other: &Self) -> bool {
        self.shared.id == other.shared.id
    }

    pub(crate) fn server_id(&self) -> ServerId {
        self.shared.id
    }

    /// Why `buffer` cannot be named here (foreign or freed), if so (rule 44).
    pub(crate) fn unusable(&self, buffer: &Buffer) -> Option<String> {
        if buffer.server() != self.shared.id {
            return Some("passed a buffer of another rank's device".to_owned());
        }
        let live = self.look(false, |server| server.holds(buffer.id()));
        (!live).then(|| format!("passed {}, which was freed", buffer.id()))
    }

    /// The stream this client issues work on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// A client on a new stream of the same server.
    ///
    /// # Errors
    ///
    /// Poison, or the backend's failure to make a stream.
    pub fn new_stream(&self) -> Result<Self> {
        let stream = self.call(|server| server.create_stream())?;
        Ok(Self {
            shared: self.shared.clone(),
            stream,
        })
    }

    pub(crate) fn lend_stream(&self) -> Result<LentStream<B>> {
        let stream = self.call(|server| server.lend_stream())?;
        Ok(LentStream(Self {
            shared: self.shared.clone(),
            stream,
        }))
    }

    /// `size` bytes of device memory, contents unspecified; a refusal
    /// returns a buffer carrying it (rules 28, 37).
    ///
    /// # Errors
    ///
    /// A size of zero or past the largest allocation; a poisoned device.
    pub fn allocate(&self, size: u64) -> Result<Buffer> {
        let id = self.call(|server| server.allocate(self.stream, size, true))?;
        Ok(self.handle(id, size))
    }

    /// Like [`allocate`](Self::allocate), but a refusal is an error.
    ///
    /// # Errors
    ///
    /// As `allocate`, and [`Error::OutOfMemory`].
    pub fn try_allocate(&self, size: u64) -> Result<Buffer> {
        let id = self.call(|server| server.allocate(self.stream, size, false))?;
        Ok(self.handle(id, size))
    }

    /// A buffer never allocated that carries `error` (rule 28).
    ///
    /// # Errors
    ///
    /// A size of zero; a poisoned device.
    pub fn failed_allocation(&self, size: u64, error: Error) -> Result<Buffer> {
        let id = self.call(|server| server.failed_allocation(self.stream, size, error))?;
        Ok(self.handle(id, size))
    }

    /// A buffer holding `data`.
    ///
    /// # Errors
    ///
    /// As [`allocate`](Self::allocate) and [`write`](Self::write).
    pub fn upload(&self, data: &[u8]) -> Result<Buffer> {
        let buffer = self.try_allocate(data.len() as u64)?;
        self.write(buffer.all(), data)?;
        Ok(buffer)
    }

    fn handle(&self, id: BufferId, size: u64) -> Buffer {
        Buffer::new(id, self.shared.id, size, self.shared.queue.clone())
    }

    /// Free `buffer` now; its other clones become stale.
    ///
    /// # Errors
    ///
    /// A buffer of another server, or one already freed.
    pub fn free(&self, buffer: &Buffer) -> Result<()> {
        self.call(|server| {
            server.resolve(buffer, buffer.all().range, "buffer to free")?;
            server.free(buffer.id());
            Ok(())
        })
    }

    /// Write `data` to `dst` (a scope: rule 15). The bytes written heal.
    ///
    /// # Errors
    ///
    /// Bad input; poison; the device's failure, which the bytes carry.
    pub fn write<'a>(&self, dst: impl Into<Slice<'a>>, data: &[u8]) -> Result<()> {
        self.call(|server| server.write(self.stream, dst.into(), data))
    }

    /// The bytes of `src`, after the stream's earlier work.
    ///
    /// # Errors
    ///
    /// [`Error::Unwritten`] or [`Error::SeveralUnwritten`] for a claimed
    /// byte (rules 24–27); a refusal while recording; bad input; poison; a fault.
    pub fn read<'a>(&self, src: impl Into<Slice<'a>>) -> Result<Vec<u8>> {
        let src = src.into();
        let (pending, len) = self.call(|server| server.begin_read(self.stream, src, None))?;
        let waited = pending.wait();
        let mut out = match host_vec(len) {
            Ok(out) => out,
            Err(no_room) => {
                // A fault the wait surfaced speaks first.
                self.call(|server| server.end_wait(pending, waited))?;
                return Err(no_room);
            }
        };
        self.call(|server| server.end_read(pending, waited, src, &mut out))?;
        Ok(out)
    }

    /// Like [`read`](Self::read), into `out` of the slice's length.
    ///
    /// # Errors
    ///
    /// As `read`.
    pub fn read_into<'a>(&self, src: impl Into<Slice<'a>>, out: &mut [u8]) -> Result<()> {
        let src = src.into();
        let (pending, _) =
            self.call(|server| server.begin_read(self.stream, src, Some(out.len())))?;
        let waited = pending.wait();
        self.call(|server| server.end_read(pending, waited, src, out))
    }

    /// Copy `src` into `dst` of the same length; a failed source skips it.
    ///
    /// # Errors
    ///
    /// Bad input, poison, [`Error::Skipped`], or the device's failure.
    pub fn copy<'a, 'b>(&self, src: impl Into<Slice<'a>>, dst: impl Into<Slice<'b>>) -> Result<()> {
        self.call(|server| server.copy(self.stream, src.into(), dst.into()))
    }

    pub(crate) fn issue_collective(
        &self,
        name: (&str, Option<crate::capture::RecordedRound>),
        input: (Slice<'_>, bool),
        output: Slice<'_>,
        call: impl FnOnce(
            &mut B,
            &mut B::Stream,
            crate::server::Resolved<'_, B>,
            crate::server::Resolved<'_, B>,
        ) -> Result<()>,
    ) -> Result<()> {
        self.call(|server| server.issue_collective(self.stream, name, input, output, call))
    }

    /// Issue one rank's half of a transfer of `data` (written by a receive).
    pub(crate) fn issue_transfer(
        &self,
        name: &str,
        data: (Slice<'_>, bool),
        call: impl FnOnce(&mut B, &mut B::Stream, crate::server::Resolved<'_, B>) -> Result<()>,
    ) -> Result<()> {
        self.call(|server| server.issue_transfer(self.stream, name, data, call))
    }

    /// Compile `kernel` now rather than at its first launch.
    ///
    /// # Errors
    ///
    /// [`Error::Compile`] with the compiler's log, claiming nothing.
    pub fn compile(&self, kernel: &Kernel) -> Result<()> {
        self.call(|server| server.compile(self.stream, kernel))
    }

    /// Launch `kernel` (see the [binding convention](crate::kernel)).
    ///
    /// # Errors
    ///
    /// Bad input (unclaimed); [`Error::Skipped`]; poison; a failure outputs carry.
    pub fn launch(
        &self,
        kernel: &Kernel,
        bindings: &[Binding<'_>],
        scalars: &[u8],
        dispatch: Dispatch<'_>,
    ) -> Result<()> {
        self.call_boxed(|server| server.launch(self.stream, kernel, bindings, scalars, dispatch))
    }

    /// Wait for the stream's work.
    ///
    /// # Errors
    ///
    /// A refusal while recording; poison; a fault, on the work (rule 23).
    pub fn sync(&self) -> Result<()> {
        self.sync_buffers(&[])
    }

    /// Check `buffers`, then wait for the stream's work (rule 24).
    ///
    /// # Errors
    ///
    /// As [`check`](Self::check), then as [`sync`](Self::sync).
    pub fn sync_buffers(&self, buffers: &[Slice<'_>]) -> Result<()> {
        let pending = self.call(|server| server.begin_sync(self.stream, buffers))?;
        let waited = pending.wait();
        self.call(|server| server.end_wait(pending, waited))
    }

    /// Wait for the stream's work, polling `finished` unlocked; past `until`,
    /// `stall` must make it finish. The wait's outcome lands on it (rule 23).
    pub(crate) fn sync_within(
        &self,
        until: std::time::Instant,
        finished: impl Fn(&B::Waiter) -> Result<bool>,
        stall: impl FnOnce(),
    ) -> Result<bool> {
        let pending = self.call(|server| server.begin_sync(self.stream, &[]))?;
        let (answer, waited) = match pending.finished_by(until, finished) {
            Ok(true) => (Ok(true), Ok(())),
            answer => {
                stall();
                (answer, pending.wait())
            }
        };
        self.call(|server| server.end_wait(pending, waited))?;
        answer
    }

    /// A wait for the watchdog to poll, ended by [`end_watch`](Self::end_watch).
    pub(crate) fn watch(&self) -> Result<crate::server::PendingWait<B>> {
        self.call(|server| server.begin_watch(self.stream))
    }

    /// End a [`watch`](Self::watch): `waited` lands on what it covered.
    pub(crate) fn end_watch(
        &self,
        pending: crate::server::PendingWait<B>,
        waited: Result<()>,
    ) -> Result<()> {
        self.call(|server| server.end_wait(pending, waited))
    }

    pub(crate) fn in_flight_mark(&self) -> u64 {
        self.look(false, |server| server.in_flight_mark(self.stream))
    }

    /// Claim with `error` the work submitted from `mark` on, not yet waited for.
    pub(crate) fn fail_in_flight_since(&self, mark: u64, error: Error) -> Result<()> {
        self.call(|server| {
            server.fail_in_flight_since(self.stream, mark, error);
            Ok(())
        })
    }

    /// Submit the stream's batched work now, without waiting for it.
    ///
    /// # Errors
    ///
    /// Poison; a fault, which the work in flight carries (rule 23).
    pub fn flush(&self) -> Result<()> {
        self.call(|server| server.flush(self.stream))
    }

    /// Claim `written` with a failure found outside scope (rule 21).
    ///
    /// # Errors
    ///
    /// Bad input, claiming nothing; poison.
    pub fn fail_writing(&self, written: &[Slice<'_>], error: Error) -> Result<()> {
        self.call(|server| server.fail_writing(self.stream, written, error))
    }

    /// Whether every byte of `slices` is readable, without copying any.
    ///
    /// # Errors
    ///
    /// As a [`read`](Self::read) of them would fail on a claim.
    pub fn check(&self, slices: &[Slice<'_>]) -> Result<()> {
        self.call(|server| server.check(slices))
    }
}

/// A [`Client`] that does not keep its server alive.
pub struct WeakClient<B: Backend> {
    shared: std::sync::Weak<Shared<B>>,
    stream: StreamId,
}

impl<B: Backend> Clone for WeakClient<B> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            stream: self.stream,
        }
    }
}

impl<B: Backend> std::fmt::Debug for WeakClient<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WeakClient({}, {})", B::NAME, self.stream)
    }
}

impl<B: Backend> WeakClient<B> {
    /// The client, while any other client keeps its server alive.
    pub fn upgrade(&self) -> Option<Client<B>> {
        Some(Client {
            shared: self.shared.upgrade()?,
            stream: self.stream,
        })
    }
}
