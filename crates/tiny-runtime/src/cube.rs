//! The runtime's operations written once, as `#[cube(launch)]` functions,
//! translated for whichever server the runtime runs on.
//!
//! These are the default kernels; [`crate::kernels`] keeps the native path.
//! Each reads like its native twin, with the same work per invocation and the
//! same dispatch, so the forward-pass time compares compilers, not algorithms.
//!
//! A [`Tensor`](crate::Tensor) goes in as its `f32`s plus `rows` and `cols`;
//! [`scope_cube::Args`] packs the scalars into the contract's scalar blob.
//! Kernels are compiled bounds-checked ([`scope_cube::Target::settings`]), so
//! an index the guards miss touches no other buffer and a failure stays with
//! its bytes. The checks cost little: on lavapipe the checked cube pass took
//! 0.95–1.03 s as SPIR-V, the unchecked native one 1.11–1.18 s.
//!
//! The matmul keeps the native shape, with no shared memory: on lavapipe a
//! workgroup barrier switches every invocation's coroutine, and tiling ran 4× slower.

// The `#[cube]` macro expands each kernel into a module of generated items.
#![allow(missing_docs, clippy::all)]

use scope_core::Result;
use scope_cube::cubecl_core as cubecl;
use scope_cube::{CubeKernel, Target, translate};

use cubecl::prelude::*;

use crate::kernels::{GROUP, ROWS};

/// `c[m×n] = a[m×k] · b[k×n]`, row-major. A cube is [`GROUP`] units across
/// columns; cube `y` owns rows `4y .. 4y + 4` (`ROWS` = 4).
#[cube(launch)]
pub fn matmul(a: &[f32], b: &[f32], c: &mut [f32], m: u32, n: u32, k: u32) {
    let col = ABSOLUTE_POS_X;
    let row0 = CUBE_POS_Y * 4u32;
    if col < n && row0 < m {
        // Rows past the end repeat the last one, so the loop needs no branch.
        let r1 = min(row0 + 1u32, m - 1u32);
        let r2 = min(row0 + 2u32, m - 1u32);
        let r3 = min(row0 + 3u32, m - 1u32);
        let mut acc0 = 0.0f32;
        let mut acc1 = 0.0f32;
        let mut acc2 = 0.0f32;
        let mut acc3 = 0.0f32;
        for i in 0..k {
            let bv = b[(i * n + col) as usize];
            acc0 += a[(row0 * k + i) as usize] * bv;
            acc1 += a[(r1 * k + i) as usize] * bv;
            acc2 += a[(r2 * k + i) as usize] * bv;
            acc3 += a[(r3 * k + i) as usize] * bv;
        }
        c[(row0 * n + col) as usize] = acc0;
        if row0 + 1u32 < m {
            c[((row0 + 1u32) * n + col) as usize] = acc1;
        }
        if row0 + 2u32 < m {
            c[((row0 + 2u32) * n + col) as usize] = acc2;
        }
        if row0 + 3u32 < m {
            c[((row0 + 3u32) * n + col) as usize] = acc3;
        }
    }
}

/// `out = x + bias`, `bias` one row broadcast down `rows × cols`. One unit an element.
#[cube(launch)]
pub fn bias_add(x: &[f32], bias: &[f32], out: &mut [f32], rows: u32, cols: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < rows * cols {
        out[ABSOLUTE_POS] = x[ABSOLUTE_POS] + bias[(i % cols) as usize];
    }
}

/// `out = gelu(x)` over `rows × cols`: the tanh approximation the native WGSL uses,
/// clamped so no `tanh` sees overflowing exponentials.
#[cube(launch)]
pub fn gelu(x: &[f32], out: &mut [f32], rows: u32, cols: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < rows * cols {
        let v = x[ABSOLUTE_POS];
        let t = clamp(
            0.7978845608f32 * (v + 0.044715f32 * v * v * v),
            -15.0f32,
            15.0f32,
        );
        out[ABSOLUTE_POS] = 0.5f32 * v * (1.0f32 + f32::tanh(t));
    }
}

