//! The property test's invalid operations: the contract fuzzer.
//!
//! A step of the property test is, now and then, a call no correct runtime makes. A range goes past
//! the end of a buffer or sits at `u64::MAX`, or is empty or reversed. A buffer was already freed
//! or is another server's. An allocation asks for nothing or more than the device has. A launch
//! binds at a misaligned offset or over a grid past the device's. An indirect count is `u32::MAX`.
//! A capture or graph is dropped rather than ended. A failure hook calls back into the client. Each
//! must end in its typed error, or in exactly its defined outcome. A dropped capture aborts; an
//! indirect count past the device runs nothing. Each must leave the oracle's world as it was. The
//! step asserts that no failure was seen and no claim changed. The checks after it assert every
//! word reads as the oracle says. These steps run among valid operations, with faults injected,
//! over thousands of steps. So the sequences that break a promise are found rather than guessed.

use super::{Error, Range, STALE, Suite, World, as_bytes};
use scope_core::{Binding, Dispatch};

/// How many of every hundred steps are invalid.
pub(super) const PERCENT: u64 = 5;

fn invalid<T: std::fmt::Debug>(result: &scope_core::Result<T>, what: &str) {
    assert!(
        matches!(result, Err(Error::InvalidArgument { .. })),
        "an invalid argument: {what} -> {result:?}"
    );
}

impl<S: Suite> World<S> {
    /// One invalid operation on this step's stream.
    pub(super) fn abuse(&mut self) -> String {
        // What changes nothing is asserted to change nothing.
        self.refused = true;
        let i = self.pick();
        let handle = self.bufs[i].handle.clone();
        let size = handle.size();
        let c = if self.on_other {
            self.other.clone()
        } else {
            self.client.clone()
        };
        match self.rng.below(9) {
            0 => {
                let what = format!("abuse: ranges past the end of {}", handle.id());
                let past = handle.slice(size - 4..size + 4);
                invalid(&c.write(past, &[0; 8]), &what);
                invalid(&c.read(past), &what);
                invalid(&c.check(&[past]), &what);
                invalid(&c.copy(past, handle.slice(0..8)), &what);
                what
            }
            1 => {
                let what = format!("abuse: ranges at u64::MAX of {}", handle.id());
                let far = handle.slice(u64::MAX - 4..u64::MAX);
                invalid(&c.write(far, &[0; 4]), &what);
                invalid(&c.read(far), &what);
                invalid(&c.read(handle.slice(u64::MAX - 4..)), &what);
                invalid(&c.copy(handle.slice(0..4), far), &what);
                what
            }
            2 => {
                // Reversed on purpose: the contract names it, never wraps it.
                let (from, to) = (8, 4);
                let what = format!("abuse: empty and reversed ranges of {}", handle.id());
                for r in [handle.slice(4..4), handle.slice(from..to)] {
                    invalid(&c.write(r, &[]), &what);
                    invalid(&c.read(r), &what);
                    invalid(&c.check(&[r]), &what);
                }
                let n = (size / 4) as u32;
                let bindings = [handle.slice(from..to).write()];
                let blob = S::scalar_blob(&self.kernels[0], &bindings, &[n, 1]);
                invalid(
                    &c.launch(&self.kernels[0], &bindings, &blob, Dispatch::linear(1)),
                    &what,
                );
                what
            }
            3 => {
                let stale = c.try_allocate(64).expect("allocate");
                c.free(&stale).expect("free");
                let what = format!("abuse: {} after it was freed", stale.id());
                invalid(&c.write(&stale, &[0; 64]), &what);
                invalid(&c.read(&stale), &what);
                invalid(&c.copy(&stale, handle.slice(0..4)), &what);
                invalid(&c.free(&stale), &what);
                what
            }
            4 => {
                let foreign = self.stranger.try_allocate(64).expect("allocate");
                let what = format!("abuse: {} of another server", foreign.id());
                invalid(&c.write(&foreign, &[0; 64]), &what);
                invalid(&c.read(&foreign), &what);
                invalid(&c.copy(&foreign, handle.slice(0..4)), &what);
                invalid(&c.copy(handle.slice(0..4), foreign.slice(0..4)), &what);
                invalid(&c.free(&foreign), &what);
                let bindings = [Binding::write(&foreign)];
                let blob = S::scalar_blob(&self.kernels[0], &bindings, &[16, 1]);
                invalid(
                    &c.launch(&self.kernels[0], &bindings, &blob, Dispatch::linear(1)),
                    &what,
                );
                what
            }
            5 => {
                let what = "abuse: allocations of nothing and of everything".to_owned();
                invalid(&c.allocate(0), &what);
                invalid(&c.try_allocate(u64::MAX), &what);
                invalid(&c.allocate(u64::MAX - 3), &what);
                what
            }
            6 => {
                // A fresh buffer of this stream's: only the argument under test stops the launch.
                let scratch = c.try_allocate(4 * 64).expect("allocate");
                let what = format!("abuse: bad launches over {}", scratch.id());
                // The valid launch's blob: the core refuses the bad binding before reading any, and
                // a suite may not be able to pack one for it.
                let blob = S::scalar_blob(&self.kernels[0], &[Binding::write(&scratch)], &[64, 1]);
                let fill = |binding: Binding<'_>, dispatch| {
                    c.launch(&self.kernels[0], &[binding], &blob, dispatch)
                };
                invalid(
                    &fill(Binding::write(&scratch), Dispatch::Groups([u32::MAX, 1, 1])),
                    &what,
                );
                invalid(
                    &fill(scratch.slice(0..6).write(), Dispatch::linear(1)),
                    &what,
                );
                if self.align > 4 {
                    invalid(
                        &fill(scratch.slice(4..64).write(), Dispatch::linear(1)),
                        &what,
                    );
                }
                invalid(
                    &fill(
                        Binding::write(&scratch),
                        Dispatch::Indirect(scratch.slice(0..8)),
                    ),
                    &what,
                );
                what
            }
            7 if !self.records() => {
                // Read from device memory, a count past the device runs nothing: the bytes stay,
                // stale or not.
                let counts = c.upload(&as_bytes(&[u32::MAX, 1, 1])).expect("upload");
                let n = (size / 4) as u32;
                let bindings = [Binding::write(&handle)];
                let blob = S::scalar_blob(&self.kernels[0], &bindings, &[n, 1]);
                let r: Range = (handle.id(), 0, size);
                let ids = [handle.id()];
                let what = format!("abuse: an indirect count of u32::MAX over {r:?}");
                let result = c.launch(
                    &self.kernels[0],
                    &bindings,
                    &blob,
                    Dispatch::Indirect(counts.all()),
                );
                let refused = self.refused(&ids);
                let allocated = self.bufs[i].allocated;
                if !allocated {
                    assert!(result.is_err(), "{what}");
                    // No memory to write: claimed like any launch's.
                    self.mark(&[r], STALE);
                    self.refused = false;
                    return what;
                }
                self.expect_refusal(refused, &result, &what);
                if !refused {
                    assert!(result.is_ok(), "{what} -> {result:?}");
                    self.ordered(&ids);
                }
                format!("{what} -> {result:?}")
            }
            _ => {
                // A capture forgotten rather than ended: aborted at the next call, claiming
                // nothing.
                if self.records() || self.on_other {
                    return "abuse: none (a window is open)".to_owned();
                }
                drop(self.client.begin_capture().expect("begin"));
                "abuse: a capture dropped without its end".to_owned()
            }
        }
    }
}
