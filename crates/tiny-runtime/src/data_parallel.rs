//! A data-parallel training step over a group of devices, and its CPU reference.
//!
//! Each rank of a [`scope_core::collective::Group`] holds the same weights
//! and its own shard of the batch. A step on every rank is:
//!
//! ```text
//! forward(shard) → backward → gradients ─all_reduce(Mean, F32)→ reduced ─sgd→ next weights
//! ```
//!
//! Three choices leave every rank's weights as they were, identical and
//! readable, after a failure on one rank:
//!
//! - **One buffer of gradients, one collective.** A failure anywhere in any
//!   rank's backward pass fails the whole reduced gradient on every rank
//!   (rule 41), never some parameters' and not others'.
//! - **The update writes new memory.** `sgd` writes the other of two weight
//!   buffers, so a skipped update leaves its failure there (rules 17–18).
//!   In place, it would leave the weights themselves failed.
//! - **A rank commits only bytes that were written.** It waits on the new
//!   weights and makes them current only on success: the bytes say.
//!
//! A rank whose own work was refused claims its gradient with that error,
//! so its peers never reduce last step's gradient as this one's.
//!
//! [`DataParallel::in_bf16`] packs the gradient into `bf16` before the
//! all-reduce and unpacks the result, half the bytes on the link; a failure
//! travels through both kernels as through any other.

use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use scope_core::collective::{CollectiveError, DEFAULT_DEADLINE, Element, Group, Rank, Reduce};
use scope_core::{Backend, Error, FaultPlan, Result, Site};

use crate::mlp::{Rng, Shape, Weights, gelu, gelu_grad, matmul, softmax};
use crate::runtime::{Runtime, Tensor};

/// The backward pass's kernels, in issue order: launch `n` (from 1) is `BACKWARD[n - 1]`.
pub const BACKWARD: [&str; 10] = [
    "loss.grad",
    "layer2.transpose_a1",
    "layer2.weight_grad",
    "layer2.bias_grad",
    "layer2.transpose_w2",
    "layer2.input_grad",
    "layer1.gelu_grad",
    "layer1.transpose_x",
    "layer1.weight_grad",
    "layer1.bias_grad",
];

/// The update's kernel.
pub const UPDATE: &str = "sgd";

/// The kernels around a `bf16` all-reduce: the gradient packed, the reduced one unpacked.
pub const BF16: [&str; 2] = ["gradient.to_bf16", "reduced.from_bf16"];

/// The model's parameters (or a gradient of them) in one buffer.
#[derive(Clone, Debug)]
pub struct Params {
    /// All of it, as a `1 × n` tensor.
    pub flat: Tensor,
    /// `input × hidden`.
    pub w1: Tensor,
    /// `1 × hidden`.
    pub b1: Tensor,
    /// `hidden × output`.
    pub w2: Tensor,
    /// `1 × output`.
    pub b2: Tensor,
}

impl Params {
    /// Zeroed parameters for `shape`, packed. Errors as [`Runtime::packed`].
    pub fn new<B: Backend>(rt: &Runtime<B>, shape: Shape) -> Result<Self> {
        let (flat, parts) = rt.packed(&[
            (shape.input, shape.hidden),
            (1, shape.hidden),
            (shape.hidden, shape.output),
            (1, shape.output),
        ])?;
        let [w1, b1, w2, b2] = <[Tensor; 4]>::try_from(parts)
            .map_err(|_| Error::internal("packed returned other than four tensors"))?;
        Ok(Self {
            flat,
            w1,
            b1,
            w2,
            b2,
        })
    }

    /// Write `weights` into them. Errors as [`Runtime::write`].
    pub fn write<B: Backend>(&self, rt: &Runtime<B>, weights: &Weights) -> Result<()> {
        rt.write(&self.w1, &weights.w1)?;
        rt.write(&self.b1, &weights.b1)?;
        rt.write(&self.w2, &weights.w2)?;
        rt.write(&self.b2, &weights.b2)
    }

    /// Read them back in one read: one error for a failure anywhere. Errors as [`Runtime::read`].
    pub fn read<B: Backend>(&self, rt: &Runtime<B>, shape: Shape) -> Result<Weights> {
        let all = rt.read(&self.flat)?;
        let part = |t: &Tensor| {
            let start = (t.offset() / 4) as usize;
            all[start..start + t.len()].to_vec()
        };
        Ok(Weights {
            shape,
            w1: part(&self.w1),
            b1: part(&self.b1),
            w2: part(&self.w2),
            b2: part(&self.b2),
        })
    }
}

