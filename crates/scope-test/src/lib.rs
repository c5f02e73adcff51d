//! The conformance suite: one test per behaviour, for any server.
//!
//! A server's test module implements [`Suite`]: how to get a client, four kernels in its own
//! language, and what it can do ([`Suite::capabilities`]). It expands
//! [`conformance_tests!`](crate::conformance_tests) to get one `#[test]` per behaviour. Each
//! behaviour names the rules of `docs/ERROR_MODEL.md` it checks.
//!
//! Each module declares its behaviours beside their bodies, in its own `*_tests!` macro, with what
//! each needs ([`Capability`]). Adding a behaviour edits one module. The kit decides at run time: a
//! test whose suite lacks a need prints `not exercised: <reason>` and passes.
//!
//! The same [`Suite`] drives [`random_sequences`] ([`property`]). It runs random interleavings of
//! every operation, with faults injected, checked against an oracle after each one.
//!
//! A server with no device here prints `skipped: no <backend> device` and returns. With
//! `SCOPE_REQUIRE=<backend>` (or `all`) a missing device fails the test instead.

pub mod across;
pub mod backend;
pub mod capture;
pub mod clib;
pub mod collective;
pub mod contract;
pub mod dataflow;
pub mod device;
pub mod elements;
pub mod features;
pub mod host;
pub mod inflight;
pub mod input;
pub mod kit;
pub mod launched;
pub mod membership;
pub mod property;
pub mod recorded;
pub mod recover;
pub mod rounds;
pub mod sizes;
pub mod soak;
pub mod survival;

pub use across::*;
pub use backend::*;
pub use capture::*;
pub use collective::*;
pub use contract::*;
pub use dataflow::*;
pub use device::*;
pub use features::*;
pub use input::*;
pub use kit::Capability;
pub use membership::*;
pub use property::random_sequences;
pub use recorded::*;
pub use recover::*;
pub use rounds::*;
pub use sizes::*;
pub use survival::{one_survivor_in_its_own_process, ranks_survive_a_killed_process};

use scope_core::Client;
use scope_core::Result;
use scope_core::backend::Backend;
use scope_core::kernel::Kernel;

