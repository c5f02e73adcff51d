//! Every element type a collective reduces, with every operation, on the
//! suite's transport and on ranks joined alone (rule 45).
//!
//! The inputs are small integers, some negative, some that wrap an 8-bit
//! type. Every float type holds each partial result exactly. So a
//! transport that combines in the type (NCCL, step by step) and one that
//! widens and rounds once (host staging) must agree bit for bit. The
//! expected bytes come from an oracle in `i128` and `f64`, not from the
//! core's arithmetic, which is what host staging runs.

use std::time::Duration;

use scope_core::collective::device::DeviceCollectives;
use scope_core::collective::{CollectiveError, Element, Rank, Reduce};
use scope_core::{Backend, Error};

use crate::Suite;
use crate::across::on_threads_joined;
use crate::collective::{DEFAULT_WAIT, RANKS, collective_error, group};

/// Elements per rank: whole words and whole reduce-scatter parts of every type.
const COUNT: usize = 8 * RANKS;

const OPS: [Reduce; 5] = [
    Reduce::Sum,
    Reduce::Prod,
    Reduce::Min,
    Reduce::Max,
    Reduce::Mean,
];

/// Rank `rank`'s element `i`: 1 to 3, negated at odd `i` in a signed
/// type, and 100 at `i == 0` in an 8-bit one, so its sum and product wrap.
fn value(element: Element, rank: usize, i: usize) -> i128 {
    let small = 1 + ((rank + i) % 3) as i128;
    let signed = !matches!(element, Element::U8 | Element::U32 | Element::U64);
    match element {
        Element::I8 | Element::U8 if i == 0 => 100,
        _ if signed && i % 2 == 1 => -small,
        _ => small,
    }
}

fn is_float(element: Element) -> bool {
    matches!(
        element,
        Element::F16 | Element::BF16 | Element::F32 | Element::F64
    )
}

/// `v` in `element`'s bytes: integers wrap, floats round (exact here).
fn encode(element: Element, v: f64, out: &mut Vec<u8>) {
    let int = v as i128;
    match element {
        Element::F16 => out.extend(half::f16::from_f64(v).to_le_bytes()),
        Element::BF16 => out.extend(half::bf16::from_f64(v).to_le_bytes()),
        Element::F32 => out.extend((v as f32).to_le_bytes()),
        Element::F64 => out.extend(v.to_le_bytes()),
        Element::I8 => out.extend((int as i8).to_le_bytes()),
        Element::U8 => out.extend((int as u8).to_le_bytes()),
        Element::I32 => out.extend((int as i32).to_le_bytes()),
        Element::U32 => out.extend((int as u32).to_le_bytes()),
        Element::I64 => out.extend((int as i64).to_le_bytes()),
        Element::U64 => out.extend((int as u64).to_le_bytes()),
    }
}

/// Rank `rank`'s input bytes.
fn input(element: Element, rank: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..COUNT {
        encode(element, value(element, rank, i) as f64, &mut out);
    }
    out
}

/// `v` wrapped to `element`'s width and signedness, as an integer.
pub(crate) fn wrapped(element: Element, v: i128) -> i128 {
    match element {
        Element::I8 => i128::from(v as i8),
        Element::U8 => i128::from(v as u8),
        Element::I32 => i128::from(v as i32),
        Element::U32 => i128::from(v as u32),
        Element::I64 => i128::from(v as i64),
        Element::U64 => i128::from(v as u64),
        _ => v,
    }
}

/// What every rank's all-reduce output is: the documented arithmetic.
fn expected(element: Element, op: Reduce) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..COUNT {
        let values: Vec<i128> = (0..RANKS).map(|r| value(element, r, i)).collect();
        let exact = match op {
            Reduce::Sum | Reduce::Mean => values.iter().sum(),
            Reduce::Prod => values.iter().product(),
            Reduce::Min => *values.iter().min().unwrap_or(&0),
            Reduce::Max => *values.iter().max().unwrap_or(&0),
        };
        let v = match op {
            // A float's mean divides; an integer's divides its wrapped sum, truncating.
            Reduce::Mean if is_float(element) => exact as f64 / RANKS as f64,
            Reduce::Mean => (wrapped(element, exact) / RANKS as i128) as f64,
            _ => exact as f64,
        };
        encode(element, v, &mut out);
    }
    out
}

/// One rank's all-reduce and reduce-scatter of every type by every operation.
type Outcomes = Vec<(Element, Reduce, Vec<u8>, Vec<u8>)>;

