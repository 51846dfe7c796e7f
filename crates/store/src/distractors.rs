//! Which of a context's assigned negatives become its distractors: the ones annotators are
//! shown (`annotate`) and the ones an example keeps (`assemble`).
//!
//! AF assigns k negatives to every context (9 by default) and its final cross-fitted pass scores
//! every ending, the found ones included. Taking the negatives that final ensemble scores highest
//! selects a second time with the same kind of model the audits use: the distractors then look
//! *more* like real endings than the real endings do, and a classifier trained on the export
//! learns that inverse signal. On 1,000 ActivityNet test contexts the three hardest put every
//! n-gram baseline 5–8 points below chance (BENCHMARKS.md, "Choosing the distractors").
//!
//! [`DistractorChoice::Matched`] picks them so that their final scores follow the found endings'
//! distribution instead: for each distractor it draws a target from the found endings of the
//! context's fold (the fold whose model scored this context's endings), and takes the unchosen
//! assigned negative nearest to it. A style classifier then meets distractors that are, taken
//! together, as real-looking as the found endings: no more, no less. The match is on up to three
//! scores: the ensemble's, the sentence model's own head, and the word-level heads' standardised
//! mean (which the filter keeps only where those heads find the real endings above chance). The
//! ensemble's score weighs the language models' features most, so distractors matched on it
//! alone can still be told apart by a classifier on sentence embeddings or on words and
//! character n-grams.

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use rand::seq::IndexedRandom;
use rand_chacha::ChaCha8Rng;

use crate::assemble::FinalPoint;
use crate::Store;

/// How a context's distractors are chosen among its assigned negatives.
#[derive(
    clap::ValueEnum,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum DistractorChoice {
    /// Final scores drawn to follow the found endings' (the default).
    #[default]
    Matched,
    /// The highest final scores: hardest for the filter's own model, and an inverse artifact
    /// for the audits on real data.
    Hardest,
}

/// Its name on the command line (`--distractors matched`).
impl std::fmt::Display for DistractorChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DistractorChoice::Matched => "matched",
            DistractorChoice::Hardest => "hardest",
        })
    }
}

/// The space distractors are matched in: one axis per final score the run has (the ensemble's,
/// the sentence model's, the word-level heads'), each divided by the spread of the found
/// endings' scores in the fold, so that no score outweighs another by its scale.
pub(crate) struct MatchingSpace {
    scale: Vec<f64>,
    /// The found endings' points: the targets.
    targets: Vec<Vec<f64>>,
}

impl MatchingSpace {
    /// From the found endings' raw scores in one fold (every point of the same length).
    pub(crate) fn new(found: &[Vec<f64>]) -> MatchingSpace {
        let dims = found.first().map_or(0, Vec::len);
        let scale: Vec<f64> = (0..dims)
            .map(|d| {
                let n = found.len() as f64;
                let mean = found.iter().map(|p| p[d]).sum::<f64>() / n;
                let var = found.iter().map(|p| (p[d] - mean).powi(2)).sum::<f64>() / n;
                if var > 0.0 {
                    var.sqrt()
                } else {
                    1.0
                }
            })
            .collect();
        let mut space = MatchingSpace {
            scale,
            targets: Vec::new(),
        };
        space.targets = found.iter().map(|p| space.place(p)).collect();
        space
    }

    /// A raw score point in this space.
    pub(crate) fn place(&self, point: &[f64]) -> Vec<f64> {
        point.iter().zip(&self.scale).map(|(v, s)| v / s).collect()
    }

    /// `n` distinct candidates (points already [`place`](Self::place)d), one per target drawn
    /// at random: each time the unchosen candidate nearest to the target (ties to the lower id;
    /// candidates without scores come last, by id). Fewer when there are fewer candidates; none
    /// when the fold has no found ending.
    pub(crate) fn choose(
        &self,
        candidates: &[(i64, Option<Vec<f64>>)],
        n: usize,
        rng: &mut ChaCha8Rng,
    ) -> Vec<i64> {
        let mut left: Vec<&(i64, Option<Vec<f64>>)> = candidates.iter().collect();
        let mut chosen = Vec::with_capacity(n.min(left.len()));
        while chosen.len() < n && !left.is_empty() {
            let Some(target) = self.targets.choose(rng) else {
                break;
            };
            let distance = |point: &Option<Vec<f64>>| {
                point.as_ref().map_or(f64::INFINITY, |p| {
                    p.iter().zip(target).map(|(a, b)| (a - b).powi(2)).sum()
                })
            };
            let nearest = (0..left.len())
                .min_by(|&a, &b| {
                    distance(&left[a].1)
                        .total_cmp(&distance(&left[b].1))
                        .then(left[a].0.cmp(&left[b].0))
                })
                .expect("left is not empty");
            chosen.push(left.swap_remove(nearest).0);
        }
        chosen
    }
}

