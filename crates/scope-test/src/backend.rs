//! The [`Backend`] contract driven directly, below the server.
//! These are promises a backend makes that no `Client` call can reach alone.
//! A server that breaks one is caught here, not by the undefined behaviour it causes on a device.
//! They need [`Capability::Backend`]: a suite whose [`Suite::backend`] makes one.
//!
//! Each behaviour is one `unsafe` sequence whose every call cites the contract it keeps.
//! The backend is the suite's own, on its device or its mock.
//! Everything made is given back before the behaviour ends.
//! So a mock's end-of-test check ([`Suite::finished`]) sees what leaked.

use scope_core::backend::{Bound, BoundDispatch, Launch};
use scope_core::{Access, Backend, StreamId};

use super::*;

/// A fresh backend of `S`'s device, or `None` after printing why this behaviour was not exercised.
fn open<S: Suite>() -> Option<S::Backend> {
    match S::backend()? {
        Ok(backend) => Some(backend),
        Err(Error::BackendUnavailable { backend, reason }) => {
            assert!(
                !required(backend),
                "SCOPE_REQUIRE names {backend} but it is unavailable: {reason}"
            );
            println!("skipped: no {backend} device ({reason})");
            None
        }
        Err(other) => panic!(
            "{} is present but failed to open: {other}",
            S::Backend::NAME
        ),
    }
}

/// A graph keeps the kernels it launches alive.
/// The `Backend` contract: "a kernel the core drops from its cache must not leave a graph
/// pointing at an unloaded module".
/// A fill recorded into a graph, its compiled kernel dropped, still runs when the graph replays.
pub fn a_graph_keeps_the_kernels_it_launches_alive<S: Suite>() {
    let Some(mut backend) = open::<S>() else {
        return;
    };
    // SAFETY: the backend's first stream, so its id is 0.
    let mut stream = unsafe { backend.create_stream(StreamId(0)) }.expect("a stream");
    // SAFETY: `stream` is this backend's; 256 bytes fits any suite device's largest allocation.
    let memory = unsafe { backend.allocate(&mut stream, 256) }.expect("256 bytes");
    let kernel = S::fill();
    let fill = backend.compile(&kernel).expect("the suite's fill compiles");
    let bindings = [Bound {
        memory: &memory,
        offset: 0,
        len: 256,
        access: Access::Write,
    }];
    let scalars = S::scalar_blob(&kernel, &[], &[64, 5]);
    let launch = Launch {
        name: "fill",
        bindings: &bindings,
        scalars: &scalars,
        dispatch: BoundDispatch::Groups([1, 1, 1]),
    };
    backend
        .check_launch(&fill, &launch)
        .expect("one workgroup of fill fits every device");
    // SAFETY: `stream` is this backend's, alive and not recording.
    unsafe { backend.begin_capture(&mut stream) }.expect("a capture begins");
    // SAFETY: `stream`, `fill` and `memory` are this backend's and alive; the binding is all 256
    // bytes at offset 0, which every alignment divides; one group is within the grid;
    // `check_launch` accepted this launch.
    unsafe { backend.launch(&mut stream, &fill, &launch) }.expect("recorded");
    // SAFETY: `stream` is recording; `memory`, the one memory it names, outlives the graph.
    let graph = unsafe { backend.end_capture(&mut stream) }.expect("sealed");
    drop(fill);
    // SAFETY: `stream` and `graph` are alive, `stream` is not recording, and `memory` is alive.
    unsafe { backend.replay(&mut stream, &graph) }.expect("the replay runs");
    let mut out = vec![0; 256];
    // SAFETY: both are alive, `stream` is not recording; bytes 0..256 are all of `memory`.
    unsafe { backend.read(&mut stream, &memory, 0, &mut out) }.expect("read");
    assert_eq!(as_words(&out), vec![5; 64], "the replay ran the fill");
    // SAFETY: the graph is this backend's and nothing names it again.
    unsafe { backend.destroy_graph(graph) }.expect("destroyed");
    // SAFETY: `memory` is this backend's, no graph naming it is left, and nothing names it again.
    unsafe { backend.free(memory) };
    drop(stream);
    drop(backend);
}

