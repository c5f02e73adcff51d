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

pub mod across;
pub mod backend;
pub mod capture;
pub mod clib;
pub mod collective;
pub mod contract;
pub mod dataflow;
pub mod device;
pub mod features;
pub mod host;
pub mod input;
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
/// The kernels work on `u32` words with a workgroup (block) of 64
/// invocations, one word each, and are dispatched over
/// `ceil(n / 64)` groups. Scalars are little-endian `u32`s.
pub trait Suite: 'static {
    /// The backend under test.
    type Backend: Backend;

    /// A client of a fresh server; [`scope_core::Error::BackendUnavailable`]
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

    /// A client of the server for rank `rank` of the collective behaviours'
    /// groups: a fresh server of [`client`](Self::client)'s by default (a
    /// logical device); a backend that enumerates devices gives each rank
    /// its own.
    #[allow(unused_variables)]
    fn rank_client(rank: usize) -> Result<Client<Self::Backend>> {
        Self::client()
    }

    /// How many ranks of distinct devices [`rank_client`](Self::rank_client)
    /// can make: the behaviours at every group size ([`sizes`]) run at one
    /// rank and at this many (at most [`MOST_RANKS`]). Four by default,
    /// the logical devices any number of servers can share; a suite over
    /// real devices answers the machine's count, so that a machine with one
    /// GPU runs a group of one.
    fn devices() -> usize {
        collective::RANKS
    }

    /// The group the collective behaviours run on: host staging by
    /// default ([`Group::new`](scope_core::collective::Group::new)); a suite for
    /// a device transport makes it with
    /// [`Group::over_device`](scope_core::collective::Group::over_device).
    fn group(
        clients: Vec<Client<Self::Backend>>,
        deadline: std::time::Duration,
    ) -> Result<scope_core::collective::Group<Self::Backend>> {
        scope_core::collective::Group::new(clients, deadline)
    }

    /// A fresh backend of the suite's device, for the behaviours that drive
    /// the [`Backend`] contract below the server
    /// (`conformance_tests!(@backend MySuite)`, [`backend`]): what
    /// [`client`](Self::client) would wrap. `None` by default, for a suite
    /// that only makes clients; those behaviours then do nothing, so only a
    /// suite that gives one expands them. Their kernels get their scalars
    /// from [`scalar_blob`](Self::scalar_blob) with no bindings.
    fn backend() -> Option<Result<Self::Backend>> {
        None
    }

    /// How much work `stream` has issued that has not finished, where the
    /// suite can count it (a mock driver's own counter); `None` by default.
    /// The backend behaviours use it to see that a wait covers exactly the
    /// work before it.
    #[allow(unused_variables)]
    fn pending(stream: &<Self::Backend as Backend>::Stream) -> Option<u64> {
        None
    }

    /// Whether the backend opens a lost device again
    /// ([`Backend::reopen`]): the
    /// property test ([`random_sequences`]) loses the device now and then
    /// and expects [`Client::recover`] to answer `Reopened` when this says
    /// so, and [`scope_core::Error::RestartRequired`] when not (rule 52).
    /// `false` by default, as `Backend::reopen`'s default; a suite that
    /// expands `conformance_tests!(@recovery …)` answers `true`.
    fn reopens() -> bool {
        false
    }

    /// Called at the end of every test
    /// [`conformance_tests!`](crate::conformance_tests) makes, on the test's
    /// thread: the place for a backend's own end-of-test check (a mock
    /// driver asserting it refused nothing). Nothing by default.
    fn finished() {}
}

pub use scope_core::required;

/// A client from `make`, or `None` after printing `skipped: no <backend>
/// device (<why>)` when the backend is unavailable here — the backend the
/// error names, which is not always the server's: a suite of NCCL's
/// collectives on a machine with a GPU and no NCCL is `skipped: no nccl
/// device`, a skip `SCOPE_REQUIRE=cuda` allows and `SCOPE_REQUIRE=nccl`
/// does not.
///
/// # Panics
///
/// When the backend is unavailable and [`required`]; or when `make` fails
/// for any reason other than unavailability — a device that is present but
/// broken is a failure, never a skip.
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

