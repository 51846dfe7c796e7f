//! The stylistic models' view of a project: every ending of every pool turned, once per run, into
//! the numbers the four models read.
//!
//! Each option of a (k+1)-way choice is the second sentence `sent2 + ending`:
//! - LM features and lengths (SPEC §2) for the MLP, standardised over all endings of the run;
//! - word ids for the bag-of-words and the CNN (vocabulary: every token seen at least
//!   `min_count` times in the run's texts, the rest UNK), with the "token is in `sent2`" indicator
//!   implied by the context's `sent2` length;
//! - ids for the BiLSTM, where only the `lstm_top_words` most frequent words stay and every other
//!   word becomes its UPOS tag from afkit's tagger (SWAG §3.4).
//!
//! The vocabulary is built from all texts of the run (no labels are involved, so it leaks
//! nothing about which ending is gold); words seen only in held-out contexts keep untrained
//! embeddings.

use std::collections::HashMap;

use rayon::prelude::*;
use serde::Serialize;

use crate::store::af::{EndingLm, PoolContext, PoolEnding};

/// The 17 universal POS tags, the BiLSTM's stand-ins for rare words.
pub const UPOS_TAGS: [&str; 17] = [
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN",
    "PUNCT", "SCONJ", "SYM", "VERB", "X",
];

/// Word id 0 pads sequences; id 1 is the unknown word (both vocabularies).
pub const PAD: u32 = 0;
pub const UNK: u32 = 1;

/// Number of MLP inputs per option; see [`lm_features`].
pub const LM_FEATURES: usize = 10;

#[derive(Debug, Clone, Copy, Serialize)]
pub struct EncodeConfig {
    /// Tokens seen fewer times than this in the run's texts map to UNK.
    pub min_count: usize,
    /// Words kept by the BiLSTM; the rest become their UPOS tag.
    pub lstm_top_words: usize,
    /// Longest token sequence (`sent2 + ending`) fed to the text models; the rest is cut.
    pub max_tokens: usize,
}

impl Default for EncodeConfig {
    fn default() -> Self {
        EncodeConfig {
            min_count: 2,
            lstm_top_words: 100,
            max_tokens: 64,
        }
    }
}

/// One option, ready for the models.
#[derive(Debug, Clone)]
pub struct EncodedEnding {
    pub ending_id: i64,
    /// Standardised LM features and lengths.
    pub lm: [f32; LM_FEATURES],
    /// Word ids of `sent2 + ending`; the first `EncodedContext::n_sent2` belong to `sent2`.
    pub words: Vec<u32>,
    /// BiLSTM ids of the same tokens (top words, else UPOS tags).
    pub lstm: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct EncodedContext {
    pub example_id: i64,
    /// Tokens of `sent2` at the start of every option's sequence (capped like the sequence).
    pub n_sent2: usize,
    pub gold: EncodedEnding,
    pub candidates: Vec<EncodedEnding>,
}

impl EncodedContext {
    /// The candidate with this ending id.
    pub fn candidate(&self, ending_id: i64) -> Option<&EncodedEnding> {
        self.candidates.iter().find(|e| e.ending_id == ending_id)
    }
}

/// A run's encoded contexts and vocabulary sizes.
#[derive(Debug, Clone)]
pub struct Dataset {
    pub contexts: Vec<EncodedContext>,
    pub vocab_size: usize,
    pub lstm_vocab_size: usize,
}

impl Dataset {
    /// Tokenises and tags every `sent2 + ending` (in parallel), builds both vocabularies and
    /// standardises the LM features.
    pub fn encode(pool: &[PoolContext], cfg: &EncodeConfig) -> Dataset {
        let sent2_tokens: Vec<Vec<String>> = pool
            .par_iter()
            .map(|c| crate::text::tokenize(&c.sent2))
            .collect();
        let endings: Vec<(usize, &PoolEnding)> = pool
            .iter()
            .enumerate()
            .flat_map(|(i, c)| {
                std::iter::once(&c.gold)
                    .chain(&c.candidates)
                    .map(move |e| (i, e))
            })
            .collect();
        // Tokens and tags of each option's full second sentence; tagging sees the whole sentence.
        let tagger = crate::text::Tagger::shipped();
        let tokenised: Vec<(Vec<String>, Vec<&'static str>)> = endings
            .par_iter()
            .map(|(ctx, ending)| {
                let mut tokens = sent2_tokens[*ctx].clone();
                tokens.extend(crate::text::tokenize(&ending.text));
                tokens.truncate(cfg.max_tokens);
                let tags = tagger.tag(&tokens).iter().map(|t| t.as_str()).collect();
                (tokens, tags)
            })
            .collect();

        let counts = count_tokens(&sent2_tokens, &endings, &tokenised);
        let mut by_frequency: Vec<(&str, usize)> = counts.into_iter().collect();
        by_frequency.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let word_ids: HashMap<&str, u32> = by_frequency
            .iter()
            .filter(|(_, n)| *n >= cfg.min_count)
            .enumerate()
            .map(|(i, (w, _))| (*w, i as u32 + 2))
            .collect();
        let lstm_ids: HashMap<&str, u32> = by_frequency
            .iter()
            .take(cfg.lstm_top_words)
            .enumerate()
            .map(|(i, (w, _))| (*w, i as u32 + 2))
            .collect();
        let tag_base = lstm_ids.len() as u32 + 2;
        let tag_id = |tag: &str| {
            UPOS_TAGS
                .iter()
                .position(|t| *t == tag)
                .map_or(UNK, |i| tag_base + i as u32)
        };

        let raw: Vec<[Option<f64>; LM_FEATURES]> = endings
            .iter()
            .zip(&tokenised)
            .map(|((ctx, ending), (tokens, _))| {
                let n_words = tokens.len().saturating_sub(sent2_tokens[*ctx].len());
                lm_features(&pool[*ctx], &ending.lm, n_words)
            })
            .collect();
        let standardised = standardise(&raw);

        let mut contexts: Vec<EncodedContext> = pool
            .iter()
            .zip(&sent2_tokens)
            .map(|(c, s2)| EncodedContext {
                example_id: c.example_id,
                n_sent2: s2.len().min(cfg.max_tokens),
                gold: placeholder(c.gold.id),
                candidates: Vec::with_capacity(c.candidates.len()),
            })
            .collect();
        for (((ctx, ending), (tokens, tags)), lm) in
            endings.iter().zip(&tokenised).zip(standardised)
        {
            let encoded = EncodedEnding {
                ending_id: ending.id,
                lm,
                words: tokens
                    .iter()
                    .map(|t| word_ids.get(t.as_str()).copied().unwrap_or(UNK))
                    .collect(),
                lstm: tokens
                    .iter()
                    .zip(tags)
                    .map(|(t, tag)| {
                        lstm_ids
                            .get(t.as_str())
                            .copied()
                            .unwrap_or_else(|| tag_id(tag))
                    })
                    .collect(),
            };
            let context = &mut contexts[*ctx];
            if ending.id == pool[*ctx].gold.id {
                context.gold = encoded;
            } else {
                context.candidates.push(encoded);
            }
        }
        Dataset {
            contexts,
            vocab_size: word_ids.len() + 2,
            lstm_vocab_size: tag_base as usize + UPOS_TAGS.len(),
        }
    }
}

fn placeholder(ending_id: i64) -> EncodedEnding {
    EncodedEnding {
        ending_id,
        lm: [0.0; LM_FEATURES],
        words: Vec::new(),
        lstm: Vec::new(),
    }
}

/// Token frequencies over the run's distinct texts: each `sent2` once, each ending once.
fn count_tokens<'a>(
    sent2_tokens: &'a [Vec<String>],
    endings: &[(usize, &PoolEnding)],
    tokenised: &'a [(Vec<String>, Vec<&'static str>)],
) -> HashMap<&'a str, usize> {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for tokens in sent2_tokens {
        for t in tokens {
            *counts.entry(t.as_str()).or_default() += 1;
        }
    }
    for ((ctx, _), (tokens, _)) in endings.iter().zip(tokenised) {
        for t in tokens.iter().skip(sent2_tokens[*ctx].len()) {
            *counts.entry(t.as_str()).or_default() += 1;
        }
    }
    counts
}