/// What a server supplies to run the suite against itself.
///
/// The kernels work on `u32` words with a workgroup (block) of 64 invocations, one word each, over
/// `ceil(n / 64)` groups. Scalars are little-endian `u32`s.
pub trait Suite: 'static {
    /// The backend under test.
    type Backend: Backend;

    /// A client of a fresh server; [`scope_core::Error::BackendUnavailable`] when there is no
    /// device here.
    fn client() -> Result<Client<Self::Backend>>;

    /// `out[i] = value` for `i < n`. Bindings `[out (write)]`; scalars `[n, value]`.
    fn fill() -> Kernel;

    /// `out[i] = in[i]` for `i < n`. Bindings `[in (read), out (write)]`; scalars `[n]`.
    fn copy() -> Kernel;

    /// `out[i] = a[i] + b[i]` (wrapping) for `i < n`. Bindings `[a (read), b (read), out (write)]`;
    /// scalars `[n]`.
    fn add() -> Kernel;

    /// A kernel in the backend's language that does not compile.
    fn broken() -> Kernel;

    /// What the suite can do beyond a client: the one place it says so. Nothing by default.
    /// [`Capability::Backend`] is read from [`backend`](Self::backend) instead.
    fn capabilities() -> &'static [Capability] {
        &[]
    }

    /// The scalar blob for a launch of `kernel` over `bindings` with scalars `values`.
    /// Little-endian `u32`s by default. A compiler with its own argument layout (cubecl's info
    /// struct) packs them its way.
    #[allow(unused_variables)]
    fn scalar_blob(kernel: &Kernel, bindings: &[Binding<'_>], values: &[u32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// A size within the backend's largest allocation that the device cannot provide, for a real
    /// out-of-memory. `None` to rely on injected ones only.
    fn oversized() -> Option<u64> {
        None
    }

    /// A client for rank `rank` of the collective behaviours' groups. By default a fresh server of
    /// [`client`](Self::client)'s, a logical device. A backend that enumerates devices gives each
    /// rank its own.
    #[allow(unused_variables)]
    fn rank_client(rank: usize) -> Result<Client<Self::Backend>> {
        Self::client()
    }

    /// How many ranks of distinct devices [`rank_client`](Self::rank_client) can make. [`sizes`]
    /// runs at one rank and at this many (at most [`MOST_RANKS`]). Four logical devices by default;
    /// a suite over real devices answers the machine's count.
    fn devices() -> usize {
        collective::RANKS
    }

    /// The group the collective behaviours run on: host staging by default
    /// ([`Group::new`](scope_core::collective::Group::new)). A suite that lists
    /// [`Capability::DeviceCollectives`] makes it with
    /// [`Group::over_device`](scope_core::collective::Group::over_device). The kit checks the two
    /// agree.
    fn group(
        clients: Vec<Client<Self::Backend>>,
        deadline: std::time::Duration,
    ) -> Result<scope_core::collective::Group<Self::Backend>> {
        scope_core::collective::Group::new(clients, deadline)
    }

    /// A fresh backend of the suite's device, for the behaviours that drive the [`Backend`]
    /// contract below the server ([`backend`]). `None` by default: those behaviours are then not
    /// exercised. Their kernels get their scalars from [`scalar_blob`](Self::scalar_blob) with no
    /// bindings.
    fn backend() -> Option<Result<Self::Backend>> {
        None
    }

    /// How much work `stream` has issued and not finished, where the suite can count it (a mock
    /// driver's counter). `None` by default. The backend behaviours use it to see that a wait
    /// covers exactly the work before it.
    #[allow(unused_variables)]
    fn pending(stream: &<Self::Backend as Backend>::Stream) -> Option<u64> {
        None
    }

    /// Called at the end of every exercised test, on the test's thread. A backend's own end-of-test
    /// check goes here, such as a mock asserting it refused nothing. Nothing by default.
    fn finished() {}
}

pub use scope_core::required;

/// A client from `make`, or `None` after printing `skipped: no <backend> device (<why>)` when the
/// backend is unavailable here. The backend is the one the error names. A suite of NCCL's
/// collectives on a machine with a GPU and no NCCL is `skipped: no nccl device`.
///
/// # Panics
///
/// When the backend is unavailable and [`required`]. Or when `make` fails for any other reason: a
/// present but broken device is a failure, never a skip.
pub fn client_or_skip<B: Backend>(make: impl FnOnce() -> Result<Client<B>>) -> Option<Client<B>> {
    match make() {
        Ok(client) => Some(client),
        Err(scope_core::Error::BackendUnavailable { backend, reason }) => {
            assert!(
                !required(backend),
                "SCOPE_REQUIRE names {backend} but it is unavailable: {reason}"
            );
            println!("skipped: no {backend} device ({reason})");
            None
        }
        Err(other) => panic!("{} is present but failed to start: {other}", B::NAME),
    }
}

// ----- helpers --------------------------------------------------------------

use std::sync::Arc;

use parking_lot::Mutex;

use scope_core::CaptureState;
use scope_core::Error;
use scope_core::StreamId;
use scope_core::{Binding, Buffer, Dispatch};
use scope_core::{FaultPlan, Site};

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

/// `buffer` read from the host, and through a copy the device makes of it first. Both must agree,
/// in words or in the root they name; the copy's read is one hop further down the chain. A round's
/// output is read on the device in training: the optimizer reads the all-reduced gradient. Only
/// such a read catches a failure the books missed after the round.
fn read_twice<S: Suite>(client: &Client<S::Backend>, buffer: &Buffer) -> Result<Vec<u32>> {
    // A poisoned or lost device holds no new buffer: its reads all fail.
    let Ok(through) = client.try_allocate(buffer.size()) else {
        return read(client, buffer);
    };
    // A refusal or a skip shows in the copy's read below.
    let _ = copy::<S>(client, buffer, &through);
    let host = read(client, buffer);
    let device = read(client, &through);
    match (&host, &device) {
        (Ok(host), Ok(device)) => assert_eq!(host, device, "the device's copy read other words"),
        (Err(host), Err(device)) => assert_eq!(
            host.root().to_string(),
            device.root().to_string(),
            "the device's copy names another root"
        ),
        _ => panic!("the host read {host:?}, the device's copy {device:?}"),
    }
    host
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

/// One `#[test]` per behaviour of the kit for the [`Suite`] `$suite`.
///
/// Each module lists its own behaviours (`dataflow_tests!`, `recover_tests!`, …) with what each
/// needs; this invokes every list. A behaviour whose need the suite lacks ([`Suite::capabilities`])
/// says `not exercised` and passes. Each test ends with [`Suite::finished`].
///
/// ```ignore
/// scope_test::conformance_tests!(MySuite);
/// ```
///
/// `conformance_tests!(@collectives MySuite)` expands the group behaviours alone. It is for a suite
/// that adds a transport to a backend whose other behaviours run elsewhere.
///
/// `conformance_tests!(@processes MySuite, "module::path", identity)` expands, in the module the
/// path names, to four ranks in four processes ([`ranks_in_separate_processes`]). It is for a
/// backend whose identity is NCCL's unique id, made by `identity(dir)`.
#[macro_export]
macro_rules! conformance_tests {
    ($suite:ty) => {
        $crate::dataflow_tests!($suite);
        $crate::device_tests!($suite);
        $crate::input_tests!($suite);
        $crate::capture_tests!($suite);
        $crate::contract_tests!($suite);
        $crate::recover_tests!($suite);
        $crate::backend_tests!($suite);
        $crate::features_tests!($suite);
        $crate::soak_tests!($suite);
        $crate::property_tests!($suite);
        $crate::conformance_tests!(@collectives $suite);
    };
    (@collectives $suite:ty) => {
        $crate::collective_tests!($suite);
        $crate::inflight_tests!($suite);
        $crate::membership_tests!($suite);
        $crate::recorded_tests!($suite);
        $crate::across_tests!($suite);
        $crate::sizes_tests!($suite);
        $crate::rounds_tests!($suite);
    };
    (@processes $suite:ty, $module:literal, $identity:expr) => {
        /// Four ranks in four processes: this binary runs [`rank`] four times.
        #[test]
        fn ranks_in_separate_processes() {
            $crate::ranks_in_separate_processes::<$suite>(
                concat!($module, "::rank"),
                $identity,
            );
            <$suite as $crate::Suite>::finished();
        }

        /// One rank of [`ranks_in_separate_processes`], run only by it.
        #[test]
        #[ignore = "a child process of ranks_in_separate_processes"]
        fn rank() {
            $crate::one_rank_in_its_own_process::<$suite>();
        }

        /// Four ranks in four processes, one killed in the middle of training. The others shrink to
        /// a new epoch and go on. A restarted process is admitted and healed. Every rank's weights
        /// end the same bits.
        #[test]
        fn ranks_survive_a_killed_process() {
            $crate::ranks_survive_a_killed_process::<$suite>(
                concat!($module, "::survivor"),
                $identity,
            );
            <$suite as $crate::Suite>::finished();
        }

        /// One rank of [`ranks_survive_a_killed_process`], run only by it.
        #[test]
        #[ignore = "a child process of ranks_survive_a_killed_process"]
        fn survivor() {
            $crate::one_survivor_in_its_own_process::<$suite>();
        }
    };
}
