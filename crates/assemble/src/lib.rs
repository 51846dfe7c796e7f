//! Assemble: turn verified (or unverified) candidates into final examples and splits.
//!
//! Order of work, all inside one transaction so that a re-run replaces the previous assembly
//! atomically: (1) split every group of the project (see [`split`]); (2) for every context of
//! the latest finished AF run, apply the rules of [`rules`] to its annotation rounds (see
//! [`verified`]: the deciding round, a spare round for a question with too few endings judged
//! unlikely, then the [`choice`] among them), or, with `--unverified`, take the gold and
//! assigned negatives; either way the candidates come in the order of [`DistractorChoice`] (by
//! default matched to the found endings' final scores); (3) queue the items that need
//! re-annotation or a spare round as new tasks; (4) record the parameters.
//!
//! Unverified assembly never silently keeps a negative that could be right (see [`afkit_store::risk`]):
//! a question with one among its three shown distractors is flagged (counted in the summary;
//! export marks it). [`CouldBeRight::Avoid`] takes the negatives that could not be right first,
//! [`CouldBeRight::LeaveOut`] also leaves out a question that still needs one.
//!
//! Question reviews (`afkit crowd review-export`) come last: a candidate a reviewer named
//! plausible or broken, or picked instead of the found ending, is never a distractor of its
//! context, verified or not (`afkit_store::review`).
//!
//! Re-annotation refill (SWAG fn. 6, "candidates from A"): the replaced endings are refilled with
//! endings of the context's pool that the AF run scored and annotators never saw, taken in the
//! same order as distractors (matched to the found endings' scores, or the hardest first). Pool
//! endings without a final score cannot be placed, so they are not used; an item that cannot be
//! refilled to its task's size stays out and is reported.

mod choice;
mod order;
mod rules;
mod split;
mod summary;
mod verified;

pub use summary::Summary;

use order::{distractor_order, DistractorOrder, RunData};

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::{bail, Result};
use serde::Serialize;

use afkit_engine::seed::Seed;
use afkit_store::af::AfRun;
use afkit_store::assemble::NewAssembled;
use afkit_store::dataset::Split;
use afkit_store::distractors::DistractorChoice;
use afkit_store::examples::Example;
use afkit_store::Store;

/// What `assemble` does.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Train, val and test fractions (of examples; groups are never split).
    pub fractions: Fractions,
    /// Seed of the split, the matched distractors and the order of re-annotation tasks.
    pub seed: Seed,
    /// Skip the annotators' labels: each context's distractors come from its assigned negatives.
    pub unverified: bool,
    /// The order in which candidates become distractors, verified or not.
    pub distractors: DistractorChoice,
    /// With `unverified`: what becomes of negatives that could be right.
    pub could_be_right: CouldBeRight,
    /// Verified: a question whose deciding round accepted fewer generations than this gets a
    /// spare round of annotation, and one with more than three candidates has its three chosen
    /// by how real they look; 3 turns both off.
    pub choose_from: usize,
}

/// Train / val / test fractions, in the order of [`Split::ALL`]; parsed (`str::parse`) from
/// `--split 0.8,0.1,0.1`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fractions(pub(crate) [f64; 3]);

impl std::str::FromStr for Fractions {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> Result<Fractions> {
        let parts: Vec<&str> = text.split(',').map(str::trim).collect();
        if parts.len() != 3 {
            bail!("--split {text:?}: expected three fractions train,val,test such as 0.8,0.1,0.1");
        }
        let mut out = [0.0; 3];
        for (slot, part) in out.iter_mut().zip(&parts) {
            *slot = match part.parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 0.0 => v,
                _ => bail!("--split {text:?}: {part:?} is not a fraction in [0, 1]"),
            };
        }
        let sum: f64 = out.iter().sum();
        if (sum - 1.0).abs() > 1e-6 {
            bail!("--split {text:?}: the fractions add up to {sum}, expected 1");
        }
        Ok(Fractions(out))
    }
}

impl Fractions {
    /// Canonical text form, as recorded in the project.
    pub(crate) fn to_text(self) -> String {
        format!("{},{},{}", self.0[0], self.0[1], self.0[2])
    }
}

