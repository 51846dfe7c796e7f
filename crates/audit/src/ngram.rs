//! Bag-of-n-grams choice classifiers (SWAG Table 3's fastText columns): every option's text is a
//! bag of its word unigrams and bigrams, averaged as fastText does (each n-gram weighs 1 / the
//! number of n-grams in the text), scored by a linear model; the four scores of a question go
//! through a softmax and the model is trained with cross-entropy on the gold option.
//!
//! Fitting: L2-regularised, full-batch L-BFGS (convex objective, no randomness in the optimiser),
//! with the regularisation strength picked on a seeded 80/20 split of the training questions and
//! the model refitted on all of them. The same data and seed give the same accuracy.

use std::collections::HashMap;

use rand::seq::SliceRandom;

use afkit_engine::lbfgs::{self, Objective};
use afkit_engine::seed::Seed;

/// Lower-cased word tokens (afkit's PTB-style tokeniser: punctuation split off, "n't" and "'s"
/// separate), so "Running" and "running" count as one n-gram.
pub(crate) fn words(text: &str) -> Vec<String> {
    afkit_engine::text::tokenize(text)
        .into_iter()
        .map(|t| t.to_lowercase())
        .collect()
}

fn ngrams(text: &str) -> Vec<String> {
    let w = words(text);
    let mut out = w.clone();
    out.extend(w.windows(2).map(|p| format!("{} {}", p[0], p[1])));
    out
}

/// A sparse feature vector.
pub(crate) type Features = Vec<(u32, f64)>;

/// Maps n-grams seen in training to feature ids.
pub(crate) struct Vocabulary {
    ids: HashMap<String, u32>,
}

impl Vocabulary {
    pub(crate) fn fit<'a>(texts: impl Iterator<Item = &'a str>) -> Vocabulary {
        let mut ids = HashMap::new();
        for text in texts {
            for g in ngrams(text) {
                let next = ids.len() as u32;
                ids.entry(g).or_insert(next);
            }
        }
        Vocabulary { ids }
    }

    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Averaged bag of known n-grams; n-grams unseen in training are dropped but still count in
    /// the average (as fastText's out-of-vocabulary words do).
    pub(crate) fn features(&self, text: &str) -> Features {
        let grams = ngrams(text);
        if grams.is_empty() {
            return Vec::new();
        }
        let weight = 1.0 / grams.len() as f64;
        let mut acc: HashMap<u32, f64> = HashMap::new();
        for g in grams {
            if let Some(&id) = self.ids.get(&g) {
                *acc.entry(id).or_default() += weight;
            }
        }
        let mut v: Features = acc.into_iter().collect();
        v.sort_by_key(|x| x.0);
        v
    }
}

/// A question as four feature vectors and the gold's position.
pub(crate) struct Choice {
    pub options: [Features; 4],
    pub gold: usize,
}

fn dot(w: &[f64], x: &Features) -> f64 {
    x.iter().map(|&(i, v)| w[i as usize] * v).sum()
}

/// Mean cross-entropy + λ/2 ‖w‖² over the choices, as a function of the weights.
struct Loss<'a> {
    data: &'a [&'a Choice],
    dim: usize,
    lambda: f64,
}

impl Objective for Loss<'_> {
    fn dim(&self) -> usize {
        self.dim
    }

    /// The loss, its gradient, and the gradient's Euclidean norm (the stopping measure).
    fn value_grad(&self, w: &[f64], grad: &mut [f64]) -> (f64, f64) {
        grad.iter_mut()
            .zip(w)
            .for_each(|(g, wi)| *g = self.lambda * wi);
        let mut loss = 0.5 * self.lambda * w.iter().map(|x| x * x).sum::<f64>();
        let n = self.data.len().max(1) as f64;
        for q in self.data {
            let s: [f64; 4] = std::array::from_fn(|o| dot(w, &q.options[o]));
            let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|v| (v - max).exp()).sum();
            loss += (max + z.ln() - s[q.gold]) / n;
            for (o, option) in q.options.iter().enumerate() {
                let p = (s[o] - max).exp() / z - if o == q.gold { 1.0 } else { 0.0 };
                for &(i, v) in option {
                    grad[i as usize] += p * v / n;
                }
            }
        }
        (loss, grad.iter().map(|g| g * g).sum::<f64>().sqrt())
    }
}

/// Minimises the regularised loss (the shared L-BFGS; the loss is convex, so the result does
/// not depend on the path).
fn fit(data: &[&Choice], dim: usize, lambda: f64) -> Vec<f64> {
    let loss = Loss { data, dim, lambda };
    let opts = lbfgs::Options {
        tol: 1e-7,
        ftol: 1e-10,
        max_iter: 300,
    };
    lbfgs::minimize(&loss, &opts).x
}