/// Row-wise softmax of `x` (`rows × cols`), one unit a row.
///
/// `out` is only written, so the last pass computes the exponentials again. A
/// kernel that read `out` would be skipped while a failure claimed it, instead of
/// healing it. cubecl's access analysis cannot tell a read of the unit's own
/// write from a read of old contents.
#[cube(launch)]
pub fn softmax(x: &[f32], out: &mut [f32], rows: u32, cols: u32) {
    let row = ABSOLUTE_POS as u32;
    if row < rows {
        let base = row * cols;
        let mut top = x[base as usize];
        for j in 1..cols {
            top = max(top, x[(base + j) as usize]);
        }
        let mut sum = 0.0f32;
        for j in 0..cols {
            sum += f32::exp(x[(base + j) as usize] - top);
        }
        for j in 0..cols {
            out[(base + j) as usize] = f32::exp(x[(base + j) as usize] - top) / sum;
        }
    }
}

/// `out = xᵀ`, `x` being `rows × cols`. One unit an element of `x`.
#[cube(launch)]
pub fn transpose(x: &[f32], out: &mut [f32], rows: u32, cols: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < rows * cols {
        out[((i % cols) * rows + i / cols) as usize] = x[ABSOLUTE_POS];
    }
}

/// `out = dy · gelu'(x)` over `rows × cols`, with [`gelu()`]'s approximation and clamp.
#[cube(launch)]
pub fn gelu_grad(x: &[f32], dy: &[f32], out: &mut [f32], rows: u32, cols: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < rows * cols {
        let v = x[ABSOLUTE_POS];
        let t = f32::tanh(clamp(
            0.7978845608f32 * (v + 0.044715f32 * v * v * v),
            -15.0f32,
            15.0f32,
        ));
        let du = 0.7978845608f32 * (1.0f32 + 0.134145f32 * v * v);
        out[ABSOLUTE_POS] =
            dy[ABSOLUTE_POS] * (0.5f32 * (1.0f32 + t) + 0.5f32 * v * (1.0f32 - t * t) * du);
    }
}

/// `(probs - targets) / rows`: the mean cross-entropy's gradient at the logits.
#[cube(launch)]
pub fn loss_grad(probs: &[f32], targets: &[f32], out: &mut [f32], rows: u32, cols: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < rows * cols {
        out[ABSOLUTE_POS] = (probs[ABSOLUTE_POS] - targets[ABSOLUTE_POS]) / f32::cast_from(rows);
    }
}

/// Plain SGD into new memory: `out = w - lr[0] · g` over `rows × cols`.
#[cube(launch)]
pub fn sgd(w: &[f32], g: &[f32], lr: &[f32], out: &mut [f32], rows: u32, cols: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < rows * cols {
        out[ABSOLUTE_POS] = w[ABSOLUTE_POS] - lr[0] * g[ABSOLUTE_POS];
    }
}

/// `v`'s `bf16` bits, rounded to nearest even.
#[cube]
fn bf16_bits(v: f32) -> u32 {
    let b = u32::reinterpret(v);
    (b + 0x7fffu32 + ((b >> 16u32) & 1u32)) >> 16u32
}

/// Gradients to `bf16`, two to a word: `out[i]` holds `x[2i]` low, `x[2i + 1]` high.
#[cube(launch)]
pub fn to_bf16(x: &[f32], out: &mut [u32], rows: u32, cols: u32) {
    let lo = 2u32 * (ABSOLUTE_POS as u32);
    let len = rows * cols;
    if lo < len {
        let mut hi = 0u32;
        if lo + 1u32 < len {
            hi = bf16_bits(x[(lo + 1u32) as usize]);
        }
        out[ABSOLUTE_POS] = bf16_bits(x[lo as usize]) | (hi << 16u32);
    }
}

/// `bf16` words back to the `rows × cols` `f32`s of `out`, exactly.
#[cube(launch)]
pub fn from_bf16(packed: &[u32], out: &mut [f32], rows: u32, cols: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < rows * cols {
        let word = packed[(i / 2u32) as usize];
        let mut bits = word << 16u32;
        if i % 2u32 == 1u32 {
            bits = word & 0xffff0000u32;
        }
        out[ABSOLUTE_POS] = f32::reinterpret(bits);
    }
}

fn unbound() -> BufferCompilationArg {
    BufferCompilationArg { inplace: None }
}

