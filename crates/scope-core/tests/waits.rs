//! A stream's wait runs without the server's lock: while one thread waits
//! for its stream's work, every other thread's calls go on, and the wait
//! settles exactly the work it covered — not what others submitted on the
//! same stream meanwhile.
//!
//! The backend is the null one with a script whose waits block until the
//! test opens a gate, as a GPU's would until its kernels finish; every other
//! call succeeds at once. It keeps no bytes, so these tests check outcomes —
//! which calls return, which buffers a fault claims — not values.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use scope_core::null::{Null, NullWaiter, Script};
use scope_core::{Buffer, Client, Error, Result, StreamId};

/// How long a call on another thread may take while a wait is blocked
/// before the test calls it stalled. Generous: it only has to tell
/// "returned" from "blocked until the gate opened".
const STALLED: Duration = Duration::from_secs(5);

/// The gate every wait blocks on, and what the wait then reports.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    /// Whether the next `begin_wait` returns a waiter that blocks (once).
    armed: bool,
    /// How many waits are blocked now.
    waiting: usize,
    /// Set to let blocked waits return, with this outcome.
    opened: Option<Result<()>>,
    /// What the next `end_wait` reports: a fault the backend kept for the
    /// stream's next wait, as a batch lost at submission is.
    kept: Option<Error>,
}

impl Gate {
    fn arm(&self) {
        self.state.lock().armed = true;
    }

    /// Block until some wait is blocked on the gate.
    fn until_waiting(&self) {
        let mut state = self.state.lock();
        while state.waiting == 0 {
            assert!(
                !self.changed.wait_for(&mut state, STALLED).timed_out(),
                "no wait reached the gate"
            );
        }
    }

    fn open(&self, outcome: Result<()>) {
        let mut state = self.state.lock();
        state.opened = Some(outcome);
        self.changed.notify_all();
    }

    fn pass(&self) -> Result<()> {
        let mut state = self.state.lock();
        state.waiting += 1;
        self.changed.notify_all();
        while state.opened.is_none() {
            // Bounded, so that a broken core fails the test instead of
            // hanging it.
            if self.changed.wait_for(&mut state, STALLED * 4).timed_out() {
                break;
            }
        }
        state.waiting -= 1;
        state.opened.clone().unwrap_or(Ok(()))
    }
}

/// The gate as a null backend's script: every call but the waits does
/// nothing at once.
struct GateScript(Arc<Gate>);

impl Script for GateScript {
    fn begin_wait(&mut self, _stream: StreamId) -> Option<NullWaiter> {
        // One wait blocks per arming; the rest pass, as on an idle device.
        let armed = std::mem::take(&mut self.0.state.lock().armed);
        let gate = self.0.clone();
        armed.then(|| NullWaiter::new(move || gate.pass()))
    }

    fn end_wait(&mut self, _stream: StreamId) -> Result<()> {
        match self.0.state.lock().kept.take() {
            Some(kept) => Err(kept),
            None => Ok(()),
        }
    }
}

type Gated = Null<GateScript>;

fn gated() -> (Client<Gated>, Arc<Gate>) {
    let gate = Arc::new(Gate::default());
    let client = Client::new(Null::scripted(GateScript(gate.clone()))).unwrap();
    (client, gate)
}

fn fault(code: &str) -> Error {
    Error::Fault(scope_core::DeviceFault {
        backend: "null",
        code: code.to_owned(),
        class: scope_core::FaultClass::Recoverable,
        stream: None,
        detail: "the wait reported it".to_owned(),
    })
}

fn words(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Run `f` on another thread; whether it returned within [`STALLED`].
fn returns_while_blocked(f: impl FnOnce() + Send + 'static) -> bool {
    let (done, returned) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = done.send(());
    });
    returned.recv_timeout(STALLED).is_ok()
}

#[test]
fn a_waiting_sync_does_not_stall_other_threads() {
    let (c, gate) = gated();
    let other = c.new_stream().unwrap();
    gate.arm();
    let syncing = {
        let c = c.clone();
        std::thread::spawn(move || c.sync())
    };
    gate.until_waiting();
    let went_on = returns_while_blocked(move || {
        let b = other.upload(&words(&[5; 4])).unwrap();
        other.read(&b).unwrap();
        assert_eq!(other.failures_held(), 0);
    });
    gate.open(Ok(()));
    assert!(
        went_on,
        "another stream's calls waited for this stream's sync to finish"
    );
    syncing.join().unwrap().unwrap();
}

