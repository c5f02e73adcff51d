//! The failure hook, called after the server's lock is released.
//!
//! A failure hook (rule 39) exists to tell a measurement in flight that a
//! failure happened; the natural thing for it to do next is to ask the
//! client something (`failures_seen`, `failures_held`) or to tell another
//! part of the runtime, which may issue work. Called under the server's
//! lock, any of that deadlocks, and a hook that panics part-way through an
//! operation leaves that operation's bookkeeping half done. So the server
//! only *queues* the event, under its lock, after its bookkeeping for the
//! event is complete; the client that made the call delivers queued events
//! once it has released the lock, before returning to the caller.
//!
//! Delivery is serialised by a re-entrant lock, so one hook (an `FnMut`)
//! never runs on two threads at once and another thread's events wait for
//! the hook rather than piling up: a thread returns from its call only after
//! the events it caused have been delivered (or are being delivered by
//! another thread that holds the hook). A hook that calls back into the
//! client re-enters on the same thread; the events that call causes are
//! delivered by the outer delivery loop, after the hook returns, so the hook
//! never runs inside itself.
//!
//! A hook that panics unwinds out of the client call that delivered the
//! event — the operation's bookkeeping is already complete — and stays
//! installed; events not yet delivered stay queued for the next call.

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
    /// Whether `events` may be non-empty, so delivery costs one atomic load
    /// on the success path.
    pending: AtomicBool,
    events: Mutex<VecDeque<(StreamId, Error)>>,
    hook: Mutex<Option<Hook>>,
    /// Held while delivering; the cell says whether this thread already is.
    delivering: ReentrantMutex<Cell<bool>>,
}

impl Hooks {
    /// Install `hook`, replacing any earlier one.
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

    /// Deliver the queued events. Called with the server lock released,
    /// after every call: the check is inline, the delivery is not.
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
            // A hook installed while this one ran replaces it; the one it
            // replaced is dropped outside the lock.
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

/// Clears the "delivering" mark however delivery ends, a panic included.
struct Reset<'a>(&'a Cell<bool>);

impl Drop for Reset<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}
