//! The LM features, the inputs of the AF perplexity MLP (as in SWAG), for a context and its endings:
//! mean log-prob of the ending given the context, mean log-prob of the ending alone (after the
//! document-start token; scored only when asked), mean log-prob of the context, log-prob of the
//! ending's final punctuation token, and token lengths.
//!
//! The ending-alone pass runs every ending through the model a second time, and on held-out
//! contexts it moved no audit row (BENCHMARKS.md, "The generator's ending-alone scores"; nor did
//! the same reading by AF's scorer), so callers ask for it only when they need it.
//!
//! An ending is always tokenised as `" " + text`: the tokens it has when it follows `sent2`, so
//! the conditional and the context-free scores are over the same tokens. A sampled ending whose
//! sampled tokens are exactly that tokenisation reuses the log-probs recorded while sampling.

use anyhow::Result;

use super::cache::Prefix;
use super::config::MAX_POSITIONS;
use super::llama::Llama;
use super::local::LocalLm;
use super::sampler::SampledEnding;
use super::tokenizer::GgufTokenizer;

/// Also the form `import-pool` reads features computed elsewhere in (a missing
/// `lp_final_punct` is null).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct EndingFeatures {
    pub lp_cond: f64,
    /// `None` when the ending-alone pass did not run.
    pub lp_alone: Option<f64>,
    /// Conditional log-prob of the last token when the ending ends with `.`, `!` or `?`.
    pub lp_final_punct: Option<f64>,
    pub n_tok: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ContextFeatures {
    /// Mean log-prob of the context's tokens (as the prompt renders it, without any style
    /// examples), each given the document start and those before it.
    pub ctx_logprob: f64,
    pub n_tok_sent1: usize,
    pub n_tok_sent2: usize,
    pub gold: EndingFeatures,
    /// One per ending passed in, same order.
    pub endings: Vec<EndingFeatures>,
}

fn mean(xs: &[f32]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.iter().map(|&x| x as f64).sum::<f64>() / xs.len() as f64
}

/// Positions (rows × longest row) one scoring batch may hold: big enough for efficient matrix
/// products, small enough that rows of similar length share a batch and little is padding.
const SCORE_BATCH_POSITIONS: usize = 1024;

/// A batch past this many positions takes a longer row only while its padded positions stay
/// within [`SCORE_BATCH_SLACK`] times its real ones. The generic engine pads every row to the
/// longest: filling batches to the position cap alone left 37% of its positions padding (a
/// context's endings run from 5 to 30 tokens); with this rule 14%, in two to three times as many
/// batches, which still keep the products efficient. afkit's CPU kernels pack rows without
/// padding, and batch sizes from 512 to all of a context's rows scored alike there.
const SCORE_BATCH_MIN_POSITIONS: usize = 192;
const SCORE_BATCH_SLACK: f64 = 1.25;

/// Scores `seqs` after `prefix` in the batches of [`score_batches`].
fn score_batched(
    llama: &Llama,
    prefix: &Prefix,
    seqs: &[&[u32]],
    max_rows: usize,
) -> Result<Vec<Vec<f32>>> {
    let lengths: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
    let mut out = vec![Vec::new(); seqs.len()];
    for batch in score_batches(&lengths, max_rows) {
        let rows: Vec<Vec<u32>> = batch.iter().map(|&i| seqs[i].to_vec()).collect();
        for (&i, lps) in batch.iter().zip(llama.score_continuations(prefix, &rows)?) {
            out[i] = lps;
        }
    }
    Ok(out)
}

/// Sequences of these `lengths` (token counts) as batches of indices, shortest first: each
/// batch takes the next row while it has fewer than `max_rows` rows and the row [`fits`].
fn score_batches(lengths: &[usize], max_rows: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| lengths[i]);
    let mut batches = Vec::new();
    let mut rest = order.as_slice();
    while !rest.is_empty() {
        let mut take = 1;
        while take < rest.len() && take < max_rows.max(1) && fits(lengths, &rest[..=take]) {
            take += 1;
        }
        let (batch, tail) = rest.split_at(take);
        batches.push(batch.to_vec());
        rest = tail;
    }
    batches
}

