//! The one rendezvous of rounds and membership changes: ranks arrive with a
//! part, and one decision comes out (across processes, the ballot's).
//!
//! 1. A rank's `k`-th arrival meets its peers' `k`-th.
//! 2. The last awaited rank, or the first out of time, decides, once.
//! 3. A late comer gets the decision already made.
//! 4. A decision is forgotten once every rank took it, or past [`KEPT`]
//!    open meetings; a rank arriving at a forgotten one is told so.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// How many decided meetings a rank that never comes can leave open.
pub(super) const KEPT: usize = 8;

/// The meetings of one group, numbered per rank.
pub(super) struct Meeting<P, D> {
    /// Each rank's next meeting.
    next: Vec<u64>,
    open: BTreeMap<u64, Table<P, D>>,
    forgotten_below: u64,
}

struct Table<P, D> {
    parts: Vec<Option<P>>,
    came: Vec<bool>,
    decision: Option<Arc<D>>,
    taken: usize,
}

impl<P, D> Meeting<P, D> {
    pub(super) fn new(ranks: usize) -> Self {
        Self {
            next: vec![0; ranks],
            open: BTreeMap::new(),
            forgotten_below: 0,
        }
    }

    /// Rank `rank`'s next meeting number: the ballot's seat.
    pub(super) fn seat(&mut self, rank: usize) -> u64 {
        let number = self.next[rank];
        self.next[rank] += 1;
        number
    }

    /// The meeting rank `rank` came to last (0 before any).
    pub(super) fn last(&self, rank: usize) -> u64 {
        self.next[rank].saturating_sub(1)
    }

    /// Rank `rank` took meeting `number`'s decision: apply rule 4.
    fn took(&mut self, number: u64) {
        let ranks = self.next.len();
        if let Some(table) = self.open.get_mut(&number) {
            table.taken += 1;
            if table.taken >= ranks {
                self.open.remove(&number);
            }
        }
        while self.open.len() > KEPT {
            let taken_by_comers = |t: &Table<P, D>| {
                t.decision.is_some() && t.taken >= t.came.iter().filter(|c| **c).count()
            };
            let Some(&oldest) = self
                .open
                .iter()
                .find(|(_, t)| taken_by_comers(t))
                .map(|(n, _)| n)
            else {
                break;
            };
            self.open.remove(&oldest);
            self.forgotten_below = self.forgotten_below.max(oldest + 1);
        }
    }
}

/// What a meeting waits for and how it decides, over its state `S`.
pub(super) trait Agenda<S> {
    type Part;
    type Decision;
    /// Why a waiting rank leaves before any decision.
    type Leave;

    fn meeting<'s>(&self, state: &'s mut S) -> &'s mut Meeting<Self::Part, Self::Decision>;

    /// Whether the meeting waits for rank `rank`.
    fn awaits(&self, _state: &S, _rank: usize) -> bool {
        true
    }

    fn leave(&self, _state: &S) -> Option<Self::Leave> {
        None
    }

    /// The decision, from every rank's part (`None`: it did not come).
    fn decide(&self, state: &mut S, number: u64, parts: Vec<Option<Self::Part>>) -> Self::Decision;
}

/// How a rank left a meeting.
pub(super) enum Met<D, L> {
    Decided(Arc<D>),
    Forgotten(u64),
    Left(L),
}

/// Arrive with `part` and wait at most `deadline` for the decision.
pub(super) fn attend<S, A: Agenda<S>>(
    lock: &Mutex<S>,
    changed: &Condvar,
    agenda: &A,
    (rank, part): (usize, A::Part),
    deadline: Duration,
) -> Met<A::Decision, A::Leave> {
    let until = Instant::now() + deadline;
    let mut state = lock.lock();
    let meeting = agenda.meeting(&mut state);
    let number = meeting.seat(rank);
    if number < meeting.forgotten_below {
        return Met::Forgotten(number);
    }
    let ranks = meeting.next.len();
    let table = meeting.open.entry(number).or_insert_with(|| Table {
        parts: (0..ranks).map(|_| None).collect(),
        came: vec![false; ranks],
        decision: None,
        taken: 0,
    });
    table.came[rank] = true;
    if table.decision.is_none() {
        table.parts[rank] = Some(part);
    }
    let mut spins = 0;
    loop {
        let Some(table) = agenda.meeting(&mut state).open.get(&number) else {
            return Met::Forgotten(number);
        };
        if let Some(decision) = table.decision.clone() {
            agenda.meeting(&mut state).took(number);
            return Met::Decided(decision);
        }
        let came = table.came.clone();
        let all_here = (0..ranks).all(|r| came[r] || !agenda.awaits(&state, r));
        if !all_here && let Some(leave) = agenda.leave(&state) {
            return Met::Left(leave);
        }
        if all_here || Instant::now() >= until {
            let parts = agenda
                .meeting(&mut state)
                .open
                .get_mut(&number)
                .map(|t| std::mem::take(&mut t.parts))
                .unwrap_or_default();
            let decision = Arc::new(agenda.decide(&mut state, number, parts));
            if let Some(table) = agenda.meeting(&mut state).open.get_mut(&number) {
                table.decision = Some(decision);
            }
            changed.notify_all();
            continue;
        }
        if spins < SPINS {
            spins += 1;
            parking_lot::MutexGuard::unlocked(&mut state, std::thread::yield_now);
            continue;
        }
        let _ = changed.wait_until(&mut state, until);
    }
}

/// How many times a waiting rank yields before it sleeps, sparing a wake-up.
const SPINS: u32 = 64;

#[cfg(test)]
mod tests {
    use super::*;

    /// A meeting whose decision lists who came; rank 2 may be excused.
    struct Roll {
        excused: Option<usize>,
        decided: Mutex<usize>,
    }

