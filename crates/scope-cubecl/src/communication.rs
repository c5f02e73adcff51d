//! cubecl's communication between devices (`ServerCommunication`), over
//! [`scope_core::collective`]: its collectives and its point-to-point.
//!
//! cubecl queues one part per device and returns at once, as NCCL does. A scope
//! [`Rank`](scope_core::collective::Rank) call blocks until its peers arrive. On the device
//! thread it could wait forever for a peer queued behind a third device's transfer. So each
//! server runs its parts on threads of its own. One runs collectives, one incoming transfers,
//! and one per device it sends to. So a send waits neither behind a receive nor behind a send
//! elsewhere. What a part touches stays *pending*: later calls on those buffers wait for it.
//!
//! A collective is a [`Group`](scope_core::collective::Group) over its devices. A transfer is
//! [`Rank::send`] and [`Rank::recv`] in a group of its two devices. scope's mailbox keeps the
//! pair's order and answers for a silent peer, so this module keeps none.
//!
//! The failure rules are scope's (`docs/ERROR_MODEL.md` 41–48). Two are the adapter's, for
//! cubecl's contract:
//!
//! - **A refusal taints the destination.** cubecl queues parts fire-and-forget, so the
//!   destination is the only place to hear a refusal. A refused send sends its refusal.
//! - **A failed part breaks its group.** Every rank saw the same outcome, so all break the
//!   group at the same round (`test_a_failed_part_breaks_its_group`).
//!
//! Bytes move through the host, staged through each device's [`Client`]. scope moves whole
//! words, cubecl any bytes, so each chunk is padded to words and trimmed on the way out.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, mpsc};

use cubecl_common::device::DeviceId;
use cubecl_core::ir::{ElemType, FloatKind, IntKind, UIntKind};
use cubecl_environment::backtrace::BackTrace;
use cubecl_environment::stream::StreamId;
use cubecl_runtime::memory_management::ManagedMemoryId;
use cubecl_runtime::server::{DeviceTransport, ReduceOperation, ServerError};
use scope_core::collective::{CollectiveError, Element, Rank, Reduce};
use scope_core::{Buffer, Client, Error};
use smallvec::SmallVec;

use crate::backend::CubeBackend;
use crate::error::{external, to_server_error};
use crate::peers::{Joined, PeerError};

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

/// Whether a part has finished. A once-cell blocks its waiters until set: no condvar needed.
#[derive(Default)]
struct Done(OnceLock<()>);

impl Done {
    fn finish(&self) {
        let _ = self.0.set(());
    }

    fn is_finished(&self) -> bool {
        self.0.get().is_some()
    }

