//! The choice after annotation: which of a verified question's endings judged unlikely it shows.
//!
//! What annotators accept as a distractor (real English that does not fit) is easier to tell from
//! the real ending than what AF chose among all generations: a classifier trained on verified
//! questions learns the difference, although AF's own scores put both as near the found endings.
//! So where a question has more accepted endings than it shows, the three it shows are the ones
//! that look most like real endings to three readers, each ranking the question's candidates:
//!
//! - a character 2–5-gram model and a word 1–2-gram model, each trained to tell the found
//!   endings of the other questions from their accepted endings (naive Bayes over the grams an
//!   ending holds, averaged so that length does not count), cross-fitted by group so that no
//!   question's own endings, nor its video's, teach the model that ranks them;
//! - the generator's mean log-probability of the ending after its context, where it was stored.
//!
//! The candidates are ordered by the sum of their ranks; ties keep the order assembly gave them
//! (`--distractors`). With fewer than [`MIN_QUESTIONS`] questions the gram models are not
//! trained (too few found endings to learn a style from), and the likelihood decides alone.

use std::collections::HashMap;

use afkit_engine::seed::{Key, Seed};
use afkit_engine::text::subwords::{char_gram_hashes, word_gram_hashes};

/// Below this many questions the gram readers are left out.
pub(crate) const MIN_QUESTIONS: usize = 40;

/// Folds of the cross-fitting.
const FOLDS: usize = 5;

/// A verified question as the choice reads it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Question {
    /// The group (video) of its context: a group's questions share one fold.
    pub group: String,
    /// Its found ending.
    pub found: String,
    /// Its endings judged unlikely, in the order assembly gave them: (text, the generator's mean
    /// log-probability of it after the context, where stored).
    pub candidates: Vec<(String, Option<f64>)>,
}

/// For every question, the indices of its candidates in the order they become distractors.
pub(crate) fn order(questions: &[Question], seed: Seed) -> Vec<Vec<usize>> {
    let mut readers: Vec<Vec<Vec<Option<f64>>>> = Vec::new();
    if questions.len() >= MIN_QUESTIONS {
        let groups: Vec<Option<&str>> = questions.iter().map(|q| Some(q.group.as_str())).collect();
        let folds = afkit_engine::folds::assign(&groups, FOLDS, seed.key(Key::ChoiceFolds));
        readers.push(cross_fitted(questions, &folds, Grams::Chars));
        readers.push(cross_fitted(questions, &folds, Grams::Words));
    }
    readers.push(
        questions
            .iter()
            .map(|q| q.candidates.iter().map(|(_, lp)| *lp).collect())
            .collect(),
    );
    (0..questions.len())
        .map(|i| {
            let per_reader: Vec<&[Option<f64>]> = readers.iter().map(|r| r[i].as_slice()).collect();
            by_rank_sum(&per_reader)
        })
        .collect()
}