/// Expand to one `#[test]` per behaviour of the conformance suite, for the
/// [`Suite`] implementation `$suite`, plus `random_sequences`, the property
/// test ([`random_sequences`]) at [`property::STEPS`] over
/// [`property::SEEDS`]: a server that runs the suite runs both. Each ends
/// with [`Suite::finished`].
///
/// ```ignore
/// scope_test::conformance_tests!(MySuite);
/// ```
///
/// `conformance_tests!(@backend MySuite)` expands to the behaviours that
/// drive the [`Backend`] contract directly ([`backend`]), for a suite whose
/// [`Suite::backend`] makes one; `conformance_tests!(@wgsl_features
/// MySuite)` to the optional features' WGSL kernels ([`features`]), for a
/// backend that compiles WGSL.
///
/// `conformance_tests!(@recovery MySuite)` expands to the behaviours of a
/// lost device opened again ([`recover`]), for a suite whose backend
/// reopens ([`Backend::reopen`](scope_core::backend::Backend::reopen)),
/// with `conformance_tests!(@recovering_groups MySuite)`: a group whose
/// ranks lose and recover devices, shrink and grow ([`membership`],
/// [`random_rounds_with_changes`]), which a suite over a device transport
/// expands alone.
///
/// `conformance_tests!(@processes MySuite, "module::path", identity)`
/// expands, in the module the path names, to four ranks in four processes
/// ([`ranks_in_separate_processes`]), for a backend whose identity is
/// NCCL's unique id, made by `identity(dir)`.
///
/// `conformance_tests!(@device_collectives MySuite)` expands to the
/// collective behaviours alone, plus those only a device transport has —
/// a failed library call, and ranks that share no memory ([`across`]) —
/// for a suite whose [`Suite::group`] makes its groups with
/// [`Group::over_device`](scope_core::collective::Group::over_device) and whose
/// backend implements
/// [`DeviceCollectives`](scope_core::collective::device::DeviceCollectives);
/// they include `conformance_tests!(@every_group_size MySuite)`, the
/// behaviours at one rank and at one per device ([`sizes`]), which a suite
/// over a machine's real devices expands alone, since the others need four.
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
            recovery_is_refused_where_the_backend_cannot_reopen,
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
            collectives_compute_on_every_rank,
            a_failed_input_fails_every_ranks_output,
            a_broadcast_heals_the_other_ranks_failed_buffers,
            a_rank_that_never_joins_fails_the_others_within_the_deadline,
            bad_collective_input_is_refused_everywhere,
            a_freed_buffer_is_refused_on_every_rank,
            send_and_recv_carry_failures_between_ranks,
            a_sender_ahead_of_a_silent_receiver_holds_a_bounded_mailbox,
            copies_across_devices_carry_failures,
            a_host_staged_collective_is_not_recorded,
            random_rounds_of_collectives_match_the_oracle,
            survivors_of_a_missing_rank_shrink_and_go_on,
            a_rank_absent_from_a_shrink_is_left_out_at_the_deadline,
            a_rank_whose_device_is_lost_is_not_waited_for,
            a_newcomer_is_admitted_and_healed_by_its_peers,
            bad_membership_changes_are_refused_everywhere,
        );
    };
    (@device_collectives $suite:ty) => {
        $crate::conformance_tests!(@only $suite;
            collectives_compute_on_every_rank,
            a_failed_input_fails_every_ranks_output,
            a_broadcast_heals_the_other_ranks_failed_buffers,
            a_rank_that_never_joins_fails_the_others_within_the_deadline,
            bad_collective_input_is_refused_everywhere,
            a_freed_buffer_is_refused_on_every_rank,
            send_and_recv_carry_failures_between_ranks,
            a_sender_ahead_of_a_silent_receiver_holds_a_bounded_mailbox,
            a_failed_device_call_breaks_the_group,
            survivors_of_a_missing_rank_shrink_and_go_on,
            a_rank_whose_device_is_lost_is_not_waited_for,
            a_newcomer_is_admitted_and_healed_by_its_peers,
            bad_membership_changes_are_refused_everywhere,
            ranks_in_separate_processes_decide_alike,
            a_rank_joined_with_a_stale_epoch_is_refused_everywhere,
            a_silent_rank_in_another_process_stalls_its_peers_within_the_deadline,
            collectives_recorded_in_a_graph_replay_on_every_rank,
            a_failed_input_fails_every_ranks_replay,
            recorded_collectives_that_disagree_are_refused_everywhere,
            a_rank_that_never_replays_fails_the_others_within_the_deadline,
            ranks_in_separate_processes_record_and_replay,
            ranks_in_separate_processes_send_and_receive,
            a_silent_sender_in_another_process_stalls_its_receiver_within_the_deadline,
        );
        $crate::conformance_tests!(@every_group_size $suite);
    };
    (@every_group_size $suite:ty) => {
        $crate::conformance_tests!(@only $suite;
            every_collective_computes_at_every_group_size,
            a_failed_input_fails_every_output_at_every_group_size,
            a_refused_collective_claims_nothing_at_every_group_size,
            recorded_collectives_replay_at_every_group_size,
            ranks_joined_alone_agree_at_every_group_size,
            a_join_short_of_its_peers_ends_within_the_deadline,
            a_failed_library_call_breaks_the_group_at_every_group_size,
            membership_changes_at_every_group_size,
            random_rounds_of_collectives_match_the_oracle,
            random_rounds_of_ranks_joined_alone_match_the_oracle,
        );
    };
    (@recovery $suite:ty) => {
        $crate::conformance_tests!(@only $suite;
            a_lost_device_comes_back_with_every_handle,
            a_loss_in_the_middle_of_a_chain_heals_from_its_head,
            a_loss_during_a_capture_aborts_it_and_old_graphs_refuse,
            a_device_lost_twice_comes_back_twice,
            recovering_a_healthy_device_changes_nothing,
            a_loss_while_reopening_leaves_it_poisoned_and_recoverable,
            graphs_lost_before_a_failed_reopen_are_counted_when_it_opens,
            a_loss_while_remaking_buffers_leaves_none_behind,
            two_recoveries_at_once_open_the_device_once,
            reads_in_flight_on_other_threads_meet_a_recovery,
        );
        $crate::conformance_tests!(@recovering_groups $suite);
    };
    (@recovering_groups $suite:ty) => {
        $crate::conformance_tests!(@only $suite;
            a_lost_rank_recovers_and_is_admitted_back,
            random_rounds_with_losses_and_changes_match_the_oracle,
        );
    };
    (@backend $suite:ty) => {
        $crate::conformance_tests!(@only $suite;
            a_graph_keeps_the_kernels_it_launches_alive,
            a_wait_covers_the_work_before_it_and_loses_none_after,
        );
    };
    (@wgsl_features $suite:ty) => {
        $crate::conformance_tests!(@only $suite;
            f16_kernels_run_where_f16_is_enabled,
            subgroup_kernels_run_where_subgroups_are_enabled,
            f32_atomics_run_where_enabled,
            subgroup_sizes_come_with_subgroups,
        );
    };
    (@processes $suite:ty, $module:literal, $identity:expr) => {
        /// Four ranks in four processes: this binary runs [`rank`] four
        /// times.
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

        /// Four ranks in four processes, one killed in the middle of
        /// training: the others shrink to a new epoch and go on, a
        /// restarted process is admitted and healed, and every rank's
        /// weights end the same bits.
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
    (@only $suite:ty; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::$name::<$suite>();
                <$suite as $crate::Suite>::finished();
            }
        )*
    };
    (@each $suite:ty; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::$name::<$suite>();
                <$suite as $crate::Suite>::finished();
            }
        )*

        /// The soak at CI's scale (`SCOPE_SOAK_LAUNCHES` changes it): many
        /// threads, failures and captures, and nothing grows.
        #[test]
        fn soak() {
            let config = $crate::soak::SoakConfig::default();
            if let Some(samples) = $crate::soak::soak::<$suite>(&config) {
                for sample in samples {
                    println!("soak: {sample}");
                }
            }
            <$suite as $crate::Suite>::finished();
        }

        /// The property test at CI's scale (`SCOPE_PROPERTY_SEED` and
        /// `SCOPE_PROPERTY_STEPS` change it).
        #[test]
        fn random_sequences() {
            $crate::random_sequences::<$suite>(
                &$crate::property::SEEDS,
                $crate::property::STEPS,
            );
            <$suite as $crate::Suite>::finished();
        }
    };
}
