//! The conformance suite: one test per behaviour, for any server.
//!
//! A server's test module implements [`Suite`] — how to get a client, and
//! four kernels in its own language — and expands
//! [`conformance_tests!`](crate::conformance_tests) to get one `#[test]` per
//! behaviour below. Each test names the rules of `docs/ERROR_MODEL.md` it
//! checks.
//!
//! The same [`Suite`] drives [`random_sequences`] ([`property`]): random
//! interleavings of every operation, with faults injected, checked against
//! an oracle after each one — the sequences nobody wrote a test for. Each
//! server runs it as one more `#[test]`.
//!
//! A server with no device here prints `skipped: no <backend> device` and
//! returns; with `SCOPE_REQUIRE=<backend>` (or `all`) a missing device fails
//! the test instead, which is how `cargo xtask test --backend X` makes a
//! missing device an error.

pub mod contract;
pub mod property;
pub mod soak;

pub use contract::*;
pub use property::random_sequences;

use crate::backend::Backend;
use crate::client::Client;
use crate::error::Result;
use crate::kernel::Kernel;

/// What a server supplies to run the suite against itself.
///
/// The kernels work on `u32` words with a workgroup (block) of 64
/// invocations, one word each, and are dispatched over
/// `ceil(n / 64)` groups. Scalars are little-endian `u32`s.
pub trait Suite: 'static {
    /// The backend under test.
    type Backend: Backend;

    /// A client of a fresh server; [`crate::Error::BackendUnavailable`]
    /// when there is no device here.
    fn client() -> Result<Client<Self::Backend>>;

    /// `out[i] = value` for `i < n`. Bindings `[out (write)]`; scalars
    /// `[n, value]`.
    fn fill() -> Kernel;

    /// `out[i] = in[i]` for `i < n`. Bindings `[in (read), out (write)]`;
    /// scalars `[n]`.
    fn copy() -> Kernel;

    /// `out[i] = a[i] + b[i]` (wrapping) for `i < n`. Bindings
    /// `[a (read), b (read), out (write)]`; scalars `[n]`.
    fn add() -> Kernel;

    /// A kernel in the backend's language that does not compile.
    fn broken() -> Kernel;

    /// The scalar blob for a launch of `kernel` over `bindings` whose scalars
    /// are `values`. Defaults to the values as little-endian `u32`s; a
    /// kernel compiler with its own argument layout (cubecl's info struct,
    /// say) packs them its way.
    #[allow(unused_variables)]
    fn scalar_blob(kernel: &Kernel, bindings: &[Binding<'_>], values: &[u32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// A size no larger than the backend's largest allocation that the
    /// device cannot provide, to test a real out-of-memory; `None` to rely
    /// on injected ones only.
    fn oversized() -> Option<u64> {
        None
    }

    /// Called at the end of every test
    /// [`conformance_tests!`](crate::conformance_tests) makes, on the test's
    /// thread: the place for a backend's own end-of-test check (a mock
    /// driver asserting it refused nothing). Nothing by default.
    fn finished() {}
}

/// Whether `SCOPE_REQUIRE` (a comma-separated list, or `all`) names
/// `backend`, so that a missing device is a failure rather than a skip.
pub fn required(backend: &str) -> bool {
    std::env::var("SCOPE_REQUIRE").is_ok_and(|v| {
        v.split(',')
            .map(str::trim)
            .any(|b| b.eq_ignore_ascii_case(backend) || b.eq_ignore_ascii_case("all"))
    })
}

/// A client from `make`, or `None` after printing `skipped: no <backend>
/// device (<why>)` when the backend is unavailable here.
///
/// # Panics
///
/// When the backend is unavailable and [`required`]; or when `make` fails
/// for any reason other than unavailability — a device that is present but
/// broken is a failure, never a skip.
pub fn client_or_skip<B: Backend>(make: impl FnOnce() -> Result<Client<B>>) -> Option<Client<B>> {
    match make() {
        Ok(client) => Some(client),
        Err(crate::Error::BackendUnavailable { reason, .. }) => {
            assert!(
                !required(B::NAME),
                "SCOPE_REQUIRE names {} but it is unavailable: {reason}",
                B::NAME
            );
            println!("skipped: no {} device ({reason})", B::NAME);
            None
        }
        Err(other) => panic!("{} is present but failed to start: {other}", B::NAME),
    }
}

// ----- helpers --------------------------------------------------------------

use std::sync::Arc;

use parking_lot::Mutex;

use crate::capture::CaptureState;
use crate::error::Error;
use crate::fault::{FaultPlan, Site};
use crate::handle::{Binding, Buffer, Dispatch};
use crate::id::StreamId;

pub(crate) const WORDS: u32 = 256;

fn groups(n: u32) -> Dispatch<'static> {
    Dispatch::linear(n.div_ceil(64))
}

