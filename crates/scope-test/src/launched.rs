//! Workers under `scope-launch`'s launcher, one process a rank, over a
//! device transport whose ranks meet across processes (the mock NCCL's or
//! RCCL's shared mode): what `server-cuda::mock_launched` and
//! `server-hip::mock_launched` run alike.
//!
//! The test binary is its own worker: [`launch`] starts it with `--exact
//! worker --ignored`, and its `worker` test calls [`worker`], which plays
//! the role named in [`ROLE`] and leaves marks in the launch's folder.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use scope_core::collective::device::DeviceCollectives;
use scope_core::collective::{CollectiveError, Element, Rank, Reduce};
use scope_core::{Buffer, Client};
use scope_launch::{Launched, Launcher, Outcome, Plan, Settings};
use scope_native::nccl::UniqueId;

use crate::Suite;

/// The folder the mock's shared cliques live in, and the workers' marks.
pub const DIR: &str = "SCOPE_LAUNCHED_DIR";
/// What the worker does: `sum` or `survive`.
pub const ROLE: &str = "SCOPE_LAUNCHED_ROLE";

/// Steps every survivor trains at least; it goes on until the newcomer is
/// admitted, so the test does not rest on how fast a process starts.
const STEPS: u64 = 12;
/// The step before whose round the killed workers die, on their first start.
const KILLED_AT: u64 = 3;

/// The launch ranks a `survive` launch kills: launch rank 2 alone, unless
/// the role names others (`survive:1,2`).
fn killed(role: &str) -> Vec<usize> {
    role.strip_prefix("survive:").map_or(vec![2], |ranks| {
        ranks
            .split(',')
            .map(|r| r.parse().expect("a launch rank"))
            .collect()
    })
}
/// Each round's deadline. A lost peer fails a round within the liveness
/// window (1 s) by its lease, long before: a round that waits this long
/// fails as `Stalled`, which the survivors refuse.
const DEADLINE: Duration = Duration::from_secs(20);

