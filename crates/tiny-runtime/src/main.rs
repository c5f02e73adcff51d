//! `tiny-runtime`: the demo. A 2-layer MLP on the best linked backend, a fault
//! it survives, capture/replay, and data-parallel training with a faulted rank.
//!
//! ```text
//! cargo xtask demo [--backend B]     (or: cargo run -p tiny-runtime -- ARGS)
//! tiny-runtime [--backend cuda|hip|vulkan|wgpu]
//!     [--kernels cube|native] [--target spirv|wgsl|cuda|hip]
//!     [--passes N] [--shape BATCHxINxHIDDENxOUT] [--seed S] [--devices N]
//!     [--grad-dtype bf16|f32]
//! tiny-runtime --probe [BACKEND]     what each linked server finds, as JSON
//! ```
//!
//! Act four's ranks are `--devices N` servers of the backend (4 by default;
//! 1 leaves the act out). On one GPU the ranks are logical devices.
//!
//! The kernels are the `#[cube]` ones by default. Act one also times the other
//! path on the same device, so every run prints cube against native.
//!
//! On a software adapter (lavapipe, llvmpipe) the demo marks its times as CPU
//! emulation: what it shows there is behaviour, not speed.
//!
//! `--probe` lives here, not in `xtask`, so `cargo xtask` links no server and the
//! probe is the tests' build, with no second compile. `xtask` runs one probe
//! process per backend, so a probe that panics or aborts in a driver is that
//! backend's answer, not the end of the matrix.
//!
//! Exits non-zero when a check fails.

use std::process::ExitCode;
use std::time::Duration;

use scope_core::{Backend, BackendKind, Client, DeviceKind, Probe};
use scope_cube::Target;
use tiny_runtime::backends::{self, OnClients};
use tiny_runtime::demo::{self, DataParallelReport, StepCheck, Survival, TOLERANCE};
use tiny_runtime::{Runtime, Shape, Weights};

/// Which kernels the demo runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernels {
    Cube,
    Native,
}

struct Args {
    backend: Option<String>,
    /// Also run act four's first step with its gradients all-reduced in `bf16`.
    bf16: bool,
    kernels: Kernels,
    target: Option<Target>,
    passes: usize,
    shape: Shape,
    seed: u64,
    devices: usize,
}

fn usage() -> String {
    let backends: Vec<&str> = BackendKind::ALL.iter().map(|k| k.name()).collect();
    let backends = backends.join("|");
    format!(
        "usage: tiny-runtime [--backend {backends}] [--kernels cube|native] \
         [--target spirv|wgsl|cuda|hip] [--passes N] [--shape BATCHxINxHIDDENxOUT] [--seed S] \
         [--devices N] [--grad-dtype bf16|f32]\n\
         \x20      tiny-runtime --probe [{backends}]"
    )
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        backend: None,
        bf16: true,
        kernels: Kernels::Cube,
        target: None,
        passes: 5,
        shape: Shape::DEMO,
        seed: 7,
        devices: 4,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| format!("{name} needs a value\n{}", usage()))
        };
        match arg.as_str() {
            "--backend" => args.backend = Some(value("--backend")?),
            "--grad-dtype" => {
                args.bf16 = match value("--grad-dtype")?.as_str() {
                    "bf16" => true,
                    "f32" => false,
                    other => return Err(format!("--grad-dtype {other}: bf16 or f32")),
                }
            }
            "--kernels" => {
                args.kernels = match value("--kernels")?.as_str() {
                    "cube" => Kernels::Cube,
                    "native" => Kernels::Native,
                    other => return Err(format!("--kernels {other}: cube or native")),
                }
            }
            "--target" => {
                let name = value("--target")?;
                args.target = Some(match name.as_str() {
                    "spirv" | "spir-v" => Target::SpirV,
                    "wgsl" => Target::Wgsl,
                    "cuda" => Target::Cuda,
                    "hip" => Target::Hip,
                    other => return Err(format!("--target {other}: spirv, wgsl, cuda or hip")),
                });
            }
            "--passes" => {
                args.passes = value("--passes")?
                    .parse()
                    .map_err(|e| format!("--passes: {e}"))?
            }
            "--devices" => {
                args.devices = value("--devices")?
                    .parse()
                    .map_err(|e| format!("--devices: {e}"))?;
                if args.devices == 0 {
                    return Err("--devices 0: at least one".to_owned());
                }
            }
            "--seed" => {
                args.seed = value("--seed")?
                    .parse()
                    .map_err(|e| format!("--seed: {e}"))?
            }
            "--shape" => {
                let text = value("--shape")?;
                let dims: Vec<usize> = text
                    .split(['x', '×'])
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("--shape {text}: {e}"))?;
                let [batch, input, hidden, output] = dims[..] else {
                    return Err(format!("--shape {text}: four sizes, BATCHxINxHIDDENxOUT"));
                };
                if dims.contains(&0) {
                    return Err(format!("--shape {text}: sizes must be positive"));
                }
                args.shape = Shape {
                    batch,
                    input,
                    hidden,
                    output,
                };
            }
            "-h" | "--help" => return Err(usage()),
            other => return Err(format!("unknown argument `{other}`\n{}", usage())),
        }
    }
    Ok(args)
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

