//! A 2-layer MLP: `softmax(gelu(x·W1 + b1)·W2 + b2)`, and its CPU reference.
//!
//! Every intermediate has its own tensor, allocated once with the model, so
//! a pass allocates nothing, a captured pass replays into the same memory,
//! and a failure's chain has a distinct buffer for every hop:
//!
//! ```text
//! x ─layer1.matmul→ h1 ─layer1.bias_add→ h2 ─layer1.gelu→ a1
//!   ─layer2.matmul→ h3 ─layer2.bias_add→ h4 ─layer2.softmax→ probs
//! ```

use scope_core::{Backend, Result};

use crate::runtime::{Runtime, Tensor};

/// The model's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Rows of the input: the batch.
    pub batch: usize,
    /// Input features.
    pub input: usize,
    /// Hidden units.
    pub hidden: usize,
    /// Output classes.
    pub output: usize,
}

impl Shape {
    /// The demo's size: about a second a pass on lavapipe with two cores.
    pub const DEMO: Shape = Shape {
        batch: 512,
        input: 1024,
        hidden: 1024,
        output: 256,
    };

    /// A size for tests: quick in debug, and no multiple of a tile or group size.
    pub const TEST: Shape = Shape {
        batch: 37,
        input: 70,
        hidden: 45,
        output: 19,
    };

    /// Multiply-adds a pass makes, times two: its FLOPs.
    pub fn flops(&self) -> f64 {
        2.0 * self.batch as f64 * (self.input * self.hidden + self.hidden * self.output) as f64
    }
}

/// SplitMix64: deterministic, so results compare across runs and backends, without `rand`.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next value, uniform in `[-1, 1)`.
    pub fn next_f32(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `len` values scaled by `scale`.
    pub fn vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.next_f32() * scale).collect()
    }
}

/// The weights, on the host.
#[derive(Clone, Debug)]
pub struct Weights {
    /// The sizes.
    pub shape: Shape,
    /// `input × hidden`.
    pub w1: Vec<f32>,
    /// `hidden`.
    pub b1: Vec<f32>,
    /// `hidden × output`.
    pub w2: Vec<f32>,
    /// `output`.
    pub b2: Vec<f32>,
}

impl Weights {
    /// Random weights scaled by `1/sqrt(fan-in)`, so the softmax is not saturated.
    pub fn random(shape: Shape, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let s1 = 1.0 / (shape.input as f32).sqrt();
        let s2 = 1.0 / (shape.hidden as f32).sqrt();
        Self {
            shape,
            w1: rng.vec(shape.input * shape.hidden, s1),
            b1: rng.vec(shape.hidden, 0.1),
            w2: rng.vec(shape.hidden * shape.output, s2),
            b2: rng.vec(shape.output, 0.1),
        }
    }

    /// A random `batch × input` input.
    pub fn input(&self, seed: u64) -> Vec<f32> {
        Rng::new(seed).vec(self.shape.batch * self.shape.input, 1.0)
    }

    /// The forward pass on the CPU with `f64` accumulation: the reference.
    pub fn reference(&self, x: &[f32]) -> Vec<f32> {
        let s = self.shape;
        let h = matmul(x, &self.w1, s.batch, s.input, s.hidden);
        let a: Vec<f32> = h
            .iter()
            .enumerate()
            .map(|(i, v)| gelu(v + self.b1[i % s.hidden]))
            .collect();
        let logits = matmul(&a, &self.w2, s.batch, s.hidden, s.output);
        let mut out = vec![0.0; s.batch * s.output];
        for (row, chunk) in logits.chunks_exact(s.output).enumerate() {
            let z: Vec<f32> = chunk.iter().zip(&self.b2).map(|(v, b)| v + b).collect();
            out[row * s.output..(row + 1) * s.output].copy_from_slice(&softmax(&z));
        }
        out
    }
}