/// One rank's model: two sets of weights, its shard, every intermediate and gradient.
#[derive(Debug)]
pub struct Replica<B: Backend> {
    rt: Runtime<B>,
    shard: Shape,
    weights: [Params; 2],
    current: usize,
    grads: Params,
    reduced: Params,
    /// With `bf16` gradients, the packed gradient and its all-reduced twin.
    packed: Option<[Tensor; 2]>,
    lr: Tensor,
    lr_host: f32,
    /// `1 × rows` of ones: a column sum is a matmul by it.
    ones: Tensor,
    x: Tensor,
    targets: Tensor,
    x_host: Vec<f32>,
    targets_host: Vec<f32>,
    h1: Tensor,
    h2: Tensor,
    a1: Tensor,
    h3: Tensor,
    h4: Tensor,
    probs: Tensor,
    dlogits: Tensor,
    a1_t: Tensor,
    w2_t: Tensor,
    da1: Tensor,
    dh2: Tensor,
    x_t: Tensor,
}

impl<B: Backend> Replica<B> {
    /// A replica of `weights` on `rt`, for shards of `shard.batch` rows, learning at
    /// `lr`. Fails when the device runs out of memory or fails to write.
    pub fn new(rt: Runtime<B>, shard: Shape, weights: &Weights, lr: f32) -> Result<Self> {
        let s = shard;
        let current = Params::new(&rt, s)?;
        current.write(&rt, weights)?;
        let next = Params::new(&rt, s)?;
        Ok(Self {
            grads: Params::new(&rt, s)?,
            reduced: Params::new(&rt, s)?,
            packed: None,
            lr: rt.upload(1, 1, &[lr])?,
            lr_host: lr,
            ones: rt.upload(1, s.batch, &vec![1.0; s.batch])?,
            x: rt.empty(s.batch, s.input)?,
            targets: rt.empty(s.batch, s.output)?,
            x_host: vec![0.0; s.batch * s.input],
            targets_host: vec![0.0; s.batch * s.output],
            h1: rt.empty(s.batch, s.hidden)?,
            h2: rt.empty(s.batch, s.hidden)?,
            a1: rt.empty(s.batch, s.hidden)?,
            h3: rt.empty(s.batch, s.output)?,
            h4: rt.empty(s.batch, s.output)?,
            probs: rt.empty(s.batch, s.output)?,
            dlogits: rt.empty(s.batch, s.output)?,
            a1_t: rt.empty(s.hidden, s.batch)?,
            w2_t: rt.empty(s.output, s.hidden)?,
            da1: rt.empty(s.batch, s.hidden)?,
            dh2: rt.empty(s.batch, s.hidden)?,
            x_t: rt.empty(s.input, s.batch)?,
            weights: [current, next],
            current: 0,
            shard,
            rt,
        })
    }

    /// Its runtime.
    pub fn runtime(&self) -> &Runtime<B> {
        &self.rt
    }

    /// Write this rank's shard: `x` and one-hot `targets`. Errors as [`Runtime::write`].
    pub fn load(&mut self, x: &[f32], targets: &[f32]) -> Result<()> {
        self.rt.write(&self.x, x)?;
        self.rt.write(&self.targets, targets)?;
        self.x_host = x.to_vec();
        self.targets_host = targets.to_vec();
        Ok(())
    }

    /// After its device came back (`Client::recover`), write again what only this rank
    /// knows and zero its packed buffers. No kernel writes their alignment gaps, but the
    /// all-reduce reads them, so a lost gap would fail every later step. Its weights come
    /// from a peer ([`Rank::heal`]). Errors as [`Runtime::write`].
    pub fn reload(&mut self) -> Result<()> {
        let rows = self.shard.batch;
        self.rt.write(&self.ones, &vec![1.0; rows])?;
        self.rt.write(&self.lr, &[self.lr_host])?;
        self.rt.write(&self.x, &self.x_host)?;
        self.rt.write(&self.targets, &self.targets_host)?;
        let next = &self.weights[1 - self.current];
        for packed in [&self.grads, &self.reduced, next] {
            self.rt.write(&packed.flat, &vec![0.0; packed.flat.len()])?;
        }
        Ok(())
    }

    /// Its current weights' buffer: what a heal writes.
    pub(crate) fn current_weights(&self) -> &Params {
        &self.weights[self.current]
    }

