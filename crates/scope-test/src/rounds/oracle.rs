//! The oracle: every buffer of every rank, as its words or the failures a read may name.
//!
//! It applies a round as the rules say its collective must land, never as a transport computes
//! it. So a transport's error in order, width or sign disagrees with it rather than agreeing by
//! construction.

use super::draw::*;
use crate::elements::wrapped;
use crate::property::Rng;
use scope_core::collective::{Element, Reduce};

/// A failure a read of a stale buffer may name. The rank the outermost `InputFailed` names, or
/// `IssueFailed` where `issue` (`None`: the injected failure itself). And the tag of the injected
/// failure at the bottom of its chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Origin {
    pub(super) named: Option<usize>,
    pub(super) issue: bool,
    pub(super) tag: u32,
}

/// What the oracle knows of one buffer.
#[derive(Clone, Debug)]
pub(super) enum Held {
    Clean(Vec<u32>),
    /// A read must fail, naming one of these.
    Stale(Vec<Origin>),
}

pub(super) fn tag_text(tag: u32) -> String {
    format!("round-failure#{tag};")
}

/// What a rank's call must answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    Ok,
    /// `InputFailed` naming this rank.
    InputFailed(usize),
    Refused,
    /// These ranks' library calls failed: `IssueFailed` naming one of them there; elsewhere that,
    /// or `Ok` for a call that went out before its rank learned (rule 47).
    IssueFailed(Ranks),
}

/// Every buffer of every rank, as the oracle knows it.
pub(super) struct Oracle {
    pub(super) held: Vec<Vec<Held>>,
}

/// Word `i` of the reduction of every rank's `rows` (rule 45), folded in
/// rank order in the type, wrapping. The word holds four 8-bit lanes, one
/// 32-bit element, or half of a 64-bit one (`i ^ 1` is the other half).
pub(super) fn reduce_word(element: Element, op: Reduce, rows: &[&[u32]], i: usize) -> u32 {
    let bits = 8 * element.size() as u32;
    let signed = matches!(element, Element::I8 | Element::I32 | Element::I64);
    let fold = |lanes: Vec<i128>| -> i128 {
        let total = lanes[1..].iter().fold(lanes[0], |acc, &v| {
            wrapped(
                element,
                match op {
                    Reduce::Sum | Reduce::Mean => acc + v,
                    Reduce::Prod => acc.wrapping_mul(v),
                    Reduce::Min => acc.min(v),
                    Reduce::Max => acc.max(v),
                },
            )
        });
        if op == Reduce::Mean {
            total / lanes.len() as i128
        } else {
            total
        }
    };
    // Lane `shift` of `x`, `bits` wide, as the type reads it.
    let lane = |x: u64, shift: u32| -> i128 {
        let raw = (x >> shift) & (u64::MAX >> (64 - bits));
        if signed {
            wrapped(element, i128::from(raw))
        } else {
            i128::from(raw)
        }
    };
    let to_word = |v: i128, shift: u32| ((v as u64) & (u64::MAX >> (64 - bits))) << shift;
    match bits {
        64 => {
            let low = i & !1;
            let whole = |row: &[u32]| u64::from(row[low]) | (u64::from(row[low + 1]) << 32);
            let v = fold(rows.iter().map(|row| lane(whole(row), 0)).collect());
            (v as u64 >> (32 * (i & 1))) as u32
        }
        _ => (0..32 / bits)
            .map(|k| {
                let shift = k * bits;
                let v = fold(
                    rows.iter()
                        .map(|row| lane(u64::from(row[i]), shift))
                        .collect(),
                );
                to_word(v, shift) as u32
            })
            .fold(0, |word, lane| word | lane),
    }
}

impl Oracle {
    pub(super) fn new(rng: &mut Rng, n: usize) -> Self {
        let held = (0..n)
            .map(|_| {
                (0..=SLOTS)
                    .map(|slot| Held::Clean(rng.words(words_in(slot, n))))
                    .collect()
            })
            .collect();
        Self { held }
    }

    pub(super) fn ranks(&self) -> usize {
        self.held.len()
    }

    pub(super) fn local(&mut self, rank: usize, local: &Local) {
        let held = &mut self.held[rank];
        match local {
            Local::Write { slot, words } => held[*slot] = Held::Clean(words.clone()),
            Local::Fail { slot, tag } => {
                held[*slot] = Held::Stale(vec![Origin {
                    named: None,
                    issue: false,
                    tag: *tag,
                }]);
            }
            Local::Copy { from, to } | Local::Through { from, to } => {
                held[*to] = held[*from].clone();
            }
        }
    }

    /// The origins an output names when `rank`'s `slot` is what failed. The outermost `InputFailed`
    /// names `rank`, over any of its tags.
    pub(super) fn failed_at(&self, rank: usize, slot: usize) -> Vec<Origin> {
        match &self.held[rank][slot] {
            Held::Stale(origins) => origins
                .iter()
                .map(|o| Origin {
                    named: Some(rank),
                    issue: false,
                    tag: o.tag,
                })
                .collect(),
            Held::Clean(_) => Vec::new(),
        }
    }

    /// The lowest rank whose buffer `collective` reads is stale, and that buffer.
    pub(super) fn first_failed(&self, collective: Collective) -> Option<(usize, usize)> {
        (0..self.ranks()).find_map(|r| {
            let slot = collective.reads(r)?;
            matches!(self.held[r][slot], Held::Stale(_)).then_some((r, slot))
        })
    }

