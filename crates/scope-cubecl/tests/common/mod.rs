//! What every runtime-test binary instantiates, once: one binary per
//! server (each monomorphises every test for its runtime), the same tests
//! in each, and three things cubecl's generated tests cannot say for
//! themselves.
//!
//! - **Whether a test exercised anything.** cubecl's runtime tests return
//!   early, and pass, when the device lacks what they test (plane
//!   operations, cmma, barriers, float atomics, a second device…). The
//!   tests name the runtime as `TestRuntime`, which is [`Watched<B>`]:
//!   `ScopeRuntime<B>` with a hook on every call a test makes to it (its
//!   client, the device list). The first such call starts the test's
//!   count; when the test's thread ends, the count says whether anything
//!   reached the device in between — a kernel launch, which cubecl reports
//!   to a [`LaunchObserver`] on the thread that issues it, or any thread's
//!   first operation on a device (an allocation, a write, a read, a sync, a
//!   launch), which cubecl answers by giving that thread a fresh stream id.
//!   A test with neither prints `not exercised: nothing reached the device
//!   [<test>]`, and `cargo xtask test` counts it as not exercised rather
//!   than passed. Nothing here names a family or a feature: a family a
//!   server starts to support counts as exercised the first time it
//!   reaches the device, and a host-only test (one of cubecl's checks a
//!   kernel's name and launches nothing) counts as not exercised.
//! - **One test at a time.** Launches and stream ids are counted for the
//!   whole process, so the tests of one process take turns at the device:
//!   nextest runs each test in a process of its own anyway, and under plain
//!   libtest they queue. That is also what counts the threads a test
//!   spawns as the test's.
//! - **No device.** The first call probes the server. With no device, the
//!   binary prints `skipped: no <backend> device (<why>)` and ends the
//!   process successfully, since a generated test cannot return early by
//!   itself; with `SCOPE_REQUIRE` naming the backend
//!   ([`scope_core::required`]), every test fails instead.
//!
//! A test known not to hold on a backend is marked in its binary, with its
//! reason, by a `not_run` function the binary passes to
//! [`runtime_tests!`]: the test prints `not run: <reason>` and returns.
//! Only `binary_untyped` is instantiated test by test for this (the two
//! such tests are there); the other families come from cubecl's macros
//! whole.
//!
//! libtest captures a test's output only while the test function runs, and
//! the verdict comes when its thread ends, after that: it goes to stderr
//! directly and names the test in brackets, so that it can be told whose
//! it is under plain libtest (nextest shows each process's output whole).
//! A thread the test spawned prints its verdict into the test's captured
//! stdout instead, unnamed.

#![allow(dead_code)]

use std::cell::RefCell;
use std::io::Write;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once, OnceLock, PoisonError};
use std::time::Duration;

use cubecl_common::device::DeviceId;
use cubecl_core::ir::TargetProperties;
use cubecl_core::zspace::{Shape, Strides};
use cubecl_environment::stream::{StreamId, StreamPolicy};
use cubecl_runtime::client::Client;
use cubecl_runtime::logging::{LaunchObservation, LaunchObserver};
use cubecl_runtime::runtime::{
    DeviceDescription, DevicePower, DeviceTemperature, DeviceUtilization, Runtime,
    UtilizationUnavailable,
};
use scope_cubecl::{CubeBackend, ScopeDevice, ScopeRuntime};

/// `ScopeRuntime<B>`, with a hook where each test gets its client: the
/// runtime the tests name as `TestRuntime`. Everything else is
/// `ScopeRuntime<B>`'s, the server type included, so the tests run on the
/// same server and service a program naming `ScopeRuntime<B>` gets.
pub struct Watched<B>(PhantomData<fn() -> B>);

impl<B> Clone for Watched<B> {
    fn clone(&self) -> Self {
        Self(PhantomData)
    }
}

impl<B> std::fmt::Debug for Watched<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watched")
    }
}

