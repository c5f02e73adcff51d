//! The coordinator's contract, and the store that keeps it in memory.
//!
//! The trait is etcd's vocabulary, cut to what a launch needs. Its two
//! implementations, the embedded store and a real etcd, answer alike, so
//! the code above cannot tell which it has.
//!
//! - A **lease** is a worker's liveness. Its keys vanish unless it is kept
//!   alive, so a killed or stopped process drops out on its own.
//! - **Create** writes a key only where none is, and answers what it holds
//!   after. That is the one decision a change needs: the first proposal
//!   wins, and every proposer learns which (an etcd transaction).
//! - Put, get, list by prefix and delete are the rest.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::{JobError, Result};

/// A lease's id, as the coordinator numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease(pub i64);

/// Where a launch keeps what its workers share. Every call fails with
/// [`JobError::CoordinatorLost`] when it cannot be reached; a write with a
/// lapsed lease, with [`JobError::LeaseExpired`].
pub trait Coordinator: Send + Sync {
    /// Where the coordinator is, for messages.
    fn at(&self) -> String;
    /// A lease that lives `ttl` unless kept alive.
    fn grant(&self, ttl: Duration) -> Result<Lease>;
    /// Keeps `lease` alive for another of its time to live.
    fn keep_alive(&self, lease: Lease) -> Result<()>;
    /// Ends `lease` now, and every key bound to it.
    fn revoke(&self, lease: Lease) -> Result<()>;
    /// Writes `key`, bound to `lease` if given.
    fn put(&self, key: &str, value: &[u8], lease: Option<Lease>) -> Result<()>;
    /// Writes `key` unless it exists, and answers what it holds after.
    fn create(&self, key: &str, value: &[u8], lease: Option<Lease>) -> Result<Vec<u8>>;
    /// What `key` holds.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>>;
    /// Every key that starts with `prefix`, in key order.
    fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>>;
    /// Removes `key`, if it is there.
    fn delete(&self, key: &str) -> Result<()>;
}

