//! One thread per process watches the device rounds in flight, as
//! ProcessGroupNCCL's watchdog does: a round returns once issued (rule 47),
//! yet what surfaces later still reaches every rank.
//!
//! 1. **One thread polls every part in flight**; a finished one is forgotten.
//! 2. **A part that faulted, or is late, fails its round on every rank.**
//!    Outputs are claimed before the communicators are aborted, so a peer
//!    released by the abort never reads the round's bytes as clean.
//!    And after earlier rounds' parts, which an abort would leave partial.
//! 3. **The group breaks** (rule 43).
//! 4. **Dropping a group waits for its rounds**, failing them at its deadline.
//! 5. **The thread drops nothing that can wait** (a server's sync, a
//!    communicator's destroy, a part's end): other threads do. So one busy
//!    device never delays another group's deadline.

use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{CollectiveError, Shared, State};
use crate::backend::Backend;
use crate::client::Client;
use crate::error::{Error, Result};
use crate::handle::{Buffer, Graph, Slice};
use crate::id::ByteRange;

/// How often the thread polls while anything is in flight.
const POLL: Duration = Duration::from_micros(500);

/// One rank's part of a round, as its transport watches it.
pub(super) trait Part: Send {
    /// `Ok(true)` once the part's device work finished; the stream's fault.
    fn finished(&mut self) -> Result<bool>;

    /// End the part's wait with what the poll found; called once.
    fn end(&mut self, waited: Result<()>);
}

/// Something the thread polls until it says it is done.
trait Watched: Send {
    /// Whether it is done, at `now`; never while its group is being dropped.
    fn poll(&mut self, now: Instant) -> bool;

    /// The id of the group it is watched for.
    fn group(&self) -> u64;

    /// [`poll`](Self::poll), by the drop of its group, `group`.
    fn poll_dropping(&mut self, group: &dyn Any, now: Instant) -> bool;
}

/// A thread's list and its wake-up: the watchdog's, or the reaper's.
struct Watchdog<T> {
    list: Mutex<Vec<T>>,
    added: Condvar,
    /// Held by a sweep, so the list is whole when a dropped group takes its own.
    sweep: Mutex<()>,
    /// Set when its thread could not start: nothing is kept, to grow unread.
    orphaned: AtomicBool,
}

static DOG: OnceLock<&'static Watchdog<Box<dyn Watched>>> = OnceLock::new();

/// Groups a poll holds, and drops handed to a thread of their own, not done.
static BACKGROUND: AtomicUsize = AtomicUsize::new(0);

/// Whether every group a poll held, and every drop handed to another thread,
/// was let go by `until`: what a drop gives back (its streams) comes soon,
/// not at once, and a test that counts it waits here.
#[doc(hidden)]
pub fn background_drops_done(until: Instant) -> bool {
    while BACKGROUND.load(Ordering::Acquire) > 0 {
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(POLL);
    }
    true
}

fn watchdog() -> &'static Watchdog<Box<dyn Watched>> {
    DOG.get_or_init(|| Watchdog::spawned("scope-watchdog", Watchdog::run))
}

fn reaper() -> &'static Watchdog<Box<dyn Send>> {
    static REAPER: OnceLock<&'static Watchdog<Box<dyn Send>>> = OnceLock::new();
    REAPER.get_or_init(|| {
        Watchdog::spawned("scope-reaper", |r| {
            loop {
                r.wait_for_entries();
                // Dropped after the lock is let go: a drop may take a while.
                let items = std::mem::take(&mut *r.list.lock());
                let n = items.len();
                drop(items);
                BACKGROUND.fetch_sub(n, Ordering::Release);
            }
        })
    })
}

impl<T: Send + 'static> Watchdog<T> {
    fn spawned(name: &str, run: fn(&'static Self)) -> &'static Self {
        let dog: &'static Self = Box::leak(Box::new(Self {
            list: Mutex::new(Vec::new()),
            added: Condvar::new(),
            sweep: Mutex::new(()),
            orphaned: AtomicBool::new(false),
        }));
        let spawned = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || run(dog));
        if let Err(error) = spawned {
            tracing::error!("no {name} thread: {error}");
            dog.orphaned.store(true, Ordering::Relaxed);
        }
        dog
    }

    /// Return once the list is not empty.
    fn wait_for_entries(&self) {
        let mut list = self.list.lock();
        while list.is_empty() {
            self.added.wait(&mut list);
        }
    }

    fn add(&self, items: impl IntoIterator<Item = T>) {
        if self.orphaned.load(Ordering::Relaxed) {
            return;
        }
        self.list.lock().extend(items);
        self.added.notify_one();
    }
}

