//! Launches, the hot path (`benches/launch_path.rs`): bindings resolved,
//! checked and listed in one pass, then run in a scope (rules 17–22, 38).

use super::handles;
use super::ordering::{any_capturing, refuse_recorded_while_capturing};
use crate::few::Few;

use super::*;

impl<B: Backend> Server<B> {
    /// Inlined; an uncached kernel goes to [`launch_uncompiled`](Self::launch_uncompiled).
    #[inline]
    pub(crate) fn launch(
        &mut self,
        stream: StreamId,
        kernel: &Kernel,
        bindings: &[Binding<'_>],
        scalars: &[u8],
        dispatch: Dispatch<'_>,
    ) -> Launched {
        self.check_poison()?;
        self.launch_scoped(stream, kernel, bindings, scalars, dispatch, false)
    }

    /// Compile once the arguments pass; a compile error claims `written` (rule 21).
    #[cold]
    #[inline(never)]
    fn launch_uncompiled(
        &mut self,
        stream: StreamId,
        kernel: &Kernel,
        bindings: &[Binding<'_>],
        scalars: &[u8],
        dispatch: Dispatch<'_>,
        written: Vec<BufferRange>,
    ) -> Launched {
        if let Err(error) = self.ensure_compiled(stream, kernel) {
            return Err(Box::new(failed_writing(
                &mut self.books(),
                Work::new(WorkKind::Launch, stream),
                written,
                error,
            )));
        }
        self.recycle_write_set(written);
        self.launch_scoped(stream, kernel, bindings, scalars, dispatch, true)
    }

    /// A launch over the server split into books and device: one lookup per
    /// binding. After `compiled_now`, a cache miss is an internal error.
    #[inline(always)]
    fn launch_scoped(
        &mut self,
        stream: StreamId,
        kernel: &Kernel,
        bindings: &[Binding<'_>],
        scalars: &[u8],
        dispatch: Dispatch<'_>,
        compiled_now: bool,
    ) -> Launched {
        let (mut books, mut device) = self.split();
        let name = kernel.name();
        let memory = device.memory;
        let indirect = matches!(dispatch, Dispatch::Indirect(_));
        let runs_nothing = match dispatch {
            Dispatch::Groups(groups) => groups.contains(&0),
            Dispatch::Indirect(_) => false,
        };
        let mut written = books.write_set();
        let writes_all = !indirect && !runs_nothing;
        let mut bound: Few<Bound<'_, B::Memory>, 8> = Few::new();
        // The first written buffer without memory; all allocated; all ours.
        let mut unallocated: Option<BufferId> = None;
        let mut all_allocated = true;
        let mut mine = true;
        // Every input allocated and clean: the scope need not look again.
        let mut inputs_clean = true;
        let LaunchRules {
            alignment,
            mask,
            divide,
            ..
        } = *device.rules;
        for (i, binding) in bindings.iter().enumerate() {
            let what = || format!("binding {i} of `{name}`");
            let (r, entry) = handles::resolve(
                books.ledger,
                books.id,
                binding.slice.buffer,
                binding.slice.range,
                &what,
            )?;
            // `resolve` refused reversed and empty ranges: no saturation needed.
            let len = r.range.end - r.range.start;
            if (r.range.start & mask) | (len & 3) != 0
                || (divide && !r.range.start.is_multiple_of(alignment))
            {
                return Err(Box::new(misplaced(what(), r.range, alignment)));
            }
            mine &= entry.last_user == stream;
            let access = binding.access;
            match memory.of_live(r.buffer) {
                Some(memory) => bound.push_with(|| Bound {
                    memory,
                    offset: r.range.start,
                    len,
                    access,
                }),
                None => {
                    all_allocated = false;
                    if access.writes() && unallocated.is_none() {
                        unallocated = Some(r.buffer);
                    }
                }
            }
            if access.reads() {
                inputs_clean &= entry.allocated && entry.taint.is_clean();
            }
            if access.writes() && writes_all {
                written.push(r);
            }
        }
        let bound_dispatch = match dispatch {
            Dispatch::Groups(groups) => Some(BoundDispatch::Groups(groups)),
            Dispatch::Indirect(slice) => {
                let (r, entry) =
                    handles::resolve(books.ledger, books.id, slice.buffer, slice.range, &|| {
                        "indirect dispatch".to_owned()
                    })?;
                if r.range.len() != 12 || r.range.start % 4 != 0 {
                    return Err(Box::new(Error::invalid(
                        "indirect dispatch",
                        format!("{r} must be three aligned u32 counts (12 bytes)"),
                    )));
                }
                mine &= entry.last_user == stream;
                inputs_clean &= entry.allocated && entry.taint.is_clean();
                memory.of(r.buffer).map(|memory| BoundDispatch::Indirect {
                    memory,
                    offset: r.range.start,
                })
            }
        };
        // The buffers it touches, only where some stream captures or crosses.
        let indirect_buffer = match dispatch {
            Dispatch::Indirect(slice) => Some(slice.buffer.id()),
            Dispatch::Groups(_) => None,
        };
        let touched = bindings
            .iter()
            .map(|b| b.slice.buffer.id())
            .chain(indirect_buffer);
        let capturing = any_capturing(books.streams);
        if capturing {
            refuse_recorded_while_capturing(books.streams, books.ledger, stream, touched.clone())?;
        }
        if indirect {
            // Indirect: it may write nothing, so only clean bytes join its write set.
            for binding in bindings.iter().filter(|b| b.access.writes()) {
                let r = BufferRange {
                    buffer: binding.slice.buffer.id(),
                    range: binding.slice.range,
                };
                books.ledger.unclaimed(r, &mut written);
            }
        }
        // Work that never started: no memory to write, or no kernel (rule 21).
        if let Some(unallocated) = unallocated {
            let error = books.ledger.unallocated_error(unallocated);
            written.retain(|w| w.buffer != unallocated);
            return Err(Box::new(failed_writing(
                &mut books,
                Work::new(WorkKind::Launch, stream),
                written,
                error,
            )));
        }
        let Some(compiled) = device.cached(kernel) else {
            if compiled_now {
                books.recycle(written);
                return Err(Box::new(Error::internal(
                    "a kernel just compiled is missing from the cache",
                )));
            }
            return self.launch_uncompiled(stream, kernel, bindings, scalars, dispatch, written);
        };
        if let Dispatch::Groups(groups) = dispatch {
            crate::backend::grid_within(name, groups, device.rules.max_workgroups)?;
        }
        // Checked before the scope opens, so an impossible launch claims nothing.
        let launch = match bound_dispatch {
            Some(dispatch) if all_allocated => Some(Launch {
                name,
                bindings: &bound,
                scalars,
                dispatch,
            }),
            _ => None,
        };
        if let Some(launch) = &launch {
            device.backend.check_launch(compiled, launch)?;
        }
        let recording = capturing
            && books.streams[books.stream_index(stream)]
                .window
                .is_recording();
        let read = if !inputs_clean || recording || cfg!(debug_assertions) {
            read_set(bindings, dispatch)
        } else {
            Few::new()
        };
        // Not a scope's `Result`: its layout cost a store-forwarding stall.
        let running = if inputs_clean {
            ExecuteScope::entering(&mut books, name, stream, &read, written, indirect)
        } else {
            let scope = ExecuteScope::launching(&mut books, name, stream, &read, written);
            let scope = if indirect {
                scope.writing_at_most()
            } else {
                scope
            };
            match scope.run() {
                Ok(running) => running,
                Err(skipped) => return self.conclude(stream, skipped).map_err(Box::new),
            }
        };
        // The body in this function's own code, not a closure.
        let outcome = if runs_nothing {
            running.finish_ok();
            ScopedOutcome::Executed(())
        } else {
            let mut running = running;
            let (books, written) = running.parts();
            let result = device.issue(
                books,
                Site::Launch,
                stream,
                (&touched, mine),
                written,
                |d| {
                    let Some(launch) = &launch else {
                        return Err(lost_memory());
                    };
                    // SAFETY: every binding and indirect count lies aligned inside a
                    // live buffer; host counts are non-zero and within the grid, and
                    // `check_launch` accepted the launch.
                    unsafe { d.backend.launch(d.stream, compiled, launch) }
                },
            );
            match result {
                Ok(()) => {
                    running.finish_ok();
                    ScopedOutcome::Executed(())
                }
                Err(error) => running.finish(Err(error)),
            }
        };
        self.conclude(stream, outcome).map_err(Box::new)
    }
}

/// A launch's result, boxed so success moves a pointer past the lock.
pub(crate) type Launched = std::result::Result<(), Box<Error>>;

/// A binding without memory, out of line so the call's closure inlines.
#[cold]
#[inline(never)]
fn lost_memory() -> Error {
    Error::internal("a launch's binding lost its memory after its check")
}

/// Why a binding's range failed the mask test: offset or length.
#[cold]
fn misplaced(what: String, range: ByteRange, alignment: u64) -> Error {
    if !range.start.is_multiple_of(alignment) {
        return Error::invalid(
            what,
            format!("offset {} is not a multiple of {alignment}", range.start),
        );
    }
    Error::invalid(what, format!("{range} is not whole 4-byte words"))
}

/// The ranges a launch reads: read bindings, then indirect counts.
fn read_set(bindings: &[Binding<'_>], dispatch: Dispatch<'_>) -> Few<BufferRange, 8> {
    let mut read = Few::new();
    let at = |slice: &Slice<'_>| BufferRange {
        buffer: slice.buffer.id(),
        range: slice.range,
    };
    for binding in bindings.iter().filter(|b| b.access.reads()) {
        read.push(at(&binding.slice));
    }
    if let Dispatch::Indirect(slice) = dispatch {
        read.push(at(&slice));
    }
    read
}
