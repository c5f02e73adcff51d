//! cubecl's communication between devices (`ServerCommunication`), over
//! [`scope_core::collective`].
//!
//! cubecl queues one part per device and returns at once, as NCCL does. A scope
//! [`Rank`](scope_core::collective::Rank) call blocks until every rank arrives. On the device
//! thread it could wait forever for a peer queued behind a third device's transfer. So each
//! server hands its parts to two threads of its own, one for collectives and one for incoming
//! transfers. What a part touches stays *pending*: later calls on those buffers wait for it,
//! and `sync` waits for every part. So work queued after a collective sees its result.
//!
//! The failure rules are scope's (`docs/ERROR_MODEL.md` 41–46). Two are the adapter's, for
//! cubecl's contract:
//!
//! - **A refusal taints the destination.** cubecl queues parts fire-and-forget, so the
//!   destination is the only place to hear a refusal.
//! - **A failed part breaks its group.** Every rank saw the same outcome, so all break the
//!   group at the same round (`test_a_failed_part_breaks_its_group`).
//!
//! Bytes move through the host, staged through each device's [`Client`]. scope moves whole
//! words, cubecl any bytes, so each chunk is padded to words and trimmed on the way out.

use std::any::{Any, TypeId};
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::Instant;

use cubecl_common::device::DeviceId;
use cubecl_core::ir::{ElemType, FloatKind, IntKind, UIntKind};
use cubecl_environment::backtrace::BackTrace;
use cubecl_environment::stream::StreamId;
use cubecl_runtime::memory_management::ManagedMemoryId;
use cubecl_runtime::server::{DeviceTransport, ReduceOperation, ServerError};
use parking_lot::{Condvar, Mutex};
use scope_core::collective::{
    CollectiveError, DEFAULT_DEADLINE, Element, Group, Rank, Reduce, copy_across,
};
use scope_core::{Buffer, Client, Error};
use smallvec::SmallVec;

use crate::backend::CubeBackend;
use crate::error::external;

/// cubecl's element types that are scope's, which a group reduces.
const ELEMENTS: [(ElemType, Element); 10] = [
    (ElemType::Float(FloatKind::F32), Element::F32),
    (ElemType::Float(FloatKind::F16), Element::F16),
    (ElemType::Float(FloatKind::BF16), Element::BF16),
    (ElemType::Float(FloatKind::F64), Element::F64),
    (ElemType::Int(IntKind::I8), Element::I8),
    (ElemType::Int(IntKind::I32), Element::I32),
    (ElemType::Int(IntKind::I64), Element::I64),
    (ElemType::UInt(UIntKind::U8), Element::U8),
    (ElemType::UInt(UIntKind::U32), Element::U32),
    (ElemType::UInt(UIntKind::U64), Element::U64),
];

/// The element types a group reduces: every one [`ELEMENTS`] maps.
pub(crate) fn transport() -> DeviceTransport {
    DeviceTransport {
        reduces: ELEMENTS.iter().map(|(dtype, _)| *dtype).collect(),
    }
}

/// What a device's collectives and transfers did since the process started: evidence that a
/// test moved bytes rather than returned early.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommunicationCounts {
    /// Collective parts this device took part in, whatever their outcome.
    pub collective_parts: u64,
    /// Transfers this device sent (`to_client`), refused ones included.
    pub transfers_sent: u64,
    /// Transfers this device received, whatever their outcome.
    pub transfers_received: u64,
}

const MAX_COUNTED: usize = 64;

struct Counters {
    parts: [AtomicU64; MAX_COUNTED],
    sent: [AtomicU64; MAX_COUNTED],
    transfers: [AtomicU64; MAX_COUNTED],
}

static COUNTERS: Counters = Counters {
    parts: [const { AtomicU64::new(0) }; MAX_COUNTED],
    sent: [const { AtomicU64::new(0) }; MAX_COUNTED],
    transfers: [const { AtomicU64::new(0) }; MAX_COUNTED],
};

