//! The contract's operations on memory and kernels, each a scope around an
//! issue (rules 15–28). Launches are in `launch.rs`.

use smallvec::SmallVec;

use super::*;

impl<B: Backend> Server<B> {
    pub(crate) fn write(&mut self, stream: StreamId, dst: Slice<'_>, data: &[u8]) -> Result<()> {
        self.check_poison()?;
        let r = self.resolve_copy_range(dst, "write destination")?;
        if data.len() as u64 != r.range.len() {
            return Err(Error::invalid(
                "write",
                format!("{} bytes given for {r}", data.len()),
            ));
        }
        self.require_memory(r)?;
        self.refuse_recorded_elsewhere(stream, &[r.buffer])?;
        let mut written = self.write_set();
        written.push(r);
        let (mut books, mut device) = self.split();
        let outcome = ExecuteScope::over(&mut books, Work::new(WorkKind::Write, stream), written)
            .execute(|books, written| {
                device.issue(
                    books,
                    Site::Write,
                    stream,
                    (&[r.buffer].into_iter(), false),
                    written,
                    |d| {
                        let memory = d.memory.get(r.buffer)?;
                        // SAFETY: `r` is resolved inside this live buffer and word-aligned,
                        // `data` is its length, and memory and stream are this backend's.
                        unsafe { d.backend.write(d.stream, memory, r.range.start, data) }
                    },
                )
            });
        self.conclude(stream, outcome)
    }

    /// A host read's first half, under the lock (rule 24); the client waits
    /// unlocked, then calls [`end_read`](Self::end_read).
    pub(crate) fn begin_read(
        &mut self,
        stream: StreamId,
        src: Slice<'_>,
        room: Option<usize>,
    ) -> Result<(PendingWait<B>, u64)> {
        let r = self.check_read(stream, src)?;
        let len = r.range.len();
        if let Some(room) = room
            && room as u64 != len
        {
            return Err(Error::invalid(
                "read",
                format!("{room} bytes of room for {r}"),
            ));
        }
        let index = self.stream_index(stream);
        self.streams[index].drains += 1;
        let mark = self.streams[index].in_flight.mark();
        let begun = self
            .fault(Site::Read, Some(stream))
            .and_then(|()| self.order(stream, &[r.buffer]))
            .and_then(|()| {
                let Server {
                    backend,
                    table,
                    streams,
                    ..
                } = &mut *self;
                let memory = table.memory(r.buffer)?;
                // SAFETY: `check_read` resolved `r` inside this live, allocated buffer,
                // word-aligned, off the record. Only `end_read` or `end_wait` ends it.
                unsafe {
                    backend.begin_read(&mut streams[index].device, memory, r.range.start, len)
                }
            });
        match begun {
            Ok(waiter) => Ok((
                PendingWait {
                    stream,
                    // A recovery between the halves must not pass new bytes as clean.
                    token: WaitToken::new(&self.waits, true),
                    waiter,
                    mark,
                },
                len,
            )),
            Err(error) => {
                self.settle(stream, &error, u64::MAX);
                Err(error)
            }
        }
    }

    /// A host read's second half, checking again what came meanwhile.
    pub(crate) fn end_read(
        &mut self,
        pending: PendingWait<B>,
        waited: Result<()>,
        src: Slice<'_>,
        out: &mut [u8],
    ) -> Result<()> {
        let PendingWait {
            stream,
            waiter,
            mark,
            token,
        } = pending;
        let r = match waited.and_then(|()| self.check_read(stream, src)) {
            Ok(r) => r,
            Err(error) => {
                // Give back what the read held; settle what the wait surfaced.
                return self.end_wait(
                    PendingWait {
                        stream,
                        waiter,
                        mark,
                        token,
                    },
                    Err(error),
                );
            }
        };
        let index = self.stream_index(stream);
        let Server {
            backend,
            table,
            streams,
            ..
        } = &mut *self;
        let read = table.memory(r.buffer).and_then(|memory| {
            // SAFETY: this stream's waiter from `begin_read` on this range returned
            // `Ok`; `check_read` found the range in the same live buffer; `out` fits.
            unsafe {
                backend.end_read(
                    &mut streams[index].device,
                    waiter,
                    memory,
                    r.range.start,
                    out,
                )
            }
        });
        match read {
            Ok(()) => {
                self.streams[index].in_flight.take_to(mark);
                Ok(())
            }
            Err(error) => {
                self.settle(stream, &error, u64::MAX);
                Err(error)
            }
        }
    }