/// `a[m×k] · b[k×n]` on the CPU, rows split across the machine's threads.
pub fn matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0.0f32; m * n];
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(m.max(1));
    let rows_each = m.div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        for (block, out) in c.chunks_mut(rows_each * n).enumerate() {
            scope.spawn(move || {
                let mut acc = vec![0.0f64; n];
                for (r, out_row) in out.chunks_exact_mut(n).enumerate() {
                    let row = block * rows_each + r;
                    acc.fill(0.0);
                    for (p, &av) in a[row * k..(row + 1) * k].iter().enumerate() {
                        let av = f64::from(av);
                        for (slot, &bv) in acc.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                            *slot += av * f64::from(bv);
                        }
                    }
                    for (o, v) in out_row.iter_mut().zip(&acc) {
                        *o = *v as f32;
                    }
                }
            });
        }
    });
    c
}

/// GELU, the tanh approximation the kernels use.
pub fn gelu(v: f32) -> f32 {
    let v = f64::from(v);
    let t = (0.797_884_560_8 * (v + 0.044_715 * v * v * v)).clamp(-15.0, 15.0);
    (0.5 * v * (1.0 + t.tanh())) as f32
}

/// The derivative of [`gelu`] at `v` (same approximation, same clamp).
pub fn gelu_grad(v: f32) -> f32 {
    let v = f64::from(v);
    let t = (0.797_884_560_8 * (v + 0.044_715 * v * v * v))
        .clamp(-15.0, 15.0)
        .tanh();
    let du = 0.797_884_560_8 * (1.0 + 3.0 * 0.044_715 * v * v);
    (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du) as f32
}

/// Softmax of one row.
pub fn softmax(row: &[f32]) -> Vec<f32> {
    let top = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f64> = row.iter().map(|v| f64::from(v - top).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.iter().map(|e| (e / sum) as f32).collect()
}

/// The largest absolute difference between two results.
pub fn max_error(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            if x.is_nan() || y.is_nan() {
                f32::INFINITY
            } else {
                (x - y).abs()
            }
        })
        .fold(0.0, f32::max)
}

/// The model on a device: weights, input and every intermediate.
#[derive(Clone, Debug)]
pub struct Mlp {
    /// The sizes.
    pub shape: Shape,
    /// `batch × input`: write a new input here between passes.
    pub x: Tensor,
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
    h1: Tensor,
    h2: Tensor,
    a1: Tensor,
    h3: Tensor,
    h4: Tensor,
    /// `batch × output`: the class probabilities a pass writes.
    pub probs: Tensor,
}

impl Mlp {
    /// Upload `weights` and `x`, and allocate the intermediates.
    /// Fails when a device runs out of memory or fails to write.
    pub fn new<B: Backend>(rt: &Runtime<B>, weights: &Weights, x: &[f32]) -> Result<Self> {
        let s = weights.shape;
        Ok(Self {
            shape: s,
            x: rt.upload(s.batch, s.input, x)?,
            w1: rt.upload(s.input, s.hidden, &weights.w1)?,
            b1: rt.upload(1, s.hidden, &weights.b1)?,
            w2: rt.upload(s.hidden, s.output, &weights.w2)?,
            b2: rt.upload(1, s.output, &weights.b2)?,
            h1: rt.empty(s.batch, s.hidden)?,
            h2: rt.empty(s.batch, s.hidden)?,
            a1: rt.empty(s.batch, s.hidden)?,
            h3: rt.empty(s.batch, s.output)?,
            h4: rt.empty(s.batch, s.output)?,
            probs: rt.empty(s.batch, s.output)?,
        })
    }

    /// Issue one forward pass of six launches, never waiting; read [`probs`](Self::probs).
    /// Fails only on a rejected launch; a device failure is carried to `probs`.
    pub fn forward<B: Backend>(&self, rt: &Runtime<B>) -> Result<()> {
        rt.matmul("layer1.matmul", &self.x, &self.w1, &self.h1)?;
        rt.bias_add("layer1.bias_add", &self.h1, &self.b1, &self.h2)?;
        rt.gelu("layer1.gelu", &self.h2, &self.a1)?;
        rt.matmul("layer2.matmul", &self.a1, &self.w2, &self.h3)?;
        rt.bias_add("layer2.bias_add", &self.h3, &self.b2, &self.h4)?;
        rt.softmax("layer2.softmax", &self.h4, &self.probs)
    }

    /// The kernel names of a pass, in issue order.
    pub const KERNELS: [&'static str; 6] = [
        "layer1.matmul",
        "layer1.bias_add",
        "layer1.gelu",
        "layer2.matmul",
        "layer2.bias_add",
        "layer2.softmax",
    ];
}
