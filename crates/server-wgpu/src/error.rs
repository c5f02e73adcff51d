//! Error scopes and classification: how a wgpu error becomes the core's
//! [`Error`], on the call that caused it.
//!
//! wgpu reports most errors not as return values but to the device's error
//! sink, and its default sink panics. That is the wrong shape for a server
//! whose contract is "no panic on a driver error, and every failure lands on
//! the bytes of the work that caused it". So:
//!
//! - Every fallible wgpu call this crate makes runs inside [`scoped`], which
//!   pushes one error scope per filter (validation, out-of-memory, internal),
//!   runs the call, and pops them. The error, if any, belongs to exactly the
//!   call inside, and keeps wgpu's message (a WGSL error keeps its
//!   `line:column`).
//! - Scopes are thread-local in wgpu, and every backend call runs start to
//!   finish on the caller's thread under the server lock, so a scope never
//!   sees another thread's errors.
//! - Whatever escapes a scope (there should be nothing) reaches the handler
//!   installed by [`Sink::install`], which logs it and keeps it for the next
//!   sync instead of panicking; device loss sets a flag that every later call
//!   answers with a sticky fault, which the core turns into poison.
//! - A loss is learned late (wgpu runs the loss callback at a poll), and
//!   until then the lost device's objects fail in ways that look like
//!   validation errors. So an error a scope catches is classified only
//!   after [`lost_first`] has let a loss speak.
//! - One sink per device. The server retires it ([`Sink::retire`]) before
//!   it gives the device up — to open it again, or on drop — so nothing the
//!   teardown reports reads as a fault.
//!
//! wgpu validates encoded commands (passes, copies) when the encoder is
//! finished, not when they are recorded. The launch and copy paths check up
//! front everything that validation would refuse (binding sizes, dispatch
//! limits, usage conflicts), so the errors a batch could still raise at
//! submission are ones the server could not foresee; they are reported as a
//! late, non-sticky fault at the stream's next sync or read, where the core
//! attributes them to the work in flight (rule 23).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use scope_core::{DeviceFault, Error};

/// The backend's name in errors.
pub(crate) const NAME: &str = "wgpu";

/// Run `f` inside validation, out-of-memory and internal error scopes, and
/// return its value with the first error any of them caught.
///
/// The guards are popped in reverse order of pushing, as wgpu requires; if
/// `f` panics they drop in that order too (and wgpu discards their errors).
pub(crate) fn scoped<R>(device: &wgpu::Device, f: impl FnOnce() -> R) -> (R, Option<wgpu::Error>) {
    let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let internal = device.push_error_scope(wgpu::ErrorFilter::Internal);
    let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let value = f();
    let validation = block_on(validation.pop());
    let internal = block_on(internal.pop());
    let oom = block_on(oom.pop());
    (value, oom.or(validation).or(internal))
}

/// Drive a future that is (on native wgpu) already complete.
///
/// wgpu-core's `pop_error_scope` future is `ready(..)`, so one poll with a
/// no-op waker answers it without a thread or an allocation; anything that
/// is genuinely pending falls back to `pollster`.
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(value) => value,
        Poll::Pending => pollster::block_on(future),
    }
}

/// wgpu's message for `error`: the description for validation and internal
/// errors (WGSL errors carry `line:column` in it), and the source chain for
/// out-of-memory, whose `Display` is only "Out of Memory".
pub(crate) fn message(error: &wgpu::Error) -> String {
    match error {
        wgpu::Error::Validation { description, .. } | wgpu::Error::Internal { description, .. } => {
            description.trim_end().to_owned()
        }
        wgpu::Error::OutOfMemory { source } => format!("out of memory: {source}"),
    }
}

/// An out-of-memory error for `requested` bytes, when `error` is one.
pub(crate) fn out_of_memory(error: &wgpu::Error, requested: u64) -> Option<Error> {
    matches!(error, wgpu::Error::OutOfMemory { .. }).then(|| Error::OutOfMemory {
        backend: NAME,
        requested,
        detail: message(error),
    })
}

