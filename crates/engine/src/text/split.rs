//! Splits a second sentence into `sent2` (everything before its main verb phrase) and the ending
//! (the verb phrase), as SWAG did with a constituency parser, here from UPOS tags.
//!
//! The rule, on the tagged tokens:
//! 1. Prefix adverbials and subordinate clauses closed by a comma stay in `sent2`: while the
//!    sentence (after any leading conjunction) starts with a subordinator (`After`, `When`,
//!    `While`, ...), an adverb, a preposition, `to` or a participle, and a comma follows with a
//!    verb after it, everything up to that comma is prefix. A prefix that does not start with a
//!    subordinator must itself be verbless ("Then the man walks to the bar, picks ..." is not a
//!    prefix).
//! 2. After the prefix, the main verb phrase starts at the first auxiliary or verb, so
//!    auxiliaries belong to the ending ("is seen riding ...") and pre-verbal adverbs stay with the
//!    subject ("The man then"), as in SWAG's parses. Three kinds of verbs inside the subject are
//!    stepped over: a participle right after a noun when a finite verb follows ("A man wearing a
//!    hat walks", "A man dressed in black dances"), a participle between a determiner or an
//!    adjective and its noun ("The finished furniture is shown"), and the verb group of a
//!    relative clause ("The man who is talking waves").
//! 3. With no verb, or with no word before it (after any prefix) that can head a subject — a
//!    noun, a name, a pronoun, a number or a determiner that stands alone — (an imperative or a
//!    fragment: "Then continues to brush", or a tagger's slip: "The" / "left man holds ..."),
//!    there is no `sent2`/verb-phrase split and the result is `None`.
//!
//! The two parts are cut from the original text at the verb's token boundary, so they read
//! naturally ("The man" / "dances around the room.").

use super::tagger::{Tagger, Upos};
use super::tokenize::token_spans;

/// Splits `sentence` into `(sent2, ending)` before its main verb phrase, with the shipped tagger.
pub fn split_second_sentence(sentence: &str) -> Option<(String, String)> {
    split_with(Tagger::shipped(), sentence)
}

/// [`split_second_sentence`] with a given tagger.
pub fn split_with(tagger: &Tagger, sentence: &str) -> Option<(String, String)> {
    let text = sentence.split_whitespace().collect::<Vec<_>>().join(" ");
    let tokens = token_spans(&text);
    let words: Vec<&str> = tokens.iter().map(|t| t.text).collect();
    let tags = tagger.tag(&words);
    let verb = main_verb_index(&words, &tags)?;
    let sent2 = text[..tokens[verb].start].trim_end();
    let ending = text[tokens[verb].start..].trim();
    Some((sent2.to_string(), ending.to_string()))
}

/// Index of the token where the main verb phrase starts, if there is one with a subject before it.
pub(super) fn main_verb_index(words: &[&str], tags: &[Upos]) -> Option<usize> {
    let lower: Vec<String> = words.iter().map(|w| w.to_lowercase()).collect();
    let s = Sentence { lower, tags };
    let mut start = 0;
    while let Some(comma) = s.prefix_end(start) {
        start = comma + 1;
    }
    let verb = s.find_verb(start, words.len())?;
    let has_subject = (start..verb).any(|i| s.can_head_subject(i));
    has_subject.then_some(verb)
}

const SUBORDINATORS: &[&str] = &[
    "after", "before", "when", "whenever", "while", "whilst", "as", "once", "if", "since", "until",
    "till", "because", "although", "though", "whereas", "upon",
];

const SUBJECT_PRONOUNS: &[&str] = &[
    "i",
    "you",
    "he",
    "she",
    "it",
    "we",
    "they",
    "someone",
    "somebody",
    "everyone",
    "everybody",
    "nobody",
    "one",
];

/// Words ending in -s that are never present-tense verbs.
const NOT_VERBS: &[&str] = &[
    "always",
    "sometimes",
    "perhaps",
    "afterwards",
    "towards",
    "backwards",
    "forwards",
    "various",
    "this",
    "thus",
    "plus",
    "unless",
    "whereas",
    "besides",
    "outdoors",
    "indoors",
    "upstairs",
    "downstairs",
];

/// Determiners that can be a subject on their own.
const STANDALONE_DETERMINERS: &[&str] = &[
    "another", "this", "that", "these", "those", "all", "both", "each", "some", "many", "few",
    "several", "most", "either", "neither", "others", "none",
];

const PLURAL_NOUNS: &[&str] = &[
    "men", "women", "people", "children", "feet", "teeth", "mice",
];

