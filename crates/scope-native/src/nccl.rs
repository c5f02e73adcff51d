//! The NCCL API, which NVIDIA's NCCL and AMD's RCCL both implement: one
//! communicator wrapper, and one device transport
//! ([`DeviceCollectives`](scope_core::collective::device::DeviceCollectives),
//! for every backend that is an [`NcclDevice`]), for the CUDA and HIP
//! servers.
//!
//! RCCL is NCCL's API with NCCL's names, types and values, so the two
//! servers differ only in where the library is found; everything that
//! keeps the library from doing what it does instead of failing is here,
//! once:
//!
//! 1. **Non-blocking communicators.** A blocking NCCL call can wait without
//!    bound for a peer (connection setup, a rank that never calls). Every
//!    communicator is made with `blocking = 0`: a call returns
//!    `ncclInProgress` at once, and the rank polls
//!    `ncclCommGetAsyncError` with the communicator's lock released between
//!    polls, for at most the communicator's patience (what the group gives
//!    [`DeviceCollectives::join`](scope_core::collective::device::DeviceCollectives::join):
//!    its deadline across processes, a guard of at least a minute in one).
//!    No thread stays inside the library, so an abort — `ncclCommAbort`,
//!    the library's way out of a hung communicator — never waits behind
//!    one.
//! 2. **No call after an abort.** `ncclCommAbort` frees the communicator.
//!    The handle sits behind a lock with an `aborted` flag: a call takes it
//!    shared and refuses once the flag is set; an abort takes it
//!    exclusively, sets the flag and frees; a drop destroys only what was
//!    not aborted. A use after free inside the library cannot come from
//!    here.
//! 3. **The oldest config that says what is needed.** The config is the
//!    NCCL 2.17 head (`size`, `magic`, `version`, `blocking`, …) with its
//!    own `size`: NCCL and RCCL read a config by its size, so every version
//!    since takes it, and only `blocking` is set.

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
    /// Its 128 bytes, for a launcher to hand to the ranks in other
    /// processes.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0.map(|c| c as u8)
    }

    /// The id whose bytes `bytes` are ([`to_bytes`](Self::to_bytes)).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] unless `bytes` is 128 bytes long. Bytes
    /// not made by the library are the library's to refuse when a rank
    /// joins with them.
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

/// `ncclConfig_t` as NCCL 2.17 declared it (`ncclConfig_v21700`): the
/// fields every later version begins with.
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
    /// `NCCL_CONFIG_INITIALIZER`'s head with its own size and `blocking =
    /// 0`: every communicator here is non-blocking.
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

/// `NCCL_API_MAGIC`.
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
/// `ncclCommShrink` (NCCL 2.27): parent, excluded ranks, their count, the
/// new communicator, its config, flags.
pub type CommShrink = unsafe extern "C" fn(
    RawComm,
    *mut c_int,
    c_int,
    *mut RawComm,
    *mut c_void,
    c_int,
) -> NcclResult;
/// `ncclCommSplit` (NCCL 2.18): parent, color, key, the new
/// communicator, its config.
pub type CommSplit =
    unsafe extern "C" fn(RawComm, c_int, c_int, *mut RawComm, *mut c_void) -> NcclResult;
/// `ncclAllReduce` and `ncclReduceScatter`: send, receive, count, type,
/// operation, communicator, stream.
pub type Reducing = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    RawComm,
    *mut c_void,
) -> NcclResult;
/// `ncclAllGather` and `ncclAlltoAll`: send, receive, count, type,
/// communicator, stream.
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
/// `ncclSend` and `ncclRecv`: buffer (read by a send, written by a
/// receive), count, type, peer, communicator, stream.
pub type PointToPoint =
    unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, RawComm, *mut c_void) -> NcclResult;
/// `ncclGetErrorString`.
pub type ErrorString = unsafe extern "C" fn(NcclResult) -> *const c_char;