/// A non-sticky fault: an error that surfaced after the call that caused it
/// returned (a batch refused at submission, an error no scope caught).
pub(crate) fn late_fault(code: &str, detail: String) -> Error {
    Error::Fault(DeviceFault {
        backend: NAME,
        code: code.to_owned(),
        class: scope_core::FaultClass::Recoverable,
        stream: None,
        detail,
    })
}

/// The sticky fault a lost device answers every call with.
pub(crate) fn device_lost(detail: &str) -> Error {
    Error::Fault(DeviceFault {
        backend: NAME,
        code: "DEVICE_LOST".to_owned(),
        class: scope_core::FaultClass::Sticky,
        stream: None,
        detail: detail.to_owned(),
    })
}

/// What the device told us outside any call: loss, and errors no scope
/// caught. Shared with wgpu's callbacks, which may run on any thread.
///
/// One sink per device: a device opened again gets a new one, so nothing
/// the old device reports late reaches the new device's calls.
#[derive(Default)]
pub(crate) struct Sink {
    lost: AtomicBool,
    lost_reason: Mutex<String>,
    uncaptured: Mutex<Vec<String>>,
    any_uncaptured: AtomicBool,
    /// The server gave the device up ([`retire`](Self::retire)): what it
    /// reports from here on is its teardown, not a fault.
    retired: AtomicBool,
}

impl Sink {
    /// A sink, with its handlers installed on `device`.
    ///
    /// A loss poisons, whatever its reason, unless the server gave the
    /// device up first. wgpu reports two: `Unknown` (the driver lost the
    /// device) and `Destroyed` (`Device::destroy` was called). The server
    /// destroys a device only after retiring its sink, when it opens the
    /// device again ([`Gpu::reopen`](crate::device::Gpu::reopen)), and
    /// dropping a device reports no loss at all; so a `Destroyed` on a sink
    /// still in service is a destroy the server never asked for (through
    /// `Wgpu::raw`), and the device is as lost as by any driver fault. wgpu
    /// runs the callback at a poll once the queue is empty, so the loss is
    /// learned at the next wait or read, as a real loss is.
    pub(crate) fn install(device: &wgpu::Device) -> Arc<Self> {
        let sink = Arc::new(Self::default());
        let on_error = Arc::downgrade(&sink);
        device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            // Never panic here: this replaces wgpu's default handler, which
            // does.
            let text = message(&error);
            let Some(sink) = on_error.upgrade() else {
                tracing::debug!(backend = NAME, "wgpu error after the device went: {text}");
                return;
            };
            if sink.retired.load(Ordering::Acquire) {
                tracing::debug!(
                    backend = NAME,
                    "wgpu error while giving a device up: {text}"
                );
                return;
            }
            tracing::error!(backend = NAME, "wgpu error outside any scope: {text}");
            sink.uncaptured.lock().push(text);
            sink.any_uncaptured.store(true, Ordering::Release);
        }));
        let on_lost = Arc::downgrade(&sink);
        device.set_device_lost_callback(move |reason, text| {
            let Some(sink) = on_lost.upgrade() else {
                tracing::debug!(backend = NAME, ?reason, "device gone: {text}");
                return;
            };
            if sink.retired.load(Ordering::Acquire) {
                // The server's own teardown: nobody is left to tell.
                tracing::debug!(backend = NAME, ?reason, "device given up: {text}");
                return;
            }
            let why = if reason == wgpu::DeviceLostReason::Destroyed {
                format!(
                    "the device was destroyed by a call the server did not make \
                     (wgpu::Device::destroy){}",
                    if text.is_empty() {
                        String::new()
                    } else {
                        format!(": {text}")
                    }
                )
            } else {
                format!("{reason:?}: {text}")
            };
            tracing::error!(backend = NAME, "device lost: {why}");
            *sink.lost_reason.lock() = why;
            sink.lost.store(true, Ordering::Release);
        });
        sink
    }

    /// The server gives the device up (to open it again, or on drop): from
    /// here every call answers the sticky fault, and what the device
    /// reports as it goes — its loss callback, errors no scope caught — is
    /// logged, never kept as a fault.
    pub(crate) fn retire(&self) {
        if self.retired.swap(true, Ordering::AcqRel) {
            return;
        }
        if !self.lost.load(Ordering::Acquire) {
            *self.lost_reason.lock() = "the server gave the device up".to_owned();
            self.lost.store(true, Ordering::Release);
        }
        self.any_uncaptured.store(false, Ordering::Release);
        self.uncaptured.lock().clear();
    }

    /// The sticky fault, once the device is lost.
    #[inline]
    pub(crate) fn check_lost(&self) -> Result<(), Error> {
        if self.lost.load(Ordering::Acquire) {
            return Err(device_lost(&self.lost_reason.lock()));
        }
        Ok(())
    }

    /// Mark the device lost (a panic inside wgpu, a lost-device poll).
    pub(crate) fn mark_lost(&self, why: String) {
        if self.retired.load(Ordering::Acquire) {
            tracing::debug!(backend = NAME, "while giving a device up: {why}");
            return;
        }
        tracing::error!(backend = NAME, "device treated as lost: {why}");
        *self.lost_reason.lock() = why;
        self.lost.store(true, Ordering::Release);
    }

    /// Errors that escaped every scope since the last call, as one late
    /// fault.
    pub(crate) fn take_uncaptured(&self) -> Option<Error> {
        if !self.any_uncaptured.swap(false, Ordering::AcqRel) {
            return None;
        }
        let all = std::mem::take(&mut *self.uncaptured.lock());
        (!all.is_empty()).then(|| late_fault("uncaptured wgpu error", all.join("\n")))
    }
}

