//! A peer process killed while it holds the mock NCCL's shared clique.
//!
//! Ranks in separate processes meet in a file both map, behind one lock.
//! A process killed while it holds that lock must not hang its peers: to
//! them, a dead peer is one whose part never comes, so their round stalls
//! at the deadline, as NCCL's does. The launcher test in
//! `crates/scope-test/src/survival.rs` kills a rank at a random instant,
//! and about one run in a hundred and fifty it held the lock.

#[macro_use]
mod common;
#[path = "mock/harness.rs"]
mod harness;

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use harness::mock;
use scope_native::nccl::UniqueId;

/// Where the child finds the clique's id, as hex.
const CLIQUE: &str = "SCOPE_DEAD_PEER_CLIQUE";

/// How long the clique may take to lock once its holder is dead: taking a
/// dead process's lock over is immediate; anything else never ends.
const PATIENCE: Duration = Duration::from_secs(60);

#[test]
fn a_peer_killed_holding_the_shared_clique_hangs_none_of_its_peers() {
    if let Ok(hex) = std::env::var(CLIQUE) {
        let raw: Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
            .collect();
        mock().die_holding_shared_clique(&UniqueId::from_bytes(&raw).expect("128 bytes"));
    }
    let dir = std::env::temp_dir().join(format!("scope-dead-peer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a folder for the clique");
    let id = mock().shared_nccl_id(&dir);
    let hex: String = id.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let child = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            "a_peer_killed_holding_the_shared_clique_hangs_none_of_its_peers",
            "--nocapture",
        ])
        .env(CLIQUE, hex)
        .stdin(Stdio::null())
        .output()
        .expect("the child runs");
    assert!(
        !child.status.success(),
        "the child was to die holding the clique: {}",
        String::from_utf8_lossy(&child.stdout)
    );
    let (sent, locked) = mpsc::channel();
    std::thread::spawn(move || sent.send(mock().shared_clique_locks(&id)));
    let answer = locked.recv_timeout(PATIENCE);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        answer,
        Ok(true),
        "the clique a dead peer held did not lock within {PATIENCE:?}"
    );
}
