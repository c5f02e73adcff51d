//! The property test's device losses. Now and then a sticky fault loses the device, and the client
//! recovers ([`Client::recover`], rules 51–53).
//!
//! The loss is injected at the next device call: a `fill` on stream 0, the fault poisoning the
//! server (rule 36). The oracle then says what the recovery must do:
//!
//! - every live buffer the lost device held is made again. Each of its words is stale until
//!   rewritten: "lost with the device", naming the fault. The steps after then check that work
//!   reading them is skipped, that its outputs inherit the loss, and that a rewrite heals. A buffer
//!   whose allocation failed keeps its record;
//! - `Recovered::Reopened` counts those buffers, none unallocated, and the graphs the device held.
//!   Each graph refuses to replay from then on (`Error::Refused`, claiming nothing) and is
//!   destroyed cleanly. An open window is aborted, its handle naming no window;
//! - the client is no longer poisoned. Each stream's count of failures seen is what it was. The
//!   failure hook is the one installed at the start, and the limits published are the device's.
//!
//! Some recoveries fail first. The fault may come where the backend reopens ([`Site::Reopen`]). Or
//! the device is lost again while its buffers are made again ([`Site::Allocate`] during the
//! recovery). Each leaves the client poisoned until a later recovery opens the device. Meanwhile
//! every call fails fast with the fault, and releases (a free, a graph destroyed) still release.
//! The recovery that opens the device counts every buffer and graph the attempts before it gave up.
//!
//! A suite whose backend cannot open a device again has no [`Capability::Reopen`] in its
//! [`Suite::capabilities`]. Every recovery is refused with `Error::RestartRequired`, naming the
//! fault, and the client stays poisoned. Its buffers and graphs still release, after which the
//! store is empty. The run goes on with a fresh server, as a restarted process would.

use super::*;
use scope_core::{CaptureState, DeviceFault, Recovered};

/// About one step in this many loses the device.
pub(super) const ONE_IN: u64 = 300;

/// How a recovery goes before it opens the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attempt {
    /// The first attempt opens it.
    Opens,
    /// The backend's reopen fails once (`Site::Reopen`).
    ReopenFails,
    /// The device is lost again while the `nth` buffer is made again.
    LostWhileRemaking(u64),
}

fn sticky(code: String, detail: &str) -> Error {
    Error::Fault(DeviceFault {
        backend: "injected",
        code,
        class: scope_core::FaultClass::Sticky,
        stream: None,
        detail: detail.to_owned(),
    })
}

