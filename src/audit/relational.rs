//! Features of how each ending relates to its context and to the other options, for the
//! `relational` baseline of `--cv`. A style baseline reads an ending alone; this one reads only
//! relations: which of the ending's words the context already has, which are new, and how much
//! the option shares with the other three. A real ending often repeats the context's people and
//! objects while a generated one drifts, and a negative drawn from another context shares almost
//! nothing with this one: a benchmark where such relations pick the real ending can be answered
//! without understanding it.

use std::collections::HashSet;

use super::dataset::Question;
use super::ngram::{words, Features};

/// What each feature measures, in feature order (for the report and the tests).
pub const FEATURES: [&str; 11] = [
    "share of the ending's words found in sent1",
    "share of the ending's words found in sent2",
    "share of the ending's words found in neither (novelty)",
    "Jaccard similarity of the ending's and sent1's words",
    "Jaccard similarity of the ending's and sent2's words",
    "share of the ending's word pairs found in the context",
    "log(1 + words shared with the context)",
    "mean Jaccard similarity with the other three endings",
    "largest Jaccard similarity with another ending",
    "share of the ending's words in no other ending",
    "ending length over the mean length of the four",
];

/// The lowercased word tokens of `text`, punctuation left out.
fn word_list(text: &str) -> Vec<String> {
    words(text)
        .into_iter()
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .collect()
}

fn share(items: &[String], within: &HashSet<&str>) -> f64 {
    if items.is_empty() {
        return 0.0;
    }
    items.iter().filter(|w| within.contains(w.as_str())).count() as f64 / items.len() as f64
}

fn jaccard(a: &HashSet<&str>, b: &HashSet<&str>) -> f64 {
    let union = a.union(b).count();
    if union == 0 {
        return 0.0;
    }
    a.intersection(b).count() as f64 / union as f64
}

fn set(words: &[String]) -> HashSet<&str> {
    words.iter().map(String::as_str).collect()
}

fn pairs(words: &[String]) -> Vec<String> {
    words
        .windows(2)
        .map(|p| format!("{} {}", p[0], p[1]))
        .collect()
}

/// The relational features of every option of every question (dense, [`FEATURES`] order).
pub fn featurise(questions: &[Question]) -> Vec<[Features; 4]> {
    questions.iter().map(question_features).collect()
}

fn question_features(q: &Question) -> [Features; 4] {
    let (s1, s2) = (word_list(&q.sent1), word_list(&q.sent2));
    let (s1_set, s2_set) = (set(&s1), set(&s2));
    let context: HashSet<&str> = s1_set.union(&s2_set).copied().collect();
    let context_words: Vec<String> = s1.iter().chain(&s2).cloned().collect();
    let context_pairs = pairs(&context_words);
    let context_pairs: HashSet<&str> = context_pairs.iter().map(String::as_str).collect();
    let endings: Vec<Vec<String>> = q.endings.iter().map(|e| word_list(e)).collect();
    let sets: Vec<HashSet<&str>> = endings.iter().map(|e| set(e)).collect();
    let mean_len = endings.iter().map(Vec::len).sum::<usize>() as f64 / 4.0;
    std::array::from_fn(|o| {
        let e = &endings[o];
        let others: Vec<f64> = (0..4)
            .filter(|&j| j != o)
            .map(|j| jaccard(&sets[o], &sets[j]))
            .collect();
        let elsewhere: HashSet<&str> = (0..4)
            .filter(|&j| j != o)
            .flat_map(|j| sets[j].iter().copied())
            .collect();
        let in_context = e.iter().filter(|w| context.contains(w.as_str())).count();
        let novelty = if e.is_empty() {
            0.0
        } else {
            1.0 - in_context as f64 / e.len() as f64
        };
        let unique = if e.is_empty() {
            0.0
        } else {
            1.0 - share(e, &elsewhere)
        };
        let values = [
            share(e, &s1_set),
            share(e, &s2_set),
            novelty,
            jaccard(&sets[o], &s1_set),
            jaccard(&sets[o], &s2_set),
            share(&pairs(e), &context_pairs),
            (1.0 + in_context as f64).ln(),
            others.iter().sum::<f64>() / 3.0,
            others.iter().copied().fold(0.0, f64::max),
            unique,
            if mean_len > 0.0 {
                e.len() as f64 / mean_len
            } else {
                1.0
            },
        ];
        values
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as u32, v))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_measure_overlap_novelty_and_agreement() {
        let q = Question {
            id: "0".into(),
            group: None,
            sent1: "A man throws a red ball.".into(),
            sent2: "The dog".into(),
            endings: [
                "catches the red ball.".into(),
                "swims far away.".into(),
                "swims away quickly.".into(),
                "".into(),
            ],
            label: Some(0),
        };
        let f = question_features(&q);
        let value = |o: usize, i: usize| f[o][i].1;
        assert_eq!(f[0].len(), FEATURES.len());
        // "catches the red ball": red and ball in sent1, the in sent2, catches new.
        assert!((value(0, 0) - 0.5).abs() < 1e-12);
        assert!((value(0, 1) - 0.25).abs() < 1e-12);
        assert!((value(0, 2) - 0.25).abs() < 1e-12);
        // "red ball" is a pair of the context.
        assert!((value(0, 5) - 1.0 / 3.0).abs() < 1e-12);
        // Option 1 is wholly new to the context and shares two of its three words with option 2.
        assert_eq!(value(1, 2), 1.0);
        assert!((value(1, 8) - 0.5).abs() < 1e-12);
        assert!((value(1, 9) - 1.0 / 3.0).abs() < 1e-12);
        // An empty ending has no words to share and no length.
        assert_eq!(value(3, 0), 0.0);
        assert_eq!(value(3, 10), 0.0);
    }
}
