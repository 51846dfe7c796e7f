//! The LM features, the inputs of the AF perplexity MLP (as in SWAG), for a context and its endings:
//! mean log-prob of the ending given the context, mean log-prob of the ending alone (after the
//! document-start token), mean log-prob of the context, log-prob of the ending's final
//! punctuation token, and token lengths.
//!
//! An ending is always tokenised as `" " + text`: the tokens it has when it follows `sent2`, so
//! the conditional and the context-free scores are over the same tokens. A sampled ending whose
//! sampled tokens are exactly that tokenisation reuses the log-probs recorded while sampling.

use anyhow::Result;

use super::llama::{Llama, Prefix, MAX_POSITIONS};
use super::local::LocalLm;
use super::sampler::SampledEnding;

/// Also the form `import-pool` reads features computed elsewhere in (a missing
/// `lp_final_punct` is null).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct EndingFeatures {
    pub lp_cond: f64,
    pub lp_alone: f64,
    /// Conditional log-prob of the last token when the ending ends with `.`, `!` or `?`.
    pub lp_final_punct: Option<f64>,
    pub n_tok: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ContextFeatures {
    /// Mean log-prob of the prompt's tokens, each given the document start and those before it.
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

/// Scores `seqs` after `prefix`, shortest first, in batches of similar length (little padding)
/// of at most `max_rows` rows.
fn score_batched(
    llama: &Llama,
    prefix: &Prefix,
    seqs: &[&[u32]],
    max_rows: usize,
) -> Result<Vec<Vec<f32>>> {
    let mut order: Vec<usize> = (0..seqs.len()).collect();
    order.sort_by_key(|&i| seqs[i].len());
    let mut out = vec![Vec::new(); seqs.len()];
    let mut rest = order.as_slice();
    while !rest.is_empty() {
        // Rows are sorted, so the batch's longest row is its last.
        let mut take = 1;
        while take < rest.len()
            && take < max_rows.max(1)
            && (take + 1) * seqs[rest[take]].len() <= SCORE_BATCH_POSITIONS
        {
            take += 1;
        }
        let (chunk, tail) = rest.split_at(take);
        let rows: Vec<Vec<u32>> = chunk.iter().map(|&i| seqs[i].to_vec()).collect();
        for (&i, lps) in chunk.iter().zip(llama.score_continuations(prefix, &rows)?) {
            out[i] = lps;
        }
        rest = tail;
    }
    Ok(out)
}

impl LocalLm {
    /// Mean log-prob of a prompt's tokens, each given the document start and those before it.
    pub fn prompt_logprob(&self, prompt: &str) -> Result<f64> {
        Ok(mean(&self.prefix(prompt)?.token_logprobs))
    }

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
        self.model.tokenizer.encode(&format!(" {ending}"))
    }

    /// Features of the gold ending and of `endings`, all continuing `prompt`.
    pub fn features(
        &self,
        prompt: &str,
        sent1: &str,
        sent2: &str,
        gold: &str,
        endings: &[SampledEnding],
    ) -> Result<ContextFeatures> {
        let tok = &self.model.tokenizer;
        let llama = &self.model.llama;
        let context = self.prefix(prompt)?;
        let texts: Vec<&str> = std::iter::once(gold)
            .chain(endings.iter().map(|e| e.text.as_str()))
            .collect();
        let ids: Vec<Vec<u32>> = texts
            .iter()
            .map(|t| self.ending_tokens(t))
            .collect::<Result<_>>()?;
        // Conditional log-probs: reuse the sampled ones where the tokens agree, score the rest.
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
        for (i, lps) in missing.iter().zip(score_batched(
            llama,
            &context.prefix,
            &seqs,
            self.params.batch,
        )?) {
            cond[*i] = Some(lps);
        }
        let all: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
        let alone = score_batched(llama, &self.model.doc_prefix, &all, self.params.batch)?;
        let mut features = texts
            .iter()
            .zip(cond)
            .zip(alone)
            .map(|((text, cond), alone)| {
                let cond = cond.expect("every ending scored");
                EndingFeatures {
                    lp_cond: mean(&cond),
                    lp_alone: mean(&alone),
                    lp_final_punct: text
                        .ends_with(['.', '!', '?'])
                        .then(|| cond.last().map(|&x| x as f64))
                        .flatten(),
                    n_tok: cond.len(),
                }
            });
        let gold = features.next().expect("the gold ending");
        let sent2_tokens = if sent2.is_empty() {
            0
        } else {
            tok.encode(&format!(" {sent2}"))?.len()
        };
        Ok(ContextFeatures {
            ctx_logprob: mean(&context.token_logprobs),
            n_tok_sent1: tok.encode(sent1)?.len(),
            n_tok_sent2: sent2_tokens,
            gold,
            endings: features.collect(),
        })
    }
}