/// The NCCL API's entry points a device transport calls, as C function
/// pointers: what `nccl.h` (and `rccl.h`) declare.
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
    /// `ncclCommShrink`, where the library has it (NCCL 2.27 and later;
    /// not in [`SYMBOLS`](Self::SYMBOLS), which a transport needs).
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

    /// The table, each entry point's address from `address` (a `dlsym` of
    /// the loaded library); `Err` names the first symbol it lacks.
    ///
    /// # Safety
    ///
    /// Every address `address` returns is the named function of an NCCL API
    /// library (NCCL 2.17 or later, or RCCL), loaded for as long as the
    /// table is used.
    pub unsafe fn resolve(
        library: &'static str,
        mut address: impl FnMut(&'static str) -> Option<*const c_void>,
    ) -> std::result::Result<Self, &'static str> {
        let mut next = |name: &'static str| address(name).filter(|p| !p.is_null()).ok_or(name);
        macro_rules! entry {
            ($name:literal, $ty:ty) => {{
                let raw = next($name)?;
                // SAFETY: the caller vouches that `raw` is `$name` of an
                // NCCL API library, whose C declaration is `$ty`.
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
                    // SAFETY: the caller vouches that `raw` is
                    // `ncclCommShrink` of an NCCL API library, whose C
                    // declaration is `CommShrink`.
                    unsafe { std::mem::transmute::<*const c_void, CommShrink>(raw) }
                }),
            comm_split: address("ncclCommSplit")
                .filter(|p| !p.is_null())
                .map(|raw| {
                    // SAFETY: the caller vouches that `raw` is
                    // `ncclCommSplit` of an NCCL API library, whose C
                    // declaration is `CommSplit`.
                    unsafe { std::mem::transmute::<*const c_void, CommSplit>(raw) }
                }),
        })
    }

    /// What `call` answered, as the core's error.
    fn error(&self, call: &'static str, result: NcclResult) -> Error {
        // SAFETY: `ncclGetErrorString` returns a static, NUL-terminated
        // string for any code.
        let text = unsafe { CStr::from_ptr((self.get_error_string)(result)) };
        CollectiveError::Library {
            library: self.library,
            call,
            detail: format!("result {result}: {}", text.to_string_lossy()),
        }
        .into()
    }

    /// A new unique id (`ncclGetUniqueId`).
    ///
    /// # Errors
    ///
    /// What the library answered.
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

// SAFETY: an NCCL communicator may be used from any thread; every use here
// goes through the lock, and `aborted` keeps a freed one from being used.
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

