//! The fluency floor: no distractor that reads as broken English while fluent ones are left.
//!
//! AF keeps negatives that fool its models, and a small generator's slips (a non-word, a verb
//! without its object, two clauses run together) fool stylistic models well enough: read
//! blind, most questions of an unfiltered export held at least one wrong ending a reader
//! eliminates at a glance. Such a question is easier than it looks, and no longer measures what
//! it claims to.
//!
//! A second language model, the *reader*, reads each AF run's found endings and assigned
//! negatives after their context (sent1 + " " + sent2, as the audits pose the question). The
//! floor is the reader's per-token log-likelihood that all but `quantile` of the run's found
//! endings reach; negatives under it are refused: `assemble --unverified` takes them only when a
//! context has too few others, and counts those contexts. The floor is relative to the project's
//! own found endings, so it asks of a distractor what the corpus asks of its real endings.
//!
//! The reader should not be the generator: a model finds its own samples likely, slips
//! included. It reads only the assigned negatives (k per context, not the whole pool), which
//! keeps the cost to minutes per thousand contexts, and is also why the floor is not on by
//! default: among 9 assigned negatives the fluent ones are also the ones likelier to be a second
//! right answer, so read blind the floor traded broken distractors for plausible ones.

use std::path::PathBuf;

use anyhow::{ensure, Result};

use super::scorer::{contexts_and_endings, read_in_batches};

use afkit_engine::lm::choice::{ChoiceQuestion, ChoiceScorer};
use afkit_store::fluency::{FluencyFloor, FluencyReadings};
use afkit_store::scorer::{Unread, UnreadContext};
use afkit_store::Store;

/// Share of the found endings allowed under the floor by default.
pub const DEFAULT_QUANTILE: f64 = 0.2;

/// Contexts read together and committed in one transaction.
const BATCH_CONTEXTS: usize = 16;

/// The floor a run is to be held to: which model reads, and how strict.
#[derive(Debug, Clone)]
pub struct Fluency {
    /// The name the user gave.
    pub reader: String,
    pub path: PathBuf,
    /// Share of the found endings allowed under the floor, in [0, 0.5].
    pub quantile: f64,
}

/// What holding a run to its floor found.
#[derive(Debug, Clone, PartialEq)]
pub struct FloorSummary {
    pub floor: FluencyFloor,
    /// Assigned negatives the reader read.
    pub negatives: usize,
    /// Of them, under the floor.
    pub refused: usize,
}

/// Holds AF run `run_id` to `fluency`: reads what the reader has not read yet (`progress` hears
/// endings read so far and endings missing when it started), sets the floor from the found
/// endings and records it with the run.
pub fn hold_to_floor(
    store: &mut Store,
    run_id: i64,
    fluency: &Fluency,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<FloorSummary> {
    ensure!(
        (0.0..=0.5).contains(&fluency.quantile),
        "--fluency-quantile must be between 0 and 0.5 (the share of found endings under the floor)"
    );
    let sha256 = afkit_engine::models::sha256_file(&fluency.path)?;
    read_missing(store, run_id, fluency, &sha256, progress)?;
    let FluencyReadings { found, negatives } = store.fluency_per_token(run_id, &sha256)?;
    ensure!(
        !found.is_empty(),
        "AF run {run_id}: the reader scored no found ending"
    );
    let floor = FluencyFloor {
        reader: fluency.reader.clone(),
        model: sha256,
        quantile: fluency.quantile,
        threshold: quantile(found, fluency.quantile),
    };
    store.set_fluency_floor(run_id, Some(&floor))?;
    let refused = negatives
        .iter()
        .filter(|&&(_, v)| v < floor.threshold)
        .count();
    Ok(FloorSummary {
        floor,
        negatives: negatives.len(),
        refused,
    })
}

/// The value that a share `q` of `values` falls under (the lower of the two around it).
fn quantile(mut values: Vec<f64>, q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let index = ((values.len() as f64 * q).floor() as usize).min(values.len() - 1);
    values[index]
}

/// Reads every found ending and assigned negative of the run the reader has not read,
/// [`BATCH_CONTEXTS`] contexts at a time, each batch committed.
fn read_missing(
    store: &mut Store,
    run_id: i64,
    fluency: &Fluency,
    sha256: &str,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<()> {
    let name = format!("the fluency reader {}", fluency.reader);
    read_in_batches(
        store,
        &fluency.path,
        &name,
        Unread::Fluency {
            run_id,
            model: sha256,
        },
        BATCH_CONTEXTS,
        progress,
        &|choice, batch, store| store.put_fluency_scores(sha256, &read_contexts(choice, batch)?),
    )
}

/// Each context's endings read after its startphrase (the contexts run in parallel).
fn read_contexts(choice: &ChoiceScorer, batch: &[UnreadContext]) -> Result<Vec<(i64, f64, usize)>> {
    let (contexts, texts) = contexts_and_endings(batch);
    let questions: Vec<ChoiceQuestion> = contexts
        .iter()
        .zip(&texts)
        .map(|(context, options)| ChoiceQuestion { context, options })
        .collect();
    let scores = choice.score_all(&questions, &|| {})?;
    let mut rows = Vec::new();
    for (c, read) in batch.iter().zip(&scores) {
        for (i, (id, _)) in c.endings.iter().enumerate() {
            rows.push((*id, read.loglikelihood[i], read.tokens[i]));
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn at_most_the_asked_share_of_values_falls_under_the_quantile(
            values in prop::collection::vec(-20.0f64..0.0, 1..200),
            q in 0.0f64..=0.5,
        ) {
            let floor = quantile(values.clone(), q);
            let under = values.iter().filter(|&&v| v < floor).count();
            prop_assert!(under as f64 <= q * values.len() as f64);
            prop_assert!(values.contains(&floor));
        }
    }

    #[test]
    fn quantile_zero_is_the_lowest_value() {
        assert_eq!(quantile(vec![-3.0, -1.0, -2.0], 0.0), -3.0);
        assert_eq!(quantile(vec![-4.0, -3.0, -2.0, -1.0], 0.5), -2.0);
    }
}
