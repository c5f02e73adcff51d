//! Act four, continued: a rank's device is lost in the middle of training,
//! and the group survives it ([`crate::elastic`]).
//!
//! The others shrink and train on over their rows. The lost rank's device opens
//! again, the group admits it, and a broadcast heals its weights. Every rank ends
//! with the same bits as the CPU's steps under the same membership.
//!
//! Where its device cannot open again in this process, the lost rank stays out
//! and the survivors go on. Its recovery answered `Error::RestartRequired` (a new
//! process must bring it back) or `Error::Refused` (a reset would destroy another
//! client's memory on the same device, or it should be tried later).

use std::time::{Duration, Instant};

use scope_core::{Backend, Client, Error, Recovered, Result};

use super::check::StepCheck;
use crate::data_parallel::{DataParallel, RankStep, identical, input_failed, reference_step};
use crate::mlp::Weights;

/// How a device is lost: for real where the backend can (wgpu's `Device::destroy`),
/// else by an injected sticky fault. Returns what it did and whether it was real.
pub type Lose<'a, B> = &'a dyn Fn(&Client<B>) -> Result<(String, bool)>;

/// One line of the membership timeline.
#[derive(Clone, Debug)]
pub struct Event {
    /// The epoch after it.
    pub epoch: u64,
    /// The members after it, by rank (replica indices).
    pub members: Vec<usize>,
    /// What happened.
    pub what: String,
    /// How long it took.
    pub took: Duration,
}

/// What the act saw.
#[derive(Debug)]
pub struct Survival {
    /// The replica whose device is lost.
    pub lost: usize,
    /// How it was lost.
    pub how: String,
    /// Whether the loss was real rather than injected.
    pub real: bool,
    /// The step it was lost in named it everywhere, updated nothing, changed no weights.
    pub lost_step_contained: bool,
    /// The survivors' view of that step.
    pub lost_step: StepCheck,
    /// Steps the survivors took alone, each against the CPU's step on their rows.
    pub shrunk_steps: Vec<StepCheck>,
    /// What the lost rank's recovery answered if it stayed out; `None` when it came back.
    pub stayed_out: Option<Error>,
    /// Buffers the recovered device made again, lost with the device.
    pub lost_buffers: usize,
    /// Every member's weights were the same bits after the heal (or the survivors' steps).
    pub healed_identical: bool,
    /// The step after the lost rank came back (or the survivors' next one).
    pub rejoined_step: StepCheck,
    /// The membership timeline.
    pub timeline: Vec<Event>,
    /// Failures each device still holds at the end.
    pub failures_held: Vec<usize>,
}

impl Survival {
    /// Every check of the act passed; a lost rank may stay out if the survivors went on.
    pub fn passed(&self) -> bool {
        let members = self.timeline[0].members.len() - usize::from(self.stayed_out.is_some());
        self.lost_step_contained
            && self.shrunk_steps.iter().all(StepCheck::clean)
            && self.healed_identical
            && self.rejoined_step.clean()
            && self.rejoined_step.ranks.len() == members
            && self
                .failures_held
                .iter()
                .enumerate()
                .all(|(replica, &n)| n == 0 || (self.stayed_out.is_some() && replica == self.lost))
    }
}

/// Whether `error`, from a lost rank's readmission, leaves it out while the group
/// goes on: its device cannot open again in this process, now or at all.
fn stays_out(error: &Error) -> bool {
    matches!(error, Error::RestartRequired { .. } | Error::Refused { .. })
}

/// The CPU's step from `weights` on the rows of `members`' shards, in their order.
fn reference_over(
    weights: &Weights,
    (x, targets): (&[f32], &[f32]),
    members: &[usize],
    (replicas, lr): (usize, f32),
) -> crate::data_parallel::ReferenceStep {
    let s = weights.shape;
    let rows = s.batch / replicas;
    let pick = |all: &[f32], width: usize| -> Vec<f32> {
        members
            .iter()
            .flat_map(|&m| all[m * rows * width..(m + 1) * rows * width].to_vec())
            .collect()
    };
    let mut w = weights.clone();
    w.shape.batch = rows * members.len();
    let mut step = reference_step(&w, &pick(x, s.input), &pick(targets, s.output), lr);
    step.next.shape = s;
    step.gradient.shape = s;
    step
}

