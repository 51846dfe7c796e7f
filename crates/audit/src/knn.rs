//! KNN distances between held-out and training examples (AFLite, seeds/001 Table 3): the mean
//! cosine distance from each val item to its k nearest training items, for several k, next to
//! the same measure from training items to the other training items (the baseline: how close
//! items of one distribution are to each other). Computed on whole examples (context + gold
//! ending) and per class on endings alone — gold to gold, distractor to distractor, and across —
//! the per-class and class-vs-others rows of Table 3. A dataset whose val items sit much closer to
//! train than train items sit to each other is redundant; AF aims to bring gold and distractor
//! endings close together.

use std::collections::BTreeMap;

use anyhow::Result;
use rayon::prelude::*;
use serde::Serialize;

use super::dataset::Question;
use super::observer::Observer;
use afkit_store::dataset::startphrase;

/// The neighbour counts reported (Table 3: Top1, Top5, Top10, Top50).
pub(crate) const KS: [usize; 4] = [1, 5, 10, 50];

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
pub(crate) fn mean_knn_distance(
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

/// Unit-length sentence embeddings of a batch of texts, in order, calling the progress callback
/// with the number of texts done after each batch (MiniLM's `encode_with_progress`).
pub(crate) type Encode<'a> = dyn Fn(&[&str], &mut dyn FnMut(usize)) -> Result<Vec<Vec<f32>>> + 'a;

/// Embeds the questions of both splits with `encode` (model name `model`) and measures the
/// distances of the module docs.
pub(crate) fn measure(
    encode: &Encode,
    model: &str,
    train: &[&Question],
    val: &[&Question],
    observer: &mut dyn Observer,
) -> Result<KnnReport> {
    let whole = |q: &Question| -> String {
        let gold = q.label.expect("labels checked on read");
        format!("{} {}", startphrase(&q.sent1, &q.sent2), q.endings[gold])
    };
    let gold = |q: &Question| q.endings[q.label.expect("labels checked on read")].clone();
    let distractors = |q: &Question| -> Vec<String> {
        let g = q.label.expect("labels checked on read");
        (0..4)
            .filter(|&o| o != g)
            .map(|o| q.endings[o].clone())
            .collect()
    };
    let mut texts: Vec<String> = Vec::new();
    let mut push = |list: Vec<String>| -> std::ops::Range<usize> {
        let start = texts.len();
        texts.extend(list);
        start..texts.len()
    };
    let train_whole = push(train.iter().map(|q| whole(q)).collect());
    let val_whole = push(val.iter().map(|q| whole(q)).collect());
    let train_gold = push(train.iter().map(|q| gold(q)).collect());
    let val_gold = push(val.iter().map(|q| gold(q)).collect());
    let train_dis = push(train.iter().flat_map(|q| distractors(q)).collect());
    let val_dis = push(val.iter().flat_map(|q| distractors(q)).collect());
    observer.counting(texts.len(), "texts embedded");
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let vectors = encode(&refs, &mut |n| observer.counted(n))?;
    let v = |r: &std::ops::Range<usize>| &vectors[r.clone()];
    Ok(KnnReport {
        model: model.into(),
        k: KS.to_vec(),
        n_train: train.len(),
        n_val: val.len(),
        val_to_train: mean_knn_distance(v(&val_whole), v(&train_whole), &KS, false),
        train_to_train: mean_knn_distance(v(&train_whole), v(&train_whole), &KS, true),
        by_class: by_class([v(&train_gold), v(&val_gold)], [v(&train_dis), v(&val_dis)]),
    })
}

/// The per-class rows of Table 3 from the ending vectors (`[train, val]` of each class): gold to
/// gold, distractor to distractor, and each class of val to the other class of train.
fn by_class(gold: [&[Vec<f32>]; 2], distractors: [&[Vec<f32>]; 2]) -> BTreeMap<String, Vec<f64>> {
    let [train_gold, val_gold] = gold;
    let [train_dis, val_dis] = distractors;
    let mut by_class = BTreeMap::new();
    by_class.insert(
        "gold".to_string(),
        mean_knn_distance(val_gold, train_gold, &KS, false),
    );
    by_class.insert(
        "distractor".to_string(),
        mean_knn_distance(val_dis, train_dis, &KS, false),
    );
    by_class.insert(
        "gold_vs_distractor".to_string(),
        mean_knn_distance(val_gold, train_dis, &KS, false),
    );
    by_class.insert(
        "distractor_vs_gold".to_string(),
        mean_knn_distance(val_dis, train_gold, &KS, false),
    );
    by_class
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

    #[test]
    fn measure_embeds_examples_and_endings_by_class() {
        // A fake encoder: the unit vector of the text's first letter, so texts that start alike
        // are identical and others orthogonal.
        let encode = |texts: &[&str], progress: &mut dyn FnMut(usize)| -> Result<Vec<Vec<f32>>> {
            progress(texts.len());
            Ok(texts
                .iter()
                .map(|t| {
                    let mut v = vec![0.0f32; 26];
                    v[(t.as_bytes()[0].to_ascii_lowercase() - b'a') as usize % 26] = 1.0;
                    v
                })
                .collect())
        };
        let q = |gold: &str| Question {
            id: "0".into(),
            group: None,
            sent1: "Kids play.".into(),
            sent2: "They".into(),
            endings: [gold.to_string(), "xa.".into(), "xb.".into(), "xc.".into()],
            label: Some(0),
            could_be_right: None,
        };
        let train = [q("gold one."), q("gold two.")];
        let val = [q("gold three.")];
        let (t, v): (Vec<&Question>, Vec<&Question>) =
            (train.iter().collect(), val.iter().collect());
        let r = measure(&encode, "fake", &t, &v, &mut crate::Silent).unwrap();
        assert_eq!(
            r.val_to_train[0], 0.0,
            "whole examples start with the same word"
        );
        assert_eq!(r.by_class["gold"][0], 0.0);
        assert_eq!(r.by_class["distractor"][0], 0.0);
        assert_eq!(r.by_class["gold_vs_distractor"][0], 1.0, "orthogonal");
        assert_eq!((r.n_train, r.n_val), (2, 1));
    }
}