    /// The weights it holds now, read back. Errors as [`Params::read`].
    pub fn weights(&self) -> Result<Weights> {
        self.weights[self.current].read(&self.rt, self.shard)
    }

    /// Issue the forward pass on the current weights. Never waits.
    fn forward(&self) -> Result<()> {
        let (rt, w) = (&self.rt, &self.weights[self.current]);
        rt.matmul("layer1.matmul", &self.x, &w.w1, &self.h1)?;
        rt.bias_add("layer1.bias_add", &self.h1, &w.b1, &self.h2)?;
        rt.gelu("layer1.gelu", &self.h2, &self.a1)?;
        rt.matmul("layer2.matmul", &self.a1, &w.w2, &self.h3)?;
        rt.bias_add("layer2.bias_add", &self.h3, &w.b2, &self.h4)?;
        rt.softmax("layer2.softmax", &self.h4, &self.probs)
    }

    /// Issue the backward pass into `grads`, in [`BACKWARD`]'s order. Never waits.
    fn backward(&self) -> Result<()> {
        let (rt, w, g) = (&self.rt, &self.weights[self.current], &self.grads);
        rt.loss_grad(BACKWARD[0], &self.probs, &self.targets, &self.dlogits)?;
        rt.transpose(BACKWARD[1], &self.a1, &self.a1_t)?;
        rt.matmul(BACKWARD[2], &self.a1_t, &self.dlogits, &g.w2)?;
        rt.matmul(BACKWARD[3], &self.ones, &self.dlogits, &g.b2)?;
        rt.transpose(BACKWARD[4], &w.w2, &self.w2_t)?;
        rt.matmul(BACKWARD[5], &self.dlogits, &self.w2_t, &self.da1)?;
        rt.gelu_grad(BACKWARD[6], &self.h2, &self.da1, &self.dh2)?;
        rt.transpose(BACKWARD[7], &self.x, &self.x_t)?;
        rt.matmul(BACKWARD[8], &self.x_t, &self.dh2, &g.w1)?;
        rt.matmul(BACKWARD[9], &self.ones, &self.dh2, &g.b1)
    }

    fn loss(&self) -> Result<f64> {
        let probs = self.rt.read(&self.probs)?;
        Ok(cross_entropy(&probs, &self.targets_host, self.shard.batch))
    }

    /// Pack the gradient in `bf16` from now on: half the bytes through the all-reduce.
    fn pack_gradients(&mut self) -> Result<()> {
        let words = self.grads.flat.len().div_ceil(2);
        self.packed = Some([self.rt.empty(1, words)?, self.rt.empty(1, words)?]);
        Ok(())
    }

    /// The mean of every rank's gradient into `reduced`, in `f32` or through `bf16`.
    /// A pack or unpack refused claims what it would have written, so no rank
    /// reduces, or updates with, last step's bytes as this one's.
    fn all_reduce(&self, rank: &Rank<B>) -> Result<()> {
        let (grads, reduced) = (&self.grads.flat, &self.reduced.flat);
        let Some([grads16, reduced16]) = &self.packed else {
            return rank.all_reduce(grads.slice(), reduced.slice(), Element::F32, Reduce::Mean);
        };
        let client = self.rt.client();
        if let Err(refused) = self.rt.to_bf16(BF16[0], grads, grads16) {
            let _ = client.fail_writing(&[grads16.slice()], refused);
        }
        let all_reduce = rank.all_reduce(
            grads16.slice(),
            reduced16.slice(),
            Element::BF16,
            Reduce::Mean,
        );
        if let Err(refused) = self.rt.from_bf16(BF16[1], reduced16, reduced) {
            let _ = client.fail_writing(&[reduced.slice()], refused);
        }
        all_reduce
    }