impl<B: CubeBackend> Runtime for Watched<B> {
    type Server = <ScopeRuntime<B> as Runtime>::Server;
    type Device = <ScopeRuntime<B> as Runtime>::Device;

    fn client(device: &Self::Device) -> Client {
        watched::<B, _>(|| ScopeRuntime::<B>::client(device))
    }

    fn can_read_tensor(shape: &Shape, strides: &Strides) -> bool {
        watched::<B, _>(|| ScopeRuntime::<B>::can_read_tensor(shape, strides))
    }

    fn target_properties() -> TargetProperties {
        watched::<B, _>(ScopeRuntime::<B>::target_properties)
    }

    fn enumerate_devices(type_id: u16) -> Vec<DeviceId> {
        watched::<B, _>(|| ScopeRuntime::<B>::enumerate_devices(type_id))
    }

    fn enumerate_all_devices() -> Vec<DeviceId> {
        watched::<B, _>(ScopeRuntime::<B>::enumerate_all_devices)
    }

    fn enumerate_devices_like(device_id: DeviceId) -> Vec<DeviceId> {
        watched::<B, _>(|| ScopeRuntime::<B>::enumerate_devices_like(device_id))
    }

    fn find_device(device_id: DeviceId) -> Result<(), usize> {
        watched::<B, _>(|| ScopeRuntime::<B>::find_device(device_id))
    }

    fn is_available() -> bool {
        watched::<B, _>(ScopeRuntime::<B>::is_available)
    }

    fn description(device: &Self::Device) -> Option<DeviceDescription> {
        watched::<B, _>(|| ScopeRuntime::<B>::description(device))
    }

    fn utilization(device: &Self::Device) -> Result<DeviceUtilization, UtilizationUnavailable> {
        watched::<B, _>(|| ScopeRuntime::<B>::utilization(device))
    }

    fn temperature(device: &Self::Device) -> Result<DeviceTemperature, UtilizationUnavailable> {
        watched::<B, _>(|| ScopeRuntime::<B>::temperature(device))
    }

    fn power(device: &Self::Device) -> Result<DevicePower, UtilizationUnavailable> {
        watched::<B, _>(|| ScopeRuntime::<B>::power(device))
    }
}

/// `call`, `ScopeRuntime<B>`'s answer, as the first thing a test asks of
/// its runtime (a client, or the device list for the tests that need two
/// devices) starts the test's count: after the call, so that opening the
/// server is not counted as the test's work.
fn watched<B: CubeBackend, T>(call: impl FnOnce() -> T) -> T {
    let test = starting::<B>();
    let answer = call();
    if test {
        mark_start();
    }
    answer
}

/// Kernel launches issued in this process, on any thread, since the
/// observer was installed.
static LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// Counts every launch cubecl issues. cubecl calls it on the issuing thread
/// before the launch is submitted, discarded launches (compile-only modes)
/// included.
struct CountLaunches;

impl LaunchObserver for CountLaunches {
    fn launched(&self, _kernel: &'static str) {
        LAUNCHES.fetch_add(1, Ordering::Relaxed);
    }
}

/// Who holds the device: one test at a time; the others wait for it.
struct Slot {
    busy: bool,
    /// Spawned threads waiting for it (see [`starting`]), which go first.
    spawned_waiting: usize,
}

static SLOT: Mutex<Slot> = Mutex::new(Slot {
    busy: false,
    spawned_waiting: 0,
});
static SLOT_FREED: Condvar = Condvar::new();

/// How long a spawned thread waits for the device before taking itself for
/// a thread of the test that holds it.
const SPAWNED_WAIT: Duration = Duration::from_secs(5);

/// Wait for the device, after any spawned thread waiting for it, and hold
/// it.
fn take_slot() {
    let mut slot = SLOT.lock().unwrap_or_else(PoisonError::into_inner);
    while slot.busy || slot.spawned_waiting > 0 {
        slot = SLOT_FREED
            .wait(slot)
            .unwrap_or_else(PoisonError::into_inner);
    }
    slot.busy = true;
}

