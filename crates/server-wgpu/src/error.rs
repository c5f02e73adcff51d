//! Error scopes and classification: how a wgpu error becomes the core's
//! [`Error`], on the call that caused it.
//!
//! wgpu reports most errors to the device's error sink, whose default panics.
//! This server must not panic on a driver error, and each failure must land
//! on the work that caused it. So:
//!
//! - Every fallible wgpu call runs inside [`scoped`]. Its error belongs to
//!   that call alone and keeps wgpu's message (WGSL keeps `line:column`).
//! - Scopes are thread-local, and each backend call runs on one thread under
//!   the server lock. A scope never sees another thread's errors.
//! - What escapes a scope reaches the handler from [`Sink::install`]. It logs
//!   the error and keeps it for the next sync, never panicking.
//! - A loss is learned late, at a poll, and until then looks like validation
//!   errors. So a caught error is classified only after [`lost_first`].
//! - One sink per device. [`Sink::retire`] runs before the device is given
//!   up, so its teardown never reads as a fault.
//!
//! wgpu validates encoded commands only when the encoder finishes. Launch and
//! copy check up front what that validation would refuse. What a batch still
//! raises at submission is a late, non-sticky fault at the next sync or read,
//! charged to the work in flight (rule 23).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use scope_core::{BackendKind, DeviceFault, Error};

/// The table's row for this server; its name is in every error.
pub(crate) const KIND: BackendKind = BackendKind::Wgpu;
pub(crate) const NAME: &str = KIND.name();

/// Run `f` inside validation, out-of-memory and internal error scopes; its
/// value and the first error caught. Guards pop in reverse, as wgpu requires.
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

/// Drive a future native wgpu has already completed: `pop_error_scope` is
/// `ready(..)`, so one no-op poll answers it. Else fall back to `pollster`.
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(value) => value,
        Poll::Pending => pollster::block_on(future),
    }
}

/// wgpu's message for `error`. Out-of-memory adds its source, since its
/// `Display` is only "Out of Memory".
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

/// A non-sticky fault, for an error raised after its call returned.
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

/// What the device reports outside any call: loss, and errors no scope
/// caught. wgpu's callbacks may reach it from any thread.
#[derive(Default)]
pub(crate) struct Sink {
    lost: AtomicBool,
    lost_reason: Mutex<String>,
    uncaptured: Mutex<Vec<String>>,
    any_uncaptured: AtomicBool,
    /// Set by [`retire`](Self::retire): later reports are teardown, not faults.
    retired: AtomicBool,
}

impl Sink {
    /// A sink, with its handlers installed on `device`. Any loss on a sink in
    /// service poisons: the server destroys a device only after retiring its
    /// sink ([`Gpu::reopen`](crate::device::Gpu::reopen)). So a `Destroyed`
    /// here came through `Wgpu::raw`.
    pub(crate) fn install(device: &wgpu::Device) -> Arc<Self> {
        let sink = Arc::new(Self::default());
        let on_error = Arc::downgrade(&sink);
        device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            // Never panic: this replaces wgpu's default handler, which does.
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

    /// Give the device up. Every later call answers the sticky fault, and
    /// teardown reports are logged, never kept.
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

    /// Errors that escaped every scope since the last call, as one late fault.
    pub(crate) fn take_uncaptured(&self) -> Option<Error> {
        if !self.any_uncaptured.swap(false, Ordering::AcqRel) {
            return None;
        }
        let all = std::mem::take(&mut *self.uncaptured.lock());
        (!all.is_empty()).then(|| late_fault("uncaptured wgpu error", all.join("\n")))
    }
}

/// How long [`lost_first`] waits for submitted work, so a loss can speak.
const LOSS_PROBE: Duration = Duration::from_secs(2);

/// On an error path: the sticky fault if the device turns out to be lost.
/// A destroyed device fails silently and reports the loss only at a poll, so
/// the server first sees a refused submission or a failed map. Alone, that
/// would read as a recoverable error on one piece of work. So poll first, for
/// at most [`LOSS_PROBE`]; errors are rare, so the wait costs nothing.
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

/// Run `f`, turning a panic inside wgpu into a lost device. wgpu still panics
/// on a few paths no scope reaches, and then the device cannot be trusted.
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
