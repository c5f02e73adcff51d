//! The launcher, its coordinator and its workers, as processes.
//!
//! This binary is its own worker: the launcher runs it with `--exact worker
//! --ignored`, and the test `worker` plays the role the parent test names in
//! `SCOPE_LAUNCH_TEST_ROLE`, leaving marks in the parent's folder. What the
//! workers did is read from those marks and from the launcher's timeline,
//! never from timing alone.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use scope_launch::embedded::Embedded;
use scope_launch::settings::{Settings, keys};
use scope_launch::{Coordinator, JobError, Launched, Store};

const ROLE: &str = "SCOPE_LAUNCH_TEST_ROLE";
const DIR: &str = "SCOPE_LAUNCH_TEST_DIR";

/// How long a worker waits for a mark its test promises; only a broken
/// launcher makes it wait this long.
const PATIENCE: Duration = Duration::from_secs(60);

fn folder(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!(
        "scope-launch-{name}-{}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("a folder for the marks");
    dir
}

/// Leaves a mark whole or not at all: written aside, then renamed, so a
/// test that sees it never reads it half written.
fn mark(dir: &Path, name: &str, text: &str) {
    let aside = dir.join(format!(".{name}.{}", std::process::id()));
    std::fs::write(&aside, text).expect("a mark");
    std::fs::rename(&aside, dir.join(name)).expect("a mark");
}

fn marks(dir: &Path, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("the marks")
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names
}

fn wait_for_marks(dir: &Path, prefix: &str, count: usize) {
    let began = Instant::now();
    while marks(dir, prefix).len() < count {
        assert!(
            began.elapsed() < PATIENCE,
            "{count} marks `{prefix}*` never came"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn launcher(ranks: usize, role: &str, dir: &Path, options: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_scope-launch"));
    command
        .arg("-n")
        .arg(ranks.to_string())
        .args(options)
        .arg("--")
        .arg(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            "worker",
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(ROLE, role)
        .env(DIR, dir)
        .stdin(Stdio::null());
    command
}

fn launch(ranks: usize, role: &str, dir: &Path, options: &[&str]) -> (Output, String) {
    let out = launcher(ranks, role, dir, options)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("the launcher runs");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, said)
}

fn process_is_gone(pid: u32) -> bool {
    // A zombie is gone too: it runs nothing.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|s| s.trim_start().starts_with('Z'))
    })
}

/// The worker every test above launches; does nothing when run by hand.
#[test]
#[ignore = "a worker process of the tests in this file"]
fn worker() {
    let Ok(role) = std::env::var(ROLE) else {
        println!("not run: a worker of this file's launches, which set {ROLE}");
        return;
    };
    let dir = PathBuf::from(std::env::var(DIR).expect("the marks' folder"));
    let me = Launched::from_env().expect("a launched worker joins");
    let (rank, pid) = (me.rank(), std::process::id());
    mark(&dir, &format!("started-{rank}-{pid}"), "");
    match role.as_str() {
        "share" => {
            let shared = me
                .share("token", PATIENCE, || Ok(pid.to_string().into_bytes()))
                .expect("rank 0 shares");
            assert!(me.alive().unwrap().contains(&rank));
            let text = String::from_utf8(shared).unwrap();
            mark(
                &dir,
                &format!("shared-{rank}"),
                &format!("{} {} {text}", me.ranks(), me.epoch()),
            );
        }
        "fail-once" => {
            if rank == 1 && me.restarts() == 0 {
                std::process::exit(7);
            }
            // Every rank lives until rank 1 started twice, so a restart of
            // the whole job would show as a second start of another rank.
            wait_for_marks(&dir, "started-1-", 2);
        }
        "fail-always" => {
            if rank == 2 {
                std::process::exit(3);
            }
            std::thread::sleep(PATIENCE);
        }
        "stop-once" => {
            if rank == 1 && me.restarts() == 0 {
                // SAFETY: `raise` with a valid signal; the process stops
                // here and the launcher kills it.
                unsafe { libc::raise(libc::SIGSTOP) };
            }
            wait_for_marks(&dir, "started-1-", 2);
        }
        "until-lost" => {
            let began = Instant::now();
            let lost = loop {
                if let Err(lost) = me.healthy() {
                    break lost;
                }
                assert!(
                    began.elapsed() < PATIENCE,
                    "never learned the launcher was gone"
                );
                std::thread::sleep(Duration::from_millis(5));
            };
            mark(&dir, &format!("lost-{rank}"), &lost.to_string());
            std::process::exit(4);
        }
        other => panic!("no role `{other}`"),
    }
}

/// Where a test's launch keeps its coordinator: the launcher's own, or an
/// etcd this test started, stopped when dropped.
enum On {
    Embedded,
    Etcd(EtcdServer),
}

impl On {
    fn options(&self) -> Vec<String> {
        match self {
            Self::Embedded => Vec::new(),
            Self::Etcd(etcd) => vec!["--coordinator".into(), etcd.address.clone()],
        }
    }
}

/// A single etcd member on free loopback ports, in a folder of its own,
/// killed with its test (and with this process, should the test die).
struct EtcdServer {
    child: std::process::Child,
    dir: PathBuf,
    address: String,
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// An etcd started for one test, or `None` after printing why, where no
/// `etcd` binary is installed (`SCOPE_ETCD` names another). Under CI
/// (`CI=true`, where `ci/run.sh` installs it) or with `SCOPE_REQUIRE=etcd`,
/// a missing etcd fails the test instead.
fn etcd() -> Option<EtcdServer> {
    use std::os::unix::process::CommandExt;
    let binary = std::env::var("SCOPE_ETCD").unwrap_or_else(|_| "etcd".into());
    let mut last = String::new();
    // A port found free may be taken before etcd binds it: try a few.
    for _ in 0..5 {
        let (client, peer) = (free_port(), free_port());
        let dir = folder("etcd");
        let mut command = Command::new(&binary);
        command
            .arg("--data-dir")
            .arg(&dir)
            .args(["--name", "scope-test"])
            .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .arg(format!(
                "--initial-cluster=scope-test=http://127.0.0.1:{peer}"
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: `prctl` is async-signal-safe and touches no memory of
        // this process: etcd is killed when the test process ends.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            })
        };
        let child = match command.spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let required = std::env::var("SCOPE_REQUIRE")
                    .is_ok_and(|r| r.split(',').any(|r| r == "etcd"))
                    || std::env::var("CI").is_ok_and(|v| v == "true");
                assert!(
                    !required,
                    "CI or SCOPE_REQUIRE=etcd, and `{binary}` is not installed"
                );
                println!(
                    "skipped: no etcd (`{binary}` is not installed; ci/install-etcd.sh installs it)"
                );
                let _ = std::fs::remove_dir_all(&dir);
                return None;
            }
            Err(e) => panic!("starting {binary}: {e}"),
        };
        let mut server = EtcdServer {
            child,
            dir,
            address: format!("etcd://127.0.0.1:{client}"),
        };
        let began = Instant::now();
        while began.elapsed() < PATIENCE {
            if let Ok(Some(status)) = server.child.try_wait() {
                last = format!("etcd ended: {status}");
                break;
            }
            match scope_launch::connect::connect(&server.address, Duration::from_secs(2)) {
                Ok(_) => return Some(server),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(server);
    }
    panic!("etcd never answered: {last}");
}

/// Each behaviour below, once on the launcher's own coordinator and once
/// on a real etcd.
macro_rules! on_both {
    ($($(#[$doc:meta])* fn $name:ident($on:ident) $body:block)*) => {$(
        $(#[$doc])*
        mod $name {
            use super::*;
            fn run($on: On) $body
            #[test]
            fn embedded() {
                run(On::Embedded);
            }
            #[test]
            fn etcd() {
                if let Some(server) = super::etcd() {
                    run(On::Etcd(server));
                }
            }
        }
    )*};
}

fn with<'a>(on: &'a On, more: &[&'a str]) -> Vec<String> {
    let mut options = on.options();
    options.extend(more.iter().map(|s| (*s).to_owned()));
    options
}

fn launch_on(ranks: usize, role: &str, dir: &Path, options: &[String]) -> (Output, String) {
    let options: Vec<&str> = options.iter().map(String::as_str).collect();
    launch(ranks, role, dir, &options)
}

on_both! {
    /// Four workers, each told its rank; rank 0 shares a value and every
    /// rank reads the same one.
    fn every_worker_learns_its_rank_and_the_one_value_rank_0_shares(on) {
        let dir = folder("share");
        let (out, said) = launch_on(4, "share", &dir, &on.options());
        assert!(out.status.success(), "{said}");
        let shared: Vec<String> = (0..4)
            .map(|r| std::fs::read_to_string(dir.join(format!("shared-{r}"))).expect("every rank's mark"))
            .collect();
        let rank_0 = marks(&dir, "started-0-");
        let pid_0 = rank_0[0].rsplit('-').next().unwrap();
        for line in &shared {
            assert_eq!(line, &format!("4 0 {pid_0}"), "{shared:?}");
        }
        assert!(said.contains("every rank finished, 0 restarts spent"), "{said}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Rank 1 fails once; it alone is started again.
    fn a_worker_that_fails_is_restarted_alone(on) {
        let dir = folder("fail-once");
        let (out, said) = launch_on(4, "fail-once", &dir, &with(&on, &["--backoff", "10"]));
        assert!(out.status.success(), "{said}");
        assert_eq!(marks(&dir, "started-1-").len(), 2, "{said}");
        for rank in [0, 2, 3] {
            assert_eq!(marks(&dir, &format!("started-{rank}-")).len(), 1, "rank {rank} kept its process: {said}");
        }
        assert!(said.contains("exited with status 7); restart 1 of 3"), "{said}");
        assert!(said.contains("every rank finished, 1 restarts spent"), "{said}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Rank 2 always fails: the budget is spent and every worker stopped.
    fn a_rank_that_keeps_failing_spends_the_budget_and_the_job_stops(on) {
        let dir = folder("fail-always");
        let options = with(&on, &["--max-restarts", "2", "--backoff", "10"]);
        let (out, said) = launch_on(3, "fail-always", &dir, &options);
        assert_eq!(out.status.code(), Some(1), "{said}");
        assert_eq!(marks(&dir, "started-2-").len(), 3, "{said}");
        assert!(said.contains("with 2 of 2 restarts spent: stopping the job"), "{said}");
        assert!(said.contains("--max-restarts is spent"), "{said}");
        for name in marks(&dir, "started-") {
            let pid: u32 = name.rsplit('-').next().unwrap().parse().unwrap();
            assert!(process_is_gone(pid), "{name} outlived its launcher: {said}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Rank 1 stops itself (`SIGSTOP`): its lease lapses, the launcher
    /// kills and restarts it. The default window: a healthy worker renews
    /// four times in it, so only a machine that keeps a thread from running
    /// for most of a second could pass one for stopped.
    fn a_stopped_worker_is_found_by_its_lapsed_lease_and_restarted(on) {
        let dir = folder("stop-once");
        let (out, said) = launch_on(3, "stop-once", &dir, &with(&on, &["--backoff", "10"]));
        assert!(out.status.success(), "{said}");
        assert!(said.contains("renewed no lease for 1s: killed"), "{said}");
        assert_eq!(marks(&dir, "started-1-").len(), 2, "{said}");
        assert_eq!(marks(&dir, "started-0-").len(), 1, "{said}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The launcher killed: every worker learns at its next heartbeat and
    /// stops with a typed error. On the embedded coordinator the
    /// coordinator went with it; on etcd the launcher's lease lapses.
    fn killing_the_launcher_stops_every_worker_with_a_typed_error(on) {
        let dir = folder("until-lost");
        let options = on.options();
        let options: Vec<&str> = options.iter().map(String::as_str).collect();
        let mut launched = launcher(4, "until-lost", &dir, &options)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the launcher starts");
        wait_for_marks(&dir, "started-", 4);
        launched.kill().expect("SIGKILL");
        let _ = launched.wait();
        // The bound here is only for a worker that never learns.
        wait_for_marks(&dir, "lost-", 4);
        for rank in 0..4 {
            let lost = std::fs::read_to_string(dir.join(format!("lost-{rank}"))).unwrap();
            match on {
                On::Embedded => assert!(
                    lost.starts_with("the coordinator at tcp://127.0.0.1:") && lost.contains("is lost"),
                    "rank {rank}: {lost}"
                ),
                On::Etcd(_) => assert!(
                    lost.starts_with("the launcher of job `job-") && lost.ends_with("is gone: its lease lapsed"),
                    "rank {rank}: {lost}"
                ),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Every etcd member gone: the workers and the launcher learn it and stop,
/// the workers with a typed error of their own.
#[test]
fn losing_etcd_stops_the_workers_and_the_launcher() {
    let Some(server) = etcd() else { return };
    let dir = folder("etcd-lost");
    let options = On::Etcd(server);
    let flags = options.options();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let launched = launcher(3, "until-lost", &dir, &flags)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the launcher starts");
    wait_for_marks(&dir, "started-", 3);
    drop(options);
    let out = launched.wait_with_output().expect("the launcher ends");
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(
        said.contains("the coordinator at etcd://127.0.0.1:"),
        "{said}"
    );
    for rank in 0..3 {
        let lost = std::fs::read_to_string(dir.join(format!("lost-{rank}")))
            .unwrap_or_else(|_| panic!("rank {rank} learned nothing: {said}"));
        assert!(
            lost.starts_with("the coordinator at etcd://"),
            "rank {rank}: {lost}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_launch_that_cannot_start_says_why() {
    let dir = folder("usage");
    let (out, said) = launch(0, "share", &dir, &[]);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(
        said.contains("invalid -n: a launch of no workers"),
        "{said}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_scope-launch"))
        .args(["-n", "2", "--", "/nonexistent/program"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{said}");
    assert!(said.contains("starting \"/nonexistent/program\""), "{said}");
    let out = Command::new(env!("CARGO_BIN_EXE_scope-launch"))
        .args(["-n", "2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no `--` before the program"));
    let _ = std::fs::remove_dir_all(&dir);
}

fn settings(at: &Embedded, rank: usize, ranks: usize, epoch: u64) -> Settings {
    Settings {
        rank,
        ranks,
        epoch,
        coordinator: at.address(),
        liveness: Duration::from_millis(500),
        restart: 0,
        job: "job-test".into(),
    }
}

#[test]
fn a_worker_started_wrong_is_refused_by_name() {
    let served = Embedded::start(std::sync::Arc::new(Store::new())).unwrap();
    served
        .store()
        .put(&keys::ranks("job-test"), b"4", None)
        .unwrap();
    served
        .store()
        .put(&keys::epoch("job-test"), b"0", None)
        .unwrap();
    let refused = |s: Settings| match Launched::with(s) {
        Err(JobError::Invalid { what, why }) => format!("{what}: {why}"),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("joined"),
    };
    assert_eq!(
        refused(settings(&served, 0, 3, 0)),
        "group size: 3 given to this worker, 4 recorded for job `job-test`"
    );
    assert_eq!(
        refused(settings(&served, 0, 4, 1)),
        "epoch: 1 given to this worker, 0 recorded for job `job-test`"
    );
    let first = Launched::with(settings(&served, 2, 4, 0)).expect("rank 2 joins");
    let second = refused(settings(&served, 2, 4, 0));
    assert!(
        second.starts_with("rank: rank 2 is held by live process"),
        "{second}"
    );
    assert_eq!(first.alive().unwrap(), [2]);
    drop(first);
    // Ended on purpose: its lease is given back, and the rank is free.
    assert_eq!(
        served
            .store()
            .list(&keys::alive_prefix("job-test"))
            .unwrap(),
        []
    );
    let again = Launched::with(settings(&served, 2, 4, 0)).expect("rank 2 joins again");
    drop(again);
    let mut nowhere = settings(&served, 0, 4, 0);
    drop(served);
    nowhere.coordinator = "tcp://127.0.0.1:1".into();
    assert!(matches!(
        Launched::with(nowhere),
        Err(JobError::CoordinatorLost { .. })
    ));
}

#[test]
fn a_client_that_sends_nonsense_is_refused_and_others_are_served() {
    use std::io::{BufRead, BufReader, Write};
    let served = Embedded::start(std::sync::Arc::new(Store::new())).unwrap();
    let address = served.address();
    let host_port = address.trim_start_matches("tcp://");
    let ask = |line: &[u8]| {
        let mut stream = std::net::TcpStream::connect(host_port).unwrap();
        stream.write_all(line).unwrap();
        let mut answer = String::new();
        let _ = BufReader::new(stream).read_line(&mut answer);
        answer
    };
    assert!(ask(b"FLY me\n").starts_with("REFUSED no verb `FLY`"));
    assert!(ask(b"KEEP 99\n").starts_with("EXPIRED"));
    let long = vec![b'x'; scope_launch::wire::MAX_LINE + 10];
    assert!(ask(&long).starts_with("REFUSED a line past"));
    let worker = scope_launch::connect::connect(&address, Duration::from_secs(5)).unwrap();
    worker.put("k", b"v", None).unwrap();
    assert_eq!(worker.get("k").unwrap().as_deref(), Some(&b"v"[..]));
    assert!(matches!(
        worker.put("big", &vec![0; scope_launch::store::MAX_VALUE + 1], None),
        Err(JobError::Invalid { .. })
    ));
}