fn data_type(element: Element) -> c_int {
    match element {
        Element::I32 => 2,
        Element::U32 => 3,
        Element::F32 => 7,
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

/// `ncclUint32`, for the calls that only move words.
const WORDS: c_int = 3;
/// `ncclInt8`, for transfers of bytes.
const BYTES: c_int = 0;

impl Communicator {
    /// Join the communicator `id` names as rank `rank` of `ranks`, on the
    /// device current on this thread, waiting (by polling) until every rank
    /// joined or `patience` passed; later calls are
    /// polled as long.
    ///
    /// # Safety
    ///
    /// `table` is a live NCCL API library's; the device this rank runs on is
    /// current on the calling thread (the library takes it from there);
    /// every rank joins with the same `id` and `ranks`, once.
    ///
    /// # Errors
    ///
    /// What the library answered; a join still in progress after
    /// `patience` ([`CollectiveError::Stalled`]), whose communicator is
    /// then aborted — NCCL's own answer to an init that must end, where a
    /// destroy would wait for the missing peers.
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
        // SAFETY: `comm` and `config` outlive the call; the config is
        // NCCL_CONFIG_INITIALIZER's head with its own size and `blocking =
        // 0`; the caller made the device current and gives every rank this
        // id and count.
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
        // An init that did not settle is aborted, never destroyed: NCCL's
        // destroy waits for the init, and so for peers that never come.
        if let Err(e) = joined.settle("ncclCommInitRankConfig") {
            joined.abort();
            return Err(e);
        }
        Ok(joined)
    }

    /// This rank's communicator of the survivors, once the ranks
    /// `exclude` (ascending) left this one: `ncclCommShrink` with the
    /// default flag (no operation is in flight to terminate), non-blocking
    /// as every communicator here, polled until every survivor came or
    /// `patience` passed. `Ok(None)` where the library has no shrink.
    ///
    /// # Safety
    ///
    /// This rank's device is current on the calling thread; no call through
    /// this communicator is in flight; every rank not in `exclude` shrinks
    /// it once, with the same `exclude`, and no excluded rank does.
    ///
    /// # Errors
    ///
    /// An aborted communicator; what the library answered; a shrink still
    /// in progress after `patience` ([`CollectiveError::Stalled`]), whose
    /// new communicator is then aborted.
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
            // SAFETY: the parent is live (not aborted, under the lock);
            // `exclude`, `comm` and `config` outlive the call; the config is
            // NCCL_CONFIG_INITIALIZER's head with its own size and
            // `blocking = 0`; flag 0 is NCCL_SHRINK_DEFAULT; the caller
            // vouches for the rest.
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

    /// This rank's communicator of the same ranks, numbered alike, with
    /// resources of its own (`ncclCommSplit`, one color, `splitShare = 0`):
    /// NCCL runs a communicator's kernels one after another whatever their
    /// streams, so work on the copy never waits behind this one's.
    /// `Ok(None)` where the library has no split.
    ///
    /// # Safety
    ///
    /// As [`shrink`](Self::shrink), with nothing excluded: every rank
    /// duplicates once, with its own `rank`.
    ///
    /// # Errors
    ///
    /// As [`shrink`](Self::shrink).
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
            // SAFETY: the parent is live (not aborted, under the lock);
            // `comm` and `config` outlive the call; the config is
            // NCCL_CONFIG_INITIALIZER's head with its own size, `blocking =
            // 0` and `splitShare = 0`; color 0 on every rank keeps every
            // rank, the key its number; the caller vouches for the rest.
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

    /// The communicator `call` made from this one, once it settled; an
    /// unsettled one is aborted, as a join's is.
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

    /// Poll until the communicator's pending work is no longer in
    /// progress: `Ok` when it completed, the error it ended with, or the
    /// communicator's patience ran out.
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

    /// A peer never came, or one aborted (`ncclRemoteError`): what
    /// `DeviceCollectives::join` asks a transport to answer then.
    fn stalled(&self, call: &'static str) -> Error {
        CollectiveError::Stalled {
            collective: call,
            round: 0,
            deadline: self.patience,
        }
        .into()
    }

    /// Whether the communicator still works: its asynchronous error,
    /// without waiting (`ncclCommGetAsyncError`). A call still in progress
    /// is fine; a peer's abort or a failed link is
    /// [`CollectiveError::Stalled`].
    ///
    /// # Errors
    ///
    /// As above; an aborted communicator; what the library answered.
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

    /// Issue `call` from `send` into `recv` (each a device address and a
    /// length in bytes) on `stream`, as a rank of `ranks`, and wait until
    /// the library took it.
    ///
    /// # Safety
    ///
    /// `send` and `recv` are on this communicator's device, as long as
    /// `call` requires of its input and output over `ranks`, and alive until
    /// the work completes; `stream` is a live stream of that device; every
    /// rank of the communicator issues the same call as its next.
    ///
    /// # Errors
    ///
    /// What the library answered; an aborted communicator.
    pub unsafe fn issue(
        &self,
        call: Call,
        (send, send_bytes): (u64, u64),
        (recv, recv_bytes): (u64, u64),
        ranks: usize,
        stream: *mut c_void,
    ) -> Result<()> {
        let words = |bytes: u64| (bytes / 4) as usize;
        let (send_ptr, recv_ptr) = (send as *const c_void, recv as *mut c_void);
        let t = &self.table;
        let (name, issued) = {
            let handle = self.handle.read();
            if handle.aborted {
                return Err(aborted(t.library, call.name()));
            }
            let comm = handle.comm;
            // SAFETY: the communicator is live (not aborted, under its
            // lock); the caller vouches for the buffers, the stream and the
            // agreement of every rank; each count is the one the NCCL API
            // takes for that call (per rank for a gather's input, a
            // scatter's output and an all-to-all's part).
            unsafe {
                match call {
                    Call::AllReduce { element, op } => (
                        "ncclAllReduce",
                        (t.all_reduce)(
                            send_ptr,
                            recv_ptr,
                            words(send_bytes),
                            data_type(element),
                            operation(op),
                            comm,
                            stream,
                        ),
                    ),
                    Call::AllGather => (
                        "ncclAllGather",
                        (t.all_gather)(send_ptr, recv_ptr, words(send_bytes), WORDS, comm, stream),
                    ),
                    Call::ReduceScatter { element, op } => (
                        "ncclReduceScatter",
                        (t.reduce_scatter)(
                            send_ptr,
                            recv_ptr,
                            words(recv_bytes),
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
                            words(send_bytes),
                            WORDS,
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
                            words(send_bytes) / ranks.max(1),
                            WORDS,
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

    /// Issue this rank's half of a transfer with rank `peer` — a send of
    /// `data` (a device address and a length in bytes) or a receive into
    /// it — on `stream`, and wait until the library took it.
    ///
    /// # Safety
    ///
    /// `data` is on this communicator's device and alive until the work
    /// completes; `stream` is a live stream of that device; `peer` issues
    /// the opposite half, of the same length, as its next transfer with
    /// this rank.
    ///
    /// # Errors
    ///
    /// What the library answered; an aborted communicator.
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
            // SAFETY: the communicator is live (not aborted, under its
            // lock); the caller vouches for the buffer, the stream and the
            // peer's matching half; bytes move as `ncclInt8`, so the count
            // is the length.
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

    /// Run `launch`, which starts work recorded on this communicator (a
    /// graph's replay), only while it is live: an abort waits for it, and
    /// after one it is refused, since the abort freed what that work uses.
    ///
    /// # Errors
    ///
    /// An aborted communicator; what `launch` returned.
    pub fn while_live(&self, launch: impl FnOnce() -> Result<()>) -> Result<()> {
        let handle = self.handle.read();
        if handle.aborted {
            return Err(aborted(self.table.library, "a graph's replay"));
        }
        launch()
    }

    /// Abort: calls waiting in the library return, and the communicator
    /// takes no more. Idempotent; any thread.
    pub fn abort(&self) {
        let mut handle = self.handle.write();
        if handle.aborted {
            return;
        }
        handle.aborted = true;
        // SAFETY: a live communicator (the flag was clear under the
        // exclusive lock), aborted once; no call is inside the library on
        // it (calls hold the lock shared), and none will be (the flag).
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

    /// An id travels as its 128 bytes and back; other lengths are refused.
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