    pub(super) fn words(&self, rank: usize, slot: usize) -> &[u32] {
        match &self.held[rank][slot] {
            Held::Clean(words) => words,
            Held::Stale(_) => unreachable!("only clean inputs are combined"),
        }
    }

    /// Apply `collective`, which every rank calls the same way. It reads what [`Collective::reads`]
    /// says. It writes `outputs(rank)`, made from the clean inputs, into every rank's `dst`. Every
    /// rank's answer.
    pub(super) fn collective(
        &mut self,
        collective: Collective,
        dst: usize,
        outputs: impl Fn(&Self, usize) -> Vec<u32>,
    ) -> Vec<Answer> {
        let n = self.ranks();
        if let Some((failed, slot)) = self.first_failed(collective) {
            let origins = self.failed_at(failed, slot);
            for held in &mut self.held {
                held[dst] = Held::Stale(origins.clone());
            }
            return vec![Answer::InputFailed(failed); n];
        }
        let written: Vec<Vec<u32>> = (0..n).map(|r| outputs(self, r)).collect();
        for (held, words) in self.held.iter_mut().zip(written) {
            held[dst] = Held::Clean(words);
        }
        vec![Answer::Ok; n]
    }

    /// Apply `collective`. Every rank's answers, in the order the rank makes its calls: a shift
    /// answers its send, then its receive.
    pub(super) fn apply(&mut self, collective: Collective) -> Vec<Vec<Answer>> {
        let n = self.ranks();
        let chunk = PART as usize / n;
        let single = |answers: Vec<Answer>| answers.into_iter().map(|a| vec![a]).collect();
        match collective {
            Collective::AllReduce {
                src,
                dst,
                element,
                op,
            } => single(self.collective(collective, dst, |o, _| {
                let rows: Vec<&[u32]> = (0..n).map(|r| o.words(r, src)).collect();
                (0..PART as usize)
                    .map(|i| reduce_word(element, op, &rows, i))
                    .collect()
            })),
            Collective::AllGather { src } => single(self.collective(collective, WIDE, |o, _| {
                (0..n).flat_map(|r| o.words(r, src).to_vec()).collect()
            })),
            Collective::ReduceScatter { dst, element, op } => {
                single(self.collective(collective, dst, |o, rank| {
                    let part = rank * PART as usize..(rank + 1) * PART as usize;
                    let rows: Vec<&[u32]> =
                        (0..n).map(|r| &o.words(r, WIDE)[part.clone()]).collect();
                    (0..PART as usize)
                        .map(|i| reduce_word(element, op, &rows, i))
                        .collect()
                }))
            }
            Collective::AllToAll { src, dst } => {
                single(self.collective(collective, dst, |o, rank| {
                    (0..n)
                        .flat_map(|from| {
                            o.words(from, src)[rank * chunk..(rank + 1) * chunk].to_vec()
                        })
                        .collect()
                }))
            }
            Collective::Broadcast { root, slot } => {
                single(self.collective(collective, slot, |o, _| o.words(root, slot).to_vec()))
            }
            Collective::Shift { src, dst } => {
                let sent: Vec<Held> = (0..n).map(|r| self.held[r][src].clone()).collect();
                let mut answers = Vec::with_capacity(n);
                for rank in 0..n {
                    let before = (rank + n - 1) % n;
                    let send = match &sent[rank] {
                        Held::Stale(_) => Answer::InputFailed(rank),
                        Held::Clean(_) => Answer::Ok,
                    };
                    let (recv, held) = match &sent[before] {
                        Held::Stale(origins) => (
                            Answer::InputFailed(before),
                            Held::Stale(
                                origins
                                    .iter()
                                    .map(|o| Origin {
                                        named: Some(before),
                                        issue: false,
                                        tag: o.tag,
                                    })
                                    .collect(),
                            ),
                        ),
                        Held::Clean(words) => (Answer::Ok, Held::Clean(words.clone())),
                    };
                    self.held[rank][dst] = held;
                    answers.push(vec![send, recv]);
                }
                answers
            }
            Collective::Refused { .. } => vec![vec![Answer::Refused]; n],
        }
    }
}

impl Oracle {
    /// `collective`, whose library call failed on each rank of `failing` with its failure's tag.
    /// Every rank's output carries `IssueFailed` naming one of them: the first to fail, which no
    /// rank can know before (rules 43, 47).
    pub(super) fn failed_call(
        &mut self,
        collective: Collective,
        failing: &[(usize, u32)],
    ) -> Vec<Vec<Answer>> {
        let dst = collective.writes().expect("a failed call writes an output");
        let origins: Vec<Origin> = failing
            .iter()
            .map(|&(rank, tag)| Origin {
                named: Some(rank),
                issue: true,
                tag,
            })
            .collect();
        for held in &mut self.held {
            held[dst] = Held::Stale(origins.clone());
        }
        let ranks = Ranks(failing.iter().fold(0, |mask, (rank, _)| mask | 1 << rank));
        vec![vec![Answer::IssueFailed(ranks)]; self.ranks()]
    }
}

/// A set of ranks, one bit each: the ranks whose calls failed in one round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ranks(u32);

impl Ranks {
    /// Whether `rank` is one of them.
    pub(super) fn names(self, rank: usize) -> bool {
        rank < 32 && self.0 & (1 << rank) != 0
    }
}