fn as_bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Launch `kernel` with `values` packed by the suite's [`Suite::scalar_blob`].
fn launch<S: Suite>(
    client: &Client<S::Backend>,
    kernel: &Kernel,
    bindings: &[Binding<'_>],
    values: &[u32],
    dispatch: Dispatch<'_>,
) -> Result<()> {
    let blob = S::scalar_blob(kernel, bindings, values);
    client.launch(kernel, bindings, &blob, dispatch)
}

fn as_words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn words_of(buffer: &Buffer) -> u32 {
    u32::try_from(buffer.size() / 4).unwrap_or(u32::MAX)
}

fn alloc<B: Backend>(client: &Client<B>, words: u32) -> Buffer {
    client.try_allocate(u64::from(words) * 4).expect("allocate")
}

fn upload<B: Backend>(client: &Client<B>, words: &[u32]) -> Buffer {
    client.upload(&as_bytes(words)).expect("upload")
}

fn read<B: Backend>(client: &Client<B>, buffer: &Buffer) -> Result<Vec<u32>> {
    client.read(buffer).map(|b| as_words(&b))
}

fn fill<S: Suite>(client: &Client<S::Backend>, out: &Buffer, value: u32) -> Result<()> {
    let n = words_of(out);
    launch::<S>(
        client,
        &S::fill(),
        &[Binding::write(out)],
        &[n, value],
        groups(n),
    )
}

fn copy<S: Suite>(client: &Client<S::Backend>, input: &Buffer, out: &Buffer) -> Result<()> {
    let n = words_of(out);
    launch::<S>(
        client,
        &S::copy(),
        &[Binding::read(input), Binding::write(out)],
        &[n],
        groups(n),
    )
}

fn add<S: Suite>(client: &Client<S::Backend>, a: &Buffer, b: &Buffer, out: &Buffer) -> Result<()> {
    let n = words_of(out);
    launch::<S>(
        client,
        &S::add(),
        &[Binding::read(a), Binding::read(b), Binding::write(out)],
        &[n],
        groups(n),
    )
}

/// An error to fail the next launch with.
fn injected(what: &str) -> Error {
    Error::Launch {
        kernel: Arc::from(what),
        stream: StreamId(0),
        detail: format!("injected: {what}"),
    }
}

/// Fail the next launch on any stream.
fn fail_next_launch<B: Backend>(client: &Client<B>, what: &str) {
    client.inject(FaultPlan::new().fail(Site::Launch, 1, injected(what)));
}

fn setup<S: Suite>() -> Option<Client<S::Backend>> {
    client_or_skip(S::client)
}

fn assert_root_contains(error: &Error, text: &str) {
    let entries = error.unwritten();
    assert!(!entries.is_empty(), "expected a read report, got: {error}");
    assert!(
        entries[0].root.to_string().contains(text),
        "root cause should mention {text:?}: {error}"
    );
}

// ----- the suite ------------------------------------------------------------

/// Clean work computes the right numbers and leaves nothing held (rules 15,
/// 16, 19).
pub fn clean_work_computes<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    let sum = alloc(&c, WORDS);
    fill::<S>(&c, &a, 3).unwrap();
    copy::<S>(&c, &a, &b).unwrap();
    add::<S>(&c, &a, &b, &sum).unwrap();
    assert_eq!(read(&c, &sum).unwrap(), vec![6; WORDS as usize]);
    assert_eq!(
        c.failures_held(),
        0,
        "the success path leaves no failure behind"
    );
}

/// A read three skips downstream of a failure names the root and every hop,
/// newest first (rules 17, 18, 25, 26).
pub fn chain_report_over_three_hops<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    let d = alloc(&c, WORDS);
    let x = upload(&c, &vec![1; WORDS as usize]);
    let out = alloc(&c, WORDS);
    fail_next_launch(&c, "root-fill");
    assert!(fill::<S>(&c, &a, 1).is_err());
    assert!(matches!(copy::<S>(&c, &a, &b), Err(Error::Skipped { .. })));
    assert!(matches!(copy::<S>(&c, &b, &d), Err(Error::Skipped { .. })));
    assert!(matches!(
        add::<S>(&c, &x, &d, &out),
        Err(Error::Skipped { .. })
    ));
    let error = read(&c, &out).unwrap_err();
    let report = &error.unwritten()[0];
    assert_root_contains(&error, "root-fill");
    let kernels: Vec<_> = report
        .chain
        .hops
        .iter()
        .map(|h| h.kernel.to_string())
        .collect();
    assert_eq!(
        kernels,
        vec![
            S::add().name().to_string(),
            S::copy().name().to_string(),
            S::copy().name().to_string()
        ]
    );
    assert_eq!(report.chain.hops[0].needed.buffer, d.id());
    assert_eq!(report.chain.hops[1].needed.buffer, b.id());
    assert_eq!(report.chain.hops[2].needed.buffer, a.id());
    assert_eq!(report.carriers, 4, "a, b, d and out carry the one failure");
    let text = error.to_string();
    assert!(
        text.contains(&format!("{}", a.id())) && text.contains("root-fill"),
        "{text}"
    );
    // The same failure, not a new one per hop.
    let from_b = read(&c, &b).unwrap_err();
    assert_eq!(from_b.unwritten()[0].failure, report.failure);
}