/// What a run's matched distractors are chosen with: per fold, the space of its found endings'
/// scores; each context's fold; and every assigned negative's raw scores.
pub struct Matching {
    spaces: HashMap<i64, MatchingSpace>,
    folds: HashMap<i64, i64>,
    assigned: HashMap<i64, FinalPoint>,
    axes: Axes,
}

/// The scores besides the ensemble's that a run's matching is on: each only where every found
/// and assigned ending has it (runs without the head, or finished before afkit kept its scores,
/// match without it).
#[derive(Debug, Clone, Copy)]
struct Axes {
    sentence: bool,
    style: bool,
}

impl Axes {
    fn of<'a>(points: impl Iterator<Item = &'a FinalPoint> + Clone) -> Axes {
        Axes {
            sentence: points.clone().all(|p| p.sentence.is_some()),
            style: points.clone().all(|p| p.style.is_some()),
        }
    }

    /// An ending's point on these axes; `None` when it lacks a score they need.
    fn point(self, p: &FinalPoint) -> Option<Vec<f64>> {
        let mut point = vec![p.ensemble];
        for (on, score) in [(self.sentence, p.sentence), (self.style, p.style)] {
            if on {
                point.push(score?);
            }
        }
        Some(point)
    }
}

impl Matching {
    /// The matching of AF run `run_id`; `None` when the run scored no found ending (runs
    /// finished before afkit kept those scores).
    pub fn load(store: &Store, run_id: i64) -> Result<Option<Matching>> {
        let folds = store.folds(run_id)?;
        let scores = store.matching_scores(run_id)?;
        let axes = Axes::of(scores.found.values().chain(scores.assigned.values()));
        let mut by_fold: BTreeMap<i64, Vec<(i64, Vec<f64>)>> = BTreeMap::new();
        for (example, p) in &scores.found {
            if let (Some(&fold), Some(point)) = (folds.get(example), axes.point(p)) {
                by_fold.entry(fold).or_default().push((*example, point));
            }
        }
        if by_fold.is_empty() {
            return Ok(None);
        }
        let spaces = by_fold
            .into_iter()
            .map(|(fold, mut found)| {
                // In example order, so that a seeded draw does not depend on SQLite's row order.
                found.sort_by_key(|(example, _)| *example);
                let points: Vec<Vec<f64>> = found.into_iter().map(|(_, p)| p).collect();
                (fold, MatchingSpace::new(&points))
            })
            .collect();
        Ok(Some(Matching {
            spaces,
            folds,
            assigned: scores.assigned,
            axes,
        }))
    }