fn verdict(error: f32) -> &'static str {
    if error <= TOLERANCE { "ok" } else { "FAILED" }
}

struct Demo {
    bf16: bool,
    kernels: Kernels,
    target: Option<Target>,
    shape: Shape,
    passes: usize,
    seed: u64,
}

impl OnClients for Demo {
    type Output = Result<bool, String>;

    fn run<B: Backend>(self, clients: Vec<Client<B>>) -> Self::Output {
        let client = clients[0].clone();
        let s = self.shape;
        println!("backend  {}", client.backend());
        println!("device   {}", client.describe());
        let emulated =
            device_kind(client.backend(), client.describe()) == Some(DeviceKind::Software);
        if emulated {
            for line in SOFTWARE_NOTE {
                println!("         {line}");
            }
        }
        let tag = if emulated { "  [CPU emulation]" } else { "" };
        let make = |kernels: Kernels, client: Client<B>| match (kernels, self.target) {
            (Kernels::Native, _) => Runtime::native(client),
            (Kernels::Cube, Some(target)) => Runtime::cube(client, target),
            (Kernels::Cube, None) => Runtime::new(client),
        };
        let other = match self.kernels {
            Kernels::Cube => Kernels::Native,
            Kernels::Native => Kernels::Cube,
        };
        let devices = clients.len();
        let rt = make(self.kernels, client.clone()).map_err(|e| e.to_string())?;
        let twin = make(other, client).map_err(|e| e.to_string())?;
        println!("kernels  {}", rt.path().describe());
        let weights = Weights::random(s, self.seed);
        let setup = demo::setup(&rt, &weights, self.seed + 1).map_err(|e| e.to_string())?;
        let mut ok = true;

        println!("\n1. forward pass");
        let fwd = demo::forward(&rt, &setup.mlp, &setup.reference)
            .map_err(|e| format!("forward pass: {e}"))?;
        println!(
            "   first pass, compiling kernels   {}{tag}",
            secs(fwd.first)
        );
        println!(
            "   forward pass                    {}  ({:.2} GFLOP/s){tag}",
            secs(fwd.steady),
            s.flops() / fwd.steady.as_secs_f64() / 1e9
        );
        // The reference is an f64 loop, unoptimised in the dev profile; it says so.
        println!(
            "   CPU reference                   {}  (f64 on the host{})",
            secs(setup.cpu),
            if cfg!(debug_assertions) {
                ", unoptimised dev build"
            } else {
                ""
            }
        );
        println!(
            "   max error vs CPU                {:.2e}  {}",
            fwd.max_error,
            verdict(fwd.max_error)
        );
        ok &= fwd.max_error <= TOLERANCE;
        let cmp = demo::forward(&twin, &setup.mlp, &setup.reference)
            .map_err(|e| format!("forward pass ({}): {e}", twin.path().describe()))?;
        println!(
            "   {:<31} {}  ({:.2} GFLOP/s, {:.2}× this path's time; max error {:.2e} {}){tag}",
            format!("same pass, {} kernels", twin.path().describe()),
            secs(cmp.steady),
            s.flops() / cmp.steady.as_secs_f64() / 1e9,
            cmp.steady.as_secs_f64() / fwd.steady.as_secs_f64().max(1e-9),
            cmp.max_error,
            verdict(cmp.max_error)
        );
        ok &= cmp.max_error <= TOLERANCE;

        println!("\n2. a fault injected into layer1.matmul");
        let fault = demo::fault(&rt, &setup.mlp, &setup.x, &setup.reference)
            .map_err(|e| format!("fault demo: {e}"))?;
        println!("   reading layer2.softmax's output fails:");
        for line in fault.read_error.to_string().lines() {
            println!("   | {line}");
        }
        println!(
            "   chain    output ← {} ← root",
            if fault.skipped.is_empty() {
                "(no hops)".to_owned()
            } else {
                fault.skipped.join(" ← ")
            }
        );
        println!("   root     {}", fault.root);
        println!(
            "   device   {}; untouched bytes read {}",
            if fault.poisoned {
                "POISONED"
            } else {
                "not poisoned"
            },
            if fault.device_kept_working {
                "fine"
            } else {
                "FAILED"
            }
        );
        println!(
            "   rerun after rewriting the input: max error {:.2e}  {}",
            fault.rerun_max_error,
            verdict(fault.rerun_max_error)
        );
        let expected: Vec<&str> = tiny_runtime::Mlp::KERNELS[1..]
            .iter()
            .rev()
            .copied()
            .collect();
        if fault.skipped != expected {
            println!("   FAILED: expected the chain {}", expected.join(" ← "));
            ok = false;
        }
        ok &= !fault.poisoned && fault.device_kept_working && fault.rerun_max_error <= TOLERANCE;

        println!("\n3. capture once, replay {} times", self.passes);
        let replay = demo::replay(&rt, &setup.mlp, &setup.reference, self.passes)
            .map_err(|e| format!("replay: {e}"))?;
        let per = |d: Duration| d.as_secs_f64() / replay.passes.max(1) as f64;
        println!(
            "   eager    {}  ({:.4} s a pass){tag}",
            secs(replay.eager),
            per(replay.eager)
        );
        println!(
            "   replay   {}  ({:.4} s a pass, {:.2}× eager){tag}",
            secs(replay.replay),
            per(replay.replay),
            replay.eager.as_secs_f64() / replay.replay.as_secs_f64().max(1e-9)
        );
        println!(
            "   max error after replays         {:.2e}  {}",
            replay.max_error,
            verdict(replay.max_error)
        );
        ok &= replay.max_error <= TOLERANCE;

        if devices > 1 {
            // On fresh devices, before act four loses one; printed after it.
            let bf16 = if self.bf16 {
                let runtimes = clients
                    .iter()
                    .map(|c| make(self.kernels, c.clone()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                let shape = demo::data_parallel_shape(devices);
                let seed = self.seed + 10;
                Some(
                    demo::bf16_step(runtimes, (shape, demo::LEARNING_RATE, seed))
                        .map_err(|e| format!("the bf16 step: {e}"))?,
                )
            } else {
                None
            };
            let runtimes = clients
                .into_iter()
                .map(|c| make(self.kernels, c))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| e.to_string())?;
            let report = demo::data_parallel(
                runtimes,
                (
                    demo::data_parallel_shape(devices),
                    demo::LEARNING_RATE,
                    self.seed + 10,
                ),
                &backends::lose_device,
            )
            .map_err(|e| format!("data-parallel step: {e}"))?;
            print_data_parallel(&report, B::NAME, tag);
            ok &= report.passed();
            if let Some(step) = bf16 {
                print_bf16(&step, report.gradient_bytes, tag);
                ok &= step.passed();
            }
        }
        if emulated {
            println!(
                "\n   (times marked [CPU emulation] measure the software adapter on this CPU; \
                 on a GPU they measure the device)"
            );
        }
        Ok(ok)
    }
}

fn ok(pass: bool) -> &'static str {
    if pass { "ok" } else { "FAILED" }
}