/// The MLP's raw inputs for one option (SWAG §3.4: "LM perplexity features and context/ending
/// lengths"): ending log-prob given the context, alone, their difference, final punctuation
/// log-prob, whether that is missing, ending length in LM tokens and in words, context log-prob,
/// `sent1` and `sent2` lengths in LM tokens.
fn lm_features(ctx: &PoolContext, lm: &EndingLm, n_words: usize) -> [Option<f64>; LM_FEATURES] {
    let diff = match (lm.lp_cond, lm.lp_alone) {
        (Some(c), Some(a)) => Some(c - a),
        _ => None,
    };
    [
        lm.lp_cond,
        lm.lp_alone,
        diff,
        lm.lp_final_punct,
        Some(f64::from(u8::from(lm.lp_final_punct.is_none()))),
        lm.n_tok_ending.map(|n| n as f64),
        Some(n_words as f64),
        ctx.ctx_logprob,
        ctx.n_tok_sent1.map(|n| n as f64),
        ctx.n_tok_sent2.map(|n| n as f64),
    ]
}

/// Zero mean, unit variance per feature over all rows; a missing value becomes the mean (0) and
/// a constant feature becomes 0.
fn standardise(raw: &[[Option<f64>; LM_FEATURES]]) -> Vec<[f32; LM_FEATURES]> {
    let mut mean = [0.0f64; LM_FEATURES];
    let mut std = [1.0f64; LM_FEATURES];
    for f in 0..LM_FEATURES {
        let values: Vec<f64> = raw.iter().filter_map(|r| r[f]).collect();
        if values.is_empty() {
            continue;
        }
        let n = values.len() as f64;
        mean[f] = values.iter().sum::<f64>() / n;
        let var = values.iter().map(|v| (v - mean[f]).powi(2)).sum::<f64>() / n;
        std[f] = if var > 1e-12 { var.sqrt() } else { 1.0 };
    }
    raw.iter()
        .map(|r| {
            let mut out = [0.0f32; LM_FEATURES];
            for f in 0..LM_FEATURES {
                out[f] = r[f].map_or(0.0, |v| ((v - mean[f]) / std[f]) as f32);
            }
            out
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standardise_centres_scales_and_imputes_the_mean() {
        let mut rows = vec![[Some(1.0); LM_FEATURES], [Some(3.0); LM_FEATURES]];
        rows[1][0] = None;
        rows[0][2] = Some(5.0);
        let out = standardise(&rows);
        assert_eq!(out[1][0], 0.0, "missing → mean");
        assert_eq!(out[0][1], -1.0);
        assert_eq!(out[1][1], 1.0);
        assert_eq!(out[0][0], 0.0, "a constant feature carries no signal");
    }
}
