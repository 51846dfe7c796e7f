//! KNN distances between held-out and training examples (AFLite, seeds/001 Table 3): the mean
//! cosine distance from each val item to its k nearest training items, for several k, next to
//! the same measure from training items to the other training items (the baseline: how close
//! items of one distribution are to each other). Computed on whole examples (context + gold
//! ending) and per class on endings alone — gold to gold, distractor to distractor, and across —
//! the per-class and class-vs-others rows of Table 3. A dataset whose val items sit much closer to
//! train than train items sit to each other is redundant; AF aims to bring gold and distractor
//! endings close together.

use std::collections::BTreeMap;

use rayon::prelude::*;
use serde::Serialize;

/// The neighbour counts reported (Table 3: Top1, Top5, Top10, Top50).
pub const KS: [usize; 4] = [1, 5, 10, 50];

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KnnReport {
    pub model: String,
    pub k: Vec<usize>,
    /// Examples embedded per split (after sampling).
    pub n_train: usize,
    pub n_val: usize,
    /// Mean distance of val examples to their k nearest train examples, per k.
    pub val_to_train: Vec<f64>,
    /// Mean distance of train examples to their k nearest other train examples, per k.
    pub train_to_train: Vec<f64>,
    /// Ending-level rows: gold, distractor, gold_vs_distractor, distractor_vs_gold.
    pub by_class: BTreeMap<String, Vec<f64>>,
}

/// Mean over `queries` of the mean cosine distance (1 − dot of unit vectors) to the k nearest
/// vectors of `base`, for every k in `ks` (capped by the base size). With `skip_self`, query i is
/// base i and is not its own neighbour.
pub fn mean_knn_distance(
    queries: &[Vec<f32>],
    base: &[Vec<f32>],
    ks: &[usize],
    skip_self: bool,
) -> Vec<f64> {
    if queries.is_empty() || base.len() <= usize::from(skip_self) {
        return vec![f64::NAN; ks.len()];
    }
    let kmax = ks.iter().copied().max().unwrap_or(1);
    let per_query: Vec<Vec<f64>> = queries
        .par_iter()
        .enumerate()
        .map(|(qi, q)| {
            let mut d: Vec<f64> = base
                .iter()
                .enumerate()
                .filter(|(bi, _)| !(skip_self && *bi == qi))
                .map(|(_, b)| {
                    1.0 - q
                        .iter()
                        .zip(b)
                        .map(|(x, y)| (*x as f64) * (*y as f64))
                        .sum::<f64>()
                })
                .collect();
            let m = kmax.min(d.len());
            if m < d.len() {
                d.select_nth_unstable_by(m - 1, f64::total_cmp);
                d.truncate(m);
            }
            d.sort_by(f64::total_cmp);
            ks.iter()
                .map(|&k| {
                    let k = k.min(d.len());
                    d[..k].iter().sum::<f64>() / k as f64
                })
                .collect()
        })
        .collect();
    (0..ks.len())
        .map(|i| per_query.iter().map(|v| v[i]).sum::<f64>() / per_query.len() as f64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(x: f32, y: f32) -> Vec<f32> {
        let n = (x * x + y * y).sqrt();
        vec![x / n, y / n]
    }

    #[test]
    fn nearest_neighbours_by_cosine_distance() {
        let base = vec![unit(1.0, 0.0), unit(0.0, 1.0), unit(-1.0, 0.0)];
        let queries = vec![unit(1.0, 0.0)];
        let d = mean_knn_distance(&queries, &base, &[1, 2, 3], false);
        assert!((d[0] - 0.0).abs() < 1e-6);
        assert!((d[1] - 0.5).abs() < 1e-6);
        assert!((d[2] - 1.0).abs() < 1e-6);
        let own = mean_knn_distance(&base, &base, &[1], true);
        // Each point's nearest other point is at distance 1 (90°), except none closer.
        assert!((own[0] - 1.0).abs() < 1e-6);
    }
}