/// What device `index` of any scope runtime did so far; devices past the 64th are not counted.
pub fn communication_counts(index: u16) -> CommunicationCounts {
    let i = usize::from(index);
    if i >= MAX_COUNTED {
        return CommunicationCounts::default();
    }
    CommunicationCounts {
        collective_parts: COUNTERS.parts[i].load(Ordering::Relaxed),
        transfers_sent: COUNTERS.sent[i].load(Ordering::Relaxed),
        transfers_received: COUNTERS.transfers[i].load(Ordering::Relaxed),
    }
}

fn count(counters: &[AtomicU64; MAX_COUNTED], device: DeviceId) {
    if let Some(counter) = counters.get(usize::from(device.index_id)) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether a part has finished.
#[derive(Default)]
struct Done {
    finished: Mutex<bool>,
    changed: Condvar,
}

impl Done {
    fn finish(&self) {
        *self.finished.lock() = true;
        self.changed.notify_all();
    }

    fn is_finished(&self) -> bool {
        *self.finished.lock()
    }

    fn wait(&self) {
        let mut finished = self.finished.lock();
        while !*finished {
            self.changed.wait(&mut finished);
        }
    }
}

/// Finishes its part however the job ends, a panic included, or later calls would hang.
struct Finish(Arc<Done>);

impl Drop for Finish {
    fn drop(&mut self) {
        self.0.finish();
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// A thread running one device's parts of one kind, in the order queued.
struct Worker {
    jobs: mpsc::Sender<Job>,
}

impl Worker {
    fn new(name: String) -> Self {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                // Ends when the server, the only sender, is dropped.
                while let Ok(job) = queue.recv() {
                    job();
                }
            })
            .expect("spawning a communication thread");
        Self { jobs }
    }

    fn run(&self, job: Job) {
        let _ = self.jobs.send(job);
    }
}

/// A group as every member's server shares it.
struct Joined<B: CubeBackend> {
    group: Group<B>,
    /// The first failed part's error, once one failed.
    broken: Mutex<Option<Error>>,
}

/// A send waiting for its receive.
enum Sent<B: CubeBackend> {
    Bytes {
        from: Client<B>,
        src: Owned,
        /// Earlier parts on the sender that touch the source.
        after: Vec<Arc<Done>>,
        /// Finishes the send's part once the bytes are read, or the receive
        /// drops them.
        done: Finish,
    },
    /// The sender refused: the receive's destination carries this.
    Refused(ServerError),
}

/// The sends each (sender, receiver) pair has not received yet, in order.
type Mailboxes<B> = HashMap<(DeviceId, DeviceId), VecDeque<Sent<B>>>;

/// What every server of backend `B` shares.
struct Shared<B: CubeBackend> {
    groups: Mutex<HashMap<Vec<DeviceId>, Arc<Joined<B>>>>,
    mail: Mutex<Mailboxes<B>>,
    arrived: Condvar,
}

fn shared<B: CubeBackend>() -> Arc<Shared<B>> {
    type AnyShared = Arc<dyn Any + Send + Sync>;
    static ALL: OnceLock<Mutex<HashMap<TypeId, AnyShared>>> = OnceLock::new();
    let mut all = ALL.get_or_init(Default::default).lock();
    let entry = all.entry(TypeId::of::<B>()).or_insert_with(|| {
        Arc::new(Shared::<B> {
            groups: Mutex::new(HashMap::new()),
            mail: Mutex::new(HashMap::new()),
            arrived: Condvar::new(),
        })
    });
    entry
        .clone()
        .downcast::<Shared<B>>()
        .expect("one shared state per backend type")
}

/// A cubecl range of a buffer, owned so a part can outlive the call.
#[derive(Clone)]
pub(crate) struct Owned {
    pub(crate) buffer: Buffer,
    /// Whole words.
    pub(crate) words: Range<u64>,
    /// Where cubecl's bytes start within them.
    pub(crate) skip: usize,
    /// How many bytes cubecl names.
    pub(crate) len: usize,
    pub(crate) memory: ManagedMemoryId,
}

impl Owned {
    pub(crate) fn slice(&self) -> scope_core::Slice<'_> {
        self.buffer.slice(self.words.clone())
    }

    /// Read cubecl's bytes.
    pub(crate) fn read<B: CubeBackend>(&self, client: &Client<B>) -> scope_core::Result<Vec<u8>> {
        let words = client.read(self.slice())?;
        Ok(words[self.skip..self.skip + self.len].to_vec())
    }

    /// Write cubecl's bytes, keeping the words' other bytes.
    fn write<B: CubeBackend>(&self, client: &Client<B>, bytes: &[u8]) -> scope_core::Result<()> {
        let words = (self.words.end - self.words.start) as usize;
        if self.skip == 0 && bytes.len() == words {
            return client.write(self.slice(), bytes);
        }
        // The bytes around cubecl's in the first and last words; a range
        // whose old bytes do not read is written over with zeros there.
        let mut all = client.read(self.slice()).unwrap_or_else(|_| vec![0; words]);
        all[self.skip..self.skip + bytes.len()].copy_from_slice(bytes);
        client.write(self.slice(), &all)
    }
}