fn reduce_everything<B: Backend>(rank: &Rank<B>, recorded: bool) -> Outcomes {
    let c = rank.client();
    let mut cases = Vec::new();
    for element in Element::ALL {
        let bytes = input(element, rank.index());
        for op in OPS {
            let mine = c.upload(&bytes).expect("upload");
            let all = c.allocate(bytes.len() as u64).expect("allocate");
            let part = c.allocate((bytes.len() / RANKS) as u64).expect("allocate");
            cases.push((element, op, mine, all, part));
        }
    }
    // Recorded, every round goes into one graph, replayed once on every rank.
    let capture = recorded.then(|| c.begin_capture().expect("a capture"));
    for (element, op, mine, all, part) in &cases {
        let name = element.name();
        rank.all_reduce(mine.all(), all.all(), *element, *op)
            .unwrap_or_else(|e| panic!("{name} {op:?}: {e}"));
        rank.reduce_scatter(mine.all(), part.all(), *element, *op)
            .unwrap_or_else(|e| panic!("{name} {op:?} scattered: {e}"));
    }
    if let Some(capture) = capture {
        let graph = c.end_capture(capture).expect("a clean window seals");
        rank.replay(&graph).expect("every rank replays");
    }
    let read = |b: &scope_core::Buffer| c.read(b).expect("a clean round reads clean");
    cases
        .iter()
        .map(|(element, op, _, all, part)| (*element, *op, read(all), read(part)))
        .collect()
}

fn check(at: &str, rank: usize, outcomes: Outcomes) {
    assert_eq!(outcomes.len(), Element::ALL.len() * OPS.len());
    for (element, op, all, part) in outcomes {
        let want = expected(element, op);
        let name = element.name();
        assert_eq!(all, want, "{at}, rank {rank}: all_reduce {name} {op:?}");
        let size = want.len() / RANKS;
        assert_eq!(
            part,
            want[rank * size..(rank + 1) * size],
            "{at}, rank {rank}: reduce_scatter {name} {op:?}"
        );
    }
}

/// Every element type reduces with every operation, all-reduce and
/// reduce-scatter, on every rank of the suite's group, to the bits rule 45
/// documents: integers wrap and a mean truncates; floats are IEEE.
pub fn every_element_type_reduces_with_every_operation<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    let outcomes = group.run(|rank| reduce_everything(&rank, false));
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        check("the suite's group", rank, outcome);
    }
    assert!(group.broken().is_none());
}

/// Every type and operation recorded into one graph on every rank of a
/// group over a device transport, then replayed together (rule 50).
pub fn recorded_rounds_reduce_every_element_type<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    let outcomes = group.run(|rank| reduce_everything(&rank, true));
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        check("recorded and replayed", rank, outcome);
    }
    assert!(group.broken().is_none());
}

/// Ranks joined alone carry the type on their ballot: every type and
/// operation reduces as in one group.
pub fn ranks_joined_alone_reduce_every_element_type<S: Suite>()
where
    S::Backend: DeviceCollectives,
{
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    let clients = (0..RANKS)
        .map(|r| group.rank(r).expect("a rank").client().clone())
        .collect();
    drop(group);
    let identity = <S::Backend as DeviceCollectives>::identity()
        .expect("the suite's backend has its collectives library");
    let deadline = Duration::from_secs(60);
    let outcomes = on_threads_joined::<S, _>(clients, &identity, RANKS, deadline, |joined| {
        reduce_everything(&joined.expect("every rank joins"), false)
    });
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        check("ranks joined alone", rank, outcome);
    }
}

/// A length that is whole words but not whole elements of an 8-byte type,
/// or ranks that name different types, is refused on every rank, claiming
/// nothing; the group stays in step (rule 44).
pub fn a_length_or_type_that_does_not_fit_is_refused_on_every_rank<S: Suite>() {
    let Some(group) = group::<S>(DEFAULT_WAIT) else {
        return;
    };
    let outcomes = group.run(|rank| {
        let c = rank.client();
        let words = c.upload(&[7; 12]).expect("upload");
        let output = c.upload(&[5; 12]).expect("upload");
        let odd = rank.all_reduce(words.all(), output.all(), Element::F64, Reduce::Sum);
        let element = if rank.index() == 1 {
            Element::BF16
        } else {
            Element::F16
        };
        let eight = words.slice(0..8);
        let mixed = rank.all_reduce(eight, output.slice(0..8), element, Reduce::Sum);
        let kept = c.read(&output).expect("nothing claimed");
        rank.all_reduce(eight, output.slice(0..8), Element::U8, Reduce::Max)
            .expect("still in step");
        (odd, mixed, kept, c.read(&output).expect("clean"))
    });
    for (rank, (odd, mixed, kept, maxed)) in outcomes.into_iter().enumerate() {
        for (what, refused) in [("12 bytes of f64", odd), ("f16 beside bf16", mixed)] {
            let error: Error = refused.expect_err(what);
            assert!(
                matches!(collective_error(&error), CollectiveError::Refused { .. }),
                "rank {rank}, {what}: {error}"
            );
        }
        assert_eq!(kept, [5; 12], "rank {rank}: nothing claimed");
        assert_eq!(maxed[..8], [7; 8], "rank {rank}: a clean round after");
    }
    assert!(group.broken().is_none());
}

/// The element behaviours: one `#[test]` each for `$suite`.
#[macro_export]
macro_rules! element_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, elements::every_element_type_reduces_with_every_operation }
        $crate::behaviour! { joined $suite, elements::ranks_joined_alone_reduce_every_element_type }
        $crate::behaviour! { $suite, elements::recorded_rounds_reduce_every_element_type, DeviceCollectives }
        $crate::behaviour! { $suite, elements::a_length_or_type_that_does_not_fit_is_refused_on_every_rank }
    };
}
