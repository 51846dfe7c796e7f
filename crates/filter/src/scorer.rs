//! Scorer models (`afkit filter --scorer MODEL`): further language models whose reading of every
//! ending joins the MLP's features, so that AF prefers distractors a stronger reader finds as
//! likely as the real ending.
//!
//! The generator's own features come from the prompt it sampled with; a scorer reads each ending
//! as lm-evaluation-harness poses a SWAG-style question (`lm::choice`): after `sent1 + " " +
//! sent2`. From the summed log-likelihood and the ending's length come the features a zero-shot
//! model decides on: the sum (`acc`), the sum per character (`acc_norm`) and the sum per token.
//! Every ending is scored once per model and stored ([`afkit_store::scorer`]), so a resumed or
//! repeated run reads the scores.
//!
//! The scorer does not read the endings after the document start alone. That second reading
//! cost as much as the first, and filtering without it moved no audit row beyond its standard
//! error (BENCHMARKS.md, "The scorer's reading of each ending alone"). Readings an earlier afkit stored with it keep their two further features
//! (per token alone, and the context's gain) while every option of a run has them.

use std::path::Path;

use anyhow::{Context, Result};

use crate::settings::Scorer;
use afkit_engine::lm::choice::{ChoiceQuestion, ChoiceScorer};
use afkit_engine::lm::model::LanguageModel;
use afkit_store::dataset::startphrase;
use afkit_store::scorer::{ScorerScore, Unread, UnreadContext};
use afkit_store::Store;

/// Features per scorer model and option; see [`scorer_features`].
pub(crate) const SCORER_FEATURES: usize = 5;

/// The features of [`scorer_features`] that need the reading alone, missing in readings made now.
pub(crate) const SCORER_ALONE_FEATURES: [usize; 2] = [3, 4];

/// Contexts scored together and committed in one transaction.
const BATCH_CONTEXTS: usize = 8;

/// The MLP's inputs from one scorer's reading of an ending: summed log-likelihood after the
/// context, the same per character and per token, then per token alone and the difference, which
/// only readings stored with the reading alone have.
pub(crate) fn scorer_features(score: &ScorerScore, ending: &str) -> [Option<f64>; SCORER_FEATURES] {
    let tokens = score.n_tok.max(1) as f64;
    let chars = ending.chars().count().max(1) as f64;
    [
        Some(score.ll_cond),
        Some(score.ll_cond / chars),
        Some(score.ll_cond / tokens),
        score.ll_alone.map(|alone| alone / tokens),
        score.ll_alone.map(|alone| (score.ll_cond - alone) / tokens),
    ]
}

/// Scores every pool ending `scorer` has not scored yet, [`BATCH_CONTEXTS`] contexts at a time,
/// each batch committed: an interrupted run keeps what it scored. `progress` hears (endings
/// scored so far, endings missing when it started).
pub(crate) fn store_scorer_scores(
    store: &mut Store,
    scorer: &Scorer,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<()> {
    let name = format!("scorer model {}", scorer.name);
    read_in_batches(
        store,
        &scorer.path,
        &name,
        Unread::Scorer {
            model: &scorer.sha256,
        },
        BATCH_CONTEXTS,
        progress,
        &|choice, batch, store| {
            store.put_scorer_scores(&scorer.sha256, &score_contexts(choice, batch)?)
        },
    )
}

/// Reads a batch of contexts with the model and stores what it read.
pub(super) type ReadAndPut<'a> =
    dyn Fn(&ChoiceScorer, &[UnreadContext], &mut Store) -> Result<()> + 'a;

/// Reads the endings `unread` names with the model at `path` (named `name` in errors),
/// `batch_contexts` contexts at a time until none is left, each batch read and committed by
/// `read_and_put` (which returns nothing: the batch's endings count as done). The model is
/// loaded only when something is missing; `progress` hears endings done and endings missing
/// at the start.
pub(super) fn read_in_batches(
    store: &mut Store,
    path: &Path,
    name: &str,
    unread: Unread<'_>,
    batch_contexts: usize,
    progress: &mut dyn FnMut(usize, usize),
    read_and_put: &ReadAndPut<'_>,
) -> Result<()> {
    let missing = store.count_unread(unread)?;
    if missing == 0 {
        return Ok(());
    }
    let model = LanguageModel::load(path).with_context(|| format!("cannot load {name}"))?;
    let choice = ChoiceScorer::new(&model)?;
    let mut done = 0;
    progress(done, missing);
    loop {
        afkit_engine::interrupt::check()?;
        let batch = store.unread_contexts(unread, batch_contexts)?;
        if batch.is_empty() {
            return Ok(());
        }
        read_and_put(&choice, &batch, store).with_context(|| name.to_string())?;
        done += batch.iter().map(|c| c.endings.len()).sum::<usize>();
        progress(done.min(missing), missing);
    }
}

/// Each context of `batch` as a language model reads it (`sent1 + " " + sent2`), and its endings'
/// texts in the batch's order: what the scorer and the fluency reader both ask the model about.
pub(crate) fn contexts_and_endings(batch: &[UnreadContext]) -> (Vec<String>, Vec<Vec<String>>) {
    let contexts = batch
        .iter()
        .map(|c| startphrase(&c.sent1, &c.sent2))
        .collect();
    let endings = batch
        .iter()
        .map(|c| c.endings.iter().map(|(_, t)| t.clone()).collect())
        .collect();
    (contexts, endings)
}

/// Each context's endings scored after its startphrase (the contexts' questions run in
/// parallel).
fn score_contexts(
    choice: &ChoiceScorer,
    batch: &[UnreadContext],
) -> Result<Vec<(i64, ScorerScore)>> {
    let (contexts, texts) = contexts_and_endings(batch);
    let questions: Vec<ChoiceQuestion> = contexts
        .iter()
        .zip(&texts)
        .map(|(context, options)| ChoiceQuestion { context, options })
        .collect();
    let scores = choice.score_all(&questions, &|| {})?;
    let mut rows = Vec::new();
    for (c, cond) in batch.iter().zip(&scores) {
        for (i, (id, _)) in c.endings.iter().enumerate() {
            rows.push((
                *id,
                ScorerScore {
                    ll_cond: cond.loglikelihood[i],
                    ll_alone: None,
                    n_tok: cond.tokens[i],
                },
            ));
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_are_per_character_and_per_token_and_never_divide_by_zero() {
        let stored_with_alone = ScorerScore {
            ll_cond: -12.0,
            ll_alone: Some(-20.0),
            n_tok: 4,
        };
        assert_eq!(
            scorer_features(&stored_with_alone, "abcdef"),
            [-12.0, -2.0, -3.0, -5.0, 2.0].map(Some)
        );
        let read_now = ScorerScore {
            ll_alone: None,
            ..stored_with_alone
        };
        let features = scorer_features(&read_now, "abcdef");
        for (f, value) in features.iter().enumerate() {
            assert_eq!(value.is_none(), SCORER_ALONE_FEATURES.contains(&f), "{f}");
        }
        let empty = ScorerScore {
            ll_cond: -1.0,
            ll_alone: Some(-1.0),
            n_tok: 0,
        };
        assert!(scorer_features(&empty, "")
            .iter()
            .all(|v| v.is_some_and(f64::is_finite)));
    }
}
