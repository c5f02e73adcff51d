//! A device lost for real and opened again, on both software adapters.
//!
//! The conformance group (`conformance.rs`, `recover_tests!`) loses the device by
//! an injected sticky fault: the server is poisoned, but the wgpu device
//! itself is healthy. Here the device is lost for real: `Device::destroy` on
//! the server's own device (through `Wgpu::raw`), which lavapipe and
//! llvmpipe both honour — wgpu marks the device invalid, every later call
//! on it is a silent no-op, and its loss callback runs at the next poll.
//! The server must classify that as the sticky device-lost fault, and
//! `Client::recover` must give the destroyed device up and ask the adapter
//! for a new one.

mod common;

use scope_core::{Binding, Buffer, Client, Dispatch, Kernel, Recovered};
use scope_test::client_or_skip;
use server_wgpu::{Api, Wgpu};

use common::{ADD, FILL, bytes, words};

const N: u32 = 1000;

fn setup(api: Api) -> Option<Client<Wgpu>> {
    client_or_skip(|| common::client_on(api))
}

fn read_words(c: &Client<Wgpu>, b: &Buffer) -> scope_core::Result<Vec<u32>> {
    c.read(b).map(|v| words(&v))
}

fn fill(c: &Client<Wgpu>, out: &Buffer, value: u32) -> scope_core::Result<()> {
    c.launch(
        &Kernel::wgsl("fill", FILL),
        &[Binding::write(out)],
        &bytes(&[N, value]),
        Dispatch::linear(N.div_ceil(64)),
    )
}

fn add(c: &Client<Wgpu>, a: &Buffer, b: &Buffer, out: &Buffer) -> scope_core::Result<()> {
    c.launch(
        &Kernel::wgsl("add", ADD),
        &[Binding::read(a), Binding::read(b), Binding::write(out)],
        &bytes(&[N]),
        Dispatch::linear(N.div_ceil(64)),
    )
}

fn ramp(start: u32) -> Vec<u32> {
    (start..start + N).collect()
}

/// The server's device, for comparing before and after.
fn raw_device(c: &Client<Wgpu>) -> wgpu::Device {
    c.with_backend(|b| b.raw().0.clone())
}

/// Destroy the server's device behind its back, and see the next call that
/// reaches the device fail with the sticky device-lost fault and poison
/// the client.
fn destroy_and_see_it_lost(c: &Client<Wgpu>, probe: &Buffer) {
    c.with_backend(|b| b.raw().0.destroy());
    let error = read_words(c, probe).unwrap_err();
    assert!(error.is_sticky(), "a real loss is sticky: {error}");
    let text = error.to_string();
    assert!(text.contains("DEVICE_LOST"), "{text}");
    assert!(
        text.contains("destroy"),
        "says the device was destroyed: {text}"
    );
    assert!(c.poison().is_some(), "the client is poisoned");
    assert!(c.allocate(64).unwrap_err().is_device_poisoned());
    assert!(c.sync().unwrap_err().is_device_poisoned());
}

/// Recover, expecting the device to open again with `buffers` remade.
fn reopen(c: &Client<Wgpu>, buffers: usize) {
    match c.recover() {
        Ok(Recovered::Reopened {
            buffers: remade,
            unallocated,
            fault,
            ..
        }) => {
            assert_eq!(remade, buffers);
            assert_eq!(unallocated, 0);
            assert!(fault.is_sticky(), "{fault}");
        }
        other => panic!("the device should have opened again: {other:?}"),
    }
    assert!(c.poison().is_none());
}

fn assert_lost(c: &Client<Wgpu>, buffer: &Buffer) {
    let error = read_words(c, buffer).unwrap_err();
    assert!(error.is_lost_with_device(), "{error}");
    assert!(error.to_string().contains("DEVICE_LOST"), "{error}");
}

