//! Random rounds of collectives against an oracle, for any group.
//!
//! The collective behaviours test each rule with the sequence someone wrote. This runs the
//! sequences nobody did. Each round, every rank may write fresh bytes into one of its buffers. It
//! may instead fail one, as a failed kernel would, or copy one into another. Then the group runs
//! one collective over those buffers:
//!
//! - an all-reduce (`u32` or `i32`, any reduction, in place now and then);
//! - an all-gather into a wide buffer, or a reduce-scatter out of it;
//! - an all-to-all, or a broadcast from any root;
//! - every rank sending to the next and receiving from the one before;
//! - a call the ranks disagree on: another collective, or an output of another length on one rank.
//!
//! Over a device transport a round whose inputs are clean is sometimes recorded on every rank,
//! sometimes with a copy of its output recorded after it. The ranks then replay it together, with a
//! failure claimed on one rank in between (rule 50).
//!
//! Rounds are left in flight. After its call each rank may copy the round's output into another
//! buffer, or write the round's input from the host. It may claim a buffer, or copy through a buffer
//! it frees at once. A runtime's step issues such work behind its round, and it must wait for the
//! round. Reads come only now and then: up to [`IN_FLIGHT`] rounds and their work are outstanding.
//!
//! Beside the group, an oracle keeps every buffer of every rank. It knows either its words or the
//! failures a read of it may name. When the ranks read, each reads all of its buffers, and:
//!
//! - a read fails exactly when the oracle says the buffer is stale. A clean read returns the
//!   oracle's words (rule 41's healing, 45's stream order);
//! - a stale buffer's root is the one the oracle expects. That is the injected failure, or
//!   `InputFailed` naming the lowest rank whose input failed. The failure's text is somewhere in
//!   its chain (rules 41, 48);
//! - every rank's call answered as the oracle expects. That is `Ok`, `InputFailed` naming that
//!   rank, or `Refused` on every rank with nothing claimed (rule 44). Rounds whose inputs also
//!   failed are included;
//! - the group never breaks, and the store's books add up ([`Client::audit`]).
//!
//! `SCOPE_ROUND_SEEDS=<n>` runs seeds 0 to n − 1 in place of the fixed ones, and
//! `SCOPE_ROUNDS=<n>` that many rounds a seed: `cargo xtask stress` runs thousands.
//!
//! # Why this shape
//!
//! Every rank's thread draws the whole round, every rank's part, from the same seed. Each keeps the
//! whole oracle. So a rank needs no message from another to know what its reads must return. The
//! ranks run as a runtime's would, each on its own thread, meeting only inside the collectives.
//! Buffers are whole parts (no sub-ranges), so staleness is per buffer, not per word. The words are
//! random over all of `u32`. So sums and products wrap, and `i32`'s order differs from `u32`'s. A
//! transport that computes in another width or sign is caught.
//!
//! `SCOPE_PROPERTY_SEED=<seed>` runs one seed alone, as for [`random_sequences`]. A failing round
//! prints the seed and the rounds before it.

mod changes;

use self::changes::{Event, Handoff};
use super::across::each_of_ranks_alone;
use super::collective::{DEFAULT_WAIT, collective_error, group_of};
use super::property::Rng;
use super::*;
use scope_core::Slice;
use scope_core::collective::device::DeviceCollectives;
use scope_core::collective::{CollectiveError, Element, Rank, Reduce};

use crate::elements::wrapped;

/// The seeds every suite runs. The group's size is one more than the seed's remainder by four
/// ([`ranks_for`]). So these are four, three, two, one and four ranks.
pub const ROUND_SEEDS: [u64; 5] = [3, 6, 9, 12, 0x0dd_ba13];

/// How many ranks seed `seed` plays: one to four, and no more than the suite has devices. See
/// [`Suite::devices`]: on a machine with one GPU, every seed plays one rank.
pub fn ranks_for<S: Suite>(seed: u64) -> usize {
    (1 + (seed % 4) as usize).min(S::devices().max(1))
}

/// Words of each rank's part: whole chunks of an all-to-all or a reduce-scatter over one to four
/// ranks. 48 = 4 × 12 = 3 × 16.
const PART: u32 = 48;

