//! Splits by group: every group (video) goes to exactly one of train / val / test, so that no
//! test context shares a video with a training context.
//!
//! Groups are visited in a seeded random order and each goes to the split that is furthest below
//! its target share of examples (its example count divided by its fraction is the smallest), so
//! the splits hit the requested fractions closely even with few, unevenly sized groups.
//!
//! Stability: a recorded assignment made with the same seed and fractions is kept as it is;
//! only groups that are new since then are placed (by the same rule, on top of the existing
//! counts). A released test split therefore never changes when examples are added.

use std::collections::BTreeMap;

use rand::seq::SliceRandom;

use afkit_engine::seed::Seed;
use afkit_store::dataset::Split;

/// Assigns every group in `sizes` (group → number of examples) to a split, given the train, val
/// and test `fractions` (in the order of [`Split::ALL`], adding up to 1). `previous` holds the
/// recorded assignment when it was made with the same seed and fractions (else pass an empty map).
pub(crate) fn assign(
    sizes: &BTreeMap<String, usize>,
    fractions: [f64; 3],
    seed: Seed,
    previous: &BTreeMap<String, Split>,
) -> BTreeMap<String, Split> {
    // Examples per split, indexed like `Split::ALL` and the fractions.
    let mut counts = [0usize; 3];
    let mut out = BTreeMap::new();
    let mut new_groups = Vec::new();
    for (group, &size) in sizes {
        match previous.get(group) {
            Some(&split) => {
                counts[split as usize] += size;
                out.insert(group.clone(), split);
            }
            None => new_groups.push(group.clone()),
        }
    }
    // BTreeMap order is the canonical starting order; the seeded shuffle makes it random.
    new_groups.shuffle(&mut seed.rng());
    for group in new_groups {
        let index = (0..3)
            .filter(|&i| fractions[i] > 0.0)
            .min_by(|&a, &b| {
                let fill = |i: usize| counts[i] as f64 / fractions[i];
                fill(a).total_cmp(&fill(b)).then(a.cmp(&b))
            })
            .expect("fractions sum to 1, so one is positive");
        counts[index] += sizes[&group];
        out.insert(group, Split::ALL[index]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(n: usize) -> BTreeMap<String, usize> {
        (0..n).map(|i| (format!("v{i:03}"), 1 + i % 7)).collect()
    }

    #[test]
    fn hits_the_fractions_and_is_reproducible() {
        let sizes = sizes(300);
        let total: usize = sizes.values().sum();
        let f = [0.8, 0.1, 0.1];
        let a = assign(&sizes, f, Seed::new(7), &BTreeMap::new());
        assert_eq!(a, assign(&sizes, f, Seed::new(7), &BTreeMap::new()));
        assert_ne!(
            a,
            assign(&sizes, f, Seed::new(8), &BTreeMap::new()),
            "the seed matters"
        );
        for (i, split) in Split::ALL.iter().enumerate() {
            let n: usize = a
                .iter()
                .filter(|(_, s)| *s == split)
                .map(|(g, _)| sizes[g])
                .sum();
            let share = n as f64 / total as f64;
            assert!((share - f[i]).abs() < 0.02, "{split}: {share}");
        }
    }

    #[test]
    fn keeps_recorded_groups_when_groups_are_added() {
        let f = [0.6, 0.2, 0.2];
        let before = assign(&sizes(50), f, Seed::new(1), &BTreeMap::new());
        let after = assign(&sizes(80), f, Seed::new(1), &before);
        for (group, split) in &before {
            assert_eq!(&after[group], split);
        }
        assert_eq!(after.len(), 80);
    }

    #[test]
    fn zero_fraction_splits_stay_empty() {
        let a = assign(&sizes(20), [1.0, 0.0, 0.0], Seed::new(0), &BTreeMap::new());
        assert!(a.values().all(|&s| s == Split::Train));
    }
}
