//! SWAG's assembly rules (§3.5, footnotes 5 and 6) as pure functions over one labelled
//! item, so each rule can be tested on hand-made labels, with one change for validity: a
//! distractor must be judged *unlikely*. SWAG also kept generations judged likely (a plausible
//! continuation annotators did not rank best), and such a distractor is a second right answer;
//! here an item without three unlikely generations goes back to annotation instead.
//!
//! Several annotators per item are combined per ending, as medians on ordered scales:
//! - judgement (likely < unlikely < gibberish): gibberish when at least half of the submissions
//!   say gibberish, else unlikely when at least half say unlikely or gibberish, else likely. A tie
//!   goes to the more severe label, so a distractor that half the annotators found gibberish is
//!   not kept, and a found ending that half found unlikely is typed unlikely.
//! - rank (neither < second < best): best when more than half rank it best, else second when more
//!   than half rank it best or second, else neither. A tie goes to the lower rank: a rank needs a
//!   strict majority, so an even split sends the item back to annotation rather than into the
//!   dataset on a coin flip. With one annotator both rules return that annotator's labels.

use std::collections::{HashMap, HashSet};

use afkit_store::dataset::{Judgement, Rank};

/// The combined labels of one ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Consensus {
    pub judgement: Judgement,
    /// `None`: neither best nor second.
    pub rank: Option<Rank>,
}

/// Combines the votes (one per non-broken submission) on one ending; `None` without votes.
pub(crate) fn consensus(votes: &[(Judgement, Option<Rank>)]) -> Option<Consensus> {
    let n = votes.len();
    if n == 0 {
        return None;
    }
    let count_j = |j: Judgement| votes.iter().filter(|(v, _)| *v >= j).count();
    let judgement = if 2 * count_j(Judgement::Gibberish) >= n {
        Judgement::Gibberish
    } else if 2 * count_j(Judgement::Unlikely) >= n {
        Judgement::Unlikely
    } else {
        Judgement::Likely
    };
    let count_r = |r: Rank| votes.iter().filter(|(_, v)| *v >= Some(r)).count();
    let rank = if 2 * count_r(Rank::Best) > n {
        Some(Rank::Best)
    } else if 2 * count_r(Rank::Second) > n {
        Some(Rank::Second)
    } else {
        None
    };
    Some(Consensus { judgement, rank })
}

/// A verified example built from an item: a gold ending and its distractors, in the order given.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Built {
    pub gold: i64,
    pub gold_type: Judgement,
    /// (ending id, judgement), in the order given: every candidate, of which the question
    /// shows the first three (and keeps a fourth).
    pub distractors: Vec<(i64, Judgement)>,
}

/// Why an item goes back to the annotation queue (SWAG fn. 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum ReannotateReason {
    /// The found ending was not ranked best or second best.
    FoundOutsideTopTwo,
    /// Fewer than three usable distractors (fewer than four non-gibberish endings for a 4-way
    /// example once the generation ranked best is set aside).
    TooFewNonGibberish,
    /// Three or more non-gibberish generations, but fewer than three judged unlikely: the
    /// others could be right.
    TooFewUnlikely,
}

impl ReannotateReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReannotateReason::FoundOutsideTopTwo => "found_outside_top_two",
            ReannotateReason::TooFewNonGibberish => "too_few_non_gibberish",
            ReannotateReason::TooFewUnlikely => "too_few_unlikely",
        }
    }
}

/// What assemble does with one labelled item.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    /// The found ending is gold (`found_rank` is best or second → `gold0`/`gold1`), plus the
    /// generation-as-gold example when a generation was ranked best above the found ending.
    Gold {
        found_rank: Rank,
        example: Built,
        generated_gold: Option<Built>,
    },
    /// Back to the queue: `keep` are the endings that stay (the found one first, then the
    /// generations that could still serve: neither gibberish nor ranked above it, and unlikely
    /// once the found ending is in the top two; in the order given); the rest of the task is
    /// refilled from the pool.
    Reannotate {
        reason: ReannotateReason,
        keep: Vec<i64>,
    },
    /// The item yields nothing and re-annotation cannot help.
    Drop(DropReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum DropReason {
    /// The annotators judged the found ending gibberish (the corpus's own ending is not correct
    /// English): no round of annotation changes it.
    FoundGibberish,
    /// Some ending of the task has no label in any non-broken submission.
    IncompleteLabels,
}

impl DropReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DropReason::FoundGibberish => "found_gibberish",
            DropReason::IncompleteLabels => "incomplete_labels",
        }
    }
}