    /// The final scores the match is on, by name: `ensemble`, then `sentence` and `style` where
    /// every found ending and assigned negative of the run has them.
    pub fn axes(&self) -> Vec<&'static str> {
        let mut axes = vec!["ensemble"];
        for (on, name) in [(self.axes.sentence, "sentence"), (self.axes.style, "style")] {
            if on {
                axes.push(name);
            }
        }
        axes
    }

    /// Up to `n` of `example`'s `candidates`, matched to the found endings of its fold, in the
    /// order they were chosen. A candidate's scores are the run's when it is an assigned
    /// negative, else `pool`'s (the context's scored pool, for endings a re-annotation refill
    /// brings in); candidates with neither are taken last. `None` when the context's fold has
    /// no scored found ending.
    pub fn choose(
        &self,
        example: i64,
        candidates: &[i64],
        pool: &HashMap<i64, FinalPoint>,
        n: usize,
        rng: &mut ChaCha8Rng,
    ) -> Option<Vec<i64>> {
        let space = self.spaces.get(self.folds.get(&example)?)?;
        let placed: Vec<(i64, Option<Vec<f64>>)> = candidates
            .iter()
            .map(|&e| {
                let scores = self.assigned.get(&e).or_else(|| pool.get(&e));
                let point = scores.and_then(|p| self.axes.point(p));
                (e, point.map(|p| space.place(&p)))
            })
            .collect();
        Some(space.choose(&placed, n, rng))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use afkit_engine::seed::Seed;
    use proptest::prelude::*;

    fn one_axis(scores: &[f64]) -> Vec<Vec<f64>> {
        scores.iter().map(|&s| vec![s]).collect()
    }

    proptest! {
        #[test]
        fn matching_takes_distinct_candidates_each_nearest_its_target(
            points in prop::collection::vec(
                prop::option::weighted(0.9, prop::collection::vec(-5.0f64..5.0, 2)), 0..12),
            found in prop::collection::vec(prop::collection::vec(-5.0f64..5.0, 2), 0..6),
            n in 0usize..6,
            seed in 0u64..1000,
        ) {
            let space = MatchingSpace::new(&found);
            let candidates: Vec<(i64, Option<Vec<f64>>)> = points
                .into_iter()
                .enumerate()
                .map(|(i, p)| (10 + i as i64, p.map(|p| space.place(&p))))
                .collect();
            let chosen = space.choose(&candidates, n, &mut Seed::new(seed).rng());
            let expected = if found.is_empty() { 0 } else { n.min(candidates.len()) };
            prop_assert_eq!(chosen.len(), expected);
            let mut distinct = chosen.clone();
            distinct.sort_unstable();
            distinct.dedup();
            prop_assert_eq!(distinct.len(), chosen.len(), "a candidate is chosen once");
            // Replaying the draws: every pick is the nearest of what was left to its target.
            let mut rng = Seed::new(seed).rng();
            let mut left = candidates.clone();
            for &pick in &chosen {
                let target = space.targets.choose(&mut rng).unwrap();
                let distance = |p: &Option<Vec<f64>>| p.as_ref().map_or(f64::INFINITY, |p| {
                    p.iter().zip(target).map(|(a, b)| (a - b).powi(2)).sum::<f64>()
                });
                let picked = &left.iter().find(|(id, _)| *id == pick).unwrap().1;
                prop_assert!(left.iter().all(|(_, p)| distance(p) >= distance(picked)));
                left.retain(|(id, _)| *id != pick);
            }
        }
    }

    #[test]
    fn scores_far_from_every_found_ending_are_taken_last() {
        let space = MatchingSpace::new(&one_axis(&[0.0]));
        let candidates: Vec<(i64, Option<Vec<f64>>)> = [(1, 9.0), (2, 0.1), (3, 8.0), (4, -0.2)]
            .into_iter()
            .map(|(id, s)| (id, Some(vec![s])))
            .collect();
        let chosen = space.choose(&candidates, 2, &mut Seed::new(0).rng());
        assert_eq!(chosen, vec![2, 4]);
    }

    #[test]
    fn the_draw_follows_the_found_endings_distribution() {
        // Candidates at every score from 0 to 99, found endings only between 40 and 60: four
        // choices land within four of that range (a target drawn again takes the next nearest),
        // whatever the seed, and never among the highest scores that `hardest` would take.
        let found: Vec<f64> = (40..=60).map(f64::from).collect();
        let space = MatchingSpace::new(&one_axis(&found));
        let candidates: Vec<(i64, Option<Vec<f64>>)> = (0..100)
            .map(|i| (i, Some(space.place(&[i as f64]))))
            .collect();
        for seed in 0..50 {
            let chosen = space.choose(&candidates, 4, &mut Seed::new(seed).rng());
            assert_eq!(chosen.len(), 4);
            assert!(chosen.iter().all(|&c| (36..=64).contains(&c)), "{chosen:?}");
        }
    }

    #[test]
    fn the_match_is_on_every_score_all_endings_have() {
        let point = |sentence, style| FinalPoint {
            ensemble: 1.0,
            sentence,
            style,
        };
        let full = point(Some(2.0), Some(3.0));
        let axes = Axes::of([full, full].iter());
        assert_eq!(axes.point(&full), Some(vec![1.0, 2.0, 3.0]));
        assert_eq!(axes.point(&point(Some(2.0), None)), None);
        // A run finished before afkit kept style scores matches on the other two, as it did.
        let older = point(Some(2.0), None);
        let axes = Axes::of([full, older].iter());
        assert_eq!(axes.point(&older), Some(vec![1.0, 2.0]));
        let axes = Axes::of([point(None, Some(3.0))].iter());
        assert_eq!(axes.point(&full), Some(vec![1.0, 3.0]));
    }

    #[test]
    fn each_axis_counts_by_the_spread_of_the_found_endings() {
        // The ensemble's scores spread over ±100, the sentence model's over ±1. Unscaled, the
        // ensemble axis would decide alone; scaled, a candidate far off on the sentence axis
        // loses to one a little off on both.
        let space = MatchingSpace::new(&[vec![-100.0, -1.0], vec![100.0, 1.0]]);
        let target = [100.0, 1.0];
        let off_on_sentence = space.place(&[target[0] - 1.0, target[1] - 1.5]);
        let a_little_off_on_both = space.place(&[target[0] - 20.0, target[1] - 0.2]);
        let candidates = vec![(1, Some(off_on_sentence)), (2, Some(a_little_off_on_both))];
        let only_high = MatchingSpace {
            targets: vec![space.place(&target)],
            ..space
        };
        assert_eq!(
            only_high.choose(&candidates, 1, &mut Seed::new(3).rng()),
            vec![2]
        );
    }
}