/// A wait in three steps covers the work before it and loses nothing issued while it ran.
/// The steps: `begin_wait` under the server's lock, `wait` without it on another thread, and
/// `end_wait` under it again.
/// The same stream then syncs.
/// A sync while it records, which `Backend::sync`'s contract allows, leaves its capture intact.
/// Where the suite counts a stream's unfinished work ([`Suite::pending`]), more is checked.
/// The wait is seen to cover exactly the work before it: an event, not a sync of the stream.
pub fn a_wait_covers_the_work_before_it_and_loses_none_after<S: Suite>() {
    let Some(mut backend) = open::<S>() else {
        return;
    };
    // SAFETY: the backend's first stream, so its id is 0.
    let mut stream = unsafe { backend.create_stream(StreamId(0)) }.expect("a stream");
    // SAFETY: `stream` is this backend's; 256 bytes fits any suite device's largest allocation.
    let memory = unsafe { backend.allocate(&mut stream, 256) }.expect("256 bytes");
    // SAFETY: `stream` and `memory` are alive; bytes 0..64 lie inside the 256, in whole words.
    unsafe { backend.write(&mut stream, &memory, 0, &[1; 64]) }.expect("write");
    // SAFETY: `stream` is this backend's, alive and not recording; the waiter is ended once, below.
    let waiter = unsafe { backend.begin_wait(&mut stream) }.expect("begin");
    // Another thread's write while the wait runs.
    // SAFETY: as the first write; bytes 64..128.
    unsafe { backend.write(&mut stream, &memory, 64, &[2; 64]) }.expect("write");
    let pending = S::pending(&stream);
    let waiter = std::thread::spawn(move || {
        if let Some(waiter) = &waiter {
            // SAFETY: the waiter is this backend's, alive until the join, and not ended yet.
            unsafe { S::Backend::wait(waiter) }.expect("the wait");
        }
        waiter
    })
    .join()
    .expect("the waiting thread");
    if let (Some(before), Some(after)) = (pending, S::pending(&stream)) {
        assert_eq!(
            after, 1,
            "the wait covered the work before it and only that (of {before} pending)"
        );
    }
    if let Some(waiter) = waiter {
        // SAFETY: the waiter `begin_wait` gave for this stream, ended once.
        unsafe { backend.end_wait(&mut stream, waiter) }.expect("end");
    }
    // SAFETY: as the first write; bytes 128..192.
    unsafe { backend.write(&mut stream, &memory, 128, &[3; 64]) }.expect("write");
    let mut out = vec![0; 192];
    // SAFETY: `stream` and `memory` are alive, `stream` is not recording, 0..192 lies in the 256.
    unsafe { backend.read(&mut stream, &memory, 0, &mut out) }.expect("read");
    assert_eq!(out[..64], [1; 64]);
    assert_eq!(out[64..128], [2; 64], "the write issued during the wait");
    assert_eq!(out[128..], [3; 64]);
    if let Some(left) = S::pending(&stream) {
        assert_eq!(left, 0, "a read waits for all of the stream's work");
    }
    // SAFETY: as the first write.
    unsafe { backend.write(&mut stream, &memory, 0, &[4; 64]) }.expect("write");
    // SAFETY: `stream` is this backend's and alive.
    unsafe { backend.sync(&mut stream) }.expect("sync");
    if let Some(left) = S::pending(&stream) {
        assert_eq!(left, 0, "a sync waits for all of the stream's work");
    }
    // SAFETY: `stream` is this backend's, alive and not recording.
    unsafe { backend.begin_capture(&mut stream) }.expect("a capture begins");
    // SAFETY: `stream` is this backend's and alive; `sync` may be asked of a recording stream.
    unsafe { backend.sync(&mut stream) }.expect("a recording stream syncs");
    // SAFETY: `stream` is recording; the capture names no memory.
    let graph = unsafe { backend.end_capture(&mut stream) }.expect("still sealable");
    // SAFETY: the graph is this backend's and nothing names it again.
    unsafe { backend.destroy_graph(graph) }.expect("destroyed");
    // SAFETY: `memory` is this backend's and nothing names it again.
    unsafe { backend.free(memory) };
    drop(stream);
    drop(backend);
}

/// The backend behaviours: one `#[test]` each for `$suite`, with what each needs.
#[macro_export]
macro_rules! backend_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, backend::a_graph_keeps_the_kernels_it_launches_alive, Backend }
        $crate::behaviour! { $suite, backend::a_wait_covers_the_work_before_it_and_loses_none_after, Backend }
    };
}