/// The same bits on every rank, or not.
fn same(identical: bool, ranks: usize) -> String {
    if identical {
        format!("the same bits on all {ranks} ranks")
    } else {
        "DIFFERENT on some rank, or unreadable".to_owned()
    }
}

/// One line of act four: a label in the demo's column, then `value`.
fn line(label: &str, value: impl std::fmt::Display) {
    println!("   {label:<31} {value}");
}

/// A clean step's lines.
fn print_clean(check: &StepCheck, ranks: usize, tag: &str) {
    line(
        "loss on the batch",
        format!(
            "{:.6}  (CPU {:.6})  {}",
            check.loss.unwrap_or(f64::NAN),
            check.reference_loss,
            ok(check.loss_error() <= f64::from(TOLERANCE))
        ),
    );
    line(
        "all-reduced gradient",
        format!(
            "{}  {}",
            same(check.gradients_identical, ranks),
            ok(check.gradients_identical)
        ),
    );
    line(
        "  max error vs CPU",
        format!(
            "{:.2e}  {}",
            check.gradient_error,
            verdict(check.gradient_error)
        ),
    );
    line(
        "weights after the update",
        format!(
            "{}, {} of {ranks} updated  {}",
            same(check.weights_identical, ranks),
            check.updated,
            ok(check.weights_identical && check.updated == ranks)
        ),
    );
    line(
        "  max error vs CPU",
        format!(
            "{:.2e}  (the step moved them up to {:.2e})  {}",
            check.weights_error,
            check.weights_change,
            verdict(check.weights_error)
        ),
    );
    line("step time", format!("{}{tag}", secs(check.time)));
}