/// Run the act on `dp`, whose members all hold `weights`: lose replica `lost` with `lose`,
/// take a failing step, shrink, take two steps, readmit and heal it, and step on every rank.
/// Fails when the shrink, the recovery, the admission or the heal fails.
pub fn survive<B: Backend>(
    dp: &mut DataParallel<B>,
    (x, targets, lr): (&[f32], &[f32], f32),
    weights: &Weights,
    (lost, lose): (usize, Lose<'_, B>),
) -> Result<Survival> {
    let replicas = dp.ranks();
    let mut timeline = vec![Event {
        epoch: dp.epoch(),
        members: dp.members().to_vec(),
        what: "the group as made".to_owned(),
        took: Duration::ZERO,
    }];
    let start = Instant::now();
    let client = dp.replica(lost).runtime().client().clone();
    let (how, real) = lose(&client)?;
    timeline.push(Event {
        epoch: dp.epoch(),
        members: dp.members().to_vec(),
        what: format!("rank {lost}'s device lost: {how}"),
        took: start.elapsed(),
    });

    // The step in which it is lost: nothing is written anywhere.
    let all = dp.members().to_vec();
    let reference = reference_over(weights, (x, targets), &all, (replicas, lr));
    let survivor = all.iter().copied().find(|&r| r != lost).unwrap_or(0);
    let before = dp.weights(survivor)?;
    let (steps, time) = dp.step(None);
    let survivors: Vec<RankStep> = steps.into_iter().filter(|s| s.rank != lost).collect();
    let named_lost = survivors.iter().all(|s| {
        s.all_reduce
            .as_ref()
            .err()
            .and_then(input_failed)
            .is_some_and(|(rank, _)| rank == lost)
    });
    let lost_step = StepCheck::new(survivors, time, &before, &reference, false);
    let lost_step_contained = named_lost
        && lost_step.updated == 0
        && lost_step.weights_identical
        && lost_step.weights_change == 0.0;

    let start = Instant::now();
    let members = dp.shrink()?;
    timeline.push(Event {
        epoch: dp.epoch(),
        members: members.clone(),
        what: format!("the survivors shrank the group, rank {lost} not waited for"),
        took: start.elapsed(),
    });
    let mut current = weights.clone();
    let mut shrunk_steps = Vec::new();
    for _ in 0..2 {
        let reference = reference_over(&current, (x, targets), &members, (replicas, lr));
        let (steps, time) = dp.step(None);
        shrunk_steps.push(StepCheck::new(steps, time, &current, &reference, true));
        current = reference.next;
    }

    let start = Instant::now();
    let mut stayed_out = None;
    let mut lost_buffers = 0;
    match dp.readmit(lost) {
        Ok(readmission) => {
            if let Recovered::Reopened { buffers, .. } = &readmission.recovered {
                lost_buffers = *buffers;
            }
            timeline.push(Event {
                epoch: dp.epoch() - 1,
                members: members.clone(),
                what: format!(
                    "rank {lost}'s device opened again: {lost_buffers} buffers made anew, each \
                     lost with the device until written"
                ),
                took: readmission.recover,
            });
            timeline.push(Event {
                epoch: dp.epoch(),
                members: dp.members().to_vec(),
                what: format!("the group admitted rank {lost} as its last rank"),
                took: readmission.admit,
            });
            timeline.push(Event {
                epoch: dp.epoch(),
                members: dp.members().to_vec(),
                what: format!("a broadcast from rank 0 healed rank {lost}'s weights"),
                took: readmission.heal,
            });
        }
        // Refused before the group changed: the survivors go on alone.
        Err(why) if stays_out(&why) && !dp.members().contains(&lost) => {
            timeline.push(Event {
                epoch: dp.epoch(),
                members: dp.members().to_vec(),
                what: format!("rank {lost} stays out, the survivors go on: {why}"),
                took: start.elapsed(),
            });
            stayed_out = Some(why);
        }
        Err(other) => return Err(other),
    }
    let healed: Vec<_> = dp.members().iter().map(|&r| dp.weights(r)).collect();
    let healed_identical = match healed.first() {
        Some(Ok(first)) => healed
            .iter()
            .all(|w| w.as_ref().is_ok_and(|w| identical(w, first))),
        _ => false,
    };

    let members = dp.members().to_vec();
    let reference = reference_over(&current, (x, targets), &members, (replicas, lr));
    let (steps, time) = dp.step(None);
    let rejoined_step = StepCheck::new(steps, time, &current, &reference, true);
    Ok(Survival {
        lost,
        how,
        real,
        lost_step_contained,
        lost_step,
        shrunk_steps,
        stayed_out,
        lost_buffers,
        healed_identical,
        rejoined_step,
        timeline,
        failures_held: dp.failures_held(),
    })
}
