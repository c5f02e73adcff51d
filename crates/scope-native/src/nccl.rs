//! The NCCL API, which NVIDIA's NCCL and AMD's RCCL both implement with the same names,
//! types and values: one communicator wrapper and one device transport ([`NcclDevice`]).
//! What keeps the library from hanging or faulting is here, once:
//!
//! 1. **Non-blocking communicators.** A blocking call can wait without bound for a peer, so
//!    calls return `ncclInProgress` at once and are polled, the lock released between polls.
//!    No thread stays inside the library, so an abort never waits behind one.
//! 2. **No call after an abort.** `ncclCommAbort` frees the communicator, so a call holds
//!    the handle's lock shared and refuses once its `aborted` flag is set.
//! 3. **The oldest config that says what is needed.** The NCCL 2.17 head with its own
//!    `size`: the library reads a config by its size, so every later version takes it.

mod library;
pub mod transport;

pub use library::NcclLibrary;
pub use transport::NcclDevice;

use std::ffi::{CStr, c_char, c_int, c_void};
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use scope_core::collective::device::Direction;
use scope_core::collective::{Call, CollectiveError, Element, Reduce};
use scope_core::{Error, Result};

/// `ncclComm_t`.
pub type RawComm = *mut c_void;

/// `ncclResult_t`.
pub type NcclResult = c_int;

const SUCCESS: NcclResult = 0;
const IN_PROGRESS: NcclResult = 7;
/// `ncclRemoteError`: a peer aborted, or its link failed.
const REMOTE: NcclResult = 6;

/// `ncclUniqueId`: what every rank of one communicator joins with.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct UniqueId(pub [c_char; 128]);

impl UniqueId {
    /// Its 128 bytes, for a launcher to hand to the ranks in other processes.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0.map(|c| c as u8)
    }

    /// The id of `bytes` ([`to_bytes`](Self::to_bytes)); only their length is checked here.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bytes: &[u8; 128] = bytes.try_into().map_err(|_| {
            Error::invalid(
                "nccl unique id",
                format!("{} bytes where an id has 128", bytes.len()),
            )
        })?;
        Ok(Self(bytes.map(|b| b as c_char)))
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

/// `ncclConfig_t` as NCCL 2.17 declared it: the head every later version begins with.
#[repr(C)]
struct Config {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
}

impl Config {
    fn non_blocking() -> Self {
        Self {
            size: size_of::<Config>(),
            magic: API_MAGIC,
            version: CONFIG_VERSION,
            blocking: 0,
            cga_cluster_size: UNDEF,
            min_ctas: UNDEF,
            max_ctas: UNDEF,
            net_name: std::ptr::null(),
            split_share: UNDEF,
        }
    }
}