/// A skipped launch never runs: a sentinel it would overwrite survives
/// (rules 17, 18).
pub fn skipped_launch_never_runs<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let bad = alloc(&c, WORDS);
    let out = upload(&c, &vec![0xdead_beef; WORDS as usize]);
    fail_next_launch(&c, "poisoned-input");
    assert!(fill::<S>(&c, &bad, 1).is_err());
    let outcome = copy::<S>(&c, &bad, &out);
    assert!(matches!(outcome, Err(Error::Skipped { .. })), "{outcome:?}");
    assert!(
        read(&c, &out).is_err(),
        "the skipped launch's output carries the failure"
    );
    let under = as_words(&c.peek(&out).unwrap());
    assert_eq!(
        under,
        vec![0xdead_beef; WORDS as usize],
        "the body never ran"
    );
}

/// A failed write over part of a buffer claims only that part; rewrites heal
/// exactly what they cover; reads never clear (rules 8, 11, 12, 19, 27).
pub fn partial_writes_and_healing<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let buf = upload(&c, &vec![5; WORDS as usize]);
    let half = u64::from(WORDS) * 2;
    fail_next_launch(&c, "half");
    let n = WORDS / 2;
    assert!(
        launch::<S>(
            &c,
            &S::fill(),
            &[buf.slice(0..half).write()],
            &[n, 9],
            groups(n)
        )
        .is_err()
    );
    assert!(c.read(buf.slice(0..half)).is_err());
    assert!(c.read(buf.slice(0..4)).is_err());
    assert_eq!(
        as_words(&c.read(buf.slice(half..)).unwrap()),
        vec![5; n as usize]
    );
    assert!(
        c.read(buf.slice(0..half)).is_err(),
        "a read never clears a failure"
    );
    c.write(buf.slice(0..64), &[7; 64]).unwrap();
    assert!(c.read(buf.slice(0..64)).is_ok());
    assert!(
        c.read(buf.slice(64..half)).is_err(),
        "the rest is still unwritten"
    );
    assert!(
        c.read(buf.slice(60..68)).is_err(),
        "a straddling read fails"
    );
    c.write(buf.slice(64..half), &vec![7; (half - 64) as usize])
        .unwrap();
    assert!(read(&c, &buf).is_ok());
    assert_eq!(c.failures_held(), 0, "healing released the failure");
}

/// Work that failed or was skipped inside a window dooms it, and its
/// recorded outputs carry the reason (rules 31, 33).
pub fn capture_doomed_by_failure<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    let capture = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 1).unwrap();
    fail_next_launch(&c, "inside-window");
    assert!(fill::<S>(&c, &b, 2).is_err());
    let error = c.end_capture(capture).unwrap_err();
    assert!(matches!(error, Error::Unsealed { .. }), "{error}");
    assert!(error.to_string().contains("inside-window"), "{error}");
    assert_eq!(c.capture_state(), CaptureState::NoCapture);
    let on_a = read(&c, &a).unwrap_err();
    assert!(
        matches!(&*on_a.unwritten()[0].root, Error::Unsealed { .. }),
        "{on_a}"
    );
}

/// A skip inside a window dooms it (rules 18, 31).
pub fn capture_doomed_by_skip<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let bad = alloc(&c, WORDS);
    let out = alloc(&c, WORDS);
    fail_next_launch(&c, "before-window");
    assert!(fill::<S>(&c, &bad, 1).is_err());
    let capture = c.begin_capture().unwrap();
    assert!(matches!(
        copy::<S>(&c, &bad, &out),
        Err(Error::Skipped { .. })
    ));
    let error = c.end_capture(capture).unwrap_err();
    assert!(matches!(error, Error::Unsealed { .. }), "{error}");
}

/// A window ended from another stream is abandoned (rule 33).
pub fn abandoned_window<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let other = c.new_stream().unwrap();
    let a = alloc(&c, WORDS);
    let capture = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 1).unwrap();
    let error = other.end_capture(capture).unwrap_err();
    assert!(matches!(error, Error::Unsealed { .. }));
    assert!(error.to_string().contains("abandons"), "{error}");
    assert!(read(&c, &a).is_err(), "the recorded output is claimed");
    assert_eq!(c.capture_state(), CaptureState::NoCapture);
}

