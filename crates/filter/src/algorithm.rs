//! The pure parts of SWAG's Algorithm 1: the initial assignment, the 80/20 split, accuracy,
//! which negatives to swap, and when to stop. No models and no I/O here, so the invariants are
//! tested directly (see the property tests below and `tests/filter.rs`).
//!
//! Swap rule (SWAG Algorithm 1, the replacement step). For a held-out context with gold score g:
//! - easy negatives: assigned endings x_j with g > f(x_j);
//! - adversarial candidates: unassigned pool endings x with f(x) > f(x_easy).
//!
//! Up to N_easy easy negatives are replaced, the easiest (lowest score) first, each by an
//! adversarial candidate that outscores it, taken in the order of [`Replacement`]: by default
//! the highest-scoring (the paper's rule), or the one scoring nearest the gold. The reference
//! code's stricter variant (candidates must also outscore the gold) is not used: it would leave a
//! context's easy negatives in place whenever its gold is hard to beat.

use rand::seq::{IndexedRandom, SliceRandom};
use rand::RngCore;
use rand_chacha::ChaCha8Rng;

use crate::settings::{Convergence, Replacement};
use afkit_engine::seed::Seed;

// Each step of a run draws from its own stream of the run's seed (`Seed::stream`), so that any
// iteration can be re-run on its own and a resumed run draws exactly what an uninterrupted one
// would.

/// Stream of the initial assignment; iteration `i` uses stream `i + 1`.
pub(crate) const INITIAL_STREAM: u64 = 0;
/// Stream of the final cross-fitted pass.
pub(crate) const FINAL_STREAM: u64 = u64::MAX;

pub(crate) fn iteration_stream(iteration: usize) -> u64 {
    iteration as u64 + 1
}

/// The seed of the models a step trains (and of a group-wise deal of folds): the next number of
/// the step's stream.
pub(crate) fn draw_seed(rng: &mut ChaCha8Rng) -> Seed {
    Seed::new(rng.next_u64())
}

/// k distinct endings drawn uniformly from `pool` (which must hold at least k).
pub(crate) fn initial_draw(pool: &[i64], k: usize, rng: &mut ChaCha8Rng) -> Vec<i64> {
    pool.choose_multiple(rng, k).copied().collect()
}

// Without groups (every context a group of its own) the split and the folds draw exactly as
// they did before groups could be held out together, so a recorded seed still gives its run.

/// A random split of the contexts into train (about 80%) and test (about 20%, at least one
/// context), whole groups at a time: the first of five folds dealt by group is held out.
/// `groups[i]` is context i's group (`None`: a group of its own).
pub(crate) fn split_80_20(
    groups: &[Option<&str>],
    rng: &mut ChaCha8Rng,
) -> (Vec<usize>, Vec<usize>) {
    let n = groups.len();
    if groups.iter().all(Option::is_none) {
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(rng);
        let n_test = ((n as f64 * 0.2).round() as usize).clamp(1.min(n), n);
        let test = order.split_off(n - n_test);
        return (order, test);
    }
    let fold_of = folds(groups, 5, rng);
    (0..n).partition(|&i| fold_of[i] != 0)
}

/// The split of a phase's iteration `turn` when the iterations take turns
/// ([`crate::HeldOutTurns::Rotating`]): `deal` deals the contexts into five folds by group, the
/// same deal for turns 5·r to 5·r + 4, and turn t holds out fold t mod 5. So every context is
/// held out exactly once in every five turns of a deal. A project of fewer than five groups is
/// dealt into as many folds as it has groups, so that no turn holds out nothing.
pub(crate) fn rotating_split(
    groups: &[Option<&str>],
    turn: usize,
    deal: &mut ChaCha8Rng,
) -> (Vec<usize>, Vec<usize>) {
    let n_folds = afkit_engine::folds::count_groups(groups).clamp(1, 5);
    let fold_of = folds(groups, n_folds, deal);
    (0..groups.len()).partition(|&i| fold_of[i] != turn % n_folds)
}

