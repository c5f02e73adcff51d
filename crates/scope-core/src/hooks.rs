//! The failure hook (rule 39), called once the lock is released: under it, a
//! hook calling the client deadlocks and a panic leaves bookkeeping half done.
//! A re-entrant lock serialises delivery; a panicking hook stays installed.

use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, ReentrantMutex};

use crate::error::Error;
use crate::id::StreamId;

/// A failure hook, as installed by [`Client::on_failure`](crate::Client::on_failure).
pub(crate) type Hook = Box<dyn FnMut(StreamId, &Error) + Send>;

/// The hook of one server and the events waiting for it.
#[derive(Default)]
pub(crate) struct Hooks {
    /// Whether a hook is installed: without one, events are not queued.
    installed: AtomicBool,
    /// Whether `events` may be non-empty: one atomic load on the success path.
    pending: AtomicBool,
    events: Mutex<VecDeque<(StreamId, Error)>>,
    hook: Mutex<Option<Hook>>,
    /// Held while delivering; the cell says whether this thread already is.
    delivering: ReentrantMutex<Cell<bool>>,
}

impl Hooks {
    pub(crate) fn install(&self, hook: Hook) {
        let old = self.hook.lock().replace(hook);
        self.installed.store(true, Ordering::Release);
        // An old hook may own a client; drop it outside the lock.
        drop(old);
    }

    /// Queue an event, if a hook is installed. Called under the server lock.
    pub(crate) fn queue(&self, stream: StreamId, error: &Error) {
        if !self.installed.load(Ordering::Acquire) {
            return;
        }
        self.events.lock().push_back((stream, error.clone()));
        self.pending.store(true, Ordering::Release);
    }

    fn next(&self) -> Option<(StreamId, Error)> {
        let mut events = self.events.lock();
        let event = events.pop_front();
        if events.is_empty() {
            self.pending.store(false, Ordering::Release);
        }
        event
    }

    /// Deliver the queued events, unlocked; only the check is inline.
    #[inline]
    pub(crate) fn deliver(&self) {
        if self.pending.load(Ordering::Acquire) {
            self.deliver_queued();
        }
    }

    #[inline(never)]
    fn deliver_queued(&self) {
        let delivering = self.delivering.lock();
        if delivering.get() {
            // Called from inside the hook: the outer loop delivers these.
            return;
        }
        delivering.set(true);
        let _reset = Reset(&delivering);
        while let Some((stream, error)) = self.next() {
            let Some(mut hook) = self.hook.lock().take() else {
                continue;
            };
            let outcome = catch_unwind(AssertUnwindSafe(|| hook(stream, &error)));
            // A hook installed meanwhile replaces this one, dropped outside the lock.
            let replaced = {
                let mut slot = self.hook.lock();
                if slot.is_none() {
                    *slot = Some(hook);
                    None
                } else {
                    Some(hook)
                }
            };
            drop(replaced);
            if let Err(panic) = outcome {
                resume_unwind(panic);
            }
        }
    }
}

/// Clears the "delivering" mark however delivery ends.
struct Reset<'a>(&'a Cell<bool>);

impl Drop for Reset<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}