/// What a collective does, as one rank calls it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    AllReduce(Element, Reduce),
    AllGather,
    ReduceScatter(Element, Reduce),
    Broadcast { root: usize },
    AllToAll,
}

impl Kind {
    /// How many equal chunks a rank's input is cut into, each padded to
    /// whole words on its own.
    fn input_chunks(self, ranks: usize) -> usize {
        match self {
            Kind::AllToAll => ranks,
            _ => 1,
        }
    }

    /// How many equal chunks a rank's output holds.
    fn output_chunks(self, ranks: usize) -> usize {
        match self {
            Kind::AllGather | Kind::AllToAll => ranks,
            _ => 1,
        }
    }
}

/// The element and combination a reduction of `dtype` by `op` is, when
/// scope reduces it.
pub(crate) fn reduction(dtype: ElemType, op: ReduceOperation) -> Option<(Element, Reduce)> {
    let (_, element) = ELEMENTS.iter().find(|(known, _)| *known == dtype)?;
    let op = match op {
        ReduceOperation::Sum => Reduce::Sum,
        ReduceOperation::Mean => Reduce::Mean,
    };
    Some((*element, op))
}

/// `bytes` in `chunks` equal chunks, each padded with zeros to whole words.
fn pad(bytes: &[u8], chunks: usize) -> Vec<u8> {
    let chunk = bytes.len() / chunks;
    let padded = chunk.div_ceil(4).max(1) * 4;
    let mut out = vec![0; padded * chunks];
    for (i, part) in bytes.chunks(chunk.max(1)).take(chunks).enumerate() {
        out[i * padded..i * padded + part.len()].copy_from_slice(part);
    }
    out
}

/// `padded` in `chunks` equal padded chunks, each cut back to `chunk` bytes.
fn unpad(padded: &[u8], chunks: usize, chunk: usize) -> Vec<u8> {
    let width = padded.len() / chunks;
    padded
        .chunks(width)
        .flat_map(|part| &part[..chunk])
        .copied()
        .collect()
}

fn generic(reason: String) -> ServerError {
    ServerError::Generic {
        reason,
        backtrace: BackTrace::capture(),
    }
}

/// One server's side of the communication.
pub(crate) struct Communication<B: CubeBackend> {
    device: DeviceId,
    shared: Arc<Shared<B>>,
    collectives: Worker,
    transfers: Worker,
    /// Parts not known to have finished.
    pending: Vec<Pending>,
}

/// A part not known to have finished.
struct Pending {
    done: Arc<Done>,
    /// The memory it reads or writes.
    memory: Vec<ManagedMemoryId>,
    /// The cubecl stream that queued it.
    stream: StreamId,
}

/// Parts a call waits for before it runs.
#[derive(Default)]
pub(crate) struct Waits(Vec<Arc<Done>>);

impl Waits {
    /// Whether there is nothing to wait for.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Wait for every one.
    pub(crate) fn wait(self) {
        for done in self.0 {
            done.wait();
        }
    }
}

impl<B: CubeBackend> Communication<B> {
    pub(crate) fn new(device: DeviceId) -> Self {
        let name = |what: &str| format!("{} {what} {}", B::RUNTIME_NAME, device.index_id);
        Self {
            device,
            shared: shared::<B>(),
            collectives: Worker::new(name("collectives")),
            transfers: Worker::new(name("transfers")),
            pending: Vec::new(),
        }
    }