    /// What every read checks before it touches device or host memory.
    pub(super) fn check_read(&mut self, stream: StreamId, src: Slice<'_>) -> Result<BufferRange> {
        self.check_poison()?;
        let r = self.resolve_copy_range(src, "read source")?;
        self.refuse_if_recording(stream, "a host read")?;
        self.table.check(&[r])?;
        self.require_memory(r)?;
        // Before the device call, so before its injected fault too.
        self.refuse_recorded_elsewhere(stream, &[r.buffer])?;
        Ok(r)
    }

    #[cfg(feature = "fault-injection")]
    pub(crate) fn peek_vec(&mut self, stream: StreamId, src: Slice<'_>) -> Result<Vec<u8>> {
        let r = self.resolve_copy_range(src, "peek source")?;
        self.refuse_if_recording(stream, "a peek")?;
        self.require_memory(r)?;
        self.refuse_recorded_elsewhere(stream, &[r.buffer])?;
        let mut out = host_vec(r.range.len())?;
        self.device_read(stream, r, &mut out)?;
        Ok(out)
    }

    #[cfg(feature = "fault-injection")]
    pub(super) fn device_read(
        &mut self,
        stream: StreamId,
        r: BufferRange,
        out: &mut [u8],
    ) -> Result<()> {
        self.order(stream, &[r.buffer])?;
        let index = self.stream_index(stream);
        let Server {
            backend,
            table,
            streams,
            ..
        } = self;
        let memory = table.memory(r.buffer)?;
        // SAFETY: the caller resolved `r` inside this live buffer, word-aligned,
        // sized `out` to it and refused a recording stream.
        unsafe { backend.read(&mut streams[index].device, memory, r.range.start, out) }
    }

    pub(crate) fn copy(&mut self, stream: StreamId, src: Slice<'_>, dst: Slice<'_>) -> Result<()> {
        self.check_poison()?;
        let s = self.resolve_copy_range(src, "copy source")?;
        let d = self.resolve_copy_range(dst, "copy destination")?;
        if s.range.len() != d.range.len() {
            return Err(Error::invalid(
                "copy",
                format!("source {s} and destination {d} differ in length"),
            ));
        }
        if s.buffer == d.buffer && s.range.intersects(d.range) {
            return Err(Error::invalid("copy", format!("{s} and {d} overlap")));
        }
        self.require_memory(d)?;
        self.refuse_recorded_elsewhere(stream, &[s.buffer, d.buffer])?;
        let mut written = self.write_set();
        written.push(d);
        let label = self.copy_label.clone();
        let read = [s];
        let (mut books, mut device) = self.split();
        let outcome = ExecuteScope::launching(&mut books, &label, stream, &read, written).execute(
            |books, written| {
                device.issue(
                    books,
                    Site::Copy,
                    stream,
                    (&[s.buffer, d.buffer].into_iter(), false),
                    written,
                    |dev| {
                        let (src, dst) = (dev.memory.get(s.buffer)?, dev.memory.get(d.buffer)?);
                        // SAFETY: both ranges are resolved inside live buffers, word-aligned,
                        // equally long, and do not overlap (checked above).
                        unsafe {
                            dev.backend.copy(
                                dev.stream,
                                src,
                                s.range.start,
                                dst,
                                d.range.start,
                                s.range.len(),
                            )
                        }
                    },
                )
            },
        );
        self.conclude(stream, outcome)
    }