/// Rounds per seed: a tenth of a second a seed on the host server, under a second on lavapipe.
pub const ROUNDS: usize = 100;

/// The most rounds in flight when the ranks read: a read comes after at most this many rounds.
pub const IN_FLIGHT: usize = 4;

/// Buffers of one part per rank. The wide buffer comes after them: a part per rank, for the
/// all-gather and the reduce-scatter.
const SLOTS: usize = 4;
const WIDE: usize = SLOTS;

/// Words before and after each part in its buffer. A part starts three words in: a whole word, but
/// no backend's binding alignment. So a transport that drops the offset, or writes past the part,
/// is caught. The margins must read back clean, as uploaded, after every round.
const MARGIN: u32 = 3;

/// One rank's buffers, each a part between two margins.
struct Parts {
    buffers: Vec<Buffer>,
    /// Each buffer's margins, as uploaded.
    margins: Vec<(Vec<u32>, Vec<u32>)>,
}

impl Parts {
    /// `oracle`'s parts of rank `rank`, between margins drawn from `rng`.
    fn upload<B: Backend>(c: &Client<B>, oracle: &Oracle, rank: usize, rng: &mut Rng) -> Self {
        let (buffers, margins) = (0..=SLOTS)
            .map(|slot| {
                let (before, after) = (rng.words(MARGIN), rng.words(MARGIN));
                let words: Vec<u32> = [&before[..], oracle.words(rank, slot), &after[..]].concat();
                (upload(c, &words), (before, after))
            })
            .unzip();
        Self { buffers, margins }
    }

    /// The first `words` words of `slot`'s part.
    fn words(&self, slot: usize, words: u32) -> Slice<'_> {
        let start = u64::from(MARGIN) * 4;
        self.buffers[slot].slice(start..start + u64::from(words) * 4)
    }

    /// `slot`'s part.
    fn view(&self, slot: usize) -> Slice<'_> {
        let words = words_of(&self.buffers[slot]) - 2 * MARGIN;
        self.words(slot, words)
    }

    /// Whether every margin reads back clean, as uploaded.
    fn check_margins<B: Backend>(&self, at: &str, c: &Client<B>) {
        for (slot, (buffer, (before, after))) in self.buffers.iter().zip(&self.margins).enumerate()
        {
            let end = buffer.size();
            let margin = u64::from(MARGIN) * 4;
            for (range, expected) in [(0..margin, before), (end - margin..end, after)] {
                let read = c.read(buffer.slice(range.clone())).map(|b| as_words(&b));
                assert!(
                    read.as_ref().is_ok_and(|words| words == expected),
                    "{at}: buffer {slot}'s margin {range:?} was touched: {read:?}"
                );
            }
        }
    }
}

/// A failure a read of a stale buffer may name. The rank the outermost `InputFailed` names (`None`:
/// the injected failure itself). And the tag of the injected failure at the bottom of its chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Origin {
    named: Option<usize>,
    tag: u32,
}

/// What the oracle knows of one buffer.
#[derive(Clone, Debug)]
enum Held {
    Clean(Vec<u32>),
    /// A read must fail, naming one of these.
    Stale(Vec<Origin>),
}

fn tag_text(tag: u32) -> String {
    format!("round-failure#{tag};")
}

/// One rank's part of a round, before the collective.
#[derive(Clone)]
enum Local {
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
    fn write(rng: &mut Rng, slot: usize, n: usize) -> Self {
        Local::Write {
            slot,
            words: rng.words(words_in(slot, n)),
        }
    }

