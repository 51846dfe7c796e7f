//! One AF iteration (SWAG Algorithm 1's loop body): split the contexts 80/20, train a fresh
//! model on the 80% under the current assignment, score the held-out pools, and swap each
//! held-out context's easily spotted negatives for candidates the model finds likelier.

use std::time::Instant;

use anyhow::Result;

use super::adversary::Adversary;
use super::config::{split_groups, Config, HeldOutTurns};
use super::held_out::{accuracy, score_held_out, training_choices, HeldOut};
use crate::algorithm::{choose_swaps, draw_seed, iteration_stream, rotating_split, split_80_20};
use crate::data::Dataset;
use crate::train::train;
use afkit_engine::seed::Key;
use afkit_store::af::{Assignment, IterationRecord, Phase, Swap};

/// What one iteration did, to commit and report.
pub(crate) struct IterationOutcome {
    pub record: IterationRecord,
    pub swaps: Vec<Swap>,
    /// Seconds spent training (the rest is scoring and bookkeeping).
    pub train_seconds: f64,
    /// Seconds of those and of the scoring spent on the fine-tuned adversary.
    pub adversary_seconds: f64,
}

/// One AF iteration, the `turn`-th of its phase: split, train, score the held-out pools,
/// measure, choose swaps. Its randomness comes from (seed, iteration, turn) alone, so a resumed
/// run repeats it exactly.
pub(crate) fn run_iteration(
    data: &Dataset,
    assignment: &Assignment,
    (family, iteration, turn): (Phase, usize, usize),
    config: &Config,
    adversary: Option<&Adversary>,
) -> Result<IterationOutcome> {
    let started = Instant::now();
    let mut rng = config.seed.stream(iteration_stream(iteration));
    let groups = split_groups(data, config);
    let (train_ids, test_ids) = match config.turns {
        HeldOutTurns::Random => split_80_20(&groups, &mut rng),
        HeldOutTurns::Rotating => {
            let round = turn / 5;
            let phase = family.name();
            let mut deal = config.seed.key(Key::HeldOutDeal { phase, round }).rng();
            rotating_split(&groups, turn, &mut deal)
        }
    };
    let model_seed = draw_seed(&mut rng);
    let choices = training_choices(data, &train_ids, assignment);
    let model = train(data, &choices, family, &config.train, model_seed)?;
    // The fine-tuned adversary joins the ensemble's iterations only.
    let adversary = adversary.filter(|_| family == Phase::Ensemble);
    let adversary_started = Instant::now();
    let trained = adversary
        .map(|a| a.trained(data, &train_ids, assignment, model_seed))
        .transpose()?;
    let mut adversary_seconds = adversary_started.elapsed().as_secs_f64();
    let train_seconds = started.elapsed().as_secs_f64();
    let mut held_out = score_held_out(&model, data, &test_ids)?;
    if let (Some(a), Some(trained)) = (adversary, &trained) {
        let joined = Instant::now();
        a.join(trained, &mut held_out, data, &test_ids)?;
        adversary_seconds += joined.elapsed().as_secs_f64();
    }
    let swaps: Vec<Swap> = held_out
        .iter()
        .flat_map(|h| easy_negative_swaps(h, &assignment[&h.context.example_id], config))
        .collect();
    let record = IterationRecord {
        iteration,
        phase: family,
        swaps: swaps.len(),
        seconds: started.elapsed().as_secs_f64(),
        n_test: test_ids.len(),
        accuracy: accuracy(&held_out, assignment),
    };
    Ok(IterationOutcome {
        record,
        swaps,
        train_seconds,
        adversary_seconds,
    })
}

/// The swaps of one held-out context whose negatives are `assigned`: its easy negatives, each
/// replaced by an unassigned candidate that the decisive head scores higher ([`choose_swaps`]).
fn easy_negative_swaps(h: &HeldOut, assigned: &[i64], config: &Config) -> Vec<Swap> {
    let decisive = h.decisive();
    let assigned_scores: Vec<(i64, f32)> = assigned
        .iter()
        .map(|id| (*id, decisive[h.position(*id)]))
        .collect();
    let unassigned: Vec<(i64, f32)> = h
        .context
        .candidates
        .iter()
        .enumerate()
        .filter(|(_, e)| !assigned.contains(&e.ending_id))
        .map(|(i, e)| (e.ending_id, decisive[i + 1]))
        .collect();
    choose_swaps(
        decisive[0],
        &assigned_scores,
        &unassigned,
        config.n_easy,
        config.replacement,
    )
    .into_iter()
    .map(|(slot, new_ending_id)| Swap {
        example_id: h.context.example_id,
        slot,
        old_ending_id: assigned[slot],
        new_ending_id,
    })
    .collect()
}

/// Replaces the swapped negatives in `assignment`.
pub(crate) fn apply_swaps(assignment: &mut Assignment, swaps: &[Swap]) {
    for s in swaps {
        if let Some(slots) = assignment.get_mut(&s.example_id) {
            slots[s.slot] = s.new_ending_id;
        }
    }
}
