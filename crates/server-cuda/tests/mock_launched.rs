//! Four workers under `scope-launch`'s launcher, one process a rank, over
//! the mock driver and the mock NCCL's shared mode: each joins its group
//! with one call (`Launched::join`), which carries NCCL's unique id through
//! the launcher's coordinator, and their all-reduce sums every rank's input.
//!
//! This binary is its own worker: the test below launches it with
//! `--exact worker --ignored`.

#[path = "mock/harness.rs"]
mod harness;

use std::path::PathBuf;
use std::time::Duration;

use harness::mock;
use scope_core::collective::{Element, Reduce};
use scope_launch::{Launched, Launcher, Outcome, Plan};

/// The folder the mock's shared clique lives in, and the workers' marks.
const DIR: &str = "SCOPE_MOCK_LAUNCHED_DIR";

#[test]
fn four_launched_workers_join_with_one_call_and_sum() {
    let dir = std::env::temp_dir().join(format!("scope-mock-launched-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a folder for the clique");
    // The mock must load here too: a worker finds it where this process does.
    mock();
    let mut plan = Plan::new(4, std::env::current_exe().expect("this test binary"));
    plan.args = ["--exact", "worker", "--ignored", "--nocapture"]
        .map(Into::into)
        .to_vec();
    plan.env = vec![(DIR.into(), dir.clone().into())];
    plan.policy.max_restarts = 0;
    let ended = Launcher::new(plan)
        .and_then(Launcher::run)
        .expect("the launch runs");
    assert_eq!(ended, Outcome::Done { restarts: 0 });
    for rank in 0..4 {
        let summed = std::fs::read_to_string(dir.join(format!("summed-{rank}")))
            .unwrap_or_else(|_| panic!("rank {rank} left no mark"));
        assert_eq!(summed, "10", "rank {rank}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// One worker of the test above; does nothing when run by hand.
#[test]
#[ignore = "a worker process of four_launched_workers_join_with_one_call_and_sum"]
fn worker() {
    let Ok(dir) = std::env::var(DIR).map(PathBuf::from) else {
        println!("not run: a worker of four_launched_workers_join_with_one_call_and_sum");
        return;
    };
    let me = Launched::from_env().expect("a launched worker");
    let client = {
        mock();
        server_cuda::client_on(me.rank()).expect("the mock's device")
    };
    let deadline = Duration::from_secs(10);
    let rank = me
        .join(client, deadline, || Ok(mock().shared_nccl_id(&dir)))
        .expect("one call joins the group");
    let c = rank.client();
    let mine = (me.rank() + 1) as u32;
    let input = c
        .upload(&[mine.to_le_bytes(); 256].concat())
        .expect("an upload");
    let sum = c.try_allocate(1024).expect("an output");
    rank.all_reduce(input.all(), sum.all(), Element::U32, Reduce::Sum)
        .expect("a clean round");
    let read = c.read(&sum).expect("the sum reads clean");
    let words: Vec<u32> = read
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
        .collect();
    assert!(words.iter().all(|&w| w == 10), "{:?}", &words[..4]);
    std::fs::write(dir.join(format!("summed-{}", me.rank())), "10").expect("a mark");
}
