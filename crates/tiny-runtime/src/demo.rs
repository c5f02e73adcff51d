//! The demo's acts, as functions that return what they saw.
//!
//! The binary prints these reports and the tests assert on them, so what the
//! README shows is what CI checks.

use std::time::{Duration, Instant};

use scope_core::{Backend, DeviceFault, Error, FaultPlan, Result, Site};

use crate::data_parallel::{
    self, BACKWARD, DataParallel, Injection, RankStep, UPDATE, identical, input_failed,
    reference_step,
};
use crate::mlp::{Mlp, Shape, Weights, max_error};
use crate::runtime::Runtime;

mod check;
mod survival;

pub use check::{StepCheck, TOLERANCE};
pub use survival::{Event, Lose, Survival};

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

/// Run a pass twice, timing each to completion, and compare; fails on any device error.
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
    /// The largest difference from the reference after rewriting the input and rerunning.
    pub rerun_max_error: f32,
}

/// The fault the demo injects on `layer1.matmul`: a launch failure that is not sticky.
pub fn injected_fault(backend: &'static str) -> Error {
    injected_fault_in(backend, "`layer1.matmul`")
}

/// The same fault, on `what` (a kernel, as the detail names it).
pub fn injected_fault_in(backend: &'static str, what: &str) -> Error {
    Error::Fault(DeviceFault {
        backend,
        code: "INJECTED_LAUNCH_FAILURE".to_owned(),
        class: scope_core::FaultClass::Recoverable,
        stream: None,
        detail: format!("the demo failed {what} on purpose"),
    })
}

/// Fail the next pass's first launch, read the output, show the device still works, and
/// rerun on a rewritten input. Fails on other device errors, or an output read that works.
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
    /// The largest difference from the reference after replays into a zeroed output.
    pub max_error: f32,
}

/// Time `passes` eager passes, capture one, time `passes` replays of it. Fails on
/// any device error, a capture that did not seal, or a failure the output carries.
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

/// Everything a demo run needs, made once: the model, its input and the CPU reference.
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

/// Make random weights and input for `weights.shape`, upload them, and compute
/// the reference. Fails when a device runs out of memory or fails to write.
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

/// Rows of the batch each rank of act four gets.
pub const ROWS_PER_RANK: usize = 64;

/// Act four's sizes over `ranks` ranks: [`ROWS_PER_RANK`] rows each, `256 → 128 → 32`,
/// so a step on four logical devices takes well under a second on lavapipe.
pub fn data_parallel_shape(ranks: usize) -> Shape {
    Shape {
        batch: ROWS_PER_RANK * ranks.max(1),
        input: 256,
        hidden: 128,
        output: 32,
    }
}

/// Act four's learning rate.
pub const LEARNING_RATE: f32 = 0.5;

/// The rank act four fails: rank 2, or the last one in a smaller group.
pub fn faulted_rank(ranks: usize) -> usize {
    2.min(ranks.saturating_sub(1))
}

/// How one rank's view of a failed step reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failed {
    /// The rank its all-reduce call named as the one whose input failed.
    pub all_reduce_names: Option<usize>,
    /// The rank a read of its all-reduced gradient names.
    pub gradient_names: Option<usize>,
    /// The root cause that read gives for that rank's input.
    pub root: Option<String>,
    /// The kernels the named rank's chain walks, from its gradient back to the root.
    pub chain: Vec<String>,
    /// Whether its update was skipped: the new weights carry the failure, first hop `sgd`.
    pub update_skipped: bool,
}

impl Failed {
    fn of(step: &RankStep) -> Self {
        let all_reduce_names = step
            .all_reduce
            .as_ref()
            .err()
            .and_then(input_failed)
            .map(|(rank, _)| rank);
        let read = step.gradient.as_ref().err();
        let named = read.and_then(input_failed);
        let (root, chain) = match named {
            Some((_, cause)) => (
                Some(cause.root().to_string()),
                cause
                    .unwritten()
                    .first()
                    .map(|entry| {
                        entry
                            .chain
                            .hops
                            .iter()
                            .map(|h| h.kernel.to_string())
                            .collect()
                    })
                    .unwrap_or_default(),
            ),
            None => (None, Vec::new()),
        };
        let update_skipped = step.update.as_ref().err().is_some_and(|e| {
            input_failed(e).is_some()
                && e.unwritten()
                    .first()
                    .and_then(|entry| entry.chain.hops.first())
                    .is_some_and(|hop| &*hop.kernel == UPDATE)
        });
        Self {
            all_reduce_names,
            gradient_names: named.map(|(rank, _)| rank),
            root,
            chain,
            update_skipped,
        }
    }
}