    /// A claim of any buffer, under the next tag.
    fn fail(rng: &mut Rng, next_tag: &mut u32) -> Self {
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
enum Disagreement {
    /// The odd rank calls an all-gather where the others all-reduce.
    Call,
    /// The odd rank's output is half as long.
    Length,
}

/// The collective of a round, the same on every rank.
#[derive(Clone, Copy, Debug)]
enum Collective {
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
struct Round {
    locals: Vec<Vec<Local>>,
    collective: Collective,
    /// Over a device transport, where every input it reads is clean: record the collective on every
    /// rank. Then replay the graphs together (rule 50). After `late`, a failure is claimed on one
    /// rank between the recording and the replay.
    recorded: bool,
    late: Option<(usize, Local)>,
    /// Where a recorded round copies its output after the call, inside the graph.
    recorded_copy: Option<usize>,
    /// What each rank issues after its call, while the round is in flight.
    after: Vec<Vec<Local>>,
    /// Whether the ranks read every buffer after this round. Always after [`IN_FLIGHT`] rounds.
    read: bool,
}

impl Collective {
    /// The buffer `rank` reads as a collective's input, if any. A broadcast reads only the root's.
    /// A shift's reads are its sends' (the oracle follows each). A refused call reads nothing.
    fn reads(self, rank: usize) -> Option<usize> {
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
    fn writes(self) -> Option<usize> {
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
    fn recordable(self) -> bool {
        !matches!(self, Collective::Shift { .. } | Collective::Refused { .. })
    }
}

/// What a rank's call must answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Ok,
    /// `InputFailed` naming this rank.
    InputFailed(usize),
    Refused,
}

/// The rounds' draws, on the property test's generator: a seed means one sequence everywhere.
impl Rng {
    /// An index below `n`.
    fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    fn words(&mut self, n: u32) -> Vec<u32> {
        (0..n).map(|_| self.next() as u32).collect()
    }

    /// Two distinct part-sized buffers.
    fn two(&mut self) -> (usize, usize) {
        let a = self.index(SLOTS);
        (a, (a + 1 + self.index(SLOTS - 1)) % SLOTS)
    }
}

/// The words of a part-sized buffer, or of the wide one.
fn words_in(slot: usize, n: usize) -> u32 {
    if slot == WIDE { PART * n as u32 } else { PART }
}

impl Round {
    fn draw(rng: &mut Rng, n: usize, next_tag: &mut u32) -> Self {
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
    fn after(
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

/// Every buffer of every rank, as the oracle knows it.
struct Oracle {
    held: Vec<Vec<Held>>,
}

/// Word `i` of the reduction of every rank's `rows` (rule 45), folded in
/// rank order in the type, wrapping. The word holds four 8-bit lanes, one
/// 32-bit element, or half of a 64-bit one (`i ^ 1` is the other half).
fn reduce_word(element: Element, op: Reduce, rows: &[&[u32]], i: usize) -> u32 {
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
    fn new(rng: &mut Rng, n: usize) -> Self {
        let held = (0..n)
            .map(|_| {
                (0..=SLOTS)
                    .map(|slot| Held::Clean(rng.words(words_in(slot, n))))
                    .collect()
            })
            .collect();
        Self { held }
    }

    fn ranks(&self) -> usize {
        self.held.len()
    }

    fn local(&mut self, rank: usize, local: &Local) {
        let held = &mut self.held[rank];
        match local {
            Local::Write { slot, words } => held[*slot] = Held::Clean(words.clone()),
            Local::Fail { slot, tag } => {
                held[*slot] = Held::Stale(vec![Origin {
                    named: None,
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
    fn failed_at(&self, rank: usize, slot: usize) -> Vec<Origin> {
        match &self.held[rank][slot] {
            Held::Stale(origins) => origins
                .iter()
                .map(|o| Origin {
                    named: Some(rank),
                    tag: o.tag,
                })
                .collect(),
            Held::Clean(_) => Vec::new(),
        }
    }

    /// The lowest rank whose buffer `collective` reads is stale, and that buffer.
    fn first_failed(&self, collective: Collective) -> Option<(usize, usize)> {
        (0..self.ranks()).find_map(|r| {
            let slot = collective.reads(r)?;
            matches!(self.held[r][slot], Held::Stale(_)).then_some((r, slot))
        })
    }

    fn words(&self, rank: usize, slot: usize) -> &[u32] {
        match &self.held[rank][slot] {
            Held::Clean(words) => words,
            Held::Stale(_) => unreachable!("only clean inputs are combined"),
        }
    }

    /// Apply `collective`, which every rank calls the same way. It reads what [`Collective::reads`]
    /// says. It writes `outputs(rank)`, made from the clean inputs, into every rank's `dst`. Every
    /// rank's answer.
    fn collective(
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
    fn apply(&mut self, collective: Collective) -> Vec<Vec<Answer>> {
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

/// Make `rank`'s calls of `collective` on `buffers`, in the order [`Oracle::apply`] answers them.
fn call<B: Backend>(rank: &Rank<B>, parts: &Parts, collective: Collective) -> Vec<Result<()>> {
    let n = rank.ranks();
    let r = rank.index();
    let all = |slot: usize| parts.view(slot);
    match collective {
        Collective::AllReduce {
            src,
            dst,
            element,
            op,
        } => vec![rank.all_reduce(all(src), all(dst), element, op)],
        Collective::AllGather { src } => vec![rank.all_gather(all(src), all(WIDE))],
        Collective::ReduceScatter { dst, element, op } => {
            vec![rank.reduce_scatter(all(WIDE), all(dst), element, op)]
        }
        Collective::AllToAll { src, dst } => vec![rank.all_to_all(all(src), all(dst))],
        Collective::Broadcast { root, slot } => vec![rank.broadcast(root, all(slot))],
        Collective::Shift { src, dst } => {
            // Even ranks send first, odd ones receive first. Between processes a send waits for its
            // receiver (rule 48), so a ring in which every rank sends first would stall.
            let send = || rank.send((r + 1) % n, all(src));
            let recv = || rank.recv((r + n - 1) % n, all(dst));
            if r.is_multiple_of(2) {
                let sent = send();
                vec![sent, recv()]
            } else {
                let received = recv();
                vec![send(), received]
            }
        }
        Collective::Refused { odd, src, dst, how } => vec![match how {
            Disagreement::Call if r == odd => rank.all_gather(all(src), all(WIDE)),
            Disagreement::Length if r == odd => rank.all_reduce(
                all(src),
                parts.words(dst, PART / 2),
                Element::U32,
                Reduce::Sum,
            ),
            _ => rank.all_reduce(all(src), all(dst), Element::U32, Reduce::Sum),
        }],
    }
}

/// Whether `got` is what the oracle said the call answers.
fn answered(at: &str, got: &Result<()>, expected: Answer) {
    match (got, expected) {
        (Ok(()), Answer::Ok) => {}
        (Err(error), Answer::InputFailed(rank)) => match error {
            Error::Collective(c) => match &**c {
                CollectiveError::InputFailed { rank: named, .. } if *named == rank => {}
                other => panic!("{at}: expected InputFailed naming rank {rank}, got {other}"),
            },
            other => panic!("{at}: expected InputFailed naming rank {rank}, got {other}"),
        },
        (Err(error), Answer::Refused) => assert!(
            matches!(collective_error(error), CollectiveError::Refused { .. }),
            "{at}: expected a refusal, got {error}"
        ),
        (got, expected) => panic!("{at}: expected {expected:?}, got {got:?}"),
    }
}

/// Read `part` and hold it to what the oracle knows. A stale part's origins narrow to those its
/// root matches.
fn check_read<B: Backend>(at: &str, client: &Client<B>, part: Slice<'_>, held: &mut Held) {
    match (client.read(part).map(|b| as_words(&b)), held) {
        (Ok(words), Held::Clean(expected)) => {
            assert!(
                words == *expected,
                "{at}: read {words:?}, expected {expected:?}"
            );
        }
        (Err(error), Held::Stale(origins)) => {
            let root = error.root();
            let named = match root {
                Error::Collective(c) => match &**c {
                    CollectiveError::InputFailed { rank, .. } => Some(*rank),
                    other => panic!("{at}: a stale buffer's root is {other}"),
                },
                _ => None,
            };
            let text = format!("{root:?}");
            let before = origins.clone();
            origins.retain(|o| o.named == named && text.contains(&tag_text(o.tag)));
            assert!(
                !origins.is_empty(),
                "{at}: the root names {named:?} and is {root}; expected one of {before:?}"
            );
        }
        (Ok(words), Held::Stale(origins)) => {
            panic!(
                "{at}: read {} words as clean; expected a failure from {origins:?}",
                words.len()
            )
        }
        (Err(error), Held::Clean(_)) => panic!("{at}: expected clean words, read failed: {error}"),
    }
}

/// What one rank's thread counted. Rounds recorded and replayed. Its calls that ran, failed on an
/// input, and were refused. Devices lost and recovered in place, and shrinks of every rank. Ranks
/// lost, shrunk away and admitted back. The most rounds in flight at a read, and the words read.
type Tally = [usize; 9];

/// Rank `rank`'s side of `rounds` random rounds from `seed`. Every round is drawn whole, and the
/// whole oracle kept. This rank's parts are played and its buffers held to the oracle.
/// `over_device`: the group's transport can record a round.
fn play<B: Backend>(
    mut rank: Rank<B>,
    seed: u64,
    rounds: usize,
    over_device: bool,
    changes: Option<&Handoff<B>>,
) -> Tally {
    let n = rank.ranks();
    let mut tally = [0usize; 9];
    let mut in_flight = 0;
    let c = rank.client().clone();
    let c = &c;
    let mut rng = Rng::new(seed);
    let mut oracle = Oracle::new(&mut rng, n);
    let first = rank.index();
    let parts = Parts::upload(c, &oracle, first, &mut Rng::new(seed ^ (first as u64 + 1)));
    let mut next_tag = 0;
    let mut log: Vec<String> = Vec::new();
    for round in 0..rounds {
        let event = changes.and_then(|_| Event::draw(&mut rng, n, &mut next_tag));
        if let (Some(event), Some(handoff)) = (event, changes) {
            log.push(format!("{round}: {event:?}"));
            let at = format!("seed {seed}, round {round}, {event:?}");
            rank = changes::apply(&at, (event, round), rank, &mut oracle, &parts, handoff);
            tally[match event {
                Event::Lose { .. } => 4,
                Event::Reform => 5,
                Event::Rotate { .. } => 6,
            }] += 1;
        }
        let r = rank.index();
        let rank = &rank;
        let plan = Round::draw(&mut rng, n, &mut next_tag);
        log.push(format!("{round}: {plan:?}"));
        let at = |what: &str| {
            let tail = log[log.len().saturating_sub(4)..].join("\n  ");
            format!("seed {seed}, rank {r}, round {round}, {what}; the last rounds:\n  {tail}")
        };
        for (owner, locals) in plan.locals.iter().enumerate() {
            for local in locals {
                oracle.local(owner, local);
                if owner == r {
                    do_local(c, &parts, local);
                }
            }
        }
        let collective = plan.collective;
        let mut copied_in_graph = None;
        let answers = if plan.recorded
            && over_device
            && collective.recordable()
            && oracle.first_failed(collective).is_none()
        {
            let capture = c.begin_capture().expect("a window opens");
            for recorded in call(rank, &parts, collective) {
                recorded.unwrap_or_else(|e| panic!("{}: {e}", at("recording")));
            }
            if let (Some(from), Some(to)) = (collective.writes(), plan.recorded_copy) {
                c.copy(parts.view(from), parts.view(to))
                    .unwrap_or_else(|e| panic!("{}: {e}", at("recording the copy")));
                copied_in_graph = Some((from, to));
            }
            let graph = c
                .end_capture(capture)
                .unwrap_or_else(|e| panic!("{}: {e}", at("sealing")));
            if let Some((owner, late)) = &plan.late {
                oracle.local(*owner, late);
                if *owner == r {
                    do_local(c, &parts, late);
                }
            }
            tally[0] += 1;
            let replayed = rank.replay(&graph);
            c.destroy_graph(&graph)
                .unwrap_or_else(|e| panic!("{}: {e}", at("destroying the graph")));
            vec![replayed]
        } else {
            call(rank, &parts, collective)
        };
        let expected = oracle.apply(collective);
        for (i, (got, &want)) in answers.iter().zip(&expected[r]).enumerate() {
            answered(&at(&format!("call {i}")), got, want);
            match want {
                Answer::Ok => tally[1] += 1,
                Answer::InputFailed(_) => tally[2] += 1,
                Answer::Refused => tally[3] += 1,
            }
        }
        if let Some((from, to)) = copied_in_graph {
            for owner in 0..n {
                oracle.local(owner, &Local::Copy { from, to });
            }
        }
        for (owner, locals) in plan.after.iter().enumerate() {
            for local in locals {
                oracle.local(owner, local);
                if owner == r {
                    do_local(c, &parts, local);
                }
            }
        }
        in_flight += 1;
        assert!(rank.broken().is_none(), "{}", at("the group broke"));
        // Around a change every rank reads: the change's own checks expect nothing in flight.
        if plan.read || in_flight == IN_FLIGHT || round + 1 == rounds || changes.is_some() {
            for slot in 0..=SLOTS {
                check_read(
                    &at(&format!("buffer {slot} ({in_flight} rounds in flight)")),
                    c,
                    parts.view(slot),
                    &mut oracle.held[r][slot],
                );
                tally[8] += words_in(slot, n) as usize;
            }
            parts.check_margins(&at("the margins"), c);
            if let Err(books) = c.audit() {
                panic!("{}: {books}", at("the store's books"));
            }
            tally[7] = tally[7].max(in_flight);
            in_flight = 0;
        }
    }
    tally
}

/// `rounds` random rounds per seed of `seeds` on a group of the suite's ranks.
/// `SCOPE_PROPERTY_SEED` replaces the seeds with one. Each rank holds its buffers to the oracle
/// after every round.
///
/// # Panics
///
/// When a rank's call or read disagrees with the oracle, the group breaks, or the books do not add
/// up. It prints the seed and the rounds so far first.
pub fn random_rounds<S: Suite>(seeds: &[u64], rounds: usize) {
    let rounds = rounds_or_asked(rounds);
    for seed in seeds_or_the_one_asked(seeds) {
        let Some(group) = group_of::<S>(ranks_for::<S>(seed), DEFAULT_WAIT) else {
            return;
        };
        let over_device = group.is_over_device();
        let tallies = group.run(|rank| play(rank, seed, rounds, over_device, None));
        report("", seed, rounds, &tallies);
    }
}

/// [`random_rounds`] with events between rounds, for a suite whose devices recover
/// ([`Client::recover`]). A rank's device is lost and recovered in place. Every rank shrinks to a
/// new epoch. A rank is lost, shrunk away, recovered and admitted back (`rounds/changes.rs`).
///
/// # Panics
///
/// As [`random_rounds`]; when a change or a recovery fails.
pub fn random_rounds_with_changes<S: Suite>(seeds: &[u64], rounds: usize) {
    let rounds = rounds_or_asked(rounds);
    for seed in seeds_or_the_one_asked(seeds) {
        let Some(group) = group_of::<S>(ranks_for::<S>(seed), DEFAULT_WAIT) else {
            return;
        };
        let over_device = group.is_over_device();
        let handoff = Handoff::new();
        let tallies = group.run(|rank| play(rank, seed, rounds, over_device, Some(&handoff)));
        report(" with losses and changes", seed, rounds, &tallies);
    }
}

/// [`random_rounds`] on ranks that each joined alone, from the identity ([`Rank::join`]). Ranks in
/// separate processes do the same. Every decision is a ballot through the device transport.
///
/// # Panics
///
/// As [`random_rounds`]; when a rank does not join.
pub fn random_rounds_joined<S: Suite>(seeds: &[u64], rounds: usize)
where
    S::Backend: DeviceCollectives,
{
    let rounds = rounds_or_asked(rounds);
    for seed in seeds_or_the_one_asked(seeds) {
        let Some(tallies) =
            each_of_ranks_alone::<S, _>(ranks_for::<S>(seed), DEFAULT_WAIT, |rank| {
                play(rank, seed, rounds, true, None)
            })
        else {
            return;
        };
        report(" joined alone", seed, rounds, &tallies);
    }
}

/// `seeds`, or the one `SCOPE_PROPERTY_SEED` names, or `0..n` for `SCOPE_ROUND_SEEDS=n`.
fn seeds_or_the_one_asked(seeds: &[u64]) -> Vec<u64> {
    if let Some(seed) = property::env_seed() {
        return vec![seed];
    }
    property::env_number("SCOPE_ROUND_SEEDS").map_or_else(|| seeds.to_vec(), |n| (0..n).collect())
}

/// `rounds`, or the number `SCOPE_ROUNDS` names.
fn rounds_or_asked(rounds: usize) -> usize {
    property::env_number("SCOPE_ROUNDS").map_or(rounds, |n| n as usize)
}

fn report(how: &str, seed: u64, rounds: usize, tallies: &[Tally]) {
    let [
        recorded,
        ok,
        failed,
        refused,
        lost,
        reformed,
        rotated,
        in_flight,
        _,
    ] = tallies[0];
    let words: usize = tallies.iter().map(|t| t[8]).sum();
    let events = if lost + reformed + rotated > 0 {
        format!(
            "; {lost} devices lost and recovered in place, {reformed} shrinks of every rank, \
             {rotated} ranks lost, shrunk away and admitted back"
        )
    } else {
        String::new()
    };
    println!(
        "random rounds: seed {seed}, {rounds} rounds on {} rank(s){how}; rank 0's calls: {ok} ran, \
         {failed} failed on an input, {refused} refused; {recorded} rounds recorded and replayed\
         {events}; at most {in_flight} rounds in flight at a read; {words} words read, as the oracle \
         said",
        tallies.len()
    );
}

fn do_local<B: Backend>(c: &Client<B>, parts: &Parts, local: &Local) {
    match local {
        Local::Write { slot, words } => c
            .write(parts.view(*slot), &as_bytes(words))
            .expect("a host write"),
        Local::Fail { slot, tag } => c
            .fail_writing(&[parts.view(*slot)], injected(&tag_text(*tag)))
            .expect("a claim from outside"),
        Local::Copy { from, to } => {
            // A copy of stale bytes is skipped, its destination claimed.
            let _ = c.copy(parts.view(*from), parts.view(*to));
        }
        Local::Through { from, to } => {
            let through = c
                .try_allocate(u64::from(PART) * 4)
                .expect("a buffer to copy through");
            let _ = c.copy(parts.view(*from), through.all());
            let _ = c.copy(through.all(), parts.view(*to));
        }
    }
}

/// Random rounds of every collective hold to the oracle on every rank (rules 41, 44, 45, 48).
/// Failed, healed and copied buffers come between them. [`ROUND_SEEDS`], [`ROUNDS`] each.
pub fn random_rounds_of_collectives_match_the_oracle<S: Suite>() {
    random_rounds::<S>(&ROUND_SEEDS, ROUNDS);
}

/// [`random_rounds_of_collectives_match_the_oracle`] with devices lost and recovered between
/// rounds. The group is shrunk and grown too (rules 41, 44, 51, 54–57). Every rank's buffers are
/// held to the oracle throughout. [`ROUND_SEEDS`], [`ROUNDS`] each.
pub fn random_rounds_with_losses_and_changes_match_the_oracle<S: Suite>() {
    random_rounds_with_changes::<S>(&ROUND_SEEDS, ROUNDS);
}

/// [`random_rounds_of_collectives_match_the_oracle`] on ranks that each joined alone. They decide
/// by ballot (rules 41, 44, 48, 49, 50).
pub fn random_rounds_of_ranks_joined_alone_match_the_oracle<S: Suite>()
where
    S::Backend: DeviceCollectives,
{
    random_rounds_joined::<S>(&ROUND_SEEDS, ROUNDS);
}

/// The random rounds: one `#[test]` each for `$suite`, with what each needs.
#[macro_export]
macro_rules! rounds_tests {
    ($suite:ty) => {
        $crate::behaviour! { $suite, rounds::random_rounds_of_collectives_match_the_oracle }
        $crate::behaviour! { joined $suite, rounds::random_rounds_of_ranks_joined_alone_match_the_oracle }
        $crate::behaviour! { $suite, rounds::random_rounds_with_losses_and_changes_match_the_oracle, Reopen }
    };
}
