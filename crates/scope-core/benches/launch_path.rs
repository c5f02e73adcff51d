//! The whole launch path through the reference server: `Client::launch` of a
//! kernel with 2 read bindings and 1 write binding — lock, handle
//! resolution, validation, the compile cache, the skip check, the scope, the
//! backend call, in-flight bookkeeping. The host kernel does nothing, so the
//! figure is the server's own cost plus the host backend's copy of three
//! 16-byte bindings.
//!
//! `SCOPE_BENCH_SMOKE=1` runs a few iterations, to prove the bench runs.

use std::time::Instant;

use scope_core::host::Host;
use scope_core::{Binding, Client, Dispatch, Kernel};

fn main() {
    let smoke = std::env::var_os("SCOPE_BENCH_SMOKE").is_some();
    let iterations: u32 = if smoke { 1_000 } else { 300_000 };
    let rounds = if smoke { 1 } else { 5 };
    let mut host = Host::new();
    host.register("noop", |_| Ok(()));
    let client = Client::new(host).expect("host client");
    let a = client.upload(&[1; 16]).unwrap();
    let b = client.upload(&[2; 16]).unwrap();
    let out = client.allocate(16).unwrap();
    let kernel = Kernel::host("noop");
    let bindings = [Binding::read(&a), Binding::read(&b), Binding::write(&out)];
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..iterations {
            client
                .launch(&kernel, &bindings, &[], Dispatch::linear(1))
                .expect("launch");
        }
        client.sync().unwrap();
        best = best.min(start.elapsed().as_nanos() as f64 / f64::from(iterations));
    }
    assert_eq!(client.failures_held(), 0);
    println!("launch_path: reference server, 2 reads + 1 write: {best:.0} ns/launch");
}