/// What `key` holds once someone writes it, waited for at most `within`.
pub fn wait_for(coordinator: &dyn Coordinator, key: &str, within: Duration) -> Result<Vec<u8>> {
    let began = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(value) = coordinator.get(key)? {
            return Ok(value);
        }
        let waited = began.elapsed();
        if waited >= within {
            return Err(JobError::TimedOut {
                key: key.to_owned(),
                waited,
            });
        }
        std::thread::sleep(pause.min(within - waited));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// The most keys one store holds: a client that writes without end is
/// refused, not fed.
pub const MAX_KEYS: usize = 1 << 16;
/// The longest key.
pub const MAX_KEY: usize = 1 << 10;
/// The longest value.
pub const MAX_VALUE: usize = 1 << 18;
/// The most leases alive at once.
pub const MAX_LEASES: usize = 1 << 12;

/// The coordinator's state in memory: the launcher's own, served to its
/// workers by [`crate::embedded`].
#[derive(Default)]
pub struct Store {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    keys: BTreeMap<String, (Vec<u8>, Option<i64>)>,
    leases: HashMap<i64, (Duration, Instant)>,
    next: i64,
}

impl Inner {
    /// Drops leases past their time, and their keys; every call does this
    /// first, so a lapsed lease is never seen alive.
    fn expire(&mut self) {
        let now = Instant::now();
        let before = self.leases.len();
        self.leases.retain(|_, (_, until)| *until > now);
        if self.leases.len() != before {
            let leases = &self.leases;
            self.keys
                .retain(|_, (_, lease)| lease.is_none_or(|l| leases.contains_key(&l)));
        }
    }

    fn check(&self, key: &str, value: &[u8], lease: Option<Lease>) -> Result<()> {
        if key.len() > MAX_KEY || value.len() > MAX_VALUE {
            return Err(JobError::invalid(
                "key or value",
                format!(
                    "{} and {} bytes, past {MAX_KEY} and {MAX_VALUE}",
                    key.len(),
                    value.len()
                ),
            ));
        }
        if self.keys.len() >= MAX_KEYS && !self.keys.contains_key(key) {
            return Err(JobError::invalid(
                "key",
                format!("the store holds {MAX_KEYS} already"),
            ));
        }
        match lease {
            Some(l) if !self.leases.contains_key(&l.0) => Err(JobError::LeaseExpired),
            _ => Ok(()),
        }
    }
}

impl Store {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Coordinator for Store {
    fn at(&self) -> String {
        "this process".to_owned()
    }

    fn grant(&self, ttl: Duration) -> Result<Lease> {
        let mut s = self.inner.lock();
        s.expire();
        if s.leases.len() >= MAX_LEASES {
            return Err(JobError::invalid(
                "lease",
                format!("{MAX_LEASES} are alive already"),
            ));
        }
        s.next += 1;
        let id = s.next;
        s.leases.insert(id, (ttl, Instant::now() + ttl));
        Ok(Lease(id))
    }

    fn keep_alive(&self, lease: Lease) -> Result<()> {
        let mut s = self.inner.lock();
        s.expire();
        let (ttl, until) = s.leases.get_mut(&lease.0).ok_or(JobError::LeaseExpired)?;
        *until = Instant::now() + *ttl;
        Ok(())
    }

    fn revoke(&self, lease: Lease) -> Result<()> {
        let mut s = self.inner.lock();
        s.leases.remove(&lease.0);
        s.keys.retain(|_, (_, l)| *l != Some(lease.0));
        s.expire();
        Ok(())
    }

    fn put(&self, key: &str, value: &[u8], lease: Option<Lease>) -> Result<()> {
        let mut s = self.inner.lock();
        s.expire();
        s.check(key, value, lease)?;
        s.keys
            .insert(key.to_owned(), (value.to_vec(), lease.map(|l| l.0)));
        Ok(())
    }

    fn create(&self, key: &str, value: &[u8], lease: Option<Lease>) -> Result<Vec<u8>> {
        let mut s = self.inner.lock();
        s.expire();
        if let Some((held, _)) = s.keys.get(key) {
            return Ok(held.clone());
        }
        s.check(key, value, lease)?;
        s.keys
            .insert(key.to_owned(), (value.to_vec(), lease.map(|l| l.0)));
        Ok(value.to_vec())
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let mut s = self.inner.lock();
        s.expire();
        Ok(s.keys.get(key).map(|(v, _)| v.clone()))
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let mut s = self.inner.lock();
        s.expire();
        Ok(s.keys
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, (v, _))| (k.clone(), v.clone()))
            .collect())
    }

    fn delete(&self, key: &str) -> Result<()> {
        let mut s = self.inner.lock();
        s.expire();
        s.keys.remove(key);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Moves `lease`'s end to now, as if its time to live had passed with
    /// no renewal: the test then needs no clock, and no scheduler's favour.
    fn lapse(store: &Store, lease: Lease) {
        store.inner.lock().leases.get_mut(&lease.0).unwrap().1 = Instant::now();
    }

    #[test]
    fn a_lapsed_lease_takes_its_keys_and_a_kept_one_keeps_them() {
        let store = Store::new();
        let ttl = Duration::from_secs(60);
        let short = store.grant(ttl).unwrap();
        let kept = store.grant(ttl).unwrap();
        store.put("alive/0", b"a", Some(short)).unwrap();
        store.put("alive/1", b"b", Some(kept)).unwrap();
        store.put("job", b"c", None).unwrap();
        lapse(&store, short);
        // A renewal moves the end a whole time to live on.
        let renewed = Instant::now();
        store.keep_alive(kept).unwrap();
        assert!(store.inner.lock().leases[&kept.0].1 >= renewed + ttl);
        assert_eq!(store.get("alive/0").unwrap(), None);
        assert!(matches!(
            store.keep_alive(short),
            Err(JobError::LeaseExpired)
        ));
        assert!(matches!(
            store.put("late", b"", Some(short)),
            Err(JobError::LeaseExpired)
        ));
        let names: Vec<String> = store.list("").unwrap().into_iter().map(|e| e.0).collect();
        assert_eq!(names, ["alive/1", "job"]);
        store.revoke(kept).unwrap();
        assert_eq!(store.list("alive/").unwrap(), []);
    }

    #[test]
    fn a_lease_lapses_on_the_clock_too() {
        let store = Store::new();
        let lease = store.grant(Duration::from_millis(20)).unwrap();
        store.put("alive/0", b"a", Some(lease)).unwrap();
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(store.get("alive/0").unwrap(), None);
    }

    #[test]
    fn of_racing_creates_one_wins_and_every_racer_learns_which() {
        let store = std::sync::Arc::new(Store::new());
        let answers: Vec<Vec<u8>> = std::thread::scope(|s| {
            let racers: Vec<_> = (0..8u8)
                .map(|i| {
                    let store = &store;
                    s.spawn(move || store.create("decision/1", &[i], None).unwrap())
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let won = store.get("decision/1").unwrap().unwrap();
        assert!(answers.iter().all(|a| *a == won), "{answers:?}");
    }

    #[test]
    fn a_store_fed_without_end_refuses_and_does_not_grow() {
        let store = Store::new();
        for i in 0..MAX_KEYS {
            store.put(&i.to_string(), b"", None).unwrap();
        }
        assert!(matches!(
            store.put("one more", b"", None),
            Err(JobError::Invalid { .. })
        ));
        // An existing key may still be rewritten.
        store.put("0", b"again", None).unwrap();
        assert!(matches!(
            store.put("big", &vec![0; MAX_VALUE + 1], None),
            Err(JobError::Invalid { .. })
        ));
    }

    #[test]
    fn a_wait_ends_at_its_bound_naming_the_key() {
        let store = Store::new();
        let began = Instant::now();
        let waited = wait_for(&store, "never", Duration::from_millis(50));
        assert!(matches!(waited, Err(JobError::TimedOut { ref key, .. }) if key == "never"));
        assert!(began.elapsed() >= Duration::from_millis(50));
        store.put("soon", b"1", None).unwrap();
        assert_eq!(wait_for(&store, "soon", Duration::ZERO).unwrap(), b"1");
    }
}
