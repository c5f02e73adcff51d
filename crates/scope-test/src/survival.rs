//! Ranks in separate processes survive one of them being killed (rules 49, 54–57). A launcher, the
//! test's parent process, runs four ranks and kills one in the middle of training. It hands the
//! others a fresh identity and the next epoch. Then it starts a fresh process in its place and
//! hands all four the epoch after. The newcomer is healed by a broadcast. Every rank's weights end
//! bit-identical, and equal to the steps computed here with the same membership schedule.
//!
//! Ranks across processes share no memory to meet in. So the launcher decides membership and hands
//! it out through files of one folder. A real launcher uses its own channel: torchrun's store, a
//! job scheduler. What the test shows is scope's part. A killed peer stalls its survivors'
//! collective within the deadline, not forever (rule 49). They join the next epoch and train on
//! over themselves (rules 54, 55). The restarted process's bytes are not trusted until a broadcast
//! heals them (rule 57).
//!
//! The schedule of every rank's weights `w` (one `u32` repeated). Each step adds every member
//! device `d`'s `w + step + 1 + d`:
//!
//! | step | epoch | members | |
//! |---|---|---|---|
//! | 0, 1 | 0 | 0 1 2 3 | |
//! | 2 | 0 | 0 1 2 (3 killed) | stalls: nothing written |
//! | 2 | 1 | 0 1 2 | |
//! | — | 2 | 0 1 2 3′ | 3′ unhealed: fails on every rank; then healed |
//! | 3 | 2 | 0 1 2 3′ | |

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::*;
use scope_core::collective::device::DeviceCollectives;
use scope_core::collective::{CollectiveError, Element, Rank, Reduce};
use scope_native::nccl::UniqueId;

const ROLE: &str = "SCOPE_SURVIVAL_ROLE";
const DEVICE: &str = "SCOPE_SURVIVAL_DEVICE";
const FOLDER: &str = "SCOPE_SURVIVAL_DIR";

/// Words of the weights.
const WORDS: u32 = 16;

/// How long a rank waits for its peers: generous for four processes under load. The killed rank's
/// survivors wait it out once.
const DEADLINE: Duration = Duration::from_secs(5);

/// How long anything waits for a mark another process leaves.
const PATIENCE: Duration = Duration::from_secs(120);

/// The weights after a step over `members` from `w`.
fn stepped(w: u32, step: u32, members: &[u32]) -> u32 {
    members.iter().fold(0u32, |sum, d| {
        sum.wrapping_add(w.wrapping_add(step + 1 + d))
    })
}

/// The weights the schedule ends with.
fn expected() -> u32 {
    let mut w = 1;
    for step in [0, 1] {
        w = stepped(w, step, &[0, 1, 2, 3]);
    }
    w = stepped(w, 2, &[0, 1, 2]);
    stepped(w, 3, &[0, 1, 2, 3])
}