/// Launches four workers of this test binary in `role`; how the launch
/// ended, and its folder. `prepare` runs first (loading the mock here, so a
/// worker finds it where this process does).
pub fn launch(role: &str, prepare: impl FnOnce()) -> (Outcome, PathBuf) {
    let dir = std::env::temp_dir().join(format!("scope-launched-{role}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a folder for the cliques");
    prepare();
    let mut plan = Plan::new(4, std::env::current_exe().expect("this test binary"));
    plan.args = ["--exact", "worker", "--ignored", "--nocapture"]
        .map(Into::into)
        .to_vec();
    plan.env = vec![(DIR.into(), dir.clone().into()), (ROLE.into(), role.into())];
    plan.policy.max_restarts = 2;
    plan.policy.backoff = Duration::from_millis(100);
    let ended = Launcher::new(plan)
        .and_then(Launcher::run)
        .expect("the launch runs");
    (ended, dir)
}

/// Four workers each join with one call (`Launched::join`, NCCL's unique id
/// carried by the coordinator) and their all-reduce sums every rank's input.
pub fn four_launched_workers_join_with_one_call_and_sum(prepare: impl FnOnce()) {
    let (ended, dir) = launch("sum", prepare);
    assert_eq!(ended, Outcome::Done { restarts: 0 });
    for rank in 0..4 {
        let summed = std::fs::read_to_string(dir.join(format!("summed-{rank}")))
            .unwrap_or_else(|_| panic!("rank {rank} left no mark"));
        assert_eq!(summed, "10", "rank {rank}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Launch rank 2 is killed (`SIGKILL`) before its round of step 3. The
/// survivors' round fails as `Missing` naming rank 2, by its lease, not
/// `Stalled` at the deadline; they decide epoch 1 without
/// it and train on over three ranks. The launcher starts it again; it waits
/// for the survivors' mark of epoch 1 before it registers (so the order is
/// the test's, not the machine's). The survivors agree to admit it after
/// their next step, and epoch 2 holds all four, the newcomer last. A
/// broadcast from rank 0 heals its weights, and every rank ends with the
/// same weights, each step's sum checked against that step's members.
pub fn a_killed_worker_is_left_out_then_admitted_and_healed(prepare: impl FnOnce()) {
    let (ended, dir) = launch("survive", prepare);
    assert_eq!(ended, Outcome::Done { restarts: 1 });
    for (rank, (_, epochs)) in finals(&dir).iter().enumerate() {
        if rank == 2 {
            assert_eq!(epochs, "2:0,1,3,2", "the newcomer");
        } else {
            assert_eq!(epochs, "0:0,1,2,3 1:0,1,3 2:0,1,3,2", "launch rank {rank}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Launch ranks 1 and 2 are killed before the same round. The survivors
/// name both, decide epoch 1 of ranks 0 and 3, and train on; both are
/// started again and admitted (together, or one epoch each, as they
/// register), healed, and every rank ends with the same weights.
pub fn two_workers_killed_at_once_are_left_out_then_admitted_and_healed(prepare: impl FnOnce()) {
    let (ended, dir) = launch("survive:1,2", prepare);
    assert_eq!(ended, Outcome::Done { restarts: 2 });
    for (rank, (_, epochs)) in finals(&dir).iter().enumerate() {
        let epochs: Vec<&str> = epochs.split(' ').collect();
        let last = epochs.last().unwrap();
        assert!(
            last.ends_with(":0,3,1,2") || last.ends_with(":0,3,2,1"),
            "launch rank {rank}: {epochs:?}"
        );
        if rank == 0 || rank == 3 {
            assert_eq!(epochs[..2], ["0:0,1,2,3", "1:0,3"], "launch rank {rank}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every launch rank's final weights and epochs; the weights all equal.
fn finals(dir: &Path) -> Vec<(String, String)> {
    let finals: Vec<(String, String)> = (0..4)
        .map(|rank| {
            let text = std::fs::read_to_string(dir.join(format!("final-{rank}")))
                .unwrap_or_else(|_| panic!("launch rank {rank} left no mark"));
            let (weights, epochs) = text.split_once('\n').unwrap();
            (weights.to_owned(), epochs.to_owned())
        })
        .collect();
    for (rank, (weights, _)) in finals.iter().enumerate() {
        assert_eq!(weights, &finals[0].0, "launch rank {rank}: {finals:?}");
    }
    finals
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
        .collect()
}

fn bytes(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// One worker of [`launch`], on the suite's client of its launch rank, its
/// identity made by `identity` in the launch's folder. Does nothing, saying
/// so, when run by hand.
pub fn worker<S: Suite>(identity: impl Fn(&Path) -> UniqueId)
where
    S::Backend: DeviceCollectives<Identity = UniqueId>,
{
    let Ok(dir) = std::env::var(DIR).map(PathBuf::from) else {
        println!("not run: a worker of a launch, which sets {DIR}");
        return;
    };
    let settings = Settings::from_env().expect("a launched worker");
    if settings.restart > 0 {
        let began = Instant::now();
        while !dir.join("left-out").exists() {
            assert!(
                began.elapsed() < Duration::from_secs(120),
                "the survivors never shrank"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let me = Launched::with(settings).expect("a launched worker");
    let client = S::rank_client(me.rank()).expect("the suite's rank client");
    let make = || Ok(identity(&dir));
    let group = me
        .join(client, DEADLINE, make)
        .expect("one call joins the group");
    let role = std::env::var(ROLE).unwrap_or_default();
    if role.starts_with("survive") {
        return survive(&me, group, &dir, &make, &killed(&role));
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

/// Heals the newcomers of `group`'s epoch, if it has any, from rank 0.
fn heal<B: DeviceCollectives>(
    me: &Launched,
    group: &Rank<B>,
    weights: &Buffer,
    host: &mut Vec<u32>,
) {
    if !me.newcomers().expect("the coordinator").is_empty() {
        group.heal(0, &[weights.all()]).expect("a heal from rank 0");
        *host = words(
            &group
                .client()
                .read(weights)
                .expect("healed weights read clean"),
        );
    }
}

/// Rank 0 of the epoch says which step it resumes at; a newcomer learns it.
fn resume_at(me: &Launched, step: u64) -> u64 {
    let shared = me
        .share("step", DEADLINE, || Ok(step.to_string().into_bytes()))
        .expect("the epoch's step");
    String::from_utf8(shared).unwrap().parse().unwrap()
}

/// The `survive` role: train, lose the `killed` launch ranks, train on,
/// admit them back.
fn survive<B>(
    me: &Launched,
    mut group: Rank<B>,
    dir: &Path,
    make: &dyn Fn() -> scope_core::Result<UniqueId>,
    killed: &[usize],
) where
    B: DeviceCollectives<Identity = UniqueId>,
{
    let client: Client<B> = group.client().clone();
    let mut epochs = Vec::new();
    let seen = |me: &Launched, epochs: &mut Vec<String>| {
        let epoch = me.membership();
        let members: Vec<String> = epoch.members.iter().map(usize::to_string).collect();
        epochs.push(format!("{}:{}", epoch.number, members.join(",")));
    };
    seen(me, &mut epochs);
    // Zeros as launched; a worker started again holds wrong weights until
    // it is healed.
    let start = if me.restarts() == 0 { 0 } else { 0xdead };
    let mut host = vec![start; 256];
    let mut weights = client.upload(&bytes(&host)).expect("weights");
    heal(me, &group, &weights, &mut host);
    let mut step = resume_at(me, 0);
    loop {
        if killed.contains(&me.rank()) && me.restarts() == 0 && step == KILLED_AT {
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
        let change = match round {
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
                std::thread::sleep(Duration::from_millis(100));
                me.change_due(step - 1).expect("the coordinator")
            }
            Err(failed) => {
                // A lost peer, which the round names by its lease: the next
                // epoch without it, and this step again.
                let named = match failed.root() {
                    scope_core::Error::Collective(error) => match &**error {
                        CollectiveError::Missing { missing, .. } => missing.clone(),
                        _ => panic!("launch rank {}: {failed}", me.rank()),
                    },
                    _ => panic!("launch rank {}: {failed}", me.rank()),
                };
                assert!(
                    !named.is_empty() && named.iter().all(|r| killed.contains(&members[*r])),
                    "the round names the killed {killed:?} of {members:?}: {failed}"
                );
                // Two workers killed at once die a few milliseconds apart,
                // and the round fails at the first: the next epoch waits
                // for both, so the order is the test's.
                let began = Instant::now();
                let missing = loop {
                    let missing = me.missing().expect("the coordinator");
                    if missing == killed || began.elapsed() > DEADLINE {
                        break missing;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                };
                eprintln!(
                    "launch rank {} at step {step}: {failed}; missing {missing:?}",
                    me.rank()
                );
                assert_eq!(
                    missing, killed,
                    "the coordinator names the killed: {failed}"
                );
                true
            }
        };
        if change {
            drop(group);
            group = me
                .rejoin(client.clone(), DEADLINE, make)
                .expect("the next epoch");
            seen(me, &mut epochs);
            if me.membership().members.len() == 4 - killed.len() {
                std::fs::write(dir.join("left-out"), "").expect("a mark");
            }
            heal(me, &group, &weights, &mut host);
            step = resume_at(me, step);
        }
    }
    let text = format!("{:?}\n{}", &host[..4], epochs.join(" "));
    std::fs::write(dir.join(format!("final-{}", me.rank())), text).expect("a mark");
}