/// Deals the contexts into `folds` folds of near-equal size by group ([`afkit_engine::folds`]), at
/// random.
pub(crate) fn folds(groups: &[Option<&str>], folds: usize, rng: &mut ChaCha8Rng) -> Vec<usize> {
    if groups.iter().all(Option::is_none) {
        let mut order: Vec<usize> = (0..groups.len()).collect();
        order.shuffle(rng);
        let mut fold_of = vec![0; groups.len()];
        for (position, &context) in order.iter().enumerate() {
            fold_of[context] = position % folds;
        }
        return fold_of;
    }
    afkit_engine::folds::assign(groups, folds, draw_seed(rng))
}

/// A choice counts as solved when the gold outscores every assigned negative (ties are errors,
/// so a model that scores everything alike sits at or below chance, never above).
pub(crate) fn solved(gold: f32, assigned: &[f32]) -> bool {
    assigned.iter().all(|&s| gold > s)
}

/// Which adversarial candidate replaces an easy negative.
///
/// The swaps for one held-out context: pairs (slot of the replaced easy negative, ending id that
/// replaces it). `assigned`: (ending id, score) per slot; `unassigned`: (ending id, score) of the
/// pool endings not assigned (the gold excluded).
pub(crate) fn choose_swaps(
    gold: f32,
    assigned: &[(i64, f32)],
    unassigned: &[(i64, f32)],
    n_easy: usize,
    replacement: Replacement,
) -> Vec<(usize, i64)> {
    let mut easy: Vec<usize> = (0..assigned.len())
        .filter(|&slot| gold > assigned[slot].1)
        .collect();
    easy.sort_by(|&a, &b| assigned[a].1.total_cmp(&assigned[b].1).then(a.cmp(&b)));
    // Candidates in order of preference, ties broken by ending id.
    let mut candidates: Vec<(i64, f32)> = unassigned.to_vec();
    match replacement {
        Replacement::NearestGold => candidates.sort_by(|a, b| {
            (a.1 - gold)
                .abs()
                .total_cmp(&(b.1 - gold).abs())
                .then(a.0.cmp(&b.0))
        }),
        Replacement::Highest => candidates.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))),
    }
    let mut swaps = Vec::new();
    for slot in easy.into_iter().take(n_easy) {
        let easy_score = assigned[slot].1;
        if let Some(at) = candidates.iter().position(|c| c.1 > easy_score) {
            swaps.push((slot, candidates.remove(at).0));
        }
    }
    swaps
}

impl Convergence {
    /// Whether one iteration was quiet: `accuracy` is the deciding model's held-out accuracy.
    pub(crate) fn quiet(&self, k: usize, swaps: usize, n_test: usize, accuracy: f64) -> bool {
        (swaps as f64) < self.min_swap_fraction * n_test as f64
            || self.at_chance(k, n_test, accuracy)
    }

    /// Whether a held-out accuracy over `n_test` contexts of k + 1 options is within the rule's
    /// standard errors of chance, or under it.
    pub(crate) fn at_chance(&self, k: usize, n_test: usize, accuracy: f64) -> bool {
        let chance = 1.0 / (k as f64 + 1.0);
        let margin = self.chance_standard_errors * (chance * (1.0 - chance) / n_test as f64).sqrt();
        accuracy <= chance + margin
    }

    /// Whether a phase whose iterations were quiet or not (in order) has converged.
    pub(crate) fn converged(&self, quiet: &[bool]) -> bool {
        quiet.len() >= self.min_iterations && self.settled(quiet)
    }

