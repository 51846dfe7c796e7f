//! The local backend: batched ancestral sampling on the candle model.
//!
//! A context is run through the model once (its *prefix*). With afkit's CPU kernels, rows of
//! several contexts decode together by continuous batching: each step is one GEMM per projection
//! over every row in flight, and a finished row's slot goes at once to a waiting row; a context
//! starts rows only as its pool needs them. The generic engine (any device, [`crate::device`])
//! decodes one context's rows in lockstep through candle ops, in rounds, dropping rows as they
//! stop. Both draw the same tokens from the same per-row generators with the same stop rules, and
//! a pool keeps the first N⁻ acceptable rows in row order, so both keep the same endings (up to
//! the rounding of the logits). Every row's tokens and their log-probabilities are kept, so an
//! ending's conditional log-probability costs nothing extra (an LM feature).

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use super::cache::{Prefix, RowCache, SlotCache, SlotRow};
use super::model::LanguageModel;
use super::sampler::{
    goes_on_the_last_word, normalise_ending, sample_token, EndingRule, EndingSampler, Rejection,
    SampleRequest, SampledEnding, SampledPool, SamplingParams,
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
pub(crate) struct PromptPrefix {
    pub prompt: String,
    pub prefix: Prefix,
}

/// How a decoded row ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    SentenceEnd,
    EndOfText,
    TokenCap,
    /// More words than an ending may have: stopped early, it would be discarded anyway.
    TooLong,
    /// Its first words already fail the request's rule, for the reason given
    /// ([`EndingRule::refusing_early`]): stopped early, the pool would refuse it anyway.
    Refused(&'static str),
}

#[derive(Debug, Clone)]
pub(crate) struct DecodedRow {
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

    /// `[doc_start] + prompt tokens`.
    pub(crate) fn prompt_ids(&self, prompt: &str) -> Result<Vec<u32>> {
        let mut ids = vec![self.model.tokenizer.doc_start];
        ids.extend(self.model.tokenizer.encode(prompt)?);
        Ok(ids)
    }

    /// The prompt's prefix, computed once while the prompt is among the latest few.
    pub(crate) fn prefix(&self, prompt: &str) -> Result<Arc<PromptPrefix>> {
        let mut recent = self.recent_prefixes.lock().expect("prefix cache poisoned");
        if let Some(p) = recent.iter().find(|p| p.prompt == prompt) {
            return Ok(Arc::clone(p));
        }
        let prefix = self.model.llama.prefix(&self.prompt_ids(prompt)?)?;
        let p = Arc::new(PromptPrefix {
            prompt: prompt.to_string(),
            prefix,
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
    pub(crate) fn decode_groups(&self, groups: &mut [DecodeGroup]) -> Result<Vec<Vec<DecodedRow>>> {
        let mut feed = AllRows {
            waiting: VecDeque::new(),
            out: groups
                .iter()
                .map(|g| (0..g.rows).map(|_| DecodedRow::default()).collect())
                .collect(),
        };
        for (g, group) in groups.iter_mut().enumerate() {
            for row in 0..group.rows {
                feed.waiting
                    .push_back(LiveRow::new(g, row, group.rng, group.rule));
            }
        }
        let prefixes: Vec<&Prefix> = groups.iter().map(|g| g.prefix).collect();
        if self.model.llama.cpu_kernels() {
            self.decode_continuous(&prefixes, &mut feed)?;
        } else {
            self.decode_lockstep(&prefixes, &mut feed)?;
        }
        Ok(feed.out)
    }

    /// Continuous batching (afkit's CPU kernels): at most `batch` rows are in flight, one decode
    /// step advances all of them, and a finished row's slot goes at once to the next row the
    /// feed gives (of any group), so the matrix products stay large until the feed runs dry.
    /// Rows of a group the feed no longer wants are dropped unfinished.
    fn decode_continuous(&self, prefixes: &[&Prefix], feed: &mut dyn RowFeed) -> Result<()> {
        let llama = &self.model.llama;
        let vocab = llama.cfg.vocab;
        let slots = self.params.batch.clamp(1, feed.most_rows().max(1));
        let mut cache = SlotCache::new(&llama.cfg, slots, self.params.max_tokens);
        let mut free_slots: Vec<usize> = (0..slots).rev().collect();
        let mut live: Vec<LiveRow> = Vec::new();
        loop {
            self.admit(prefixes, feed, &mut free_slots, &mut live)?;
            if live.is_empty() {
                return Ok(());
            }
            let tokens: Vec<u32> = live
                .iter()
                .map(|r| *r.decoded.tokens.last().expect("a token"))
                .collect();
            let rows: Vec<SlotRow> = live
                .iter()
                .zip(&tokens)
                .map(|(r, token)| SlotRow {
                    slot: r.slot,
                    prefix: prefixes[r.group],
                    position: r.decoded.tokens.len() - 1,
                    tokens: std::slice::from_ref(token),
                })
                .collect();
            let hidden = llama.slot_forward(&rows, &mut cache)?;
            let logits = llama.logits(&hidden)?;
            let mut stepped = std::mem::take(&mut live);
            let drawn = self.draw_tokens(&mut stepped, |i, _| &logits[i * vocab..(i + 1) * vocab]);
            for row in self.advance(stepped, drawn, &mut live) {
                free_slots.push(row.slot);
                feed.stopped(row)?;
            }
            let (wanted, unwanted) = std::mem::take(&mut live)
                .into_iter()
                .partition(|r| feed.wants(r.group));
            live = wanted;
            for row in unwanted {
                free_slots.push(row.slot);
                feed.dropped(row);
            }
        }
    }

    /// Fills free slots with the feed's next rows. A row's first token comes from its prefix's
    /// next-token distribution, so it is drawn at once; rows that stop there free the slot again.
    fn admit(
        &self,
        prefixes: &[&Prefix],
        feed: &mut dyn RowFeed,
        free_slots: &mut Vec<usize>,
        live: &mut Vec<LiveRow>,
    ) -> Result<()> {
        loop {
            let mut newcomers = Vec::new();
            while newcomers.len() < free_slots.len() {
                match feed.next_row(live) {
                    Some(row) => newcomers.push(row),
                    None => break,
                }
            }
            if newcomers.is_empty() {
                return Ok(());
            }
            for row in &mut newcomers {
                row.slot = free_slots.pop().expect("a free slot per newcomer");
            }
            let drawn = self.draw_tokens(&mut newcomers, |_, r| &prefixes[r.group].next_logprobs);
            for row in self.advance(newcomers, drawn, live) {
                free_slots.push(row.slot);
                feed.stopped(row)?;
            }
        }
    }

    /// Lockstep decoding (the generic engine): the rows of one context at a time, at most `batch`
    /// together, all at the same position after their shared prefix, so that one
    /// [`super::llama::Llama::step_lockstep`] advances them through candle ops on any device.
    /// A row's slot is its row in the batch's cache; rows that stop leave the cache.
    fn decode_lockstep(&self, prefixes: &[&Prefix], feed: &mut AllRows) -> Result<()> {
        let llama = &self.model.llama;
        let vocab = llama.cfg.vocab;
        while let Some(first) = feed.waiting.front() {
            let prefix = prefixes[first.group];
            let group = first.group;
            let take = feed
                .waiting
                .iter()
                .take(self.params.batch.max(1))
                .take_while(|r| r.group == group)
                .count();
            let mut batch: Vec<LiveRow> = feed.waiting.drain(..take).collect();
            let drawn = self.draw_tokens(&mut batch, |_, _| &prefix.next_logprobs);
            let mut live = Vec::new();
            let mut stopped = self.advance(batch, drawn, &mut live);
            let mut cache = RowCache::default();
            while !live.is_empty() {
                if !stopped.is_empty() {
                    let kept: Vec<u32> = live.iter().map(|r| r.slot as u32).collect();
                    cache.keep_rows(&kept)?;
                    for row in stopped.drain(..) {
                        feed.stopped(row)?;
                    }
                }
                for (i, row) in live.iter_mut().enumerate() {
                    row.slot = i;
                }
                let tokens: Vec<u32> = live
                    .iter()
                    .map(|r| *r.decoded.tokens.last().expect("a token"))
                    .collect();
                let logits = llama.step_lockstep(&tokens, prefix, &mut cache)?;
                let mut stepped = std::mem::take(&mut live);
                let drawn =
                    self.draw_tokens(&mut stepped, |i, _| &logits[i * vocab..(i + 1) * vocab]);
                stopped.extend(self.advance(stepped, drawn, &mut live));
            }
            for row in stopped {
                feed.stopped(row)?;
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

    /// Appends each row's drawn token; rows that go on join `live`, the others are returned.
    fn advance(
        &self,
        rows: Vec<LiveRow>,
        drawn: Vec<(u32, f32)>,
        live: &mut Vec<LiveRow>,
    ) -> Vec<LiveRow> {
        let tok = &self.model.tokenizer;
        let mut stopped = Vec::new();
        for (mut row, (token, lp)) in rows.into_iter().zip(drawn) {
            let r = &mut row.decoded;
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
                } else if let Some(why) = self.refused_early(&row.rule, r) {
                    r.stop = Stop::Refused(why);
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
                stopped.push(row);
            }
        }
        stopped
    }

    /// The reason `rule` refuses a row whose newest token begins a word, judged on the whole
    /// words before that token; `None` when the rule does not judge early or cannot tell yet. A
    /// row that began inside the prompt's last word is left to the checks of the whole ending,
    /// which count it as `mid_word`.
    fn refused_early(&self, rule: &EndingRule, row: &DecodedRow) -> Option<&'static str> {
        let tok = &self.model.tokenizer;
        let (&newest, earlier) = row.tokens.split_last()?;
        let starts_word = |token: &u32| tok.starts_word[*token as usize];
        if !rule.judges_early()
            || !starts_word(&newest)
            || !earlier.first().is_some_and(starts_word)
        {
            return None;
        }
        let whole_words = tok.decode(earlier).ok()?;
        rule.refuses_early(&normalise_ending(&whole_words))
    }
}

/// Where the rows of continuous batching come from, and where they go when they stop.
trait RowFeed {
    /// The next row to decode, if one is wanted now; `live` are the rows decoding now.
    fn next_row(&mut self, live: &[LiveRow]) -> Option<LiveRow>;
    /// Takes a row that stopped.
    fn stopped(&mut self, row: LiveRow) -> Result<()>;
    /// Whether `group` still wants the rows it has in flight.
    fn wants(&self, group: usize) -> bool;
    /// Takes a row dropped unfinished because its group no longer wanted it.
    fn dropped(&mut self, row: LiveRow);
    /// The most rows the feed may give in all (to size the batch).
    fn most_rows(&self) -> usize;
}

/// A fixed set of rows, every one decoded to its end.
struct AllRows {
    waiting: VecDeque<LiveRow>,
    out: Vec<Vec<DecodedRow>>,
}

impl RowFeed for AllRows {
    fn next_row(&mut self, _live: &[LiveRow]) -> Option<LiveRow> {
        self.waiting.pop_front()
    }

    fn stopped(&mut self, row: LiveRow) -> Result<()> {
        self.out[row.group][row.row] = row.decoded;
        Ok(())
    }

    fn wants(&self, _group: usize) -> bool {
        true
    }

    fn dropped(&mut self, _row: LiveRow) {
        unreachable!("every row is wanted to its end")
    }

    fn most_rows(&self) -> usize {
        self.waiting.len()
    }
}

/// A row in flight: which group and row it is, its cache slot, its generator, the rule that may
/// stop it early and its tokens so far.
struct LiveRow {
    group: usize,
    row: usize,
    slot: usize,
    rng: ChaCha8Rng,
    rule: EndingRule,
    decoded: DecodedRow,
}

impl LiveRow {
    /// Row `row` of `group`, its generator seeded by the next draw of the group's generator.
    fn new(group: usize, row: usize, group_rng: &mut ChaCha8Rng, rule: &EndingRule) -> Self {
        LiveRow {
            group,
            row,
            slot: 0,
            rng: Seed::new(group_rng.random::<u64>()).rng(),
            rule: rule.clone(),
            decoded: DecodedRow::default(),
        }
    }
}

/// One context's share of a decode batch: `rows` sequences continuing `prefix`, drawn from the
/// context's own generator, each stopped early where `rule` refuses it.
pub(crate) struct DecodeGroup<'a> {
    pub prefix: &'a Prefix,
    pub rows: usize,
    pub rng: &'a mut ChaCha8Rng,
    pub rule: &'a EndingRule,
}

/// A context being sampled: its prompt, generator, the endings kept so far and its draw budget;
/// with continuous batching also its rows in flight and those stopped but not yet offered to the
/// pool (rows are offered in row order, so the pool is the same however rows finish).
struct Sampling<'a> {
    request: &'a SampleRequest,
    prompt: Arc<PromptPrefix>,
    rng: ChaCha8Rng,
    seen: HashSet<String>,
    pool: SampledPool,
    max_draws: usize,
    admitted: usize,
    in_flight: usize,
    waiting_offer: BTreeMap<usize, DecodedRow>,
    offered: usize,
    survival: Survival,
}

impl Sampling<'_> {
    fn full(&self) -> bool {
        self.pool.endings.len() >= self.request.n
    }

    /// Rows this context wants in the next round (0 when done).
    fn wanted(&self) -> usize {
        if self.full() || self.pool.draws >= self.max_draws {
            return 0;
        }
        self.pool
            .draws_to_cover(self.request.n, self.max_draws)
            .max(1)
    }

    /// Whether continuous batching should start another row of this context: only while the
    /// endings kept and those expected from the rows stopped but not yet offered and from the
    /// rows in flight fall short of N⁻. `expected_in_flight` is the rows in flight's expected
    /// endings ([`Survival::after`] each). Rows started beyond that are likely decoded for
    /// nothing, while other contexts' rows can use the slots.
    fn wants_row(&self, expected_in_flight: f64) -> bool {
        if self.full() || self.admitted >= self.max_draws {
            return false;
        }
        let waiting: f64 = self
            .waiting_offer
            .values()
            .filter(|r| r.stop == Stop::SentenceEnd)
            .count() as f64
            * self.survival.of_finished();
        self.pool.endings.len() as f64 + waiting + expected_in_flight < self.request.n as f64
    }
}

/// How a context's offered rows ended, by their length in tokens: what a row still decoding is
/// likely to give. Rows refused early (at their first words) or at a length cap leave the batch
/// soon or late, so a row that has decoded `t` tokens is kept more often than rows on average
/// early on and less often near the cap; counting all rows alike starts rows for nothing.
#[derive(Default)]
struct Survival {
    /// Rows offered, and rows kept, by length in tokens.
    offered: Vec<u32>,
    kept: Vec<u32>,
    /// Of the rows that ended a sentence: how many were offered, and how many kept.
    sentence_ends: (u32, u32),
}

impl Survival {
    fn record(&mut self, len: usize, stop: Stop, kept: bool) {
        if self.offered.len() <= len {
            self.offered.resize(len + 1, 0);
            self.kept.resize(len + 1, 0);
        }
        self.offered[len] += 1;
        self.kept[len] += u32::from(kept);
        if stop == Stop::SentenceEnd {
            self.sentence_ends.0 += 1;
            self.sentence_ends.1 += u32::from(kept);
        }
    }

    /// The chance that a row in flight with `tokens` tokens is kept: the share kept of the
    /// offered rows longer than `tokens`, drawn towards [`PRIOR_KEPT`] while they are few. The
    /// first rows offered are the ones refused at their first words, so the share of all rows
    /// kept starts near 0 and would start rows for nothing.
    fn after(&self, tokens: usize) -> f64 {
        let longer = (tokens + 1).min(self.offered.len());
        let offered: u32 = self.offered[longer..].iter().sum();
        let kept: u32 = self.kept[longer..].iter().sum();
        smoothed(kept, offered)
    }

    /// The chance that a row that ended a sentence, waiting to be offered, is kept.
    fn of_finished(&self) -> f64 {
        let (offered, kept) = self.sentence_ends;
        smoothed(kept, offered)
    }
}

/// What [`Survival`] assumes of a row before its context has offered rows like it, and how many
/// rows' weight that assumption has.
const PRIOR_KEPT: f64 = 0.8;
const PRIOR_ROWS: f64 = 5.0;

/// `kept` of `offered`, drawn towards [`PRIOR_KEPT`].
fn smoothed(kept: u32, offered: u32) -> f64 {
    (f64::from(kept) + PRIOR_KEPT * PRIOR_ROWS) / (f64::from(offered) + PRIOR_ROWS)
}

/// Sampling's rows for continuous batching: each context's rows in row order, started while the
/// context [`Sampling::wants_row`], offered to its pool in row order as they stop, and dropped
/// unfinished once its pool is full. The pool is the one rounds of whole batches would keep
/// (the first N⁻ acceptable rows in row order); only the rows drawn for nothing are fewer.
struct Demand<'l, 's, 'r, 'k> {
    lm: &'l LocalLm,
    states: &'s mut [Sampling<'r>],
    /// Hears of every ending a pool keeps.
    kept: &'k mut dyn FnMut(),
}

impl RowFeed for Demand<'_, '_, '_, '_> {
    fn next_row(&mut self, live: &[LiveRow]) -> Option<LiveRow> {
        let mut expected = vec![0.0; self.states.len()];
        let mut decoding = vec![0; self.states.len()];
        for row in live {
            let state = &self.states[row.group];
            expected[row.group] += state.survival.after(row.decoded.tokens.len());
            decoding[row.group] += 1;
        }
        let (group, state) = self.states.iter_mut().enumerate().find(|(g, s)| {
            // Rows admitted this step are not in `live` yet and have no token.
            let admitted_now = (s.in_flight - decoding[*g]) as f64 * s.survival.after(0);
            s.wants_row(expected[*g] + admitted_now)
        })?;
        let row = LiveRow::new(group, state.admitted, &mut state.rng, &state.request.rule);
        state.admitted += 1;
        state.in_flight += 1;
        Some(row)
    }

    fn stopped(&mut self, row: LiveRow) -> Result<()> {
        let state = &mut self.states[row.group];
        state.in_flight -= 1;
        state.waiting_offer.insert(row.row, row.decoded);
        while let Some(decoded) = state.waiting_offer.remove(&state.offered) {
            state.offered += 1;
            if self.lm.offer_row(state, decoded)? {
                (self.kept)();
            }
        }
        Ok(())
    }

    fn wants(&self, group: usize) -> bool {
        !self.states[group].full()
    }

    fn dropped(&mut self, row: LiveRow) {
        let state = &mut self.states[row.group];
        state.in_flight -= 1;
        state.pool.draws += 1;
        state.pool.tokens_generated += row.decoded.tokens.len();
        state.pool.reject(Rejection::Surplus);
    }

    fn most_rows(&self) -> usize {
        self.states
            .iter()
            .map(|s| s.max_draws.saturating_sub(s.admitted))
            .sum()
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

    /// With afkit's CPU kernels, one continuous batch over all contexts, each starting rows as
    /// its pool needs them ([`Demand`]). On the generic engine, rounds: each round decodes the
    /// rows every unfinished context still wants, until each context has its N⁻ unique endings
    /// or has spent its draws.
    fn sample_many_telling(
        &self,
        requests: &[SampleRequest],
        kept: &mut dyn FnMut(),
    ) -> Result<Vec<SampledPool>> {
        let mut states: Vec<Sampling> = requests
            .iter()
            .map(|request| self.start_sampling(request))
            .collect::<Result<_>>()?;
        if self.model.llama.cpu_kernels() {
            self.sample_continuously(&mut states, kept)?;
        } else {
            self.sample_in_rounds(&mut states, kept)?;
        }
        Ok(states.into_iter().map(|s| s.pool).collect())
    }
}

impl LocalLm {
    fn start_sampling<'r>(&self, request: &'r SampleRequest) -> Result<Sampling<'r>> {
        Ok(Sampling {
            request,
            prompt: self.prefix(&request.prompt)?,
            rng: request.seed.rng(),
            seen: request.seen_endings(),
            pool: SampledPool::default(),
            max_draws: self.params.max_draws(request.n),
            admitted: 0,
            in_flight: 0,
            waiting_offer: BTreeMap::new(),
            offered: 0,
            survival: Survival::default(),
        })
    }

    /// One continuous batch over all contexts on afkit's CPU kernels.
    fn sample_continuously(&self, states: &mut [Sampling], kept: &mut dyn FnMut()) -> Result<()> {
        let prompts: Vec<Arc<PromptPrefix>> =
            states.iter().map(|s| Arc::clone(&s.prompt)).collect();
        let prefixes: Vec<&Prefix> = prompts.iter().map(|p| &p.prefix).collect();
        self.decode_continuous(
            &prefixes,
            &mut Demand {
                lm: self,
                states,
                kept,
            },
        )?;
        // Rows that stopped after a row dropped unfinished were drawn for nothing too.
        for state in states.iter_mut() {
            for (_, decoded) in std::mem::take(&mut state.waiting_offer) {
                if self.offer_row(state, decoded)? {
                    kept();
                }
            }
        }
        Ok(())
    }

    /// Rounds on the generic engine: each decodes the rows every unfinished context still wants.
    fn sample_in_rounds(&self, states: &mut [Sampling], kept: &mut dyn FnMut()) -> Result<()> {
        loop {
            let wanted: Vec<usize> = states.iter().map(Sampling::wanted).collect();
            if wanted.iter().all(|&w| w == 0) {
                return Ok(());
            }
            let mut groups: Vec<DecodeGroup> = states
                .iter_mut()
                .zip(&wanted)
                .filter(|(_, &w)| w > 0)
                .map(|(s, &rows)| DecodeGroup {
                    prefix: &s.prompt.prefix,
                    rows,
                    rng: &mut s.rng,
                    rule: &s.request.rule,
                })
                .collect();
            let decoded = self.decode_groups(&mut groups)?;
            drop(groups);
            let sampling = states.iter_mut().zip(&wanted).filter(|(_, &w)| w > 0);
            for ((state, _), rows) in sampling.zip(decoded) {
                for row in rows {
                    if self.offer_row(state, row)? {
                        kept();
                    }
                }
            }
        }
    }

    /// Whether `tokens`, sampled after `prompt`, begin inside the prompt's last word: a first
    /// token that starts no word and joins the last letter.
    pub(crate) fn begins_mid_word(&self, prompt: &str, tokens: &[u32]) -> Result<bool> {
        let tok = &self.model.tokenizer;
        match tokens.first() {
            Some(&first) if !tok.starts_word[first as usize] => {
                Ok(goes_on_the_last_word(prompt, &tok.decode(&[first])?))
            }
            _ => Ok(false),
        }
    }

    /// Offers a context's next decoded row (in row order) to its pool, which keeps it if it is a
    /// whole sentence, not too long and unique, while the pool still wants endings. Whether the
    /// pool kept it; the context's [`Survival`] hears either way.
    fn offer_row(&self, state: &mut Sampling, row: DecodedRow) -> Result<bool> {
        let (tokens, stop) = (row.tokens.len(), row.stop);
        let kept = self.judge_row(state, row)?;
        state.survival.record(tokens, stop, kept);
        Ok(kept)
    }

    /// [`Self::offer_row`]'s verdict.
    fn judge_row(&self, state: &mut Sampling, row: DecodedRow) -> Result<bool> {
        state.pool.draws += 1;
        state.pool.tokens_generated += row.tokens.len();
        match row.stop {
            Stop::SentenceEnd => {}
            Stop::TooLong => {
                state.pool.reject(Rejection::TooLong);
                return Ok(false);
            }
            Stop::EndOfText | Stop::TokenCap => {
                state.pool.reject(Rejection::NoSentenceEnd);
                return Ok(false);
            }
            Stop::Refused(why) => {
                state.pool.reject(Rejection::Rule(why));
                return Ok(false);
            }
        }
        if self.begins_mid_word(&state.request.prompt, &row.tokens)? {
            state.pool.reject(Rejection::MidWord);
            return Ok(false);
        }
        let text = normalise_ending(&self.model.tokenizer.decode(&row.tokens)?);
        let ending = SampledEnding {
            text,
            tokens: Some((row.tokens, row.logprobs)),
        };
        let before = state.pool.endings.len();
        state.pool.offer(
            ending,
            state.request,
            self.params.max_words,
            &mut state.seen,
        );
        Ok(state.pool.endings.len() > before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_refused_at_their_first_words_leave_longer_rows_their_chance() {
        let mut survival = Survival::default();
        for _ in 0..10 {
            survival.record(2, Stop::Refused("not_a_verb_phrase"), false);
        }
        // Only short rows were offered: a row past them is judged by the prior alone.
        assert_eq!(survival.after(2), PRIOR_KEPT);
        assert!(survival.after(0) < PRIOR_KEPT / 2.0);
        for i in 0..20 {
            survival.record(12, Stop::SentenceEnd, i % 4 != 0);
        }
        let expected = (15.0 + PRIOR_KEPT * PRIOR_ROWS) / (20.0 + PRIOR_ROWS);
        assert!((survival.after(5) - expected).abs() < 1e-12);
        assert!((survival.of_finished() - expected).abs() < 1e-12);
        // Rows as long as any offered are judged by the prior again.
        assert_eq!(survival.after(12), PRIOR_KEPT);
    }
}
