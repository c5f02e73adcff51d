//! What a round is, and how every rank draws the same one from a seed.
//!
//! Each rank's thread draws every rank's part of a round, so the draws are a pure function of the
//! generator: no draw may depend on what a rank's calls answered, or the ranks' oracles part.

use crate::property::Rng;
use scope_core::collective::{Element, Reduce};

/// Words of each rank's part: whole chunks of an all-to-all or a reduce-scatter over one to four
/// ranks. 48 = 4 × 12 = 3 × 16.
pub(super) const PART: u32 = 48;

/// Buffers of one part per rank. The wide buffer comes after them: a part per rank, for the
/// all-gather and the reduce-scatter.
pub(super) const SLOTS: usize = 4;
pub(super) const WIDE: usize = SLOTS;

/// Words before and after each part in its buffer. A part starts three words in: a whole word, but
/// no backend's binding alignment. So a transport that drops the offset, or writes past the part,
/// is caught. The margins must read back clean, as uploaded, after every round.
pub(super) const MARGIN: u32 = 3;

/// One rank's part of a round, before the collective.
#[derive(Clone)]
pub(super) enum Local {
    Write {
        slot: usize,
        words: Vec<u32>,
    },
    Fail {
        slot: usize,
        tag: u32,
    },
    Copy {
        from: usize,
        to: usize,
    },
    /// A copy through a buffer made for it and dropped at once, its copies still in flight.
    Through {
        from: usize,
        to: usize,
    },
}

impl Local {
    /// Fresh words for `slot`, in a group of `n`.
    pub(super) fn write(rng: &mut Rng, slot: usize, n: usize) -> Self {
        Local::Write {
            slot,
            words: rng.words(words_in(slot, n)),
        }
    }

    /// A claim of any buffer, under the next tag.
    pub(super) fn fail(rng: &mut Rng, next_tag: &mut u32) -> Self {
        *next_tag += 1;
        Local::Fail {
            slot: rng.index(SLOTS + 1),
            tag: *next_tag,
        }
    }
}

/// A write's words are random: the log names the first.
impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Local::Write { slot, words } => write!(
                f,
                "Write {{ slot: {slot}, {} words from {:#x} }}",
                words.len(),
                words.first().copied().unwrap_or_default()
            ),
            Local::Fail { slot, tag } => write!(f, "Fail {{ slot: {slot}, tag: {tag} }}"),
            Local::Copy { from, to } => write!(f, "Copy {{ from: {from}, to: {to} }}"),
            Local::Through { from, to } => write!(f, "Through {{ from: {from}, to: {to} }}"),
        }
    }
}

/// How the ranks disagree in a refused round.
#[derive(Clone, Copy, Debug)]
pub(super) enum Disagreement {
    /// The odd rank calls an all-gather where the others all-reduce.
    Call,
    /// The odd rank's output is half as long.
    Length,
}

/// The collective of a round, the same on every rank.
#[derive(Clone, Copy, Debug)]
pub(super) enum Collective {
    AllReduce {
        src: usize,
        dst: usize,
        element: Element,
        op: Reduce,
    },
    AllGather {
        src: usize,
    },
    ReduceScatter {
        dst: usize,
        element: Element,
        op: Reduce,
    },
    AllToAll {
        src: usize,
        dst: usize,
    },
    Broadcast {
        root: usize,
        slot: usize,
    },
    /// Every rank sends `src` to the next and receives into `dst` from the one before.
    Shift {
        src: usize,
        dst: usize,
    },
    Refused {
        odd: usize,
        src: usize,
        dst: usize,
        how: Disagreement,
    },
}

#[derive(Clone, Debug)]
pub(super) struct Round {
    pub(super) locals: Vec<Vec<Local>>,
    pub(super) collective: Collective,
    /// Over a device transport, where every input it reads is clean: record the collective on every
    /// rank. Then replay the graphs together (rule 50). After `late`, a failure is claimed on one
    /// rank between the recording and the replay.
    pub(super) recorded: bool,
    pub(super) late: Option<(usize, Local)>,
    /// Where a recorded round copies its output after the call, inside the graph.
    pub(super) recorded_copy: Option<usize>,
    /// What each rank issues after its call, while the round is in flight.
    pub(super) after: Vec<Vec<Local>>,
    /// Whether the ranks read every buffer after this round. Always after [`IN_FLIGHT`] rounds.
    pub(super) read: bool,
}

impl Collective {
    /// The buffer `rank` reads as a collective's input, if any. A broadcast reads only the root's.
    /// A shift's reads are its sends' (the oracle follows each). A refused call reads nothing.
    pub(super) fn reads(self, rank: usize) -> Option<usize> {
        match self {
            Collective::AllReduce { src, .. }
            | Collective::AllGather { src }
            | Collective::AllToAll { src, .. } => Some(src),
            Collective::ReduceScatter { .. } => Some(WIDE),
            Collective::Broadcast { root, slot } => (root == rank).then_some(slot),
            Collective::Shift { .. } | Collective::Refused { .. } => None,
        }
    }

