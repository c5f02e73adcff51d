//! Collectives over a group of devices (rules 41–50). If any rank's input
//! carries a failure, every rank's output carries it, naming that rank; in
//! NCCL a failed rank's peers hang, or it sends garbage.
//!
//! 1. **Every rank decides the same way, before data moves**
//!    (`meeting.rs`): the result is written, or the failure claimed with
//!    [`Client::fail_writing`] (rule 21).
//! 2. **No rank waits forever** ([`CollectiveError::Missing`]).
//! 3. **A group that lost a rank stays broken**
//!    ([`CollectiveError::Broken`]) until it shrinks, as NCCL requires.
//! 4. **Bad input is refused on every rank, claiming nothing** (rule 38).
//! 5. **Host staging**, so every backend works, or a vendor library ([`device`]).
//! 6. **Across processes, the meeting rides the transport** ([`remote`]).
//! 7. **A graph holding collectives is a promise to peers** ([`Rank::replay`]).
//!
//! Each rank calls from its own thread ([`Group::run`]).

pub(crate) mod compute;
pub mod device;
mod meeting;
mod membership;
mod p2p;
pub mod remote;
mod replay;
mod round;
mod watchdog;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use self::device::Mover;
use self::meeting::Meeting;
pub use self::p2p::{MAILBOX_BYTES, MAILBOX_PARCELS};
use self::remote::{Ballot, Liveness};
use self::round::{Input, Kind, Outcome, Part, Written};
#[doc(hidden)]
pub use self::watchdog::background_drops_done;
use crate::backend::Backend;
use crate::capture::CaptureState;
use crate::client::Client;
pub use crate::error::CollectiveError;
use crate::error::{Error, Result};
use crate::handle::Slice;

/// How a collective combines the ranks' values, in rank order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    /// The sum.
    Sum,
    /// The product.
    Prod,
    /// The least value.
    Min,
    /// The greatest value.
    Max,
    /// The sum divided by the number of ranks; integers truncate.
    Mean,
}

/// What a reduction reads the bytes as, little-endian: every type NCCL
/// reduces but fp8 (NCCL 2.24 on), whose arithmetic no test here can check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    /// `f32`.
    F32,
    /// `i32`.
    I32,
    /// `u32`.
    U32,
    /// IEEE binary16; combined in `f32`, rounded once (rule 45).
    F16,
    /// bfloat16; combined in `f32`, rounded once (rule 45).
    BF16,
    /// `f64`.
    F64,
    /// `i8`.
    I8,
    /// `u8`.
    U8,
    /// `i64`.
    I64,
    /// `u64`.
    U64,
}

impl Element {
    /// Every element type, in the order a ballot numbers them.
    pub const ALL: [Element; 10] = [
        Element::F32,
        Element::I32,
        Element::U32,
        Element::F16,
        Element::BF16,
        Element::F64,
        Element::I8,
        Element::U8,
        Element::I64,
        Element::U64,
    ];

    /// Bytes per element.
    pub const fn size(self) -> u64 {
        match self {
            Element::I8 | Element::U8 => 1,
            Element::F16 | Element::BF16 => 2,
            Element::F32 | Element::I32 | Element::U32 => 4,
            Element::F64 | Element::I64 | Element::U64 => 8,
        }
    }

    /// The type's name, as errors give it.
    pub const fn name(self) -> &'static str {
        match self {
            Element::F32 => "f32",
            Element::I32 => "i32",
            Element::U32 => "u32",
            Element::F16 => "f16",
            Element::BF16 => "bf16",
            Element::F64 => "f64",
            Element::I8 => "i8",
            Element::U8 => "u8",
            Element::I64 => "i64",
            Element::U64 => "u64",
        }
    }
}

/// Copy `src` on one device into `dst` on another, through the host (rule 46).
///
/// # Errors
///
/// `SourceFailed` (`dst` carries it); [`Error::InvalidArgument`] for unequal
/// lengths; the write's own errors.
pub fn copy_across<A: Backend, B: Backend>(
    from: &Client<A>,
    src: Slice<'_>,
    to: &Client<B>,
    dst: Slice<'_>,
) -> Result<()> {
    let len = |s: &Slice<'_>| s.range.end.saturating_sub(s.range.start);
    if len(&src) != len(&dst) {
        return Err(Error::invalid(
            "copy across devices",
            format!(
                "{} source bytes for {} destination bytes",
                len(&src),
                len(&dst)
            ),
        ));
    }
    match from.read(src) {
        Ok(bytes) => to.write(dst, &bytes),
        Err(refused) if is_refusal(&refused) => Err(refused),
        Err(cause) => {
            let error: Error = CollectiveError::SourceFailed {
                from: format!("{} ({})", A::NAME, from.describe()),
                cause,
            }
            .into();
            to.fail_writing(&[dst], error.clone())?;
            Err(error)
        }
    }
}

