//! Four workers under `scope-launch`'s launcher, one process a rank, over
//! the mock driver and the mock NCCL's shared mode: each joins its group
//! with one call (`Launched::join`), which carries NCCL's unique id through
//! the launcher's coordinator, and their all-reduce sums every rank's input.
//!
//! A second launch kills one worker mid-training: the survivors leave it
//! out of the next epoch and train on, the launcher starts it again, and
//! the survivors admit and heal it, every rank ending with the same bits.
//!
//! This binary is its own worker: the tests below launch it with
//! `--exact worker --ignored`, naming its role in `SCOPE_MOCK_LAUNCHED_ROLE`.

#[path = "mock/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};
use std::time::Duration;

use harness::mock;
use scope_core::collective::{Element, Rank, Reduce};
use scope_launch::{Launched, Launcher, Outcome, Plan};

/// The folder the mock's shared cliques live in, and the workers' marks.
const DIR: &str = "SCOPE_MOCK_LAUNCHED_DIR";
/// What the worker does: `sum` or `survive`.
const ROLE: &str = "SCOPE_MOCK_LAUNCHED_ROLE";

fn launch(role: &str, backoff: Duration) -> (Outcome, PathBuf) {
    let dir = std::env::temp_dir().join(format!("scope-ml-{role}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a folder for the cliques");
    // The mock must load here too: a worker finds it where this process does.
    mock();
    let mut plan = Plan::new(4, std::env::current_exe().expect("this test binary"));
    plan.args = ["--exact", "worker", "--ignored", "--nocapture"]
        .map(Into::into)
        .to_vec();
    plan.env = vec![(DIR.into(), dir.clone().into()), (ROLE.into(), role.into())];
    plan.policy.max_restarts = 1;
    plan.policy.backoff = backoff;
    let ended = Launcher::new(plan)
        .and_then(Launcher::run)
        .expect("the launch runs");
    (ended, dir)
}

#[test]
fn four_launched_workers_join_with_one_call_and_sum() {
    let (ended, dir) = launch("sum", Duration::from_millis(100));
    assert_eq!(ended, Outcome::Done { restarts: 0 });
    for rank in 0..4 {
        let summed = std::fs::read_to_string(dir.join(format!("summed-{rank}")))
            .unwrap_or_else(|_| panic!("rank {rank} left no mark"));
        assert_eq!(summed, "10", "rank {rank}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Launch rank 2 is killed (`SIGKILL`) before its round of step 3. The
/// survivors' round fails within the deadline; they decide epoch 1 without
/// it and train on over three ranks. The launcher starts it again; it waits
/// for the survivors' mark of epoch 1 before it registers (so the order is
/// the test's, not the machine's), the survivors agree to admit it after
/// their next step, and epoch 2 holds all four, the newcomer last.
/// A broadcast from rank 0 heals its weights, and every rank ends with the
/// same weights, each step's sum checked against that step's members.
#[test]
fn a_killed_worker_is_left_out_then_admitted_and_healed() {
    let (ended, dir) = launch("survive", Duration::from_millis(100));
    assert_eq!(ended, Outcome::Done { restarts: 1 });
    let finals: Vec<String> = (0..4)
        .map(|rank| {
            std::fs::read_to_string(dir.join(format!("final-{rank}")))
                .unwrap_or_else(|_| panic!("launch rank {rank} left no mark"))
        })
        .collect();
    for (rank, text) in finals.iter().enumerate() {
        let (weights, epochs) = text.split_once('\n').unwrap();
        assert_eq!(
            weights,
            finals[0].split_once('\n').unwrap().0,
            "launch rank {rank}: {finals:?}"
        );
        if rank != 2 {
            assert_eq!(epochs, "0:0,1,2,3 1:0,1,3 2:0,1,3,2", "launch rank {rank}");
        } else {
            assert_eq!(epochs, "2:0,1,3,2", "the newcomer");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Steps every survivor trains at least; it goes on until the newcomer is
/// admitted, so the test does not rest on how fast a process starts.
const STEPS: u64 = 12;
/// The step before whose round launch rank 2 dies, on its first start.
const KILLED_AT: u64 = 3;

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
        .collect()
}

fn bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// One worker of the tests above; does nothing when run by hand.
#[test]
#[ignore = "a worker process of this file's launches"]
fn worker() {
    let Ok(dir) = std::env::var(DIR).map(PathBuf::from) else {
        println!("not run: a worker of this file's launches, which set {DIR}");
        return;
    };
    let settings = scope_launch::Settings::from_env().expect("a launched worker");
    if settings.restart > 0 {
        let began = std::time::Instant::now();
        while !dir.join("left-out").exists() {
            assert!(
                began.elapsed() < Duration::from_secs(120),
                "the survivors never shrank"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let me = Launched::with(settings).expect("a launched worker");
    let client = {
        mock();
        server_cuda::client_on(me.rank()).expect("the mock's device")
    };
    let deadline = Duration::from_secs(3);
    let make = || Ok(mock().shared_nccl_id(&dir));
    let group = me
        .join(client.clone(), deadline, make)
        .expect("one call joins the group");
    if std::env::var(ROLE).as_deref() == Ok("survive") {
        return survive(&me, group, &dir);
    }
    let c = group.client();
    let mine = (me.rank() + 1) as u32;
    let input = c.upload(&bytes(&[mine; 256])).expect("an upload");
    let sum = c.try_allocate(1024).expect("an output");
    group
        .all_reduce(input.all(), sum.all(), Element::U32, Reduce::Sum)
        .expect("a clean round");
    let read = c.read(&sum).expect("the sum reads clean");
    assert!(
        words(&read).iter().all(|&w| w == 10),
        "{:?}",
        &words(&read)[..4]
    );
    std::fs::write(dir.join(format!("summed-{}", me.rank())), "10").expect("a mark");
}

/// The `survive` role: train, lose launch rank 2, train on, admit it back.
fn survive(me: &Launched, mut group: Rank<server_cuda::Cuda>, dir: &Path) {
    let client = group.client().clone();
    let deadline = Duration::from_secs(3);
    let make = || Ok(mock().shared_nccl_id(dir));
    let mut epochs = Vec::new();
    let mut seen = |me: &Launched| {
        let epoch = me.membership();
        let members: Vec<String> = epoch.members.iter().map(usize::to_string).collect();
        epochs.push(format!("{}:{}", epoch.number, members.join(",")));
    };
    seen(me);
    // The weights: zeros as launched; a worker started again holds wrong
    // ones until it is healed.
    let start = if me.restarts() == 0 { 0 } else { 0xdead };
    let mut host = vec![start; 256];
    let mut weights = client.upload(&bytes(&host)).expect("weights");
    let heal =
        |group: &Rank<server_cuda::Cuda>, weights: &scope_core::Buffer, host: &mut Vec<u32>| {
            if !me.newcomers().expect("the coordinator").is_empty() {
                group.heal(0, &[weights.all()]).expect("a heal from rank 0");
                *host = words(&client.read(weights).expect("healed weights read clean"));
            }
        };
    heal(&group, &weights, &mut host);
    // Rank 0 of each epoch says which step it resumes at; a newcomer learns it.
    let share_step = |step: u64| -> u64 {
        let shared = me
            .share("step", deadline, || Ok(step.to_string().into_bytes()))
            .expect("the epoch's step");
        String::from_utf8(shared).unwrap().parse().unwrap()
    };
    let mut step = share_step(0);
    loop {
        if me.rank() == 2 && me.restarts() == 0 && step == KILLED_AT {
            // SAFETY: `raise` with a valid signal; the process ends here.
            unsafe { libc::raise(libc::SIGKILL) };
        }
        let members = me.membership().members;
        if step >= STEPS && members.len() == 4 {
            break;
        }
        let input = client
            .upload(&bytes(&[(me.rank() + 1) as u32; 256]))
            .expect("an upload");
        let sum = client.try_allocate(1024).expect("an output");
        let round = group
            .all_reduce(input.all(), sum.all(), Element::U32, Reduce::Sum)
            .and_then(|()| client.read(&sum));
        match round {
            Ok(read) => {
                let expected: u32 = members.iter().map(|&m| (m + 1) as u32).sum();
                assert!(
                    words(&read).iter().all(|&w| w == expected),
                    "step {step} over {members:?}: {:?}",
                    &words(&read)[..4]
                );
                for (w, s) in host.iter_mut().zip(words(&read)) {
                    *w = w.wrapping_add(s);
                }
                weights = client.upload(&bytes(&host)).expect("weights");
                step += 1;
                if me.change_due(step - 1).expect("the coordinator") {
                    drop(group);
                    group = me
                        .rejoin(client.clone(), deadline, make)
                        .expect("an admission");
                    seen(me);
                    heal(&group, &weights, &mut host);
                    step = share_step(step);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(failed) => {
                // A lost peer: the next epoch without it, and this step again.
                eprintln!("launch rank {} at step {step}: {failed}", me.rank());
                drop(group);
                group = me.rejoin(client.clone(), deadline, make).expect("a shrink");
                seen(me);
                std::fs::write(dir.join("left-out"), "").expect("a mark");
                heal(&group, &weights, &mut host);
                step = share_step(step);
            }
        }
    }
    let text = format!("{:?}\n{}", &host[..4], epochs.join(" "));
    std::fs::write(dir.join(format!("final-{}", me.rank())), text).expect("a mark");
}
