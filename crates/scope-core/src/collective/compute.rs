//! The arithmetic of a clean round, apart: it decides a collective's speed.

use std::sync::Arc;

use super::{Call, Element, Reduce};

/// Each rank's output bytes; ranks with the same bytes share one vector.
pub(crate) fn compute(kind: Call, inputs: &[&[u8]]) -> Vec<Arc<Vec<u8>>> {
    let ranks = inputs.len();
    let shared = |bytes: Vec<u8>| {
        let one = Arc::new(bytes);
        (0..ranks).map(|_| one.clone()).collect()
    };
    match kind {
        Call::AllReduce { element, op } => shared(reduce(element, op, inputs)),
        Call::AllGather => shared(inputs.concat()),
        Call::ReduceScatter { element, op } => {
            let all = reduce(element, op, inputs);
            let part = all.len() / ranks;
            all.chunks(part).map(|c| Arc::new(c.to_vec())).collect()
        }
        Call::Broadcast { root } => shared(inputs[root].to_vec()),
        Call::AllToAll => {
            let part = inputs[0].len() / ranks;
            (0..ranks)
                .map(|to| {
                    Arc::new(
                        inputs
                            .iter()
                            .flat_map(|from| &from[to * part..(to + 1) * part])
                            .copied()
                            .collect(),
                    )
                })
                .collect()
        }
    }
}

/// How one element type's bytes combine: read wide, combine in rank
/// order, written back narrow once (rule 45).
trait Word {
    /// What it combines in: itself, or `f32` for the 16-bit floats.
    type Wide: Wide;
    const SIZE: usize;
    fn widen(bytes: &[u8]) -> Self::Wide;
    fn narrow(wide: Self::Wide, out: &mut [u8]);
}

/// The arithmetic of a value being combined.
trait Wide: Copy {
    /// Inlined where `op` is a constant, so a loop per operation has no branch.
    fn combine(self, other: Self, op: Reduce) -> Self;
    fn mean(sum: Self, n: usize) -> Self;
}

/// The floats: IEEE in every step; `Min` and `Max` return the number
/// beside a NaN, as `fminf` and NCCL do.
macro_rules! float_wide {
    ($($t:ty),*) => {$(
        impl Wide for $t {
            #[inline(always)]
            fn combine(self, other: Self, op: Reduce) -> Self {
                match op {
                    Reduce::Sum | Reduce::Mean => self + other,
                    Reduce::Prod => self * other,
                    Reduce::Min => self.min(other),
                    Reduce::Max => self.max(other),
                }
            }
            fn mean(sum: Self, n: usize) -> Self {
                sum / n as $t
            }
        }
    )*};
}

/// The integers: sums and products wrap, and a mean truncates.
macro_rules! integer_wide {
    ($($t:ty),*) => {$(
        impl Wide for $t {
            #[inline(always)]
            fn combine(self, other: Self, op: Reduce) -> Self {
                match op {
                    Reduce::Sum | Reduce::Mean => self.wrapping_add(other),
                    Reduce::Prod => self.wrapping_mul(other),
                    Reduce::Min => self.min(other),
                    Reduce::Max => self.max(other),
                }
            }
            fn mean(sum: Self, n: usize) -> Self {
                sum.wrapping_div(<$t>::try_from(n).unwrap_or(<$t>::MAX))
            }
        }
    )*};
}

float_wide!(f32, f64);
integer_wide!(i8, u8, i32, u32, i64, u64);

/// The types that combine as themselves.
macro_rules! own_word {
    ($($t:ty),*) => {$(
        impl Word for $t {
            type Wide = $t;
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline(always)]
            fn widen(bytes: &[u8]) -> $t {
                <$t>::from_le_bytes(bytes.try_into().unwrap_or_default())
            }
            #[inline(always)]
            fn narrow(wide: $t, out: &mut [u8]) {
                out.copy_from_slice(&wide.to_le_bytes());
            }
        }
    )*};
}

own_word!(f32, f64, i8, u8, i32, u32, i64, u64);