    /// The pending parts that touch `memory`, or that `stream` queued when
    /// there is one: what a call on them waits for.
    pub(crate) fn waits(
        &mut self,
        memory: impl IntoIterator<Item = ManagedMemoryId>,
        stream: Option<StreamId>,
    ) -> Waits {
        self.pending.retain(|pending| !pending.done.is_finished());
        if self.pending.is_empty() {
            return Waits::default();
        }
        let memory: SmallVec<[ManagedMemoryId; 8]> = memory.into_iter().collect();
        Waits(
            self.pending
                .iter()
                .filter(|pending| {
                    Some(pending.stream) == stream
                        || pending.memory.iter().any(|id| memory.contains(id))
                })
                .map(|pending| pending.done.clone())
                .collect(),
        )
    }

    /// Wait, on the device thread, for the pending parts that touch
    /// `memory`.
    pub(crate) fn settle(&mut self, memory: impl IntoIterator<Item = ManagedMemoryId>) {
        self.waits(memory, None).wait();
    }

    /// The pending parts touching `memory`, which a new part waits for.
    fn after(&mut self, memory: &[ManagedMemoryId]) -> Vec<Arc<Done>> {
        self.waits(memory.iter().copied(), None).0
    }

    fn track(&mut self, memory: Vec<ManagedMemoryId>, stream: StreamId) -> Arc<Done> {
        let done = Arc::new(Done::default());
        self.pending.push(Pending {
            done: done.clone(),
            memory,
            stream,
        });
        done
    }

    /// The group over `device_ids`, made on its first use by any member.
    fn joined(&self, device_ids: &[DeviceId]) -> Result<Arc<Joined<B>>, ServerError> {
        let mut groups = self.shared.groups.lock();
        if let Some(joined) = groups.get(device_ids) {
            return Ok(joined.clone());
        }
        let mut clients = Vec::with_capacity(device_ids.len());
        for &id in device_ids {
            let client = crate::runtime::opened::<B>(id).ok_or_else(|| {
                generic(format!(
                    "{}: device {id:?} of the group was never opened",
                    B::RUNTIME_NAME
                ))
            })?;
            clients.push(client);
        }
        let group =
            Group::new(clients, DEFAULT_DEADLINE).map_err(|e| crate::error::to_server_error(&e))?;
        let joined = Arc::new(Joined {
            group,
            broken: Mutex::new(None),
        });
        groups.insert(device_ids.to_vec(), joined.clone());
        Ok(joined)
    }

    /// `comm_init`: the group, made now if no member made it yet.
    pub(crate) fn init(&self, device_ids: &[DeviceId]) -> Result<(), ServerError> {
        self.rank_in(device_ids)?;
        self.joined(device_ids).map(drop)
    }

    fn rank_in(&self, device_ids: &[DeviceId]) -> Result<usize, ServerError> {
        for (i, id) in device_ids.iter().enumerate() {
            if device_ids[..i].contains(id) {
                return Err(generic(format!(
                    "{id:?} appears twice among a collective's devices, which need one rank each"
                )));
            }
        }
        device_ids
            .iter()
            .position(|id| *id == self.device)
            .ok_or_else(|| {
                generic(format!(
                    "{:?} is not among the collective's devices {device_ids:?}",
                    self.device
                ))
            })
    }

    /// Queue this device's part of a collective. `src` is `None` only for a
    /// broadcast's non-root ranks. `client` is the device's stream-0 client.
    pub(crate) fn collective(
        &mut self,
        kind: Kind,
        src: Option<Owned>,
        dst: Owned,
        device_ids: &[DeviceId],
        client: Client<B>,
        stream: StreamId,
    ) -> Result<(), ServerError> {
        let rank = self.rank_in(device_ids)?;
        let joined = self.joined(device_ids)?;
        let ranks = device_ids.len();
        let mut memory = vec![dst.memory];
        memory.extend(src.as_ref().map(|src| src.memory));
        let after = self.after(&memory);
        let done = self.track(memory, stream);
        let device = self.device;
        self.collectives.run(Box::new(move || {
            let _finish = Finish(done);
            for earlier in after {
                earlier.wait();
            }
            run_part(&joined, rank, ranks, kind, src.as_ref(), &dst, &client);
            count(&COUNTERS.parts, device);
        }));
        Ok(())
    }

