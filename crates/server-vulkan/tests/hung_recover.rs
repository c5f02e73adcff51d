//! A recovery while a kernel never finishes: the wait for the lost device
//! gives up after the wait timeout instead of blocking, what that work may
//! use is leaked rather than destroyed under it, and a new device opens
//! beside the one still spinning.
//!
//! No work is run on the new device here: on lavapipe a launch on it did
//! not finish while the old device's kernel spun (its read timed out), so
//! the spinning kernel seems to hold what every device of the physical
//! device runs on. `recover.rs` runs work on a new device.
//!
//! Its own test binary, as `hung.rs` is: it sets
//! `SCOPE_VULKAN_WAIT_TIMEOUT_MS`, and the hung kernel keeps a lavapipe
//! thread busy until the process exits.

use scope_core::{Binding, Dispatch, FaultPlan, Kernel, Recovered};
use scope_test::client_or_skip;

/// The kernel of `hung.rs`: a loop that makes progress and never ends,
/// over the most workgroups the device allows.
const SPIN: &str = r#"
@group(0) @binding(0) var<storage, read_write> data: array<atomic<u32>>;
@compute @workgroup_size(1)
fn main() {
    loop {
        atomicAdd(&data[1], 1u);
        if (atomicLoad(&data[0]) == 0u) { break; }
    }
}
"#;

/// Any launch, to meet the injected loss.
const FILL: &str = r#"
struct Params { n: u32, value: u32 }
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@group(0) @binding(1) var<storage, read> params: Params;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < params.n) { out[id.x] = params.value; }
}
"#;

fn bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[test]
fn a_recovery_gives_up_on_a_hung_device_and_opens_a_new_one() {
    // SAFETY: this binary's only test, and it sets the variable before any
    // thread that could read the environment exists.
    unsafe { std::env::set_var("SCOPE_VULKAN_WAIT_TIMEOUT_MS", "2000") };
    let Some(c) = client_or_skip(|| server_vulkan::client_with(server_vulkan::Config::default()))
    else {
        return;
    };
    let data = c.upload(&bytes(&[1; 64])).unwrap();
    let out = c.try_allocate(256).unwrap();
    let most = c.with_backend(|b| b.max_workgroups());
    c.launch(
        &Kernel::wgsl("spin", SPIN),
        &[Binding::write(&data)],
        &[],
        Dispatch::Groups(most),
    )
    .unwrap();
    c.flush().unwrap();
    c.inject(FaultPlan::new().poison_at(1, "injected", "DEVICE_LOST"));
    let lost = c
        .launch(
            &Kernel::wgsl("fill", FILL),
            &[Binding::write(&out)],
            &bytes(&[64, 1]),
            Dispatch::linear(1),
        )
        .unwrap_err();
    assert!(lost.is_sticky(), "{lost}");
    let before = c.with_backend(|b| b.raw().map(|raw| raw.device.handle()));
    let start = std::time::Instant::now();
    let recovered = c.recover().unwrap();
    let took = start.elapsed();
    assert!(
        matches!(recovered, Recovered::Reopened { buffers: 2, .. }),
        "{recovered:?}"
    );
    assert!(
        took >= std::time::Duration::from_millis(1900) && took < std::time::Duration::from_secs(30),
        "the wait for the hung device gives up after its timeout: {took:?}"
    );
    let after = c.with_backend(|b| b.raw().map(|raw| raw.device.handle()));
    assert!(after.is_some());
    assert_ne!(before, after, "a new VkDevice beside the hung one");
    assert!(c.poison().is_none());
    assert!(c.read(&out).unwrap_err().is_lost_with_device());
    // Memory comes from the new device's pool.
    let fresh = c.try_allocate(1 << 20).unwrap();
    assert!(c.with_backend(scope_core::Backend::bytes_reserved) >= 1 << 20);
    drop(fresh);
    drop((data, out));
    drop(c);
    assert!(
        start.elapsed() < std::time::Duration::from_secs(60),
        "teardown took {:?}",
        start.elapsed()
    );
}
