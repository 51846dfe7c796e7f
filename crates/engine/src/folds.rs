//! Folds by group: questions cut from one video share people, places and phrasing (ActivityNet's
//! `sent1` is often the previous caption's ending), so a model tested on a video it was trained
//! on would be credited for recognising the video rather than for reading style. Every group
//! therefore lands in exactly one fold; a question without a group is a group of its own. The
//! audit's cross-validation and AF's held-out contexts both deal their folds here.

use std::collections::HashMap;

use crate::seed::Seed;
use rand::seq::SliceRandom;

/// The fold (0..k) of every question, given each question's group.
///
/// The groups are shuffled with `seed`, then dealt largest first (a stable sort, so groups of
/// equal size keep their shuffled order) to the fold with the fewest questions so far. Dealing
/// largest first keeps the folds within one largest group of each other in questions; the
/// shuffle makes which groups share a fold depend on the seed alone, not on the file order.
pub fn assign(groups: &[Option<&str>], k: usize, seed: Seed) -> Vec<usize> {
    assert!(k >= 1, "at least one fold");
    let mut group_of = Vec::with_capacity(groups.len());
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut sizes: Vec<usize> = Vec::new();
    for group in groups {
        let g = match group {
            Some(name) => *index.entry(*name).or_insert_with(|| {
                sizes.push(0);
                sizes.len() - 1
            }),
            None => {
                sizes.push(0);
                sizes.len() - 1
            }
        };
        sizes[g] += 1;
        group_of.push(g);
    }
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.shuffle(&mut seed.rng());
    order.sort_by(|a, b| sizes[*b].cmp(&sizes[*a]));
    let mut load = vec![0usize; k];
    let mut fold_of_group = vec![0usize; sizes.len()];
    for g in order {
        let lightest = (0..k).min_by_key(|&f| (load[f], f)).expect("k >= 1");
        load[lightest] += sizes[g];
        fold_of_group[g] = lightest;
    }
    group_of.into_iter().map(|g| fold_of_group[g]).collect()
}

/// The number of distinct groups (a question without one counts as its own).
pub fn count_groups(groups: &[Option<&str>]) -> usize {
    let named: std::collections::HashSet<&str> = groups.iter().flatten().copied().collect();
    named.len() + groups.iter().filter(|g| g.is_none()).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(ids: &[Option<u8>]) -> Vec<Option<String>> {
        ids.iter().map(|g| g.map(|g| format!("v{g}"))).collect()
    }

    proptest! {
        #[test]
        fn groups_never_straddle_folds_and_folds_are_balanced(
            ids in prop::collection::vec(prop::option::weighted(0.8, 0u8..40), 1..300),
            k in 2usize..8,
            seed in any::<u64>(),
        ) {
            let owned = names(&ids);
            let groups: Vec<Option<&str>> = owned.iter().map(|g| g.as_deref()).collect();
            let folds = assign(&groups, k, Seed::new(seed));
            prop_assert_eq!(folds.len(), groups.len());
            let mut fold_of: HashMap<&str, usize> = HashMap::new();
            for (g, &f) in groups.iter().zip(&folds) {
                prop_assert!(f < k);
                if let Some(g) = *g {
                    prop_assert_eq!(*fold_of.entry(g).or_insert(f), f, "group {} in two folds", g);
                }
            }
            let mut sizes: HashMap<&str, usize> = HashMap::new();
            for &g in groups.iter().flatten() {
                *sizes.entry(g).or_default() += 1;
            }
            let largest = sizes.values().copied().max().unwrap_or(0).max(1);
            let load: Vec<usize> = (0..k).map(|f| folds.iter().filter(|&&x| x == f).count()).collect();
            let (min, max) = (*load.iter().min().unwrap(), *load.iter().max().unwrap());
            prop_assert!(max - min <= largest, "loads {:?}, largest group {}", load, largest);
            if count_groups(&groups) >= k {
                prop_assert!(min > 0, "an empty fold: {:?}", load);
            }
            prop_assert_eq!(assign(&groups, k, Seed::new(seed)), folds, "the seed fixes the folds");
        }
    }

    #[test]
    fn the_seed_decides_which_groups_share_a_fold() {
        let owned: Vec<String> = (0..60).map(|i| format!("v{i}")).collect();
        let groups: Vec<Option<&str>> = owned.iter().map(|g| Some(g.as_str())).collect();
        assert_ne!(
            assign(&groups, 5, Seed::new(1)),
            assign(&groups, 5, Seed::new(2))
        );
        assert_eq!(count_groups(&[Some("a"), None, Some("a"), None]), 3);
    }
}