/// A sealed graph replays its work, heals its outputs, and replays host
/// writes with the bytes given when they were recorded (rules 32, 34).
pub fn replay_success<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let input = upload(&c, &vec![1; WORDS as usize]);
    let mid = alloc(&c, WORDS);
    let out = alloc(&c, WORDS);
    // Taint `out` first: a clean replay must heal it.
    fail_next_launch(&c, "stale-out");
    assert!(fill::<S>(&c, &out, 0).is_err());
    let capture = c.begin_capture().unwrap();
    c.write(&input, &as_bytes(&vec![4; WORDS as usize]))
        .unwrap();
    copy::<S>(&c, &input, &mid).unwrap();
    add::<S>(&c, &mid, &input, &out).unwrap();
    let graph = c.end_capture(capture).unwrap();
    // The recorded work has not run yet.
    assert_eq!(read(&c, &input).unwrap(), vec![1; WORDS as usize]);
    c.write(&input, &as_bytes(&vec![100; WORDS as usize]))
        .unwrap();
    for _ in 0..3 {
        c.replay(&graph).unwrap();
    }
    assert_eq!(
        read(&c, &out).unwrap(),
        vec![8; WORDS as usize],
        "replay wrote the retained bytes"
    );
    assert_eq!(c.failures_held(), 0);
    c.destroy_graph(&graph).unwrap();
}

/// A replay that fails claims every output with the replay's error (rule 34).
pub fn replay_failure<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    let capture = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 1).unwrap();
    copy::<S>(&c, &a, &b).unwrap();
    let graph = c.end_capture(capture).unwrap();
    c.inject(FaultPlan::new().fail(Site::Replay, 1, injected("replay-broke")));
    assert!(c.replay(&graph).is_err());
    for buffer in [&a, &b] {
        assert_root_contains(&read(&c, buffer).unwrap_err(), "replay-broke");
    }
    c.replay(&graph).unwrap();
    assert_eq!(
        read(&c, &b).unwrap(),
        vec![1; WORDS as usize],
        "the next replay heals"
    );
}

/// Replaying or destroying an unknown or destroyed graph is an error that
/// claims nothing; a failed destroy claims the graph's outputs (rules 34,
/// 35).
pub fn unknown_and_destroyed_graphs<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let capture = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 1).unwrap();
    let graph = c.end_capture(capture).unwrap();
    c.destroy_graph(&graph).unwrap();
    let held = c.failures_held();
    assert!(matches!(
        c.replay(&graph),
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        c.destroy_graph(&graph),
        Err(Error::InvalidArgument { .. })
    ));
    assert_eq!(c.failures_held(), held, "claims nothing");
    if let Some(other) = setup::<S>() {
        assert!(matches!(
            other.replay(&graph),
            Err(Error::InvalidArgument { .. })
        ));
    }
    let capture = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 2).unwrap();
    let graph = c.end_capture(capture).unwrap();
    c.replay(&graph).unwrap();
    c.inject(FaultPlan::new().fail(Site::Destroy, 1, injected("destroy-wait")));
    assert!(c.destroy_graph(&graph).is_err());
    assert_root_contains(&read(&c, &a).unwrap_err(), "destroy-wait");
}

/// A failed allocation's buffer carries its error; launches reading it skip;
/// the device keeps working (rules 17, 28, 37).
pub fn failed_allocation_keeps_device_working<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let oom = || Error::OutOfMemory {
        backend: "injected",
        requested: 1024,
        detail: "injected".into(),
    };
    // Two failures: the server retries once after trimming its caches.
    c.inject(
        FaultPlan::new()
            .fail(Site::Allocate, 1, oom())
            .fail(Site::Allocate, 2, oom()),
    );
    let lost = c.allocate(1024).unwrap();
    assert!(read(&c, &lost).unwrap_err().is_out_of_memory());
    let out = alloc(&c, WORDS);
    assert!(matches!(
        copy::<S>(&c, &lost, &out),
        Err(Error::Skipped { .. })
    ));
    assert!(read(&c, &out).unwrap_err().is_out_of_memory());
    // One failure: the retry succeeds.
    c.inject(FaultPlan::new().fail(Site::Allocate, 1, oom()));
    let retried = c.try_allocate(1024).unwrap();
    fill::<S>(&c, &retried, 4).unwrap();
    assert_eq!(read(&c, &retried).unwrap(), vec![4; 256]);
    if let Some(size) = S::oversized() {
        let huge = c.allocate(size).unwrap();
        assert!(c.read(huge.slice(0..4)).unwrap_err().is_out_of_memory());
        assert!(c.try_allocate(size).unwrap_err().is_out_of_memory());
    }
    let fine = alloc(&c, WORDS);
    fill::<S>(&c, &fine, 9).unwrap();
    assert_eq!(read(&c, &fine).unwrap(), vec![9; WORDS as usize]);
    drop((lost, out));
    assert_eq!(
        c.failures_held(),
        0,
        "freeing the carriers empties the store"
    );
}

