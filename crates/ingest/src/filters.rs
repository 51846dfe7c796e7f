//! From records to examples: split second sentences and apply the dataset's filters
//! ([`afkit_engine::text::rules`]), each drop with its reason. Token counts are PTB tokens (punctuation included) from
//! [`afkit_engine::text::tokenize`].
//!
//! Checked in this order, the first failing one is the recorded reason:
//! - `long_context` (every format, SWAG CSV included): `sent1` + `sent2` have more than
//!   [`MAX_CONTEXT_TOKENS`] tokens (`sent1` alone is checked before the second sentence is split);
//! - `no_verb_phrase`: the second sentence has no main verb phrase with a subject before it;
//! - `short_context`: `sent1` + `sent2` have fewer than 6 tokens;
//! - `short_ending`: the ending has fewer than 5 tokens;
//! - `long_ending`: the ending has more than 25 tokens;
//! - `rare_token` (opt-in): a token of `sent1`, `sent2` or the ending (lowercased) occurs fewer
//!   than N times in the sentences of this call's input (each caption counted once).

use std::collections::HashMap;

use anyhow::Result;
use rayon::prelude::*;

use super::input::{Record, Second};
use afkit_engine::text::rules::{ending_length_problem, MAX_CONTEXT_TOKENS, MIN_CONTEXT_TOKENS};
use afkit_engine::text::{split_second_sentence, tokenize};
use afkit_store::examples::NewExample;

/// What becomes of one record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Outcome {
    Kept(NewExample),
    Dropped(&'static str),
}

/// Lowercased token frequencies over a corpus.
pub(crate) struct TokenCounts(HashMap<String, u32>);

impl TokenCounts {
    pub(crate) fn from_sentences<'a>(sentences: impl Iterator<Item = &'a String>) -> TokenCounts {
        let sentences: Vec<&String> = sentences.collect();
        let counts = sentences
            .par_iter()
            .fold(HashMap::new, |mut m: HashMap<String, u32>, s| {
                for t in tokenize(s) {
                    *m.entry(t.to_lowercase()).or_default() += 1;
                }
                m
            })
            .reduce(HashMap::new, |mut a, b| {
                for (k, v) in b {
                    *a.entry(k).or_default() += v;
                }
                a
            });
        TokenCounts(counts)
    }

    pub(crate) fn count(&self, token: &str) -> u32 {
        self.0.get(&token.to_lowercase()).copied().unwrap_or(0)
    }
}

/// Decides every record's outcome, in parallel; `filtered` is false for inputs taken as they
/// are (SWAG CSV). Stops with `Interrupted` on Ctrl-C.
pub(crate) fn process_all(
    records: &[Record],
    filtered: bool,
    rare: Option<(u32, &TokenCounts)>,
    processed: &mut dyn FnMut(usize),
) -> Result<Vec<Outcome>> {
    let mut outcomes = Vec::with_capacity(records.len());
    for chunk in records.chunks(4096) {
        afkit_engine::interrupt::check()?;
        outcomes.par_extend(chunk.par_iter().map(|r| process(r, filtered, rare)));
        processed(chunk.len());
    }
    Ok(outcomes)
}

fn process(record: &Record, filtered: bool, rare: Option<(u32, &TokenCounts)>) -> Outcome {
    // Checked before the split, so that a huge first sentence costs no tagging.
    let sent1_tokens = tokenize(&record.sent1);
    if sent1_tokens.len() > MAX_CONTEXT_TOKENS {
        return Outcome::Dropped("long_context");
    }
    let (sent2, ending) = match &record.second {
        Second::Split { sent2, ending } => (sent2.clone(), ending.clone()),
        Second::Unsplit(sentence) => match split_second_sentence(sentence) {
            Some(parts) => parts,
            None => return Outcome::Dropped("no_verb_phrase"),
        },
    };
    let sent2_tokens = tokenize(&sent2);
    if sent1_tokens.len() + sent2_tokens.len() > MAX_CONTEXT_TOKENS {
        return Outcome::Dropped("long_context");
    }
    if filtered {
        let ending_tokens = tokenize(&ending);
        if sent1_tokens.len() + sent2_tokens.len() < MIN_CONTEXT_TOKENS {
            return Outcome::Dropped("short_context");
        }
        if let Some(problem) = ending_length_problem(ending_tokens.len()) {
            return Outcome::Dropped(problem);
        }
        if let Some((min, counts)) = rare {
            let mut all = sent1_tokens
                .iter()
                .chain(&sent2_tokens)
                .chain(&ending_tokens);
            if all.any(|t| counts.count(t) < min) {
                return Outcome::Dropped("rare_token");
            }
        }
    }
    Outcome::Kept(NewExample {
        ext_id: record.ext_id.clone(),
        group: record.group.clone(),
        sent1: record.sent1.clone(),
        sent2,
        ending,
        gold_source: record.gold_source.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(sent1: &str, second: &str) -> Record {
        Record {
            ext_id: "v#0".into(),
            group: "v".into(),
            sent1: sent1.into(),
            second: Second::Unsplit(second.into()),
            gold_source: None,
            origin: "test".into(),
        }
    }

    fn outcome(sent1: &str, second: &str) -> Outcome {
        process(&record(sent1, second), true, None)
    }

    #[test]
    fn filters_by_reason() {
        let sent1 = "A man is standing in a kitchen.";
        match outcome(sent1, "He chops an onion on a board.") {
            Outcome::Kept(ex) => {
                assert_eq!(
                    (ex.sent2.as_str(), ex.ending.as_str()),
                    ("He", "chops an onion on a board.")
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            outcome(sent1, "A close up of an onion."),
            Outcome::Dropped("no_verb_phrase")
        );
        assert_eq!(
            outcome("He cooks.", "He chops an onion on a board."),
            Outcome::Dropped("short_context")
        );
        assert_eq!(
            outcome(sent1, "He chops it."),
            Outcome::Dropped("short_ending")
        );
        let long = format!("He chops {}.", ["an onion"; 12].join(" and "));
        assert_eq!(outcome(sent1, &long), Outcome::Dropped("long_ending"));
    }

    #[test]
    fn rare_tokens_are_counted_over_the_corpus() {
        let sentences: Vec<String> = [
            "A man is standing in a kitchen.",
            "He chops an onion on a board.",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let counts = TokenCounts::from_sentences(sentences.iter());
        assert_eq!(counts.count("A"), 3);
        let r = record(&sentences[0], &sentences[1]);
        assert!(matches!(
            process(&r, true, Some((1, &counts))),
            Outcome::Kept(_)
        ));
        assert_eq!(
            process(&r, true, Some((2, &counts))),
            Outcome::Dropped("rare_token")
        );
    }

    #[test]
    fn given_splits_are_taken_as_they_are_when_unfiltered() {
        let mut r = record("Hi.", "");
        r.second = Second::Split {
            sent2: "He".into(),
            ending: "runs.".into(),
        };
        assert!(matches!(process(&r, false, None), Outcome::Kept(_)));
        assert_eq!(process(&r, true, None), Outcome::Dropped("short_context"));
    }
}
