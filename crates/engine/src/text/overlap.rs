//! How an ending's words relate to its context's: which it repeats from `sent1` or `sent2`, which
//! are new, which word pairs it copies. A real ending tends to repeat the context's people and
//! objects while a generated one drifts, so these relations answer a benchmark without reading
//! it. The audit's `relational` baseline measures them; AF's MLP reads the same numbers so that
//! it can pick distractors that relate to their context as the real ending does.

use std::collections::HashSet;

/// What each relation measures, in [`ContextWords::relations`] order.
pub const CONTEXT_RELATIONS: [&str; 7] = [
    "share of the ending's words found in sent1",
    "share of the ending's words found in sent2",
    "share of the ending's words found in neither (novelty)",
    "Jaccard similarity of the ending's and sent1's words",
    "Jaccard similarity of the ending's and sent2's words",
    "share of the ending's word pairs found in the context",
    "log(1 + words shared with the context)",
];

/// The lowercased word tokens of `text`, punctuation left out.
pub fn content_words(text: &str) -> Vec<String> {
    super::tokenize(text)
        .into_iter()
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .map(|w| w.to_lowercase())
        .collect()
}

/// Share of `items` found in `within` (0 for no items).
pub fn share(items: &[String], within: &HashSet<String>) -> f64 {
    if items.is_empty() {
        return 0.0;
    }
    let found = items.iter().filter(|w| within.contains(*w)).count();
    found as f64 / items.len() as f64
}

/// Intersection over union of two word sets (0 when both are empty).
pub fn jaccard(a: &HashSet<String>, b: &HashSet<String>) -> f64 {
    let union = a.union(b).count();
    if union == 0 {
        return 0.0;
    }
    a.intersection(b).count() as f64 / union as f64
}

/// Adjacent word pairs, joined by a space.
fn pairs(words: &[String]) -> Vec<String> {
    words
        .windows(2)
        .map(|p| format!("{} {}", p[0], p[1]))
        .collect()
}

/// A context's words, ready to relate any number of endings to it.
#[derive(Debug, Clone)]
pub struct ContextWords {
    sent1: HashSet<String>,
    sent2: HashSet<String>,
    both: HashSet<String>,
    pairs: HashSet<String>,
}

impl ContextWords {
    pub fn new(sent1: &str, sent2: &str) -> ContextWords {
        let (s1, s2) = (content_words(sent1), content_words(sent2));
        let context: Vec<String> = s1.iter().chain(&s2).cloned().collect();
        let sent1: HashSet<String> = s1.into_iter().collect();
        let sent2: HashSet<String> = s2.into_iter().collect();
        ContextWords {
            both: sent1.union(&sent2).cloned().collect(),
            pairs: pairs(&context).into_iter().collect(),
            sent1,
            sent2,
        }
    }

    /// The [`CONTEXT_RELATIONS`] of an ending, given as its [`content_words`].
    pub fn relations(&self, ending: &[String]) -> [f64; CONTEXT_RELATIONS.len()] {
        let set: HashSet<String> = ending.iter().cloned().collect();
        let in_context = ending.iter().filter(|w| self.both.contains(*w)).count();
        let novelty = if ending.is_empty() {
            0.0
        } else {
            1.0 - in_context as f64 / ending.len() as f64
        };
        [
            share(ending, &self.sent1),
            share(ending, &self.sent2),
            novelty,
            jaccard(&set, &self.sent1),
            jaccard(&set, &self.sent2),
            share(&pairs(ending), &self.pairs),
            (1.0 + in_context as f64).ln(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Shares and similarities stay within [0, 1]; an ending's words are either in the
        /// context or new; an ending made of sent1's words alone, each once, is sent1's twin.
        #[test]
        fn relations_are_shares_and_the_context_and_novelty_add_up(
            sent1 in "[a-d ]{0,24}",
            sent2 in "[c-f ]{0,12}",
            ending in "[a-f ]{0,24}",
        ) {
            let context = ContextWords::new(&sent1, &sent2);
            let words = content_words(&ending);
            let r = context.relations(&words);
            for value in &r[..6] {
                proptest::prop_assert!((0.0..=1.0).contains(value));
            }
            if !words.is_empty() {
                let in_context = words.iter().filter(|w| context.both.contains(*w)).count();
                proptest::prop_assert!((r[2] + in_context as f64 / words.len() as f64 - 1.0).abs() < 1e-12);
            }
            let mut twin: Vec<String> = context.sent1.iter().cloned().collect();
            twin.sort();
            if !twin.is_empty() {
                proptest::prop_assert_eq!(context.relations(&twin)[3], 1.0);
                proptest::prop_assert_eq!(context.relations(&twin)[0], 1.0);
            }
        }
    }

    #[test]
    fn relations_count_repeated_new_and_paired_words() {
        let context = ContextWords::new("A man throws a red ball.", "The dog");
        let r = context.relations(&content_words("catches the red ball."));
        // red and ball are in sent1, the is in sent2, catches is new.
        assert!((r[0] - 0.5).abs() < 1e-12);
        assert!((r[1] - 0.25).abs() < 1e-12);
        assert!((r[2] - 0.25).abs() < 1e-12);
        // {catches, the, red, ball} against {a, man, throws, red, ball}: 2 of 7.
        assert!((r[3] - 2.0 / 7.0).abs() < 1e-12);
        // "red ball" is one of the ending's three pairs found in the context.
        assert!((r[5] - 1.0 / 3.0).abs() < 1e-12);
        assert!((r[6] - 4f64.ln()).abs() < 1e-12);
        let empty = context.relations(&[]);
        assert_eq!(empty[..6], [0.0; 6]);
        assert_eq!(empty[6], 0.0);
    }
}
