//! Kernels written once for every server: `u32` conformance operations, a bit-exact hash,
//! and a float kernel. Each has a constructor that translates it for a target. A cube is
//! [`CUBE`] units, one element each; scalars come in declaration order.

#![allow(missing_docs, clippy::all)]

use cubecl_core as cubecl;
use cubecl_core::prelude::*;

use scope_core::Result;

use crate::{CubeKernel, Target, translate};

/// Units per cube of every kernel here.
pub const CUBE: u32 = 64;

/// `out[i] = value` for `i < n`.
#[cube(launch)]
pub fn fill(out: &mut [u32], n: u32, value: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < n {
        out[ABSOLUTE_POS] = value;
    }
}

/// `out[i] = input[i]` for `i < n`.
#[cube(launch)]
pub fn copy(input: &[u32], out: &mut [u32], n: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < n {
        out[ABSOLUTE_POS] = input[ABSOLUTE_POS];
    }
}

/// `out[i] = a[i] + b[i]`, wrapping, for `i < n`.
#[cube(launch)]
pub fn add(a: &[u32], b: &[u32], out: &mut [u32], n: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < n {
        out[ABSOLUTE_POS] = a[ABSOLUTE_POS] + b[ABSOLUTE_POS];
    }
}

/// A wrapping hash of `input[i]`, `i` and `seed`, so any compiler difference shows in the bits.
#[cube(launch)]
pub fn mix(input: &[u32], out: &mut [u32], seed: u32, n: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < n {
        let mut h = input[ABSOLUTE_POS] ^ seed;
        h = h * 2654435761u32;
        h = h ^ (h >> 15u32);
        h = h + (i * 40503u32);
        h = h ^ (h << 7u32);
        out[ABSOLUTE_POS] = h;
    }
}

/// `out[i] = alpha * x[i] + sqrt(|y[i]|) + exp(-x[i] * x[i])`: an info struct with every part.
#[cube(launch)]
pub fn blend(x: &[f32], y: &[f32], out: &mut [f32], alpha: f32, n: u32) {
    let i = ABSOLUTE_POS as u32;
    if i < n {
        if ABSOLUTE_POS < out.len() {
            let xv = x[ABSOLUTE_POS];
            let yv = y[ABSOLUTE_POS];
            out[ABSOLUTE_POS] = alpha * xv + f32::sqrt(f32::abs(yv)) + f32::exp(-(xv * xv));
        }
    }
}

/// `out[i] = a0[i] + … + a19[i]`, wrapping: too many addresses for SPIR-V push constants.
#[cube(launch)]
pub fn wide_sum(
    a0: &[u32],
    a1: &[u32],
    a2: &[u32],
    a3: &[u32],
    a4: &[u32],
    a5: &[u32],
    a6: &[u32],
    a7: &[u32],
    a8: &[u32],
    a9: &[u32],
    a10: &[u32],
    a11: &[u32],
    a12: &[u32],
    a13: &[u32],
    a14: &[u32],
    a15: &[u32],
    a16: &[u32],
    a17: &[u32],
    a18: &[u32],
    a19: &[u32],
    out: &mut [u32],
    n: u32,
) {
    let i = ABSOLUTE_POS as u32;
    if i < n {
        let p = ABSOLUTE_POS;
        out[p] = a0[p]
            + a1[p]
            + a2[p]
            + a3[p]
            + a4[p]
            + a5[p]
            + a6[p]
            + a7[p]
            + a8[p]
            + a9[p]
            + a10[p]
            + a11[p]
            + a12[p]
            + a13[p]
            + a14[p]
            + a15[p]
            + a16[p]
            + a17[p]
            + a18[p]
            + a19[p];
    }
}

fn unbound() -> BufferCompilationArg {
    BufferCompilationArg { inplace: None }
}

macro_rules! constructor {
    ($(#[$doc:meta])* $name:ident, $module:ident :: $kernel:ident, $($arg:expr),*) => {
        $(#[$doc])*
        ///
        /// # Errors
        ///
        /// [`scope_core::Error::Compile`] when the target's compiler refuses it.
        pub fn $name(target: Target) -> Result<CubeKernel> {
            let definition = $module::$kernel::new(
                target.settings([CUBE, 1, 1]),
                target.device_properties(),
                target.target_properties(),
                $($arg),*
            );
            translate(&definition, target)
        }
    };
}

constructor!(
    /// [`fill`](fn@fill), translated: buffers `[out]`, scalars `[n, value]`.
    fill_kernel, fill::Fill, unbound(), (), ()
);
constructor!(
    /// [`copy`](fn@copy), translated: buffers `[input, out]`, scalars `[n]`.
    copy_kernel, copy::Copy, unbound(), unbound(), ()
);
constructor!(
    /// [`add`](fn@add), translated: buffers `[a, b, out]`, scalars `[n]`.
    add_kernel, add::Add, unbound(), unbound(), unbound(), ()
);
constructor!(
    /// [`mix`](fn@mix), translated: buffers `[input, out]`, scalars `[seed, n]`.
    mix_kernel, mix::Mix, unbound(), unbound(), (), ()
);
constructor!(
    /// [`blend`](fn@blend), translated: buffers `[x, y, out]`, scalars `[alpha, n]`.
    blend_kernel, blend::Blend, unbound(), unbound(), unbound(), (), ()
);
constructor!(
    /// [`wide_sum`](fn@wide_sum), translated: buffers `[a0, …, a19, out]`, scalars `[n]`.
    wide_sum_kernel, wide_sum::WideSum,
    unbound(), unbound(), unbound(), unbound(), unbound(),
    unbound(), unbound(), unbound(), unbound(), unbound(),
    unbound(), unbound(), unbound(), unbound(), unbound(),
    unbound(), unbound(), unbound(), unbound(), unbound(),
    unbound(), ()
);
