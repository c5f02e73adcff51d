//! `scope-launch -n N [options] -- PROGRAM [ARGS...]`: starts N workers of
//! PROGRAM, one per device, watches them and restarts a failed one.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use scope_launch::{Launcher, Outcome, Plan};

const USAGE: &str = "\
usage: scope-launch -n N [options] -- PROGRAM [ARGS...]

Starts N workers of PROGRAM, ranks 0..N, each told its rank, the group's
size and where the coordinator is (SCOPE_LAUNCH_* variables). A worker
that fails is restarted alone, after a back-off, until the job's restarts
are spent.

options:
  -n N                  how many workers (required)
  --max-restarts K      restarts the whole job may spend (default 3)
  --backoff MS          wait before a rank's first restart, doubled after (default 100)
  --liveness MS         a worker silent this long is counted gone (default 1000)
  --coordinator ADDR    tcp://HOST:PORT of a running coordinator (default: the launcher's own)
  --epoch E             the membership epoch to start in (default 0)

exit status: 0 when every worker finished, 1 when the restarts were spent,
2 for a usage error, 3 when the launch itself failed, 130 when interrupted.";

fn parse(args: Vec<OsString>) -> Result<Plan, String> {
    let (options, program) = match args.iter().position(|a| a == "--") {
        Some(at) => (&args[..at], &args[at + 1..]),
        None => return Err("no `--` before the program".into()),
    };
    let Some((program, program_args)) = program.split_first() else {
        return Err("no program after `--`".into());
    };
    let mut plan = Plan::new(0, program.clone());
    plan.args = program_args.to_vec();
    let mut options = options.iter().map(|o| o.to_string_lossy().into_owned());
    let mut ranks = None;
    while let Some(option) = options.next() {
        let mut value = |name: &str| {
            options
                .next()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        fn number<T: std::str::FromStr>(name: &str, text: &str) -> Result<T, String> {
            text.parse()
                .map_err(|_| format!("{name}: `{text}` is not a number"))
        }
        match option.as_str() {
            "-n" => ranks = Some(number::<usize>("-n", &value("-n")?)?),
            "--max-restarts" => {
                plan.policy.max_restarts = number("--max-restarts", &value("--max-restarts")?)?
            }
            "--backoff" => {
                plan.policy.backoff =
                    Duration::from_millis(number("--backoff", &value("--backoff")?)?)
            }
            "--liveness" => {
                plan.liveness = Duration::from_millis(number("--liveness", &value("--liveness")?)?)
            }
            "--coordinator" => plan.coordinator = Some(value("--coordinator")?),
            "--epoch" => plan.epoch = number("--epoch", &value("--epoch")?)?,
            other => return Err(format!("unknown option `{other}`")),
        }
    }
    plan.ranks = ranks.ok_or("-n is required")?;
    Ok(plan)
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let plan = match parse(args) {
        Ok(plan) => plan,
        Err(why) => {
            eprintln!("scope-launch: {why}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    scope_launch::launcher::stop_on_signals();
    let ran = Launcher::new(plan).and_then(Launcher::run);
    match ran {
        Ok(Outcome::Done { .. }) => ExitCode::SUCCESS,
        Ok(Outcome::Spent {
            rank,
            why,
            restarts,
        }) => {
            eprintln!(
                "scope-launch: rank {rank} failed ({why}) after {restarts} restarts; --max-restarts is spent"
            );
            ExitCode::from(1)
        }
        Ok(Outcome::Interrupted) => ExitCode::from(130),
        Err(error) => {
            eprintln!("scope-launch: {error}");
            ExitCode::from(3)
        }
    }
}