/// A sticky fault poisons the device: every later operation fails fast
/// naming it, and work in flight carries it (rule 36).
pub fn sticky_fault_poisons<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let early = alloc(&c, WORDS);
    let victim = alloc(&c, WORDS);
    fill::<S>(&c, &early, 1).unwrap();
    c.inject(FaultPlan::new().poison_at(1, "injected", "ILLEGAL_ADDRESS"));
    let error = fill::<S>(&c, &victim, 2).unwrap_err();
    assert!(error.is_sticky(), "{error}");
    assert!(c.poison().is_some());
    let later = c.allocate(64).unwrap_err();
    assert!(later.is_device_poisoned(), "{later}");
    assert!(later.to_string().contains("ILLEGAL_ADDRESS"), "{later}");
    assert!(c.read(&early).unwrap_err().is_device_poisoned());
    assert!(c.sync().unwrap_err().is_device_poisoned());
    // Work in flight when the fault surfaced carries the poison, seen
    // through the report's chain.
    let in_flight = c.check(&[early.all()]).unwrap_err();
    assert!(in_flight.is_device_poisoned(), "{in_flight}");
}

/// The failure hook fires on every skip and failure, never on success
/// (rule 39).
pub fn failure_hook_fires_on_skip_and_failure_only<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = seen.clone();
    c.on_failure(move |_, error| sink.lock().push(error.to_string()));
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    fill::<S>(&c, &a, 1).unwrap();
    copy::<S>(&c, &a, &b).unwrap();
    assert!(seen.lock().is_empty(), "success is silent");
    let before = c.failures_seen();
    fail_next_launch(&c, "candidate");
    assert!(fill::<S>(&c, &a, 2).is_err());
    assert!(copy::<S>(&c, &a, &b).is_err());
    let seen = seen.lock();
    assert_eq!(seen.len(), 2);
    assert!(
        seen[0].contains("candidate") && seen[1].contains("candidate"),
        "{seen:?}"
    );
    assert_eq!(
        c.failures_seen(),
        before + 2,
        "a measurement in flight sees both"
    );
}

/// Two chains that share no buffer never affect each other, even on one
/// stream (rule 40).
pub fn independent_chains_never_interfere<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let (a1, a2) = (alloc(&c, WORDS), alloc(&c, WORDS));
    let (b1, b2) = (alloc(&c, WORDS), alloc(&c, WORDS));
    fill::<S>(&c, &b1, 3).unwrap();
    fail_next_launch(&c, "chain-a");
    assert!(fill::<S>(&c, &a1, 1).is_err());
    copy::<S>(&c, &b1, &b2).unwrap();
    assert!(copy::<S>(&c, &a1, &a2).is_err());
    assert_eq!(read(&c, &b2).unwrap(), vec![3; WORDS as usize]);
    assert!(read(&c, &a2).is_err());
}

/// Several streams: ordered across streams, and a failure raised on one is
/// seen from another (rules 22, 40).
pub fn several_streams<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let s1 = c.new_stream().unwrap();
    let s2 = c.new_stream().unwrap();
    let a = alloc(&c, WORDS);
    let b = alloc(&c, WORDS);
    let sum = alloc(&c, WORDS);
    fill::<S>(&c, &a, 2).unwrap();
    copy::<S>(&s1, &a, &b).unwrap();
    add::<S>(&s2, &a, &b, &sum).unwrap();
    assert_eq!(read(&c, &sum).unwrap(), vec![4; WORDS as usize]);
    assert_eq!(read(&s1, &sum).unwrap(), vec![4; WORDS as usize]);
    fail_next_launch(&s1, "on-stream-1");
    assert!(fill::<S>(&s1, &a, 7).is_err());
    assert_root_contains(&read(&s2, &a).unwrap_err(), "on-stream-1");
    assert!(matches!(copy::<S>(&s2, &a, &b), Err(Error::Skipped { .. })));
    s1.sync().unwrap();
    s2.sync().unwrap();
}

/// Each distinct failure a read meets is named once, in the order found
/// (rule 25).
pub fn several_failures_named_once_each<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let buf = alloc(&c, WORDS);
    let half = u64::from(WORDS) * 2;
    let n = WORDS / 2;
    fail_next_launch(&c, "first-half");
    assert!(
        launch::<S>(
            &c,
            &S::fill(),
            &[buf.slice(0..half).write()],
            &[n, 1],
            groups(n)
        )
        .is_err()
    );
    fail_next_launch(&c, "second-half");
    assert!(
        launch::<S>(
            &c,
            &S::fill(),
            &[buf.slice(half..).write()],
            &[n, 1],
            groups(n)
        )
        .is_err()
    );
    let error = read(&c, &buf).unwrap_err();
    let entries = error.unwritten();
    assert_eq!(entries.len(), 2, "{error}");
    assert!(entries[0].root.to_string().contains("first-half"));
    assert!(entries[1].root.to_string().contains("second-half"));
    assert!(matches!(error, Error::SeveralUnwritten(_)));
}

