//! Lending the locked server to a closure. The lock is not re-entrant, so
//! while [`Client::with_backend`](crate::Client::with_backend) runs, [`Lent`]
//! records the thread and server: a call that only looks is answered, one
//! that would change it gets a typed error. Only a failed `try_lock` asks.

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
    pub(crate) fn is_here(&self) -> bool {
        // Only this thread stores its own number, so no ordering is needed.
        self.thread.load(Ordering::Relaxed) == this_thread()
    }

    pub(crate) fn here<R, F: FnOnce(&T) -> R>(&self, f: F) -> Result<R, F> {
        if !self.is_here() {
            return Err(f);
        }
        let server = self.server.load(Ordering::Relaxed);
        // SAFETY: stored only while a `Lending` lives, which `server` outlives;
        // the lock is held, the server shared-borrowed, the reference kept in `f`.
        Ok(f(unsafe { &*server }))
    }

    /// Lend `server` to a closure on this thread, until the result drops.
    pub(crate) fn lend<'a>(&'a self, server: &'a T) -> Lending<'a, T> {
        self.server
            .store(std::ptr::from_ref(server).cast_mut(), Ordering::Relaxed);
        self.thread.store(this_thread(), Ordering::Relaxed);
        Lending(self)
    }
}

pub(crate) struct Lending<'a, T>(&'a Lent<T>);

impl<T> Drop for Lending<'_, T> {
    fn drop(&mut self) {
        self.0.thread.store(0, Ordering::Relaxed);
        self.0.server.store(std::ptr::null_mut(), Ordering::Relaxed);
    }
}