/// Lose `client`'s device by a sticky fault (`DEVICE_LOST`) at its next call: the loss every
/// backend can show. Returns what it did and `false`; [`Error::Internal`] if none was lost.
pub fn inject_loss<B: Backend>(client: &scope_core::Client<B>) -> Result<(String, bool)> {
    client.inject(FaultPlan::new().poison_at(1, "injected", "DEVICE_LOST"));
    let _ = client.allocate(4);
    if client.poison().is_none() {
        return Err(Error::internal(
            "an injected loss did not poison the device",
        ));
    }
    Ok((
        "a sticky fault (DEVICE_LOST) injected at its next device call".to_owned(),
        false,
    ))
}

/// Act four: data-parallel steps on several devices, one with a fault on one rank.
#[derive(Debug)]
pub struct DataParallelReport {
    /// How many ranks (devices).
    pub ranks: usize,
    /// The whole batch's sizes.
    pub shape: Shape,
    /// The learning rate.
    pub lr: f32,
    /// Bytes each rank's all-reduce moves.
    pub gradient_bytes: u64,
    /// Compiling the step's kernels on every device.
    pub compile: Duration,
    /// Every rank read back the initial weights exactly.
    pub loaded: bool,
    /// The rank whose backward pass fails in the second step.
    pub faulted_rank: usize,
    /// The kernel that fails there.
    pub faulted_kernel: &'static str,
    /// The first, clean step.
    pub clean: StepCheck,
    /// The step with the fault.
    pub faulted: StepCheck,
    /// How each rank saw the faulted step.
    pub failed: Vec<Failed>,
    /// The step after it.
    pub recovered: StepCheck,
    /// Failures each device still holds after the last step.
    pub failures_held: Vec<usize>,
    /// Then rank [`faulted_rank`]'s device is lost and comes back: what stopped it, if any.
    pub survival: Result<Survival>,
}

impl DataParallelReport {
    /// The faulted step did what it should: every rank names the faulted rank and its
    /// root cause, no update ran, and the weights read back unchanged and identical.
    pub fn fault_contained(&self) -> bool {
        let f = &self.faulted;
        self.failed.iter().all(|r| {
            r.all_reduce_names == Some(self.faulted_rank)
                && r.gradient_names == Some(self.faulted_rank)
                && r.root
                    .as_deref()
                    .is_some_and(|root| root.contains("INJECTED_LAUNCH_FAILURE"))
                && r.update_skipped
        }) && f.updated == 0
            && f.weights_identical
            && f.weights_error == 0.0
            && f.weights_change == 0.0
            && f.loss_error() <= f64::from(TOLERANCE)
    }

    /// Every check of the act passed.
    pub fn passed(&self) -> bool {
        self.loaded
            && self.clean.clean()
            && self.fault_contained()
            && self.recovered.clean()
            && self.failures_held.iter().all(|&n| n == 0)
            && self.survival.as_ref().is_ok_and(Survival::passed)
    }
}

/// One clean step with `bf16` gradients, checked against the CPU's `f32` step within
/// [`data_parallel::bf16_bound`].
#[derive(Debug)]
pub struct Bf16Step {
    /// The step, as act four checks one.
    pub check: StepCheck,
    /// How far the gradient may be from the CPU's, beside [`TOLERANCE`].
    pub gradient_bound: f32,
    /// How far the weights may be, `lr` times that.
    pub weights_bound: f32,
    /// Bytes each rank's all-reduce moved, half the `f32` gradient's.
    pub bytes: u64,
}