/// Hand `items` to the reaper, counted until dropped.
fn reap(items: Vec<Box<dyn Send>>) {
    let reaper = reaper();
    if !reaper.orphaned.load(Ordering::Relaxed) {
        BACKGROUND.fetch_add(items.len(), Ordering::AcqRel);
        reaper.add(items);
    }
}

impl Watchdog<Box<dyn Watched>> {
    fn run(&'static self) {
        loop {
            self.wait_for_entries();
            // The sweep's lock before the list's entries: a group dropped
            // meanwhile takes its entries before them, or after the sweep.
            let sweep = self.sweep.lock();
            let mut taken = std::mem::take(&mut *self.list.lock());
            // Polled without the list's lock: a poll may claim or abort.
            let now = Instant::now();
            let done: Vec<_> = taken.extract_if(.., |watched| watched.poll(now)).collect();
            let empty = {
                let mut list = self.list.lock();
                list.append(&mut taken);
                list.is_empty()
            };
            drop(sweep);
            if !done.is_empty() {
                reap(done.into_iter().map(|d| d as Box<dyn Send>).collect());
            }
            if !empty {
                std::thread::sleep(POLL);
            }
        }
    }

    /// Take out every entry watched for `group`, after the sweep under way.
    fn extract(&self, group: u64) -> Vec<Box<dyn Watched>> {
        let _sweep = self.sweep.lock();
        let mut list = self.list.lock();
        list.extract_if(.., |watched| watched.group() == group)
            .collect()
    }
}

/// A part in flight, as the group remembers it to claim its output.
pub(super) struct Flight<B: Backend> {
    pub(super) round: u64,
    pub(super) rank: usize,
    /// The rank's own client: the output's, and the stream that reads it.
    pub(super) client: Client<B>,
    /// The rank's stream's in-flight mark at issue: what came after.
    pub(super) mark: u64,
    /// Still inside its issue, maybe holding its server's lock in a
    /// transport that blocks: its own rank claims it (`fail_in_flight`).
    pub(super) issuing: bool,
    pub(super) writes: Writes,
}

/// What a part in flight writes, to claim if its round fails.
pub(super) enum Writes {
    /// A call's output range.
    Output(Buffer, ByteRange),
    /// Whatever a replayed graph writes.
    Graph(Graph),
}

/// The watchdog's entry for one part: it holds its group weakly, so the
/// group's drop is where its user lets go, and waits for its parts.
struct Watch<B: Backend> {
    group: Weak<Shared<B>>,
    /// The group's id: its drop may run where `Arc::into_inner` moved it.
    key: u64,
    round: u64,
    rank: usize,
    collective: &'static str,
    part: Box<dyn Part>,
    /// What the poll found, for the part's end on the reaper: an end takes
    /// the server's lock, held by a rank blocked in an issue until an abort.
    ended: Option<Result<()>>,
    until: Instant,
}

impl<B: Backend> Drop for Watch<B> {
    fn drop(&mut self) {
        if let Some(waited) = self.ended.take() {
            self.part.end(waited);
        }
    }
}

impl<B: Backend> Watched for Watch<B> {
    fn poll(&mut self, now: Instant) -> bool {
        BACKGROUND.fetch_add(1, Ordering::AcqRel);
        let done = self.group.upgrade().is_some_and(|shared| {
            let done = self.poll_on(&shared, now);
            if let Some(last) = Arc::into_inner(shared) {
                drop_elsewhere(last);
            }
            done
        });
        BACKGROUND.fetch_sub(1, Ordering::Release);
        done
    }

    fn group(&self) -> u64 {
        self.key
    }

    fn poll_dropping(&mut self, group: &dyn Any, now: Instant) -> bool {
        group
            .downcast_ref::<Shared<B>>()
            .is_none_or(|shared| self.poll_on(shared, now))
    }
}

impl<B: Backend> Watch<B> {
    fn poll_on(&mut self, shared: &Shared<B>, now: Instant) -> bool {
        if shared.failed_from(self.round) {
            // The failing part claimed this one's output before its abort.
            shared.landed(self.rank, self.round);
            return self.end(Ok(()));
        }
        let error = match self.part.finished() {
            Ok(true) => {
                shared.landed(self.rank, self.round);
                return self.end(Ok(()));
            }
            Ok(false) => match shared.gone(false) {
                Some(missing) => self.missing(shared, missing),
                None if now < self.until => return false,
                None => match shared.gone(true) {
                    Some(missing) => self.missing(shared, missing),
                    None => CollectiveError::Stalled {
                        collective: self.collective,
                        round: self.round,
                        deadline: shared.deadline,
                    },
                },
            },
            Err(cause) => {
                let seat = (self.rank, self.round);
                match super::round::blame(self.collective, seat, shared.deadline, cause) {
                    // A peer's abort: a gone rank is why, if one is known.
                    stalled @ CollectiveError::Stalled { .. } => shared
                        .gone(true)
                        .map_or(stalled, |missing| self.missing(shared, missing)),
                    error => error,
                }
            }
        };
        shared.fail_in_flight(self.round, &error);
        shared.landed(self.rank, self.round);
        self.end(Err(error.into()))
    }