/// Whether `rows` (sorted by length, so the last is the longest) may be scored as one batch.
/// A row's first token is scored from the prefix alone, so a batch feeds each row its length
/// less one positions, padded to the longest.
fn fits(lengths: &[usize], rows: &[usize]) -> bool {
    let longest = rows.last().map_or(0, |&i| lengths[i]);
    let padded = rows.len() * longest.saturating_sub(1);
    let real: usize = rows.iter().map(|&i| lengths[i].saturating_sub(1)).sum();
    rows.len() * longest <= SCORE_BATCH_POSITIONS
        && (padded <= SCORE_BATCH_MIN_POSITIONS || padded as f64 <= SCORE_BATCH_SLACK * real as f64)
}

/// What the LM features need from a model: the log-prob of each token of a sequence given the
/// tokens before it. The local engine answers from its own forward pass; a completions server
/// that echoes prompt log-probs answers the same questions over HTTP
/// ([`super::openai::OpenAiSampler`]), so the client does no model work.
pub trait TokenScorer: Sync {
    /// The tokenizer whose tokens are scored.
    fn tokenizer(&self) -> &GgufTokenizer;
    /// Log-probs of the prompt's tokens, each given the document start and those before it.
    fn prompt_logprobs(&self, prompt: &str) -> Result<Vec<f32>>;
    /// Log-probs of each sequence's tokens as it continues `[doc_start] + prompt`.
    fn after_prompt(&self, prompt: &str, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>>;
    /// Log-probs of each sequence's tokens after the document-start token alone.
    fn alone(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>>;
}

impl TokenScorer for LocalLm {
    fn tokenizer(&self) -> &GgufTokenizer {
        &self.model.tokenizer
    }

    fn prompt_logprobs(&self, prompt: &str) -> Result<Vec<f32>> {
        Ok(self.model.llama.prefill(&self.prompt_ids(prompt)?)?.1)
    }

    fn after_prompt(&self, prompt: &str, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let context = self.prefix(prompt)?;
        score_batched(&self.model.llama, &context.prefix, seqs, self.params.batch)
    }

    fn alone(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        score_batched(
            &self.model.llama,
            &self.model.doc_prefix,
            seqs,
            self.params.batch,
        )
    }
}

/// Mean log-prob of a prompt's tokens, each given the document start and those before it.
pub fn prompt_logprob(scorer: &dyn TokenScorer, prompt: &str) -> Result<f64> {
    Ok(mean(&scorer.prompt_logprobs(prompt)?))
}

impl LocalLm {
    /// Why a context cannot be used, if it cannot: the document-start token, the prompt and
    /// then the longer of the found ending and the longest ending sampling may produce must fit
    /// the model's positions (sampling and scoring run exactly those sequences).
    pub fn misfit(&self, prompt: &str, gold: &str) -> Result<Option<String>> {
        let prompt_tokens = 1 + self.model.tokenizer.encode(prompt)?.len();
        let ending_tokens = self.params.max_tokens.max(self.ending_tokens(gold)?.len());
        Ok((prompt_tokens + ending_tokens >= MAX_POSITIONS).then(|| {
            format!(
                "its prompt has {prompt_tokens} tokens; with an ending of up to {ending_tokens} \
                 tokens it does not fit the model's {MAX_POSITIONS} positions"
            )
        }))
    }

    /// Tokens of an ending as it follows the context.
    pub fn ending_tokens(&self, ending: &str) -> Result<Vec<u32>> {
        ending_tokens(&self.model.tokenizer, ending)
    }
}

/// Tokens of an ending as it follows the context.
pub(crate) fn ending_tokens(tok: &GgufTokenizer, ending: &str) -> Result<Vec<u32>> {
    tok.encode(&format!(" {ending}"))
}

/// Features of the gold ending and of `endings`, all continuing `prompt`, from `scorer`; the
/// context's own from `context_prompt`, the context as `prompt` renders it without style
/// examples (the same text where there are none). Sampled endings whose recorded tokens are the
/// scorer's tokenisation keep the log-probs recorded while sampling; the rest are scored. Every
/// ending is also scored alone when `alone` is set.
pub fn features(
    scorer: &dyn TokenScorer,
    prompt: &str,
    context_prompt: &str,
    context: (&str, &str),
    gold: &str,
    endings: &[SampledEnding],
    alone: bool,
) -> Result<ContextFeatures> {
    let (sent1, sent2) = context;
    let tok = scorer.tokenizer();
    let texts: Vec<&str> = std::iter::once(gold)
        .chain(endings.iter().map(|e| e.text.as_str()))
        .collect();
    let ids: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| ending_tokens(tok, t))
        .collect::<Result<_>>()?;
    let cond = conditional_log_probs(scorer, prompt, endings, &ids)?;
    let alone: Vec<Option<f64>> = if alone {
        let all: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
        scorer.alone(&all)?.iter().map(|a| Some(mean(a))).collect()
    } else {
        vec![None; ids.len()]
    };
    let mut features = texts
        .iter()
        .zip(cond)
        .zip(alone)
        .map(|((text, cond), lp_alone)| EndingFeatures {
            lp_cond: mean(&cond),
            lp_alone,
            lp_final_punct: text
                .ends_with(['.', '!', '?'])
                .then(|| cond.last().map(|&x| x as f64))
                .flatten(),
            n_tok: cond.len(),
        });
    let gold = features.next().expect("the gold ending");
    let sent2_tokens = if sent2.is_empty() {
        0
    } else {
        tok.encode(&format!(" {sent2}"))?.len()
    };
    Ok(ContextFeatures {
        ctx_logprob: prompt_logprob(scorer, context_prompt)?,
        n_tok_sent1: tok.encode(sent1)?.len(),
        n_tok_sent2: sent2_tokens,
        gold,
        endings: features.collect(),
    })
}

/// Each ending's log-probs after `prompt` (`ids[0]` is the gold ending's tokens, the rest
/// `endings`'): a sampled ending whose recorded tokens are the scorer's tokenisation keeps the
/// log-probs recorded while sampling, the rest are scored.
fn conditional_log_probs(
    scorer: &dyn TokenScorer,
    prompt: &str,
    endings: &[SampledEnding],
    ids: &[Vec<u32>],
) -> Result<Vec<Vec<f32>>> {
    let mut cond: Vec<Option<Vec<f32>>> = std::iter::once(None)
        .chain(
            endings
                .iter()
                .zip(&ids[1..])
                .map(|(e, canonical)| match &e.tokens {
                    Some((sampled, lps)) if sampled == canonical => Some(lps.clone()),
                    _ => None,
                }),
        )
        .collect();
    let missing: Vec<usize> = (0..ids.len()).filter(|&i| cond[i].is_none()).collect();
    let seqs: Vec<&[u32]> = missing.iter().map(|&i| ids[i].as_slice()).collect();
    for (i, lps) in missing.iter().zip(scorer.after_prompt(prompt, &seqs)?) {
        cond[*i] = Some(lps);
    }
    Ok(cond
        .into_iter()
        .map(|c| c.expect("every ending scored"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every sequence is scored exactly once, shortest first; no batch breaks the row or
        /// position cap; past the small-batch floor a batch's padding stays within the slack;
        /// and a batch ends only where the next row would break one of those rules.
        #[test]
        fn batches_cover_every_sequence_within_the_rules(
            lengths in prop::collection::vec(1usize..60, 0..200),
            max_rows in 1usize..80,
        ) {
            let batches = score_batches(&lengths, max_rows);
            let flat: Vec<usize> = batches.iter().flatten().copied().collect();
            let mut seen = flat.clone();
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..lengths.len()).collect::<Vec<_>>());
            prop_assert!(flat.windows(2).all(|w| lengths[w[0]] <= lengths[w[1]]));
            for (b, batch) in batches.iter().enumerate() {
                prop_assert!(!batch.is_empty() && batch.len() <= max_rows);
                prop_assert!(batch.len() == 1 || fits(&lengths, batch));
                if let Some(next) = batches.get(b + 1) {
                    let mut grown = batch.clone();
                    grown.push(next[0]);
                    prop_assert!(batch.len() == max_rows || !fits(&lengths, &grown));
                }
            }
        }
    }

    /// Endings of 5 to 30 tokens, as a context's pool has them: little of a batch is padding.
    #[test]
    fn a_pool_of_endings_is_scored_with_little_padding() {
        let lengths: Vec<usize> = (0..65).map(|i| 5 + (i * 7) % 26).collect();
        let batches = score_batches(&lengths, 256);
        let fed = |i: usize| lengths[i] - 1;
        let padded: usize = batches
            .iter()
            .map(|b| b.len() * b.iter().map(|&i| fed(i)).max().unwrap())
            .sum();
        let real: usize = (0..lengths.len()).map(fed).sum();
        assert!(
            padded as f64 <= SCORE_BATCH_SLACK * real as f64,
            "{padded} positions for {real}"
        );
    }
}
