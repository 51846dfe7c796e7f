//! The local backend: batched ancestral sampling on the candle model.
//!
//! A context is run through the model once (its *prefix*). All rows of a batch start from that
//! prefix's next-token distribution and decode in lock-step, one GEMM per projection per step;
//! finished rows leave the batch. Every row's tokens and their log-probabilities are kept, so an
//! ending's conditional log-probability costs nothing extra (SPEC §2 features).

use std::sync::{Arc, Mutex};

use anyhow::Result;
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use super::llama::{Prefix, RowCache};
use super::model::LanguageModel;
use super::sampler::{
    acceptable_ending, normalise_ending, sample_token, EndingSampler, SampleRequest, SampledEnding,
    SampledPool, SamplingParams,
};

/// The candle model as a generation backend and scorer.
pub struct LocalLm {
    pub model: LanguageModel,
    pub params: SamplingParams,
    model_sha256: Option<String>,
    /// The last context's prefix, so that scoring right after sampling reuses the prefill.
    last_prefix: Mutex<Option<Arc<PromptPrefix>>>,
}

/// A prompt run through the model: `[doc_start] + prompt tokens`.
pub struct PromptPrefix {
    pub prompt: String,
    pub prefix: Prefix,
    /// Log-probability of each prompt token given the tokens before it.
    pub token_logprobs: Vec<f32>,
}

/// How a decoded row ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    SentenceEnd,
    EndOfText,
    TokenCap,
    /// More words than an ending may have: stopped early, it would be discarded anyway.
    TooLong,
}

#[derive(Debug, Clone)]
pub struct DecodedRow {
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub stop: Stop,
    words: usize,
}

impl LocalLm {
    pub fn new(model: LanguageModel, params: SamplingParams, model_sha256: Option<String>) -> Self {
        LocalLm {
            model,
            params,
            model_sha256,
            last_prefix: Mutex::new(None),
        }
    }

    /// The prompt's prefix, computed once for consecutive calls with the same prompt.
    pub fn prefix(&self, prompt: &str) -> Result<Arc<PromptPrefix>> {
        let mut last = self.last_prefix.lock().expect("prefix cache poisoned");
        if let Some(p) = last.as_ref().filter(|p| p.prompt == prompt) {
            return Ok(Arc::clone(p));
        }
        let mut ids = vec![self.model.tokenizer.doc_start];
        ids.extend(self.model.tokenizer.encode(prompt)?);
        let (prefix, token_logprobs) = self.model.llama.prefill(&ids)?;
        let p = Arc::new(PromptPrefix {
            prompt: prompt.to_string(),
            prefix,
            token_logprobs,
        });
        *last = Some(Arc::clone(&p));
        Ok(p)
    }

    /// Decodes `rows` sequences after `prefix` together until each stops.
    pub fn decode_batch(
        &self,
        prefix: &Prefix,
        rows: usize,
        rng: &mut ChaCha8Rng,
    ) -> Result<Vec<DecodedRow>> {
        let tok = &self.model.tokenizer;
        let vocab = self.model.llama.cfg.vocab;
        let mut out: Vec<DecodedRow> = (0..rows)
            .map(|_| DecodedRow {
                tokens: Vec::new(),
                logprobs: Vec::new(),
                stop: Stop::TokenCap,
                words: 0,
            })
            .collect();
        // The first token of every row comes from the prefix's own next-token distribution.
        let mut logits: Vec<f32> = prefix.next_logprobs.repeat(rows);
        let mut active: Vec<usize> = (0..rows).collect();
        let mut cache = RowCache::default();
        loop {
            let uniforms: Vec<f64> = active.iter().map(|_| rng.random::<f64>()).collect();
            let params = &self.params;
            let drawn: Vec<(u32, f32)> = logits
                .par_chunks(vocab)
                .zip(uniforms.par_iter())
                .map_init(Vec::new, |scratch, (row_logits, &u)| {
                    sample_token(row_logits, u, params, scratch)
                })
                .collect();
            let mut still = Vec::with_capacity(active.len());
            let mut kept_positions = Vec::with_capacity(active.len());
            for (pos, (&row, &(token, lp))) in active.iter().zip(&drawn).enumerate() {
                let r = &mut out[row];
                if tok.is_end_of_generation(token) {
                    r.stop = Stop::EndOfText;
                    continue;
                }
                r.tokens.push(token);
                r.logprobs.push(lp);
                r.words += usize::from(tok.starts_word[token as usize]);
                if r.words > self.params.max_words {
                    r.stop = Stop::TooLong;
                } else if tok.ends_sentence[token as usize] {
                    r.stop = Stop::SentenceEnd;
                } else if r.tokens.len() < self.params.max_tokens {
                    still.push(row);
                    kept_positions.push(pos as u32);
                }
            }
            if still.is_empty() {
                return Ok(out);
            }
            if still.len() < active.len() {
                cache.select_rows(&kept_positions)?;
            }
            active = still;
            let last: Vec<u32> = active
                .iter()
                .map(|&r| *out[r].tokens.last().expect("a token"))
                .collect();
            let input = Tensor::from_vec(last, (active.len(), 1), &Device::Cpu)?;
            let hidden = self.model.llama.forward(&input, Some(prefix), &mut cache)?;
            let hidden = hidden.reshape((active.len(), self.model.llama.cfg.d_model))?;
            logits = self.model.llama.logits(&hidden)?.flatten_all()?.to_vec1()?;
        }
    }
}

impl EndingSampler for LocalLm {
    fn describe(&self) -> (String, String, Option<String>) {
        let name = self
            .model
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        ("local".into(), name, self.model_sha256.clone())
    }

    fn sample(&self, request: &SampleRequest) -> Result<SampledPool> {
        let prompt = self.prefix(&request.prompt)?;
        let mut rng = ChaCha8Rng::seed_from_u64(request.seed);
        let mut seen = request.seen_endings();
        let mut pool = SampledPool::default();
        let max_draws = request.n * self.params.max_draws_per_ending.max(1);
        while pool.endings.len() < request.n && pool.draws < max_draws {
            let rows = pool
                .draws_to_cover(request.n, max_draws)
                .clamp(1, self.params.batch);
            for row in self.decode_batch(&prompt.prefix, rows, &mut rng)? {
                pool.draws += 1;
                pool.tokens_generated += row.tokens.len();
                if row.stop != Stop::SentenceEnd || pool.endings.len() >= request.n {
                    continue;
                }
                let text = normalise_ending(&self.model.tokenizer.decode(&row.tokens)?);
                if acceptable_ending(&text, self.params.max_words) && seen.insert(text.clone()) {
                    pool.endings.push(SampledEnding {
                        text,
                        tokens: Some((row.tokens, row.logprobs)),
                    });
                }
            }
        }
        Ok(pool)
    }
}
