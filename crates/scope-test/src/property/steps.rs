//! The generator: one random operation a step. It may allocate, free, write, launch, copy, read,
//! sync, capture, replay or destroy. Each is issued to the server and told to the oracle, with
//! faults planted at the site it reaches.

use super::*;

impl<S: Suite> World<S> {
    pub(super) fn pick(&mut self) -> usize {
        self.rng.below(self.bufs.len() as u64) as usize
    }

    /// A random word-aligned, non-empty range of buffer `i`.
    pub(super) fn range(&mut self, i: usize) -> Range {
        let words = self.bufs[i].words.len() as u64;
        let a = self.rng.below(words);
        let b = a + 1 + self.rng.below(words - a);
        (self.bufs[i].handle.id(), a * 4, b * 4)
    }

    /// A random binding offset of buffer `i`, leaving at least one word.
    pub(super) fn binding_start(&mut self, i: usize) -> u64 {
        let size = self.bufs[i].handle.size();
        self.align * self.rng.below((size - 4) / self.align + 1)
    }

    /// `percent`, or a quarter of it inside a window, so that some windows seal and their graphs
    /// get replayed.
    pub(super) fn failure_rate(&self, percent: u64) -> u64 {
        if self.records() { percent / 4 } else { percent }
    }

    pub(super) fn recording(&self) -> bool {
        self.window.is_some()
    }

    /// This step's stream, as an index.
    pub(super) fn stream(&self) -> usize {
        usize::from(self.on_other)
    }

    /// Whether this step's stream is recording: stream 0 with a window open (windows open on stream
    /// 0 only).
    pub(super) fn records(&self) -> bool {
        self.recording() && !self.on_other
    }

    /// Whether stream `s` is recording.
    pub(super) fn stream_records(&self, s: usize) -> bool {
        s == 0 && self.recording()
    }

    /// The stream this step's work goes to.
    pub(super) fn on(&self) -> &Client<S::Backend> {
        if self.on_other {
            &self.other
        } else {
            &self.client
        }
    }

    pub(super) fn step(&mut self) -> String {
        self.on_other = self.rng.chance(30);
        self.refused = false;
        let before = (
            self.client.failures_seen(),
            self.other.failures_seen(),
            self.client.failure_claims(),
        );
        let live = self.bufs.len();
        let abused = live >= 3 && self.rng.chance(abuse::PERCENT);
        let lost = live >= 3 && !abused && self.rng.below(loss::ONE_IN) == 0;
        let roll = self.rng.below(100);
        let what = match roll {
            _ if abused => self.abuse(),
            _ if lost => self.lose(),
            _ if live < 3 || (roll < 10 && live < 24) => self.allocate(),
            0..=9 => self.free(),
            10..=27 => self.write(),
            28..=59 => self.launch(),
            60..=65 => self.copy(),
            66..=71 => self.read(),
            72..=73 => self.sync(),
            74..=81 => self.capture(),
            82..=95 => self.replay(),
            _ => self.destroy(),
        };
        if self.refused {
            let after = (
                self.client.failures_seen(),
                self.other.failures_seen(),
                self.client.failure_claims(),
            );
            assert_eq!(
                before, after,
                "a refusal changes nothing (failures seen on each stream, claims): {what}"
            );
        }
        self.tally.abused += usize::from(abused);
        if self.on_other && self.recording() && !abused {
            self.tally.during_windows += 1;
            self.tally.refused += usize::from(self.refused);
        }
        if self.on_other {
            format!("[stream 1] {what}")
        } else {
            what
        }
    }

    pub(super) fn allocate(&mut self) -> String {
        let size = 4 * (1 + self.rng.below(self.max_words));
        let fail = self.rng.chance(8);
        if fail {
            // Twice: the server trims its caches and retries once (rule 37).
            let oom = || Error::OutOfMemory {
                backend: "injected",
                requested: size,
                detail: "injected".into(),
            };
            self.client
                .inject(FaultPlan::new().fail(Site::Allocate, 1, oom()).fail(
                    Site::Allocate,
                    2,
                    oom(),
                ));
        }
        let handle = self.on().allocate(size).expect("allocate");
        self.client.inject(FaultPlan::new());
        // Fresh memory holds no failure: its bytes are unspecified but not claimed (nothing meant
        // to write them).
        let id = handle.id();
        self.bufs.push(Buf {
            handle,
            words: vec![if fail { STALE } else { UNKNOWN }; (size / 4) as usize],
            allocated: !fail,
            // Failed or not, the allocating stream is its first user.
            last_user: self.stream(),
        });
        format!("allocate {id}: {size} bytes (fails: {fail})")
    }