/// A kernel that does not compile claims its outputs with the compiler's
/// log (rule 21).
pub fn compile_error_claims_outputs<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let input = upload(&c, &[1; 64]);
    let out = upload(&c, &[2; 64]);
    let error = launch::<S>(
        &c,
        &S::broken(),
        &[Binding::read(&input), Binding::write(&out)],
        &[64],
        groups(64),
    )
    .unwrap_err();
    assert!(matches!(error, Error::Compile { .. }), "{error}");
    let on_read = read(&c, &out).unwrap_err();
    assert!(
        matches!(&*on_read.unwritten()[0].root, Error::Compile { .. }),
        "{on_read}"
    );
    assert_eq!(
        read(&c, &input).unwrap(),
        vec![1; 64],
        "inputs are untouched"
    );
    assert!(c.compile(&S::broken()).is_err());
    assert!(c.compile(&S::fill()).is_ok());
}

/// Bad input is a typed error naming what was wrong; nothing panics and
/// nothing already written is lost.
pub fn bad_input_is_typed<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let buf = upload(&c, &[11; 64]);
    let out = alloc(&c, 64);
    let invalid = |r: Result<()>| match r {
        Err(Error::InvalidArgument { .. }) => {}
        other => panic!("expected an invalid argument, got {other:?}"),
    };
    // A binding past the end of its buffer.
    invalid(launch::<S>(
        &c,
        &S::fill(),
        &[buf.slice(0..512).write()],
        &[128, 0],
        groups(128),
    ));
    // Zero and overflowing sizes.
    invalid(c.allocate(0).map(drop));
    invalid(c.write(buf.slice(u64::MAX - 3..u64::MAX), &[0; 4]));
    invalid(c.read(buf.slice(8..8)).map(drop));
    #[allow(clippy::reversed_empty_ranges)]
    let reversed = buf.slice(16..8);
    invalid(c.read(reversed).map(drop));
    invalid(c.write(buf.slice(0..8), &[0; 4]));
    invalid(c.write(buf.slice(2..6), &[0; 4]));
    invalid(c.copy(buf.slice(0..16), out.slice(0..8)));
    // A handle from another server.
    if let Some(other) = setup::<S>() {
        let foreign = alloc(&other, 64);
        invalid(copy::<S>(&c, &foreign, &out));
        invalid(c.read(&foreign).map(drop));
        invalid(c.free(&foreign));
    }
    // A freed handle.
    let freed = alloc(&c, 64);
    let stale = freed.clone();
    c.free(&freed).unwrap();
    invalid(c.read(&stale).map(drop));
    invalid(fill::<S>(&c, &stale, 1));
    invalid(c.free(&stale));
    // Nothing was lost, nothing was claimed.
    assert_eq!(read(&c, &buf).unwrap(), vec![11; 64]);
    assert_eq!(c.failures_held(), 0);
}

/// Host reads, syncs and replays on a recording stream are refused, change
/// nothing, and do not doom the window; capture steps need their
/// predecessor (rules 29, 38).
pub fn refusals_while_recording<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let a = alloc(&c, WORDS);
    let capture = c.begin_capture().unwrap();
    assert!(c.begin_capture().unwrap_err().is_refusal());
    fill::<S>(&c, &a, 1).unwrap();
    assert!(c.read(&a).unwrap_err().is_refusal());
    assert!(c.sync().unwrap_err().is_refusal());
    assert_eq!(c.capture_state(), CaptureState::Recording);
    let graph = c.end_capture(capture).unwrap();
    c.replay(&graph).unwrap();
    assert_eq!(read(&c, &a).unwrap(), vec![1; WORDS as usize]);
    // A handle on the window that just ended names no open window.
    let stray = crate::Capture::stale(c.stream(), graph.server);
    assert!(matches!(
        c.end_capture(stray).unwrap_err(),
        Error::InvalidArgument { .. }
    ));
}