/// Whether a read's error is the caller's mistake (rule 38), not a failure.
fn is_refusal(error: &Error) -> bool {
    matches!(error, Error::InvalidArgument { .. } | Error::Refused { .. })
}

/// What every rank must agree a call is; exhaustive, so a new one fails to
/// compile in every transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// [`Rank::all_reduce`].
    AllReduce {
        /// What the bytes are.
        element: Element,
        /// How they combine.
        op: Reduce,
    },
    /// [`Rank::all_gather`].
    AllGather,
    /// [`Rank::reduce_scatter`].
    ReduceScatter {
        /// What the bytes are.
        element: Element,
        /// How they combine.
        op: Reduce,
    },
    /// [`Rank::broadcast`].
    Broadcast {
        /// The rank whose bytes every rank gets.
        root: usize,
    },
    /// [`Rank::all_to_all`].
    AllToAll,
}

impl Call {
    /// Each rank's output bytes for clean `inputs`, both in rank order.
    pub fn outputs(self, inputs: &[&[u8]]) -> Vec<Arc<Vec<u8>>> {
        compute::compute(self, inputs)
    }

    /// Whether rank `rank` reads its input: in a broadcast only the root.
    pub(crate) fn reads_input_of(self, rank: usize) -> bool {
        !matches!(self, Call::Broadcast { root } if root != rank)
    }

    /// The collective's name, as errors give it.
    pub fn name(self) -> &'static str {
        match self {
            Call::AllReduce { .. } => "all_reduce",
            Call::AllGather => "all_gather",
            Call::ReduceScatter { .. } => "reduce_scatter",
            Call::Broadcast { .. } => "broadcast",
            Call::AllToAll => "all_to_all",
        }
    }

    /// What a length must be whole of: 4-byte words, as every host copy
    /// moves, and a reduction's elements.
    pub fn unit(self) -> u64 {
        match self {
            Call::AllReduce { element, .. } | Call::ReduceScatter { element, .. } => {
                element.size().max(4)
            }
            _ => 4,
        }
    }

    /// What a length must be whole of, in words.
    fn units(self) -> String {
        match self {
            Call::AllReduce { element, .. } | Call::ReduceScatter { element, .. }
                if element.size() > 4 =>
            {
                format!("{} elements", element.name())
            }
            _ => "4-byte words".to_owned(),
        }
    }

    /// The output length for `input` bytes over `ranks`, or why none.
    fn output_len(self, input: u64, ranks: u64) -> std::result::Result<u64, String> {
        let divisible = |what: &str| {
            if input.is_multiple_of(self.unit() * ranks) {
                Ok(input / ranks)
            } else {
                Err(format!(
                    "passed {input} input bytes to {what}, which are not {ranks} equal parts of whole {}",
                    self.units()
                ))
            }
        };
        match self {
            Call::AllReduce { .. } | Call::Broadcast { .. } => Ok(input),
            Call::AllGather => Ok(input * ranks),
            Call::ReduceScatter { .. } => divisible("reduce_scatter"),
            Call::AllToAll => divisible("all_to_all").map(|_| input),
        }
    }
}

struct Shared<B: Backend> {
    /// Unique in the process: what a capture window records rounds under.
    id: u64,
    /// This process's ranks' clients: all, or one ([`Rank::join`]).
    clients: Vec<Client<B>>,
    /// The rank `clients[0]` is.
    first: usize,
    ranks: usize,
    deadline: Duration,
    /// `None`: bytes move through the host.
    device: Option<Box<dyn Mover<B>>>,
    /// `None`: ranks meet in memory, not by ballot.
    ballot: Option<Box<dyn Ballot<B>>>,
    /// 0 as made, one more per membership change.
    epoch: u64,
    /// Drain each rank's stream before a round, to measure against.
    draining: bool,
    /// Who knows sooner than the deadline that a rank is gone ([`Rank::watch_liveness`]).
    liveness: OnceLock<Arc<dyn Liveness>>,
    state: Mutex<State<B>>,
    changed: Condvar,
    /// Notified when no part of this process is in flight any more.
    all_landed: Condvar,
}

