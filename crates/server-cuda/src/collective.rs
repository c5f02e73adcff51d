//! Collectives on the devices, through NCCL: the CUDA answer to
//! [`DeviceCollectives`], for [`Group::over_device`](scope_core::collective::Group::over_device).
//!
//! The group decides every round before a byte moves (`scope_core::collective::device`);
//! this file only turns an agreed call into NCCL's, and keeps NCCL from
//! doing the things it does instead of failing:
//!
//! 1. **Loaded at run time.** cudarc's `nccl` binds `libnccl.so` by name
//!    on first use; without it, [`Cuda::identity`](DeviceCollectives::identity)
//!    answers [`Error::BackendUnavailable`] instead of cudarc's panic.
//! 2. **Non-blocking communicators.** A blocking NCCL call can wait
//!    without bound for a peer (connection setup, a rank that never
//!    calls). Every communicator here is made with `blocking = 0`: a call
//!    returns `ncclInProgress` at once, and the rank polls
//!    `ncclCommGetAsyncError` with the communicator's lock released between
//!    polls, for at most [`STUCK`]. So no thread is ever inside NCCL for
//!    long, and [`abort`](DeviceCollectives::abort) — `ncclCommAbort`, the
//!    library's way out of a hung communicator — never waits behind one.
//! 3. **No call after an abort.** `ncclCommAbort` frees the communicator.
//!    The handle sits behind a lock with an `aborted` flag: a call takes it
//!    shared and refuses once the flag is set, an abort takes it
//!    exclusively, sets the flag and frees; drop destroys only what was not
//!    aborted. A use after free in NCCL cannot happen from here.
//!
//! Collectives are not recorded into CUDA graphs (the server refuses a
//! collective on a capturing stream): NCCL supports capture, but the
//! group's agreement is a host meeting that a replay would not repeat.
//!
//! Only one process: the group's meetings are in memory, so every rank of
//! a communicator is a server in this process. The identity type is NCCL's
//! unique id, which is what a launcher would hand to ranks in other
//! processes; making the meetings cross processes is not done.

use std::ffi::c_void;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cudarc::nccl::sys;
use parking_lot::RwLock;
use scope_core::collective::device::{DeviceCall, DeviceCollectives};
use scope_core::collective::{Call, Element, Reduce};
use scope_core::{Error, Result};

use crate::{Cuda, CudaMemory, CudaStreamState};

/// The longest a rank polls a call (or its join) before it gives up and
/// reports it: far past any call the group agreed to, so reaching it means
/// a peer is gone.
pub const STUCK: Duration = Duration::from_secs(60);

/// NCCL's `NCCL_API_MAGIC`, which a config made by
/// `NCCL_CONFIG_INITIALIZER` carries.
const API_MAGIC: u32 = 0xcafe_beef;

/// NCCL's `NCCL_CONFIG_UNDEF_INT`: "the library's default".
const UNDEF: i32 = i32::MIN;

/// Whether `libnccl.so` loads here, asked once per process.
fn nccl_present() -> Result<()> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: opening the library by name runs its initialisers, as any
    // use would; nothing is called.
    let present = *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() });
    if present {
        Ok(())
    } else {
        Err(Error::BackendUnavailable {
            backend: "nccl",
            reason:
                "libnccl.so was not found (install NCCL, or the nvidia-nccl-cu13 wheel, on the \
                     library path)"
                    .to_owned(),
        })
    }
}

/// What an NCCL call answered, as the core's error for `call`.
fn nccl_error(call: &str, result: sys::ncclResult_t) -> Error {
    // SAFETY: `ncclGetErrorString` returns a static, NUL-terminated string
    // for any code.
    let text = unsafe { std::ffi::CStr::from_ptr(sys::ncclGetErrorString(result)) };
    Error::Launch {
        kernel: call.into(),
        stream: scope_core::StreamId(0),
        detail: format!("{result:?}: {}", text.to_string_lossy()),
    }
}

/// NCCL's unique id, which every rank of one communicator joins with.
#[derive(Clone, Copy)]
pub struct NcclId(sys::ncclUniqueId);

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclId(..)")
    }
}

/// One rank's NCCL communicator.
pub struct NcclComm {
    handle: RwLock<Handle>,
}

struct Handle {
    comm: sys::ncclComm_t,
    aborted: bool,
}

