//! The final cross-fitted pass: the contexts are dealt into folds, the final family (the
//! ensemble, or the MLP when the run has no ensemble phase) is trained on all folds but one
//! and scores the held-out fold's gold and every pool ending; stored as `af_folds` and
//! `af_scores`, which finishes the run.

use anyhow::Result;

use super::adversary::Adversary;
use super::config::{split_groups, Config};
use super::held_out::{accuracy, score_held_out, training_choices};
use super::observer::Observer;
use crate::algorithm::{draw_seed, folds, FINAL_STREAM};
use crate::data::Dataset;
use crate::train::train;
use afkit_store::af::{Assignment, FinalScore, HeadAccuracy};
use afkit_store::Store;

/// The final cross-fitted pass, stored with the run's folds; returns the number of endings
/// scored and every head's held-out accuracy.
pub(crate) fn finish_run(
    store: &mut Store,
    run_id: i64,
    data: &Dataset,
    assignment: &Assignment,
    config: &Config,
    adversary: Option<&Adversary>,
    observer: &mut dyn Observer,
) -> Result<(usize, HeadAccuracy)> {
    observer.final_pass_started(config.folds);
    let (fold_of, mut scores, accuracy) =
        final_pass(data, assignment, config, adversary, observer)?;
    // In key order, SQLite appends to the scores' B-tree instead of splitting pages all over it.
    scores.sort_unstable_by_key(|s| s.ending_id);
    let folds: Vec<(i64, usize)> = data
        .contexts
        .iter()
        .zip(&fold_of)
        .map(|(c, f)| (c.example_id, *f))
        .collect();
    store.finish_af_run(run_id, &folds, &scores, &accuracy)?;
    Ok((scores.len(), accuracy))
}

/// Returns each context's fold, the ensemble (and sentence model) score of every gold and pool
/// ending, and the held-out accuracy of every head over all folds.
fn final_pass(
    data: &Dataset,
    assignment: &Assignment,
    config: &Config,
    adversary: Option<&Adversary>,
    observer: &mut dyn Observer,
) -> Result<(Vec<usize>, Vec<FinalScore>, HeadAccuracy)> {
    let family = config.final_family();
    let mut rng = config.seed.stream(FINAL_STREAM);
    let fold_of = folds(&split_groups(data, config), config.folds, &mut rng);
    let mut scores = Vec::new();
    let mut held_out_all = Vec::new();
    for fold in 0..config.folds {
        afkit_engine::interrupt::check()?;
        let model_seed = draw_seed(&mut rng);
        let (test_ids, train_ids): (Vec<usize>, Vec<usize>) =
            (0..data.contexts.len()).partition(|&i| fold_of[i] == fold);
        let choices = training_choices(data, &train_ids, assignment);
        let model = train(data, &choices, family, &config.train, model_seed)?;
        let mut held_out = score_held_out(&model, data, &test_ids)?;
        if let Some(adversary) = adversary {
            let fold_model = adversary.trained(data, &train_ids, assignment, model_seed)?;
            adversary.join(&fold_model, &mut held_out, data, &test_ids)?;
        }
        for h in &held_out {
            scores.push(h.final_score(0, h.context.gold.ending_id));
            for (i, e) in h.context.candidates.iter().enumerate() {
                scores.push(h.final_score(i + 1, e.ending_id));
            }
        }
        held_out_all.extend(held_out);
        observer.fold_done();
    }
    let accuracy = accuracy(&held_out_all, assignment);
    Ok((fold_of, scores, accuracy))
}