/// Wait for the device for [`SPAWNED_WAIT`] at most, and hold it if it
/// came free.
fn take_slot_within() -> bool {
    let mut slot = SLOT.lock().unwrap_or_else(PoisonError::into_inner);
    slot.spawned_waiting += 1;
    let (mut slot, _) = SLOT_FREED
        .wait_timeout_while(slot, SPAWNED_WAIT, |slot| slot.busy)
        .unwrap_or_else(PoisonError::into_inner);
    slot.spawned_waiting -= 1;
    if slot.busy {
        // Not taken: the named tests it held back may go on waiting as before.
        SLOT_FREED.notify_all();
        return false;
    }
    slot.busy = true;
    true
}

fn give_slot() {
    SLOT.lock().unwrap_or_else(PoisonError::into_inner).busy = false;
    SLOT_FREED.notify_all();
}

/// The test whose count this thread keeps, from its start to the end of
/// the thread.
struct Running {
    /// Its name, on libtest's thread for it; `None` on a thread it spawned.
    test: Option<String>,
    /// [`LAUNCHES`] when it started, once its first call to the runtime
    /// returned; `None` before, or when it is not run.
    launches: Option<u64>,
    /// A stream id allocated when it started: every thread's first
    /// operation on a device allocates the next one.
    streams: u64,
}

impl Drop for Running {
    /// The thread is ending: say whether anything reached the device since
    /// the test started, then let the next test have the device.
    fn drop(&mut self) {
        if let Some(launches) = self.launches {
            let launched = LAUNCHES.load(Ordering::Relaxed) - launches;
            // Ids handed out since the start, less the one asked for now.
            let first_operations = StreamId::allocate().value - self.streams - 1;
            if launched == 0 && first_operations == 0 {
                match &self.test {
                    // libtest stopped capturing this thread's output when
                    // the test returned, so the line names the test; and it
                    // goes to stderr, where libtest does not write: on
                    // stdout it could land inside the result line libtest
                    // is printing for the previous test.
                    Some(test) => {
                        let _ = writeln!(
                            std::io::stderr().lock(),
                            "not exercised: nothing reached the device [{test}]"
                        );
                    }
                    // A spawned thread prints into its test's captured
                    // output, which the test collects when it joins it.
                    None => println!("not exercised: nothing reached the device"),
                }
            }
        }
        give_slot();
    }
}

std::thread_local! {
    static RUNNING: RefCell<Option<Running>> = const { RefCell::new(None) };
}

/// Something asks the runtime for the first time on this thread: check the
/// device (once per process), install the launch counter (once), and start
/// a test's count if this is where its test starts. Whether it did.
///
/// libtest runs each test on a thread named after it: there, the test
/// waits for the device and starts. A thread a test spawns has no name.
/// If it is the first thread of its test to ask anything (cubecl's
/// collectives run their body on a thread they spawn), its test starts
/// there, once the device is free. But it may instead belong to the test
/// that holds the device, whose window already counts its work, and which
/// may be waiting for it: so it waits [`SPAWNED_WAIT`] at most, ahead of
/// the named tests, and takes itself for that test's thread if the device
/// is still held then. With several devices listed (logical devices,
/// `SCOPE_LOGICAL_DEVICES`), cubecl's multi-device tests spawn threads
/// that ask for clients while their test holds the device, and such a
/// thread takes itself for the holder's at once rather than wait.
///
/// Under nextest, one test a process, the device is free or held by the
/// thread's own test. Under plain libtest, a test that held it longer than
/// the wait (or held it at all, with several devices) would count a
/// spawned thread of another test as its own, and that other test would
/// have no verdict.
fn starting<B: CubeBackend>() -> bool {
    device_or_skip::<B>();
    static OBSERVE: Once = Once::new();
    OBSERVE.call_once(|| {
        // For the life of the process: its guard is never dropped.
        std::mem::forget(LaunchObservation::new(Arc::new(CountLaunches)));
    });
    if RUNNING.with(|running| running.borrow().is_some()) {
        return false;
    }
    let thread = std::thread::current();
    let test = thread.name().filter(|name| *name != "main");
    if test.is_some() {
        take_slot();
    } else if several_devices::<B>() || !take_slot_within() {
        return false;
    }
    RUNNING.with(|running| {
        *running.borrow_mut() = Some(Running {
            test: test.map(str::to_owned),
            launches: None,
            streams: 0,
        });
    });
    true
}