/// Applies the assembly rules to one item. `found` is the task's found ending, `generations` its
/// other endings in the order they should become distractors (assemble matches them to the found
/// endings' scores, or puts the hardest first), `labels` their combined labels.
pub(crate) fn decide(
    found: i64,
    generations: &[i64],
    labels: &HashMap<i64, Consensus>,
) -> Decision {
    if generations.iter().any(|e| !labels.contains_key(e)) || !labels.contains_key(&found) {
        return Decision::Drop(DropReason::IncompleteLabels);
    }
    let found_label = labels[&found];
    // Before the rank: gibberish cannot be ranked, and another round shows the same found ending.
    if found_label.judgement == Judgement::Gibberish {
        return Decision::Drop(DropReason::FoundGibberish);
    }
    // What a re-annotation round keeps: the found ending and the usable generations that pass `keep`.
    let reannotate = |reason, keep: &dyn Fn(&i64) -> bool| {
        let kept = generations
            .iter()
            .copied()
            .filter(|e| usable(labels, e) && keep(e));
        Decision::Reannotate {
            reason,
            keep: std::iter::once(found).chain(kept).collect(),
        }
    };
    let Some(found_rank) = found_label.rank else {
        return reannotate(ReannotateReason::FoundOutsideTopTwo, &|e| {
            labels[e].rank.is_none()
        });
    };
    let distractors = match unlikely_distractors(generations, labels) {
        Ok(distractors) => distractors,
        Err(reason) => {
            return reannotate(reason, &|e| {
                wrong(labels, e) && labels[e].rank <= found_label.rank
            })
        }
    };
    let generated_gold = if found_rank == Rank::Second {
        generated_gold(generations, labels)
    } else {
        None
    };
    Decision::Gold {
        found_rank,
        example: Built {
            gold: found,
            gold_type: found_label.judgement,
            distractors: typed(distractors, labels),
        },
        generated_gold,
    }
}

/// The generations that can be distractors: judged unlikely and not ranked best, in the order
/// given; or why fewer than three are.
fn unlikely_distractors(
    generations: &[i64],
    labels: &HashMap<i64, Consensus>,
) -> Result<Vec<i64>, ReannotateReason> {
    let not_best: Vec<i64> = generations
        .iter()
        .copied()
        .filter(|e| usable(labels, e) && labels[e].rank != Some(Rank::Best))
        .collect();
    if not_best.len() < 3 {
        return Err(ReannotateReason::TooFewNonGibberish);
    }
    let distractors: Vec<i64> = not_best.into_iter().filter(|e| wrong(labels, e)).collect();
    if distractors.len() < 3 {
        return Err(ReannotateReason::TooFewUnlikely);
    }
    Ok(distractors)
}

/// Whether the ending is correct English to the annotators (not judged gibberish).
fn usable(labels: &HashMap<i64, Consensus>, ending: &i64) -> bool {
    labels[ending].judgement != Judgement::Gibberish
}

/// Whether annotators judged the ending a wrong answer a reader can still take seriously:
/// unlikely (likely could be right, gibberish gives itself away).
fn wrong(labels: &HashMap<i64, Consensus>, ending: &i64) -> bool {
    labels[ending].judgement == Judgement::Unlikely
}

/// The example whose gold is the generation the annotators ranked best, if one is usable, with
/// the other generations judged unlikely as its distractors.
fn generated_gold(generations: &[i64], labels: &HashMap<i64, Consensus>) -> Option<Built> {
    generations
        .iter()
        .copied()
        .find(|e| usable(labels, e) && labels[e].rank == Some(Rank::Best))
        .map(|gold| Built {
            gold,
            gold_type: labels[&gold].judgement,
            distractors: typed(
                generations
                    .iter()
                    .copied()
                    .filter(|e| *e != gold && wrong(labels, e))
                    .collect(),
                labels,
            ),
        })
}

/// `ids`, each with its judgement.
fn typed(ids: Vec<i64>, labels: &HashMap<i64, Consensus>) -> Vec<(i64, Judgement)> {
    ids.into_iter().map(|e| (e, labels[&e].judgement)).collect()
}

/// The generations of a round after the one that decided its question that can be distractors
/// too: judged unlikely and not ranked best (a rank there says nothing of the found ending, whose
/// place was settled, but a generation ranked best over it could be right), in the order given.
pub(crate) fn spare_distractors(
    generations: &[i64],
    labels: &HashMap<i64, Consensus>,
) -> Vec<(i64, Judgement)> {
    let accepted = generations.iter().copied().filter(|e| {
        labels
            .get(e)
            .is_some_and(|l| l.judgement == Judgement::Unlikely && l.rank != Some(Rank::Best))
    });
    typed(accepted.collect(), labels)
}