/// Uploaded, filled and computed buffers; the device destroyed for real;
/// the next read a sticky fault that poisons; `recover` opens a new device
/// from the same adapter, every buffer reads as lost with the device, a
/// rewrite heals it, and kernels (compiled again) give the right numbers.
pub fn a_destroyed_device_comes_back(api: Api) {
    let Some(c) = setup(api) else { return };
    let a = c.upload(&bytes(&ramp(1))).unwrap();
    let b = c.allocate(u64::from(N) * 4).unwrap();
    let sum = c.allocate(u64::from(N) * 4).unwrap();
    fill(&c, &b, 10).unwrap();
    add(&c, &a, &b, &sum).unwrap();
    assert_eq!(read_words(&c, &a).unwrap(), ramp(1));
    assert_eq!(read_words(&c, &sum).unwrap(), ramp(11));
    let described = c.describe().to_owned();
    let limits = c.limits();
    let before = raw_device(&c);

    destroy_and_see_it_lost(&c, &sum);
    reopen(&c, 3);

    let after = raw_device(&c);
    assert_ne!(before, after, "a new device, not the destroyed one");
    drop(before);
    assert_eq!(c.describe(), described, "the same adapter");
    assert_eq!(c.limits().max_allocation, limits.max_allocation);
    assert_eq!(
        c.limits().launch,
        limits.launch,
        "the same features and limits"
    );
    for buffer in [&a, &b, &sum] {
        assert_lost(&c, buffer);
    }
    // Work over lost bytes is skipped, and its output carries the loss.
    assert!(matches!(
        add(&c, &a, &b, &sum),
        Err(scope_core::Error::Skipped { .. })
    ));
    assert_lost(&c, &sum);
    // Rewrites heal, and the new device computes.
    c.write(a.all(), &bytes(&ramp(100))).unwrap();
    fill(&c, &b, 7).unwrap();
    add(&c, &a, &b, &sum).unwrap();
    assert_eq!(read_words(&c, &a).unwrap(), ramp(100));
    assert_eq!(read_words(&c, &b).unwrap(), vec![7; N as usize]);
    assert_eq!(read_words(&c, &sum).unwrap(), ramp(107));
    let fresh = c.upload(&bytes(&ramp(5))).unwrap();
    assert_eq!(read_words(&c, &fresh).unwrap(), ramp(5));
    c.sync().unwrap();
    c.audit().unwrap();
    drop((a, b, sum, fresh));
    c.sync().unwrap();
    assert_eq!(c.failures_held(), 0);
}

/// Work encoded and submitted when the device is destroyed: the sync that
/// learns of it fails sticky, and after recovery every stream works, the
/// one that held the work included.
pub fn work_in_flight_at_the_loss_is_lost_with_it(api: Api) {
    let Some(c) = setup(api) else { return };
    let other = c.new_stream().unwrap();
    let a = c.upload(&bytes(&ramp(0))).unwrap();
    let out = c.allocate(u64::from(N) * 4).unwrap();
    for round in 0..50 {
        fill(&other, &out, round).unwrap();
    }
    other.flush().unwrap();
    c.with_backend(|b| b.raw().0.destroy());
    let _ = fill(&other, &out, 99);
    let error = other.sync().unwrap_err();
    assert!(error.is_sticky(), "{error}");
    assert!(c.poison().is_some());
    reopen(&c, 2);
    assert_lost(&other, &out);
    assert_lost(&c, &a);
    fill(&other, &out, 3).unwrap();
    add(&c, &out, &out, &a).unwrap();
    assert_eq!(read_words(&other, &a).unwrap(), vec![6; N as usize]);
    c.audit().unwrap();
}

/// Destroyed, recovered, destroyed again, recovered again: each recovery
/// opens a device of its own, and the same handles compute after both.
pub fn a_device_destroyed_twice_comes_back_twice(api: Api) {
    let Some(c) = setup(api) else { return };
    let a = c.upload(&bytes(&ramp(1))).unwrap();
    let b = c.allocate(u64::from(N) * 4).unwrap();
    let mut devices = vec![raw_device(&c)];
    for round in 0..2u32 {
        fill(&c, &b, round).unwrap();
        destroy_and_see_it_lost(&c, &b);
        reopen(&c, 2);
        let device = raw_device(&c);
        assert!(
            devices.iter().all(|d| *d != device),
            "round {round}: a device of its own"
        );
        devices.push(device);
        assert_lost(&c, &a);
        assert_lost(&c, &b);
        assert!(c.failures_held() <= c.failure_claims());
        c.write(a.all(), &bytes(&ramp(round))).unwrap();
        fill(&c, &b, 1000).unwrap();
        let sum = c.allocate(u64::from(N) * 4).unwrap();
        add(&c, &a, &b, &sum).unwrap();
        assert_eq!(read_words(&c, &sum).unwrap(), ramp(round + 1000));
        c.audit().unwrap();
    }
    drop(devices);
    c.sync().unwrap();
}

/// A destroyed device's client, dropped without recovering, goes quietly:
/// the final wait meets a lost device, and nothing panics.
pub fn a_destroyed_device_drops_quietly(api: Api) {
    let Some(c) = setup(api) else { return };
    let a = c.upload(&bytes(&ramp(0))).unwrap();
    fill(&c, &a, 1).unwrap();
    c.with_backend(|b| b.raw().0.destroy());
    let _ = fill(&c, &a, 2);
    drop(a);
    drop(c);
}

macro_rules! on_each_api {
    ($($name:ident),* $(,)?) => {
        mod vulkan {
            $( #[test] fn $name() { super::$name(server_wgpu::Api::Vulkan); } )*
        }
        mod gl {
            $( #[test] fn $name() { super::$name(server_wgpu::Api::Gl); } )*
        }
    };
}

on_each_api!(
    a_destroyed_device_comes_back,
    work_in_flight_at_the_loss_is_lost_with_it,
    a_device_destroyed_twice_comes_back_twice,
    a_destroyed_device_drops_quietly,
);