/// A launch that runs no workgroup writes nothing and heals nothing; an
/// indirect launch heals nothing, since its count is on the device; an
/// indirect count joins the read set (rules 17, 19).
pub fn zero_and_indirect_dispatch<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let out = alloc(&c, WORDS);
    fail_next_launch(&c, "stale");
    assert!(fill::<S>(&c, &out, 1).is_err());
    let n = WORDS;
    launch::<S>(
        &c,
        &S::fill(),
        &[Binding::write(&out)],
        &[n, 5],
        Dispatch::Groups([0, 1, 1]),
    )
    .unwrap();
    assert!(read(&c, &out).is_err(), "a zero dispatch heals nothing");
    // A device-side count is unknown when the launch concludes, so an
    // indirect launch heals nothing either: a zero count there would leave
    // the stale bytes, which nobody wrote.
    let zero = upload(&c, &[0, 1, 1]);
    launch::<S>(
        &c,
        &S::fill(),
        &[Binding::write(&out)],
        &[n, 5],
        Dispatch::Indirect(zero.all()),
    )
    .unwrap();
    assert_root_contains(&read(&c, &out).unwrap_err(), "stale");
    let counts = upload(&c, &[n.div_ceil(64), 1, 1]);
    launch::<S>(
        &c,
        &S::fill(),
        &[Binding::write(&out)],
        &[n, 5],
        Dispatch::Indirect(counts.all()),
    )
    .unwrap();
    assert_root_contains(&read(&c, &out).unwrap_err(), "stale");
    // Clean bytes it may write: they read as the kernel left them.
    c.write(&out, &as_bytes(&[0; WORDS as usize])).unwrap();
    launch::<S>(
        &c,
        &S::fill(),
        &[Binding::write(&out)],
        &[n, 5],
        Dispatch::Indirect(counts.all()),
    )
    .unwrap();
    assert_eq!(read(&c, &out).unwrap(), vec![5; WORDS as usize]);
    launch::<S>(
        &c,
        &S::fill(),
        &[Binding::write(&out)],
        &[n, 7],
        Dispatch::Indirect(zero.all()),
    )
    .unwrap();
    assert_eq!(
        read(&c, &out).unwrap(),
        vec![5; WORDS as usize],
        "a zero count leaves clean bytes as they were"
    );
    fail_next_launch(&c, "count");
    assert!(fill::<S>(&c, &counts, 0).is_err());
    let skipped = launch::<S>(
        &c,
        &S::fill(),
        &[Binding::write(&out)],
        &[n, 6],
        Dispatch::Indirect(counts.all()),
    );
    assert!(matches!(skipped, Err(Error::Skipped { .. })), "{skipped:?}");
    assert_root_contains(&read(&c, &out).unwrap_err(), "count");
}

/// A buffer bound for reading and writing is in both sets: tainted, it
/// skips; clean, it runs and heals (rules 16, 17).
pub fn read_write_binding_is_in_both_sets<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let buf = alloc(&c, WORDS);
    fail_next_launch(&c, "rw");
    assert!(fill::<S>(&c, &buf, 1).is_err());
    let n = WORDS;
    let rw = launch::<S>(
        &c,
        &S::fill(),
        &[Binding::read_write(&buf)],
        &[n, 2],
        groups(n),
    );
    assert!(matches!(rw, Err(Error::Skipped { .. })), "{rw:?}");
    c.write(&buf, &as_bytes(&vec![0; WORDS as usize])).unwrap();
    launch::<S>(
        &c,
        &S::fill(),
        &[Binding::read_write(&buf)],
        &[n, 2],
        groups(n),
    )
    .unwrap();
    assert_eq!(read(&c, &buf).unwrap(), vec![2; WORDS as usize]);
}

/// A buffer last used by work recorded on one stream cannot be used from
/// another until that capture ends: the work to wait for has not run (rule
/// 38). Nothing is doomed or lost. A buffer the capturing stream used only
/// before its capture began is not refused, unless the other stream is
/// capturing too.
pub fn recorded_buffers_wait_for_their_capture<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let other = c.new_stream().unwrap();
    let a = upload(&c, &vec![1; WORDS as usize]);
    let b = alloc(&c, WORDS);
    let early = upload(&c, &vec![7; WORDS as usize]);
    let seen = (c.failures_seen(), other.failures_seen());
    let capture = c.begin_capture().unwrap();
    fill::<S>(&c, &a, 2).unwrap();
    assert!(other.read(&a).unwrap_err().is_refusal());
    assert!(
        other.read(&a).unwrap_err().is_refusal(),
        "refused again: a refusal does not make the other stream a's last user"
    );
    let refused = copy::<S>(&other, &a, &b).unwrap_err();
    assert!(refused.is_refusal(), "{refused}");
    // A refusal is the caller's error, not a device failure (rule 38): the
    // copy's destination is not claimed and no failure was seen.
    other.check(&[b.all()]).unwrap();
    assert_eq!((c.failures_seen(), other.failures_seen()), seen);
    // What the capturing stream used only before its capture began is
    // usable from another stream, ordered after that earlier work.
    assert_eq!(read(&other, &early).unwrap(), vec![7; WORDS as usize]);
    copy::<S>(&other, &early, &b).unwrap();
    assert_eq!(read(&other, &b).unwrap(), vec![7; WORDS as usize]);
    let graph = c.end_capture(capture).unwrap();
    c.replay(&graph).unwrap();
    assert_eq!(read(&other, &a).unwrap(), vec![2; WORDS as usize]);
    // Two captures cannot wait for each other's streams: while both record,
    // a buffer the other capturing stream used, even before its capture, is
    // refused, and nothing is claimed.
    let before = upload(&c, &vec![5; WORDS as usize]);
    let first = c.begin_capture().unwrap();
    let second = other.begin_capture().unwrap();
    let refused = copy::<S>(&other, &before, &b).unwrap_err();
    assert!(refused.is_refusal(), "{refused}");
    other.abort_capture(second).unwrap();
    c.abort_capture(first).unwrap();
    assert_eq!(read(&other, &before).unwrap(), vec![5; WORDS as usize]);
    assert_eq!(read(&other, &b).unwrap(), vec![7; WORDS as usize]);
}