impl<B: Backend> Shared<B> {
    fn new(
        clients: Vec<Client<B>>,
        (first, ranks): (usize, usize),
        deadline: Duration,
        device: Option<Box<dyn Mover<B>>>,
        ballot: Option<Box<dyn Ballot<B>>>,
        epoch: u64,
    ) -> Self {
        let state = State {
            rounds: Meeting::new(ranks),
            broken: None,
            first_failed: None,
            flights: Vec::new(),
            failed_from: None,
            failing: 0,
            abort_due: None,
            mail: std::collections::BTreeMap::new(),
            membership: membership::Membership::new(ranks),
        };
        static GROUPS: AtomicU64 = AtomicU64::new(0);
        Self {
            id: GROUPS.fetch_add(1, Ordering::Relaxed),
            clients,
            first,
            ranks,
            deadline,
            device,
            ballot,
            epoch,
            draining: false,
            liveness: OnceLock::new(),
            state: Mutex::new(state),
            changed: Condvar::new(),
            all_landed: Condvar::new(),
        }
    }

    /// Whether the group is closed to calls through rank `rank`.
    fn closed(&self, state: &State<B>, rank: usize) -> Option<Closed> {
        if let Some(stale) = state.membership.stale(self.epoch, rank) {
            return Some(Closed::Stale(stale));
        }
        state.broken.clone().map(Closed::Broken)
    }

    /// Rank `rank`'s client; only this process's ranks are asked for.
    fn client(&self, rank: usize) -> &Client<B> {
        &self.clients[rank - self.first]
    }
}

/// What a group's ranks share, under one lock.
struct State<B: Backend> {
    /// The rounds (`round.rs`).
    rounds: Meeting<Part, Outcome>,
    broken: Option<Arc<CollectiveError>>,
    /// Over a device transport: the first rank whose call failed.
    first_failed: Option<usize>,
    /// This process's parts in flight on communication streams.
    flights: Vec<watchdog::Flight<B>>,
    /// The first round that failed in flight (`watchdog.rs`).
    failed_from: Option<u64>,
    /// Failures in flight still being claimed.
    failing: usize,
    /// An abort waiting for earlier rounds' parts to land (`watchdog.rs`).
    abort_due: Option<watchdog::AbortDue>,
    /// Point-to-point parcels, by (sender, receiver).
    mail: std::collections::BTreeMap<(usize, usize), p2p::Mailbox>,
    membership: membership::Membership<B>,
}

/// Why a group takes no more calls.
enum Closed {
    /// A membership change superseded its epoch (rule 55).
    Stale(CollectiveError),
    /// It lost a rank (rule 43).
    Broken(Arc<CollectiveError>),
}

impl Closed {
    /// As a call refused on entry answers it.
    fn refusal(self) -> Error {
        match self {
            Closed::Stale(stale) => stale.into(),
            Closed::Broken(cause) => CollectiveError::Broken { cause }.into(),
        }
    }

    /// As a wait that was under way answers it: what broke the group.
    fn cause(self) -> Error {
        match self {
            Closed::Stale(stale) => stale.into(),
            Closed::Broken(cause) => (*cause).clone().into(),
        }
    }
}

/// A group of clients, one per device: rank `i` is `clients[i]`.
pub struct Group<B: Backend> {
    shared: Arc<Shared<B>>,
}

impl<B: Backend> Clone for Group<B> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<B: Backend> std::fmt::Debug for Group<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let over = if self.shared.device.is_some() {
            "device transport"
        } else {
            "host staging"
        };
        write!(f, "Group({} {} ranks, {over})", self.shared.ranks, B::NAME)
    }
}

/// How long a rank waits for its peers unless the group says otherwise.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

impl<B: Backend> Group<B> {
    /// A group of `clients` whose ranks wait at most `deadline`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for no clients, or two of one server.
    pub fn new(clients: Vec<Client<B>>, deadline: Duration) -> Result<Self> {
        Self::check_clients(&clients)?;
        Ok(Self::over(clients, deadline, None))
    }

