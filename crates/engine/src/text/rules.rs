//! What a context and an ending must be to enter a dataset: the rules ingest applies to found
//! endings, and generation applies to sampled ones. Holding both to the same rules matters: an
//! ending that no found ending could be (two tokens long, or starting mid noun phrase) is a style
//! artifact that a classifier learns at once.
//!
//! Token counts are PTB tokens, punctuation included ([`crate::text::tokenize`]).

use super::{split_second_sentence, tokenize};

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
}