    /// Whether the last `patience` iterations were all quiet, however few the phase ran: the
    /// style phase's rule, which has no floor because the adversary's iterations follow.
    pub(crate) fn settled(&self, quiet: &[bool]) -> bool {
        self.patience > 0
            && quiet.len() >= self.patience
            && quiet[quiet.len() - self.patience..].iter().all(|&q| q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn scores() -> impl Strategy<Value = f32> {
        // Few distinct values, so ties are common.
        (0i32..8).prop_map(|v| v as f32 / 2.0)
    }

    proptest! {
        #[test]
        fn swaps_replace_easy_negatives_by_higher_scoring_unassigned_endings(
            gold in scores(),
            assigned in prop::collection::vec(scores(), 1..10),
            unassigned in prop::collection::vec(scores(), 0..20),
            n_easy in 0usize..4,
            nearest in any::<bool>(),
        ) {
            let replacement =
                if nearest { Replacement::NearestGold } else { Replacement::Highest };
            let assigned: Vec<(i64, f32)> =
                assigned.into_iter().enumerate().map(|(i, s)| (i as i64, s)).collect();
            let unassigned: Vec<(i64, f32)> =
                unassigned.into_iter().enumerate().map(|(i, s)| (100 + i as i64, s)).collect();
            let swaps = choose_swaps(gold, &assigned, &unassigned, n_easy, replacement);
            prop_assert!(swaps.len() <= n_easy);
            let mut slots: Vec<usize> = swaps.iter().map(|s| s.0).collect();
            let mut news: Vec<i64> = swaps.iter().map(|s| s.1).collect();
            slots.sort_unstable();
            slots.dedup();
            news.sort_unstable();
            news.dedup();
            prop_assert_eq!(slots.len(), swaps.len(), "a slot is swapped at most once");
            prop_assert_eq!(news.len(), swaps.len(), "an ending comes in at most once");
            for (slot, new) in &swaps {
                let old_score = assigned[*slot].1;
                let new_score = unassigned.iter().find(|u| u.0 == *new).unwrap().1;
                prop_assert!(gold > old_score, "only easy negatives are replaced");
                prop_assert!(new_score > old_score, "the newcomer outscores what it replaces");
                // No candidate left unchosen was eligible and preferable.
                for u in unassigned.iter().filter(|u| u.1 > old_score && !news.contains(&u.0)) {
                    match replacement {
                        Replacement::NearestGold => prop_assert!(
                            (u.1 - gold).abs() >= (new_score - gold).abs(),
                            "{u:?} is nearer the gold than the newcomer {new}"
                        ),
                        Replacement::Highest => prop_assert!(u.1 <= new_score),
                    }
                }
            }
            // The rule is not idle: when some unassigned ending outscores the easiest easy
            // negative, at least one swap happens.
            let best = unassigned.iter().map(|u| u.1).fold(f32::MIN, f32::max);
            let easiest = assigned.iter().filter(|a| gold > a.1).map(|a| a.1).fold(f32::MAX, f32::min);
            if n_easy > 0 && best > easiest {
                prop_assert!(!swaps.is_empty());
            }
        }

        #[test]
        fn split_is_a_partition_holding_out_whole_groups(
            ids in prop::collection::vec(prop::option::of(0u8..30), 1..200),
            seed in 0u64..1000,
        ) {
            let names: Vec<Option<String>> = ids.iter().map(|g| g.map(|g| format!("v{g}"))).collect();
            let groups: Vec<Option<&str>> = names.iter().map(|g| g.as_deref()).collect();
            let n = groups.len();
            let (train, test) = split_80_20(&groups, &mut Seed::new(seed).stream(1));
            let mut all: Vec<usize> = train.iter().chain(&test).copied().collect();
            all.sort_unstable();
            prop_assert_eq!(all, (0..n).collect::<Vec<_>>());
            prop_assert!(!test.is_empty());
            for &i in &train {
                prop_assert!(
                    groups[i].is_none() || test.iter().all(|&j| groups[j] != groups[i]),
                    "group {:?} on both sides", groups[i]
                );
            }
            if groups.iter().all(Option::is_none) {
                prop_assert!((test.len() as f64 - n as f64 * 0.2).abs() <= 1.0);
            }
        }

        #[test]
        fn initial_draw_takes_k_distinct_pool_endings(
            pool_size in 1usize..40, k in 1usize..10, seed in 0u64..1000,
        ) {
            prop_assume!(pool_size >= k);
            let pool: Vec<i64> = (0..pool_size as i64).map(|i| i * 7 + 3).collect();
            let draw = initial_draw(&pool, k, &mut Seed::new(seed).stream(INITIAL_STREAM));
            let mut distinct = draw.clone();
            distinct.sort_unstable();
            distinct.dedup();
            prop_assert_eq!(distinct.len(), k);
            prop_assert!(draw.iter().all(|e| pool.contains(e)));
            prop_assert_eq!(draw, initial_draw(&pool, k, &mut Seed::new(seed).stream(INITIAL_STREAM)));
        }
    }

    #[test]
    fn nearest_gold_takes_the_candidate_level_with_the_gold_where_highest_overshoots() {
        let assigned = [(1, 0.0), (2, 3.0)];
        let unassigned = [(10, 5.0), (11, 1.1), (12, 0.5)];
        let swaps = |rule| choose_swaps(1.0, &assigned, &unassigned, 2, rule);
        assert_eq!(swaps(Replacement::NearestGold), [(0, 11)]);
        assert_eq!(swaps(Replacement::Highest), [(0, 10)]);
    }

    #[test]
    fn ties_with_the_gold_are_not_solved() {
        assert!(solved(1.0, &[0.5, 0.9]));
        assert!(!solved(1.0, &[0.5, 1.0]));
        assert!(solved(1.0, &[]));
    }

    #[test]
    fn convergence_needs_patience_quiet_iterations_in_a_row() {
        let rule = Convergence::default();
        // k = 9, 200 held out: chance 0.1, margin 2·sqrt(0.09/200) ≈ 0.042.
        assert!(rule.quiet(9, 0, 200, 0.9), "no swaps");
        assert!(rule.quiet(9, 50, 200, 0.14));
        assert!(!rule.quiet(9, 50, 200, 0.15));
        assert!(!rule.converged(&[true]));
        assert!(!rule.converged(&[false, false, false, true, false]));
        assert!(
            !rule.converged(&[true, true, true, true]),
            "fewer than min_iterations"
        );
        assert!(rule.converged(&[false, false, false, true, true]));
        assert!(rule.settled(&[true, true]), "no floor");
        assert!(!rule.settled(&[true, false]));
        assert!(!rule.settled(&[true]));
    }

    proptest! {
        #[test]
        fn rotating_turns_hold_out_every_context_once_per_deal(
            ids in prop::collection::vec(prop::option::of(0u8..30), 1..120),
            seed in 0u64..1000,
            round in 0usize..3,
        ) {
            let names: Vec<Option<String>> = ids.iter().map(|g| g.map(|g| format!("v{g}"))).collect();
            let groups: Vec<Option<&str>> = names.iter().map(|g| g.as_deref()).collect();
            let n = groups.len();
            let mut held_out_turns = vec![0usize; n];
            // Five folds, or one per group when there are fewer.
            let n_folds = afkit_engine::folds::count_groups(&groups).min(5);
            for turn in 5 * round..5 * round + n_folds {
                let (train, test) = rotating_split(&groups, turn, &mut Seed::new(seed).rng());
                prop_assert!(!test.is_empty(), "turn {} holds out nothing", turn);
                prop_assert_eq!(train.len() + test.len(), n);
                for &i in &test {
                    held_out_turns[i] += 1;
                    for &j in &train {
                        prop_assert!(groups[i].is_none() || groups[i] != groups[j]);
                    }
                }
            }
            prop_assert!(held_out_turns.iter().all(|&t| t == 1), "{:?}", held_out_turns);
        }
    }

    #[test]
    fn folds_are_balanced() {
        let f = folds(&[None; 23], 5, &mut Seed::new(1).stream(FINAL_STREAM));
        for fold in 0..5 {
            let size = f.iter().filter(|&&x| x == fold).count();
            assert!(size == 4 || size == 5);
        }
    }
}
