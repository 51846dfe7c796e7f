//! The final cross-fitted pass: the contexts are dealt into folds, the final family (the
//! ensemble, or the MLP when the run has no ensemble phase) is trained on all folds but one
//! and scores the held-out fold's gold and every pool ending; stored as `af_folds` and
//! `af_scores`, which finishes the run.

use anyhow::Result;

use super::adversary::Adversary;
use super::config::{split_groups, Config};
use super::held_out::{accuracy, mean_of_read, score_held_out, training_choices, StyleScales};
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

/// Returns each context's fold, the final scores ([`FinalScore`]) of every gold and pool
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
        let style = StyleScales::of_found(&held_out);
        for h in &held_out {
            scores.push(h.final_score(0, h.context.gold.ending_id, &style));
            for (i, e) in h.context.candidates.iter().enumerate() {
                scores.push(h.final_score(i + 1, e.ending_id, &style));
            }
        }
        held_out_all.extend(held_out);
        observer.fold_done();
    }
    let accuracy = accuracy(&held_out_all, assignment);
    if !word_level_heads_find_style(&accuracy, data.contexts.len(), config) {
        scores.iter_mut().for_each(|s| s.style = None);
    }
    Ok((fold_of, scores, accuracy))
}

/// Whether the word-level heads' mean held-out accuracy is above chance by the convergence
/// rule's margin. Only then are their style scores kept for matching the distractors: scores
/// that find no style are the noise of a few contexts' words, which the audit's classifiers,
/// trained on the same contexts, share: matching on them pushed the n-gram rows of 150-context
/// projects under chance.
fn word_level_heads_find_style(accuracy: &HeadAccuracy, contexts: usize, config: &Config) -> bool {
    let heads = [accuracy.bow, accuracy.cnn, accuracy.lstm, accuracy.subword];
    mean_of_read(heads.into_iter().flatten())
        .is_some_and(|mean| !config.convergence.at_chance(config.k, contexts, mean))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn style_scores_are_kept_only_where_the_word_level_heads_beat_chance() {
        // k = 9: chance 0.1; two standard errors at chance are 0.033 over 339 contexts and
        // 0.049 over 147.
        let config = Config::default();
        let heads = |bow, cnn, lstm, subword| HeadAccuracy {
            bow: Some(bow),
            cnn: Some(cnn),
            lstm: Some(lstm),
            subword: Some(subword),
            // Neither the MLP nor the sentence model is a word-level head.
            mlp: Some(0.9),
            sentence: Some(0.9),
            ..HeadAccuracy::default()
        };
        let found = heads(0.180, 0.160, 0.157, 0.178);
        assert!(word_level_heads_find_style(&found, 339, &config));
        assert!(!word_level_heads_find_style(&found, 40, &config));
        let noise = heads(0.082, 0.143, 0.122, 0.129);
        assert!(!word_level_heads_find_style(&noise, 147, &config));
        let mlp_only = HeadAccuracy {
            mlp: Some(0.9),
            ..HeadAccuracy::default()
        };
        assert!(!word_level_heads_find_style(&mlp_only, 10_000, &config));
    }
}
