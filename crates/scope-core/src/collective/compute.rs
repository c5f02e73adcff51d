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

trait Word: Copy {
    fn from_le(bytes: [u8; 4]) -> Self;
    fn to_le(self) -> [u8; 4];
    fn combine(self, other: Self, op: Reduce) -> Self;
    fn mean(sum: Self, n: usize) -> Self;
}

impl Word for f32 {
    fn from_le(bytes: [u8; 4]) -> Self {
        f32::from_le_bytes(bytes)
    }
    fn to_le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
    fn combine(self, other: Self, op: Reduce) -> Self {
        match op {
            Reduce::Sum | Reduce::Mean => self + other,
            Reduce::Prod => self * other,
            Reduce::Min => self.min(other),
            Reduce::Max => self.max(other),
        }
    }
    fn mean(sum: Self, n: usize) -> Self {
        sum / n as f32
    }
}

/// The integer elements: sums and products wrap, and a mean truncates.
macro_rules! integer_word {
    ($($t:ty),*) => {$(
        impl Word for $t {
            fn from_le(bytes: [u8; 4]) -> Self {
                <$t>::from_le_bytes(bytes)
            }
            fn to_le(self) -> [u8; 4] {
                self.to_le_bytes()
            }
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

integer_word!(i32, u32);

/// `inputs` combined with `op` in rank order, so every run gets the same bits.
fn reduce(element: Element, op: Reduce, inputs: &[&[u8]]) -> Vec<u8> {
    match element {
        Element::F32 => reduce_as::<f32>(op, inputs),
        Element::I32 => reduce_as::<i32>(op, inputs),
        Element::U32 => reduce_as::<u32>(op, inputs),
    }
}

fn reduce_as<W: Word>(op: Reduce, inputs: &[&[u8]]) -> Vec<u8> {
    let word = |c: &[u8]| W::from_le([c[0], c[1], c[2], c[3]]);
    let mut acc: Vec<W> = inputs[0].chunks_exact(4).map(word).collect();
    for input in &inputs[1..] {
        for (a, c) in acc.iter_mut().zip(input.chunks_exact(4)) {
            *a = a.combine(word(c), op);
        }
    }
    if op == Reduce::Mean {
        for a in &mut acc {
            *a = W::mean(*a, inputs.len());
        }
    }
    acc.into_iter().flat_map(W::to_le).collect()
}