    /// `Missing` naming `missing`, waited since the part was issued.
    fn missing(&self, shared: &Shared<B>, missing: Vec<usize>) -> CollectiveError {
        let issued = self
            .until
            .checked_sub(shared.deadline)
            .unwrap_or(self.until);
        super::remote::missing_since((self.collective, self.round), missing, issued)
    }

    fn end(&mut self, waited: Result<()>) -> bool {
        self.ended = Some(waited);
        true
    }
}

/// Drop a group whose last handle a poll held, on a thread of its own. Its
/// drop may wait on a device, or for this very sweep. It keeps its late
/// rounds' deadlines, so it must not queue behind the reaper's drops.
fn drop_elsewhere<B: Backend>(last: Shared<B>) {
    let slot = Arc::new(Mutex::new(Some(last)));
    let theirs = Arc::clone(&slot);
    BACKGROUND.fetch_add(1, Ordering::AcqRel);
    let spawned = std::thread::Builder::new()
        .name("scope-group-drop".to_owned())
        .spawn(move || {
            drop(theirs.lock().take());
            BACKGROUND.fetch_sub(1, Ordering::Release);
        });
    if let Err(error) = spawned {
        tracing::error!("no thread to drop a group on ({error}): the reaper drops it");
        if let Some(last) = slot.lock().take() {
            reap(vec![Box::new(last) as Box<dyn Send>]);
        }
        BACKGROUND.fetch_sub(1, Ordering::Release);
    }
}

impl<B: Backend> Drop for Shared<B> {
    /// Rounds in flight run to their end or their deadline, failed there
    /// as the watchdog would: a read through a client kept past the group
    /// never waits on a late peer, and no communicator is destroyed busy.
    fn drop(&mut self) {
        let Some(dog) = DOG.get() else {
            return;
        };
        let mut mine = dog.extract(self.id);
        while !mine.is_empty() {
            let now = Instant::now();
            mine.retain_mut(|watched| !watched.poll_dropping(&*self, now));
            if !mine.is_empty() {
                std::thread::sleep(POLL);
            }
        }
    }
}