struct Sentence<'a> {
    lower: Vec<String>,
    tags: &'a [Upos],
}

impl Sentence<'_> {
    /// Whether token `i` can head a subject: a noun, a name, a pronoun or a number (or a token the
    /// tagger cannot place, most often a misspelt noun), or a determiner that stands alone
    /// ("Another jumps"). An article or an adverb alone is no subject: "The" / "left man holds
    /// ..." is a tagger's slip, "Then" / "continues ..." a fragment.
    fn can_head_subject(&self, i: usize) -> bool {
        matches!(
            self.tags[i],
            Upos::Noun | Upos::Propn | Upos::Pron | Upos::Num | Upos::X
        ) || STANDALONE_DETERMINERS.contains(&self.lower[i].as_str())
    }

    /// If a prefix adverbial or subordinate clause starts at `start`, the index of its comma.
    fn prefix_end(&self, start: usize) -> Option<usize> {
        let n = self.tags.len();
        let mut first = start;
        while first < n && self.tags[first] == Upos::Cconj {
            first += 1;
        }
        if first >= n {
            return None;
        }
        let subordinate =
            SUBORDINATORS.contains(&self.lower[first].as_str()) || self.tags[first] == Upos::Sconj;
        let adverbial = matches!(self.tags[first], Upos::Adv | Upos::Adp | Upos::Part)
            || (self.tags[first] == Upos::Verb && is_participle(&self.lower[first]));
        if !subordinate && !adverbial {
            return None;
        }
        let comma = (first + 1..n).find(|&i| self.lower[i] == ",")?;
        self.find_verb(comma + 1, n)?;
        if !subordinate && self.find_verb(first + 1, comma).is_some() {
            return None;
        }
        Some(comma)
    }

    /// The first verb or auxiliary in `from..to` that heads the clause (see the module docs).
    fn find_verb(&self, from: usize, to: usize) -> Option<usize> {
        let mut i = from;
        while i < to {
            match self.tags[i] {
                Upos::Pron if self.starts_relative_clause(i, from) => {
                    i = self.skip_verb_group(i + 1, to);
                    continue;
                }
                Upos::Aux => return Some(i),
                Upos::Verb
                    if !self.is_reduced_relative(i, from, to)
                        && !self.is_attributive_participle(i, to) =>
                {
                    return Some(i)
                }
                Upos::Noun | Upos::Propn | Upos::Adp | Upos::Adv | Upos::Adj | Upos::X
                    if self.is_mistagged_verb(i, from) =>
                {
                    return Some(i)
                }
                _ => {}
            }
            i += 1;
        }
        None
    }

    /// A participle between a determiner or an adjective and the noun it describes ("The
    /// finished furniture is shown", "A smiling man waves"): an adjective of the subject.
    fn is_attributive_participle(&self, i: usize, to: usize) -> bool {
        is_participle(&self.lower[i])
            && i > 0
            && matches!(self.tags[i - 1], Upos::Det | Upos::Adj)
            && i + 1 < to
            && matches!(self.tags[i + 1], Upos::Noun | Upos::Propn | Upos::Adj)
    }

    /// "who"/"which"/"that" right after a noun: a relative clause inside the subject.
    fn starts_relative_clause(&self, i: usize, from: usize) -> bool {
        i > from
            && matches!(self.lower[i].as_str(), "who" | "which" | "that")
            && matches!(self.tags[i - 1], Upos::Noun | Upos::Propn)
    }

    /// Index after the verb group (auxiliaries, adverbs, verbs) that starts at or after `i`.
    fn skip_verb_group(&self, mut i: usize, to: usize) -> usize {
        while i < to && !matches!(self.tags[i], Upos::Aux | Upos::Verb) {
            i += 1;
        }
        while i < to
            && matches!(
                self.tags[i],
                Upos::Aux | Upos::Verb | Upos::Adv | Upos::Part
            )
        {
            i += 1;
        }
        i
    }

    /// A participle modifying the noun before it ("a man wearing a hat", "a man dressed in
    /// black") when a finite verb follows for the main clause.
    fn is_reduced_relative(&self, i: usize, from: usize, to: usize) -> bool {
        let word = self.lower[i].as_str();
        if i == from {
            return false;
        }
        let after_noun =
            |j: usize| j > from && matches!(self.tags[j - 1], Upos::Noun | Upos::Propn);
        // "a man wearing a hat" or, set off by commas, "the man, wearing a hat,".
        if !(after_noun(i) || (self.lower[i - 1] == "," && after_noun(i - 1))) {
            return false;
        }
        let ing = word.ends_with("ing");
        let past = word.ends_with("ed");
        if !ing && !past {
            return false;
        }
        (i + 1..to).any(|j| match self.tags[j] {
            Upos::Aux => true,
            Upos::Verb => {
                let w = self.lower[j].as_str();
                !(w.ends_with("ing") || past && w.ends_with("ed"))
            }
            Upos::Noun | Upos::Propn => self.is_mistagged_verb(j, from),
            _ => false,
        })
    }

    /// A present-tense verb the tagger took for a noun. The tagger learnt from web and news
    /// text, where "dances", "grunts" or "walk" after a subject are rare; in captions the
    /// subject-verb order gives them away: a noun right after a subject pronoun ("he
    /// dismounts"), an -s form right after a noun ("the girl dances"), or a base form right after
    /// a plural or coordinated subject ("two women walk", "the man and the woman dance"), each
    /// followed by a word that cannot continue a noun compound. (A base form followed by a noun,
    /// "they play catch", stays out of reach.)
    fn is_mistagged_verb(&self, i: usize, from: usize) -> bool {
        if i == from || i + 1 >= self.tags.len() {
            return false;
        }
        let next_ok = matches!(
            self.tags[i + 1],
            Upos::Det
                | Upos::Adp
                | Upos::Adv
                | Upos::Pron
                | Upos::Cconj
                | Upos::Punct
                | Upos::Part
                | Upos::Verb
                | Upos::Num
                | Upos::Sconj
        );
        if !next_ok {
            return false;
        }
        let word = self.lower[i].as_str();
        let prev = self.lower[i - 1].as_str();
        let s_form = is_s_form(word);
        if !matches!(self.tags[i], Upos::Noun | Upos::Propn) {
            // Unknown words get odd tags ("a butterfly/ADV lands/NOUN", "the grandfather
            // unhooks/ADP"): only an -s form right after a determiner + one word qualifies.
            let det_word = i >= from + 2
                && self.tags[i - 2] == Upos::Det
                && !matches!(self.tags[i - 1], Upos::Adj | Upos::Num);
            return s_form && (matches!(self.tags[i - 1], Upos::Noun | Upos::Propn) || det_word);
        }
        if self.tags[i - 1] == Upos::Pron {
            return SUBJECT_PRONOUNS.contains(&prev);
        }
        if s_form
            && i >= from + 2
            && self.tags[i - 2] == Upos::Det
            && !matches!(self.tags[i - 1], Upos::Adj | Upos::Num)
        {
            return true;
        }
        // "the man in red stands": a colour after "in" ends the subject like a noun.
        let in_colour = self.tags[i - 1] == Upos::Adj && i >= from + 2 && self.lower[i - 2] == "in";
        if !matches!(self.tags[i - 1], Upos::Noun | Upos::Propn) && !in_colour {
            return false;
        }
        if s_form {
            return true;
        }
        (prev.ends_with('s') && !prev.ends_with("ss"))
            || PLURAL_NOUNS.contains(&prev)
            || (from..i).any(|j| self.lower[j] == "and")
    }
}