/// The 16-bit floats combine in `f32` and round to nearest even once.
macro_rules! half_word {
    ($($t:ty),*) => {$(
        impl Word for $t {
            type Wide = f32;
            const SIZE: usize = 2;
            fn widen(bytes: &[u8]) -> f32 {
                <$t>::from_le_bytes([bytes[0], bytes[1]]).to_f32()
            }
            fn narrow(wide: f32, out: &mut [u8]) {
                out.copy_from_slice(&<$t>::from_f32(wide).to_le_bytes());
            }
        }
    )*};
}

half_word!(half::f16);

/// bfloat16 by hand, inlined, so the loops over it vectorise: the high half
/// of an `f32`, rounded to nearest even; a NaN stays a quiet NaN.
impl Word for half::bf16 {
    type Wide = f32;
    const SIZE: usize = 2;
    #[inline(always)]
    fn widen(bytes: &[u8]) -> f32 {
        f32::from_bits(u32::from(u16::from_le_bytes([bytes[0], bytes[1]])) << 16)
    }
    #[inline(always)]
    fn narrow(wide: f32, out: &mut [u8]) {
        let x = wide.to_bits();
        let rounded = if wide.is_nan() {
            (x >> 16) | 0x40
        } else {
            x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16
        };
        out.copy_from_slice(&(rounded as u16).to_le_bytes());
    }
}

/// `inputs` combined with `op` in rank order, so every run gets the same bits.
fn reduce(element: Element, op: Reduce, inputs: &[&[u8]]) -> Vec<u8> {
    match element {
        Element::F32 => reduce_as::<f32>(op, inputs),
        Element::I32 => reduce_as::<i32>(op, inputs),
        Element::U32 => reduce_as::<u32>(op, inputs),
        Element::F16 => reduce_as::<half::f16>(op, inputs),
        Element::BF16 => reduce_as::<half::bf16>(op, inputs),
        Element::F64 => reduce_as::<f64>(op, inputs),
        Element::I8 => reduce_as::<i8>(op, inputs),
        Element::U8 => reduce_as::<u8>(op, inputs),
        Element::I64 => reduce_as::<i64>(op, inputs),
        Element::U64 => reduce_as::<u64>(op, inputs),
    }
}

fn reduce_as<W: Word>(op: Reduce, inputs: &[&[u8]]) -> Vec<u8> {
    // A loop per operation: the inner one then holds no branch.
    let ranks = inputs.len();
    match op {
        Reduce::Sum => fold::<W>(inputs, |a, b| a.combine(b, Reduce::Sum), None),
        Reduce::Prod => fold::<W>(inputs, |a, b| a.combine(b, Reduce::Prod), None),
        Reduce::Min => fold::<W>(inputs, |a, b| a.combine(b, Reduce::Min), None),
        Reduce::Max => fold::<W>(inputs, |a, b| a.combine(b, Reduce::Max), None),
        Reduce::Mean => fold::<W>(inputs, |a, b| a.combine(b, Reduce::Sum), Some(ranks)),
    }
}

/// Elements a block: its `f32` or `f64` accumulator stays in the first
/// cache levels, so each input byte is read once from memory and the
/// output written once, and a 16-bit type moves half of what `f32` does.
const BLOCK: usize = 4096;