/// Accuracy with ties split evenly (a tie among m options that includes the gold earns 1/m),
/// the expected accuracy of breaking ties at random.
pub(crate) fn tie_aware_accuracy(scores: &[[f64; 4]], gold: &[usize]) -> f64 {
    if scores.is_empty() {
        return 0.0;
    }
    let credit: f64 = scores
        .iter()
        .zip(gold)
        .map(|(s, &g)| {
            let best = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let tied = s.iter().filter(|&&v| v == best).count();
            if s[g] == best {
                1.0 / tied as f64
            } else {
                0.0
            }
        })
        .sum();
    credit / scores.len() as f64
}

fn accuracy(w: &[f64], data: &[&Choice]) -> f64 {
    let scores: Vec<[f64; 4]> = data
        .iter()
        .map(|q| std::array::from_fn(|o| dot(w, &q.options[o])))
        .collect();
    let gold: Vec<usize> = data.iter().map(|q| q.gold).collect();
    tie_aware_accuracy(&scores, &gold)
}

/// The regularisation strengths tried (per-question mean loss scale).
const LAMBDAS: [f64; 4] = [1e-2, 1e-3, 1e-4, 1e-5];

/// Trains on `train` (λ chosen on a seeded 80/20 split of it) and returns the accuracy on `test`
/// and the chosen λ.
pub(crate) fn train_and_evaluate(
    train: &[Choice],
    test: &[Choice],
    dim: usize,
    seed: Seed,
) -> (f64, f64) {
    let mut order: Vec<usize> = (0..train.len()).collect();
    order.shuffle(&mut seed.rng());
    let cut = train.len() * 4 / 5;
    let fit_part: Vec<&Choice> = order[..cut].iter().map(|&i| &train[i]).collect();
    let held_out: Vec<&Choice> = order[cut..].iter().map(|&i| &train[i]).collect();
    let mut best = (f64::NEG_INFINITY, LAMBDAS[0]);
    if !held_out.is_empty() {
        for lambda in LAMBDAS {
            let acc = accuracy(&fit(&fit_part, dim, lambda), &held_out);
            // Strictly better only: ties keep the stronger regularisation.
            if acc > best.0 {
                best = (acc, lambda);
            }
        }
    }
    (fit_and_evaluate(train, test, dim, best.1), best.1)
}

/// Trains on `train` with regularisation `lambda` and returns the accuracy on `test`.
pub(crate) fn fit_and_evaluate(train: &[Choice], test: &[Choice], dim: usize, lambda: f64) -> f64 {
    let all: Vec<&Choice> = train.iter().collect();
    let w = fit(&all, dim, lambda);
    let test_refs: Vec<&Choice> = test.iter().collect();
    accuracy(&w, &test_refs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_punctuation_and_lowercase() {
        assert_eq!(
            words("He doesn't stop, OK?"),
            vec!["he", "does", "n't", "stop", ",", "ok", "?"]
        );
    }

    #[test]
    fn features_average_over_ngrams() {
        let vocab = Vocabulary::fit(["a b"].into_iter());
        assert_eq!(vocab.len(), 3);
        // "a b c": 3 unigrams + 2 bigrams; known: a, b, "a b".
        let f = vocab.features("a b c");
        assert_eq!(f.len(), 3);
        assert!(f.iter().all(|&(_, v)| (v - 0.2).abs() < 1e-12));
    }

    #[test]
    fn ties_earn_partial_credit() {
        assert_eq!(tie_aware_accuracy(&[[1.0, 1.0, 0.0, 0.0]], &[1]), 0.5);
        assert_eq!(tie_aware_accuracy(&[[0.0, 2.0, 0.0, 0.0]], &[0]), 0.0);
    }

    #[test]
    fn lbfgs_learns_a_separable_tell() {
        let vocab = Vocabulary::fit(["tell x", "y", "z", "w"].into_iter());
        let make = |gold: usize| Choice {
            options: std::array::from_fn(|o| {
                vocab.features(if o == gold { "tell x" } else { "y z" })
            }),
            gold,
        };
        let train: Vec<Choice> = (0..40).map(|i| make(i % 4)).collect();
        let test: Vec<Choice> = (0..8).map(|i| make((i + 1) % 4)).collect();
        let (acc, _) = train_and_evaluate(&train, &test, vocab.len(), Seed::new(0));
        assert_eq!(acc, 1.0);
    }
}