/// Wait for `path` to exist while every one of `children` runs. One that exits first is named with
/// its output, not waited for past its end.
fn wait_with(path: &Path, children: &mut [(String, Child)]) {
    let started = Instant::now();
    while !path.exists() {
        for (who, child) in children.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                let mut said = String::new();
                use std::io::Read as _;
                if let Some(out) = child.stdout.as_mut() {
                    let _ = out.read_to_string(&mut said);
                }
                if let Some(err) = child.stderr.as_mut() {
                    let _ = err.read_to_string(&mut said);
                }
                panic!(
                    "{who} exited ({status}) before {} appeared:\n{said}",
                    path.display()
                );
            }
        }
        assert!(
            started.elapsed() < PATIENCE,
            "waited {PATIENCE:?} for {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Wait for `path` to exist.
fn wait_for(path: &Path) {
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < PATIENCE,
            "waited {PATIENCE:?} for {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn mark(dir: &Path, name: &str) {
    std::fs::write(dir.join(name), b"").expect("a mark");
}

/// Hand out epoch `epoch`: its identity and members (devices, in rank order). Written whole before
/// the name appears.
fn hand_out(dir: &Path, epoch: u64, id: &UniqueId, members: &[u32]) {
    let hex: String = id.to_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let list: Vec<String> = members.iter().map(u32::to_string).collect();
    let name = dir.join(format!("epoch-{epoch}"));
    let partial = dir.join(format!("epoch-{epoch}.partial"));
    std::fs::write(&partial, format!("{hex}\n{}", list.join(","))).expect("an epoch's file");
    std::fs::rename(&partial, &name).expect("an epoch's file");
}

/// Epoch `epoch` as the launcher handed it out, once it has.
fn handed_out(dir: &Path, epoch: u64) -> (UniqueId, Vec<u32>) {
    let name = dir.join(format!("epoch-{epoch}"));
    wait_for(&name);
    let text = std::fs::read_to_string(name).expect("an epoch's file");
    let (hex, list) = text.split_once('\n').expect("two lines");
    let raw: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
        .collect();
    let members = list
        .split(',')
        .map(|d| d.parse().expect("a device"))
        .collect();
    (UniqueId::from_bytes(&raw).expect("128 bytes"), members)
}

/// Join epoch `epoch` as device `device`.
fn join<B: DeviceCollectives<Identity = UniqueId>>(
    client: Client<B>,
    dir: &Path,
    epoch: u64,
    device: u32,
) -> Rank<B> {
    let (id, members) = handed_out(dir, epoch);
    let rank = members
        .iter()
        .position(|&d| d == device)
        .expect("a member of the epoch");
    Rank::join_epoch(client, &id, rank, members.len(), epoch, DEADLINE)
        .unwrap_or_else(|e| panic!("device {device} joins epoch {epoch}: {e}"))
}

/// One step: every member adds its `w + step + 1 + device`. The weights change only when the sum
/// was written. A member whose weights cannot be read still takes part: its contribution carries
/// why.
fn step<B: Backend>(rank: &Rank<B>, w: &Buffer, (step, device): (u32, u32)) -> Result<()> {
    let c = rank.client();
    let grad = alloc(c, WORDS);
    match read(c, w) {
        Ok(mine) => {
            let mine: Vec<u32> = mine
                .iter()
                .map(|v| v.wrapping_add(step + 1 + device))
                .collect();
            c.write(grad.all(), &as_bytes(&mine))?;
        }
        Err(unreadable) => c.fail_writing(&[grad.all()], unreadable)?,
    }
    let sum = alloc(c, WORDS);
    rank.all_reduce(grad.all(), sum.all(), Element::U32, Reduce::Sum)?;
    c.copy(sum.all(), w.all())
}

fn spawn(me: &Path, child: &str, dir: &Path, (role, device): (&str, u32)) -> Child {
    Command::new(me)
        .args(["--exact", child, "--ignored", "--nocapture"])
        .env(ROLE, role)
        .env(DEVICE, device.to_string())
        .env(FOLDER, dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("a child process")
}

/// The parent: the launcher of the schedule above. `child` names the test that runs
/// [`one_survivor_in_its_own_process`]. `identity(dir)` makes an identity its ranks can join from
/// other processes.
///
/// # Panics
///
/// When a surviving child fails, or the weights differ.
pub fn ranks_survive_a_killed_process<S: Suite>(child: &str, identity: impl Fn(&Path) -> UniqueId)
where
    S::Backend: DeviceCollectives<Identity = UniqueId>,
{
    if client_or_skip(|| S::rank_client(0)).is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!(
        "scope-survival-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a folder for the children");
    let clique = |epoch: u64| {
        let folder = dir.join(format!("clique-{epoch}"));
        std::fs::create_dir_all(&folder).expect("a clique's folder");
        identity(&folder)
    };
    let me = std::env::current_exe().expect("this test binary");
    hand_out(&dir, 0, &clique(0), &[0, 1, 2, 3]);
    let mut children: Vec<(String, Child)> = (0..4)
        .map(|d| {
            (
                format!("device {d}"),
                spawn(&me, child, &dir, ("original", d)),
            )
        })
        .collect();
    // Kill device 3 once it is idle before step 2.
    wait_with(&dir.join("at-2-3"), &mut children);
    let (_, mut killed) = children.remove(3);
    killed.kill().expect("the kill");
    let _ = killed.wait();
    for d in 0..3 {
        wait_with(&dir.join(format!("stalled-{d}")), &mut children);
    }
    hand_out(&dir, 1, &clique(1), &[0, 1, 2]);
    for d in 0..3 {
        wait_with(&dir.join(format!("done-1-{d}")), &mut children);
    }
    children.push((
        "device 3, restarted".to_owned(),
        spawn(&me, child, &dir, ("newcomer", 3)),
    ));
    hand_out(&dir, 2, &clique(2), &[0, 1, 2, 3]);
    let mut failed = Vec::new();
    let mut weights = Vec::new();
    for (who, child) in children {
        let out = child.wait_with_output().expect("the child's output");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() || !said.contains("1 passed") {
            failed.push(format!("{who} ({}):\n{said}", out.status));
        }
        let line = said.lines().find_map(|l| l.strip_prefix("weights: "));
        weights.push((who, line.map(str::to_owned)));
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    let expected = format!("{:?}", vec![expected(); WORDS as usize]);
    for (who, w) in weights {
        assert_eq!(w.as_deref(), Some(expected.as_str()), "{who}'s weights");
    }
}

/// One child of [`ranks_survive_a_killed_process`], run only by it. An original rank (device 3 is
/// killed before step 2), or the restarted device 3.
pub fn one_survivor_in_its_own_process<S: Suite>()
where
    S::Backend: DeviceCollectives<Identity = UniqueId>,
{
    let (Ok(role), Ok(device)) = (std::env::var(ROLE), std::env::var(DEVICE)) else {
        println!("not run: a child process of ranks_survive_a_killed_process, which sets {ROLE}");
        return;
    };
    let device: u32 = device.parse().expect("a device");
    let dir = PathBuf::from(std::env::var(FOLDER).expect("the folder"));
    let client = S::rank_client(device as usize).expect("the suite's rank client");
    let (rank, w) = if role == "newcomer" {
        let rank = join(client, &dir, 2, device);
        let c = rank.client();
        // A restarted process holds no weights: its bytes say so.
        let w = alloc(c, WORDS);
        c.fail_writing(&[w.all()], injected("a restarted process holds no weights"))
            .unwrap();
        (rank, w)
    } else {
        let me = join(client, &dir, 0, device);
        let c = me.client().clone();
        let w = upload(&c, &[1; WORDS as usize]);
        for s in [0, 1] {
            step(&me, &w, (s, device)).expect("a step of four");
        }
        mark(&dir, &format!("at-2-{device}"));
        if device == 3 {
            // Killed here by the launcher.
            std::thread::sleep(PATIENCE * 2);
            panic!("device 3 was not killed");
        }
        let before = read(&c, &w).unwrap();
        let started = Instant::now();
        let stalled = step(&me, &w, (2, device)).expect_err("a killed peer stalls the step");
        assert!(started.elapsed() < DEADLINE + Duration::from_secs(30));
        assert!(
            matches!(
                super::collective::collective_error(&stalled),
                CollectiveError::Stalled { .. }
            ),
            "{stalled}"
        );
        assert!(me.broken().is_some());
        assert_eq!(read(&c, &w).unwrap(), before, "nothing was written");
        mark(&dir, &format!("stalled-{device}"));

        let survivors = join(c.clone(), &dir, 1, device);
        assert_eq!((survivors.epoch(), survivors.ranks()), (1, 3));
        step(&survivors, &w, (2, device)).expect("a step of the survivors");
        mark(&dir, &format!("done-1-{device}"));
        (join(c, &dir, 2, device), w)
    };
    // Epoch 2: the restarted rank's weights fail every rank's step, until rank 0's broadcast heals
    // them.
    let c = rank.client();
    let error = step(&rank, &w, (3, device)).expect_err("unhealed weights fail the step");
    assert!(
        matches!(
            super::collective::collective_error(&error),
            CollectiveError::InputFailed { rank: 3, .. }
        ),
        "{error}"
    );
    rank.heal(0, &[w.all()]).expect("healed from rank 0");
    step(&rank, &w, (3, device)).expect("a step of four again");
    println!("weights: {:?}", read(c, &w).unwrap());
    S::finished();
}