/// The operations translated for one target: the forward four, then training's four.
#[derive(Clone, Debug)]
pub struct CubeKernels {
    /// Buffers `[a, b, c]`, scalars `[m, n, k]`; 64 columns × [`ROWS`] rows a cube.
    pub matmul: CubeKernel,
    /// Buffers `[x, bias, out]`, scalars `[rows, cols]`; 64 elements a cube.
    pub bias_add: CubeKernel,
    /// Buffers `[x, out]`, scalars `[rows, cols]`; 64 elements a cube.
    pub gelu: CubeKernel,
    /// Buffers `[x, out]`, scalars `[rows, cols]`; 64 rows a cube.
    pub softmax: CubeKernel,
    /// Buffers `[x, out]`, scalars `[rows, cols]` of `x`; 64 elements a cube.
    pub transpose: CubeKernel,
    /// Buffers `[x, dy, out]`, scalars `[rows, cols]`; 64 elements a cube.
    pub gelu_grad: CubeKernel,
    /// Buffers `[probs, targets, out]`, scalars `[rows, cols]`; 64 elements a cube.
    pub loss_grad: CubeKernel,
    /// Buffers `[w, g, lr, out]`, scalars `[rows, cols]`; 64 elements a cube.
    pub sgd: CubeKernel,
    /// Buffers `[x, out]`, scalars `[rows, cols]` of `x`; 64 words a cube.
    pub to_bf16: CubeKernel,
    /// Buffers `[packed, out]`, scalars `[rows, cols]` of `out`; 64 elements a cube.
    pub from_bf16: CubeKernel,
}

impl CubeKernels {
    /// The kernels, translated into `target`'s language: a few milliseconds of CPU a
    /// kernel, and the server compiles the result on first use.
    /// Fails with [`scope_core::Error::Compile`] when cubecl cannot compile one.
    pub fn for_target(target: Target) -> Result<Self> {
        const _: () = assert!(ROWS == 4, "the cube matmul hard-codes four rows");
        let settings = || target.settings([GROUP, 1, 1]);
        let device = Target::device_properties;
        let props = Target::target_properties;
        Ok(Self {
            matmul: translate(
                &matmul::Matmul::new(
                    settings(),
                    device(target),
                    props(target),
                    unbound(),
                    unbound(),
                    unbound(),
                    (),
                    (),
                    (),
                ),
                target,
            )?,
            bias_add: translate(
                &bias_add::BiasAdd::new(
                    settings(),
                    device(target),
                    props(target),
                    unbound(),
                    unbound(),
                    unbound(),
                    (),
                    (),
                ),
                target,
            )?,
            gelu: translate(
                &gelu::Gelu::new(
                    settings(),
                    device(target),
                    props(target),
                    unbound(),
                    unbound(),
                    (),
                    (),
                ),
                target,
            )?,
            softmax: translate(
                &softmax::Softmax::new(
                    settings(),
                    device(target),
                    props(target),
                    unbound(),
                    unbound(),
                    (),
                    (),
                ),
                target,
            )?,
            transpose: translate(
                &transpose::Transpose::new(
                    settings(),
                    device(target),
                    props(target),
                    unbound(),
                    unbound(),
                    (),
                    (),
                ),
                target,
            )?,
            gelu_grad: translate(
                &gelu_grad::GeluGrad::new(
                    settings(),
                    device(target),
                    props(target),
                    unbound(),
                    unbound(),
                    unbound(),
                    (),
                    (),
                ),
                target,
            )?,
            loss_grad: translate(
                &loss_grad::LossGrad::new(
                    settings(),
                    device(target),
                    props(target),
                    unbound(),
                    unbound(),
                    unbound(),
                    (),
                    (),
                ),
                target,
            )?,
            sgd: translate(
                &sgd::Sgd::new(
                    settings(),
                    device(target),
                    props(target),
                    unbound(),
                    unbound(),
                    unbound(),
                    unbound(),
                    (),
                    (),
                ),
                target,
            )?,
            to_bf16: translate(
                &to_bf16::ToBf16::new(
                    settings(),
                    device(target),
                    props(target),
                    unbound(),
                    unbound(),
                    (),
                    (),
                ),
                target,
            )?,
            from_bf16: translate(
                &from_bf16::FromBf16::new(
                    settings(),
                    device(target),
                    props(target),
                    unbound(),
                    unbound(),
                    (),
                    (),
                ),
                target,
            )?,
        })
    }
}
