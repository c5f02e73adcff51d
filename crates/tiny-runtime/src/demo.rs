//! The demo's three acts, as functions that return what they saw.
//!
//! The binary prints these reports; the tests assert on them. Keeping the
//! acts here rather than in `main` means the thing the README shows people
//! is the thing CI checks.

use std::time::{Duration, Instant};

use scope_core::{Backend, DeviceFault, Error, FaultPlan, Result, Site};

use crate::mlp::{Mlp, Weights, max_error};
use crate::runtime::Runtime;

/// How close a device result must be to the CPU reference. The outputs are
/// probabilities; `f32` accumulation over a thousand terms differs from the
/// `f64` reference by about 1e-6 of a logit.
pub const TOLERANCE: f32 = 1e-4;

/// Act one: a checked forward pass.
#[derive(Clone, Debug)]
pub struct Forward {
    /// The first pass, which also pays for compiling the kernels.
    pub first: Duration,
    /// A second pass: the steady-state time.
    pub steady: Duration,
    /// The largest difference from the CPU reference.
    pub max_error: f32,
}

/// Run a pass twice, timing each to completion, and compare the result.
///
/// # Errors
///
/// Any device error, including a failure the output carries.
pub fn forward<B: Backend>(rt: &Runtime<B>, mlp: &Mlp, reference: &[f32]) -> Result<Forward> {
    let start = Instant::now();
    rt.compile()?;
    mlp.forward(rt)?;
    rt.sync()?;
    let first = start.elapsed();
    let start = Instant::now();
    mlp.forward(rt)?;
    let probs = rt.read(&mlp.probs)?;
    let steady = start.elapsed();
    Ok(Forward {
        first,
        steady,
        max_error: max_error(&probs, reference),
    })
}

/// Act two: what a user sees when the first layer's matmul fails.
#[derive(Clone, Debug)]
pub struct Fault {
    /// The error the read of the output returned.
    pub read_error: Error,
    /// The kernels the chain names, from the output back to the root.
    pub skipped: Vec<String>,
    /// The root error.
    pub root: String,
    /// Whether the device was poisoned (it must not be).
    pub poisoned: bool,
    /// An unrelated read of the weights after the fault succeeded.
    pub device_kept_working: bool,
    /// The largest difference from the reference after rewriting the input
    /// and running again.
    pub rerun_max_error: f32,
}

/// The fault the demo injects: a launch failure the driver does not declare
/// sticky, such as an invalid launch configuration, on `layer1.matmul`.
pub fn injected_fault(backend: &'static str) -> Error {
    Error::Fault(DeviceFault {
        backend,
        code: "INJECTED_LAUNCH_FAILURE".to_owned(),
        sticky: false,
        stream: None,
        detail: "the demo failed `layer1.matmul` on purpose".to_owned(),
    })
}

/// Fail the next pass's first launch (`layer1.matmul`), read the output,
/// show the device still works, rewrite the input and run again.
///
/// # Errors
///
/// A device error other than the injected one, or a read of the output
/// that did not fail.
pub fn fault<B: Backend>(
    rt: &Runtime<B>,
    mlp: &Mlp,
    x: &[f32],
    reference: &[f32],
) -> Result<Fault> {
    rt.sync()?;
    // Counted from installation: the pass's first launch is layer1.matmul.
    rt.client()
        .inject(FaultPlan::new().fail(Site::Launch, 1, injected_fault(B::NAME)));
    mlp.forward(rt)?;
    let read_error = match rt.read(&mlp.probs) {
        Ok(_) => {
            return Err(Error::invalid(
                "fault demo",
                "the output read succeeded after an injected fault",
            ));
        }
        Err(error) => error,
    };
    rt.client().inject(FaultPlan::new());
    let (skipped, root) = match read_error.unwritten().first() {
        Some(entry) => (
            entry
                .chain
                .hops
                .iter()
                .map(|hop| hop.kernel.to_string())
                .collect(),
            entry.root.to_string(),
        ),
        None => (Vec::new(), read_error.to_string()),
    };
    let poisoned = rt.client().poison().is_some();
    // Bytes no failed work touched read as ever: the input, say.
    let device_kept_working = rt.read(&mlp.x).is_ok_and(|v| v == x);
    rt.write(&mlp.x, x)?;
    mlp.forward(rt)?;
    let probs = rt.read(&mlp.probs)?;
    Ok(Fault {
        read_error,
        skipped,
        root,
        poisoned,
        device_kept_working,
        rerun_max_error: max_error(&probs, reference),
    })
}

/// Act three: one pass captured, replayed `passes` times.
#[derive(Clone, Debug)]
pub struct Replay {
    /// Passes in each timing.
    pub passes: usize,
    /// `passes` eager passes, issued and waited for.
    pub eager: Duration,
    /// `passes` replays of the captured pass, issued and waited for.
    pub replay: Duration,
    /// The largest difference from the reference after the replays (the
    /// output is zeroed first, so a replay that wrote nothing fails).
    pub max_error: f32,
}

/// Time `passes` eager passes, capture one, time `passes` replays of it.
///
/// # Errors
///
/// Any device error, a capture that did not seal, or a failure the output
/// carries.
pub fn replay<B: Backend>(
    rt: &Runtime<B>,
    mlp: &Mlp,
    reference: &[f32],
    passes: usize,
) -> Result<Replay> {
    let client = rt.client();
    rt.sync()?;
    let start = Instant::now();
    for _ in 0..passes {
        mlp.forward(rt)?;
    }
    rt.sync()?;
    let eager = start.elapsed();

    let capture = client.begin_capture()?;
    if let Err(error) = mlp.forward(rt) {
        client.abort_capture(capture)?;
        return Err(error);
    }
    let graph = client.end_capture(capture)?;

    rt.write(&mlp.probs, &vec![0.0; mlp.probs.len()])?;
    let start = Instant::now();
    for _ in 0..passes {
        client.replay(&graph)?;
    }
    rt.sync()?;
    let replay = start.elapsed();
    let probs = rt.read(&mlp.probs)?;
    client.destroy_graph(&graph)?;
    Ok(Replay {
        passes,
        eager,
        replay,
        max_error: max_error(&probs, reference),
    })
}

/// Everything a demo run needs, made once: the model on the device, its
/// input and the CPU reference.
#[derive(Debug)]
pub struct Setup {
    /// The model on the device.
    pub mlp: Mlp,
    /// The input uploaded.
    pub x: Vec<f32>,
    /// The CPU reference output.
    pub reference: Vec<f32>,
    /// How long the CPU reference took.
    pub cpu: Duration,
}

/// Make random weights and input for `weights.shape`, upload them, and
/// compute the reference.
///
/// # Errors
///
/// A device out of memory or failing to write.
pub fn setup<B: Backend>(rt: &Runtime<B>, weights: &Weights, seed: u64) -> Result<Setup> {
    let x = weights.input(seed);
    let mlp = Mlp::new(rt, weights, &x)?;
    let start = Instant::now();
    let reference = weights.reference(&x);
    let cpu = start.elapsed();
    Ok(Setup {
        mlp,
        x,
        reference,
        cpu,
    })
}