/// Freeing every buffer empties the store, whatever failed (rules 7, 13).
pub fn freeing_everything_empties_the_store<S: Suite>() {
    let Some(c) = setup::<S>() else { return };
    let mut buffers: Vec<Buffer> = (0..6).map(|_| alloc(&c, WORDS)).collect();
    fail_next_launch(&c, "one");
    assert!(fill::<S>(&c, &buffers[0], 1).is_err());
    for i in 1..buffers.len() {
        let _ = copy::<S>(&c, &buffers[i - 1], &buffers[i]);
    }
    fail_next_launch(&c, "two");
    assert!(fill::<S>(&c, &buffers[3], 1).is_err());
    assert!(c.failures_held() <= c.failure_claims(), "rule 7 bound");
    c.audit().unwrap();
    assert!(c.failures_held() >= 1);
    buffers.clear();
    assert_eq!(c.failures_held(), 0);
    assert_eq!(c.bytes_allocated(), 0);
}

/// Expand to one `#[test]` per behaviour of the conformance suite, for the
/// [`Suite`] implementation `$suite`, plus `random_sequences`, the property
/// test ([`random_sequences`]) at [`property::STEPS`] over
/// [`property::SEEDS`]: a server that runs the suite runs both. Each ends
/// with [`Suite::finished`].
///
/// ```ignore
/// scope_core::conformance_tests!(MySuite);
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($suite:ty) => {
        $crate::conformance_tests!(@each $suite;
            clean_work_computes,
            chain_report_over_three_hops,
            skipped_launch_never_runs,
            partial_writes_and_healing,
            capture_doomed_by_failure,
            capture_doomed_by_skip,
            abandoned_window,
            replay_success,
            replay_failure,
            unknown_and_destroyed_graphs,
            failed_allocation_keeps_device_working,
            sticky_fault_poisons,
            failure_hook_fires_on_skip_and_failure_only,
            independent_chains_never_interfere,
            several_streams,
            several_failures_named_once_each,
            compile_error_claims_outputs,
            bad_input_is_typed,
            refusals_while_recording,
            zero_and_indirect_dispatch,
            read_write_binding_is_in_both_sets,
            freeing_everything_empties_the_store,
            recorded_buffers_wait_for_their_capture,
            a_hook_may_call_back_into_the_client,
            a_panicking_hook_leaves_the_books_right,
            a_hook_holding_a_weak_client_is_dropped_with_the_server,
            a_dropped_capture_is_aborted,
            a_foreign_capture_is_refused_and_aborted_at_home,
            reading_a_huge_failed_buffer_allocates_nothing,
            past_the_largest_allocation_is_invalid_everywhere,
            poison_fails_fast_and_releases_still_release,
            a_count_past_the_device_runs_nothing,
            a_replayed_indirect_launch_heals_nothing,
            threads_racing_frees_against_launches,
            reads_on_many_threads_each_get_their_own_bytes,
            the_limits_reported_are_the_limits_enforced,
            a_failure_from_outside_claims_like_a_failed_launch,
            flush_submits_and_changes_nothing_else,
            a_caller_failed_allocation_behaves_like_the_devices,
            a_closure_holding_the_lock_may_call_back,
        );
    };
    (@each $suite:ty; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::conformance::$name::<$suite>();
                <$suite as $crate::conformance::Suite>::finished();
            }
        )*

        /// The soak at CI's scale (`SCOPE_SOAK_LAUNCHES` changes it): many
        /// threads, failures and captures, and nothing grows.
        #[test]
        fn soak() {
            let config = $crate::conformance::soak::SoakConfig::default();
            if let Some(samples) = $crate::conformance::soak::soak::<$suite>(&config) {
                for sample in samples {
                    println!("soak: {sample}");
                }
            }
            <$suite as $crate::conformance::Suite>::finished();
        }

        /// The property test at CI's scale (`SCOPE_PROPERTY_SEED` and
        /// `SCOPE_PROPERTY_STEPS` change it).
        #[test]
        fn random_sequences() {
            $crate::conformance::random_sequences::<$suite>(
                &$crate::conformance::property::SEEDS,
                $crate::conformance::property::STEPS,
            );
            <$suite as $crate::conformance::Suite>::finished();
        }
    };
}
