//! Text processing shared by the stages: word tokenisation, afkit's own UPOS tagger, and the
//! splitter that cuts a second sentence into `sent2` and its ending before the main verb phrase,
//! and how an ending's words relate to its context's.

mod conllu;
pub mod overlap;
pub mod rules;
mod split;
pub mod subwords;
mod tagger;
mod tokenize;

pub use conllu::read_conllu;
pub use split::{split_second_sentence, split_with};
pub use tagger::{TaggedSentence, Tagger, TrainOptions, Upos};
pub use tokenize::{token_spans, tokenize, Token};

/// `n` with its noun in the number it takes, for messages: "1 context", "3 contexts".
pub fn counted<N: std::fmt::Display + PartialEq + From<u8>>(n: N, one: &str, many: &str) -> String {
    let noun = if n == N::from(1) { one } else { many };
    format!("{n} {noun}")
}
