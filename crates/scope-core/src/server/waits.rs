//! Waits that run with the server's lock released. They are counted, so a
//! recovery can wait them out. They see the device's fault, so none reports
//! work finished on a faulted device, as no driver does.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::error::Error;

/// How many waits run with the lock released ([`WaitToken`]), and the
/// fault that poisoned their device, if one did.
#[derive(Debug, Default)]
pub(crate) struct Waits {
    count: Mutex<usize>,
    ended: Condvar,
    /// The poison, read without the server's lock, which a blocked rank holds.
    fault: Mutex<Option<Arc<Error>>>,
}

impl Waits {
    /// The device faulted with `fault`, or recovered (`None`).
    pub(super) fn poisoned(&self, fault: Option<Arc<Error>>) {
        *self.fault.lock() = fault;
    }

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
    /// The device's fault: an injected one leaves its work running.
    pub(crate) fn device_fault(&self) -> Option<Arc<Error>> {
        self.0.as_ref().and_then(|waits| waits.fault.lock().clone())
    }

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
