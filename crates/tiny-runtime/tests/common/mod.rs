//! What every test of act four asserts, on whichever server it ran.

use tiny_runtime::data_parallel::BACKWARD;
use tiny_runtime::demo::{DataParallelReport, StepCheck, TOLERANCE};

/// Rows a rank in the tests' data-parallel step: not a multiple of any
/// group size, so edges are exercised.
pub const ROWS_PER_RANK: usize = 11;

/// The tests' sizes over `ranks` ranks: none a multiple of a group size.
pub fn data_parallel_shape(ranks: usize) -> tiny_runtime::Shape {
    tiny_runtime::Shape {
        batch: ROWS_PER_RANK * ranks,
        input: 70,
        hidden: 45,
        output: 19,
    }
}

fn assert_clean(name: &str, step: &StepCheck, ranks: usize) {
    for r in &step.ranks {
        assert!(
            r.all_reduce.is_ok(),
            "{name}: rank {}: {:?}",
            r.rank,
            r.all_reduce
        );
        assert!(r.update.is_ok(), "{name}: rank {}: {:?}", r.rank, r.update);
    }
    assert!(
        step.gradients_identical,
        "{name}: every rank's all-reduced gradient is the same bits"
    );
    assert!(
        step.gradient_error <= TOLERANCE,
        "{name}: gradient off the CPU's by {}",
        step.gradient_error
    );
    assert_eq!(step.updated, ranks, "{name}: every rank updated");
    assert!(
        step.weights_identical,
        "{name}: the updated weights are the same bits on every rank"
    );
    assert!(
        step.weights_error <= TOLERANCE,
        "{name}: weights off the CPU's by {}",
        step.weights_error
    );
    assert!(
        step.weights_change > 0.0,
        "{name}: the update moved the weights"
    );
    assert!(
        step.loss_error() <= f64::from(TOLERANCE),
        "{name}: loss {:?} against the CPU's {}",
        step.loss,
        step.reference_loss
    );
}

/// Everything act four shows: a clean step agreeing with the CPU on every
/// rank; a fault in one rank's backward pass failing every rank's
/// all-reduced gradient, naming that rank, its root cause and its chain,
/// the update skipped everywhere and the weights unchanged and identical;
/// and the next step clean again, with no failure left held; then the
/// survival act, the lost rank taken back.
pub fn assert_data_parallel(report: &DataParallelReport) {
    assert_steps(report);
    assert_survival(report);
    assert!(report.passed());
}

/// As [`assert_data_parallel`], but the lost rank's device cannot open
/// again in this process: its readmission answers `why`, it stays out,
/// and the survivors go on, their next step clean over their rows.
#[allow(dead_code)]
pub fn assert_data_parallel_without_the_lost_rank(
    report: &DataParallelReport,
    why: fn(&scope_core::Error) -> bool,
) {
    assert_steps(report);
    let survival = report
        .survival
        .as_ref()
        .unwrap_or_else(|e| panic!("the group survives the lost device: {e}"));
    for event in &survival.timeline {
        println!(
            "epoch {} members {:?}: {} ({:?})",
            event.epoch, event.members, event.what, event.took
        );
    }
    let lost = report.faulted_rank;
    let survivors: Vec<usize> = (0..report.ranks).filter(|&r| r != lost).collect();
    assert!(survival.lost_step_contained);
    assert_eq!(
        survival.timeline[2].members, survivors,
        "the survivors shrank"
    );
    for (i, step) in survival.shrunk_steps.iter().enumerate() {
        assert_clean(&format!("survivors' step {i}"), step, survivors.len());
    }
    let stayed_out = survival
        .stayed_out
        .as_ref()
        .expect("the lost rank stays out");
    assert!(why(stayed_out), "its readmission answered {stayed_out}");
    assert_eq!(survival.lost_buffers, 0);
    let last = survival.timeline.last().expect("a timeline");
    assert_eq!(last.members, survivors, "not admitted");
    assert!(last.what.contains("stays out"), "{}", last.what);
    assert!(survival.healed_identical, "the survivors agree");
    assert_clean(
        "the survivors' step after it stayed out",
        &survival.rejoined_step,
        survivors.len(),
    );
    for (replica, &held) in survival.failures_held.iter().enumerate() {
        if replica != lost {
            assert_eq!(held, 0, "replica {replica} holds nothing");
        }
    }
    assert!(survival.passed());
    assert!(report.passed());
}