/// How long an error path waits for the device's submitted work so that a
/// loss can speak ([`lost_first`]).
const LOSS_PROBE: Duration = Duration::from_secs(2);

/// On an error path, before the error is classified as anything else: the
/// sticky fault if the device turns out to be lost.
///
/// wgpu says little at the moment a device goes. On a destroyed device
/// (`Device::destroy`) every call is a silent no-op — objects made on it
/// are invalid, and wgpu drops the errors that say why — and the loss
/// callback runs only at a poll that finds the queue empty. What the
/// server does see is the consequence: a submission refused because a
/// buffer is invalid, a map that fails, a write into an invalid buffer.
/// Each of those, classified on its own, would read as a recoverable
/// validation error on one piece of work. So every error a scope catches
/// first polls the device (waiting at most [`LOSS_PROBE`] for the work in
/// flight) and asks the sink: a lost device answers the sticky fault, which
/// poisons, and only a device still in service gets the error's own
/// classification. Errors are rare, so the wait costs nothing on the path
/// that matters; work that runs past the probe leaves the loss to the next
/// wait, as any loss is learned.
pub(crate) fn lost_first(device: &wgpu::Device, sink: &Sink) -> Result<(), Error> {
    sink.check_lost()?;
    let _ = no_panic(sink, "a device poll after an error", || {
        device.poll(wgpu::PollType::Wait {
            submission_index: None,
            timeout: Some(LOSS_PROBE),
        })
    })?;
    sink.check_lost()
}

/// Run `f`, turning a panic inside wgpu into a lost device.
///
/// wgpu still panics on a few paths no scope reaches (a device error while
/// polling, say). Those mean the device can no longer be trusted, which is
/// what a sticky fault says.
pub(crate) fn no_panic<R>(sink: &Sink, what: &str, f: impl FnOnce() -> R) -> Result<R, Error> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(value) => Ok(value),
        Err(payload) => {
            let text = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a panic without a message".to_owned());
            let why = format!("wgpu panicked during {what}: {text}");
            sink.mark_lost(why.clone());
            Err(device_lost(&why))
        }
    }
}