const API_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT`: "the library's default".
const UNDEF: c_int = c_int::MIN;
/// `NCCL_VERSION(2, 17, 0)`, the version of the config's layout.
const CONFIG_VERSION: u32 = 21_700;

/// `ncclGetUniqueId`.
pub type GetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> NcclResult;
/// `ncclCommInitRankConfig`.
pub type CommInitRankConfig =
    unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int, *mut c_void) -> NcclResult;
/// `ncclCommGetAsyncError`.
pub type CommGetAsyncError = unsafe extern "C" fn(RawComm, *mut NcclResult) -> NcclResult;
/// `ncclCommAbort` and `ncclCommDestroy`.
pub type CommEnd = unsafe extern "C" fn(RawComm) -> NcclResult;
/// `ncclCommShrink` (NCCL 2.27): parent, excluded ranks, their count, new, config, flags.
pub type CommShrink = unsafe extern "C" fn(
    RawComm,
    *mut c_int,
    c_int,
    *mut RawComm,
    *mut c_void,
    c_int,
) -> NcclResult;
/// `ncclCommSplit` (NCCL 2.18): parent, color, key, the new communicator, its config.
pub type CommSplit =
    unsafe extern "C" fn(RawComm, c_int, c_int, *mut RawComm, *mut c_void) -> NcclResult;
/// `ncclAllReduce` and `ncclReduceScatter`: send, receive, count, type, op, comm, stream.
pub type Reducing = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    *mut c_void,
) -> NcclResult;
/// `ncclAllGather` and `ncclAlltoAll`: send, receive, count, type, comm, stream.
pub type Moving = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    RawComm,
    *mut c_void,
) -> NcclResult;
/// `ncclBroadcast`: send, receive, count, type, root, communicator, stream.
pub type Rooted = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    *mut c_void,
) -> NcclResult;
/// `ncclSend` and `ncclRecv`: buffer, count, type, peer, communicator, stream.
pub type PointToPoint =
    unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, *mut c_void) -> NcclResult;
/// `ncclGetErrorString`.
pub type ErrorString = unsafe extern "C" fn(NcclResult) -> *const c_char;

/// The NCCL API's entry points a device transport calls, as `nccl.h` declares them.
#[allow(missing_docs)]
#[derive(Clone, Copy)]
pub struct NcclTable {
    /// Which library this is ("nccl", "rccl"), as its errors name it.
    pub library: &'static str,
    pub get_unique_id: GetUniqueId,
    pub comm_init_rank_config: CommInitRankConfig,
    pub comm_get_async_error: CommGetAsyncError,
    pub comm_abort: CommEnd,
    pub comm_destroy: CommEnd,
    pub all_reduce: Reducing,
    pub all_gather: Moving,
    pub reduce_scatter: Reducing,
    pub broadcast: Rooted,
    pub all_to_all: Moving,
    pub send: PointToPoint,
    pub recv: PointToPoint,
    pub get_error_string: ErrorString,
    /// `ncclCommShrink`, where the library has it (NCCL 2.27 and later).
    pub comm_shrink: Option<CommShrink>,
    /// `ncclCommSplit`, where the library has it (NCCL 2.18 and later).
    pub comm_split: Option<CommSplit>,
}

impl NcclTable {
    /// The symbols the table holds, in field order.
    pub const SYMBOLS: [&'static str; 13] = [
        "ncclGetUniqueId",
        "ncclCommInitRankConfig",
        "ncclCommGetAsyncError",
        "ncclCommAbort",
        "ncclCommDestroy",
        "ncclAllReduce",
        "ncclAllGather",
        "ncclReduceScatter",
        "ncclBroadcast",
        "ncclAlltoAll",
        "ncclSend",
        "ncclRecv",
        "ncclGetErrorString",
    ];

    /// The table, each address from `address`; `Err` names the first symbol it lacks.
    ///
    /// # Safety
    /// Every address is the named function of an NCCL API library (NCCL 2.17 or later, or
    /// RCCL), loaded for as long as the table is used.
    pub unsafe fn resolve(
        library: &'static str,
        mut address: impl FnMut(&'static str) -> Option<*const c_void>,
    ) -> std::result::Result<Self, &'static str> {
        let mut next = |name: &'static str| address(name).filter(|p| !p.is_null()).ok_or(name);
        macro_rules! entry {
            ($name:literal, $ty:ty) => {{
                let raw = next($name)?;
                // SAFETY: the caller vouches `raw` is `$name`, whose C declaration is `$ty`.
                unsafe { std::mem::transmute::<*const c_void, $ty>(raw) }
            }};
        }
        Ok(Self {
            library,
            get_unique_id: entry!("ncclGetUniqueId", GetUniqueId),
            comm_init_rank_config: entry!("ncclCommInitRankConfig", CommInitRankConfig),
            comm_get_async_error: entry!("ncclCommGetAsyncError", CommGetAsyncError),
            comm_abort: entry!("ncclCommAbort", CommEnd),
            comm_destroy: entry!("ncclCommDestroy", CommEnd),
            all_reduce: entry!("ncclAllReduce", Reducing),
            all_gather: entry!("ncclAllGather", Moving),
            reduce_scatter: entry!("ncclReduceScatter", Reducing),
            broadcast: entry!("ncclBroadcast", Rooted),
            all_to_all: entry!("ncclAlltoAll", Moving),
            send: entry!("ncclSend", PointToPoint),
            recv: entry!("ncclRecv", PointToPoint),
            get_error_string: entry!("ncclGetErrorString", ErrorString),
            comm_shrink: address("ncclCommShrink")
                .filter(|p| !p.is_null())
                .map(|raw| {
                    // SAFETY: the caller vouches `raw` is `ncclCommShrink`: a `CommShrink`.
                    unsafe { std::mem::transmute::<*const c_void, CommShrink>(raw) }
                }),
            comm_split: address("ncclCommSplit")
                .filter(|p| !p.is_null())
                .map(|raw| {
                    // SAFETY: the caller vouches `raw` is `ncclCommSplit`: a `CommSplit`.
                    unsafe { std::mem::transmute::<*const c_void, CommSplit>(raw) }
                }),
        })
    }

    fn error(&self, call: &'static str, result: NcclResult) -> Error {
        // SAFETY: `ncclGetErrorString` returns a static C string for any code.
        let text = unsafe { CStr::from_ptr((self.get_error_string)(result)) };
        CollectiveError::Library {
            library: self.library,
            call,
            detail: format!("result {result}: {}", text.to_string_lossy()),
        }
        .into()
    }

    /// A new unique id (`ncclGetUniqueId`), or what the library answered.
    pub fn unique_id(&self) -> Result<UniqueId> {
        let mut id = UniqueId([0; 128]);
        // SAFETY: the library writes the 128 bytes of `id`.
        let made = unsafe { (self.get_unique_id)(&mut id) };
        if made != SUCCESS {
            return Err(self.error("ncclGetUniqueId", made));
        }
        Ok(id)
    }
}

/// One rank's communicator, non-blocking, abortable from any thread.
pub struct Communicator {
    table: NcclTable,
    handle: RwLock<Handle>,
    /// How long a call (or the join) is polled before it is reported.
    patience: Duration,
}

struct Handle {
    comm: RawComm,
    aborted: bool,
}

// SAFETY: an NCCL communicator serves any thread; all use is under the lock, checking `aborted`.
unsafe impl Send for Communicator {}
// SAFETY: as above.
unsafe impl Sync for Communicator {}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Communicator(..)")
    }
}

fn aborted(library: &'static str, call: &'static str) -> Error {
    CollectiveError::Library {
        library,
        call,
        detail: "the communicator was aborted (a rank of its group failed)".to_owned(),
    }
    .into()
}

/// `ncclDataType_t`, the same numbers in RCCL.
fn data_type(element: Element) -> c_int {
    match element {
        Element::I8 => 0,
        Element::U8 => 1,
        Element::I32 => 2,
        Element::U32 => 3,
        Element::I64 => 4,
        Element::U64 => 5,
        Element::F16 => 6,
        Element::F32 => 7,
        Element::F64 => 8,
        Element::BF16 => 9,
    }
}

fn operation(op: Reduce) -> c_int {
    match op {
        Reduce::Sum => 0,
        Reduce::Prod => 1,
        Reduce::Max => 2,
        Reduce::Min => 3,
        Reduce::Mean => 4,
    }
}

/// `ncclInt8`, for the calls and transfers that only move bytes.
const BYTES: c_int = 0;

impl Communicator {
    /// Join the communicator `id` names as rank `rank` of `ranks`, on this thread's current
    /// device. The join and later calls are polled for up to `patience`.
    ///
    /// # Safety
    /// `table` is a live NCCL API library's; this rank's device is current on the calling
    /// thread; every rank joins with the same `id` and `ranks`, once.
    pub unsafe fn join(
        table: NcclTable,
        id: UniqueId,
        rank: usize,
        ranks: usize,
        patience: Duration,
    ) -> Result<Self> {
        let (Ok(rank), Ok(ranks)) = (c_int::try_from(rank), c_int::try_from(ranks)) else {
            return Err(Error::invalid("nccl communicator", "too many ranks"));
        };
        let mut config = Config::non_blocking();
        let mut comm: RawComm = std::ptr::null_mut();
        // SAFETY: `comm` and `config` outlive the call; the config is non-blocking; the caller
        // made the device current and gives every rank this id and count.
        let made = unsafe {
            (table.comm_init_rank_config)(
                &mut comm,
                ranks,
                id,
                rank,
                (&raw mut config).cast::<c_void>(),
            )
        };
        if made != SUCCESS && made != IN_PROGRESS {
            return Err(table.error("ncclCommInitRankConfig", made));
        }
        let joined = Self {
            table,
            handle: RwLock::new(Handle {
                comm,
                aborted: false,
            }),
            patience,
        };
        // Aborted, never destroyed: NCCL's destroy waits for the init, and so for lost peers.
        if let Err(e) = joined.settle("ncclCommInitRankConfig") {
            joined.abort();
            return Err(e);
        }
        Ok(joined)
    }

    /// The survivors' communicator once the ranks `exclude` (ascending) left: `ncclCommShrink`
    /// with the default flag, or `Ok(None)` without one. Polled for up to `patience`.
    ///
    /// # Safety
    /// This rank's device is current; no call through this communicator is in flight;
    /// exactly the ranks not in `exclude` shrink it, once each, with the same `exclude`.
    pub unsafe fn shrink(&self, exclude: &[usize], patience: Duration) -> Result<Option<Self>> {
        let Some(comm_shrink) = self.table.comm_shrink else {
            return Ok(None);
        };
        let mut exclude: Vec<c_int> = exclude
            .iter()
            .map(|&r| c_int::try_from(r))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| Error::invalid("nccl communicator", "too many ranks"))?;
        let count = c_int::try_from(exclude.len())
            .map_err(|_| Error::invalid("nccl communicator", "too many ranks"))?;
        let mut config = Config::non_blocking();
        let mut comm: RawComm = std::ptr::null_mut();
        let made = {
            let handle = self.handle.read();
            if handle.aborted {
                return Err(aborted(self.table.library, "ncclCommShrink"));
            }
            // SAFETY: the parent is live (not aborted, under the lock); `exclude`, `comm`, `config`
            // outlive the call; flag 0 is NCCL_SHRINK_DEFAULT; the caller vouches the rest.
            unsafe {
                comm_shrink(
                    handle.comm,
                    exclude.as_mut_ptr(),
                    count,
                    &mut comm,
                    (&raw mut config).cast::<c_void>(),
                    0,
                )
            }
        };
        self.derived("ncclCommShrink", made, comm, patience)
            .map(Some)
    }

    /// This rank's copy of the communicator with resources of its own (`ncclCommSplit`,
    /// `splitShare = 0`), or `Ok(None)` without a split. NCCL runs a communicator's kernels
    /// in order whatever their streams, so work on the copy never waits behind this one's.
    ///
    /// # Safety
    /// As [`shrink`](Self::shrink), with nothing excluded; every rank passes its own `rank`.
    pub unsafe fn duplicate(&self, rank: usize, patience: Duration) -> Result<Option<Self>> {
        let Some(comm_split) = self.table.comm_split else {
            return Ok(None);
        };
        let key = c_int::try_from(rank)
            .map_err(|_| Error::invalid("nccl communicator", "too many ranks"))?;
        let mut config = Config::non_blocking();
        config.split_share = 0;
        let mut comm: RawComm = std::ptr::null_mut();
        let made = {
            let handle = self.handle.read();
            if handle.aborted {
                return Err(aborted(self.table.library, "ncclCommSplit"));
            }
            // SAFETY: the parent is live (not aborted, under the lock); `comm` and `config` outlive
            // the call; color 0 keeps every rank, keyed by its number; the caller vouches the rest.
            unsafe {
                comm_split(
                    handle.comm,
                    0,
                    key,
                    &mut comm,
                    (&raw mut config).cast::<c_void>(),
                )
            }
        };
        self.derived("ncclCommSplit", made, comm, patience)
            .map(Some)
    }

    fn derived(
        &self,
        call: &'static str,
        made: NcclResult,
        comm: RawComm,
        patience: Duration,
    ) -> Result<Self> {
        if made != SUCCESS && made != IN_PROGRESS {
            return Err(self.table.error(call, made));
        }
        let derived = Self {
            table: self.table,
            handle: RwLock::new(Handle {
                comm,
                aborted: false,
            }),
            patience,
        };
        if let Err(e) = derived.settle(call) {
            derived.abort();
            return Err(e);
        }
        Ok(derived)
    }

    /// Poll until pending work settles: `Ok` once done, else its error or patience run out.
    fn settle(&self, call: &'static str) -> Result<()> {
        let until = Instant::now() + self.patience;
        loop {
            {
                let handle = self.handle.read();
                if handle.aborted {
                    return Err(aborted(self.table.library, call));
                }
                let mut state = IN_PROGRESS;
                // SAFETY: the handle is live (not aborted, under the lock).
                let asked = unsafe { (self.table.comm_get_async_error)(handle.comm, &mut state) };
                if asked != SUCCESS {
                    return Err(self.table.error("ncclCommGetAsyncError", asked));
                }
                match state {
                    SUCCESS => return Ok(()),
                    IN_PROGRESS => {}
                    REMOTE => return Err(self.stalled(call)),
                    failed => return Err(self.table.error(call, failed)),
                }
            }
            if Instant::now() >= until {
                return Err(self.stalled(call));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// A peer never came or aborted (`ncclRemoteError`), as `join` asks a transport to say.
    fn stalled(&self, call: &'static str) -> Error {
        CollectiveError::Stalled {
            collective: call,
            round: 0,
            deadline: self.patience,
        }
        .into()
    }

    /// Whether the communicator still works, without waiting (`ncclCommGetAsyncError`). A
    /// peer's abort or a failed link is [`CollectiveError::Stalled`].
    pub fn health(&self) -> Result<()> {
        let handle = self.handle.read();
        if handle.aborted {
            return Err(aborted(self.table.library, "ncclCommGetAsyncError"));
        }
        let mut state = SUCCESS;
        // SAFETY: the handle is live (not aborted, under the lock).
        let asked = unsafe { (self.table.comm_get_async_error)(handle.comm, &mut state) };
        if asked != SUCCESS {
            return Err(self.table.error("ncclCommGetAsyncError", asked));
        }
        match state {
            SUCCESS | IN_PROGRESS => Ok(()),
            REMOTE => Err(self.stalled("communicator")),
            failed => Err(self.table.error("ncclCommGetAsyncError", failed)),
        }
    }

    /// Issue `call` from `send` into `recv` (each a device address and a byte length) on
    /// `stream`, as a rank of `ranks`, and wait until the library took it.
    ///
    /// # Safety
    /// `send` and `recv` are on this device, as long as `call` needs over `ranks`, and alive
    /// until the work completes; `stream` is this device's; every rank issues the same call.
    pub unsafe fn issue(
        &self,
        call: Call,
        (send, send_bytes): (u64, u64),
        (recv, recv_bytes): (u64, u64),
        ranks: usize,
        stream: *mut c_void,
    ) -> Result<()> {
        // A reduction counts its elements; a call that only moves bytes, bytes.
        let count = |bytes: u64| match call {
            Call::AllReduce { element, .. } | Call::ReduceScatter { element, .. } => {
                (bytes / element.size()) as usize
            }
            _ => bytes as usize,
        };
        let (send_ptr, recv_ptr) = (send as *const c_void, recv as *mut c_void);
        let t = &self.table;
        let (name, issued) = {
            let handle = self.handle.read();
            if handle.aborted {
                return Err(aborted(t.library, call.name()));
            }
            let comm = handle.comm;
            // SAFETY: live (not aborted, under its lock); the caller vouches for buffers, stream
            // and agreement; each count is NCCL's (per rank: gather in, scatter out, all-to-all).
            unsafe {
                match call {
                    Call::AllReduce { element, op } => (
                        "ncclAllReduce",
                        (t.all_reduce)(
                            send_ptr,
                            recv_ptr,
                            count(send_bytes),
                            data_type(element),
                            operation(op),
                            comm,
                            stream,
                        ),
                    ),
                    Call::AllGather => (
                        "ncclAllGather",
                        (t.all_gather)(send_ptr, recv_ptr, count(send_bytes), BYTES, comm, stream),
                    ),
                    Call::ReduceScatter { element, op } => (
                        "ncclReduceScatter",
                        (t.reduce_scatter)(
                            send_ptr,
                            recv_ptr,
                            count(recv_bytes),
                            data_type(element),
                            operation(op),
                            comm,
                            stream,
                        ),
                    ),
                    Call::Broadcast { root } => (
                        "ncclBroadcast",
                        (t.broadcast)(
                            send_ptr,
                            recv_ptr,
                            count(send_bytes),
                            BYTES,
                            c_int::try_from(root).unwrap_or(c_int::MAX),
                            comm,
                            stream,
                        ),
                    ),
                    Call::AllToAll => (
                        "ncclAlltoAll",
                        (t.all_to_all)(
                            send_ptr,
                            recv_ptr,
                            count(send_bytes) / ranks.max(1),
                            BYTES,
                            comm,
                            stream,
                        ),
                    ),
                }
            }
        };
        match issued {
            SUCCESS | IN_PROGRESS => self.settle(name),
            REMOTE => Err(self.stalled(name)),
            failed => Err(t.error(name, failed)),
        }
    }

    /// Issue this rank's half of a transfer with `peer`, a send of `data` (a device address
    /// and a byte length) or a receive into it, on `stream`; wait until the library took it.
    ///
    /// # Safety
    /// `data` is on this communicator's device and alive until the work completes; `stream`
    /// is a live stream of that device; `peer` issues the opposite half, as long, next.
    pub unsafe fn point_to_point(
        &self,
        direction: Direction,
        peer: usize,
        (data, bytes): (u64, u64),
        stream: *mut c_void,
    ) -> Result<()> {
        let t = &self.table;
        let (name, entry) = match direction {
            Direction::Send => ("ncclSend", t.send),
            Direction::Recv => ("ncclRecv", t.recv),
        };
        let peer = c_int::try_from(peer)
            .map_err(|_| Error::invalid("nccl peer", format!("rank {peer}")))?;
        let issued = {
            let handle = self.handle.read();
            if handle.aborted {
                return Err(aborted(t.library, name));
            }
            // SAFETY: the communicator is live (not aborted, under its lock); the caller vouches
            // for the buffer, the stream and the peer's half; in `ncclInt8`, count is length.
            unsafe {
                entry(
                    data as *mut c_void,
                    bytes as usize,
                    BYTES,
                    peer,
                    handle.comm,
                    stream,
                )
            }
        };
        match issued {
            SUCCESS | IN_PROGRESS => self.settle(name),
            REMOTE => Err(self.stalled(name)),
            failed => Err(t.error(name, failed)),
        }
    }

    /// Run `launch`, a graph's replay of work on this communicator, only while it is live: an
    /// abort waits for it, and after one it is refused, since the abort freed what it uses.
    pub fn while_live(&self, launch: impl FnOnce() -> Result<()>) -> Result<()> {
        let handle = self.handle.read();
        if handle.aborted {
            return Err(aborted(self.table.library, "a graph's replay"));
        }
        launch()
    }

    /// Abort: calls waiting in the library return, and no more are taken. Idempotent.
    pub fn abort(&self) {
        let mut handle = self.handle.write();
        if handle.aborted {
            return;
        }
        handle.aborted = true;
        // SAFETY: live (the flag was clear under the exclusive lock), aborted once; calls hold
        // the lock shared, so none is inside the library on it, and the flag keeps any out.
        let result = unsafe { (self.table.comm_abort)(handle.comm) };
        if result != SUCCESS {
            tracing::warn!("ncclCommAbort: result {result}");
        }
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        let handle = self.handle.get_mut();
        if !handle.aborted {
            // SAFETY: a live communicator, destroyed once, by its owner.
            let result = unsafe { (self.table.comm_destroy)(handle.comm) };
            if result != SUCCESS {
                tracing::warn!("ncclCommDestroy: result {result}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unique_id_travels_as_bytes() {
        let mut id = UniqueId([0; 128]);
        for (i, c) in id.0.iter_mut().enumerate() {
            *c = (i as u8).wrapping_mul(37) as c_char;
        }
        let back = UniqueId::from_bytes(&id.to_bytes()).unwrap();
        assert_eq!(back.0, id.0);
        assert!(matches!(
            UniqueId::from_bytes(&[0; 127]),
            Err(Error::InvalidArgument { .. })
        ));
    }
}