impl<B: Backend> Shared<B> {
    /// Watch `part` until it finishes, fails or outlives the deadline.
    pub(super) fn watch(
        self: &Arc<Self>,
        (rank, round, collective): (usize, u64, &'static str),
        part: Box<dyn Part>,
    ) {
        watchdog().add([Box::new(Watch {
            group: Arc::downgrade(self),
            key: self.id,
            round,
            rank,
            collective,
            part,
            ended: None,
            until: Instant::now() + self.deadline,
        }) as Box<dyn Watched>]);
    }

    /// Remember `flight` before its part is issued, so a round failing in
    /// flight claims its output; refused once its round failed.
    ///
    /// # Errors
    ///
    /// What failed the round, which this rank's part must not join.
    pub(super) fn take_off(&self, flight: Flight<B>) -> Result<()> {
        let mut state = self.state.lock();
        if let Some(cause) = failure_from(&state, flight.round) {
            return Err(cause);
        }
        state.flights.push(flight);
        Ok(())
    }

    /// What failed round `round`, or one before it, in flight.
    pub(super) fn failed_in_flight(&self, round: u64) -> Option<Error> {
        failure_from(&self.state.lock(), round)
    }

    /// Whether round `round`, or one before it, failed in flight.
    fn failed_from(&self, round: u64) -> bool {
        marked(&self.state.lock(), round)
    }

    /// Rank `rank`'s part of `round` went out: whoever fails it claims it.
    pub(super) fn issued(&self, rank: usize, round: u64) {
        let mut state = self.state.lock();
        for flight in &mut state.flights {
            if flight.rank == rank && flight.round == round {
                flight.issuing = false;
            }
        }
    }

    /// Rank `rank`'s part of round `round` is no longer in flight.
    pub(super) fn landed(&self, rank: usize, round: u64) {
        let mut state = self.state.lock();
        state.flights.retain(|f| f.rank != rank || f.round != round);
        self.abort_if_due(&mut state);
        if state.flights.is_empty() && state.failing == 0 {
            self.all_landed.notify_all();
        }
    }

    /// Wait until no part is in flight, or `until`: shrink no busy communicator.
    pub(super) fn wait_landed(&self, until: Instant) {
        let mut state = self.state.lock();
        while !state.flights.is_empty() || state.failing > 0 {
            if self.all_landed.wait_until(&mut state, until).timed_out() {
                tracing::warn!(
                    "{} parts still in flight past the deadline at a membership change",
                    state.flights.len()
                );
                return;
            }
        }
    }

    /// Round `round` failed in flight: break the group, claim every later
    /// part's output and the work after it, then abort the communicators.
    pub(super) fn fail_in_flight(&self, round: u64, error: &CollectiveError) {
        let flights = {
            let mut state = self.state.lock();
            let first = state.failed_from.map_or(round, |f| f.min(round));
            state.failed_from = Some(first);
            let (mut failed, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut state.flights)
                .into_iter()
                .partition(|f| f.round >= first);
            state.flights = kept;
            // A part still issuing claims its own output once its issue
            // returns; claiming it here could wait on its server's lock.
            failed.retain(|f| !f.issuing);
            state.failing += 1;
            merge_due(&mut state, AbortDue::before(first));
            // The cause is kept with the mark: a part that sees the mark
            // before the claims below are done claims with it.
            if state.broken.is_none() {
                tracing::warn!("{error}");
                state.broken = Some(Arc::new(error.clone()));
                self.changed.notify_all();
            }
            failed
        };
        let failure: Error = error.clone().into();
        for flight in &flights {
            // A freed output or graph has nothing left to claim.
            let _ = match &flight.writes {
                Writes::Output(buffer, range) => {
                    let output = Slice {
                        buffer,
                        range: *range,
                    };
                    flight.client.fail_writing(&[output], failure.clone())
                }
                Writes::Graph(graph) => flight.client.fail_graph(graph, failure.clone()),
            };
            let _ = flight
                .client
                .fail_in_flight_since(flight.mark, failure.clone());
        }
        let mut state = self.state.lock();
        state.failing -= 1;
        self.abort_if_due(&mut state);
        if state.failing == 0 && state.flights.is_empty() {
            self.all_landed.notify_all();
        }
    }

    /// Abort once claims are done and rounds before `round` landed.
    pub(super) fn abort_after_claims(&self, round: u64) {
        let mut state = self.state.lock();
        self.abort_once_landed(&mut state, AbortDue::before(round));
    }

    /// Abort as `due` says, once nothing it would end unclaimed is left.
    pub(super) fn abort_once_landed(&self, state: &mut State<B>, due: AbortDue) {
        merge_due(state, due);
        self.abort_if_due(state);
    }

    /// Abort if due, unclaimed and no earlier part is on a stream (one
    /// inside its issue may wait for it); under the lock, as claims are.
    fn abort_if_due(&self, state: &mut State<B>) {
        let Some(due) = state.abort_due else {
            return;
        };
        let earlier = |f: &Flight<B>| f.round < due.before && !f.issuing;
        if state.failing > 0 || state.flights.iter().any(earlier) {
            return;
        }
        state.abort_due = None;
        if let Some(device) = &self.device {
            if due.every {
                device.abort_all();
            } else {
                device.break_off();
            }
        }
    }
}

/// An abort waiting for parts of rounds before `before`, which finish or fail in time.
#[derive(Clone, Copy)]
pub(super) struct AbortDue {
    before: u64,
    /// Every communicator, or only across processes ([`Mover::break_off`](super::device::Mover::break_off)).
    every: bool,
}

impl AbortDue {
    /// The abort a round failing in flight, `round`, needs.
    fn before(round: u64) -> Self {
        Self {
            before: round,
            every: true,
        }
    }

    /// The abort a rank that never came needs: after every part here.
    pub(super) fn break_off() -> Self {
        Self {
            before: u64::MAX,
            every: false,
        }
    }
}

/// Keep one abort: the earliest round, and every communicator if either says so.
fn merge_due<B: Backend>(state: &mut State<B>, due: AbortDue) {
    state.abort_due = Some(match state.abort_due {
        None => due,
        Some(kept) => AbortDue {
            before: kept.before.min(due.before),
            every: kept.every || due.every,
        },
    });
}

/// What failed round `round`, or one before it, in flight, under `state`.
fn failure_from<B: Backend>(state: &State<B>, round: u64) -> Option<Error> {
    if !marked(state, round) {
        return None;
    }
    Some(state.broken.clone().map_or_else(
        || Error::internal("a round failed in flight with no cause kept"),
        |broken| (*broken).clone().into(),
    ))
}

/// Whether round `round`, or one before it, is marked failed in flight.
fn marked<B: Backend>(state: &State<B>, round: u64) -> bool {
    state.failed_from.is_some_and(|first| first <= round)
}