/// `inputs` folded by `f` in rank order, then divided by `mean`'s count.
fn fold<W: Word>(
    inputs: &[&[u8]],
    f: impl Fn(W::Wide, W::Wide) -> W::Wide,
    mean: Option<usize>,
) -> Vec<u8> {
    let n = inputs[0].len() / W::SIZE;
    let mut out = vec![0; n * W::SIZE];
    let mut acc: Vec<W::Wide> = Vec::with_capacity(BLOCK.min(n));
    for start in (0..n).step_by(BLOCK) {
        let bytes = start * W::SIZE..(start + BLOCK).min(n) * W::SIZE;
        acc.clear();
        acc.extend(inputs[0][bytes.clone()].chunks_exact(W::SIZE).map(W::widen));
        for input in &inputs[1..] {
            for (a, c) in acc
                .iter_mut()
                .zip(input[bytes.clone()].chunks_exact(W::SIZE))
            {
                *a = f(*a, W::widen(c));
            }
        }
        for (o, &a) in out[bytes].chunks_exact_mut(W::SIZE).zip(&acc) {
            W::narrow(mean.map_or(a, |n| W::Wide::mean(a, n)), o);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{Element, Reduce, reduce};

    /// Four ranks' values in `element`, from a fixed sequence over many exponents.
    fn ranks_of<T>(from_f32: impl Fn(f32) -> T, bytes: impl Fn(T) -> [u8; 2]) -> Vec<Vec<u8>> {
        let mut state = 0x9e37_79b9_u32;
        (0..4)
            .map(|_| {
                (0..4096)
                    .flat_map(|_| {
                        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                        let mantissa = (state >> 8) as f32 / (1 << 24) as f32 - 0.5;
                        let scale = 2f32.powi((state % 17) as i32 - 8);
                        bytes(from_f32(mantissa * scale))
                    })
                    .collect()
            })
            .collect()
    }

    /// The bound rule 45 documents for the 16-bit floats: the result is the
    /// `f32` sum rounded once, so within half an ulp of it, and the `f32`
    /// sum is within (n − 1)·2⁻²⁴·Σ|xᵢ| of the exact one.
    #[test]
    fn a_sixteen_bit_sum_is_within_the_documented_bound_of_the_exact_one() {
        type Pair = (fn(f32) -> [u8; 2], fn([u8; 2]) -> f64, u32);
        let f16: Pair = (
            |x| half::f16::from_f32(x).to_le_bytes(),
            |b| half::f16::from_le_bytes(b).to_f64(),
            10,
        );
        let bf16: Pair = (
            |x| half::bf16::from_f32(x).to_le_bytes(),
            |b| half::bf16::from_le_bytes(b).to_f64(),
            7,
        );
        for (element, (encode, decode, mantissa)) in [(Element::F16, f16), (Element::BF16, bf16)] {
            let inputs = ranks_of(|x| x, encode);
            let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
            let out = reduce(element, Reduce::Sum, &views);
            let word = |v: &[u8], i: usize| decode([v[2 * i], v[2 * i + 1]]);
            for i in 0..out.len() / 2 {
                let exact: f64 = views.iter().map(|v| word(v, i)).sum();
                let magnitude: f64 = views.iter().map(|v| word(v, i).abs()).sum();
                let got = word(&out, i);
                let once = views.iter().fold(0f32, |a, v| a + word(v, i) as f32);
                assert_eq!(
                    out[2 * i..2 * i + 2],
                    encode(once),
                    "{element:?} rounds once"
                );
                let ulp = 2f64.powi(got.abs().max(f64::MIN_POSITIVE).log2().floor() as i32)
                    / f64::from(1u32 << mantissa);
                let bound = ulp / 2.0 + 3.0 * 2f64.powi(-24) * magnitude;
                assert!(
                    (got - exact).abs() <= bound.max(2f64.powi(-24)),
                    "{element:?} element {i}: {got} for {exact}, bound {bound}"
                );
            }
        }
    }

    /// Sums and products propagate a NaN; `Min` and `Max` return the number
    /// beside one, as `fminf` and NCCL do; integers wrap.
    #[test]
    fn nans_propagate_through_sums_and_integers_wrap() {
        let nan = f32::NAN.to_le_bytes();
        let one = 1f32.to_le_bytes();
        let sum = reduce(Element::F32, Reduce::Sum, &[&nan, &one]);
        assert!(f32::from_le_bytes(sum[..4].try_into().unwrap()).is_nan());
        let max = reduce(Element::F32, Reduce::Max, &[&nan, &one]);
        assert_eq!(max, one);
        let half_nan = half::bf16::NAN.to_le_bytes();
        let half_one = half::bf16::ONE.to_le_bytes();
        let sum = reduce(Element::BF16, Reduce::Sum, &[&half_nan, &half_one]);
        assert!(half::bf16::from_le_bytes([sum[0], sum[1]]).is_nan());
        assert_eq!(reduce(Element::U8, Reduce::Sum, &[&[200], &[100]]), [44]);
        // A mean divides the wrapped sum: -100 + -99 wraps to 57, halved to 28.
        assert_eq!(reduce(Element::I8, Reduce::Mean, &[&[0x9c], &[0x9d]]), [28]);
        let big = i64::MAX.to_le_bytes();
        let wrapped = reduce(Element::I64, Reduce::Sum, &[&big, &1i64.to_le_bytes()]);
        assert_eq!(wrapped, i64::MIN.to_le_bytes());
    }
}