    /// One step on this rank: forward, backward (under `inject`'s fault, if any), the
    /// all-reduce, the update into the other weights, and the commit if it wrote them.
    pub fn step(&mut self, rank: &Rank<B>, inject: Option<&Injection>) -> RankStep {
        let client = self.rt.client().clone();
        let issued = self.forward().and_then(|()| {
            if let Some(injection) = inject {
                // Finish the forward pass so the fault lands on the backward pass alone:
                // a fault claims every write in flight (docs/ERROR_MODEL.md).
                client.sync()?;
                client.inject(FaultPlan::new().fail(
                    Site::Launch,
                    injection.launch,
                    injection.error.clone(),
                ));
            }
            self.backward()
        });
        if inject.is_some() {
            client.inject(FaultPlan::new());
        }
        if let Err(refused) = issued {
            // Claim the gradient, or the collective would reduce last step's as this one's.
            let _ = client.fail_writing(&[self.grads.flat.slice()], refused);
        }
        let all_reduce = self.all_reduce(rank);
        let (cur, next) = (self.current, 1 - self.current);
        let weights = &self.weights;
        let update = self
            .rt
            .sgd(
                UPDATE,
                &weights[cur].flat,
                &self.reduced.flat,
                &self.lr,
                &weights[next].flat,
            )
            .inspect_err(|refused| {
                let _ = client.fail_writing(&[weights[next].flat.slice()], refused.clone());
            })
            .and_then(|()| client.sync_buffers(&[weights[next].flat.slice()]));
        if update.is_ok() {
            self.current = next;
        }
        RankStep {
            rank: rank.index(),
            loss: self.loss(),
            all_reduce,
            gradient: self.reduced.read(&self.rt, self.shard),
            update,
            weights: self.weights(),
        }
    }
}

/// A fault to install on one replica's client for its backward pass.
#[derive(Clone, Debug)]
pub struct Injection {
    /// The replica (its rank, while every replica is a member).
    pub rank: usize,
    /// Which launch of the backward pass fails, from 1 ([`BACKWARD`]).
    pub launch: u64,
    /// What it fails with.
    pub error: Error,
}

/// What one rank saw of a step.
#[derive(Debug)]
pub struct RankStep {
    /// The rank.
    pub rank: usize,
    /// Its shard's mean cross-entropy before the update.
    pub loss: Result<f64>,
    /// What its all-reduce call returned.
    pub all_reduce: Result<()>,
    /// Its all-reduced gradient, read back in one read, as a user would see it.
    pub gradient: Result<Weights>,
    /// The update's output, waited for: an error when it was skipped or failed.
    pub update: Result<()>,
    /// The weights it holds after the step, read back.
    pub weights: Result<Weights>,
}

/// A group of replicas, one per device.
///
/// Members may change ([`crate::elastic`]): a lost rank is left out and admitted back
/// once it recovers. A replica keeps its index and its shard through every change.
#[derive(Debug)]
pub struct DataParallel<B: Backend> {
    pub(crate) group: Group<B>,
    /// By rank of the current group, the replica it is.
    pub(crate) members: Vec<usize>,
    replicas: Vec<Mutex<Replica<B>>>,
    shape: Shape,
}

impl<B: Backend> DataParallel<B> {
    /// A replica of `weights` on each runtime (rank `i` on `runtimes[i]`), for batches
    /// of `weights.shape` rows split evenly, learning at `lr`. Fails with
    /// [`Error::InvalidArgument`] for no runtimes, an uneven batch or two runtimes on
    /// one server, and when a device runs out of memory.
    pub fn new(runtimes: Vec<Runtime<B>>, weights: &Weights, lr: f32) -> Result<Self> {
        let ranks = runtimes.len();
        let shape = weights.shape;
        if ranks == 0 || !shape.batch.is_multiple_of(ranks) {
            return Err(Error::invalid(
                "data-parallel group",
                format!("a batch of {} rows over {ranks} ranks", shape.batch),
            ));
        }
        let group = Group::new(
            runtimes.iter().map(|rt| rt.client().clone()).collect(),
            DEFAULT_DEADLINE,
        )?;
        let shard = Shape {
            batch: shape.batch / ranks,
            ..shape
        };
        let replicas = runtimes
            .into_iter()
            .map(|rt| Replica::new(rt, shard, weights, lr).map(Mutex::new))
            .collect::<Result<_>>()?;
        Ok(Self {
            group,
            members: (0..ranks).collect(),
            replicas,
            shape,
        })
    }

    /// All-reduce the gradients in `bf16` from now on, rounded to nearest even
    /// before and after the round (rule 45): half the bytes on the link, within
    /// [`bf16_bound`] of the `f32` step. Fails when a device runs out of memory.
    pub fn in_bf16(self) -> Result<Self> {
        for replica in &self.replicas {
            replica.lock().pack_gradients()?;
        }
        Ok(self)
    }

    /// How many replicas (ranks, when every one is a member).
    pub fn ranks(&self) -> usize {
        self.replicas.len()
    }

    /// The current group's members, by rank: the replica each rank is.
    pub fn members(&self) -> &[usize] {
        &self.members
    }