/// Orders endings by final ensemble score, highest (hardest) first; ties and unscored endings by id.
pub(crate) fn hardest_first(
    endings: impl Iterator<Item = i64>,
    score: &dyn Fn(i64) -> Option<f64>,
) -> Vec<i64> {
    let mut v: Vec<(i64, Option<f64>)> = endings.map(|e| (e, score(e))).collect();
    v.sort_by(|(ea, sa), (eb, sb)| match (sa, sb) {
        (Some(a), Some(b)) => b.total_cmp(a).then(ea.cmp(eb)),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => ea.cmp(eb),
    });
    v.into_iter().map(|(e, _)| e).collect()
}

/// Whether a question review set `ending` aside (`vetoed`: its context's vetoes, if any).
pub(crate) fn is_vetoed(vetoed: Option<&HashSet<i64>>, ending: i64) -> bool {
    vetoed.is_some_and(|v| v.contains(&ending))
}

/// `candidates` without those a question review set aside (`vetoed`: named plausible or broken,
/// or picked over the found ending), and how many those were: a review's verdict stands over
/// the annotators' labels.
pub(crate) fn without_vetoed(
    candidates: &[i64],
    vetoed: Option<&HashSet<i64>>,
) -> (Vec<i64>, usize) {
    let kept: Vec<i64> = candidates
        .iter()
        .copied()
        .filter(|&e| !is_vetoed(vetoed, e))
        .collect();
    let set_aside = candidates.len() - kept.len();
    (kept, set_aside)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Judgement::*;
    use Rank::*;

    fn c(judgement: Judgement, rank: Option<Rank>) -> Consensus {
        Consensus { judgement, rank }
    }

    #[test]
    fn one_vote_is_its_own_consensus() {
        assert_eq!(
            consensus(&[(Unlikely, Some(Second))]),
            Some(c(Unlikely, Some(Second)))
        );
        assert_eq!(consensus(&[]), None);
    }

    #[test]
    fn judgement_ties_go_to_the_more_severe_label() {
        assert_eq!(
            consensus(&[(Likely, None), (Gibberish, None)])
                .unwrap()
                .judgement,
            Gibberish
        );
        assert_eq!(
            consensus(&[(Likely, None), (Unlikely, None)])
                .unwrap()
                .judgement,
            Unlikely
        );
        // Median of likely, unlikely, gibberish is unlikely.
        let three = [(Likely, None), (Unlikely, None), (Gibberish, None)];
        assert_eq!(consensus(&three).unwrap().judgement, Unlikely);
        let majority = [(Likely, None), (Likely, None), (Gibberish, None)];
        assert_eq!(consensus(&majority).unwrap().judgement, Likely);
    }

    #[test]
    fn rank_needs_a_strict_majority() {
        assert_eq!(
            consensus(&[(Likely, Some(Best)), (Likely, Some(Second))])
                .unwrap()
                .rank,
            Some(Second)
        );
        assert_eq!(
            consensus(&[(Likely, Some(Best)), (Likely, None)])
                .unwrap()
                .rank,
            None
        );
        let three = [(Likely, Some(Best)), (Likely, Some(Best)), (Likely, None)];
        assert_eq!(consensus(&three).unwrap().rank, Some(Best));
    }

    fn labels(list: &[(i64, Judgement, Option<Rank>)]) -> (Vec<i64>, HashMap<i64, Consensus>) {
        (
            list.iter().map(|x| x.0).collect(),
            list.iter().map(|&(e, j, r)| (e, c(j, r))).collect(),
        )
    }

    /// The generations of a task (every ending but the found one, 1), higher ids first: as if
    /// ending 10 + i had score i and assemble put the hardest first.
    fn hardest(endings: &[i64]) -> Vec<i64> {
        let score = |e: i64| Some(e as f64);
        hardest_first(endings.iter().copied().filter(|&e| e != 1), &score)
    }

    #[test]
    fn found_best_keeps_the_hardest_unlikely_generations() {
        let (endings, l) = labels(&[
            (1, Likely, Some(Best)),
            (11, Unlikely, Some(Second)),
            (12, Gibberish, None),
            (13, Unlikely, None),
            (14, Likely, None),
            (15, Unlikely, None),
        ]);
        let Decision::Gold {
            found_rank,
            example,
            generated_gold,
        } = decide(1, &hardest(&endings), &l)
        else {
            panic!("expected gold")
        };
        assert_eq!(found_rank, Best);
        assert_eq!(
            example.distractors,
            vec![(15, Unlikely), (13, Unlikely), (11, Unlikely)]
        );
        assert!(generated_gold.is_none());
    }

    #[test]
    fn generation_best_with_found_second_adds_a_generated_gold() {
        let (endings, l) = labels(&[
            (1, Likely, Some(Second)),
            (11, Unlikely, None),
            (12, Unlikely, None),
            (13, Unlikely, None),
            (14, Likely, Some(Best)),
            (15, Gibberish, None),
        ]);
        let Decision::Gold {
            found_rank,
            example,
            generated_gold,
        } = decide(1, &hardest(&endings), &l)
        else {
            panic!("expected gold")
        };
        assert_eq!(found_rank, Second);
        assert_eq!(
            example.distractors.iter().map(|d| d.0).collect::<Vec<_>>(),
            vec![13, 12, 11]
        );
        let gen = generated_gold.unwrap();
        assert_eq!(gen.gold, 14);
        assert_eq!(
            gen.distractors.iter().map(|d| d.0).collect::<Vec<_>>(),
            vec![13, 12, 11]
        );
    }

    #[test]
    fn found_outside_top_two_is_reannotated_without_the_endings_that_beat_it() {
        let (endings, l) = labels(&[
            (1, Likely, None),
            (11, Likely, Some(Best)),
            (12, Gibberish, None),
            (13, Unlikely, Some(Second)),
            (14, Unlikely, None),
            (15, Likely, None),
        ]);
        assert_eq!(
            decide(1, &hardest(&endings), &l),
            Decision::Reannotate {
                reason: ReannotateReason::FoundOutsideTopTwo,
                keep: vec![1, 15, 14]
            }
        );
    }

    #[test]
    fn too_few_non_gibberish_is_reannotated() {
        let (endings, l) = labels(&[
            (1, Likely, Some(Second)),
            (11, Gibberish, None),
            (12, Gibberish, None),
            (13, Likely, Some(Best)),
            (14, Unlikely, None),
            (15, Likely, None),
        ]);
        assert_eq!(
            decide(1, &hardest(&endings), &l),
            Decision::Reannotate {
                reason: ReannotateReason::TooFewNonGibberish,
                keep: vec![1, 14]
            }
        );
    }

    #[test]
    fn generations_judged_likely_are_never_distractors() {
        let (endings, l) = labels(&[
            (1, Likely, Some(Best)),
            (11, Likely, Some(Second)),
            (12, Likely, None),
            (13, Unlikely, None),
            (14, Unlikely, None),
            (15, Gibberish, None),
        ]);
        assert_eq!(
            decide(1, &hardest(&endings), &l),
            Decision::Reannotate {
                reason: ReannotateReason::TooFewUnlikely,
                keep: vec![1, 14, 13]
            }
        );
    }

    #[test]
    fn gibberish_found_ending_and_missing_labels_are_dropped() {
        let (endings, l) = labels(&[
            (1, Gibberish, Some(Best)),
            (11, Likely, Some(Second)),
            (12, Likely, None),
            (13, Likely, None),
            (14, Likely, None),
        ]);
        assert_eq!(
            decide(1, &hardest(&endings), &l),
            Decision::Drop(DropReason::FoundGibberish)
        );
        let mut unranked = l.clone();
        unranked.insert(1, c(Gibberish, None));
        assert_eq!(
            decide(1, &hardest(&endings), &unranked),
            Decision::Drop(DropReason::FoundGibberish),
            "no re-annotation: the found ending would be shown again"
        );
        let mut partial = l.clone();
        partial.remove(&13);
        assert_eq!(
            decide(1, &hardest(&endings), &partial),
            Decision::Drop(DropReason::IncompleteLabels)
        );
    }

    #[test]
    fn a_spare_round_adds_its_unlikely_generations_not_ranked_best() {
        let (endings, l) = labels(&[
            (1, Unlikely, None),
            (11, Unlikely, Some(Best)),
            (12, Unlikely, Some(Second)),
            (13, Likely, None),
            (14, Gibberish, None),
            (15, Unlikely, None),
        ]);
        let added: Vec<i64> = spare_distractors(&hardest(&endings), &l)
            .into_iter()
            .map(|(e, j)| {
                assert_eq!(j, Unlikely);
                e
            })
            .collect();
        assert_eq!(added, vec![15, 12]);
    }

    #[test]
    fn distractors_follow_the_given_order() {
        let (_, l) = labels(&[
            (1, Likely, Some(Best)),
            (11, Unlikely, None),
            (12, Gibberish, None),
            (13, Unlikely, Some(Second)),
            (14, Likely, None),
            (15, Unlikely, None),
        ]);
        let Decision::Gold { example, .. } = decide(1, &[13, 11, 12, 15, 14], &l) else {
            panic!("expected gold")
        };
        assert_eq!(
            example.distractors.iter().map(|d| d.0).collect::<Vec<_>>(),
            vec![13, 11, 15]
        );
    }

    #[test]
    fn unscored_endings_sort_last() {
        let order = hardest_first([3, 1, 2].into_iter(), &|e| (e != 2).then_some(-(e as f64)));
        assert_eq!(order, vec![1, 3, 2]);
    }
}
