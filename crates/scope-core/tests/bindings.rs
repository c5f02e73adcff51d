//! What a launch checks of each binding before anything is claimed, and
//! which scope a clean or a failing input opens: the launch path checks
//! each binding in one pass, the offset and the length with one mask, and
//! opens its scope without a second look when it saw every input clean.
//! These pin what that pass must keep answering — the same refusal, in the
//! same order, naming the same binding — and that an input carrying a
//! failure still skips the launch.
//!
//! Over the null backend, which keeps no bytes: the tests check outcomes
//! (which error, which bytes a failure claims), never values.

use scope_core::null::Null;
use scope_core::{Binding, Buffer, ByteRange, Client, Dispatch, Error, Kernel, Slice};

fn client(alignment: Option<u64>) -> Client<Null> {
    let backend = match alignment {
        Some(alignment) => Null::new().with_binding_alignment(alignment),
        None => Null::new(),
    };
    Client::new(backend).expect("null client")
}

fn launch(client: &Client<Null>, bindings: &[Binding<'_>]) -> scope_core::Result<()> {
    client.launch(&Kernel::host("k"), bindings, &[], Dispatch::linear(1))
}

/// The refusal `bindings` get, which must be an invalid argument that
/// claimed nothing; its `what` and `why`.
fn refused(client: &Client<Null>, bindings: &[Binding<'_>]) -> (String, String) {
    let error = launch(client, bindings).expect_err("refused");
    assert_eq!(client.failures_held(), 0, "a refusal claims nothing");
    match error {
        Error::InvalidArgument { what, why } => (what, why),
        other => panic!("not an invalid argument: {other}"),
    }
}

fn buffers(client: &Client<Null>) -> (Buffer, Buffer) {
    (
        client.allocate(64).expect("allocate"),
        client.allocate(64).expect("allocate"),
    )
}

#[test]
fn an_offset_off_the_alignment_is_refused_naming_its_binding() {
    let client = client(None);
    let (a, out) = buffers(&client);
    let (what, why) = refused(&client, &[Binding::read(&a), out.slice(2..10).write()]);
    assert_eq!(what, "binding 1 of `k`");
    assert_eq!(why, "offset 2 is not a multiple of 4");
}

#[test]
fn a_length_of_part_words_is_refused() {
    let client = client(None);
    let (a, out) = buffers(&client);
    let (what, why) = refused(&client, &[a.slice(4..10).read(), Binding::write(&out)]);
    assert_eq!(what, "binding 0 of `k`");
    assert!(why.contains("is not whole 4-byte words"), "{why}");
}

#[test]
fn an_offset_is_checked_before_a_length() {
    let client = client(None);
    let (a, _) = buffers(&client);
    let (_, why) = refused(&client, &[a.slice(2..5).read_write()]);
    assert_eq!(why, "offset 2 is not a multiple of 4");
}

#[test]
fn an_alignment_below_a_word_still_asks_whole_words() {
    // Alignment 1: any offset, lengths in whole words.
    let client = client(Some(1));
    let (a, out) = buffers(&client);
    launch(&client, &[a.slice(1..9).read(), out.slice(3..7).write()])
        .expect("any offset on alignment 1");
    let (_, why) = refused(&client, &[a.slice(1..4).read()]);
    assert!(why.contains("is not whole 4-byte words"), "{why}");
    // Alignment 2: even offsets.
    let client = self::client(Some(2));
    let (a, _) = buffers(&client);
    launch(&client, &[a.slice(2..6).read()]).expect("an even offset on alignment 2");
    let (_, why) = refused(&client, &[a.slice(1..5).read()]);
    assert_eq!(why, "offset 1 is not a multiple of 2");
}

#[test]
fn an_alignment_that_is_no_power_of_two_divides() {
    let client = client(Some(12));
    let (a, _) = buffers(&client);
    launch(&client, &[a.slice(24..28).read()]).expect("a multiple of 12");
    let (_, why) = refused(&client, &[a.slice(16..20).read()]);
    assert_eq!(why, "offset 16 is not a multiple of 12");
    let (_, why) = refused(&client, &[a.slice(12..14).read()]);
    assert!(why.contains("is not whole 4-byte words"), "{why}");
}

#[test]
fn ranges_past_their_buffer_reversed_or_empty_are_refused() {
    let client = client(None);
    let (a, _) = buffers(&client);
    let (what, why) = refused(&client, &[a.slice(60..68).read()]);
    assert_eq!(what, "binding 0 of `k`");
    assert!(why.contains("runs past the end"), "{why}");
    let reversed = Slice {
        buffer: &a,
        range: ByteRange { start: 8, end: 4 },
    };
    let (_, why) = refused(&client, &[reversed.read()]);
    assert!(why.contains("reversed"), "{why}");
    let (_, why) = refused(&client, &[a.slice(8..8).read()]);
    assert!(why.contains("empty range"), "{why}");
}

#[test]
fn a_freed_or_foreign_buffer_is_refused() {
    let client = client(None);
    let (a, b) = buffers(&client);
    client.free(&b).expect("free");
    let (what, why) = refused(&client, &[Binding::read(&a), Binding::write(&b)]);
    assert_eq!(what, "binding 1 of `k`");
    assert!(why.contains("was freed"), "{why}");
    let other = self::client(None);
    let foreign = other.allocate(64).expect("allocate");
    let (_, why) = refused(&client, &[Binding::read(&foreign)]);
    assert!(why.contains("belongs to another server"), "{why}");
}

#[test]
fn a_clean_launch_leaves_nothing_claimed() {
    let client = client(None);
    let (a, out) = buffers(&client);
    for _ in 0..3 {
        launch(&client, &[Binding::read(&a), Binding::write(&out)]).expect("launch");
    }
    assert_eq!(client.failures_held(), 0);
    client.check(&[out.all()]).expect("the output is written");
}

#[test]
fn an_input_that_carries_a_failure_skips_the_launch() {
    // Rules 17, 18: the input is tainted over part of its range only; the
    // launch reads the whole buffer and must see it.
    let client = client(None);
    let (a, out) = buffers(&client);
    client
        .fail_writing(&[a.slice(16..32)], Error::refused("root"))
        .expect("fail_writing");
    let error = launch(&client, &[Binding::read(&a), Binding::write(&out)]).expect_err("skipped");
    assert!(matches!(error, Error::Skipped { .. }), "{error}");
    let report = client
        .check(&[out.all()])
        .expect_err("the output carries the root");
    assert!(report.to_string().contains("root"), "{report}");
    // An input read outside the tainted bytes is clean.
    launch(&client, &[a.slice(0..16).read(), Binding::write(&out)]).expect("clean bytes");
    client.check(&[out.all()]).expect("healed");
}

#[test]
fn an_output_that_carries_a_failure_does_not_skip_and_heals() {
    let client = client(None);
    let (a, out) = buffers(&client);
    client
        .fail_writing(&[out.all()], Error::refused("old"))
        .expect("fail_writing");
    launch(&client, &[Binding::read(&a), Binding::write(&out)]).expect("runs");
    client.check(&[out.all()]).expect("the rewrite healed it");
    assert_eq!(client.failures_held(), 0);
}

#[test]
fn a_read_write_binding_that_carries_a_failure_skips() {
    let client = client(None);
    let (a, _) = buffers(&client);
    client
        .fail_writing(&[a.slice(0..4)], Error::refused("root"))
        .expect("fail_writing");
    let error = launch(&client, &[Binding::read_write(&a)]).expect_err("skipped");
    assert!(matches!(error, Error::Skipped { .. }), "{error}");
}

#[test]
fn an_input_without_memory_skips_with_its_allocation_error() {
    // Rule 28: reads of a failed allocation answer its error; a launch
    // that reads it is skipped, and its output carries that error.
    let client = client(None);
    let (_, out) = buffers(&client);
    let failed = client
        .failed_allocation(64, Error::refused("no room"))
        .expect("failed allocation");
    let error =
        launch(&client, &[Binding::read(&failed), Binding::write(&out)]).expect_err("skipped");
    assert!(matches!(error, Error::Skipped { .. }), "{error}");
    let report = client.check(&[out.all()]).expect_err("claimed");
    assert!(report.to_string().contains("no room"), "{report}");
}

#[test]
fn an_indirect_launch_whose_counts_carry_a_failure_skips() {
    let client = client(None);
    let (a, out) = buffers(&client);
    let counts = client.allocate(12).expect("allocate");
    let kernel = Kernel::host("k");
    client
        .launch(
            &kernel,
            &[Binding::read(&a), Binding::write(&out)],
            &[],
            Dispatch::Indirect(counts.all()),
        )
        .expect("clean counts");
    client
        .fail_writing(&[counts.all()], Error::refused("counts"))
        .expect("fail_writing");
    let error = client
        .launch(
            &kernel,
            &[Binding::read(&a), Binding::write(&out)],
            &[],
            Dispatch::Indirect(counts.all()),
        )
        .expect_err("skipped");
    assert!(matches!(error, Error::Skipped { .. }), "{error}");
}
