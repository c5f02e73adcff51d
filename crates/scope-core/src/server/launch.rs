//! Launches: each binding resolved, checked and listed in one pass, the
//! launch checked by the backend before its scope opens, and run inside
//! it (rules 17–22, 38). Apart from the other work (`work.rs`) because it
//! is the path a runtime takes most, and the one its cost is measured on
//! (`benches/launch_path.rs`).

use super::handles;
use super::ordering::{any_capturing, refuse_recorded_while_capturing};
use crate::few::Few;

use super::*;

impl<B: Backend> Server<B> {
    /// Inlined into `Client::launch`, its one caller: the call and its
    /// frame were 21 instructions of every launch. A kernel not yet in the
    /// cache takes [`launch_uncompiled`](Self::launch_uncompiled), out of
    /// line, so that the loop's launch carries none of it.
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

    /// A launch whose kernel was not in the cache, once every check of its
    /// arguments passed: compiled only now, so that a launch refused for
    /// them never compiles, and one whose kernel does not compile claims
    /// its outputs, `written` (rule 21). Then launched as any other.
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

    /// A launch, over the server split into its books and its device
    /// ([`Books`] says why): one pass over the bindings resolves each with
    /// one lookup, checks it, and adds it to the lists the launch needs —
    /// the write set, and the one list the backend both checks and
    /// launches. A kernel not yet in the cache goes to
    /// [`launch_uncompiled`](Self::launch_uncompiled), with its write set,
    /// once every check has passed; `compiled_now` says it came from there,
    /// and a kernel still missing is then an internal error.
    ///
    /// Inlined into both callers, so that the result is written once, where
    /// the caller returns it, rather than passed out through an enum.
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
        // What a clean launch over host-given counts writes: its written
        // bindings (an indirect launch's is worked out below).
        let mut written = books.write_set();
        let writes_all = !indirect && !runs_nothing;
        let mut bound: Few<Bound<'_, B::Memory>, 8> = Few::new();
        // The first buffer written that has no memory; whether every
        // buffer has memory (else the scope skips or claims, and the
        // backend is asked nothing); whether every buffer was last used on
        // this stream (else the launch waits for another).
        let mut unallocated: Option<BufferId> = None;
        let mut all_allocated = true;
        let mut mine = true;
        // Whether every input is allocated and carries no failure at all:
        // then none can make the scope skip, and it need not look again
        // ([`ExecuteScope::entering`]).
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
            // `resolve` refused a reversed or empty range: the subtraction
            // needs none of `len`'s saturation.
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
        // `None` when the counts' buffer has no memory.
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
        // The buffers it touches, asked for only where some stream captures
        // or some buffer was last used on another stream.
        let indirect_buffer = match dispatch {
            Dispatch::Indirect(slice) => Some(slice.buffer.id()),
            Dispatch::Groups(_) => None,
        };
        let touched = bindings
            .iter()
            .map(|b| b.slice.buffer.id())
            .chain(indirect_buffer);
        // Whether any stream captures: where none does (the common case),
        // nothing is refused and this stream does not record.
        let capturing = any_capturing(books.streams);
        if capturing {
            refuse_recorded_while_capturing(books.streams, books.ledger, stream, touched.clone())?;
        }
        if indirect {
            // An indirect launch's counts are on the device: the core cannot
            // know, when the launch concludes, whether it wrote anything (a
            // zero count, or one past the device's limit, runs nothing). So
            // it heals nothing: bytes that carried a failure keep it, and
            // only bytes that were clean are in its write set — clean
            // whether it ran or not, and claimed if it fails.
            for binding in bindings.iter().filter(|b| b.access.writes()) {
                let r = BufferRange {
                    buffer: binding.slice.buffer.id(),
                    range: binding.slice.range,
                };
                books.ledger.unclaimed(r, &mut written);
            }
        }
        // Work that never started: a buffer with no memory to write, a
        // kernel that does not compile (rule 21).
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
        // The launch as the backend sees it: checked now, before the scope
        // opens (a launch no device could run claims nothing), and launched
        // as it was checked. `None` when a buffer has no memory: the scope
        // then skips the launch (an input carries why) or claims its
        // outputs, and the backend is asked nothing.
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
        // The ranges it reads, in order, the counts last: where a skip
        // looks for a failure, and what a recording window keeps. A launch
        // whose inputs are clean, on a stream that is not recording, needs
        // neither, and does not gather them (but for the debug check of
        // `entering`).
        let recording = capturing
            && books.streams[books.stream_index(stream)]
                .window
                .is_recording();
        let read = if !inputs_clean || recording || cfg!(debug_assertions) {
            read_set(bindings, dispatch)
        } else {
            Few::new()
        };
        // A scope that runs, never a `Result` of one: an enum that also
        // held a skip's outcome laid an `Error`'s 4-byte fields over the
        // write set's length, so the compiler stored that length in two
        // halves and read it back whole, a load the processor cannot
        // forward from the two stores (perf put a tenth of a launch's
        // samples just after it). A skip settles here instead.
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
        // The body in this function's own code, not a closure
        // ([`ExecuteScope::run`]).
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
                    // SAFETY: every binding was resolved inside its live
                    // buffer with an aligned offset and whole words, an
                    // indirect dispatch's 12 aligned bytes likewise (all
                    // above); host-given counts are non-zero
                    // (`runs_nothing`) and within the grid, and the
                    // backend's `check_launch` accepted this very launch
                    // for this kernel, above.
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

/// What a launch returns inside the core: its error boxed, so that the
/// success path moves a pointer-sized result rather than an [`Error`]'s
/// bytes through every step and out past the lock. The client unboxes it.
pub(crate) type Launched = std::result::Result<(), Box<Error>>;

/// The error of a launch that reached its device call with a binding that
/// has no memory: out of line, so that the device call's closure stays
/// small enough to inline into the launch.
#[cold]
#[inline(never)]
fn lost_memory() -> Error {
    Error::internal("a launch's binding lost its memory after its check")
}

/// Why a binding's range is refused, past the mask test of
/// [`Server::launch_scoped`]: its offset off the backend's alignment, or its
/// length not whole 4-byte words.
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

/// The ranges a launch reads, in order: its read bindings, then an
/// indirect dispatch's counts. Every one was resolved already, so each is
/// the binding's own buffer and range.
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
