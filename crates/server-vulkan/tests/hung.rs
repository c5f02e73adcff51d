//! A kernel that never finishes: a sync gives up with a typed fault, other
//! threads' calls go on while it waits (the wait does not hold the server's
//! lock), and dropping the server afterwards returns instead of blocking
//! forever or destroying what the device may still run.
//!
//! Its own test binary: it sets `SCOPE_VULKAN_WAIT_TIMEOUT_MS`, and the
//! hung kernel keeps a lavapipe thread busy until the process exits.

use scope_core::{Binding, Dispatch, Error, Kernel};
use scope_test::client_or_skip;

/// Counts atomically until a word it never changes becomes zero: a loop
/// that makes progress (an atomic in every iteration), so no compiler may
/// assume it ends and drop it. Lavapipe ends any loop after 65,536
/// iterations, so the test dispatches the most workgroups the device allows
/// as well: about 2.8 × 10^14 of them, which no CPU finishes.
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

fn bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

#[test]
fn a_hung_kernel_times_out_and_teardown_does_not_block() {
    // SAFETY: this binary's only test, and it sets the variable before any
    // thread that could read the environment exists.
    unsafe { std::env::set_var("SCOPE_VULKAN_WAIT_TIMEOUT_MS", "2000") };
    let Some(c) = client_or_skip(|| server_vulkan::client_with(server_vulkan::Config::default()))
    else {
        return;
    };
    let data = c.upload(&bytes(&[1; 64])).unwrap();
    let most = c.with_backend(|b| b.max_workgroups());
    c.launch(
        &Kernel::wgsl("spin", SPIN),
        &[Binding::write(&data)],
        &[],
        Dispatch::Groups(most),
    )
    .unwrap();
    let start = std::time::Instant::now();
    let syncing = {
        let c = c.clone();
        std::thread::spawn(move || c.sync())
    };
    // While the sync waits for the kernel, another stream's calls that need
    // no device wait return at once; with the wait under the server's lock
    // they would return only when it gave up, two seconds in.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let other = c.new_stream().unwrap();
    let asked = std::time::Instant::now();
    let fresh = other.upload(&bytes(&[2; 64])).unwrap();
    assert_eq!(other.failures_held(), 0);
    other.check(&[fresh.all()]).unwrap();
    let took = asked.elapsed();
    assert!(
        !syncing.is_finished(),
        "the sync returned before the other stream's calls were timed"
    );
    assert!(
        took < std::time::Duration::from_millis(1000),
        "another stream's calls took {took:?} while a sync waited"
    );
    let error = syncing
        .join()
        .unwrap()
        .expect_err("the kernel never finishes");
    assert!(
        matches!(&error, Error::Fault(f) if !f.class.poisons() && f.code == "VK_TIMEOUT"),
        "{error}"
    );
    assert!(
        c.read(&data).is_err(),
        "the kernel's output carries the fault"
    );
    drop(data);
    drop(fresh);
    drop(other);
    drop(c);
    assert!(
        start.elapsed() < std::time::Duration::from_secs(60),
        "teardown took {:?}",
        start.elapsed()
    );
}