    pub(super) fn free(&mut self) -> String {
        let i = self.pick();
        let buf = self.bufs.swap_remove(i);
        let id = buf.handle.id();
        let explicit = self.rng.chance(50);
        if explicit {
            self.client.free(&buf.handle).expect("free");
        }
        drop(buf);
        format!("free {id} (explicit: {explicit})")
    }

    pub(super) fn write(&mut self) -> String {
        let i = self.pick();
        // Whole buffers often: healing has to keep up with failures spreading through skips, or
        // most of the state ends up stale.
        let r = if self.rng.chance(30) {
            (self.bufs[i].handle.id(), 0, self.bufs[i].handle.size())
        } else {
            self.range(i)
        };
        let data: Arc<[u32]> = (0..len(&r) / 4).map(|_| self.rng.next() as u32).collect();
        let fail = self.rng.chance(self.failure_rate(5));
        if fail {
            self.client
                .inject(FaultPlan::new().fail(Site::Write, 1, injected("write")));
        }
        let result = self
            .on()
            .write(self.bufs[i].handle.slice(r.1..r.2), &as_bytes(&data));
        self.client.inject(FaultPlan::new());
        let what = format!("write {r:?} (fails: {fail}) -> {result:?}");
        if !self.bufs[i].allocated {
            // No memory to write is found before any refusal.
            assert!(result.is_err(), "a write to an unallocated buffer fails");
            self.expect_refusal(false, &result, &what);
            return what;
        }
        let refused = self.refused(&[r.0]);
        self.expect_refusal(refused, &result, &what);
        if refused {
            return what;
        }
        assert_eq!(result.is_err(), fail, "{what}");
        if fail {
            self.mark(&[r], STALE);
            self.doom();
            return what;
        }
        self.ordered(&[r.0]);
        // Healed by the write: its values are known once it ran, at once or at each replay of its
        // window.
        self.mark(&[r], UNKNOWN);
        self.done(&[], &[r], Op::Write(r, data));
        what
    }

