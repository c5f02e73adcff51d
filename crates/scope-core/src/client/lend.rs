//! Lending the locked server to a caller's closure, and answering the calls
//! that closure makes back into a client of the same server.
//!
//! [`Client::with_backend`](crate::Client::with_backend) and
//! [`Client::with_memory`](crate::Client::with_memory) run the caller's
//! closure under the server's lock, which is not re-entrant: a closure that
//! calls any client of the same server would wait for a lock its own thread
//! holds, for good. Failure hooks avoid this by running after the lock is
//! released; these closures cannot, since they borrow what the lock guards.
//!
//! So while a closure runs, the server is *lent*: [`Lent`] records which
//! thread holds it and where the server is. A call on that thread that finds
//! the lock taken asks here before it waits. A call that only looks (a
//! count, a limit, another `with_backend`) is answered from the lent server
//! — a shared borrow beside the closure's own, and nothing can change it
//! while the lock is held. A call that would change the server gets a typed
//! error instead: it cannot have `&mut` to what the closure still borrows.
//!
//! The check costs nothing on the common path: a call asks here only after
//! `try_lock` failed, which on the lending thread it always does, and on any
//! other thread means it is about to wait anyway.

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// A number no other live thread has; 0 is no thread.
fn this_thread() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static THIS: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    THIS.with(|this| *this)
}

/// Which thread has the server lent to a closure, and the server.
pub(crate) struct Lent<T> {
    thread: AtomicU64,
    server: AtomicPtr<T>,
}

impl<T> Default for Lent<T> {
    fn default() -> Self {
        Self {
            thread: AtomicU64::new(0),
            server: AtomicPtr::new(std::ptr::null_mut()),
        }
    }
}

impl<T> Lent<T> {
    /// Whether a closure on this thread has the server.
    pub(crate) fn is_here(&self) -> bool {
        // Only this thread ever stores its own number: no other thread's
        // store can make this true, so no ordering is needed.
        self.thread.load(Ordering::Relaxed) == this_thread()
    }

    /// Run `f` on the server a closure on this thread was lent, or hand `f`
    /// back when there is none.
    pub(crate) fn here<R, F: FnOnce(&T) -> R>(&self, f: F) -> Result<R, F> {
        if !self.is_here() {
            return Err(f);
        }
        let server = self.server.load(Ordering::Relaxed);
        // SAFETY: this thread's number is in `thread` only while a
        // `Lending` made by `lend` on this thread lives, and `lend` stored
        // `server` from a shared reference that outlives that `Lending`
        // (both are in the lending frame, below this one on this thread's
        // stack). While it lives the server is only shared-borrowed — by
        // the closure and by this — and the lock that guards it is held, so
        // nothing writes it. The reference does not escape `f`.
        Ok(f(unsafe { &*server }))
    }

    /// Lend `server` to a closure about to run on this thread; the lending
    /// ends when the returned value drops (on unwind too).
    pub(crate) fn lend<'a>(&'a self, server: &'a T) -> Lending<'a, T> {
        self.server
            .store(std::ptr::from_ref(server).cast_mut(), Ordering::Relaxed);
        self.thread.store(this_thread(), Ordering::Relaxed);
        Lending(self)
    }
}

/// A lending in force; see [`Lent::lend`].
pub(crate) struct Lending<'a, T>(&'a Lent<T>);

impl<T> Drop for Lending<'_, T> {
    fn drop(&mut self) {
        self.0.thread.store(0, Ordering::Relaxed);
        self.0.server.store(std::ptr::null_mut(), Ordering::Relaxed);
    }
}