/// The steps before the loss: clean, faulted on one rank, clean again.
fn assert_steps(report: &DataParallelReport) {
    let ranks = report.ranks;
    assert!(report.loaded, "every rank starts from the same weights");
    assert_clean("step 1", &report.clean, ranks);

    let faulted = report.faulted_rank;
    assert_eq!(report.faulted_kernel, BACKWARD[0]);
    let step = &report.faulted;
    for (r, seen) in step.ranks.iter().zip(&report.failed) {
        let rank = r.rank;
        let error = r
            .gradient
            .as_ref()
            .expect_err("every rank's all-reduced gradient reads as failed");
        println!("rank {rank} reads its all-reduced gradient:\n{error}");
        assert!(r.all_reduce.is_err(), "rank {rank}: its all_reduce fails");
        assert_eq!(
            seen.all_reduce_names,
            Some(faulted),
            "rank {rank}: all_reduce names the faulted rank"
        );
        assert_eq!(
            seen.gradient_names,
            Some(faulted),
            "rank {rank}: the read names the faulted rank: {error}"
        );
        let root = seen.root.as_deref().unwrap_or_default();
        assert!(
            root.contains("INJECTED_LAUNCH_FAILURE") && root.contains("`loss.grad` on rank"),
            "rank {rank}: the root cause travels: {root}"
        );
        assert_eq!(
            seen.chain,
            ["layer1.bias_grad", "layer1.gelu_grad", "layer2.input_grad"],
            "rank {rank}: the faulted rank's chain travels: {error}"
        );
        let text = error.to_string();
        assert!(
            text.contains(&format!("rank {faulted}'s input could not be read"))
                && text.contains("skipped `layer2.input_grad`"),
            "rank {rank}: the read's text names the rank and the chain: {text}"
        );
        assert!(
            seen.update_skipped,
            "rank {rank}: the update was skipped for the failed gradient: {:?}",
            r.update
        );
        assert!(
            r.loss.is_ok(),
            "rank {rank}: the forward pass ran clean: {:?}",
            r.loss
        );
    }
    assert_eq!(step.updated, 0, "no rank updated");
    assert!(
        step.weights_identical,
        "the weights are the same bits on every rank"
    );
    assert_eq!(
        step.weights_error, 0.0,
        "the weights read back as before the step"
    );
    assert_eq!(step.weights_change, 0.0);
    assert!(
        step.loss_error() <= f64::from(TOLERANCE),
        "loss {:?} against the CPU's {}",
        step.loss,
        step.reference_loss
    );

    assert_clean("step 3", &report.recovered, ranks);
    assert_eq!(
        report.recovered.loss, report.faulted.loss,
        "step 3 starts where step 2 did: the failed step changed nothing"
    );
    assert!(
        report.failures_held.iter().all(|&n| n == 0),
        "the next step healed every failure: {:?}",
        report.failures_held
    );
}

/// Then the faulted rank's device is lost (rules 51, 54–57): the step it
/// is lost in fails on every survivor naming it, nothing updated; the
/// survivors shrink without it and train on, each step the CPU's over
/// their rows; it comes back, is admitted and healed, and the next step on
/// every rank is the CPU's over every row, the weights the same bits
/// everywhere and no failure left held.
fn assert_survival(report: &DataParallelReport) {
    let survival = report
        .survival
        .as_ref()
        .unwrap_or_else(|e| panic!("the group survives the lost device: {e}"));
    let lost = report.faulted_rank;
    for event in &survival.timeline {
        println!(
            "epoch {} members {:?}: {} ({:?})",
            event.epoch, event.members, event.what, event.took
        );
    }
    assert!(
        survival.lost_step_contained,
        "the step it was lost in is contained: {:?}",
        survival.lost_step.ranks
    );
    let survivors: Vec<usize> = (0..report.ranks).filter(|&r| r != lost).collect();
    assert_eq!(
        survival.timeline[2].members, survivors,
        "the survivors shrank"
    );
    for (i, step) in survival.shrunk_steps.iter().enumerate() {
        assert_clean(&format!("survivors' step {i}"), step, survivors.len());
    }
    assert!(
        survival.stayed_out.is_none(),
        "taken back: {:?}",
        survival.stayed_out
    );
    assert!(
        survival.lost_buffers > 0,
        "the recovered device made its buffers again"
    );
    assert!(
        survival.healed_identical,
        "the heal gave it the same weights"
    );
    let mut every = survivors.clone();
    every.push(lost);
    assert_eq!(
        survival.timeline.last().map(|e| e.members.clone()),
        Some(every),
        "admitted as the last rank"
    );
    assert_clean(
        "the step after it came back",
        &survival.rejoined_step,
        report.ranks,
    );
    assert!(
        survival.failures_held.iter().all(|&n| n == 0),
        "nothing left held: {:?}",
        survival.failures_held
    );
    assert!(survival.passed());
}