    pub(super) fn launch(&mut self) -> String {
        let shape = match self.rng.below(100) {
            0..=39 => Shape::Fill,
            40..=74 => Shape::Copy,
            _ => Shape::Add,
        };
        let out = self.pick();
        let n_inputs = match shape {
            Shape::Fill => 0,
            Shape::Copy => 1,
            Shape::Add => 2,
        };
        // Inputs never share a buffer with the output (see the module docs).
        let mut inputs = Vec::new();
        while inputs.len() < n_inputs {
            let i = self.pick();
            if i != out {
                inputs.push(i);
            }
        }
        let starts: Vec<u64> = std::iter::once(out)
            .chain(inputs.iter().copied())
            .map(|i| self.binding_start(i))
            .collect();
        let room = std::iter::once(out)
            .chain(inputs.iter().copied())
            .zip(&starts)
            .map(|(i, s)| (self.bufs[i].handle.size() - s) / 4)
            .min()
            .unwrap_or(1);
        let n = 1 + self.rng.below(room);
        let range_of = |i: usize, start: u64| (self.bufs[i].handle.id(), start, start + 4 * n);
        let w = range_of(out, starts[0]);
        let reads: Vec<Range> = inputs
            .iter()
            .zip(&starts[1..])
            .map(|(&i, &s)| range_of(i, s))
            .collect();
        let value = self.rng.next() as u32;
        let (kernel, op, values) = match shape {
            Shape::Fill => (&self.kernels[0], Op::Fill(w, value), vec![n as u32, value]),
            Shape::Copy => (&self.kernels[1], Op::Copy(reads[0], w), vec![n as u32]),
            Shape::Add => (
                &self.kernels[2],
                Op::Add(reads[0], reads[1], w),
                vec![n as u32],
            ),
        };
        let fail = self.rng.chance(self.failure_rate(12));
        if fail {
            self.client
                .inject(FaultPlan::new().fail(Site::Launch, 1, injected("launch")));
        }
        let buffer = |r: &Range| &self.bufs[self.index_of(r.0).expect("live")].handle;
        let bindings: Vec<Binding<'_>> = reads
            .iter()
            .map(|r| buffer(r).slice(r.1..r.2).read())
            .chain(std::iter::once(buffer(&w).slice(w.1..w.2).write()))
            .collect();
        let blob = S::scalar_blob(kernel, &bindings, &values);
        let result = self.on().launch(
            kernel,
            &bindings,
            &blob,
            Dispatch::linear((n as u32).div_ceil(64)),
        );
        drop(bindings);
        self.client.inject(FaultPlan::new());
        let unallocated_out = !self.bufs[out].allocated;
        let skipped = !unallocated_out && self.any_stale(&reads);
        let clean = !unallocated_out && !skipped && !fail;
        let what =
            format!("launch {shape:?} reads {reads:?} writes {w:?} (fails: {fail}) -> {result:?}");
        // Refused before anything else: an output without memory, an input carrying a failure.
        let ids: Vec<BufferId> = reads.iter().chain([&w]).map(|r| r.0).collect();
        let refused = self.refused(&ids);
        self.expect_refusal(refused, &result, &what);
        if refused {
            return what;
        }
        match (&result, clean) {
            (Ok(()), true) => {}
            (Err(Error::Skipped { .. }), false) if skipped => {}
            (Err(e), false) if !skipped && !matches!(e, Error::Skipped { .. }) => {}
            _ => panic!("expected clean={clean} skipped={skipped}: {what}"),
        }
        if unallocated_out {
            // Never started: nothing to claim, but a window is missing it.
            self.doom();
            return what;
        }
        if !clean {
            // Skipped or failed before `order`: no buffer changes hands.
            self.mark(&[w], STALE);
            self.doom();
            return what;
        }
        self.ordered(&ids);
        self.mark(&[w], UNKNOWN);
        self.done(&reads, &[w], op);
        what
    }

    pub(super) fn copy(&mut self) -> String {
        let i = self.pick();
        // Within one buffer often: the contract allows it when the ranges do not overlap, and not
        // every API does (wgpu refuses it).
        let j = if self.rng.chance(25) { i } else { self.pick() };
        let s = self.range(i);
        let n = len(&s).min(self.bufs[j].handle.size());
        let s = (s.0, s.1, s.1 + n);
        let start = 4 * self.rng.below((self.bufs[j].handle.size() - n) / 4 + 1);
        let d = (self.bufs[j].handle.id(), start, start + n);
        let fail = self.rng.chance(self.failure_rate(8));
        if fail {
            self.client
                .inject(FaultPlan::new().fail(Site::Copy, 1, injected("copy")));
        }
        let result = self.on().copy(
            self.bufs[i].handle.slice(s.1..s.2),
            self.bufs[j].handle.slice(d.1..d.2),
        );
        self.client.inject(FaultPlan::new());
        let what = format!("copy {s:?} -> {d:?} (fails: {fail}) -> {result:?}");
        if overlap(&s, &d) {
            assert!(
                matches!(result, Err(Error::InvalidArgument { .. })),
                "an overlapping copy is invalid: {what}"
            );
            return what;
        }
        if !self.bufs[j].allocated {
            // No memory to write is found before any refusal.
            assert!(result.is_err(), "{what}");
            self.expect_refusal(false, &result, &what);
            return what;
        }
        let refused = self.refused(&[s.0, d.0]);
        self.expect_refusal(refused, &result, &what);
        if refused {
            return what;
        }
        let skipped = self.any_stale(&[s]);
        let clean = !skipped && !fail;
        assert_eq!(result.is_ok(), clean, "{what}");
        assert_eq!(
            matches!(result, Err(Error::Skipped { .. })),
            skipped,
            "{what}"
        );
        if !clean {
            self.mark(&[d], STALE);
            self.doom();
            return what;
        }
        self.ordered(&[s.0, d.0]);
        self.mark(&[d], UNKNOWN);
        self.done(&[s], &[d], Op::Copy(s, d));
        what
    }