/// What unverified assembly does with assigned negatives that could be right.
#[derive(
    clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum CouldBeRight {
    /// Keep the distractors' order and flag a question that shows one (the default): read
    /// blind, taking them last made an export no more valid and easier for language models.
    #[default]
    Flag,
    /// Take them last, and flag a question that still shows one.
    Avoid,
    /// Take them last, and leave out a question that still needs one.
    LeaveOut,
}

/// What `assemble` reports while it works. Every method has a default that does nothing.
pub trait Observer {
    fn note(&mut self, _message: &str) {}
}

/// The recorded parameters of the last assembly (`meta` key `assemble`).
#[derive(Debug, Serialize, serde::Deserialize, PartialEq)]
struct Recorded {
    seed: Seed,
    split: String,
    unverified: bool,
    /// Absent in assemblies recorded before the choice existed (they took the hardest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    distractors: Option<DistractorChoice>,
    af_run: i64,
    /// What became of unverified negatives that could be right (absent: flagged, or the
    /// assembly predates the judgement).
    #[serde(default, skip_serializing_if = "is_flag")]
    could_be_right: CouldBeRight,
    /// Verified assembly's `choose_from` (absent: unverified, or recorded before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    choose_from: Option<usize>,
}

fn is_flag(policy: &CouldBeRight) -> bool {
    *policy == CouldBeRight::Flag
}

impl Recorded {
    /// The record of an assembly with `config` from AF run `af_run`; verified assembly flags
    /// negatives that could be right, whatever the config says.
    fn of(config: &Config, af_run: i64) -> Recorded {
        Recorded {
            seed: config.seed,
            split: config.fractions.to_text(),
            unverified: config.unverified,
            distractors: Some(config.distractors),
            af_run,
            could_be_right: if config.unverified {
                config.could_be_right
            } else {
                CouldBeRight::Flag
            },
            choose_from: (!config.unverified).then_some(config.choose_from),
        }
    }
}

/// The latest finished AF run, which the assembly takes its negatives from; says which and
/// whether the examples are verified.
fn latest_run(store: &Store, unverified: bool, observer: &mut dyn Observer) -> Result<AfRun> {
    let Some(run) = store.latest_finished_af_run()? else {
        bail!(
            "no finished AF run in {}: run `afkit filter` first",
            store.path().display()
        );
    };
    observer.note(&format!(
        "assembling {} examples from AF run {}",
        if unverified { "unverified" } else { "verified" },
        run.id
    ));
    Ok(run)
}

/// Runs the whole assembly in one transaction; see the module docs.
pub fn run(store: &mut Store, config: &Config, observer: &mut dyn Observer) -> Result<Summary> {
    let Config {
        fractions,
        seed,
        unverified,
        distractors,
        could_be_right,
        choose_from,
    } = *config;
    let run = latest_run(store, unverified, observer)?;
    let examples = store.examples()?;
    let splits = group_splits(store, &examples, fractions, seed)?;
    let run_data = RunData::of(store.af_decisions(run.id)?, &splits);
    let mut summary = Summary {
        af_run: run.id,
        unverified,
        distractors,
        ..Summary::default()
    };
    let mut reannotations: Vec<(i64, Vec<i64>)> = Vec::new();
    let order = distractor_order(store, run.id, distractors, seed)?;
    let vetoes = store.review_vetoes()?;
    if let DistractorOrder::Matched { matching, .. } = &order {
        summary.matched_on = matching.axes();
    }
    let mut built = if unverified {
        let passed = store.review_passed()?;
        let guard = Guard {
            store,
            policy: could_be_right,
            vetoes: &vetoes,
            passed: &passed,
        };
        assemble_unverified(&examples, &run_data, &order, &guard, &mut summary)?
    } else {
        let inputs = verified::Inputs {
            store,
            run_id: run.id,
            run: &run_data,
            order: &order,
            choose_from,
            seed,
            vetoes: &vetoes,
        };
        verified::assemble(&inputs, &examples, &mut summary, &mut reannotations)?
    };
    count_built(&examples, &built, &mut summary);
    check_no_empty_split(&splits, &summary, fractions, unverified)?;
    // Train first, then val, then test; assembly order within a split follows the examples.
    built.sort_by_key(|ex| ex.split);
    let record = serde_json::to_string(&Recorded::of(config, run.id))?;
    store.commit_assembly(&splits, &built, &reannotations, &record)?;
    Ok(summary)
}