impl<S: Suite> World<S> {
    /// Lose the device and recover it; the step's log line.
    pub(super) fn lose(&mut self) -> String {
        // The loss and the recovery go through stream 0, which holds the window if one is open.
        self.on_other = false;
        let Some(victim) = self.bufs.iter().position(|b| b.allocated) else {
            // Nothing the loss can surface at: work towards it instead.
            return self.allocate();
        };
        self.tally.lost += 1;
        let code = format!("DEVICE_LOST {}", self.tally.lost);
        self.client
            .inject(FaultPlan::new().poison_at(1, "injected", &code));
        let handle = self.bufs[victim].handle.clone();
        let n = (handle.size() / 4) as u32;
        let bindings = [handle.all().write()];
        let blob = S::scalar_blob(&self.kernels[0], &bindings, &[n, 0xdead]);
        let met = self.client.launch(
            &self.kernels[0],
            &bindings,
            &blob,
            Dispatch::linear(n.div_ceil(64)),
        );
        self.client.inject(FaultPlan::new());
        let met = met.expect_err("the call the loss surfaces at fails");
        assert!(met.is_sticky(), "the loss is a sticky fault: {met}");
        let poison = self.client.poison().expect("the loss poisons the device");
        assert!(poison.to_string().contains(&code), "{poison}");
        // Every word the device held is lost with it, whatever the recovery does. A failed
        // allocation's record stays as it was.
        for buf in self.bufs.iter_mut().filter(|b| b.allocated) {
            buf.words.fill(STALE);
        }
        if !self.reopens {
            return self.restart(&code);
        }
        let attempt = match self.rng.below(100) {
            0..=14 => Attempt::ReopenFails,
            15..=24 => {
                let held = self.bufs.iter().filter(|b| b.allocated).count() as u64;
                Attempt::LostWhileRemaking(1 + self.rng.below(held))
            }
            _ => Attempt::Opens,
        };
        let mut what = format!("lose the device ({code}; {attempt:?})");
        // Counted before any attempt: one that fails gives them up, and the one that opens counts
        // them.
        let graphs = self.graphs.iter().filter(|g| !g.lost).count();
        if attempt != Attempt::Opens {
            what += &self.fail_to_recover(attempt, &code);
            self.tally.failed_attempts += 1;
        }
        // Counted after: a buffer freed while poisoned is not made again.
        let held = self.bufs.iter().filter(|b| b.allocated).count();
        let seen = (self.client.failures_seen(), self.other.failures_seen());
        let recovered = self.client.recover();
        let what = format!("{what} -> {recovered:?}");
        match &recovered {
            Ok(Recovered::Reopened {
                fault,
                buffers,
                unallocated,
                graphs: lost,
            }) => {
                assert!(fault.to_string().contains(&code), "names the loss: {what}");
                assert_eq!(*buffers, held, "every buffer the device held: {what}");
                assert_eq!(*unallocated, 0, "the device came back as large: {what}");
                assert_eq!(*lost, graphs, "every graph the device held: {what}");
            }
            other => panic!("the device opens again: {other:?}: {what}"),
        }
        self.tally.reopened += 1;
        assert!(self.client.poison().is_none(), "{what}");
        assert_eq!(
            (self.client.failures_seen(), self.other.failures_seen()),
            seen,
            "each stream's count of failures seen carries over: {what}"
        );
        let max = self.client.with_backend(|b| b.max_allocation());
        assert_eq!(
            self.client.limits().max_allocation,
            max,
            "the limits are asked again: {what}"
        );
        self.after_reopening(&code, &what);
        what
    }

    /// A recovery that fails as `attempt` says, and what the poisoned client does until the next.
    /// Returns the log's addition.
    fn fail_to_recover(&mut self, attempt: Attempt, code: &str) -> String {
        let plan = match attempt {
            Attempt::ReopenFails => FaultPlan::new().fail(
                Site::Reopen,
                1,
                sticky(format!("{code} again"), "lost again while opening"),
            ),
            Attempt::LostWhileRemaking(nth) => FaultPlan::new().fail(
                Site::Allocate,
                nth,
                sticky(format!("{code} again"), "lost again while remaking"),
            ),
            Attempt::Opens => FaultPlan::new(),
        };
        self.client.inject(plan);
        let failed = self.client.recover();
        self.client.inject(FaultPlan::new());
        let what = format!(" -> {failed:?}");
        let error = failed.expect_err("the attempt fails");
        assert!(
            error.to_string().contains(&format!("{code} again")),
            "names the loss it met: {error}"
        );
        assert!(self.client.poison().is_some(), "still poisoned: {what}");
        // The window, if any, is aborted by now; its handle names none.
        if let Some((capture, _)) = self.window.take() {
            assert_eq!(self.client.capture_state(), CaptureState::NoCapture);
            drop(capture);
        }
        for graph in &mut self.graphs {
            graph.lost = true;
        }
        // Every call fails fast; releases still release.
        let i = self.pick();
        let handle = self.bufs[i].handle.clone();
        let read = self.other.read(handle.all());
        assert!(
            read.as_ref().is_err_and(Error::is_device_poisoned),
            "a read while poisoned: {read:?}"
        );
        assert!(
            self.client
                .allocate(4)
                .is_err_and(|e| e.is_device_poisoned()),
            "an allocation while poisoned"
        );
        let mut released = String::new();
        if self.rng.chance(50) {
            let buf = self.bufs.swap_remove(i);
            self.client
                .free(&buf.handle)
                .expect("a free while poisoned");
            released += &format!("; free {}", buf.handle.id());
        }
        if !self.graphs.is_empty() && self.rng.chance(50) {
            let g = self.rng.below(self.graphs.len() as u64) as usize;
            let model = self.graphs.swap_remove(g);
            self.client
                .destroy_graph(&model.graph)
                .expect("a graph destroyed while poisoned");
            released += &format!("; destroy {:?}", model.graph.id());
        }
        format!("{what}{released}")
    }