/// Whether `B`'s runtime lists more than one device, asked once.
fn several_devices<B: CubeBackend>() -> bool {
    static SEVERAL: OnceLock<bool> = OnceLock::new();
    *SEVERAL.get_or_init(|| ScopeRuntime::<B>::enumerate_all_devices().len() > 1)
}

/// The test's count starts now.
fn mark_start() {
    RUNNING.with(|running| {
        if let Some(running) = running.borrow_mut().as_mut() {
            running.launches = Some(LAUNCHES.load(Ordering::Relaxed));
            running.streams = StreamId::allocate().value;
        }
    });
}

/// With no device for `B`, end the process after saying so (or fail, when
/// `SCOPE_REQUIRE` names the backend). Probes once per process.
fn device_or_skip<B: CubeBackend>() {
    static NONE: OnceLock<Option<(&'static str, String)>> = OnceLock::new();
    let missing = NONE.get_or_init(|| {
        // Only the default stream policy gives each thread its own stream
        // id on its first operation, which the count relies on.
        assert!(
            matches!(
                cubecl_environment::stream::policy(),
                StreamPolicy::PerThread
            ),
            "these tests count a thread's first device operation by the stream id it is given, \
             which needs cubecl's per-thread stream policy"
        );
        let probe = B::probe();
        if probe.has_device() {
            return None;
        }
        let why = probe
            .why_not
            .clone()
            .unwrap_or_else(|| "none found".to_owned());
        if !scope_core::required(probe.backend) {
            // To stdout itself: libtest would capture a `println!` and never
            // show it, since the process ends here.
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "skipped: no {} device ({why}): every test of this binary needs one; it stops here",
                probe.backend
            );
            let _ = out.flush();
            // A generated test cannot return early; the whole binary can.
            // Other tests' threads wait on this initialisation until then.
            std::process::exit(0);
        }
        Some((probe.backend, why))
    });
    if let Some((backend, why)) = missing {
        panic!("SCOPE_REQUIRE names {backend}, and there is no {backend} device: {why}");
    }
}

/// The running test does not run, for `why`: say so, in place of a verdict
/// on what reached the device.
pub fn not_run(why: &str) {
    println!("not run: {why}");
    RUNNING.with(|running| {
        if let Some(running) = running.borrow_mut().as_mut() {
            running.launches = None;
        }
    });
}

/// The scope client of `B`'s default device, for a `not_run` condition
/// that asks the server which device it opened.
pub fn scope_client<B: CubeBackend>() -> scope_core::Client<B> {
    ScopeRuntime::<B>::scope_client(&ScopeDevice::default())
}

