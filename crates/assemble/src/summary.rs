//! What one assembly produced: the summary `afkit assemble` prints.

use std::collections::BTreeMap;

use serde::Serialize;

use afkit_store::distractors::DistractorChoice;

/// What one assembly produced; printed by `afkit assemble`.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Summary {
    pub af_run: i64,
    pub unverified: bool,
    /// How the distractors were chosen among the candidates.
    pub distractors: DistractorChoice,
    /// The final scores matched distractors were matched on (`ensemble`, `sentence`, `style`);
    /// empty for the hardest.
    pub matched_on: Vec<&'static str>,
    /// Examples per split.
    pub examples: BTreeMap<String, usize>,
    /// Examples per gold source (gold0-orig, gen-orig, unverified, ...).
    pub gold_sources: BTreeMap<String, usize>,
    /// Groups (the `group` an example was ingested with: an ActivityNet video) with at least
    /// one example in the split; the dataset card counts the same.
    pub groups: BTreeMap<String, usize>,
    /// Items sent back to annotation, by reason.
    pub reannotation_queued: BTreeMap<String, usize>,
    /// Items that need re-annotation but have too few scored, unseen pool endings to refill.
    pub cannot_refill: Vec<String>,
    /// Verified questions queued for a spare round: their deciding round accepted fewer
    /// generations than `choose_from`.
    pub spare_rounds_queued: usize,
    /// Verified questions built while their spare round awaits labels.
    pub spare_rounds_awaiting_labels: usize,
    /// Verified questions that would get a spare round but have no unseen scored pool ending.
    pub spare_pool_empty: usize,
    /// Verified questions (found ending gold) by the number of endings judged unlikely they
    /// choose their distractors from.
    pub candidates_per_question: BTreeMap<usize, usize>,
    /// Verified questions whose three distractors were chosen among more by how real they look.
    pub chosen_after_annotation: usize,
    /// Contexts of the AF run without a label yet (no task, or no submission on the current task).
    pub awaiting_labels: usize,
    /// Items whose only submissions flag them as broken.
    pub broken: usize,
    /// Items that yield nothing, by reason.
    pub dropped: BTreeMap<String, usize>,
    /// Generation-as-gold candidates left out because their context is in val or test (fn. 5).
    pub generated_gold_withheld_from_eval: usize,
    /// Generation-as-gold candidates left out because fewer than three distractors remain.
    pub generated_gold_too_few_distractors: usize,
    /// Contexts with fewer than three assigned negatives (only with `--unverified`).
    pub too_few_negatives: usize,
    /// Contexts that took a negative under the AF run's fluency floor for want of three above
    /// it (only with `--unverified`).
    pub under_fluency_floor: usize,
    /// Unverified questions kept with a distractor that could be right among their three
    /// (export flags them).
    pub could_be_right_flagged: usize,
    /// Unverified questions left out because three distractors that could not be right were not
    /// to be had (only with [`CouldBeRight::LeaveOut`]).
    pub could_be_right_left_out: usize,
    /// Candidates a question review set aside (named plausible or broken, or picked over the
    /// found ending): never shown as distractors of their context.
    pub review_set_aside: usize,
    /// Questions left with fewer than three distractors once reviews set some aside: a spare
    /// round is queued for a verified one when none awaits labels; an unverified one is left out.
    pub review_too_few: usize,
    /// Assigned negatives of unverified questions that no stored evidence could judge (no
    /// likelihood of both endings from one model, no sentence vectors): taken as if safe.
    pub unjudged_negatives: usize,
}
