//! Waits that run with the server's lock released, counted so that a
//! recovery can wait them out before it gives the device up.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// How many waits run with the lock released ([`WaitToken`]).
#[derive(Debug, Default)]
pub(crate) struct Waits {
    count: Mutex<usize>,
    ended: Condvar,
}

impl Waits {
    pub(super) fn begin(&self) {
        *self.count.lock() += 1;
    }

    pub(super) fn end(&self) {
        let mut count = self.count.lock();
        *count -= 1;
        if *count == 0 {
            self.ended.notify_all();
        }
    }

    pub(super) fn any(&self) -> bool {
        *self.count.lock() > 0
    }

    pub(crate) fn wait_out(&self, until: Instant) {
        let mut count = self.count.lock();
        while *count > 0 {
            if self.ended.wait_until(&mut count, until).timed_out() {
                return;
            }
        }
    }
}

/// One unlocked wait in flight, which `Server::recover` waits out.
pub(crate) struct WaitToken(Option<Arc<Waits>>);

impl WaitToken {
    pub(super) fn new(waits: &Arc<Waits>, waiting: bool) -> Self {
        if !waiting {
            return Self(None);
        }
        waits.begin();
        Self(Some(waits.clone()))
    }
}

impl Drop for WaitToken {
    fn drop(&mut self) {
        if let Some(waits) = &self.0 {
            waits.end();
        }
    }
}