impl Bf16Step {
    /// Same bits everywhere, every update written, and within the bounds.
    pub fn passed(&self) -> bool {
        let c = &self.check;
        c.gradients_identical
            && c.weights_identical
            && c.updated == c.ranks.len()
            && c.gradient_error <= self.gradient_bound + TOLERANCE
            && c.weights_error <= self.weights_bound + TOLERANCE
            && c.loss_error() <= f64::from(TOLERANCE)
    }
}

/// One step of [`data_parallel()`]'s group with its gradients all-reduced in `bf16`
/// ([`DataParallel::in_bf16`]). Fails on a device error, or an uneven batch.
pub fn bf16_step<B: Backend>(
    runtimes: Vec<Runtime<B>>,
    (shape, lr, seed): (Shape, f32, u64),
) -> Result<Bf16Step> {
    let weights = Weights::random(shape, seed);
    let x = weights.input(seed + 1);
    let targets = data_parallel::targets(shape, seed + 2);
    let dp = DataParallel::new(runtimes, &weights, lr)?.in_bf16()?;
    dp.compile()?;
    dp.load(&x, &targets)?;
    let reference = reference_step(&weights, &x, &targets, lr);
    let (steps, time) = dp.step(None);
    let largest = [
        &reference.gradient.w1,
        &reference.gradient.b1,
        &reference.gradient.w2,
        &reference.gradient.b2,
    ]
    .into_iter()
    .flatten()
    .fold(0f32, |m, g| m.max(g.abs()));
    let gradient_bound = data_parallel::bf16_bound(largest);
    Ok(Bf16Step {
        check: StepCheck::new(steps, time, &weights, &reference, true),
        gradient_bound,
        weights_bound: lr * gradient_bound,
        bytes: dp.gradient_bytes(),
    })
}

/// Run act four on `runtimes`: three SGD steps, each checked against the CPU's, the second
/// failing rank [`faulted_rank`]'s `loss.grad`. Then that rank's device is lost with `lose`
/// and the group survives it. Fails on a device error outside the steps, or an uneven batch.
pub fn data_parallel<B: Backend>(
    runtimes: Vec<Runtime<B>>,
    (shape, lr, seed): (Shape, f32, u64),
    lose: Lose<'_, B>,
) -> Result<DataParallelReport> {
    let ranks = runtimes.len();
    let weights = Weights::random(shape, seed);
    let x = weights.input(seed + 1);
    let targets = data_parallel::targets(shape, seed + 2);
    let mut dp = DataParallel::new(runtimes, &weights, lr)?;
    let start = Instant::now();
    dp.compile()?;
    let compile = start.elapsed();
    dp.load(&x, &targets)?;
    let loaded = (0..ranks).all(|r| dp.weights(r).is_ok_and(|w| identical(&w, &weights)));

    let first = reference_step(&weights, &x, &targets, lr);
    let (steps, time) = dp.step(None);
    let clean = StepCheck::new(steps, time, &weights, &first, true);
    let after_clean = dp.weights(0)?;

    let faulted_rank = faulted_rank(ranks);
    let faulted_kernel = BACKWARD[0];
    let injection = Injection {
        rank: faulted_rank,
        launch: 1,
        error: injected_fault_in(
            B::NAME,
            &format!("`{faulted_kernel}` on rank {faulted_rank}"),
        ),
    };
    // The failed step changes nothing, so the CPU's next step starts from the first's.
    let second = reference_step(&first.next, &x, &targets, lr);
    let (steps, time) = dp.step(Some(&injection));
    let failed = steps.iter().map(Failed::of).collect();
    let faulted = StepCheck::new(steps, time, &after_clean, &second, false);
    let before = dp.weights(0)?;

    let (steps, time) = dp.step(None);
    let recovered = StepCheck::new(steps, time, &before, &second, true);
    let failures_held = dp.failures_held();
    let survival = survival::survive(
        &mut dp,
        (&x, &targets, lr),
        &second.next,
        (faulted_rank, lose),
    );
    Ok(DataParallelReport {
        ranks,
        shape,
        lr,
        gradient_bytes: dp.gradient_bytes(),
        compile,
        loaded,
        faulted_rank,
        faulted_kernel,
        clean,
        faulted,
        failed,
        recovered,
        failures_held,
        survival,
    })
}
