//! Which devices the servers of this process hold, so that a reset of one
//! never destroys another client's memory.
//!
//! CUDA's `cuDevicePrimaryCtxReset` and HIP's `hipDeviceReset` reset a
//! device **for the whole process**. A server resets only through
//! [`reset_alone`], which refuses while another server holds the device.
//! It keeps the registry locked while the reset runs, so a server opening
//! the device meanwhile waits. A server takes its hold before it first
//! touches the device, for the same reason.

use std::collections::BTreeMap;

use parking_lot::Mutex;
use scope_core::{Error, Result};

/// A device, by API and ordinal.
pub(crate) type Key = (&'static str, usize);

/// How many servers of this process hold each device.
static HOLDERS: Mutex<BTreeMap<Key, usize>> = Mutex::new(BTreeMap::new());

/// One server's hold on its device, counted while it lives.
#[derive(Debug)]
pub struct Holding {
    key: Key,
}

impl Holding {
    /// Hold device `ordinal` of `api` (`"cuda"`, `"hip"`).
    pub fn new(api: &'static str, ordinal: usize) -> Self {
        let key = (api, ordinal);
        *HOLDERS.lock().entry(key).or_insert(0) += 1;
        Self { key }
    }

    /// The device held.
    pub(crate) fn key(&self) -> Key {
        self.key
    }
}

/// Run `reset` if no other server holds `key`, with the registry locked
/// throughout. `reset` must not make or drop a [`Holding`]: it would wait
/// for itself. Otherwise, how many other servers hold it.
fn alone<R>(key: Key, reset: impl FnOnce() -> R) -> Result<R, usize> {
    let holders = HOLDERS.lock();
    match others_in(&holders, key) {
        0 => Ok(reset()),
        others => Err(others),
    }
}

/// [`alone`] for a reset of `key` after `broken`; `what` names the reset
/// in the refusal.
///
/// # Errors
///
/// [`Error::Refused`] naming the device, `broken` and how many other
/// servers hold it; or what `reset` answered.
pub(crate) fn reset_alone<R>(
    key: Key,
    what: &str,
    broken: &Error,
    reset: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let (api, ordinal) = key;
    alone(key, reset).map_err(|others| {
        Error::refused(format!(
            "{api} device {ordinal} cannot be reset after {broken}: {others} other client(s) \
             of this process hold it, and {what} would destroy their memory; recover once \
             they are dropped"
        ))
    })?
}

fn others_in(holders: &BTreeMap<Key, usize>, key: Key) -> usize {
    holders.get(&key).map_or(0, |n| n.saturating_sub(1))
}

impl Drop for Holding {
    fn drop(&mut self) {
        let mut holders = HOLDERS.lock();
        if let Some(n) = holders.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                holders.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn others(holding: &Holding) -> usize {
        others_in(&HOLDERS.lock(), holding.key())
    }

    #[test]
    fn holders_are_counted_per_api_and_device() {
        let a = Holding::new("test-api", 0);
        assert_eq!(others(&a), 0);
        let b = Holding::new("test-api", 0);
        let elsewhere = Holding::new("test-api", 1);
        let other_api = Holding::new("other-test-api", 0);
        assert_eq!(others(&a), 1);
        assert_eq!(others(&elsewhere), 0);
        assert_eq!(others(&other_api), 0);
        drop(b);
        assert_eq!(others(&a), 0);
    }

    #[test]
    fn alone_refuses_beside_another_holder_and_runs_when_alone() {
        let a = Holding::new("test-api-alone", 0);
        let b = Holding::new("test-api-alone", 0);
        assert_eq!(alone(a.key(), || "reset"), Err(1));
        drop(b);
        assert_eq!(alone(a.key(), || "reset"), Ok("reset"));
    }

    /// A server opening the device while a reset runs waits for it: the
    /// hold it takes first cannot be taken until the reset returns.
    #[test]
    fn a_hold_taken_during_a_reset_waits_for_it_to_end() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::mpsc;
        use std::time::Duration;

        let a = Holding::new("test-api-race", 0);
        let resetting = AtomicBool::new(false);
        let (held, seen) = mpsc::channel();
        std::thread::scope(|s| {
            let opened = alone(a.key(), || {
                resetting.store(true, Ordering::SeqCst);
                let opening = s.spawn(|| {
                    let hold = Holding::new("test-api-race", 0);
                    // Taken only once `alone` has let the registry go.
                    held.send(resetting.load(Ordering::SeqCst)).unwrap();
                    hold
                });
                // However long the reset takes, the hold is not taken
                // during it.
                assert!(seen.recv_timeout(Duration::from_millis(100)).is_err());
                resetting.store(false, Ordering::SeqCst);
                opening
            });
            let opening = opened.expect("alone: no other holder yet");
            assert!(!seen.recv().unwrap(), "taken after the reset");
            let other = opening.join().unwrap();
            assert_eq!(others(&a), 1);
            drop(other);
        });
    }
}
