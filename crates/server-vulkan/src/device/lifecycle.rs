//! Instances and devices are made and destroyed one at a time in the
//! process, and, while the validation layer is loaded, never during
//! another call of this crate.
//!
//! The Vulkan spec lets an application create and destroy instances and
//! devices from any thread at once: none of those calls has an externally
//! synchronised parameter. The Khronos loader does not hold up its side.
//! It keeps every logical device of every instance on one process-wide
//! list, which `vkCreateDevice` walks under a lock while `vkCreateDevice`
//! and `vkDestroyDevice` add and free its nodes without one
//! (KhronosGroup/Vulkan-Loader#2018), so a device opened on one thread while
//! another is destroyed reads a freed node. Servers do exactly that: the
//! ranks of a group open their devices on their own threads, and a
//! recovery destroys a lost device while other servers of the process run.
//! So every `vkCreateInstance`, `vkDestroyInstance`, `vkCreateDevice` and
//! `vkDestroyDevice` of this crate runs inside [`one_at_a_time`], which
//! holds a process-wide lock for writing. They are rare calls (a server's
//! open, a recovery, a drop), so the lock costs nothing measurable.
//!
//! The validation layer has a race of its own. Before 1.3.250 it looked
//! every call's handle up in one process-wide map, unlocked, that creating
//! and destroying an instance or a device rewrites
//! (KhronosGroup/Vulkan-ValidationLayers#4391): with the layer on, a device
//! made or destroyed on one thread could crash a call on another in the
//! middle of the lookup, reading freed memory. Debian 12's layer (1.3.239)
//! did, in the conformance suite's property test, while other tests opened
//! and dropped their servers. So while any instance of this crate has the
//! layer loaded, every other call of this crate holds the same lock for
//! reading ([`calling`], and [`Guarded`], which `Gpu::vk` hands out): a
//! device is then never made or destroyed during a call that the layer
//! looks up. Without the layer — a runtime's case — a call takes no lock.
//!
//! Reads are taken recursively: a thread reading never waits for a writer
//! queued behind another reader, so a call that waits on the device (for
//! work another thread has yet to submit) cannot deadlock with one that
//! opens a device; the opening waits until no call is in flight. Nothing
//! here covers what other libraries of the process create (wgpu makes its
//! own instances and devices).

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{RwLock, RwLockReadGuard};

/// Held for writing while an instance or a device is created or destroyed,
/// and for reading by every other call while the layer is loaded.
static LIFECYCLE: RwLock<()> = RwLock::new(());

/// How many instances of this crate have the validation layer loaded.
static LAYERED: AtomicUsize = AtomicUsize::new(0);

/// Run `make_or_destroy` — one `vkCreateInstance`, `vkDestroyInstance`,
/// `vkCreateDevice` or `vkDestroyDevice` — while no other thread of the
/// process runs one through here, nor (with the layer loaded) any other
/// call. It must not make another call of this crate itself, nor wait on
/// device work: the lock is not reentrant.
pub(crate) fn one_at_a_time<R>(make_or_destroy: impl FnOnce() -> R) -> R {
    let _one = LIFECYCLE.write();
    make_or_destroy()
}

/// [`one_at_a_time`] for creating an instance: when `layered` and the
/// instance is made, the calls of this crate take the lock from now on,
/// until [`destroy_instance`] says the instance is gone.
pub(crate) fn create_instance<T, E>(
    layered: bool,
    create: impl FnOnce() -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    one_at_a_time(|| {
        let made = create();
        if layered && made.is_ok() {
            LAYERED.fetch_add(1, Ordering::AcqRel);
        }
        made
    })
}

/// [`one_at_a_time`] for destroying an instance made by
/// [`create_instance`] with the same `layered`.
pub(crate) fn destroy_instance(layered: bool, destroy: impl FnOnce()) {
    one_at_a_time(|| {
        destroy();
        if layered {
            LAYERED.fetch_sub(1, Ordering::AcqRel);
        }
    });
}

/// The read side, for as long as it lives: nothing while no instance of
/// this crate has the layer loaded. A call on a device of a layered
/// instance can only happen while that instance lives, so it always sees
/// the count above zero.
pub(crate) struct Calling {
    _held: Option<RwLockReadGuard<'static, ()>>,
}

/// Hold the read side for one call, or a few in a row.
pub(crate) fn calling() -> Calling {
    Calling {
        _held: (LAYERED.load(Ordering::Acquire) > 0).then(|| LIFECYCLE.read_recursive()),
    }
}

/// `target` (a device's or an instance's entry points), with the read
/// side held while it is used: make one in the statement that calls, so it
/// goes at the end of it.
pub(crate) struct Guarded<'a, T> {
    target: &'a T,
    _calling: Calling,
}

impl<'a, T> Guarded<'a, T> {
    pub(crate) fn new(target: &'a T) -> Self {
        Self {
            target,
            _calling: calling(),
        }
    }
}

impl<T> Deref for Guarded<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.target
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::{LAYERED, calling, one_at_a_time};

    /// However many threads make and destroy at once, no two are inside;
    /// and with the layer counted as loaded, no call is inside either.
    #[test]
    fn no_call_runs_while_a_device_is_made_or_destroyed() {
        LAYERED.fetch_add(1, Ordering::AcqRel);
        let making = AtomicUsize::new(0);
        let calls = AtomicUsize::new(0);
        let overlaps = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..200 {
                        one_at_a_time(|| {
                            let now = making.fetch_add(1, Ordering::SeqCst);
                            if now > 0 || calls.load(Ordering::SeqCst) > 0 {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            std::thread::yield_now();
                            making.fetch_sub(1, Ordering::SeqCst);
                        });
                    }
                });
                s.spawn(|| {
                    for _ in 0..200 {
                        let _call = calling();
                        // A second read on the same thread never waits.
                        let _nested = calling();
                        calls.fetch_add(1, Ordering::SeqCst);
                        if making.load(Ordering::SeqCst) > 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        std::thread::yield_now();
                        calls.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
        LAYERED.fetch_sub(1, Ordering::AcqRel);
        assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    }
}