    /// The buffer it writes on every rank, if one: its output. A refused call writes nothing.
    pub(super) fn writes(self) -> Option<usize> {
        match self {
            Collective::AllReduce { dst, .. }
            | Collective::ReduceScatter { dst, .. }
            | Collective::AllToAll { dst, .. }
            | Collective::Shift { dst, .. } => Some(dst),
            Collective::AllGather { .. } => Some(WIDE),
            Collective::Broadcast { slot, .. } => Some(slot),
            Collective::Refused { .. } => None,
        }
    }

    /// Whether it is a round a graph may record. Transfers are no rounds, and a refused call
    /// records nothing.
    pub(super) fn recordable(self) -> bool {
        !matches!(self, Collective::Shift { .. } | Collective::Refused { .. })
    }
}

impl Rng {
    /// An index below `n`.
    pub(super) fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    pub(super) fn words(&mut self, n: u32) -> Vec<u32> {
        (0..n).map(|_| self.next() as u32).collect()
    }

    /// Two distinct part-sized buffers.
    pub(super) fn two(&mut self) -> (usize, usize) {
        let a = self.index(SLOTS);
        (a, (a + 1 + self.index(SLOTS - 1)) % SLOTS)
    }
}

/// The words of a part-sized buffer, or of the wide one.
pub(super) fn words_in(slot: usize, n: usize) -> u32 {
    if slot == WIDE { PART * n as u32 } else { PART }
}

impl Round {
    pub(super) fn draw(rng: &mut Rng, n: usize, next_tag: &mut u32) -> Self {
        let locals = (0..n)
            .map(|_| {
                let mut locals = Vec::new();
                if rng.chance(50) {
                    let slot = rng.index(SLOTS + 1);
                    locals.push(Local::write(rng, slot, n));
                }
                if rng.chance(10) {
                    locals.push(Local::fail(rng, next_tag));
                }
                if rng.chance(15) {
                    let (from, to) = rng.two();
                    locals.push(Local::Copy { from, to });
                }
                locals
            })
            .collect();
        // The integer types, which the oracle computes exactly on words.
        let element = [
            Element::I8,
            Element::U8,
            Element::I32,
            Element::U32,
            Element::I64,
            Element::U64,
        ][rng.index(6)];
        let op = [
            Reduce::Sum,
            Reduce::Prod,
            Reduce::Min,
            Reduce::Max,
            Reduce::Mean,
        ][rng.index(5)];
        let (src, dst) = rng.two();
        // An all-reduce in place, now and then (NCCL's `sendbuff == recvbuff`).
        let in_place = if rng.chance(20) { src } else { dst };
        let kinds = if n > 1 { 7 } else { 5 };
        let collective = match rng.index(kinds) {
            0 => Collective::AllReduce {
                src,
                dst: in_place,
                element,
                op,
            },
            1 => Collective::AllGather { src },
            2 => Collective::ReduceScatter { dst, element, op },
            3 => Collective::AllToAll { src, dst },
            4 => Collective::Broadcast {
                root: rng.index(n),
                slot: src,
            },
            5 => Collective::Shift { src, dst },
            _ => Collective::Refused {
                odd: rng.index(n),
                src,
                dst,
                how: if rng.chance(50) {
                    Disagreement::Call
                } else {
                    Disagreement::Length
                },
            },
        };
        let recorded = rng.chance(35);
        *next_tag += 1;
        let late = rng.chance(30).then(|| {
            (
                rng.index(n),
                Local::Fail {
                    slot: rng.index(SLOTS + 1),
                    tag: *next_tag,
                },
            )
        });
        let written = collective.writes().filter(|&slot| slot < SLOTS);
        let recorded_copy = written
            .filter(|_| rng.chance(50))
            .map(|from| (from + 1 + rng.index(SLOTS - 1)) % SLOTS);
        let after = (0..n)
            .map(|r| Self::after(rng, n, collective.reads(r), written, next_tag))
            .collect();
        Self {
            locals,
            collective,
            recorded,
            late,
            recorded_copy,
            after,
            read: rng.chance(40),
        }
    }

    /// One rank's work after its call: reads of the round's output `written`, a host write of its
    /// input `read`, a claim, a copy through a buffer dropped at once.
    pub(super) fn after(
        rng: &mut Rng,
        n: usize,
        read: Option<usize>,
        written: Option<usize>,
        next_tag: &mut u32,
    ) -> Vec<Local> {
        let mut after = Vec::new();
        if let Some(from) = written.filter(|_| rng.chance(40)) {
            let to = (from + 1 + rng.index(SLOTS - 1)) % SLOTS;
            after.push(if rng.chance(30) {
                Local::Through { from, to }
            } else {
                Local::Copy { from, to }
            });
        }
        if let Some(slot) = read.filter(|_| rng.chance(20)) {
            after.push(Local::write(rng, slot, n));
        }
        if rng.chance(5) {
            after.push(Local::fail(rng, next_tag));
        }
        if rng.chance(10) {
            let (from, to) = rng.two();
            after.push(Local::Through { from, to });
        }
        after
    }
}
