//! Features of how each ending relates to its context and to the other options, for the
//! `relational` baseline of `--cv`. A style baseline reads an ending alone; this one reads only
//! relations: which of the ending's words the context already has, which are new, and how much
//! the option shares with the other three. A real ending often repeats the context's people and
//! objects while a generated one drifts, and a negative drawn from another context shares almost
//! nothing with this one: a benchmark where such relations pick the real ending can be answered
//! without understanding it.

use std::collections::HashSet;

use super::dataset::Question;
use super::ngram::Features;
use afkit_engine::text::overlap::{content_words, jaccard, share, ContextWords};

/// The relational features of every option of every question (dense, in `FEATURES` order).
pub(crate) fn featurise(questions: &[Question]) -> Vec<[Features; 4]> {
    questions.iter().map(question_features).collect()
}

fn question_features(q: &Question) -> [Features; 4] {
    let context = ContextWords::new(&q.sent1, &q.sent2);
    let endings: Vec<Vec<String>> = q.endings.iter().map(|e| content_words(e)).collect();
    let sets: Vec<HashSet<String>> = endings
        .iter()
        .map(|e| e.iter().cloned().collect())
        .collect();
    let mean_len = endings.iter().map(Vec::len).sum::<usize>() as f64 / 4.0;
    std::array::from_fn(|o| {
        let e = &endings[o];
        let others: Vec<f64> = (0..4)
            .filter(|&j| j != o)
            .map(|j| jaccard(&sets[o], &sets[j]))
            .collect();
        let elsewhere: HashSet<String> = (0..4)
            .filter(|&j| j != o)
            .flat_map(|j| sets[j].iter().cloned())
            .collect();
        let unique = if e.is_empty() {
            0.0
        } else {
            1.0 - share(e, &elsewhere)
        };
        let among_options = [
            others.iter().sum::<f64>() / 3.0,
            others.iter().copied().fold(0.0, f64::max),
            unique,
            if mean_len > 0.0 {
                e.len() as f64 / mean_len
            } else {
                1.0
            },
        ];
        context
            .relations(e)
            .into_iter()
            .chain(among_options)
            .enumerate()
            .map(|(i, v)| (i as u32, v))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use afkit_engine::text::overlap::CONTEXT_RELATIONS;

    /// What each feature measures, in feature order: the ending's relations to its context, then
    /// to the other options.
    const FEATURES: [&str; 11] = [
        CONTEXT_RELATIONS[0],
        CONTEXT_RELATIONS[1],
        CONTEXT_RELATIONS[2],
        CONTEXT_RELATIONS[3],
        CONTEXT_RELATIONS[4],
        CONTEXT_RELATIONS[5],
        CONTEXT_RELATIONS[6],
        "mean Jaccard similarity with the other three endings",
        "largest Jaccard similarity with another ending",
        "share of the ending's words in no other ending",
        "ending length over the mean length of the four",
    ];

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
            could_be_right: None,
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