/// Candidate indices ordered by the sum of their ranks under each reader (highest value first,
/// ties sharing their mean rank, a missing value ranked last); equal sums keep the given order.
fn by_rank_sum(readers: &[&[Option<f64>]]) -> Vec<usize> {
    let n = readers.first().map_or(0, |r| r.len());
    let mut sums = vec![0.0; n];
    for values in readers {
        for (sum, rank) in sums.iter_mut().zip(ranks(values)) {
            *sum += rank;
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|a, b| sums[*a].total_cmp(&sums[*b]).then(a.cmp(b)));
    order
}

/// The rank of each value, 0 for the highest; ties share their mean rank, `None` ranks after
/// every value (the missing ones tied among themselves).
fn ranks(values: &[Option<f64>]) -> Vec<f64> {
    let key = |v: Option<f64>| v.unwrap_or(f64::NEG_INFINITY);
    let mut sorted: Vec<usize> = (0..values.len()).collect();
    sorted.sort_by(|a, b| key(values[*b]).total_cmp(&key(values[*a])));
    let mut out = vec![0.0; values.len()];
    let mut start = 0;
    while start < sorted.len() {
        let value = key(values[sorted[start]]);
        let end = start
            + sorted[start..]
                .iter()
                .take_while(|&&i| key(values[i]) == value)
                .count();
        let mean = (start + end - 1) as f64 / 2.0;
        for &i in &sorted[start..end] {
            out[i] = mean;
        }
        start = end;
    }
    out
}

/// How an ending becomes grams.
#[derive(Debug, Clone, Copy)]
enum Grams {
    /// Character 2–5-grams of each `<word>`, case kept (non-words, spelling, punctuation).
    Chars,
    /// Lower-cased word unigrams and bigrams (what an ending says).
    Words,
}

impl Grams {
    /// The distinct grams of `text`, sorted, so that sums over them are the same bits on every
    /// run (the choice must be reproducible from its seed).
    fn of(self, text: &str) -> Vec<u64> {
        let mut grams = match self {
            Grams::Chars => char_gram_hashes(text),
            Grams::Words => {
                let words: Vec<String> = afkit_engine::text::tokenize(text)
                    .into_iter()
                    .map(|w| w.to_lowercase())
                    .collect();
                word_gram_hashes(&words)
            }
        };
        grams.sort_unstable();
        grams.dedup();
        grams
    }
}

/// Every candidate's score under a gram model trained on the questions of the other folds
/// (`folds[i]`: question i's fold).
fn cross_fitted(questions: &[Question], folds: &[usize], grams: Grams) -> Vec<Vec<Option<f64>>> {
    let found: Vec<Vec<u64>> = questions.iter().map(|q| grams.of(&q.found)).collect();
    let candidates: Vec<Vec<Vec<u64>>> = questions
        .iter()
        .map(|q| q.candidates.iter().map(|(t, _)| grams.of(t)).collect())
        .collect();
    let mut scores: Vec<Vec<Option<f64>>> =
        candidates.iter().map(|c| vec![None; c.len()]).collect();
    for fold in 0..FOLDS {
        let train = |i: &usize| folds[*i] != fold;
        let mut model = NaiveBayes::default();
        for i in (0..questions.len()).filter(train) {
            model.add(&found[i], true);
            for c in &candidates[i] {
                model.add(c, false);
            }
        }
        for i in (0..questions.len()).filter(|i| !train(i)) {
            for (slot, c) in scores[i].iter_mut().zip(&candidates[i]) {
                *slot = Some(model.realness(c));
            }
        }
    }
    scores
}

/// Naive Bayes over the presence of grams: for each gram, how many real and how many generated
/// endings hold it.
#[derive(Debug, Default)]
struct NaiveBayes {
    /// gram → (real endings holding it, generated endings holding it).
    counts: HashMap<u64, (f64, f64)>,
    real: f64,
    generated: f64,
}

impl NaiveBayes {
    fn add(&mut self, grams: &[u64], real: bool) {
        for g in grams {
            let count = self.counts.entry(*g).or_default();
            if real {
                count.0 += 1.0;
            } else {
                count.1 += 1.0;
            }
        }
        if real {
            self.real += 1.0;
        } else {
            self.generated += 1.0;
        }
    }

    /// The mean log-ratio, over the ending's grams, of a gram's share among real endings to its
    /// share among generated ones (add-one smoothed): above 0, the ending reads like a real one.
    fn realness(&self, grams: &[u64]) -> f64 {
        if grams.is_empty() {
            return 0.0;
        }
        let sum: f64 = grams
            .iter()
            .map(|g| {
                let (real, generated) = self.counts.get(g).copied().unwrap_or_default();
                ((real + 1.0) / (self.real + 2.0)).ln()
                    - ((generated + 1.0) / (self.generated + 2.0)).ln()
            })
            .sum();
        sum / grams.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    const WORDS: [&str; 12] = [
        "walks", "runs", "smiles", "jumps", "talks", "waves", "sits", "turns", "looks", "nods",
        "laughs", "stands",
    ];

    /// `n` questions of plain sentences; every generated ending whose index is in `tell` carries
    /// the word "suddenly", which no found ending holds.
    fn questions(n: usize, candidates: usize, tell: &[usize], rng: &mut impl Rng) -> Vec<Question> {
        fn sentence(rng: &mut impl Rng) -> String {
            let a = WORDS[rng.random_range(0..WORDS.len())];
            let b = WORDS[rng.random_range(0..WORDS.len())];
            format!("the man {a} and {b} away.")
        }
        (0..n)
            .map(|i| Question {
                group: format!("video{}", i / 2),
                found: sentence(rng),
                candidates: (0..candidates)
                    .map(|c| {
                        let text = sentence(rng);
                        if tell.contains(&c) {
                            (format!("suddenly {text}"), None)
                        } else {
                            (text, None)
                        }
                    })
                    .collect(),
            })
            .collect()
    }

    #[test]
    fn ranks_share_ties_and_put_missing_values_last() {
        assert_eq!(
            ranks(&[Some(1.0), Some(3.0), None, Some(3.0)]),
            vec![2.0, 0.5, 3.0, 0.5]
        );
        assert_eq!(ranks(&[None, None]), vec![0.5, 0.5]);
    }

    #[test]
    fn equal_rank_sums_keep_the_given_order() {
        let likelihood = [Some(-1.0), Some(-3.0), Some(-1.0), Some(-2.0)];
        assert_eq!(by_rank_sum(&[&likelihood]), vec![0, 2, 3, 1]);
        assert_eq!(by_rank_sum(&[&[None, None, None]]), vec![0, 1, 2]);
    }

    #[test]
    fn a_small_set_is_ordered_by_likelihood_alone() {
        let mut rng = Seed::new(1).rng();
        let mut qs = questions(MIN_QUESTIONS - 1, 5, &[0, 1], &mut rng);
        for q in &mut qs {
            for (c, candidate) in q.candidates.iter_mut().enumerate() {
                candidate.1 = Some(-(c as f64));
            }
        }
        assert!(order(&qs, Seed::new(3))
            .iter()
            .all(|o| *o == vec![0, 1, 2, 3, 4]));
    }

    #[test]
    fn endings_with_a_word_no_found_ending_holds_are_shown_last() {
        let mut rng = Seed::new(2).rng();
        let qs = questions(200, 6, &[0, 2, 4], &mut rng);
        let orders = order(&qs, Seed::new(3));
        let clean_first = orders
            .iter()
            .filter(|o| {
                let mut shown = o[..3].to_vec();
                shown.sort_unstable();
                shown == [1, 3, 5]
            })
            .count();
        assert!(clean_first >= 190, "{clean_first} of 200");
    }

    #[test]
    fn a_questions_own_endings_never_change_its_choice() {
        // Cross-fitting: the models that rank a question's candidates never saw its found
        // ending, so rewriting that ending leaves its order as it was.
        let mut rng = Seed::new(4).rng();
        for trial in 0..20 {
            let mut qs = questions(60, 5, &[1], &mut rng);
            let before = order(&qs, Seed::new(trial));
            let q = rng.random_range(0..qs.len());
            qs[q].found = format!("suddenly {} {}", WORDS[trial as usize % 12], qs[q].found);
            let after = order(&qs, Seed::new(trial));
            assert_eq!(before[q], after[q], "trial {trial}, question {q}");
        }
    }

    #[test]
    fn every_order_is_a_permutation_of_the_candidates() {
        let mut rng = Seed::new(5).rng();
        let mut qs = questions(80, 4, &[3], &mut rng);
        for q in qs.iter_mut().step_by(3) {
            q.candidates.truncate(2);
            q.candidates[0].1 = Some(-1.5);
        }
        for (q, o) in qs.iter().zip(order(&qs, Seed::new(9))) {
            let mut sorted = o.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..q.candidates.len()).collect::<Vec<_>>());
        }
    }
}