// SAFETY: an NCCL communicator may be used from any thread; every use here
// goes through the lock, and `aborted` keeps a freed one from being used.
unsafe impl Send for NcclComm {}
// SAFETY: as above.
unsafe impl Sync for NcclComm {}

impl NcclComm {
    /// Poll until the communicator's pending work is no longer in
    /// progress: `Ok` when it completed, the error it ended with, or
    /// [`STUCK`] passed.
    fn settle(&self, call: &str) -> Result<()> {
        let until = Instant::now() + STUCK;
        loop {
            {
                let handle = self.handle.read();
                if handle.aborted {
                    return Err(aborted(call));
                }
                let mut state = sys::ncclResult_t::ncclInProgress;
                // SAFETY: the handle is live (not aborted, under the lock).
                let asked = unsafe { sys::ncclCommGetAsyncError(handle.comm, &mut state) };
                if asked != sys::ncclResult_t::ncclSuccess {
                    return Err(nccl_error("ncclCommGetAsyncError", asked));
                }
                match state {
                    sys::ncclResult_t::ncclSuccess => return Ok(()),
                    sys::ncclResult_t::ncclInProgress => {}
                    failed => return Err(nccl_error(call, failed)),
                }
            }
            if Instant::now() >= until {
                return Err(Error::Launch {
                    kernel: call.into(),
                    stream: scope_core::StreamId(0),
                    detail: format!("still in progress after {STUCK:?}: a peer never joined"),
                });
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

fn aborted(call: &str) -> Error {
    Error::Launch {
        kernel: call.into(),
        stream: scope_core::StreamId(0),
        detail: "the communicator was aborted (a rank of its group failed)".to_owned(),
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        let handle = self.handle.get_mut();
        if !handle.aborted {
            // SAFETY: a live communicator, destroyed once, by its owner.
            let destroyed = unsafe { sys::ncclCommDestroy(handle.comm) };
            if destroyed != sys::ncclResult_t::ncclSuccess {
                tracing::warn!("ncclCommDestroy: {destroyed:?}");
            }
        }
    }
}

fn data_type(element: Element) -> sys::ncclDataType_t {
    match element {
        Element::F32 => sys::ncclDataType_t::ncclFloat32,
        Element::I32 => sys::ncclDataType_t::ncclInt32,
        Element::U32 => sys::ncclDataType_t::ncclUint32,
    }
}

fn operation(op: Reduce) -> sys::ncclRedOp_t {
    match op {
        Reduce::Sum => sys::ncclRedOp_t::ncclSum,
        Reduce::Prod => sys::ncclRedOp_t::ncclProd,
        Reduce::Min => sys::ncclRedOp_t::ncclMin,
        Reduce::Max => sys::ncclRedOp_t::ncclMax,
        Reduce::Mean => sys::ncclRedOp_t::ncclAvg,
    }
}

impl DeviceCollectives for Cuda {
    type Communicator = NcclComm;
    type Identity = NcclId;

    fn identity() -> Result<NcclId> {
        nccl_present()?;
        let mut id = std::mem::MaybeUninit::<sys::ncclUniqueId>::uninit();
        // SAFETY: NCCL writes the whole id before returning success.
        let made = unsafe { sys::ncclGetUniqueId(id.as_mut_ptr()) };
        if made != sys::ncclResult_t::ncclSuccess {
            return Err(nccl_error("ncclGetUniqueId", made));
        }
        // SAFETY: written above.
        Ok(NcclId(unsafe { id.assume_init() }))
    }

    unsafe fn join(&mut self, identity: &NcclId, rank: usize, ranks: usize) -> Result<NcclComm> {
        nccl_present()?;
        self.bind()?;
        let (Ok(rank), Ok(ranks)) = (i32::try_from(rank), i32::try_from(ranks)) else {
            return Err(Error::invalid("nccl communicator", "too many ranks"));
        };
        let mut config = sys::ncclConfig_t {
            size: std::mem::size_of::<sys::ncclConfig_t>(),
            magic: API_MAGIC,
            version: 23007,
            blocking: 0,
            cgaClusterSize: UNDEF,
            minCTAs: UNDEF,
            maxCTAs: UNDEF,
            netName: std::ptr::null(),
            splitShare: UNDEF,
            trafficClass: UNDEF,
            commName: std::ptr::null(),
            collnetEnable: UNDEF,
            CTAPolicy: UNDEF,
            shrinkShare: UNDEF,
            nvlsCTAs: UNDEF,
            nChannelsPerNetPeer: UNDEF,
            nvlinkCentricSched: UNDEF,
            graphUsageMode: UNDEF,
            numRmaCtx: UNDEF,
            maxP2pPeers: UNDEF,
        };
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` and `config` outlive the call; the config is
        // NCCL_CONFIG_INITIALIZER's with `blocking = 0`; this backend's
        // context is current on the thread (bound above), which is the
        // device NCCL takes; every rank joins with this id and count
        // (`join`'s contract).
        let made =
            unsafe { sys::ncclCommInitRankConfig(&mut comm, ranks, identity.0, rank, &mut config) };
        if !matches!(
            made,
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
        ) {
            return Err(nccl_error("ncclCommInitRankConfig", made));
        }
        let joined = NcclComm {
            handle: RwLock::new(Handle {
                comm,
                aborted: false,
            }),
        };
        joined.settle("ncclCommInitRankConfig")?;
        Ok(joined)
    }

    unsafe fn collective(
        &mut self,
        communicator: &NcclComm,
        stream: &mut CudaStreamState,
        call: &DeviceCall<'_, CudaMemory>,
    ) -> Result<()> {
        self.bind()?;
        let ptr = |memory: &CudaMemory, offset: u64| (memory.device_ptr() + offset) as *mut c_void;
        let (input, output) = (&call.input, &call.output);
        let send = ptr(input.0, input.1.start).cast_const();
        let recv = ptr(output.0, output.1.start);
        let words = |bytes: u64| (bytes / 4) as usize;
        let (in_words, out_words) = (
            words(input.1.end - input.1.start),
            words(output.1.end - output.1.start),
        );
        let cu = stream.raw().cu_stream() as sys::cudaStream_t;
        let (name, issued) = {
            let handle = communicator.handle.read();
            if handle.aborted {
                return Err(aborted(call.call.name()));
            }
            let comm = handle.comm;
            // SAFETY: the communicator is live (not aborted, under its
            // lock); `send` and `recv` point into live allocations of this
            // device for the bytes each call touches (the contract of
            // `collective`: ranges inside their memory, lengths as the call
            // requires); `cu` is this backend's stream.
            unsafe {
                match call.call {
                    Call::AllReduce { element, op } => (
                        "ncclAllReduce",
                        sys::ncclAllReduce(
                            send,
                            recv,
                            in_words,
                            data_type(element),
                            operation(op),
                            comm,
                            cu,
                        ),
                    ),
                    Call::AllGather => (
                        "ncclAllGather",
                        sys::ncclAllGather(
                            send,
                            recv,
                            in_words,
                            sys::ncclDataType_t::ncclUint32,
                            comm,
                            cu,
                        ),
                    ),
                    Call::ReduceScatter { element, op } => (
                        "ncclReduceScatter",
                        sys::ncclReduceScatter(
                            send,
                            recv,
                            out_words,
                            data_type(element),
                            operation(op),
                            comm,
                            cu,
                        ),
                    ),
                    Call::Broadcast { root } => (
                        "ncclBroadcast",
                        sys::ncclBroadcast(
                            send,
                            recv,
                            in_words,
                            sys::ncclDataType_t::ncclUint32,
                            root as i32,
                            comm,
                            cu,
                        ),
                    ),
                    Call::AllToAll => (
                        "ncclAlltoAll",
                        sys::ncclAlltoAll(
                            send,
                            recv,
                            in_words / call.ranks,
                            sys::ncclDataType_t::ncclUint32,
                            comm,
                            cu,
                        ),
                    ),
                    other => {
                        return Err(Error::invalid(
                            "nccl",
                            format!("{other:?} has no NCCL call here"),
                        ));
                    }
                }
            }
        };
        if !matches!(
            issued,
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
        ) {
            return Err(nccl_error(name, issued));
        }
        communicator.settle(name)?;
        stream.touch(input.0);
        stream.touch(output.0);
        Ok(())
    }

    unsafe fn abort(communicator: &NcclComm) {
        let mut handle = communicator.handle.write();
        if handle.aborted {
            return;
        }
        handle.aborted = true;
        // SAFETY: a live communicator (the flag was clear under the
        // exclusive lock), aborted once; no call is inside NCCL on it (they
        // hold the lock shared), and none will be (the flag).
        let aborted = unsafe { sys::ncclCommAbort(handle.comm) };
        if aborted != sys::ncclResult_t::ncclSuccess {
            tracing::warn!("ncclCommAbort: {aborted:?}");
        }
    }
}
