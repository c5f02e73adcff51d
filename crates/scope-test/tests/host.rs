//! The reference host server's own promises: its built-in kernels never
//! index past a binding, a launch that does not match a kernel's bindings is
//! refused before it runs, a kernel that panics fails its launch like a
//! trapped GPU kernel, and no read — of any size — aborts the process.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use scope_core::{Binding, Client, Dispatch, Error, FaultPlan, Kernel, Site};
use scope_test::host::{self, Host, HostArgs};

fn words(values: &[u32]) -> Vec<u8> {
    host::bytes(values)
}

#[test]
fn a_copy_into_a_shorter_output_writes_what_fits() {
    let c = host::client().unwrap();
    let input = c.upload(&words(&(1..=16).collect::<Vec<_>>())).unwrap();
    let out = c.upload(&words(&[0; 4])).unwrap();
    c.launch(
        &Kernel::host("copy"),
        &[Binding::read(&input), Binding::write(&out)],
        &words(&[16]),
        Dispatch::linear(1),
    )
    .unwrap();
    assert_eq!(host::words(&c.read(&out).unwrap()), vec![1, 2, 3, 4]);
}

#[test]
fn a_launch_with_the_wrong_bindings_is_refused_before_it_runs() {
    let c = host::client().unwrap();
    let hooked = Arc::new(AtomicUsize::new(0));
    let counter = hooked.clone();
    c.on_failure(move |_, _| {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    let out = c.upload(&words(&[7; 4])).unwrap();
    let error = c
        .launch(
            &Kernel::host("copy"),
            &[Binding::write(&out)],
            &words(&[4]),
            Dispatch::linear(1),
        )
        .unwrap_err();
    assert!(matches!(error, Error::InvalidArgument { .. }), "{error}");
    assert!(error.to_string().contains("takes 2"), "{error}");
    assert_eq!(c.failures_held(), 0, "nothing claimed");
    assert_eq!(hooked.load(Ordering::SeqCst), 0, "no hook for bad input");
    assert_eq!(host::words(&c.read(&out).unwrap()), vec![7; 4]);
}

#[test]
fn a_kernel_that_panics_fails_its_launch_and_nothing_else() {
    let mut backend = Host::new();
    backend.register("explodes", |args: &mut HostArgs<'_>| {
        let _ = args.bindings[5].len();
        Ok(())
    });
    let c = Client::new(backend).unwrap();
    let out = c.upload(&words(&[1; 4])).unwrap();
    let bystander = c.upload(&words(&[2; 4])).unwrap();
    let error = c
        .launch(
            &Kernel::host("explodes"),
            &[Binding::write(&out)],
            &[],
            Dispatch::linear(1),
        )
        .unwrap_err();
    assert!(
        matches!(&error, Error::Launch { detail, .. } if detail.contains("panicked")),
        "{error}"
    );
    assert!(c.read(&out).is_err(), "its output carries the failure");
    assert_eq!(host::words(&c.read(&bystander).unwrap()), vec![2; 4]);
    assert!(c.poison().is_none());
}

#[test]
fn reading_a_failed_64_gib_buffer_answers_its_failure() {
    // The size that used to abort the process: the read sized its output
    // before testing the bytes for a failure.
    let c = Client::new(Host::new().with_memory_limit(1 << 40)).unwrap();
    let oom = || Error::OutOfMemory {
        backend: "host",
        requested: 64 << 30,
        detail: "injected".to_owned(),
    };
    c.inject(
        FaultPlan::new()
            .fail(Site::Allocate, 1, oom())
            .fail(Site::Allocate, 2, oom()),
    );
    let huge = c.allocate(64 << 30).unwrap();
    assert!(c.read(&huge).unwrap_err().is_out_of_memory());
    let mut room = [0u8; 4];
    assert!(c.read_into(huge.slice(0..4), &mut room).is_err());
}

#[test]
fn an_allocation_past_all_memory_is_an_invalid_argument() {
    let c = Client::new(Host::new().with_memory_limit(1 << 20)).unwrap();
    assert!(matches!(
        c.allocate(2 << 20),
        Err(Error::InvalidArgument { .. })
    ));
    let first = c.try_allocate(768 << 10).unwrap();
    // Fits the device, not now: out of memory, as a buffer that says so.
    assert!(c.try_allocate(512 << 10).unwrap_err().is_out_of_memory());
    drop(first);
    c.try_allocate(512 << 10).unwrap();
}

#[test]
fn streams_are_bounded_and_the_bound_is_a_typed_error() {
    let c = host::client().unwrap();
    let mut streams = Vec::new();
    loop {
        match c.new_stream() {
            Ok(s) => streams.push(s),
            Err(error) => {
                assert!(matches!(error, Error::InvalidArgument { .. }), "{error}");
                break;
            }
        }
    }
    assert_eq!(streams.len() + 1, scope_core::MAX_STREAMS);
    // The server keeps working on every stream it has.
    let buffer = streams[streams.len() - 1].upload(&words(&[5; 4])).unwrap();
    assert_eq!(host::words(&c.read(&buffer).unwrap()), vec![5; 4]);
}

fn fault(code: &str) -> Error {
    Error::Fault(scope_core::DeviceFault {
        backend: "host",
        code: code.to_owned(),
        class: scope_core::FaultClass::Recoverable,
        stream: None,
        detail: "injected".to_owned(),
    })
}

#[test]
fn a_device_fault_while_issuing_loses_the_streams_batch() {
    // A failed batch submit claimed only the write set of the work that
    // triggered it; earlier writes in the same batch read as healthy.
    let c = host::client().unwrap();
    let earlier = c.upload(&words(&[1; 4])).unwrap();
    let out = c.upload(&words(&[2; 4])).unwrap();
    c.write(&earlier, &words(&[3; 4])).unwrap();
    c.inject(FaultPlan::new().fail(Site::Launch, 1, fault("BATCH_LOST")));
    let lost = c
        .launch(
            &Kernel::host("fill"),
            &[Binding::write(&out)],
            &words(&[4, 9]),
            Dispatch::linear(1),
        )
        .unwrap_err();
    assert!(matches!(lost, Error::Fault(_)), "{lost}");
    let error = c.read(&earlier).unwrap_err();
    assert!(error.to_string().contains("BATCH_LOST"), "{error}");
    assert!(c.read(&out).is_err());
    assert!(c.poison().is_none());
}

#[test]
fn a_fault_the_in_flight_bound_surfaces_is_not_healed_by_the_work_that_hit_it() {
    // The in-flight list is bounded by a sync once it holds 65,536 ranges.
    // That sync ran inside the scope of the write that filled the list, so
    // the fault it surfaced was claimed and then healed by that write's
    // clean exit.
    const WORDS: u64 = 1 << 16;
    let c = host::client().unwrap();
    let buffer = c.allocate(WORDS * 4).unwrap();
    c.sync().unwrap();
    c.inject(FaultPlan::new().fail(Site::Sync, 1, fault("LATE")));
    for i in 0..WORDS {
        c.write(buffer.slice(i * 4..i * 4 + 4), &words(&[i as u32]))
            .unwrap();
    }
    let last = c
        .read(buffer.slice((WORDS - 1) * 4..WORDS * 4))
        .unwrap_err();
    assert!(last.to_string().contains("LATE"), "{last}");
    assert!(c.read(buffer.slice(0..4)).is_err());
}