/// Refuses an assembly in which a split the fractions ask for would hold no example: an empty
/// split exports as nothing to evaluate on. Verified assembly may leave a split empty while its
/// contexts await labels; only a split without any group is an error there.
fn check_no_empty_split(
    splits: &BTreeMap<String, Split>,
    summary: &Summary,
    fractions: Fractions,
    unverified: bool,
) -> Result<()> {
    for (i, split) in Split::ALL.into_iter().enumerate() {
        let groups = splits.values().filter(|s| **s == split).count();
        let examples = summary.examples.get(split.as_str()).copied().unwrap_or(0);
        let empty = groups == 0 || (unverified && examples == 0);
        if fractions.0[i] == 0.0 || !empty {
            continue;
        }
        // The suggested split without it: its share goes to train (to val when it is train).
        let mut without = fractions.0;
        without[usize::from(i == 0)] += without[i];
        without[i] = 0.0;
        let shown = without.map(|f| {
            let text = format!("{f:.3}");
            text.trim_end_matches('0').trim_end_matches('.').to_string()
        });
        bail!(
            "the {split} split would be empty: it got {} of the project's {} and no assembled \
             example (all of a group's contexts go to one split). Give {split} a larger share \
             with --split, ingest contexts from more groups, or ask for no {split} split with \
             --split {}",
            groups,
            afkit_engine::text::counted(splits.len(), "group", "groups"),
            shown.join(",")
        );
    }
    Ok(())
}

/// The summary's counts of the built examples: per split, per source of the gold ending, and
/// the groups (videos) per split.
fn count_built(examples: &[Example], built: &[NewAssembled], summary: &mut Summary) {
    let group_of: HashMap<i64, &str> = examples.iter().map(|e| (e.id, e.group.as_str())).collect();
    let mut groups: BTreeMap<String, HashSet<&str>> = BTreeMap::new();
    for ex in built {
        *summary.examples.entry(ex.split.to_string()).or_default() += 1;
        *summary
            .gold_sources
            .entry(ex.gold_source.clone())
            .or_default() += 1;
        groups
            .entry(ex.split.to_string())
            .or_default()
            .insert(group_of[&ex.example_id]);
    }
    summary.groups = groups.into_iter().map(|(s, g)| (s, g.len())).collect();
}

/// Every group's split: the recorded one when seed and fractions are those of the last
/// assembly, so that re-running moves no group.
fn group_splits(
    store: &Store,
    examples: &[Example],
    fractions: Fractions,
    seed: Seed,
) -> Result<BTreeMap<String, Split>> {
    let mut sizes: BTreeMap<String, usize> = BTreeMap::new();
    for ex in examples {
        *sizes.entry(ex.group.clone()).or_default() += 1;
    }
    let previous: Option<Recorded> = match store.meta("assemble")? {
        Some(text) => serde_json::from_str(&text).ok(),
        None => None,
    };
    let same_split = previous
        .as_ref()
        .is_some_and(|p| p.seed == seed && p.split == fractions.to_text());
    let recorded = if same_split {
        store.load_splits()?
    } else {
        BTreeMap::new()
    };
    Ok(split::assign(&sizes, fractions.0, seed, &recorded))
}

/// How unverified assembly treats negatives that could be right (see [`afkit_store::risk`]).
struct Guard<'a> {
    store: &'a Store,
    policy: CouldBeRight,
    /// The candidates reviews set aside, by context.
    vetoes: &'a HashMap<i64, HashSet<i64>>,
    /// The candidates that passed review, by context (with the number of reviews).
    passed: &'a HashMap<i64, HashMap<i64, i64>>,
}