    pub(super) fn read(&mut self) -> String {
        let i = self.pick();
        let r = self.range(i);
        // Not a device fault: one would claim what is in flight on the stream (rule 23), which the
        // oracle does not follow.
        let fail = self.rng.chance(5);
        if fail {
            self.client
                .inject(FaultPlan::new().fail(Site::Read, 1, injected("read")));
        }
        let result = self.on().read(self.bufs[i].handle.slice(r.1..r.2));
        self.client.inject(FaultPlan::new());
        let what = format!("read {r:?} (fails: {fail}) -> {}", summary(&result));
        if self.records() {
            assert!(
                result.as_ref().is_err_and(Error::is_refusal),
                "a read on a recording stream is refused: {what}"
            );
            return what;
        }
        // The range is checked first: a claimed one returns its failure.
        let stale = self.any_stale(&[r]);
        let refused = !stale && self.refused(&[r.0]);
        self.expect_refusal(refused, &result, &what);
        if refused {
            return what;
        }
        match result {
            // Failed before `order`: no buffer changes hands.
            Err(e) if !stale && fail => assert!(
                matches!(&e, Error::Launch { detail, .. } if detail == "injected at read"),
                "{what}"
            ),
            Err(e) => assert!(stale, "read {r:?} of unclaimed bytes failed: {e}"),
            Ok(bytes) => {
                assert!(!stale && !fail, "read {r:?} succeeded: {what}");
                self.ordered(&[r.0]);
                for (k, (got, want)) in as_words(&bytes).iter().zip(self.values(&r)).enumerate() {
                    if let Some(want) = want {
                        assert_eq!(
                            *got,
                            want,
                            "word {k} of read {r:?} (byte {})",
                            r.1 + 4 * k as u64
                        );
                    }
                }
            }
        }
        what
    }

    pub(super) fn sync(&mut self) -> String {
        let i = self.pick();
        let r = self.range(i);
        let named = self.rng.chance(50);
        let result = if named {
            self.on()
                .sync_buffers(&[self.bufs[i].handle.slice(r.1..r.2)])
        } else {
            self.on().sync()
        };
        let what = if named {
            format!("sync {r:?} -> {result:?}")
        } else {
            format!("sync -> {result:?}")
        };
        // The named buffers are checked first, then the stream's state.
        let named = named && self.any_stale(&[r]);
        match &result {
            Err(e) if named => assert!(!e.unwritten().is_empty(), "{what}"),
            Err(e) if self.records() => assert!(e.is_refusal(), "{what}"),
            Err(_) => panic!("a sync of unclaimed bytes failed: {what}"),
            Ok(()) => assert!(!named && !self.records(), "{what}"),
        }
        what
    }

    pub(super) fn capture(&mut self) -> String {
        // Windows open and close on stream 0 only.
        self.on_other = false;
        match self.window.take() {
            None => {
                let capture = self.client.begin_capture().expect("begin");
                self.window = Some((capture, Window::default()));
                "begin capture".into()
            }
            Some((capture, window)) if self.rng.chance(15) => {
                // Dropped rather than aborted, a third of the time: the same, at the next call.
                let dropped = self.rng.chance(33);
                if dropped {
                    drop(capture);
                } else {
                    self.client.abort_capture(capture).unwrap();
                }
                self.mark(&window.written, STALE);
                format!(
                    "abort capture (dropped: {dropped}, recorded {:?})",
                    window.written
                )
            }
            Some((capture, window)) => {
                let fail = !window.doomed && self.rng.chance(10);
                if fail {
                    self.client
                        .inject(FaultPlan::new().fail(Site::Seal, 1, injected("seal")));
                }
                let result = self.client.end_capture(capture);
                self.client.inject(FaultPlan::new());
                let what = format!(
                    "end capture (doomed: {}, seal fails: {fail}, recorded {:?}) -> {result:?}",
                    window.doomed, window.written
                );
                if window.doomed || fail {
                    assert!(matches!(result, Err(Error::Unsealed { .. })), "{what}");
                    self.mark(&window.written, STALE);
                } else {
                    let graph = result.unwrap_or_else(|e| panic!("a clean window seals: {e}"));
                    self.graphs.push(GraphModel {
                        graph,
                        lost: false,
                        written: window.written,
                        reads: window.reads,
                        ops: window.ops,
                    });
                }
                what
            }
        }
    }