    /// The whole batch's sizes.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// Bytes each rank's all-reduce moves: its gradient buffer, or the packed one.
    pub fn gradient_bytes(&self) -> u64 {
        let replica = self.replica(0);
        match &replica.packed {
            Some([packed, _]) => packed.len() as u64 * 4,
            None => replica.grads.flat.slice().buffer.size(),
        }
    }

    pub(crate) fn replica(&self, index: usize) -> MutexGuard<'_, Replica<B>> {
        self.replicas[index].lock()
    }

    /// Compile every kernel a step launches, on every rank at once; the first error wins.
    pub fn compile(&self) -> Result<()> {
        self.group
            .run(|rank| self.replica(rank.index()).rt.compile_training())
            .into_iter()
            .collect()
    }

    /// Give each rank its rows of `x` and one-hot `targets`, in rank order.
    /// Fails on lengths other than the batch's, or a device failing to write.
    pub fn load(&self, x: &[f32], targets: &[f32]) -> Result<()> {
        let s = self.shape;
        if x.len() != s.batch * s.input || targets.len() != s.batch * s.output {
            return Err(Error::invalid(
                "batch",
                format!(
                    "{} inputs and {} targets for a batch of {} × {} → {}",
                    x.len(),
                    targets.len(),
                    s.batch,
                    s.input,
                    s.output
                ),
            ));
        }
        let rows = s.batch / self.ranks();
        for rank in 0..self.ranks() {
            let (xs, ts) = (rows * s.input, rows * s.output);
            self.replica(rank).load(
                &x[rank * xs..(rank + 1) * xs],
                &targets[rank * ts..(rank + 1) * ts],
            )?;
        }
        Ok(())
    }

    /// One step on every member, each on its own thread: what each saw, and the time.
    pub fn step(&self, inject: Option<&Injection>) -> (Vec<RankStep>, Duration) {
        let start = Instant::now();
        let steps = self.group.run(|rank| {
            let i = self.members[rank.index()];
            let fault = inject.filter(|f| f.rank == i);
            self.replica(i).step(&rank, fault)
        });
        (steps, start.elapsed())
    }

    /// The weights replica `replica` holds now, read back. Errors as
    /// [`Params::read`], or [`Error::InvalidArgument`] for a replica it lacks.
    pub fn weights(&self, replica: usize) -> Result<Weights> {
        self.ensure_replica("weights", replica)?;
        self.replica(replica).weights()
    }

    /// Refuse a replica index this runtime lacks, naming the call: never a panic.
    pub(crate) fn ensure_replica(&self, call: &'static str, index: usize) -> Result<()> {
        if index < self.ranks() {
            return Ok(());
        }
        Err(Error::invalid(
            call,
            format!(
                "there is no replica {index}: the runtime has {}",
                self.ranks()
            ),
        ))
    }

    /// Each rank's count of failures its device still holds.
    pub fn failures_held(&self) -> Vec<usize> {
        (0..self.ranks())
            .map(|r| self.replica(r).rt.client().failures_held())
            .collect()
    }
}

/// How far `bf16` gradients may move a reduced gradient from its `f32` value, for
/// gradients no larger than `largest`: each rank's rounds once (2⁻⁹ relative), their
/// mean is within rule 45's bound of its exact value, and rounds once more. 2⁻⁷
/// relative covers all three; a weight moves `lr` times as far.
pub fn bf16_bound(largest: f32) -> f32 {
    largest * 2f32.powi(-7)
}

/// The rank whose input failed a collective, and its read's answer, if `error` says so.
pub fn input_failed(error: &Error) -> Option<(usize, &Error)> {
    match error.root() {
        Error::Collective(c) => match &**c {
            CollectiveError::InputFailed { rank, cause, .. } => Some((*rank, cause)),
            _ => None,
        },
        _ => None,
    }
}

/// One-hot targets for `shape.batch` rows of `shape.output` classes.
pub fn targets(shape: Shape, seed: u64) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut out = vec![0.0; shape.batch * shape.output];
    for row in out.chunks_exact_mut(shape.output) {
        let unit = (rng.next_f32() + 1.0) / 2.0;
        let class = ((unit * shape.output as f32) as usize).min(shape.output - 1);
        row[class] = 1.0;
    }
    out
}

/// The mean cross-entropy of `rows` rows of probabilities against one-hot targets.
pub fn cross_entropy(probs: &[f32], targets: &[f32], rows: usize) -> f64 {
    let total: f64 = probs
        .iter()
        .zip(targets)
        .filter(|(_, t)| **t != 0.0)
        .map(|(p, t)| -f64::from(*t) * f64::from(p.max(f32::MIN_POSITIVE)).ln())
        .sum();
    total / rows.max(1) as f64
}

