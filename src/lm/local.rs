//! The local backend: batched ancestral sampling on the candle model.
//!
//! A context is run through the model once (its *prefix*). With afkit's CPU kernels, rows of
//! several contexts decode together by continuous batching: each step is one GEMM per projection
//! over every row in flight, and a finished row's slot goes at once to a waiting row. The generic
//! engine (any device, [`crate::device`]) decodes one context's rows in lockstep through candle
//! ops, dropping rows as they stop. Both draw the same tokens from the same per-row generators
//! with the same stop rules. Every row's tokens and their log-probabilities are kept, so an
//! ending's conditional log-probability costs nothing extra (an LM feature).

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use super::llama::{Prefix, RowCache, SlotCache, SlotRow};
use super::model::LanguageModel;
use super::sampler::{
    normalise_ending, sample_token, EndingSampler, Rejection, SampleRequest, SampledEnding,
    SampledPool, SamplingParams,
};
use crate::seed::Seed;

/// The candle model as a generation backend and scorer.
pub struct LocalLm {
    pub model: LanguageModel,
    pub params: SamplingParams,
    model_sha256: Option<String>,
    /// The prefixes of the latest contexts (at most [`MAX_CONTEXTS_PER_BATCH`]), so that the
    /// feature passes right after sampling reuse their prefill.
    recent_prefixes: Mutex<VecDeque<Arc<PromptPrefix>>>,
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

impl Default for DecodedRow {
    fn default() -> Self {
        DecodedRow {
            tokens: Vec::new(),
            logprobs: Vec::new(),
            stop: Stop::TokenCap,
            words: 0,
        }
    }
}

impl LocalLm {
    pub fn new(model: LanguageModel, params: SamplingParams, model_sha256: Option<String>) -> Self {
        LocalLm {
            model,
            params,
            model_sha256,
            recent_prefixes: Mutex::new(VecDeque::new()),
        }
    }