/// cubecl-core's runtime tests for `$runtime` (a `CubeBackend`), in a
/// module `$module`: what `cubecl_core::testgen_all!(f32: [f32], i32:
/// [i32], u32: [u32])` instantiates, test for test and under the same
/// names, except that `binary_untyped`'s tests are this macro's own, so
/// that `$not_run` (`fn(&str) -> Option<&'static str>`, given a test's
/// name) can mark one as not holding here, with the reason.
#[macro_export]
macro_rules! runtime_tests {
    ($module:ident, $backend:ty, not_run: $not_run:path) => {
        mod $module {
            pub type TestRuntime = $crate::common::Watched<$backend>;

            use ::cubecl_core::__private::Runtime;

            // testgen_all!'s typed form: each element type's families in a
            // module of their own (the untyped form puts minifloat's
            // `mod e4m3` beside wgmma's glob import of the type).
            mod f32_ty {
                use super::*;

                #[allow(dead_code)]
                type FloatType = f32;
                #[allow(dead_code)]
                type IntType = i32;
                #[allow(dead_code)]
                type UintType = u32;

                ::cubecl_core::testgen_float!();
            }
            mod i32_ty {
                use super::*;

                #[allow(dead_code)]
                type FloatType = f32;
                #[allow(dead_code)]
                type IntType = i32;
                #[allow(dead_code)]
                type UintType = u32;

                ::cubecl_core::testgen_int!();
            }
            mod u32_ty {
                use super::*;

                #[allow(dead_code)]
                type FloatType = f32;
                #[allow(dead_code)]
                type IntType = i32;
                #[allow(dead_code)]
                type UintType = u32;

                ::cubecl_core::testgen_uint!();
            }

            // testgen_untyped!, family by family (cubecl-core
            // 0.12.0-pre.1, runtime_tests/mod.rs), binary_untyped below.
            ::cubecl_core::testgen_launch_untyped!();
            ::cubecl_core::testgen_cmma!();
            ::cubecl_core::testgen_cmma2!();
            ::cubecl_core::testgen_wgmma!();
            ::cubecl_core::testgen_numeric!();
            ::cubecl_core::testgen_bf16!();
            ::cubecl_core::testgen_file!();
            ::cubecl_core::testgen_read_lazy!();
            ::cubecl_core::testgen_metadata!();
            ::cubecl_core::testgen_topology!();
            ::cubecl_core::testgen_properties!();

            ::cubecl_core::testgen_sync_plane!();
            ::cubecl_core::testgen_tensor_indexing!();
            ::cubecl_core::testgen_debug!();
            ::cubecl_core::testgen_cluster!();

            ::cubecl_core::testgen_enums!();
            ::cubecl_core::testgen_harness!();
            ::cubecl_core::testgen_comparison!();

            ::cubecl_core::testgen_to_client!();
            ::cubecl_core::testgen_all_reduce!();
            ::cubecl_core::testgen_collectives!();

            ::cubecl_core::testgen_control_flow!();
            ::cubecl_core::testgen_stream_errors!();
            ::cubecl_core::testgen_allocation_mode!();
            ::cubecl_core::testgen_out_of_memory!();
            ::cubecl_core::testgen_compile!();

            // testgen_binary_untyped!'s seven tests, each first asking
            // `$not_run` whether it holds here.
            mod binary_untyped {
                use super::*;

                macro_rules! binary_test {
                    ($test:ident) => {
                        #[::cubecl_core::runtime_tests::test_log::test]
                        fn $test() {
                            let client = TestRuntime::client(&Default::default());
                            if let Some(why) = $not_run(stringify!($test)) {
                                $crate::common::not_run(why);
                                return;
                            }
                            ::cubecl_core::runtime_tests::binary::$test::<TestRuntime>(client);
                        }
                    };
                }

                binary_test!(test_mulhi);
                binary_test!(test_dp4a);
                binary_test!(test_powi_int);
                binary_test!(test_powi_negative_near_one);
                binary_test!(test_signed_remainder);
                binary_test!(test_self_div);
                binary_test!(test_ieee_constant_folds);
            }

            // Every scope server resolves an indirect count on the device.
            ::cubecl_core::testgen_launch_dynamic_count!();

            #[test]
            fn capture_is_seen_by_every_client_of_its_stream() {
                ::cubecl_core::runtime_tests::capture_status::a_capture_is_seen_by_every_client_of_its_stream::<TestRuntime>();
            }

            #[test]
            fn prepared_capture_ends_at_stop_capture() {
                ::cubecl_core::runtime_tests::capture_status::a_prepared_capture_ends_at_stop_capture::<TestRuntime>();
            }
        }
    };
}