    fn check_clients(clients: &[Client<B>]) -> Result<()> {
        if clients.is_empty() {
            return Err(Error::invalid("group", "no clients"));
        }
        for (i, client) in clients.iter().enumerate() {
            if let Some(j) = clients[..i]
                .iter()
                .position(|c| c.server_id() == client.server_id())
            {
                return Err(Error::invalid(
                    "group",
                    format!(
                        "ranks {j} and {i} are clients of one server; each rank needs its own device"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn over(
        clients: Vec<Client<B>>,
        deadline: Duration,
        device: Option<Box<dyn Mover<B>>>,
    ) -> Self {
        let ranks = clients.len();
        Self {
            shared: Arc::new(Shared::new(clients, (0, ranks), deadline, device, None, 0)),
        }
    }

    /// Whether bytes move by [`over_device`](Self::over_device).
    pub fn is_over_device(&self) -> bool {
        self.shared.device.is_some()
    }

    /// How many ranks.
    pub fn ranks(&self) -> usize {
        self.shared.ranks
    }

    /// Rank `rank`'s handle, whose collectives run on its client.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a rank past the group.
    pub fn rank(&self, rank: usize) -> Result<Rank<B>> {
        if rank >= self.ranks() {
            return Err(Error::invalid(
                "rank",
                format!("{rank} in a group of {}", self.ranks()),
            ));
        }
        Ok(Rank {
            shared: self.shared.clone(),
            rank,
        })
    }

    /// What broke the group, if a rank went missing.
    pub fn broken(&self) -> Option<Arc<CollectiveError>> {
        self.shared.state.lock().broken.clone()
    }

    /// How many of this process's parts are in flight on communication
    /// streams: what the watchdog polls (rule 47).
    pub fn rounds_in_flight(&self) -> usize {
        self.shared.state.lock().flights.len()
    }

    /// Run `f` once per rank, each on its own thread; results by rank.
    pub fn run<R: Send>(&self, f: impl Fn(Rank<B>) -> R + Sync) -> Vec<R> {
        per_rank(self.ranks(), |rank| {
            f(Rank {
                shared: self.shared.clone(),
                rank,
            })
        })
    }
}

/// `f(rank)` for every rank on scoped threads; a panic resumes here.
fn per_rank<R: Send>(ranks: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let f = &f;
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..ranks)
            .map(|rank| scope.spawn(move || f(rank)))
            .collect();
        threads
            .into_iter()
            .map(|t| match t.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    })
}

/// One rank of a [`Group`].
pub struct Rank<B: Backend> {
    shared: Arc<Shared<B>>,
    rank: usize,
}

impl<B: Backend> std::fmt::Debug for Rank<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Rank({} of {})", self.rank, self.shared.ranks)
    }
}

impl<B: Backend> Rank<B> {
    /// Its index in the group.
    pub fn index(&self) -> usize {
        self.rank
    }

    /// What broke its group, if anything did.
    pub fn broken(&self) -> Option<Arc<CollectiveError>> {
        self.shared.state.lock().broken.clone()
    }

    /// Its client.
    pub fn client(&self) -> &Client<B> {
        self.shared.client(self.rank)
    }

    /// How many ranks its group has.
    pub fn ranks(&self) -> usize {
        self.shared.ranks
    }

    /// Every rank's `input`, combined with `op`, into every rank's `output`.
    ///
    /// # Errors
    ///
    /// [`Error::Collective`]: a failed input or missing rank (outputs carry
    /// it), a refusal, a broken group; the write's own errors.
    pub fn all_reduce(
        &self,
        input: Slice<'_>,
        output: Slice<'_>,
        element: Element,
        op: Reduce,
    ) -> Result<()> {
        self.collective(Call::AllReduce { element, op }, input, output)
    }

    /// Every rank's `input`, in rank order, into every rank's `output`
    /// (`ranks` times as long).
    ///
    /// # Errors
    ///
    /// As [`all_reduce`](Self::all_reduce).
    pub fn all_gather(&self, input: Slice<'_>, output: Slice<'_>) -> Result<()> {
        self.collective(Call::AllGather, input, output)
    }

    /// Every rank's `input` combined with `op`, then split in `ranks` equal
    /// parts: rank `i`'s `output` gets part `i`.
    ///
    /// # Errors
    ///
    /// As [`all_reduce`](Self::all_reduce).
    pub fn reduce_scatter(
        &self,
        input: Slice<'_>,
        output: Slice<'_>,
        element: Element,
        op: Reduce,
    ) -> Result<()> {
        self.collective(Call::ReduceScatter { element, op }, input, output)
    }

    /// Rank `root`'s `data` into every rank's `data`.
    ///
    /// # Errors
    ///
    /// As [`all_reduce`](Self::all_reduce); a root past the group is refused.
    pub fn broadcast(&self, root: usize, data: Slice<'_>) -> Result<()> {
        self.collective(Call::Broadcast { root }, data, data)
    }

    /// Part `j` of rank `i`'s `input` into part `i` of rank `j`'s `output`.
    ///
    /// # Errors
    ///
    /// As [`all_reduce`](Self::all_reduce).
    pub fn all_to_all(&self, input: Slice<'_>, output: Slice<'_>) -> Result<()> {
        self.collective(Call::AllToAll, input, output)
    }

    /// Why this rank's own arguments cannot be run, if they cannot.
    fn refusal(&self, kind: Call, input: Slice<'_>, output: Slice<'_>) -> Option<String> {
        let ranks = self.shared.ranks;
        if let Some(why) = self.client().unusable(input.buffer) {
            return Some(why);
        }
        if let Some(why) = self.client().unusable(output.buffer) {
            return Some(why);
        }
        if let Call::Broadcast { root } = kind
            && root >= ranks
        {
            return Some(format!("named root {root} in a group of {ranks}"));
        }
        let len = input.range.end.saturating_sub(input.range.start);
        if input.range.end < input.range.start || len == 0 || !len.is_multiple_of(kind.unit()) {
            return Some(format!(
                "passed input bytes {}..{}, not whole {}",
                input.range.start,
                input.range.end,
                kind.units()
            ));
        }
        let out = output.range.end.saturating_sub(output.range.start);
        match kind.output_len(len, ranks as u64) {
            Err(why) => Some(why),
            Ok(expected) if expected != out => Some(format!(
                "passed {out} output bytes where {} of {len} input bytes over {ranks} ranks writes {expected}",
                kind.name()
            )),
            Ok(_) => None,
        }
    }

    /// The entry check, claiming nothing (rules 43, 55).
    ///
    /// # Errors
    ///
    /// [`CollectiveError::Stale`], then [`CollectiveError::Broken`].
    pub(super) fn usable(&self) -> Result<()> {
        let state = self.shared.state.lock();
        match self.shared.closed(&state, self.rank) {
            Some(closed) => Err(closed.refusal()),
            None => Ok(()),
        }
    }

    fn collective(&self, kind: Call, input: Slice<'_>, output: Slice<'_>) -> Result<()> {
        self.usable()?;
        let refused = self.refusal(kind, input, output);
        let reads = kind.reads_input_of(self.rank);
        let on_device = self.shared.device.is_some();
        let recorded = self.client().capture_state() == CaptureState::Recording;
        let part = Part {
            kind: Kind::Call(kind),
            len: input.range.end.saturating_sub(input.range.start),
            epoch: self.shared.epoch,
            recorded,
            input: match refused {
                Some(why) => Input::Refused(why),
                None if recorded && !on_device => Input::Refused(
                    "records it into a capture window, which a host-staged group cannot: \
                     its bytes move through the host when the call runs, and a replay \
                     would not move them"
                        .to_owned(),
                ),
                None if !reads && on_device => Input::Ready,
                None if !reads => Input::Bytes(Vec::new()),
                None if on_device => self.ready(input, recorded),
                None => match self.client().read(input) {
                    Ok(bytes) => Input::Bytes(bytes),
                    Err(refused) if is_refusal(&refused) => {
                        Input::Refused(format!("could not read its input: {refused}"))
                    }
                    Err(failed) => Input::Failed(failed),
                },
            },
        };
        let outcome = self.meet_or_claim(part, Written::Output(output))?;
        match &*outcome {
            Outcome::Written(parts) => {
                if matches!(kind, Call::Broadcast { root } if root == self.rank) {
                    return Ok(());
                }
                self.client().write(output, &parts[self.rank])
            }
            Outcome::Agreed => self.issue(kind, input, output),
            Outcome::Refused(error) => Err(error.clone()),
            Outcome::Failed(error) => {
                self.client().fail_writing(&[output], error.clone())?;
                Err(error.clone())
            }
        }
    }
}
