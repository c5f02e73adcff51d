//! Which devices this process's servers hold, so a reset never destroys another's memory.
//!
//! CUDA and HIP reset a device **for the whole process**. A server resets only through
//! [`reset_alone`], which refuses while another server holds the device. It keeps the
//! registry locked while the reset runs, and a server takes its hold before it first
//! touches the device, so one opening meanwhile waits.

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

    pub(crate) fn key(&self) -> Key {
        self.key
    }
}

/// Run `reset` under the registry's lock if no other server holds `key`, else say how many
/// do. `reset` must not make or drop a [`Holding`]: it would wait for itself.
fn alone<R>(key: Key, reset: impl FnOnce() -> R) -> Result<R, usize> {
    let holders = HOLDERS.lock();
    match others_in(&holders, key) {
        0 => Ok(reset()),
        others => Err(others),
    }
}

/// [`alone`] for a reset of `key` after `broken`, `what` naming it: [`Error::Refused`]
/// names the device, `broken` and the other holders.
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
                    held.send(resetting.load(Ordering::SeqCst)).unwrap();
                    hold
                });
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