    pub(super) fn replay(&mut self) -> String {
        if self.graphs.is_empty() {
            // Nothing to replay yet: work towards a graph instead.
            return self.capture();
        }
        let g = self.rng.below(self.graphs.len() as u64) as usize;
        let fail = self.rng.chance(20);
        if fail {
            self.client
                .inject(FaultPlan::new().fail(Site::Replay, 1, injected("replay")));
        }
        let result = self.on().replay(&self.graphs[g].graph);
        self.client.inject(FaultPlan::new());
        let what = format!(
            "replay {:?} (fails: {fail}) -> {result:?}",
            self.graphs[g].graph.id()
        );
        if self.records() {
            assert!(result.is_err_and(|e| e.is_refusal()), "{what}");
            return what;
        }
        let model = &self.graphs[g];
        let gone = model
            .written
            .iter()
            .chain(&model.reads)
            .any(|r| self.index_of(r.0).is_none());
        if gone {
            assert!(
                matches!(result, Err(Error::InvalidArgument { .. })),
                "a graph with a freed buffer: {what}"
            );
            return what;
        }
        if model.lost {
            // Nothing of it is left to replay: refused, claiming nothing.
            assert!(
                matches!(result, Err(Error::Refused { .. })),
                "a graph of a lost device: {what}"
            );
            self.refused = true;
            return what;
        }
        let ids: Vec<BufferId> = model
            .written
            .iter()
            .chain(&model.reads)
            .map(|r| r.0)
            .collect();
        let skipped = self.any_stale(&model.reads);
        let written = model.written.clone();
        let ops = model.ops.clone();
        let refused = self.refused(&ids);
        self.expect_refusal(refused, &result, &what);
        if refused {
            return what;
        }
        let clean = !skipped && !fail;
        assert_eq!(result.is_ok(), clean, "skipped: {skipped}: {what}");
        if !clean {
            self.mark(&written, STALE);
            return what;
        }
        self.ordered(&ids);
        self.mark(&written, UNKNOWN);
        for op in &ops {
            self.apply(op);
        }
        what
    }

    pub(super) fn destroy(&mut self) -> String {
        if self.graphs.is_empty() {
            return "destroy: none".into();
        }
        let g = self.rng.below(self.graphs.len() as u64) as usize;
        let model = self.graphs.swap_remove(g);
        if self.rng.chance(25) {
            // Its last handle dropped: destroyed at the next call, failing nothing.
            let id = model.graph.id();
            drop(model);
            return format!("drop {id:?}");
        }
        let fail = self.rng.chance(30);
        if fail {
            self.client
                .inject(FaultPlan::new().fail(Site::Destroy, 1, injected("destroy")));
        }
        let result = self.client.destroy_graph(&model.graph);
        self.client.inject(FaultPlan::new());
        let what = format!(
            "destroy {:?} (fails: {fail}) -> {result:?}",
            model.graph.id()
        );
        if model.lost {
            // Nothing of it is left on the device: destroyed cleanly, the planned fault or not.
            assert!(result.is_ok(), "a graph of a lost device: {what}");
        } else {
            assert_eq!(result.is_err(), fail, "{what}");
            if fail {
                self.mark(&model.written, STALE);
            }
        }
        assert!(
            matches!(
                self.client.replay(&model.graph),
                Err(Error::InvalidArgument { .. }) | Err(Error::Refused { .. })
            ),
            "a destroyed graph is gone: {what}"
        );
        what
    }
}