#[test]
fn a_waiting_read_does_not_stall_other_threads_and_reads_after_the_wait() {
    let (c, gate) = gated();
    let b = c.upload(&words(&[1; 4])).unwrap();
    let other = c.new_stream().unwrap();
    gate.arm();
    let reading = {
        let c = c.clone();
        let b = b.clone();
        std::thread::spawn(move || c.read(&b))
    };
    gate.until_waiting();
    let went_on = returns_while_blocked(move || {
        other.allocate(64).unwrap();
    });
    assert!(
        !reading.is_finished(),
        "the read returned before its wait did"
    );
    gate.open(Ok(()));
    assert!(went_on, "another thread's call waited for this read's wait");
    assert_eq!(reading.join().unwrap().unwrap().len(), 16);
}

/// A write the next wait covers (`covered`), a sync blocked on the gate,
/// and, while it is blocked, a write on the same stream that it does not
/// cover (`later`).
fn a_sync_blocked_with_work_behind_it(
    c: &Client<Gated>,
    gate: &Gate,
) -> (Buffer, Buffer, std::thread::JoinHandle<Result<()>>) {
    let covered = c.upload(&words(&[1; 4])).unwrap();
    let later = c.upload(&words(&[2; 4])).unwrap();
    // Settle the uploads, then submit the work the wait will cover.
    c.sync().unwrap();
    c.write(&covered, &words(&[3; 4])).unwrap();
    gate.arm();
    let syncing = {
        let c = c.clone();
        std::thread::spawn(move || c.sync())
    };
    gate.until_waiting();
    let same_stream = c.clone();
    let later_write = later.clone();
    assert!(returns_while_blocked(move || {
        same_stream.write(&later_write, &words(&[4; 4])).unwrap();
    }));
    (covered, later, syncing)
}

#[test]
fn a_fault_a_wait_surfaces_lands_on_what_it_covered_only() {
    let (c, gate) = gated();
    let (covered, later, syncing) = a_sync_blocked_with_work_behind_it(&c, &gate);
    gate.open(Err(fault("LATE")));
    let surfaced = syncing.join().unwrap().unwrap_err();
    assert!(surfaced.to_string().contains("LATE"), "{surfaced}");
    let lost = c.read(&covered).unwrap_err();
    assert!(lost.to_string().contains("LATE"), "{lost}");
    c.read(&later)
        .expect("the write the wait did not cover is not claimed by its fault");
    assert!(c.poison().is_none());
}

#[test]
fn a_fault_kept_for_the_next_wait_lands_on_everything_in_flight() {
    // A batch lost at submission is reported at the stream's next wait, and
    // that batch may hold work another thread submitted while this wait
    // ran: the report cannot be limited to what the wait covered.
    let (c, gate) = gated();
    let (covered, later, syncing) = a_sync_blocked_with_work_behind_it(&c, &gate);
    gate.state.lock().kept = Some(fault("BATCH_LOST"));
    gate.open(Ok(()));
    let lost = syncing.join().unwrap().unwrap_err();
    assert!(lost.to_string().contains("BATCH_LOST"), "{lost}");
    for buffer in [&covered, &later] {
        let error = c.read(buffer).unwrap_err();
        assert!(error.to_string().contains("BATCH_LOST"), "{error}");
    }
}

#[test]
fn a_buffer_freed_while_its_read_waits_is_a_typed_error() {
    let (c, gate) = gated();
    let b = c.upload(&words(&[1; 4])).unwrap();
    gate.arm();
    let reading = {
        let c = c.clone();
        let b = b.clone();
        std::thread::spawn(move || c.read(&b))
    };
    gate.until_waiting();
    c.free(&b).unwrap();
    gate.open(Ok(()));
    let error = reading.join().unwrap().unwrap_err();
    assert!(matches!(error, Error::InvalidArgument { .. }), "{error}");
}

/// A recovery while another thread's wait is blocked does not give the
/// device up under it (the waiter names the device's objects): it waits
/// for the wait to end, then opens the device again (rule 52).
#[test]
fn a_recovery_waits_for_a_wait_in_flight_to_end() {
    let (c, gate) = gated();
    let b = c.upload(&words(&[1; 4])).unwrap();
    gate.arm();
    let syncing = {
        let c = c.clone();
        std::thread::spawn(move || c.sync())
    };
    gate.until_waiting();
    // The device is lost while the sync waits with the lock released.
    c.inject(scope_core::FaultPlan::new().poison_at(1, "null", "DEVICE_LOST"));
    assert!(c.write(&b, &words(&[2; 4])).unwrap_err().is_sticky());
    let recovering = {
        let c = c.clone();
        std::thread::spawn(move || c.recover())
    };
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !recovering.is_finished(),
        "the recovery gave the device up while a wait named it"
    );
    gate.open(Ok(()));
    assert!(syncing.join().unwrap().unwrap_err().is_device_poisoned());
    let recovered = recovering.join().unwrap().unwrap();
    assert!(
        matches!(
            recovered,
            scope_core::Recovered::Reopened { buffers: 1, .. }
        ),
        "{recovered:?}"
    );
    assert!(c.read(&b).unwrap_err().is_lost_with_device());
}