/// Act four, printed.
fn print_data_parallel(r: &DataParallelReport, backend: &str, tag: &str) {
    let s = r.shape;
    println!(
        "\n4. a data-parallel training step on {} devices ({} {backend} servers, a rank each)",
        r.ranks, r.ranks
    );
    println!(
        "   batch {} × {} → {} → {}, {} rows a rank. Every rank: forward and backward on its rows,",
        s.batch,
        s.input,
        s.hidden,
        s.output,
        s.batch / r.ranks
    );
    println!(
        "   all_reduce(Mean, F32) of its {:.1} KiB gradient (host-staged), sgd (lr {}) into",
        r.gradient_bytes as f64 / 1024.0,
        r.lr
    );
    println!("   its other weights. Checked against the CPU's step on the whole batch (f64 sums)");
    println!("   to within {TOLERANCE:.0e}.");
    line(
        "compiling the step's kernels",
        format!("{}  (every device at once){tag}", secs(r.compile)),
    );
    line("same weights on every rank", ok(r.loaded));

    println!("\n   step 1");
    print_clean(&r.clean, r.ranks, tag);

    let f = &r.faulted;
    println!(
        "\n   step 2, a fault injected into rank {}'s backward pass (`{}`, its first kernel)",
        r.faulted_rank, r.faulted_kernel
    );
    println!("   rank 0 reads its all-reduced gradient, which fails:");
    match &f.ranks[0].gradient {
        Ok(_) => println!("   | (the read succeeded)"),
        Err(error) => {
            for text in error.to_string().lines() {
                println!("   | {text}");
            }
        }
    }
    for (rank, seen) in r.failed.iter().enumerate() {
        let names = |n: Option<usize>| n.map_or("no rank".to_owned(), |n| format!("rank {n}"));
        let contained = seen.all_reduce_names == Some(r.faulted_rank)
            && seen.gradient_names == Some(r.faulted_rank)
            && seen.update_skipped;
        line(
            &format!("rank {rank}"),
            format!(
                "all_reduce names {}, its gradient names {}, update {}  {}",
                names(seen.all_reduce_names),
                names(seen.gradient_names),
                if seen.update_skipped {
                    "skipped"
                } else {
                    "NOT skipped"
                },
                ok(contained)
            ),
        );
    }
    if let Some(seen) = r.failed.get(r.faulted_rank) {
        line("root", seen.root.as_deref().unwrap_or("(none named)"));
        let mut chain = seen.chain.clone();
        chain.push("root".to_owned());
        line(
            "chain",
            format!("rank {}'s gradient ← {}", r.faulted_rank, chain.join(" ← ")),
        );
    }
    let skipped = r.failed.iter().all(|seen| seen.update_skipped);
    line(
        "update",
        format!(
            "`{}` {}: its input, the gradient, carries the failure  {}",
            tiny_runtime::data_parallel::UPDATE,
            if skipped {
                "skipped on every rank"
            } else {
                "NOT skipped on some rank"
            },
            ok(skipped)
        ),
    );
    line(
        "loss on the batch",
        format!(
            "{:.6}  (CPU {:.6}; the forward pass ran clean)  {}",
            f.loss.unwrap_or(f64::NAN),
            f.reference_loss,
            ok(f.loss_error() <= f64::from(TOLERANCE))
        ),
    );
    line(
        "weights read back",
        format!(
            "unchanged ({:.2e}), {}, {} of {} updated  {}",
            f.weights_change,
            same(f.weights_identical, r.ranks),
            f.updated,
            r.ranks,
            ok(f.weights_identical && f.updated == 0 && f.weights_error == 0.0)
        ),
    );
    line("step time", format!("{}{tag}", secs(f.time)));

    println!("\n   step 3, the next step");
    print_clean(&r.recovered, r.ranks, tag);
    let held: usize = r.failures_held.iter().sum();
    line(
        "failures held on the devices",
        format!("{held}  {}", ok(held == 0)),
    );
    match &r.survival {
        Ok(survival) => print_survival(survival, r.ranks, tag),
        Err(error) => println!(
            "\n   losing rank {}'s device: FAILED: {error}",
            r.faulted_rank
        ),
    }
}