    /// The device is open again. The window is gone, every graph refuses, and a read of what it
    /// held names the loss.
    fn after_reopening(&mut self, code: &str, what: &str) {
        if let Some((capture, _)) = self.window.take() {
            assert_eq!(
                self.client.capture_state(),
                CaptureState::NoCapture,
                "the window is aborted: {what}"
            );
            assert!(
                matches!(
                    self.client.end_capture(capture),
                    Err(Error::InvalidArgument { .. })
                ),
                "an aborted window's handle names none: {what}"
            );
        }
        for graph in &mut self.graphs {
            graph.lost = true;
        }
        let held: Vec<usize> = (0..self.bufs.len())
            .filter(|&i| self.bufs[i].allocated)
            .collect();
        let Some(&i) = held.first() else {
            return;
        };
        let read = self.client.read(self.bufs[i].handle.all());
        match read {
            Err(e) => {
                assert!(e.is_lost_with_device(), "lost with the device: {e}");
                assert!(!e.is_device_poisoned(), "not poisoned now: {e}");
                assert!(e.to_string().contains(code), "names the fault: {e}");
            }
            Ok(_) => panic!("a buffer the lost device held read clean: {what}"),
        }
        // Work reading lost bytes is skipped, and the hook installed at the start hears it. Its
        // output was lost too, so the oracle already holds it stale. Skipped work orders nothing.
        if let Some(&j) = held.get(1) {
            let n = self.bufs[i].handle.size().min(self.bufs[j].handle.size());
            let heard = self.heard.load(Ordering::Relaxed);
            let skipped = self.client.copy(
                self.bufs[i].handle.slice(0..n),
                self.bufs[j].handle.slice(0..n),
            );
            assert!(
                matches!(skipped, Err(Error::Skipped { .. })),
                "a copy of lost bytes is skipped: {skipped:?}"
            );
            assert!(
                self.heard.load(Ordering::Relaxed) > heard,
                "the hook carried over and heard the skip"
            );
        }
    }

    /// A backend that cannot open the device again. Every recovery is refused with
    /// `Error::RestartRequired`, and the client stays poisoned. Everything still releases. Then
    /// comes a fresh server, as a restarted process gets.
    fn restart(&mut self, code: &str) -> String {
        for attempt in 0..2 {
            match self.client.recover() {
                Err(Error::RestartRequired { fault, .. }) => assert!(
                    fault.to_string().contains(code),
                    "attempt {attempt} names the loss: {fault}"
                ),
                other => panic!("attempt {attempt}: a restart is required: {other:?}"),
            }
            assert!(self.client.poison().is_some(), "still poisoned");
        }
        self.tally.restarts += 1;
        let (buffers, graphs) = (self.bufs.len(), self.graphs.len());
        if let Some((capture, _)) = self.window.take() {
            assert_eq!(self.client.capture_state(), CaptureState::NoCapture);
            drop(capture);
        }
        for model in std::mem::take(&mut self.graphs) {
            if self.rng.chance(50) {
                self.client
                    .destroy_graph(&model.graph)
                    .expect("a graph destroyed while poisoned");
            }
        }
        for buf in std::mem::take(&mut self.bufs) {
            if self.rng.chance(50) {
                self.client
                    .free(&buf.handle)
                    .expect("a free while poisoned");
            }
        }
        assert_eq!(
            self.client.failures_held(),
            0,
            "a poisoned client's releases empty the store\n{}",
            self.client.dump_failures()
        );
        assert_eq!(self.client.bytes_allocated(), 0);
        let client = S::client().expect("a fresh server");
        let seed = self.rng.next();
        let tally = self.tally;
        *self = World::new(client, seed);
        self.tally = tally;
        format!(
            "lose the device ({code}): restart required; {buffers} buffers and {graphs} graphs \
             released, a fresh server"
        )
    }
}