    /// The prompt's prefix, computed once while the prompt is among the latest few.
    pub fn prefix(&self, prompt: &str) -> Result<Arc<PromptPrefix>> {
        let mut recent = self.recent_prefixes.lock().expect("prefix cache poisoned");
        if let Some(p) = recent.iter().find(|p| p.prompt == prompt) {
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
        if recent.len() == MAX_CONTEXTS_PER_BATCH {
            recent.pop_front();
        }
        recent.push_back(Arc::clone(&p));
        Ok(p)
    }

    /// Decodes every group's rows until each stops. Every row draws from its own generator,
    /// seeded from its group's generator in row order: a context samples the same endings
    /// whichever contexts share the batch and whichever engine decodes it (up to the rounding of
    /// the logits).
    pub fn decode_groups(&self, groups: &mut [DecodeGroup]) -> Result<Vec<Vec<DecodedRow>>> {
        let mut out: Vec<Vec<DecodedRow>> = groups
            .iter()
            .map(|g| (0..g.rows).map(|_| DecodedRow::default()).collect())
            .collect();
        let mut waiting: VecDeque<LiveRow> = VecDeque::new();
        for (g, group) in groups.iter_mut().enumerate() {
            for row in 0..group.rows {
                let seed = group.rng.random::<u64>();
                waiting.push_back(LiveRow {
                    group: g,
                    row,
                    slot: 0,
                    rng: Seed::new(seed).rng(),
                });
            }
        }
        let prefixes: Vec<&Prefix> = groups.iter().map(|g| g.prefix).collect();
        if self.model.llama.cpu_kernels() {
            self.decode_continuous(&prefixes, waiting, &mut out)?;
        } else {
            self.decode_lockstep(&prefixes, waiting, &mut out)?;
        }
        Ok(out)
    }

    /// Continuous batching (afkit's CPU kernels): at most `batch` rows are in flight, one decode
    /// step advances all of them, and a finished row's slot goes at once to the next waiting row
    /// (of any group), so the matrix products stay large until the queue runs dry.
    fn decode_continuous(
        &self,
        prefixes: &[&Prefix],
        mut waiting: VecDeque<LiveRow>,
        out: &mut [Vec<DecodedRow>],
    ) -> Result<()> {
        let llama = &self.model.llama;
        let vocab = llama.cfg.vocab;
        let slots = self.params.batch.clamp(1, waiting.len().max(1));
        let mut cache = SlotCache::new(&llama.cfg, slots, self.params.max_tokens);
        let mut free_slots: Vec<usize> = (0..slots).rev().collect();
        let mut live: Vec<LiveRow> = Vec::new();
        loop {
            // Admit waiting rows into free slots. A row's first token comes from its prefix's
            // next-token distribution, so it is drawn at once; rows that stop there free the
            // slot again.
            while !free_slots.is_empty() && !waiting.is_empty() {
                let take = free_slots.len().min(waiting.len());
                let mut newcomers: Vec<LiveRow> = waiting.drain(..take).collect();
                for row in &mut newcomers {
                    row.slot = free_slots.pop().expect("a free slot per newcomer");
                }
                let drawn =
                    self.draw_tokens(&mut newcomers, |_, r| &prefixes[r.group].next_logprobs);
                self.advance(newcomers, drawn, out, &mut live, &mut free_slots);
            }
            if live.is_empty() {
                return Ok(());
            }
            let tokens: Vec<u32> = live
                .iter()
                .map(|r| *out[r.group][r.row].tokens.last().expect("a token"))
                .collect();
            let rows: Vec<SlotRow> = live
                .iter()
                .zip(&tokens)
                .map(|(r, token)| SlotRow {
                    slot: r.slot,
                    prefix: prefixes[r.group],
                    position: out[r.group][r.row].tokens.len() - 1,
                    tokens: std::slice::from_ref(token),
                })
                .collect();
            let hidden = llama.slot_forward(&rows, &mut cache)?;
            let logits = llama.logits(&hidden)?;
            let mut stepped = std::mem::take(&mut live);
            let drawn = self.draw_tokens(&mut stepped, |i, _| &logits[i * vocab..(i + 1) * vocab]);
            self.advance(stepped, drawn, out, &mut live, &mut free_slots);
        }
    }

    /// Lockstep decoding (the generic engine): the rows of one context at a time, at most `batch`
    /// together, all at the same position after their shared prefix, so that one
    /// [`super::llama::Llama::step_lockstep`] advances them through candle ops on any device.
    /// A row's slot is its row in the batch's cache; rows that stop leave the cache.
    fn decode_lockstep(
        &self,
        prefixes: &[&Prefix],
        mut waiting: VecDeque<LiveRow>,
        out: &mut [Vec<DecodedRow>],
    ) -> Result<()> {
        let llama = &self.model.llama;
        let vocab = llama.cfg.vocab;
        while let Some(first) = waiting.front() {
            let prefix = prefixes[first.group];
            let group = first.group;
            let take = waiting
                .iter()
                .take(self.params.batch.max(1))
                .take_while(|r| r.group == group)
                .count();
            let mut batch: Vec<LiveRow> = waiting.drain(..take).collect();
            let drawn = self.draw_tokens(&mut batch, |_, _| &prefix.next_logprobs);
            let (mut live, mut stopped) = (Vec::new(), Vec::new());
            self.advance(batch, drawn, out, &mut live, &mut stopped);
            let mut cache = RowCache::default();
            while !live.is_empty() {
                if !stopped.is_empty() {
                    let kept: Vec<u32> = live.iter().map(|r| r.slot as u32).collect();
                    cache.keep_rows(&kept)?;
                    stopped.clear();
                }
                for (i, row) in live.iter_mut().enumerate() {
                    row.slot = i;
                }
                let tokens: Vec<u32> = live
                    .iter()
                    .map(|r| *out[r.group][r.row].tokens.last().expect("a token"))
                    .collect();
                let logits = llama.step_lockstep(&tokens, prefix, &mut cache)?;
                let mut stepped = std::mem::take(&mut live);
                let drawn =
                    self.draw_tokens(&mut stepped, |i, _| &logits[i * vocab..(i + 1) * vocab]);
                self.advance(stepped, drawn, out, &mut live, &mut stopped);
            }
        }
        Ok(())
    }

    /// One token per row, each from the row's own generator and the distribution `dist` gives
    /// the row (by its index in `rows`).
    fn draw_tokens<'d>(
        &self,
        rows: &mut [LiveRow],
        dist: impl Fn(usize, &LiveRow) -> &'d [f32] + Sync,
    ) -> Vec<(u32, f32)> {
        let params = &self.params;
        rows.par_iter_mut()
            .enumerate()
            .map_init(Vec::new, |scratch, (i, row)| {
                let u = row.rng.random::<f64>();
                sample_token(dist(i, row), u, params, scratch)
            })
            .collect()
    }

    /// Appends each row's drawn token; rows that go on join `live`, the others free their slot.
    fn advance(
        &self,
        rows: Vec<LiveRow>,
        drawn: Vec<(u32, f32)>,
        out: &mut [Vec<DecodedRow>],
        live: &mut Vec<LiveRow>,
        free_slots: &mut Vec<usize>,
    ) {
        let tok = &self.model.tokenizer;
        for (row, (token, lp)) in rows.into_iter().zip(drawn) {
            let r = &mut out[row.group][row.row];
            let goes_on = if tok.is_end_of_generation(token) {
                r.stop = Stop::EndOfText;
                false
            } else {
                r.tokens.push(token);
                r.logprobs.push(lp);
                r.words += usize::from(tok.starts_word[token as usize]);
                if r.words > self.params.max_words {
                    r.stop = Stop::TooLong;
                    false
                } else if tok.ends_sentence[token as usize] {
                    r.stop = Stop::SentenceEnd;
                    false
                } else {
                    r.tokens.len() < self.params.max_tokens
                }
            };
            if goes_on {
                live.push(row);
            } else {
                free_slots.push(row.slot);
            }
        }
    }
}

/// A row in flight: which group and row it is, its cache slot and its generator.
struct LiveRow {
    group: usize,
    row: usize,
    slot: usize,
    rng: ChaCha8Rng,
}

/// One context's share of a decode batch: `rows` sequences continuing `prefix`, drawn from the
/// context's own generator.
pub struct DecodeGroup<'a> {
    pub prefix: &'a Prefix,
    pub rows: usize,
    pub rng: &'a mut ChaCha8Rng,
}

