//! The order in which a context's candidates become distractors, and what the latest finished
//! AF run decided that the order reads: one file that verified and unverified assembly both name.

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::{bail, Result};

use afkit_engine::seed::{Key, Seed};
use afkit_store::assemble::{AfDecisions, FinalPoint};
use afkit_store::dataset::Split;
use afkit_store::distractors::{DistractorChoice, Matching};
use afkit_store::examples::Example;
use afkit_store::Store;

use super::rules;

/// What the latest finished AF run decided, with the split of every group.
pub(crate) struct RunData<'a> {
    pub(crate) assignments: BTreeMap<i64, Vec<i64>>,
    pub(crate) scores: HashMap<i64, f64>,
    pub(crate) folds: HashMap<i64, i64>,
    /// Assigned negatives under the run's fluency floor.
    pub(crate) refused: HashSet<i64>,
    pub(crate) splits: &'a BTreeMap<String, Split>,
}

impl<'a> RunData<'a> {
    pub(crate) fn of(decisions: AfDecisions, splits: &'a BTreeMap<String, Split>) -> RunData<'a> {
        let AfDecisions {
            assignments,
            scores,
            folds,
            refused,
        } = decisions;
        RunData {
            assignments,
            scores,
            folds,
            refused,
            splits,
        }
    }

    pub(crate) fn score(&self, ending_id: i64) -> Option<f64> {
        self.scores.get(&ending_id).copied()
    }
}

/// The order in which a context's candidates become distractors: matched to the found endings'
/// final scores (which needs a run that scored them) or the hardest first.
pub(crate) fn distractor_order(
    store: &Store,
    run_id: i64,
    distractors: DistractorChoice,
    seed: Seed,
) -> Result<DistractorOrder> {
    Ok(match distractors {
        DistractorChoice::Matched => {
            let Some(matching) = Matching::load(store, run_id)? else {
                bail!(
                    "AF run {run_id} in {} scored no found ending, so there is nothing to match \
                     the distractors to: run `afkit filter --new-run`, or assemble with \
                     --distractors hardest",
                    store.path().display()
                );
            };
            DistractorOrder::Matched { matching, seed }
        }
        DistractorChoice::Hardest => DistractorOrder::Hardest,
    })
}

/// The order in which a context's candidates become its distractors (see [`DistractorChoice`]).
pub(crate) enum DistractorOrder {
    /// As matching to the found endings of the context's fold draws them, from `seed`, the
    /// example id and what is drawn for.
    Matched { matching: Matching, seed: Seed },
    /// Highest final ensemble score first.
    Hardest,
}

impl DistractorOrder {
    /// `candidates` in the order they become distractors of `example`. Their scores come from
    /// the run (assigned negatives) or `pool` (the context's scored pool, for endings a
    /// re-annotation refill brought in); `draw` names the seeded draw.
    pub(crate) fn order(
        &self,
        example: &Example,
        run: &RunData,
        candidates: &[i64],
        pool: &HashMap<i64, FinalPoint>,
        draw: &str,
    ) -> Vec<i64> {
        let hardest = || rules::hardest_first(candidates.iter().copied(), &|e| run.score(e));
        let DistractorOrder::Matched { matching, seed } = self else {
            return hardest();
        };
        let mut rng = seed
            .key(Key::Distractors {
                draw,
                example: example.id,
            })
            .rng();
        matching
            .choose(example.id, candidates, pool, candidates.len(), &mut rng)
            .unwrap_or_else(hardest)
    }
}