/// Act four's first step again, its gradients all-reduced in `bf16`.
fn print_bf16(step: &demo::Bf16Step, f32_bytes: u64, tag: &str) {
    let c = &step.check;
    println!("\n   step 1 again, the gradients all-reduced in bf16 (`--grad-dtype bf16`)");
    line(
        "bytes a rank all-reduces",
        format!(
            "{:.1} KiB, {:.2}× the f32 gradient's",
            step.bytes as f64 / 1024.0,
            step.bytes as f64 / f32_bytes as f64
        ),
    );
    line(
        "gradient against the CPU's",
        format!(
            "{:.2e}, within bf16's bound {:.2e}  {}",
            c.gradient_error,
            step.gradient_bound + TOLERANCE,
            ok(c.gradient_error <= step.gradient_bound + TOLERANCE)
        ),
    );
    line(
        "weights against the CPU's",
        format!(
            "{:.2e}, within {:.2e}, {}, {} of {} updated  {}",
            c.weights_error,
            step.weights_bound + TOLERANCE,
            same(c.weights_identical, c.ranks.len()),
            c.updated,
            c.ranks.len(),
            ok(step.passed())
        ),
    );
    line("step time", format!("{}{tag}", secs(c.time)));
}

fn main() -> ExitCode {
    let mut argv = std::env::args().skip(1);
    if argv.next().as_deref() == Some("--probe") {
        return probe_mode(argv.collect());
    }
    let args = match parse() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let backend = match args.backend.clone() {
        Some(name) => name,
        None => match backends::best() {
            Ok(name) => name.to_owned(),
            Err(why) => {
                eprintln!("tiny-runtime: no device for any linked backend: {why}");
                eprintln!("  a software Vulkan adapter works: sudo ci/install-software-adapter.sh");
                return ExitCode::FAILURE;
            }
        },
    };
    let s = args.shape;
    println!(
        "tiny-runtime: 2-layer MLP, batch {} × {} → {} → {} ({:.2} GFLOP a pass)",
        s.batch,
        s.input,
        s.hidden,
        s.output,
        s.flops() / 1e9
    );
    let demo = Demo {
        bf16: args.bf16,
        kernels: args.kernels,
        target: args.target,
        shape: s,
        passes: args.passes,
        seed: args.seed,
    };
    match backends::with_clients(&backend, args.devices, demo) {
        Ok(Ok(true)) => {
            println!("\nall checks passed");
            ExitCode::SUCCESS
        }
        Ok(Ok(false)) => {
            println!("\nsome checks FAILED");
            ExitCode::FAILURE
        }
        Ok(Err(message)) => {
            eprintln!("tiny-runtime: {message}");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("tiny-runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

/// What the demo prints under the device line on a software adapter.
const SOFTWARE_NOTE: [&str; 4] = [
    "a software adapter: this machine's CPU emulates the GPU, so every time below",
    "is a CPU-emulation figure, not a GPU figure. What the run shows is behaviour:",
    "results that agree with the CPU reference, a fault that reads as its chain and",
    "heals, and a captured pass that replays.",
];

/// The kind of the device a client opened: the longest probed device name its
/// description starts with. `None` when the probe does not list it: claim nothing.
fn device_kind(backend: &str, describe: &str) -> Option<DeviceKind> {
    let probe = backends::probe(backend)?;
    probe
        .devices
        .iter()
        .filter(|d| !d.name.is_empty() && describe.starts_with(&d.name))
        .max_by_key(|d| d.name.len())
        .map(|d| d.kind)
}

/// `tiny-runtime --probe [BACKEND]`: each linked server's `probe()` as a JSON array.
/// A panicking probe answers as its backend's `why_not`; an unlinked backend says so.
fn probe_mode(names: Vec<String>) -> ExitCode {
    let known: Vec<&str> = BackendKind::ALL.iter().map(|k| k.name()).collect();
    let names: Vec<String> = if names.is_empty() {
        known.iter().map(|s| (*s).to_owned()).collect()
    } else {
        names
    };
    let mut objects = Vec::new();
    for name in &names {
        if !known.contains(&name.as_str()) {
            eprintln!("--probe {name}: one of {}", known.join(", "));
            return ExitCode::from(2);
        }
        let answer = std::panic::catch_unwind(|| backends::probe(name));
        objects.push(probe_json(name, answer));
    }
    println!("[{}]", objects.join(",\n "));
    ExitCode::SUCCESS
}

fn probe_json(name: &str, answer: std::thread::Result<Option<Probe>>) -> String {
    let (linked, devices, why_not) = match answer {
        Ok(Some(probe)) => {
            let devices: Vec<String> = probe
                .devices
                .iter()
                .map(|d| {
                    format!(
                        "{{\"name\": {}, \"kind\": {}, \"detail\": {}}}",
                        json_string(&d.name),
                        json_string(&d.kind.to_string()),
                        json_string(&d.detail)
                    )
                })
                .collect();
            let why_not = (!probe.has_device()).then(|| {
                probe
                    .why_not
                    .unwrap_or_else(|| "no device found".to_owned())
            });
            (true, devices, why_not)
        }
        Ok(None) => (
            false,
            Vec::new(),
            Some(format!(
                "not linked into this build of tiny-runtime (build it with --features {name})"
            )),
        ),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "unknown panic".to_owned());
            (
                true,
                Vec::new(),
                Some(format!(
                    "the probe panicked (a bug in server-{name}): {message}"
                )),
            )
        }
    };
    format!(
        "{{\"backend\": {}, \"linked\": {linked}, \"devices\": [{}], \"why_not\": {}}}",
        json_string(name),
        devices.join(", "),
        why_not
            .as_deref()
            .map_or_else(|| "null".to_owned(), json_string)
    )
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Act four, continued: a lost device survived.
fn print_survival(s: &Survival, ranks: usize, tag: &str) {
    println!(
        "\n   then rank {}'s device is lost ({}); the group goes on without it, and takes it back if its device opens again",
        s.lost,
        if s.real {
            "for real, by the backend"
        } else {
            "injected: this backend cannot lose a device on demand"
        }
    );
    println!("   membership timeline:");
    for event in &s.timeline {
        let members: Vec<String> = event.members.iter().map(usize::to_string).collect();
        println!(
            "   | epoch {} [{}]  {}  ({}{tag})",
            event.epoch,
            members.join(", "),
            event.what,
            secs(event.took)
        );
    }
    let f = &s.lost_step;
    line(
        "the step it was lost in",
        format!(
            "every survivor's all_reduce names rank {}, {} of {} updated, weights unchanged ({:.2e})  {}",
            s.lost,
            f.updated,
            f.ranks.len(),
            f.weights_change,
            ok(s.lost_step_contained)
        ),
    );
    for (i, step) in s.shrunk_steps.iter().enumerate() {
        println!(
            "\n   survivors' step {} ({} ranks, the mean over their rows)",
            i + 1,
            step.ranks.len()
        );
        print_clean(step, step.ranks.len(), tag);
    }
    if let Some(why) = &s.stayed_out {
        let members = s.rejoined_step.ranks.len();
        line("it stays out", format!("{why}"));
        line(
            "the survivors' weights",
            format!(
                "{}  {}",
                same(s.healed_identical, members),
                ok(s.healed_identical)
            ),
        );
        println!("\n   the survivors' next step, without it");
        print_clean(&s.rejoined_step, members, tag);
    } else {
        line(
            "after the heal",
            format!(
                "{} buffers came back lost with the device; weights {}  {}",
                s.lost_buffers,
                same(s.healed_identical, ranks),
                ok(s.healed_identical)
            ),
        );
        println!("\n   the step after it came back, on every rank");
        print_clean(&s.rejoined_step, ranks, tag);
    }
    let held: usize = s
        .failures_held
        .iter()
        .enumerate()
        .filter(|&(replica, _)| s.stayed_out.is_none() || replica != s.lost)
        .map(|(_, n)| n)
        .sum();
    line(
        "failures held on the devices",
        format!("{held}  {}", ok(held == 0)),
    );
}
