//! One step of act four checked against the CPU: what every rank saw, and
//! whether it is what a clean (or a failed) step should leave.

use std::time::Duration;

use crate::data_parallel::{RankStep, ReferenceStep, identical, max_difference};
use crate::mlp::Weights;

/// How close a device result must be to the CPU reference: `f32` sums of a
/// thousand terms differ from the `f64` reference by about 1e-6 of a logit.
pub const TOLERANCE: f32 = 1e-4;

/// One step of act four, checked against what it should have done.
#[derive(Debug)]
pub struct StepCheck {
    /// What each rank saw.
    pub ranks: Vec<RankStep>,
    /// The step's wall time, every rank's work and the collective.
    pub time: Duration,
    /// The ranks' mean loss before the update (`None` if a rank could not read it).
    pub loss: Option<f64>,
    /// The CPU's loss on the whole batch.
    pub reference_loss: f64,
    /// Every rank read its all-reduced gradient, and all were the same bits.
    pub gradients_identical: bool,
    /// Rank 0's all-reduced gradient against the CPU's (infinite when unreadable).
    pub gradient_error: f32,
    /// Every rank read its weights after the step, and all were the same bits.
    pub weights_identical: bool,
    /// Rank 0's weights after the step against the CPU's update (or the old ones if failed).
    pub weights_error: f32,
    /// The largest change of rank 0's weights in the step.
    pub weights_change: f32,
    /// How many ranks' updates wrote their new weights.
    pub updated: usize,
}

impl StepCheck {
    pub(super) fn new(
        ranks: Vec<RankStep>,
        time: Duration,
        before: &Weights,
        reference: &ReferenceStep,
        expect_update: bool,
    ) -> Self {
        let losses: Option<Vec<f64>> = ranks
            .iter()
            .map(|r| r.loss.as_ref().ok().copied())
            .collect();
        let loss = losses.map(|l| l.iter().sum::<f64>() / l.len().max(1) as f64);
        let all_same = |get: &dyn Fn(&RankStep) -> Option<&Weights>| match get(&ranks[0]) {
            Some(first) => ranks
                .iter()
                .all(|r| get(r).is_some_and(|w| identical(w, first))),
            None => false,
        };
        let gradients_identical = all_same(&|r| r.gradient.as_ref().ok());
        let weights_identical = all_same(&|r| r.weights.as_ref().ok());
        let gradient_error = ranks[0]
            .gradient
            .as_ref()
            .map_or(f32::INFINITY, |g| max_difference(g, &reference.gradient));
        let expected = if expect_update {
            &reference.next
        } else {
            before
        };
        let (weights_error, weights_change) = ranks[0]
            .weights
            .as_ref()
            .map_or((f32::INFINITY, f32::INFINITY), |w| {
                (max_difference(w, expected), max_difference(w, before))
            });
        let updated = ranks.iter().filter(|r| r.update.is_ok()).count();
        Self {
            loss,
            reference_loss: reference.loss,
            gradients_identical,
            gradient_error,
            weights_identical,
            weights_error,
            weights_change,
            updated,
            time,
            ranks,
        }
    }

    /// The loss's distance from the CPU's (infinite when unreadable).
    pub fn loss_error(&self) -> f64 {
        self.loss
            .map_or(f64::INFINITY, |l| (l - self.reference_loss).abs())
    }

    /// A clean step did what it should: every update written, and gradients and weights
    /// the same everywhere and the CPU's.
    pub fn clean(&self) -> bool {
        self.gradients_identical
            && self.gradient_error <= TOLERANCE
            && self.updated == self.ranks.len()
            && self.weights_identical
            && self.weights_error <= TOLERANCE
            && self.loss_error() <= f64::from(TOLERANCE)
    }
}