    /// `send`: hand `src` to the receive `to` queues for it.
    pub(crate) fn send(
        &mut self,
        src: Result<(Owned, Client<B>), ServerError>,
        to: DeviceId,
        stream: StreamId,
    ) {
        let sent = match src {
            Ok((src, from)) => {
                let after = self.after(&[src.memory]);
                let done = Finish(self.track(vec![src.memory], stream));
                Sent::Bytes {
                    from,
                    src,
                    after,
                    done,
                }
            }
            Err(error) => Sent::Refused(error),
        };
        count(&COUNTERS.sent, self.device);
        let mut mail = self.shared.mail.lock();
        mail.entry((self.device, to)).or_default().push_back(sent);
        self.shared.arrived.notify_all();
    }

    /// `recv`: write what `from` sends into `dst`, once it is sent. A
    /// destination that could not be made still takes its send, so the
    /// pair's later transfers stay paired.
    pub(crate) fn recv(
        &mut self,
        dst: Option<Owned>,
        from: DeviceId,
        client: Client<B>,
        stream: StreamId,
    ) {
        let memory: Vec<_> = dst.iter().map(|dst| dst.memory).collect();
        let after = self.after(&memory);
        let done = self.track(memory, stream);
        let shared = self.shared.clone();
        let device = self.device;
        self.transfers.run(Box::new(move || {
            let _finish = Finish(done);
            for earlier in after {
                earlier.wait();
            }
            let sent = take(&shared, (from, device));
            if let Some(dst) = dst {
                receive(sent, &dst, &client, from);
                count(&COUNTERS.transfers, device);
            }
        }));
    }
}

/// The next send on `pair`, or `None` after the deadline.
fn take<B: CubeBackend>(shared: &Shared<B>, pair: (DeviceId, DeviceId)) -> Option<Sent<B>> {
    let until = Instant::now() + DEFAULT_DEADLINE;
    let mut mail = shared.mail.lock();
    loop {
        if let Some(sent) = mail.get_mut(&pair).and_then(VecDeque::pop_front) {
            return Some(sent);
        }
        if shared.arrived.wait_until(&mut mail, until).timed_out() {
            return mail.get_mut(&pair).and_then(VecDeque::pop_front);
        }
    }
}

fn receive<B: CubeBackend>(sent: Option<Sent<B>>, dst: &Owned, to: &Client<B>, from_id: DeviceId) {
    let fail = |error: Error| {
        if let Err(e) = to.fail_writing(&[dst.slice()], error) {
            tracing::warn!(%e, "could not claim a failed transfer's destination");
        }
    };
    match sent {
        None => fail(external(generic(format!(
            "no send from {from_id:?} arrived within {DEFAULT_DEADLINE:?}"
        )))),
        Some(Sent::Refused(error)) => fail(external(error)),
        Some(Sent::Bytes {
            from,
            src,
            after,
            done,
        }) => {
            let _done = done;
            for earlier in after {
                earlier.wait();
            }
            if src.len != dst.len {
                return fail(external(generic(format!(
                    "{} bytes sent for a {}-byte destination",
                    src.len, dst.len
                ))));
            }
            let same_words = src.skip == 0
                && dst.skip == 0
                && src.words.end - src.words.start == dst.words.end - dst.words.start;
            if same_words {
                // Rule 46 as scope states it: the destination carries a
                // failure naming the device the bytes came from.
                if let Err(e) = copy_across(&from, src.slice(), to, dst.slice()) {
                    tracing::debug!(%e, "a transfer's source could not be read");
                }
                return;
            }
            match src.read(&from) {
                Ok(bytes) => {
                    if let Err(e) = dst.write(to, &bytes) {
                        tracing::debug!(%e, "a transfer's destination could not be written");
                    }
                }
                Err(cause) => fail(
                    CollectiveError::SourceFailed {
                        from: format!("{} ({})", B::NAME, from.describe()),
                        cause,
                    }
                    .into(),
                ),
            }
        }
    }
}

