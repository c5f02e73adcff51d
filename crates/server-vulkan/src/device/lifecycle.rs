//! Instances and devices are made and destroyed one at a time in the process. While the
//! validation layer is loaded, never during another call of this crate either.
//!
//! The spec lets any thread create and destroy devices at once; the Khronos loader does not
//! hold up its side. It adds and frees nodes of one process-wide device list without a lock
//! (KhronosGroup/Vulkan-Loader#2018). A group's ranks open devices on their own threads, and a
//! recovery destroys one while other servers run. So every create and destroy runs inside
//! [`one_at_a_time`], under a process-wide write lock. They are rare, so it costs nothing.
//!
//! The layer before 1.3.250 looked handles up in an unlocked process-wide map that creating a
//! device rewrites (KhronosGroup/Vulkan-ValidationLayers#4391). So while any instance has the
//! layer loaded, every other call holds the read side ([`calling`], [`Guarded`]). Reads are
//! recursive, so a call waiting on the device cannot deadlock with one opening a device.

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{RwLock, RwLockReadGuard};

/// Written while an instance or device is made or destroyed; read by calls under the layer.
static LIFECYCLE: RwLock<()> = RwLock::new(());

/// How many instances of this crate have the validation layer loaded.
static LAYERED: AtomicUsize = AtomicUsize::new(0);

/// Run `make_or_destroy`, one create or destroy, while no other thread runs one here.
/// It must not call this crate again, nor wait on device work: the lock is not reentrant.
pub(crate) fn one_at_a_time<R>(make_or_destroy: impl FnOnce() -> R) -> R {
    let _one = LIFECYCLE.write();
    make_or_destroy()
}

/// [`one_at_a_time`] for creating an instance; a `layered` one makes calls take the lock.
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

/// [`one_at_a_time`] for destroying an instance made by [`create_instance`].
pub(crate) fn destroy_instance(layered: bool, destroy: impl FnOnce()) {
    one_at_a_time(|| {
        destroy();
        if layered {
            LAYERED.fetch_sub(1, Ordering::AcqRel);
        }
    });
}

/// The read side while it lives; nothing while no instance has the layer loaded.
pub(crate) struct Calling {
    _held: Option<RwLockReadGuard<'static, ()>>,
}

/// Hold the read side for one call, or a few in a row.
pub(crate) fn calling() -> Calling {
    Calling {
        _held: (LAYERED.load(Ordering::Acquire) > 0).then(|| LIFECYCLE.read_recursive()),
    }
}

/// `target` with the read side held: make one in the statement that calls.
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

    /// Makers never overlap each other, nor a call while the layer counts as loaded.
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