    impl Agenda<Meeting<u32, Vec<Option<u32>>>> for Roll {
        type Part = u32;
        type Decision = Vec<Option<u32>>;
        type Leave = ();

        fn meeting<'s>(
            &self,
            state: &'s mut Meeting<u32, Vec<Option<u32>>>,
        ) -> &'s mut Meeting<u32, Vec<Option<u32>>> {
            state
        }

        fn awaits(&self, _: &Meeting<u32, Vec<Option<u32>>>, rank: usize) -> bool {
            self.excused != Some(rank)
        }

        fn decide(
            &self,
            _: &mut Meeting<u32, Vec<Option<u32>>>,
            _: u64,
            parts: Vec<Option<u32>>,
        ) -> Vec<Option<u32>> {
            *self.decided.lock() += 1;
            parts
        }
    }

    type Room = (Mutex<Meeting<u32, Vec<Option<u32>>>>, Condvar);

    fn room(ranks: usize) -> Room {
        (Mutex::new(Meeting::new(ranks)), Condvar::new())
    }

    fn roll(excused: Option<usize>) -> Roll {
        Roll {
            excused,
            decided: Mutex::new(0),
        }
    }

    fn go(room: &Room, roll: &Roll, rank: usize, deadline: Duration) -> (u64, Vec<Option<u32>>) {
        match attend(&room.0, &room.1, roll, (rank, rank as u32 * 10), deadline) {
            Met::Decided(d) => (room.0.lock().last(rank), (*d).clone()),
            Met::Forgotten(n) => panic!("meeting {n} forgotten"),
            Met::Left(()) => panic!("left"),
        }
    }

    const LONG: Duration = Duration::from_secs(30);

    #[test]
    fn every_rank_gets_the_one_decision_of_the_last_to_arrive() {
        let (room, roll) = (room(3), roll(None));
        let got: Vec<_> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..3)
                .map(|r| {
                    s.spawn({
                        let (room, roll) = (&room, &roll);
                        move || go(room, roll, r, LONG)
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let all = vec![Some(0), Some(10), Some(20)];
        assert!(got.iter().all(|g| *g == (0, all.clone())), "{got:?}");
        assert_eq!(*roll.decided.lock(), 1);
        assert!(room.0.lock().open.is_empty(), "taken by all: forgotten");
    }

    #[test]
    fn a_rank_that_never_comes_is_decided_without_at_the_deadline() {
        let (room, roll) = (room(3), roll(None));
        let started = Instant::now();
        let got = std::thread::scope(|s| {
            let patient = s.spawn(|| go(&room, &roll, 0, LONG));
            while room.0.lock().next[0] == 0 {
                std::thread::yield_now();
            }
            let hasty = go(&room, &roll, 1, Duration::from_millis(100));
            [hasty, patient.join().unwrap()]
        });
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(100) && elapsed < LONG);
        assert!(
            got.iter().all(|g| g.1 == vec![Some(0), Some(10), None]),
            "{got:?}"
        );
        assert_eq!(
            *roll.decided.lock(),
            1,
            "decided once, by the first out of time"
        );
    }

    #[test]
    fn a_late_comer_gets_the_decision_made_without_it() {
        let (room, roll) = (room(2), roll(None));
        let first = go(&room, &roll, 0, Duration::from_millis(10));
        assert_eq!(first, (0, vec![Some(0), None]));
        let late = go(&room, &roll, 1, LONG);
        assert_eq!(late, first, "its part is ignored");
        assert_eq!(*roll.decided.lock(), 1);
        assert!(room.0.lock().open.is_empty());
    }

    #[test]
    fn a_rank_not_awaited_is_not_waited_for() {
        let (room, roll) = (room(3), roll(Some(2)));
        let started = Instant::now();
        std::thread::scope(|s| {
            let other = s.spawn(|| go(&room, &roll, 1, LONG));
            assert_eq!(go(&room, &roll, 0, LONG).1, vec![Some(0), Some(10), None]);
            other.join().unwrap();
        });
        assert!(started.elapsed() < LONG);
    }

    #[test]
    fn meetings_a_rank_never_came_to_are_forgotten_past_kept() {
        let (room, roll) = (room(2), roll(Some(1)));
        for n in 0..KEPT as u64 + 3 {
            assert_eq!(go(&room, &roll, 0, LONG).0, n);
        }
        assert_eq!(room.0.lock().open.len(), KEPT);
        for n in 0..3 {
            let met = attend(&room.0, &room.1, &roll, (1, 0), LONG);
            assert!(matches!(met, Met::Forgotten(m) if m == n), "meeting {n}");
        }
        // Its next arrival meets the oldest still kept, as a late comer.
        assert_eq!(go(&room, &roll, 1, LONG), (3, vec![Some(0), None]));
        assert_eq!(room.0.lock().open.len(), KEPT - 1, "taken by both");
    }

    #[test]
    fn a_waiting_rank_leaves_when_told_to() {
        struct Closed;
        impl Agenda<Meeting<u32, ()>> for Closed {
            type Part = u32;
            type Decision = ();
            type Leave = &'static str;
            fn meeting<'s>(&self, s: &'s mut Meeting<u32, ()>) -> &'s mut Meeting<u32, ()> {
                s
            }
            fn leave(&self, _: &Meeting<u32, ()>) -> Option<&'static str> {
                Some("broken")
            }
            fn decide(&self, _: &mut Meeting<u32, ()>, _: u64, _: Vec<Option<u32>>) {}
        }
        let (lock, changed) = (Mutex::new(Meeting::new(2)), Condvar::new());
        assert!(matches!(
            attend(&lock, &changed, &Closed, (0, 1), LONG),
            Met::Left("broken")
        ));
    }
}
