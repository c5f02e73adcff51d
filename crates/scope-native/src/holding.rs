//! Which devices the servers of this process hold, so that a reset of one
//! never destroys another client's memory.
//!
//! CUDA's `cuDevicePrimaryCtxReset` and HIP's `hipDeviceReset` destroy
//! everything on a device **for the whole process**: every client of that
//! device shares its primary context. A server resets its lost device only
//! inside [`Holding::alone`], which refuses while another server holds the
//! device and keeps the registry locked while the reset runs: a server
//! opening the device on another thread meanwhile waits for the reset to
//! end, so it never makes anything the reset would destroy. A server takes
//! its hold *before* it first touches the device for the same reason.

use std::collections::BTreeMap;

use parking_lot::Mutex;
use scope_core::{Error, Result};

/// How many servers of this process hold each device, by API and ordinal.
static HOLDERS: Mutex<BTreeMap<(&'static str, usize), usize>> = Mutex::new(BTreeMap::new());

/// One server's hold on its device, counted while it lives.
#[derive(Debug)]
pub struct Holding {
    key: (&'static str, usize),
}

impl Holding {
    /// Hold device `ordinal` of `api` (`"cuda"`, `"hip"`).
    pub fn new(api: &'static str, ordinal: usize) -> Self {
        let key = (api, ordinal);
        *HOLDERS.lock().entry(key).or_insert(0) += 1;
        Self { key }
    }

    /// How many servers of this process hold the device besides this one.
    pub fn others(&self) -> usize {
        others_in(&HOLDERS.lock(), self.key)
    }

    /// Run `reset` if no other server of this process holds the device,
    /// with the registry locked throughout: no server can take a hold on
    /// any device until `reset` returns, so none is opened under it.
    /// `reset` must not make or drop a [`Holding`] (it would wait for
    /// itself).
    ///
    /// # Errors
    ///
    /// How many other servers hold the device, when any does; `reset` has
    /// not run.
    pub fn alone<R>(&self, reset: impl FnOnce() -> R) -> Result<R, usize> {
        let holders = HOLDERS.lock();
        match others_in(&holders, self.key) {
            0 => Ok(reset()),
            others => Err(others),
        }
    }
}

impl Holding {
    /// [`alone`](Self::alone) for a reset after `broken`, refused with
    /// [`Error::Refused`] naming the device, `broken` and how many other
    /// servers hold the device; `reset` is what `what` names ("a reset").
    ///
    /// # Errors
    ///
    /// The refusal above, or what `reset` answered.
    pub fn reset_alone<R>(
        &self,
        what: &str,
        broken: &Error,
        reset: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        let (api, ordinal) = self.key;
        self.alone(reset).map_err(|others| {
            Error::refused(format!(
                "{api} device {ordinal} cannot be reset after {broken}: {others} other client(s) \
                 of this process hold it, and {what} would destroy their memory; recover once \
                 they are dropped"
            ))
        })?
    }
}

fn others_in(
    holders: &BTreeMap<(&'static str, usize), usize>,
    key: (&'static str, usize),
) -> usize {
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

    #[test]
    fn holders_are_counted_per_api_and_device() {
        let a = Holding::new("test-api", 0);
        assert_eq!(a.others(), 0);
        let b = Holding::new("test-api", 0);
        let elsewhere = Holding::new("test-api", 1);
        let other_api = Holding::new("other-test-api", 0);
        assert_eq!(a.others(), 1);
        assert_eq!(elsewhere.others(), 0);
        assert_eq!(other_api.others(), 0);
        drop(b);
        assert_eq!(a.others(), 0);
    }

    #[test]
    fn alone_refuses_beside_another_holder_and_runs_when_alone() {
        let a = Holding::new("test-api-alone", 0);
        let b = Holding::new("test-api-alone", 0);
        assert_eq!(a.alone(|| "reset"), Err(1));
        drop(b);
        assert_eq!(a.alone(|| "reset"), Ok("reset"));
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
            let opened = a.alone(|| {
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
            assert_eq!(a.others(), 1);
            drop(other);
        });
    }
}