/// Whether the main verb phrase could start at `word`, tagged `tag`, whatever words are around
/// it: a verb, an auxiliary, a noun or a name (which may be a verb the tagger mistook), or an -s
/// form with another tag a verb is mistaken for — the tokens [`Sentence::find_verb`] can stop
/// at. Anything else the splitter never cuts before.
pub(super) fn could_start_verb_phrase(word: &str, tag: Upos) -> bool {
    match tag {
        Upos::Aux | Upos::Verb | Upos::Noun | Upos::Propn => true,
        Upos::Adp | Upos::Adv | Upos::Adj | Upos::X => is_s_form(&word.to_lowercase()),
        _ => false,
    }
}

/// A lowercase word that may be a present-tense -s verb ("dances", not "dress" or "always").
fn is_s_form(word: &str) -> bool {
    word.len() > 3 && word.ends_with('s') && !word.ends_with("ss") && !NOT_VERBS.contains(&word)
}

fn is_participle(word: &str) -> bool {
    word.ends_with("ing") || word.ends_with("ed") || word.ends_with("en")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-checked second sentences, most from ActivityNet Captions style, with the split a
    /// constituency parse gives (SWAG §2): subject NP (with prefix adverbials) | verb phrase.
    const CASES: &[(&str, &str, &str)] = &[
        // a participle that describes the subject's noun
        (
            "The finished furniture is shown.",
            "The finished furniture",
            "is shown.",
        ),
        (
            "A smiling man waves to the camera.",
            "A smiling man",
            "waves to the camera.",
        ),
        // plain subjects
        (
            "The man dances around the room.",
            "The man",
            "dances around the room.",
        ),
        (
            "A young woman is seen standing in a room.",
            "A young woman",
            "is seen standing in a room.",
        ),
        (
            "The girl dances around the room while the camera captures her movements.",
            "The girl",
            "dances around the room while the camera captures her movements.",
        ),
        (
            "Two women walk toward the door.",
            "Two women",
            "walk toward the door.",
        ),
        (
            "The man in red stands up and runs backwards.",
            "The man in red",
            "stands up and runs backwards.",
        ),
        (
            "One of the men walks around checking the boxes.",
            "One of the men",
            "walks around checking the boxes.",
        ),
        (
            "Several shots are then shown of people curling.",
            "Several shots",
            "are then shown of people curling.",
        ),
        (
            "Nails are hammered into the fence.",
            "Nails",
            "are hammered into the fence.",
        ),
        (
            "The camera then cuts to a news panel.",
            "The camera then",
            "cuts to a news panel.",
        ),
        (
            "There is a man sitting on a bench.",
            "There",
            "is a man sitting on a bench.",
        ),
        // pronouns
        (
            "She continues dancing around the room.",
            "She",
            "continues dancing around the room.",
        ),
        (
            "He then puts a towel over the face again.",
            "He then",
            "puts a towel over the face again.",
        ),
        (
            "They are going down the steep snowy slope at high speed.",
            "They",
            "are going down the steep snowy slope at high speed.",
        ),
        (
            "We then see a game being played.",
            "We then",
            "see a game being played.",
        ),
        // prefix adverbials and subordinate clauses
        (
            "Then, the man picks up the ball.",
            "Then, the man",
            "picks up the ball.",
        ),
        (
            "Then the woman puts a nozzle on the vacuum.",
            "Then the woman",
            "puts a nozzle on the vacuum.",
        ),
        (
            "After he finishes, he dismounts from the bars.",
            "After he finishes, he",
            "dismounts from the bars.",
        ),
        (
            "When he is finished, he walks away from the table.",
            "When he is finished, he",
            "walks away from the table.",
        ),
        (
            "Finally, the woman shows the finished cake.",
            "Finally, the woman",
            "shows the finished cake.",
        ),
        (
            "In the end, the team celebrates on the field.",
            "In the end, the team",
            "celebrates on the field.",
        ),
        (
            "Using a brush, she paints the fence white.",
            "Using a brush, she",
            "paints the fence white.",
        ),
        (
            "And he tries to look into the tub.",
            "And he",
            "tries to look into the tub.",
        ),
        // coordinated subjects
        (
            "The man and the woman dance together on the stage.",
            "The man and the woman",
            "dance together on the stage.",
        ),
        (
            "A man and woman are in a living room.",
            "A man and woman",
            "are in a living room.",
        ),
        (
            "The boy and his father throw a ball in the yard.",
            "The boy and his father",
            "throw a ball in the yard.",
        ),
        // participles and relative clauses inside the subject
        (
            "A man sitting on the deck is talking to the camera.",
            "A man sitting on the deck",
            "is talking to the camera.",
        ),
        (
            "A man wearing a red hat plays the drums.",
            "A man wearing a red hat",
            "plays the drums.",
        ),
        (
            "The man who is holding the rope pulls it tight.",
            "The man who is holding the rope",
            "pulls it tight.",
        ),
        // the verb after a comma that closes no prefix
        (
            "The man, wearing a hat, walks to the stage.",
            "The man, wearing a hat,",
            "walks to the stage.",
        ),
    ];

    #[test]
    fn splits_hand_checked_sentences() {
        let mut failures = Vec::new();
        for &(sentence, sent2, ending) in CASES {
            let got = split_second_sentence(sentence);
            if got.as_ref().map(|(a, b)| (a.as_str(), b.as_str())) != Some((sent2, ending)) {
                failures.push(format!(
                    "{sentence:?}: got {got:?}, want ({sent2:?}, {ending:?})"
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn no_split_without_a_subject_and_verb() {
        assert_eq!(split_second_sentence("A close up of a bowl of soup."), None);
        assert_eq!(split_second_sentence("Wash your hands."), None);
        assert_eq!(split_second_sentence(""), None);
        // An adverb before the verb is no subject: a fragment.
        assert_eq!(
            split_second_sentence("Then continues to brush his teeth."),
            None
        );
    }

    #[test]
    fn normalises_whitespace() {
        assert_eq!(
            split_second_sentence("  The man   dances  around. "),
            Some(("The man".into(), "dances around.".into()))
        );
    }
}