/// A context being sampled: its prompt, generator, the endings kept so far and its draw budget.
struct Sampling<'a> {
    request: &'a SampleRequest,
    prompt: Arc<PromptPrefix>,
    rng: ChaCha8Rng,
    seen: HashSet<String>,
    pool: SampledPool,
    max_draws: usize,
}

impl Sampling<'_> {
    /// Rows this context wants in the next round (0 when done).
    fn wanted(&self) -> usize {
        if self.pool.endings.len() >= self.request.n || self.pool.draws >= self.max_draws {
            return 0;
        }
        self.pool
            .draws_to_cover(self.request.n, self.max_draws)
            .max(1)
    }
}

/// Most contexts decoded in one batch: their prefixes stay cached for the feature passes.
const MAX_CONTEXTS_PER_BATCH: usize = 16;

/// Rows queued per batch slot when contexts are sampled together.
const ROWS_PER_SLOT: usize = 4;

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
        let mut pools = self.sample_many(std::slice::from_ref(request))?;
        Ok(pools.pop().expect("one pool per request"))
    }

    /// Enough contexts that their rows fill the batch's slots several times over: slots freed
    /// by finished rows are refilled, and only the last rows decode in a thinning batch.
    fn contexts_per_call(&self, n: usize) -> usize {
        let first_round = SampledPool::default().draws_to_cover(n, usize::MAX).max(1);
        (ROWS_PER_SLOT * self.params.batch / first_round).clamp(1, MAX_CONTEXTS_PER_BATCH)
    }

    /// Rounds of decoding: each round decodes the rows every unfinished context still wants, all
    /// contexts in one continuous batch, until each context has its N⁻ unique endings or has
    /// spent its draws.
    fn sample_many(&self, requests: &[SampleRequest]) -> Result<Vec<SampledPool>> {
        let mut states: Vec<Sampling> = requests
            .iter()
            .map(|request| {
                Ok(Sampling {
                    request,
                    prompt: self.prefix(&request.prompt)?,
                    rng: Seed::new(request.seed).rng(),
                    seen: request.seen_endings(),
                    pool: SampledPool::default(),
                    max_draws: self.params.max_draws(request.n),
                })
            })
            .collect::<Result<_>>()?;
        loop {
            let wanted: Vec<usize> = states.iter().map(Sampling::wanted).collect();
            if wanted.iter().all(|&w| w == 0) {
                break;
            }
            let mut groups: Vec<DecodeGroup> = states
                .iter_mut()
                .zip(&wanted)
                .filter(|(_, &w)| w > 0)
                .map(|(s, &rows)| DecodeGroup {
                    prefix: &s.prompt.prefix,
                    rows,
                    rng: &mut s.rng,
                })
                .collect();
            let decoded = self.decode_groups(&mut groups)?;
            drop(groups);
            let sampling = states.iter_mut().zip(&wanted).filter(|(_, &w)| w > 0);
            for ((state, _), rows) in sampling.zip(decoded) {
                self.keep_endings(state, rows)?;
            }
        }
        Ok(states.into_iter().map(|s| s.pool).collect())
    }
}

impl LocalLm {
    /// Adds a context's decoded rows to its pool: whole sentences, not too long, unique.
    fn keep_endings(&self, state: &mut Sampling, rows: Vec<DecodedRow>) -> Result<()> {
        for row in rows {
            state.pool.draws += 1;
            state.pool.tokens_generated += row.tokens.len();
            match row.stop {
                Stop::SentenceEnd => {}
                Stop::TooLong => {
                    state.pool.reject(Rejection::TooLong);
                    continue;
                }
                Stop::EndOfText | Stop::TokenCap => {
                    state.pool.reject(Rejection::NoSentenceEnd);
                    continue;
                }
            }
            let text = normalise_ending(&self.model.tokenizer.decode(&row.tokens)?);
            let ending = SampledEnding {
                text,
                tokens: Some((row.tokens, row.logprobs)),
            };
            state.pool.offer(
                ending,
                state.request,
                self.params.max_words,
                &mut state.seen,
            );
        }
        Ok(())
    }
}