    fn wait(&self) {
        self.0.wait();
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

/// A group that could not be made, as cubecl hears it.
fn peer_error(error: PeerError) -> ServerError {
    match error {
        PeerError::Group(error) => to_server_error(&error),
        other => generic(other.to_string()),
    }
}

/// Whether [`Rank::send`] refused before sending anything (rule 38).
fn nothing_sent(error: &Error) -> bool {
    matches!(error, Error::InvalidArgument { .. } | Error::Refused { .. })
}

/// Whether [`Rank::recv`] claimed its destination with `error`. Its refusals claim nothing.
fn claimed_by_recv(error: &Error) -> bool {
    match error {
        Error::InvalidArgument { .. } | Error::Refused { .. } => false,
        Error::Collective(collective) => !matches!(
            **collective,
            CollectiveError::Refused { .. }
                | CollectiveError::Broken { .. }
                | CollectiveError::Stale { .. }
        ),
        _ => true,
    }
}

/// One server's side of the communication.
pub(crate) struct Communication<B: CubeBackend> {
    device: DeviceId,
    collectives: Worker,
    /// Incoming transfers, in the order cubecl queued their receives.
    transfers: Worker,
    /// Outgoing transfers, one thread per receiving device, each in the order queued.
    sends: HashMap<DeviceId, Worker>,
    /// Parts not known to have finished.
    pending: Vec<Pending>,
    _backend: std::marker::PhantomData<fn() -> B>,
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
        Self {
            device,
            collectives: Worker::new(Self::thread_name(device, "collectives")),
            transfers: Worker::new(Self::thread_name(device, "transfers")),
            sends: HashMap::new(),
            pending: Vec::new(),
            _backend: std::marker::PhantomData,
        }
    }

    fn thread_name(device: DeviceId, what: &str) -> String {
        format!("{} {what} {}", B::RUNTIME_NAME, device.index_id)
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
        B::peers().group(device_ids).map_err(peer_error)
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

    /// `send`: `src`, or its refusal, to `to`'s receive, on this device's thread for `to`.
    ///
    /// # Errors
    ///
    /// No pair of ranks: a transfer to itself, or to a device never opened. The receive finds
    /// the same, so neither end waits.
    pub(crate) fn send(
        &mut self,
        src: Result<Owned, ServerError>,
        to: DeviceId,
        stream: StreamId,
    ) -> Result<(), ServerError> {
        count(&COUNTERS.sent, self.device);
        let pair = B::peers().pair(self.device, to).map_err(peer_error)?;
        let memory: Vec<_> = src.iter().map(|src| src.memory).collect();
        let after = self.after(&memory);
        let done = self.track(memory, stream);
        let device = self.device;
        let thread = self
            .sends
            .entry(to)
            .or_insert_with(|| Worker::new(Self::thread_name(device, "sends")));
        thread.run(Box::new(move || {
            let _finish = Finish(done);
            for earlier in after {
                earlier.wait();
            }
            match pair.rank(0) {
                Ok(sender) => send_part(&sender, src),
                Err(e) => tracing::warn!(%e, "a transfer group without its sender"),
            }
        }));
        Ok(())
    }

    /// `recv`: what `from` sends, into `dst`. Without a destination it still takes the send,
    /// so later transfers stay paired.
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
        let pair = B::peers().pair(from, self.device);
        let device = self.device;
        self.transfers.run(Box::new(move || {
            let _finish = Finish(done);
            for earlier in after {
                earlier.wait();
            }
            let receiver = pair
                .map_err(peer_error)
                .and_then(|pair| pair.rank(1).map_err(|e| to_server_error(&e)));
            match (receiver, dst) {
                (Ok(receiver), Some(dst)) => {
                    receive(&receiver, &dst);
                    count(&COUNTERS.transfers, device);
                }
                (Ok(receiver), None) => discard(&receiver),
                (Err(error), Some(dst)) => {
                    claim(&client, &dst, external(error), "transfer");
                    count(&COUNTERS.transfers, device);
                }
                (Err(_), None) => {}
            }
        }));
    }
}

/// Claim `dst` with `error`: the one place a queued part can report it.
fn claim<B: CubeBackend>(client: &Client<B>, dst: &Owned, error: Error, part: &str) {
    if let Err(e) = client.fail_writing(&[dst.slice()], error) {
        tracing::warn!(%e, "could not claim a failed {part}'s destination");
    }
}

/// One send: a header word, the byte length or (claimed) the refusal, then cubecl's bytes as
/// words. Padded, a 5-byte and a 6-byte transfer move alike: the header tells them apart.
fn send_part<B: CubeBackend>(sender: &Rank<B>, src: Result<Owned, ServerError>) {
    let payload = src
        .map_err(external)
        .and_then(|src| staged_bytes(sender.client(), &src).map(|staged| (src, staged)));
    match payload {
        Err(refusal) => {
            send_header(sender, Err(refusal));
        }
        Ok((src, staged)) => {
            // Bytes without their header would be read as one.
            if send_header(sender, Ok(src.len)) {
                // A send that fails here broke the pair, so its receive fails too: none waits.
                let sent = match &staged {
                    Some(staged) => sender.send(1, staged.slice(..)),
                    None => sender.send(1, src.slice()),
                };
                if let Err(e) = sent {
                    tracing::warn!(%e, "a transfer's bytes could not be sent");
                }
            }
            if let Some(staged) = staged {
                let _ = sender.client().free(&staged);
            }
        }
    }
}

/// `src`'s bytes as whole words: its own words where it starts on one (`None`), else a staged
/// copy, which carries the source's failure where reading it failed. Only a refusal is an error.
fn staged_bytes<B: CubeBackend>(
    client: &Client<B>,
    src: &Owned,
) -> scope_core::Result<Option<Buffer>> {
    if src.skip == 0 {
        return Ok(None);
    }
    match src.read(client) {
        Ok(bytes) => Ok(Some(client.upload(&pad(&bytes, 1))?)),
        Err(refused) if nothing_sent(&refused) => Err(refused),
        Err(failed) => {
            let staged = client.upload(&pad(&vec![0; src.len], 1))?;
            client.fail_writing(&[staged.slice(..)], failed)?;
            Ok(Some(staged))
        }
    }
}

/// Send the header: the byte length, or a word claimed with the refusal. Whether it went.
fn send_header<B: CubeBackend>(sender: &Rank<B>, header: Result<usize, Error>) -> bool {
    let client = sender.client();
    let word = match header {
        Ok(len) => client.upload(&(len as u32).to_le_bytes()),
        Err(refusal) => client.upload(&[0; 4]).and_then(|word| {
            client.fail_writing(&[word.slice(..)], refusal)?;
            Ok(word)
        }),
    };
    match word {
        Ok(word) => {
            let sent = sender.send(1, word.slice(..));
            let _ = client.free(&word);
            match sent {
                Err(e) if nothing_sent(&e) => {
                    tracing::warn!(%e, "a transfer's header could not reach its receive");
                    false
                }
                _ => true,
            }
        }
        Err(e) => {
            tracing::warn!(%e, "a transfer's header could not be made");
            false
        }
    }
}

/// Take the next header: the sender's byte length, or what the destination is to carry (the
/// sender's refusal, or the pair's failure). After an error no bytes follow.
fn take_header<B: CubeBackend>(receiver: &Rank<B>) -> scope_core::Result<usize> {
    let client = receiver.client();
    let word = client.allocate(4)?;
    let header = receiver
        .recv(0, word.slice(..))
        .and_then(|()| client.read(word.slice(..)));
    let _ = client.free(&word);
    let header = header?;
    Ok(u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize)
}

/// One receive: into `dst` when the sender's length is its own, else the bytes are taken and
/// dropped and `dst` carries the mismatch.
fn receive<B: CubeBackend>(receiver: &Rank<B>, dst: &Owned) {
    let unclaimed = match take_header(receiver) {
        Err(error) => Some(error),
        Ok(len) if len != dst.len => {
            drop_bytes(receiver, len);
            Some(Error::invalid(
                "transfer",
                format!(
                    "{len} bytes were sent to a destination of {} bytes",
                    dst.len
                ),
            ))
        }
        Ok(_) => receive_bytes(receiver, dst),
    };
    if let Some(error) = unclaimed {
        claim(receiver.client(), dst, error, "transfer");
    }
}

/// The bytes into `dst`: in place when it is whole words, else through a trimmed staged copy.
/// The error that did not claim `dst`, if one came.
fn receive_bytes<B: CubeBackend>(receiver: &Rank<B>, dst: &Owned) -> Option<Error> {
    let client = receiver.client();
    if dst.skip == 0 && dst.len.is_multiple_of(4) {
        return receiver
            .recv(0, dst.slice())
            .err()
            .filter(|error| !claimed_by_recv(error));
    }
    // Whatever fails here claimed the staged copy, not `dst`.
    let staged = client.allocate(pad(&vec![0; dst.len], 1).len() as u64);
    staged
        .and_then(|staged| {
            let got = receiver
                .recv(0, staged.slice(..))
                .and_then(|()| client.read(staged.slice(..)));
            let _ = client.free(&staged);
            dst.write(client, &got?[..dst.len])
        })
        .err()
}

/// Take `len` bytes' worth of words and drop them, so later transfers stay paired.
fn drop_bytes<B: CubeBackend>(receiver: &Rank<B>, len: usize) {
    let client = receiver.client();
    match client.allocate(pad(&vec![0; len], 1).len() as u64) {
        Ok(scratch) => {
            // Any answer will do: the bytes are taken either way.
            let _ = receiver.recv(0, scratch.slice(..));
            let _ = client.free(&scratch);
        }
        Err(e) => tracing::warn!(%e, "a transfer's bytes were left untaken"),
    }
}

/// Take the next send whole and drop it: a receive without a destination.
fn discard<B: CubeBackend>(receiver: &Rank<B>) {
    if let Ok(len) = take_header(receiver) {
        drop_bytes(receiver, len);
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
    let fail = |error: Error| claim(client, dst, error, "collective");
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
