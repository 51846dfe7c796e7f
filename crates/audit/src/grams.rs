//! Sparse option features for the cross-validated baselines, in one shared id space for the
//! whole pooled dataset, cut down to each training fold's own features by [`restrict`].
//!
//! Two kinds of grams: word 1–2-grams (lower-cased afkit tokens, as the train/val n-gram
//! baseline uses) and fastText-style subwords ([`afkit_engine::text::subwords`]). Grams are identified
//! by a 64-bit FNV-1a hash instead of their text, so no gram string is ever held in memory.

use std::collections::HashMap;

use rayon::prelude::*;

use super::dataset::Question;
use super::ngram::{words, Choice, Features};
use afkit_engine::text::subwords::{char_gram_hashes, word_gram_hashes};

/// Which part of the question an option's text includes besides its ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// The ending alone.
    Ending,
    /// sent2 + ending (what the question's reader completes).
    Sent2,
    /// sent1 + sent2 + ending.
    Context,
}

impl View {
    /// The text option `o` of `q` shows under this view.
    pub(crate) fn text(self, q: &Question, o: usize) -> String {
        match self {
            View::Ending => q.endings[o].clone(),
            View::Sent2 => format!("{} {}", q.sent2, q.endings[o]),
            View::Context => format!("{} {} {}", q.sent1, q.sent2, q.endings[o]),
        }
    }
}

/// How a text becomes grams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grams {
    /// Lower-cased word unigrams and bigrams.
    Words,
    /// Character 2–5-grams of each `<word>`, case kept.
    Chars,
}

/// Every question's four options as averaged bags of grams (each gram weighs 1 / the number of
/// grams in the option's text, as fastText averages), over ids shared by the whole pool.
pub(crate) fn featurise(questions: &[Question], view: View, grams: Grams) -> Vec<[Features; 4]> {
    let hashes: Vec<[Vec<u64>; 4]> = questions
        .par_iter()
        .map(|q| {
            std::array::from_fn(|o| {
                let text = view.text(q, o);
                match grams {
                    Grams::Words => word_gram_hashes(&words(&text)),
                    Grams::Chars => char_gram_hashes(&text),
                }
            })
        })
        .collect();
    let mut ids: HashMap<u64, u32> = HashMap::new();
    hashes
        .into_iter()
        .map(|options| options.map(|h| average(&h, &mut ids)))
        .collect()
}

fn average(hashes: &[u64], ids: &mut HashMap<u64, u32>) -> Features {
    if hashes.is_empty() {
        return Vec::new();
    }
    let weight = 1.0 / hashes.len() as f64;
    let mut acc: HashMap<u32, f64> = HashMap::new();
    for h in hashes {
        let next = ids.len() as u32;
        let id = *ids.entry(*h).or_insert(next);
        *acc.entry(id).or_default() += weight;
    }
    let mut v: Features = acc.into_iter().collect();
    v.sort_by_key(|x| x.0);
    v
}

/// Dense vectors (one per option) as features with ids 0..dim.
pub(crate) fn dense(vectors: &[[Vec<f32>; 4]]) -> Vec<[Features; 4]> {
    vectors
        .iter()
        .map(|options| {
            std::array::from_fn(|o| {
                options[o]
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| (i as u32, f64::from(v)))
                    .collect()
            })
        })
        .collect()
}

/// One fold's training and test questions, with the feature ids cut down to the grams the
/// training questions contain (renumbered 0..dim). A gram seen only in the test fold gets no
/// weight (it still counts in the option's average, as an unknown word does in fastText), so
/// nothing about the held-out fold reaches the fit.
pub(crate) fn restrict(
    features: &[[Features; 4]],
    gold: &[usize],
    train: &[usize],
    test: &[usize],
) -> (Vec<Choice>, Vec<Choice>, usize) {
    let mut local: HashMap<u32, u32> = HashMap::new();
    for &q in train {
        for option in &features[q] {
            for &(id, _) in option {
                let next = local.len() as u32;
                local.entry(id).or_insert(next);
            }
        }
    }
    let choice = |q: usize| Choice {
        options: std::array::from_fn(|o| {
            features[q][o]
                .iter()
                .filter_map(|&(id, v)| local.get(&id).map(|&l| (l, v)))
                .collect()
        }),
        gold: gold[q],
    };
    let train_set = train.iter().map(|&q| choice(q)).collect();
    let test_set = test.iter().map(|&q| choice(q)).collect();
    (train_set, test_set, local.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restrict_drops_grams_unseen_in_training() {
        let q = |ending: &str| Question {
            id: String::new(),
            group: None,
            sent1: String::new(),
            sent2: String::new(),
            endings: [ending, "b", "b", "b"].map(String::from),
            label: Some(0),
            could_be_right: None,
        };
        let questions = [q("a"), q("c")];
        let features = featurise(&questions, View::Ending, Grams::Words);
        let (train, test, dim) = restrict(&features, &[0, 0], &[0], &[1]);
        assert_eq!(dim, 2, "a and b");
        assert_eq!(train[0].options[0], vec![(0, 1.0)]);
        assert!(test[0].options[0].is_empty(), "c is unknown to the fit");
        assert_eq!(test[0].options[1], vec![(1, 1.0)]);
    }
}