/// A training step on the CPU over the whole batch at once.
#[derive(Clone, Debug)]
pub struct ReferenceStep {
    /// The mean cross-entropy before the update.
    pub loss: f64,
    /// The gradient of that loss.
    pub gradient: Weights,
    /// The weights after the update.
    pub next: Weights,
}

fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; a.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = a[r * cols + c];
        }
    }
    out
}

fn column_sums(a: &[f32], cols: usize) -> Vec<f32> {
    let mut sums = vec![0.0f64; cols];
    for row in a.chunks_exact(cols) {
        for (s, v) in sums.iter_mut().zip(row) {
            *s += f64::from(*v);
        }
    }
    sums.into_iter().map(|s| s as f32).collect()
}

/// The group's step on the CPU over the whole batch: forward, the mean cross-entropy's
/// gradient, and SGD at `lr`. Sums accumulate in `f64`.
pub fn reference_step(weights: &Weights, x: &[f32], targets: &[f32], lr: f32) -> ReferenceStep {
    let s = weights.shape;
    let h1 = matmul(x, &weights.w1, s.batch, s.input, s.hidden);
    let h2: Vec<f32> = h1
        .iter()
        .enumerate()
        .map(|(i, v)| v + weights.b1[i % s.hidden])
        .collect();
    let a1: Vec<f32> = h2.iter().copied().map(gelu).collect();
    let h3 = matmul(&a1, &weights.w2, s.batch, s.hidden, s.output);
    let probs: Vec<f32> = h3
        .chunks_exact(s.output)
        .flat_map(|row| {
            let z: Vec<f32> = row.iter().zip(&weights.b2).map(|(v, b)| v + b).collect();
            softmax(&z)
        })
        .collect();
    let loss = cross_entropy(&probs, targets, s.batch);
    let dlogits: Vec<f32> = probs
        .iter()
        .zip(targets)
        .map(|(p, t)| ((f64::from(*p) - f64::from(*t)) / s.batch as f64) as f32)
        .collect();
    let gw2 = matmul(
        &transpose(&a1, s.batch, s.hidden),
        &dlogits,
        s.hidden,
        s.batch,
        s.output,
    );
    let gb2 = column_sums(&dlogits, s.output);
    let da1 = matmul(
        &dlogits,
        &transpose(&weights.w2, s.hidden, s.output),
        s.batch,
        s.output,
        s.hidden,
    );
    let dh2: Vec<f32> = da1
        .iter()
        .zip(&h2)
        .map(|(d, h)| d * gelu_grad(*h))
        .collect();
    let gw1 = matmul(
        &transpose(x, s.batch, s.input),
        &dh2,
        s.input,
        s.batch,
        s.hidden,
    );
    let gb1 = column_sums(&dh2, s.hidden);
    let gradient = Weights {
        shape: s,
        w1: gw1,
        b1: gb1,
        w2: gw2,
        b2: gb2,
    };
    let sgd =
        |w: &[f32], g: &[f32]| -> Vec<f32> { w.iter().zip(g).map(|(w, g)| w - lr * g).collect() };
    let next = Weights {
        shape: s,
        w1: sgd(&weights.w1, &gradient.w1),
        b1: sgd(&weights.b1, &gradient.b1),
        w2: sgd(&weights.w2, &gradient.w2),
        b2: sgd(&weights.b2, &gradient.b2),
    };
    ReferenceStep {
        loss,
        gradient,
        next,
    }
}

/// The largest absolute difference between two sets of weights; infinite for other shapes.
pub fn max_difference(a: &Weights, b: &Weights) -> f32 {
    [
        (&a.w1, &b.w1),
        (&a.b1, &b.b1),
        (&a.w2, &b.w2),
        (&a.b2, &b.b2),
    ]
    .into_iter()
    .map(|(x, y)| crate::mlp::max_error(x, y))
    .fold(0.0, f32::max)
}

/// Whether two sets of weights are the same bits (their batch sizes aside).
pub fn identical(a: &Weights, b: &Weights) -> bool {
    let bits = |w: &Weights| -> Vec<u32> {
        [&w.w1, &w.b1, &w.w2, &w.b2]
            .into_iter()
            .flatten()
            .map(|v| v.to_bits())
            .collect()
    };
    let dims = |w: &Weights| (w.shape.input, w.shape.hidden, w.shape.output);
    dims(a) == dims(b) && bits(a) == bits(b)
}
