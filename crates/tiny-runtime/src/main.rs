//! `tiny-runtime`: the demo. A 2-layer MLP on the best linked backend, a
//! fault it survives, and capture/replay.
//!
//! ```text
//! cargo run -p tiny-runtime --release [-- --backend wgpu|vulkan|cuda|hip]
//!     [--kernels cube|native] [--target spirv|wgsl|cuda|hip]
//!     [--passes N] [--shape BATCHxINxHIDDENxOUT] [--seed S]
//! ```
//!
//! The kernels are the `#[cube]` ones by default, translated for the
//! server's language (`--target` picks another the server takes: `wgsl` on
//! Vulkan goes through naga). Act one also times a pass of the other path
//! on the same device, so every run prints cube against native.
//!
//! Exits non-zero when a check fails: a result off the CPU reference, a
//! fault that did not show, a device that did not recover.

use std::process::ExitCode;
use std::time::Duration;

use scope_core::{Backend, Client};
use scope_cube::Target;
use tiny_runtime::backends::{self, OnClient};
use tiny_runtime::demo::{self, TOLERANCE};
use tiny_runtime::{Runtime, Shape, Weights};

/// Which kernels the demo runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernels {
    Cube,
    Native,
}

struct Args {
    backend: Option<String>,
    kernels: Kernels,
    target: Option<Target>,
    passes: usize,
    shape: Shape,
    seed: u64,
}

fn usage() -> String {
    "usage: tiny-runtime [--backend wgpu|vulkan|cuda|hip] [--kernels cube|native] \
     [--target spirv|wgsl|cuda|hip] [--passes N] [--shape BATCHxINxHIDDENxOUT] [--seed S]"
        .to_owned()
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        backend: None,
        kernels: Kernels::Cube,
        target: None,
        passes: 5,
        shape: Shape::DEMO,
        seed: 7,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| format!("{name} needs a value\n{}", usage()))
        };
        match arg.as_str() {
            "--backend" => args.backend = Some(value("--backend")?),
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
    kernels: Kernels,
    target: Option<Target>,
    shape: Shape,
    passes: usize,
    seed: u64,
}

impl OnClient for Demo {
    type Output = Result<bool, String>;

    fn run<B: Backend>(self, client: Client<B>) -> Self::Output {
        let s = self.shape;
        println!("backend  {}", client.backend());
        println!("device   {}", client.describe());
        let make = |kernels: Kernels, client: Client<B>| match (kernels, self.target) {
            (Kernels::Native, _) => Runtime::native(client),
            (Kernels::Cube, Some(target)) => Runtime::cube(client, target),
            (Kernels::Cube, None) => Runtime::new(client),
        };
        let other = match self.kernels {
            Kernels::Cube => Kernels::Native,
            Kernels::Native => Kernels::Cube,
        };
        let rt = make(self.kernels, client.clone()).map_err(|e| e.to_string())?;
        let twin = make(other, client).map_err(|e| e.to_string())?;
        println!("kernels  {}", rt.path().describe());
        let weights = Weights::random(s, self.seed);
        let setup = demo::setup(&rt, &weights, self.seed + 1).map_err(|e| e.to_string())?;
        let mut ok = true;

        println!("\n1. forward pass");
        let fwd = demo::forward(&rt, &setup.mlp, &setup.reference)
            .map_err(|e| format!("forward pass: {e}"))?;
        println!("   first pass, compiling kernels   {}", secs(fwd.first));
        println!(
            "   forward pass                    {}  ({:.2} GFLOP/s)",
            secs(fwd.steady),
            s.flops() / fwd.steady.as_secs_f64() / 1e9
        );
        println!("   CPU reference                   {}", secs(setup.cpu));
        println!(
            "   max error vs CPU                {:.2e}  {}",
            fwd.max_error,
            verdict(fwd.max_error)
        );
        ok &= fwd.max_error <= TOLERANCE;
        // The other path on the same model and device, for comparison.
        let cmp = demo::forward(&twin, &setup.mlp, &setup.reference)
            .map_err(|e| format!("forward pass ({}): {e}", twin.path().describe()))?;
        println!(
            "   {:<31} {}  ({:.2} GFLOP/s, {:.2}× this path's time; max error {:.2e} {})",
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
            "   eager    {}  ({:.4} s a pass)",
            secs(replay.eager),
            per(replay.eager)
        );
        println!(
            "   replay   {}  ({:.4} s a pass, {:.2}× eager)",
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
        Ok(ok)
    }
}

fn main() -> ExitCode {
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
        kernels: args.kernels,
        target: args.target,
        shape: s,
        passes: args.passes,
        seed: args.seed,
    };
    match backends::with_client(&backend, demo) {
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