/// One rank's part, on its collectives thread.
fn run_part<B: CubeBackend>(
    joined: &Joined<B>,
    rank: usize,
    ranks: usize,
    kind: Kind,
    src: Option<&Owned>,
    dst: &Owned,
    client: &Client<B>,
) {
    let fail = |error: Error| {
        if let Err(e) = client.fail_writing(&[dst.slice()], error) {
            tracing::warn!(%e, "could not claim a failed collective's destination");
        }
    };
    if let Some(cause) = joined.broken.lock().clone() {
        return fail(external(generic(format!(
            "the group is broken by an earlier failed part, so this part never ran: {cause}"
        ))));
    }
    let chunks_in = kind.input_chunks(ranks);
    let chunks_out = kind.output_chunks(ranks);
    // A broadcast's non-root ranks bring as many bytes, never read.
    let len = src.map_or(dst.len, |src| src.len);
    let (input, failed) = match src.map(|src| src.read(client)) {
        Some(Ok(bytes)) => (pad(&bytes, chunks_in), None),
        Some(Err(error)) => (pad(&vec![0; len], chunks_in), Some(error)),
        None => (pad(&vec![0; len], chunks_in), None),
    };
    let staged = client.upload(&input).and_then(|staged| {
        if let Some(error) = failed {
            // The staged copy carries what the input carried, so the group
            // decides on it as on any input that fails to read.
            client.fail_writing(&[staged.slice(..)], error)?;
        }
        Ok(staged)
    });
    let staged = match staged {
        Ok(staged) => staged,
        Err(error) => return fail(error),
    };
    let padded_chunk = input.len() / chunks_in;
    let out_len = match kind {
        Kind::ReduceScatter(..) => input.len() / ranks,
        _ => padded_chunk * chunks_out,
    } as u64;
    let output = match kind {
        Kind::Broadcast { .. } => Ok(staged.clone()),
        _ => client.allocate(out_len),
    };
    let output = match output {
        Ok(output) => output,
        Err(error) => return fail(error),
    };
    let result = joined
        .group
        .rank(rank)
        .and_then(|member: Rank<B>| match kind {
            Kind::AllReduce(element, op) => {
                member.all_reduce(staged.slice(..), output.slice(..), element, op)
            }
            Kind::ReduceScatter(element, op) => {
                member.reduce_scatter(staged.slice(..), output.slice(..), element, op)
            }
            Kind::AllGather => member.all_gather(staged.slice(..), output.slice(..)),
            Kind::AllToAll => member.all_to_all(staged.slice(..), output.slice(..)),
            Kind::Broadcast { root } => member.broadcast(root, staged.slice(..)),
        });
    let written = result.and_then(|()| {
        let padded = client.read(output.slice(..))?;
        let chunk = dst.len / chunks_out;
        dst.write(client, &unpad(&padded, chunks_out, chunk))
    });
    if let Err(error) = written {
        if matches!(&error, Error::Collective(c) if matches!(**c, CollectiveError::InputFailed { .. }))
        {
            joined.broken.lock().get_or_insert_with(|| error.clone());
        }
        fail(error);
    }
    let _ = client.free(&staged);
    if !matches!(kind, Kind::Broadcast { .. }) {
        let _ = client.free(&output);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_pad_to_words_and_back() {
        let bytes = [1, 2, 3, 4, 5, 6];
        let padded = pad(&bytes, 2);
        assert_eq!(padded, [1, 2, 3, 0, 4, 5, 6, 0]);
        assert_eq!(unpad(&padded, 2, 3), bytes);
        assert_eq!(pad(&[1, 2, 3, 4], 1), [1, 2, 3, 4]);
        assert_eq!(
            pad(&[9, 8, 7, 6], 4),
            [9, 0, 0, 0, 8, 0, 0, 0, 7, 0, 0, 0, 6, 0, 0, 0]
        );
    }
}