    /// One rank's part of a device-transport collective, as this server's
    /// work; a skip here answers like a failed call. With `reads` false it
    /// only writes, so an old failure on the output heals (rule 41).
    pub(crate) fn issue_collective(
        &mut self,
        stream: StreamId,
        name: (&str, Option<RecordedRound>),
        (input, reads): (Slice<'_>, bool),
        output: Slice<'_>,
        call: impl FnOnce(&mut B, &mut B::Stream, Resolved<'_, B>, Resolved<'_, B>) -> Result<()>,
    ) -> Result<()> {
        self.issue_library_call(
            stream,
            name,
            (reads.then_some(input), Some(output)),
            |backend, stream, input, output| match (input, output) {
                (Some(input), Some(output)) => call(backend, stream, input, output),
                (None, Some(output)) => call(backend, stream, output.clone(), output),
                _ => Err(Error::internal("a collective lost its buffers")),
            },
        )
    }

    /// One rank's half of a transfer; never recorded, not being a round.
    pub(crate) fn issue_transfer(
        &mut self,
        stream: StreamId,
        name: &str,
        (data, writes): (Slice<'_>, bool),
        call: impl FnOnce(&mut B, &mut B::Stream, Resolved<'_, B>) -> Result<()>,
    ) -> Result<()> {
        let buffers = if writes {
            (None, Some(data))
        } else {
            (Some(data), None)
        };
        self.issue_library_call(
            stream,
            (name, None),
            buffers,
            |backend, stream, input, output| match input.or(output) {
                Some(data) => call(backend, stream, data),
                None => Err(Error::internal("a transfer lost its buffer")),
            },
        )
    }

    fn issue_library_call(
        &mut self,
        stream: StreamId,
        (name, round): (&str, Option<RecordedRound>),
        (input, output): (Option<Slice<'_>>, Option<Slice<'_>>),
        call: impl FnOnce(
            &mut B,
            &mut B::Stream,
            Option<Resolved<'_, B>>,
            Option<Resolved<'_, B>>,
        ) -> Result<()>,
    ) -> Result<()> {
        self.check_poison()?;
        let i = input
            .map(|input| self.resolve_copy_range(input, "collective input"))
            .transpose()?;
        let o = output
            .map(|output| self.resolve_copy_range(output, "collective output"))
            .transpose()?;
        for r in i.iter().chain(&o) {
            self.require_memory(*r)?;
        }
        let recording = self.streams[self.stream_index(stream)]
            .window
            .is_recording();
        if recording && round.is_none() {
            return Err(Error::refused(format!(
                "{name} on a recording stream: it is no round of a group, so it is not recorded"
            )));
        }
        let touched: SmallVec<[BufferId; 2]> = i.iter().chain(&o).map(|r| r.buffer).collect();
        self.refuse_recorded_elsewhere(stream, &touched)?;
        let mut written = self.write_set();
        written.extend(o);
        let label: Arc<str> = Arc::from(name);
        let read: SmallVec<[BufferRange; 1]> = i.into_iter().collect();
        let (mut books, mut device) = self.split();
        let outcome = ExecuteScope::launching(&mut books, &label, stream, &read, written).execute(
            |books, written| {
                device.issue(
                    books,
                    Site::Collective,
                    stream,
                    (&touched.iter().copied(), false),
                    written,
                    |dev| {
                        let resolve = |r: Option<BufferRange>| -> Result<Option<Resolved<'_, B>>> {
                            r.map(|r| Ok((dev.memory.get(r.buffer)?, r.range.start..r.range.end)))
                                .transpose()
                        };
                        let (src, dst) = (resolve(i)?, resolve(o)?);
                        call(dev.backend, dev.stream, src, dst)
                    },
                )
            },
        );
        self.conclude(stream, outcome)?;
        if let Some(round) = round {
            let index = self.stream_index(stream);
            self.streams[index].window.record_round(round);
        }
        Ok(())
    }

    pub(crate) fn compile(&mut self, stream: StreamId, kernel: &Kernel) -> Result<()> {
        self.check_poison()?;
        self.ensure_compiled(stream, kernel).map(drop)
    }

    pub(super) fn ensure_compiled(&mut self, stream: StreamId, kernel: &Kernel) -> Result<usize> {
        let id = kernel.id();
        if let Some((last, index)) = self.last_kernel
            && last == id
        {
            return Ok(index);
        }
        if let Some(&index) = self.kernel_index.get(&id) {
            self.last_kernel = Some((id, index));
            return Ok(index);
        }
        let language = kernel.source().language();
        if !self.backend.accepts(language) {
            return Err(Error::Compile {
                backend: B::NAME,
                kernel: kernel.name().clone(),
                log: format!("{} does not take {language} kernels", B::NAME),
            });
        }
        let compiled = self
            .fault(Site::Compile, Some(stream))
            .and_then(|()| self.backend.compile(kernel));
        match compiled {
            Ok(compiled) => {
                let index = self.kernels.len();
                self.kernels.push(compiled);
                self.kernel_index.insert(id, index);
                self.last_kernel = Some((id, index));
                Ok(index)
            }
            Err(error) => {
                // A fault while loading a module poisons as one running it (rule 36).
                if error.is_sticky() {
                    self.poison_with(&error);
                }
                Err(error)
            }
        }
    }

    /// A sync's first half, under the lock: the checks and the wait's start.
    pub(crate) fn begin_sync(
        &mut self,
        stream: StreamId,
        buffers: &[Slice<'_>],
    ) -> Result<PendingWait<B>> {
        self.check_poison()?;
        if !buffers.is_empty() {
            self.check(buffers)?;
        }
        self.refuse_if_recording(stream, "a sync")?;
        let index = self.stream_index(stream);
        self.streams[index].drains += 1;
        self.begin_wait(stream, Some(Site::Sync))
    }

    pub(crate) fn begin_watch(&mut self, stream: StreamId) -> Result<PendingWait<B>> {
        self.check_poison()?;
        self.refuse_if_recording(stream, "a watch")?;
        self.begin_wait(stream, None)
    }

    pub(crate) fn flush(&mut self, stream: StreamId) -> Result<()> {
        self.check_poison()?;
        let index = self.stream_index(stream);
        if self.streams[index].window.is_recording() {
            return Ok(());
        }
        // SAFETY: the stream is this server's and not recording (above).
        let flushed = unsafe { self.backend.flush(&mut self.streams[index].device) };
        if let Err(error) = &flushed {
            self.settle(stream, error, u64::MAX);
        }
        flushed
    }

    pub(crate) fn fail_writing(
        &mut self,
        stream: StreamId,
        slices: &[Slice<'_>],
        error: Error,
    ) -> Result<()> {
        self.check_poison()?;
        let mut written = self.write_set();
        for (i, slice) in slices.iter().enumerate() {
            written.push(self.resolve_with(slice.buffer, slice.range, &|| {
                format!("slice {i} of a failed write set")
            })?);
        }
        let error = failed_writing(
            &mut self.books(),
            Work::new(WorkKind::Launch, stream),
            written,
            error,
        );
        if error.is_sticky() {
            self.poison_with(&error);
        }
        Ok(())
    }

    pub(crate) fn check(&mut self, slices: &[Slice<'_>]) -> Result<()> {
        self.check_poison()?;
        let mut ranges = Vec::with_capacity(slices.len());
        for (i, slice) in slices.iter().enumerate() {
            ranges.push(self.resolve(slice.buffer, slice.range, &format!("slice {i}"))?);
        }
        self.table.check(&ranges)
    }
}