impl Guard<'_> {
    /// The context's candidates in the order they become distractors, each part in `order`'s
    /// order: those above the run's fluency floor before those under it, and with `Avoid` or
    /// `LeaveOut` those that could not be right before all that could (a second right answer
    /// is worse than a clumsy wrong one; a candidate that passed a review is not one, since a
    /// person read it as a wrong answer of this context); and whether one that could be right
    /// is among the three a question shows.
    fn order(
        &self,
        order: &DistractorOrder,
        example: &Example,
        run: &RunData,
        candidates: &[i64],
        summary: &mut Summary,
    ) -> Result<(Vec<i64>, bool)> {
        let judged =
            afkit_store::risk::judge_context(self.store, example.gold_ending_id, candidates)?;
        summary.unjudged_negatives += judged
            .values()
            .filter(|j| j.verdict == afkit_store::risk::Verdict::Unjudged)
            .count();
        let passed = |e: &i64| {
            self.passed
                .get(&example.id)
                .is_some_and(|p| p.contains_key(e))
        };
        let risky = |e: &i64| judged[e].could_be_right() && !passed(e);
        let under_floor = |e: &i64| run.refused.contains(e);
        let avoid = self.policy != CouldBeRight::Flag;
        let tier = |e: &i64| 2 * usize::from(avoid && risky(e)) + usize::from(under_floor(e));
        let none = HashMap::new();
        let mut chosen = Vec::with_capacity(candidates.len());
        for (level, draw) in [
            "distractors",
            "under the floor",
            "could be right",
            "could be right, under the floor",
        ]
        .into_iter()
        .enumerate()
        {
            let part: Vec<i64> = candidates
                .iter()
                .copied()
                .filter(|e| tier(e) == level)
                .collect();
            if !part.is_empty() {
                chosen.extend(order.order(example, run, &part, &none, draw));
            }
        }
        let flagged = chosen.iter().take(3).any(risky);
        Ok((chosen, flagged))
    }
}

/// Without verification: the gold and up to four assigned negatives of every AF context, the
/// first four in `order`, those that could not be right first (`guard`).
fn assemble_unverified(
    examples: &[Example],
    run: &RunData,
    order: &DistractorOrder,
    guard: &Guard,
    summary: &mut Summary,
) -> Result<Vec<NewAssembled>> {
    let mut built = Vec::new();
    for ex in examples {
        let Some(assigned) = run.assignments.get(&ex.id) else {
            continue;
        };
        if assigned.len() < 3 {
            summary.too_few_negatives += 1;
            continue;
        }
        let (assigned, set_aside) = rules::without_vetoed(assigned, guard.vetoes.get(&ex.id));
        summary.review_set_aside += set_aside;
        if assigned.len() < 3 {
            summary.review_too_few += 1;
            continue;
        }
        let fold = run.folds.get(&ex.id).copied();
        let (chosen, flagged) = guard.order(order, ex, run, &assigned, summary)?;
        if flagged && guard.policy == CouldBeRight::LeaveOut {
            summary.could_be_right_left_out += 1;
            continue;
        }
        summary.could_be_right_flagged += usize::from(flagged);
        if chosen.iter().take(3).any(|e| run.refused.contains(e)) {
            summary.under_fluency_floor += 1;
        }
        built.push(NewAssembled {
            example_id: ex.id,
            split: run.splits[&ex.group],
            gold_ending_id: ex.gold_ending_id,
            gold_source: "unverified".into(),
            gold_type: None,
            verified: false,
            fold,
            distractors: chosen
                .into_iter()
                .take(4)
                .map(|ending_id| (ending_id, None))
                .collect(),
        });
    }
    Ok(built)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects_fractions() {
        let parsed = |text: &str| text.parse::<Fractions>().map(|f| f.0).ok();
        assert_eq!(parsed("0.8,0.1,0.1"), Some([0.8, 0.1, 0.1]));
        assert_eq!(parsed("1, 0, 0"), Some([1.0, 0.0, 0.0]));
        assert_eq!(parsed("0.8,0.1"), None);
        assert_eq!(parsed("0.8,0.3,0.1"), None);
        assert_eq!(parsed("0.8,-0.1,0.3"), None);
        assert_eq!(parsed("a,b,c"), None);
    }
}
