//! The adapter's own behaviour, beyond what cubecl's runtime tests ask:
//! memory that cubecl frees is given back to scope, bytes cubecl cannot
//! have are refused where the caller will hear of it, and the stream fold
//! stays bounded.

#![cfg(feature = "wgpu")]

use cubecl_core as cubecl;
use cubecl_core::prelude::*;
use cubecl_environment::stream::StreamId;
use cubecl_runtime::client::Client;
use cubecl_runtime::runtime::Runtime;
use scope_cubecl::{ScopeDevice, ScopeRuntime};
use server_wgpu::Wgpu;

fn client() -> Option<Client> {
    if ScopeRuntime::<Wgpu>::enumerate_all_devices().is_empty() {
        assert!(
            !scope_core::required("wgpu"),
            "SCOPE_REQUIRE names wgpu, and there is no wgpu device"
        );
        println!("skipped: no wgpu device");
        return None;
    }
    Some(ScopeRuntime::<Wgpu>::client(&ScopeDevice::default()))
}

/// cubecl has no free call: a handle is free when the client let go of it.
/// The adapter must notice and drop the scope buffer, or a program that
/// allocates in a loop grows without bound.
#[test]
fn memory_cubecl_lets_go_of_is_given_back_to_scope() {
    let Some(client) = client() else { return };
    let scope = ScopeRuntime::<Wgpu>::scope_client(&ScopeDevice::default());
    const MIB: usize = 1 << 20;
    let ones = vec![1u8; MIB];
    for _ in 0..512 {
        let handle = client.create_from_slice(&ones);
        drop(handle);
    }
    // 512 MiB went through; a few live at a time at most.
    let held = scope.bytes_allocated();
    assert!(
        held < 160 * MIB as u64,
        "scope still holds {} MiB after every handle was dropped",
        held / MIB as u64
    );
}

#[cube(launch)]
fn bump(out: &mut [u32]) {
    if ABSOLUTE_POS < out.len() {
        out[ABSOLUTE_POS] += 1;
    }
}

/// Scope writes whole words. A cubecl write that starts inside a word
/// cannot be made without touching bytes it was not given: it is refused
/// on the destination, where the next read reports it, rather than
/// dropped or rounded.
#[test]
fn a_write_that_starts_inside_a_word_fails_its_bytes() {
    let Some(client) = client() else { return };
    let handle = client.create_from_slice(&[0u8; 64]);
    let inside = handle.clone().offset_start(2).offset_end(2);
    client.write(
        &inside,
        cubecl_common::bytes::Bytes::from_bytes_vec(vec![7u8; 60]),
    );
    let error = client.read_one(inside).expect_err("the write was refused");
    assert!(error.to_string().contains("not word-aligned"), "{error}");
    // The device kept working: a fresh buffer reads and writes.
    let fresh = client.create_from_slice(&[0u8; 16]);
    bump::launch(
        &client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(4),
        // SAFETY: `fresh` holds four u32s, the length given.
        unsafe { BufferArg::from_raw_parts(fresh.clone(), 4) },
    );
    let bytes = client.read_one(fresh).expect("a fresh buffer reads");
    assert_eq!(&bytes[..4], &1u32.to_le_bytes());
}

/// Every cubecl stream id lands on one of a bounded set of scope streams,
/// however many ids a program uses (scope streams are never destroyed).
#[test]
fn many_cubecl_streams_fold_onto_few_scope_streams() {
    let Some(client) = client() else { return };
    let handle = client.create_from_slice(&[0u8; 16]);
    for id in 0..1_000u64 {
        StreamId { value: 50_000 + id }.executes(|| {
            bump::launch(
                &client,
                CubeCount::Static(1, 1, 1),
                CubeDim::new_1d(4),
                // SAFETY: `handle` holds four u32s, the length given.
                unsafe { BufferArg::from_raw_parts(handle.clone(), 4) },
            );
        });
    }
    let bytes = client.read_one(handle).expect("the bumps ran, in order");
    assert_eq!(&bytes[..4], &1_000u32.to_le_bytes());
    let streams = client.memory_report(cubecl_runtime::memory_management::MemoryScope::Device);
    assert!(
        streams.streams.len() <= 128,
        "{} scope streams for 1,000 cubecl ones",
        streams.streams.len()
    );
}
