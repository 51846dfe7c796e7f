//! What a context and an ending must be to enter a dataset: the rules ingest applies to found
//! endings, and generation applies to sampled ones. Holding both to the same rules matters: an
//! ending that no found ending could be (two tokens long, or starting mid noun phrase) is a style
//! artifact that a classifier learns at once.
//!
//! Token counts are PTB tokens, punctuation included ([`crate::text::tokenize`]).

use super::split::could_start_verb_phrase;
use super::{split_second_sentence, tokenize, Tagger};

pub const MIN_CONTEXT_TOKENS: usize = 6;
pub(crate) const MIN_ENDING_TOKENS: usize = 5;
pub const MAX_ENDING_TOKENS: usize = 25;
/// Longer contexts are no captions (a pasted document, a broken export): they would only slow
/// generation down, or not fit the model at all. Every context of ActivityNet Captions' train
/// split is far below it: its longest sentence pair, ending included, is 136 tokens.
pub const MAX_CONTEXT_TOKENS: usize = 256;

/// Why an ending's length disqualifies it (`short_ending`, `long_ending`), if it does.
pub fn ending_length_problem(ending_tokens: usize) -> Option<&'static str> {
    if ending_tokens < MIN_ENDING_TOKENS {
        Some("short_ending")
    } else if ending_tokens > MAX_ENDING_TOKENS {
        Some("long_ending")
    } else {
        None
    }
}

/// Why a generated `ending` could not have been a found ending after `sent2`, if it could not:
/// the splitter must cut `sent2 + ending` exactly before it (`not_a_verb_phrase`: the ending
/// goes on with the subject, "of the man throws ...", or splits elsewhere), and its length must
/// pass [`ending_length_problem`]. With no `sent2` only the length is checked.
pub fn generated_ending_problem(sent2: &str, ending: &str) -> Option<&'static str> {
    if let Some(problem) = ending_length_problem(tokenize(ending).len()) {
        return Some(problem);
    }
    if sent2.is_empty() {
        return None;
    }
    match split_second_sentence(&format!("{sent2} {ending}")) {
        Some((s2, e))
            if s2 == sent2.split_whitespace().collect::<Vec<_>>().join(" ") && e == ending =>
        {
            None
        }
        _ => Some("not_a_verb_phrase"),
    }
}

/// Why every ending that begins with `whole_words` (the first words of an ending being sampled,
/// each of them finished: more text follows the last) fails [`generated_ending_problem`] after
/// `sent2`, whatever comes next, if that is already certain; `None` while it is not. Certain are:
/// more tokens than an ending may have (`long_ending`; words are tokenised one by one, so later
/// words only add tokens), and a first word that can never start the verb phrase the splitter
/// cuts before (`not_a_verb_phrase`), judged once the two tokens after it are there, since the
/// tagger reads two tokens to either side. Generation stops such a draw at once instead of
/// sampling the rest of a sentence it would refuse: the pool keeps exactly what it would have.
pub fn generated_ending_refused_early(sent2: &str, whole_words: &str) -> Option<&'static str> {
    let ending = tokenize(whole_words);
    if ending.len() > MAX_ENDING_TOKENS {
        return Some("long_ending");
    }
    let last_word = whole_words
        .split_whitespace()
        .next_back()
        .map_or(0, |w| tokenize(w).len());
    // The first token's tag is settled from its third token on; judged once, when that arrives.
    let newly_settled = ending.len() >= 3 && ending.len() - last_word < 3;
    if sent2.is_empty() || !newly_settled {
        return None;
    }
    let mut words = tokenize(sent2);
    let first = words.len();
    words.extend(ending);
    let tags = Tagger::shipped().tag(&words);
    (!could_start_verb_phrase(&words[first], tags[first])).then_some("not_a_verb_phrase")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_endings_meet_the_found_endings_rules() {
        assert_eq!(
            generated_ending_problem("The boy", "throws the ball back to his father."),
            None
        );
        assert_eq!(
            generated_ending_problem("The boy", "points."),
            Some("short_ending")
        );
        let long = format!("throws {}.", ["the ball"; 13].join(" and "));
        assert_eq!(
            generated_ending_problem("The boy", &long),
            Some("long_ending")
        );
        assert_eq!(
            generated_ending_problem("A person", "on the boat holds a float in the air."),
            Some("not_a_verb_phrase")
        );
        assert_eq!(
            generated_ending_problem("", "throws the ball back to him."),
            None
        );
    }

    /// Every whole-word beginning of `ending` that generation would judge while sampling it
    /// (each followed by more text), and the early verdict on each.
    fn early_verdicts(sent2: &str, ending: &str) -> Vec<Option<&'static str>> {
        let words: Vec<&str> = ending.split_whitespace().collect();
        (1..words.len())
            .map(|k| generated_ending_refused_early(sent2, &words[..k].join(" ")))
            .collect()
    }

    #[test]
    fn a_draw_is_refused_early_only_when_its_ending_is_certain_to_fail() {
        // "on" cannot start the verb phrase; judged once "on the boat" is there, not before.
        assert_eq!(
            early_verdicts("A person", "on the boat holds a float."),
            [None, None, Some("not_a_verb_phrase"), None, None]
        );
        assert!(
            early_verdicts("The boy", "throws the ball back to his father.")
                .iter()
                .all(Option::is_none)
        );
        // A noun may be a verb the tagger mistook ("the girl dances"): left to the whole check.
        assert!(early_verdicts("The girl", "dances across the stage.")
            .iter()
            .all(Option::is_none));
        let long = format!("throws {} again.", ["the ball"; 13].join(" and "));
        assert_eq!(
            early_verdicts("The boy", &long).last(),
            Some(&Some("long_ending"))
        );
        assert!(early_verdicts("", "of the man throws it.")
            .iter()
            .all(Option::is_none));
    }

    #[test]
    fn no_found_ending_of_the_sample_is_refused_early() {
        let sample = include_str!("../../../../data/sample/captions.json");
        let videos: serde_json::Value = serde_json::from_str(sample).unwrap();
        let mut checked = 0;
        for video in videos.as_object().unwrap().values() {
            for sentence in video["sentences"].as_array().unwrap() {
                let Some((sent2, ending)) = split_second_sentence(sentence.as_str().unwrap())
                else {
                    continue;
                };
                if generated_ending_problem(&sent2, &ending).is_none() {
                    checked += 1;
                    assert!(
                        early_verdicts(&sent2, &ending).iter().all(Option::is_none),
                        "{sent2} | {ending}"
                    );
                }
            }
        }
        assert!(
            checked >= 100,
            "only {checked} sample endings pass the rules"
        );
    }

    proptest::proptest! {
        /// The early verdict is never wrong: whatever follows a beginning refused early, the
        /// whole ending fails the rules.
        #[test]
        fn an_ending_refused_early_fails_the_whole_check(
            sent2 in proptest::sample::select(vec!["The man", "A girl in a red coat", "They", "Then, the woman", "Two dogs"]),
            words in proptest::collection::vec(proptest::sample::select(vec![
                "throws", "walks", "is", "dances", "then", "on", "of", "the", "a", "ball",
                "man", "slowly", "and", "while", "his", "red", ",", "runs", "back", "lands",
                "holding", "to", "it", "plays", "guitar", "outside", "3", "who", "seen",
            ]), 1..30),
        ) {
            let ending = format!("{}.", words.join(" "));
            if early_verdicts(sent2, &ending).iter().any(Option::is_some) {
                proptest::prop_assert!(generated_ending_problem(sent2, &ending).is_some());
            }
        }
    }
}
