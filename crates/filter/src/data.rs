//! The stylistic models' view of a project: every ending of every pool turned, once per run, into
//! the numbers the four models read.
//!
//! Each option of a (k+1)-way choice is the second sentence `sent2 + ending`:
//! - LM features, lengths and the ending's word relations to its context (`text::overlap`) for
//!   the MLP, standardised over all endings of the run;
//! - word ids for the bag-of-words and the CNN (vocabulary: every token seen at least
//!   `min_count` times in the run's texts and in the texts of at least `min_contexts` contexts,
//!   the rest UNK), with the "token is in `sent2`" indicator implied by the context's `sent2`
//!   length;
//! - ids for the BiLSTM, where only the `lstm_top_words` most frequent words stay and every other
//!   word becomes its UPOS tag from afkit's tagger (SWAG §3.4).
//!
//! The vocabulary is built from all texts of the run (no labels are involved, so it leaks
//! nothing about which ending is gold); words seen only in held-out contexts keep untrained
//! embeddings.
//!
//! Memory: the pools are streamed from the project file a chunk of contexts at a time and never
//! held as text. MLP-only iterations need only the LM features, so the text ids are encoded only
//! when asked for ([`Dataset::load`]'s `with_text`): a pool ending then costs 80 bytes, which
//! keeps a 100k-context × 256-ending project near 2 GB (BENCHMARKS.md, "Big projects").

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Result};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::scorer::{scorer_features, SCORER_ALONE_FEATURES, SCORER_FEATURES};
use super::settings::EncodeConfig;
use afkit_engine::embed::{SentenceEncoder, VectorStore, ENCODER};
use afkit_engine::text::overlap::{content_words, ContextWords, CONTEXT_RELATIONS};
use afkit_engine::text::subwords::char_gram_hashes;
use afkit_store::af::{PoolContext, PoolEnding};
use afkit_store::vector_cache::VectorCache;
use afkit_store::Store;

/// The 17 universal POS tags, the BiLSTM's stand-ins for rare words.
pub(crate) const UPOS_TAGS: [&str; 17] = [
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN",
    "PUNCT", "SCONJ", "SYM", "VERB", "X",
];

/// Word id 0 pads sequences (the models treat it as padding); id 1 is the unknown word (both
/// vocabularies).
pub(crate) const UNK: u32 = 1;

/// Number of MLP inputs per option: [`lm_features`], then the context relations.
pub(crate) const MLP_FEATURES: usize = LM_FEATURES + CONTEXT_RELATIONS.len();

/// LM features and lengths per option; see [`lm_features`].
const LM_FEATURES: usize = 10;

/// Contexts tokenised (and tagged) together, in parallel, while the pools stream in.
const CHUNK_CONTEXTS: usize = 512;

/// One option, ready for the models.
#[derive(Debug, Clone)]
pub(crate) struct EncodedEnding {
    pub ending_id: i64,
    /// Standardised LM features, lengths and context relations.
    pub mlp: [f32; MLP_FEATURES],
    /// Standardised features from the run's scorer models, [`SCORER_FEATURES`] per model in the
    /// run's order (empty, and not allocated, in a run without scorers).
    pub scorer: Box<[f32]>,
    /// Word ids of `sent2 + ending`; the first `EncodedContext::n_sent2` belong to `sent2`.
    /// Empty when the dataset was loaded without text.
    pub words: Box<[u32]>,
    /// BiLSTM ids of the same tokens (top words, else UPOS tags).
    pub lstm: Box<[u32]>,
    /// Hashed character n-gram ids of the ending alone (1-based; empty without text or with the
    /// subword model off).
    pub subwords: Box<[u32]>,
    /// MiniLM embedding of `sent2 + ending` (empty without text or with the sentence model off).
    pub sentence: Box<[f32]>,
}

#[derive(Debug, Clone)]
pub(crate) struct EncodedContext {
    pub example_id: i64,
    /// The group (video) it was ingested with: AF holds out whole groups.
    pub group: String,
    /// Tokens of `sent2` at the start of every option's sequence (capped like the sequence).
    pub n_sent2: usize,
    pub gold: EncodedEnding,
    pub candidates: Vec<EncodedEnding>,
}

impl EncodedContext {
    /// The candidate with this ending id.
    pub(crate) fn candidate(&self, ending_id: i64) -> Option<&EncodedEnding> {
        self.candidates.iter().find(|e| e.ending_id == ending_id)
    }
}

/// A run's encoded contexts and vocabulary sizes.
#[derive(Debug, Clone)]
pub(crate) struct Dataset {
    pub contexts: Vec<EncodedContext>,
    pub vocab_size: usize,
    pub lstm_vocab_size: usize,
    /// Whether the word and BiLSTM ids are there (the text models need them; the MLP does not).
    pub with_text: bool,
    /// Hash buckets of the subword ids (0: no subword model).
    pub subword_buckets: usize,
    /// Width of the sentence vectors (0: no sentence model).
    pub sentence_dim: usize,
    /// Scorer features per option (0: no scorer models).
    pub scorer_features: usize,
    /// Contexts with a complete pool left out for having fewer than k candidates.
    pub excluded: usize,
    /// Pool endings left out because a review of an assembled question vetoed them: picked
    /// over the found ending, or named plausible or broken.
    pub set_aside_by_review: usize,
    /// Whether the MLP reads the generator's ending-alone inputs ([`AloneInputs`]).
    pub alone_inputs: AloneInputs,
    /// Whether some scorer's readings alone (stored by an earlier afkit) were left out because
    /// other options lack them.
    pub scorer_alone_dropped: bool,
}

impl Dataset {
    /// Streams every complete pool with at least `k` candidates from the project, less the
    /// endings reviews vetoed (a person called them a right answer, or broken: AF must not make
    /// them wrong answers, nor train its models on them as such), tokenising
    /// (and, `with_text`, tagging) a chunk of contexts at a time in parallel, then builds both
    /// vocabularies and standardises the LM features.
    ///
    /// With the sentence model, every pool ending must have its stored sentence vector
    /// ([`store_sentence_vectors`] first). `scorers` names the scorer models whose features the
    /// options get, each by the key its scores are stored under (every pool ending must have a
    /// stored score from each).
    pub(crate) fn load(
        store: &Store,
        k: usize,
        cfg: &EncodeConfig,
        with_text: bool,
        scorers: &[String],
    ) -> Result<Dataset> {
        let mut builder = Builder::new(*cfg, with_text, scorers);
        let mut chunk: Vec<PoolContext> = Vec::with_capacity(CHUNK_CONTEXTS);
        let sentence_model = builder.reads_sentence_vectors().then_some(ENCODER);
        let vetoes = store.review_vetoes()?;
        store.for_each_pool_context(sentence_model, scorers, |mut context| {
            if let Some(vetoed) = vetoes.get(&context.example_id) {
                let before = context.candidates.len();
                context.candidates.retain(|e| !vetoed.contains(&e.id));
                builder.set_aside_by_review += before - context.candidates.len();
            }
            if context.candidates.len() < k {
                builder.excluded += 1;
                return Ok(());
            }
            chunk.push(context);
            if chunk.len() == CHUNK_CONTEXTS {
                builder.add(std::mem::take(&mut chunk))?;
            }
            Ok(())
        })?;
        builder.add(chunk)?;
        Ok(builder.finish())
    }

    /// SHA-256 over the ids of every context and ending that takes part: any change to the pools
    /// (a new context, a regenerated ending) changes it.
    pub(crate) fn fingerprint(&self) -> String {
        let mut hasher = Sha256::new();
        for c in &self.contexts {
            hasher.update(format!("{}:{}", c.example_id, c.gold.ending_id));
            for e in &c.candidates {
                hasher.update(format!(",{}", e.ending_id));
            }
            hasher.update(";");
        }
        format!("{:x}", hasher.finalize())
    }
}

/// Accumulates encoded contexts while the pools stream in. Tokens are interned (one id per
/// distinct string) so that no token string is stored per ending; interned ids become vocabulary
/// ids in [`Builder::finish`], once every token has been counted.
struct Builder {
    cfg: EncodeConfig,
    with_text: bool,
    tagger: &'static afkit_engine::text::Tagger,
    /// Width of the sentence vectors read so far (0: none yet, or no sentence model).
    sentence_dim: usize,
    /// Keys of the scorer models whose stored scores become features.
    scorers: Vec<String>,
    interned: HashMap<String, u32>,
    /// Occurrences per interned id: each `sent2` once, each ending once.
    counts: Vec<usize>,
    /// Contexts whose texts hold each interned id, and the last context that counted it.
    contexts_seen: Vec<usize>,
    last_context: Vec<usize>,
    contexts: Vec<EncodedContext>,
    excluded: usize,
    set_aside_by_review: usize,
}

/// One option after tokenising: words of the ending (after the cut at `max_tokens`), its
/// relations to the context, and with text, the whole sequence's tokens and UPOS tag positions.
struct Tokenised {
    n_words: usize,
    relations: [f64; CONTEXT_RELATIONS.len()],
    tokens: Vec<String>,
    tags: Vec<u32>,
    subwords: Vec<u32>,
}

/// One option's tokens (`sent2` then the ending, capped at `max_tokens`), their POS tags and
/// the ending's subword buckets; without text only the ending's word count.
fn tokenise_option(
    sent2: &[String],
    context: &ContextWords,
    ending: &str,
    cfg: &EncodeConfig,
    with_text: bool,
    tagger: &afkit_engine::text::Tagger,
) -> Tokenised {
    // Without text only the ending's length is needed: count its tokens without making strings
    // of them (this runs for every pool ending).
    let ending_tokens = afkit_engine::text::token_spans(ending).len();
    let n_words = (sent2.len() + ending_tokens)
        .min(cfg.max_tokens)
        .saturating_sub(sent2.len());
    let relations = context.relations(&content_words(ending));
    if !with_text {
        return Tokenised {
            n_words,
            relations,
            tokens: Vec::new(),
            tags: Vec::new(),
            subwords: Vec::new(),
        };
    }
    let tokens: Vec<String> = sent2
        .iter()
        .cloned()
        .chain(afkit_engine::text::tokenize(ending))
        .take(cfg.max_tokens)
        .collect();
    // Tagging sees the option's whole second sentence.
    let tags = tagger
        .tag(&tokens)
        .iter()
        .map(|t| upos_index(t.as_str()))
        .collect();
    Tokenised {
        n_words,
        relations,
        tokens,
        tags,
        subwords: subword_ids(ending, cfg.subword_buckets),
    }
}

impl Builder {
    fn new(cfg: EncodeConfig, with_text: bool, scorers: &[String]) -> Builder {
        Builder {
            cfg,
            with_text,
            tagger: afkit_engine::text::Tagger::shipped(),
            sentence_dim: 0,
            scorers: scorers.to_vec(),
            interned: HashMap::new(),
            counts: Vec::new(),
            contexts_seen: Vec::new(),
            last_context: Vec::new(),
            contexts: Vec::new(),
            excluded: 0,
            set_aside_by_review: 0,
        }
    }

    fn add(&mut self, mut chunk: Vec<PoolContext>) -> Result<()> {
        let (cfg, with_text, tagger) = (self.cfg, self.with_text, self.tagger);
        let tokenised: Vec<(Vec<String>, Vec<Tokenised>)> = chunk
            .par_iter()
            .map(|c| {
                let sent2 = afkit_engine::text::tokenize(&c.sent2);
                let context = ContextWords::new(&c.sent1, &c.sent2);
                let options = std::iter::once(&c.gold)
                    .chain(&c.candidates)
                    .map(|ending| {
                        tokenise_option(&sent2, &context, &ending.text, &cfg, with_text, tagger)
                    })
                    .collect();
                (sent2, options)
            })
            .collect();
        let mut sentences = self.sentence_vectors(&mut chunk)?.into_iter();
        let mut scored = self.scorer_features(&chunk)?.into_iter();
        for (c, (sent2, options)) in chunk.iter().zip(tokenised) {
            if with_text {
                for t in &sent2 {
                    let id = self.intern(t);
                    self.count(id);
                }
            }
            let mut encoded = std::iter::once(&c.gold)
                .chain(&c.candidates)
                .zip(options)
                .map(|(ending, option)| {
                    let words: Box<[u32]> = if with_text {
                        let ids: Vec<u32> = option.tokens.iter().map(|t| self.intern(t)).collect();
                        for &id in &ids[sent2.len().min(ids.len())..] {
                            self.count(id);
                        }
                        ids.into()
                    } else {
                        Box::default()
                    };
                    EncodedEnding {
                        ending_id: ending.id,
                        mlp: raw_features(mlp_inputs(c, ending, &option)),
                        scorer: scored.next().unwrap_or_default(),
                        words,
                        lstm: option.tags.into(),
                        subwords: option.subwords.into(),
                        sentence: sentences.next().unwrap_or_default().into(),
                    }
                });
            let gold = encoded.next().expect("the gold ending comes first");
            let candidates = encoded.collect();
            self.contexts.push(EncodedContext {
                example_id: c.example_id,
                group: c.group.clone(),
                n_sent2: sent2.len().min(cfg.max_tokens),
                gold,
                candidates,
            });
        }
        Ok(())
    }

    /// Whether the options get sentence vectors: with text and the sentence model on.
    fn reads_sentence_vectors(&self) -> bool {
        self.with_text && self.cfg.sentence_vectors
    }

    /// The stored sentence vectors of every option of the chunk, in option order (none without
    /// the sentence model).
    fn sentence_vectors(&mut self, chunk: &mut [PoolContext]) -> Result<Vec<Vec<f32>>> {
        if !self.reads_sentence_vectors() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for e in chunk
            .iter_mut()
            .flat_map(|c| std::iter::once(&mut c.gold).chain(&mut c.candidates))
        {
            let Some(v) = e.sentence.take() else {
                bail!(
                    "ending {} has no sentence vector (embed the pools first)",
                    e.id
                );
            };
            if self.sentence_dim == 0 {
                self.sentence_dim = v.len();
            } else if v.len() != self.sentence_dim {
                bail!(
                    "ending {} has a {}-d sentence vector, others {}-d",
                    e.id,
                    v.len(),
                    self.sentence_dim
                );
            }
            out.push(v);
        }
        Ok(out)
    }

    /// The scorer features of every option of the chunk, in option order (none without
    /// scorers).
    fn scorer_features(&self, chunk: &[PoolContext]) -> Result<Vec<Box<[f32]>>> {
        if self.scorers.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for e in chunk
            .iter()
            .flat_map(|c| std::iter::once(&c.gold).chain(&c.candidates))
        {
            let mut features = Vec::with_capacity(SCORER_FEATURES * self.scorers.len());
            for (key, score) in self.scorers.iter().zip(&e.scores) {
                let Some(score) = score else {
                    bail!(
                        "ending {} has no score from scorer model {key} (score the pools first)",
                        e.id
                    );
                };
                features.extend(
                    scorer_features(score, &e.text).map(|v| v.map_or(f32::NAN, |v| v as f32)),
                );
            }
            out.push(features.into());
        }
        Ok(out)
    }

    fn intern(&mut self, token: &str) -> u32 {
        if let Some(&id) = self.interned.get(token) {
            return id;
        }
        let id = self.counts.len() as u32;
        self.interned.insert(token.to_string(), id);
        self.counts.push(0);
        self.contexts_seen.push(0);
        self.last_context.push(usize::MAX);
        id
    }

    /// One more occurrence of interned `id` in the texts of the context being added.
    fn count(&mut self, id: u32) {
        let (id, context) = (id as usize, self.contexts.len());
        self.counts[id] += 1;
        if self.last_context[id] != context {
            self.last_context[id] = context;
            self.contexts_seen[id] += 1;
        }
    }

    /// The dataset: features standardised, every token renumbered into the vocabularies.
    fn finish(mut self) -> Dataset {
        let alone_inputs = drop_partial_inputs(&mut self.contexts, mlp_of, &ALONE_FEATURES);
        let scorer_alone_dropped =
            drop_partial_scorer_alone(&mut self.contexts, self.scorers.len());
        standardise(&mut self.contexts);
        let renumbering = self.renumbering();
        renumbering.apply(&mut self.contexts);
        Dataset {
            contexts: self.contexts,
            vocab_size: renumbering.vocab_size,
            lstm_vocab_size: renumbering.tag_base as usize + UPOS_TAGS.len(),
            with_text: self.with_text,
            subword_buckets: if self.with_text {
                self.cfg.subword_buckets
            } else {
                0
            },
            sentence_dim: self.sentence_dim,
            scorer_features: SCORER_FEATURES * self.scorers.len(),
            excluded: self.excluded,
            set_aside_by_review: self.set_aside_by_review,
            alone_inputs,
            scorer_alone_dropped,
        }
    }

    /// The vocabularies, by frequency (ties in text order): the word models' words of at least
    /// `min_count` occurrences in enough contexts, the BiLSTM's `lstm_top_words` words.
    fn renumbering(&self) -> Renumbering {
        let mut by_frequency: Vec<(&str, u32)> = self
            .interned
            .iter()
            .map(|(w, id)| (w.as_str(), *id))
            .collect();
        let counts = &self.counts;
        by_frequency.sort_by(|a, b| {
            counts[b.1 as usize]
                .cmp(&counts[a.1 as usize])
                .then(a.0.cmp(b.0))
        });
        // The context rule needs three times as many contexts as it asks of a word: below that
        // it left the word models a few dozen words (23 on the 40-context sample) and the
        // sample's audit fell further under chance than without it.
        let min_contexts = if self.contexts.len() >= 3 * self.cfg.min_contexts {
            self.cfg.min_contexts
        } else {
            1
        };
        let frequent: Vec<u32> = by_frequency
            .iter()
            .map(|(_, id)| *id)
            .filter(|&id| {
                counts[id as usize] >= self.cfg.min_count
                    && self.contexts_seen[id as usize] >= min_contexts
            })
            .collect();
        let mut word_id = vec![UNK; counts.len()];
        let mut lstm_id: Vec<Option<u32>> = vec![None; counts.len()];
        for (rank, id) in frequent.iter().enumerate() {
            word_id[*id as usize] = rank as u32 + 2;
        }
        for (rank, (_, id)) in by_frequency
            .iter()
            .take(self.cfg.lstm_top_words)
            .enumerate()
        {
            lstm_id[*id as usize] = Some(rank as u32 + 2);
        }
        Renumbering {
            word_id,
            lstm_id,
            vocab_size: frequent.len() + 2,
            tag_base: by_frequency.len().min(self.cfg.lstm_top_words) as u32 + 2,
        }
    }
}

/// Interned id → vocabulary id (UNK below `min_count` or `min_contexts`) and → BiLSTM id
/// (`None`: the BiLSTM reads the token's tag, numbered from `tag_base`).
struct Renumbering {
    word_id: Vec<u32>,
    lstm_id: Vec<Option<u32>>,
    /// The word models' vocabulary, padding and UNK included.
    vocab_size: usize,
    tag_base: u32,
}

impl Renumbering {
    /// Replaces every ending's interned ids by its word ids, and its tags by its BiLSTM ids.
    fn apply(&self, contexts: &mut [EncodedContext]) {
        contexts.par_iter_mut().for_each(|c| {
            for e in std::iter::once(&mut c.gold).chain(c.candidates.iter_mut()) {
                for (word, tag) in e.words.iter_mut().zip(e.lstm.iter_mut()) {
                    let interned = *word as usize;
                    *tag = self.lstm_id[interned].unwrap_or(if (*tag as usize) < UPOS_TAGS.len() {
                        self.tag_base + *tag
                    } else {
                        UNK
                    });
                    *word = self.word_id[interned];
                }
            }
        });
    }
}

/// Embeds every pool ending (found and generated) that has no stored sentence vector yet, a
/// batch at a time, each batch committed: an interrupted run keeps what it embedded. With
/// `cache_dir`, the shared embedding cache there gives the vectors it holds and keeps the new
/// ones. `progress` hears (embedded or read so far, total missing).
pub(crate) fn store_sentence_vectors(
    store: &mut Store,
    cache_dir: Option<&Path>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<()> {
    const BATCH: usize = 1024;
    let missing = store.count_endings_without_sentence_vector(ENCODER)?;
    if missing == 0 {
        return Ok(());
    }
    let encoder = SentenceEncoder::load_default()?;
    let mut cache = cache_dir.map(VectorCache::open_in).transpose()?;
    let mut done = 0;
    progress(done, missing);
    loop {
        afkit_engine::interrupt::check()?;
        let batch = store.endings_without_sentence_vector(ENCODER, BATCH)?;
        if batch.is_empty() {
            break;
        }
        let texts: Vec<&str> = batch.iter().map(|(_, t)| t.as_str()).collect();
        let vectors = encoder.encode_cached(
            &texts,
            cache.as_mut().map(|c| c as &mut dyn VectorStore),
            |n| {
                done += n;
                progress(done, missing)
            },
        )?;
        let rows: Vec<(i64, Vec<f32>)> = batch.iter().map(|(id, _)| *id).zip(vectors).collect();
        store.put_sentence_vectors(ENCODER, &rows)?;
    }
    Ok(())
}

/// The subword model's ids of an ending: its hashed character n-grams folded into `buckets`
/// (1-based; 0 pads). None when the model is off.
fn subword_ids(ending: &str, buckets: usize) -> Vec<u32> {
    if buckets == 0 {
        return Vec::new();
    }
    char_gram_hashes(ending)
        .into_iter()
        .map(|h| (h % buckets as u64) as u32 + 1)
        .collect()
}

/// Position of a tag in [`UPOS_TAGS`] (`UPOS_TAGS.len()` for a tag outside them).
fn upos_index(tag: &str) -> u32 {
    UPOS_TAGS
        .iter()
        .position(|t| *t == tag)
        .unwrap_or(UPOS_TAGS.len()) as u32
}

/// An option's raw MLP inputs: its [`lm_features`], then its context relations.
fn mlp_inputs(
    ctx: &PoolContext,
    ending: &PoolEnding,
    option: &Tokenised,
) -> [Option<f64>; MLP_FEATURES] {
    let lm = lm_features(ctx, ending, option.n_words);
    std::array::from_fn(|i| match i.checked_sub(LM_FEATURES) {
        None => lm[i],
        Some(r) => Some(option.relations[r]),
    })
}

/// Raw features as f32, NaN where missing, until [`standardise`] replaces them.
fn raw_features(raw: [Option<f64>; MLP_FEATURES]) -> [f32; MLP_FEATURES] {
    raw.map(|v| v.map_or(f32::NAN, |v| v as f32))
}

/// The MLP's raw inputs for one option (SWAG §3.4: "LM perplexity features and context/ending
/// lengths"): ending log-prob given the context, alone, their difference, final punctuation
/// log-prob, whether that is missing, ending length in LM tokens and in words, context log-prob,
/// `sent1` and `sent2` lengths in LM tokens.
fn lm_features(
    ctx: &PoolContext,
    ending: &PoolEnding,
    n_words: usize,
) -> [Option<f64>; LM_FEATURES] {
    let diff = match (ending.lp_cond, ending.lp_alone) {
        (Some(c), Some(a)) => Some(c - a),
        _ => None,
    };
    [
        ending.lp_cond,
        ending.lp_alone,
        diff,
        ending.lp_final_punct,
        Some(f64::from(u8::from(ending.lp_final_punct.is_none()))),
        ending.n_tok_ending.map(|n| n as f64),
        Some(n_words as f64),
        ctx.ctx_logprob,
        ctx.n_tok_sent1.map(|n| n as f64),
        ctx.n_tok_sent2.map(|n| n as f64),
    ]
}

/// The MLP inputs computed from the generator's ending-alone pass ([`lm_features`]: `lp_alone`
/// and `lp_cond - lp_alone`), which only pools generated with `--alone-scores` have.
const ALONE_FEATURES: [usize; 2] = [1, 2];

/// Which options of a run carry a group of ending-alone inputs (the generator's, or a scorer's
/// stored by an earlier afkit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AloneInputs {
    /// Every option: the MLP reads them.
    All,
    /// No option (pools generated without `--alone-scores`; scorer readings made now).
    None,
    /// Some options only: left out for every option.
    Dropped,
}

/// Makes the inputs at `columns` of `features` missing for every option when some options have
/// them and others do not (pools generated with and without the ending-alone pass, or grown
/// without it; readings stored by an earlier scorer beside new ones). A missing value is
/// standardised to the mean, so its absence beside present values would tell the MLP which
/// endings came from which run: a grown candidate from its pool's found ending.
fn drop_partial_inputs(
    contexts: &mut [EncodedContext],
    features: fn(&mut EncodedEnding) -> &mut [f32],
    columns: &[usize],
) -> AloneInputs {
    let (mut present, mut missing) = (false, false);
    for_each_option(contexts, features, |values| {
        let absent = values[columns[0]].is_nan();
        present |= !absent;
        missing |= absent;
    });
    match (present, missing) {
        (_, false) => return AloneInputs::All,
        (false, true) => return AloneInputs::None,
        (true, true) => {}
    }
    for c in contexts {
        for e in std::iter::once(&mut c.gold).chain(c.candidates.iter_mut()) {
            let values = features(e);
            for &f in columns {
                values[f] = f32::NAN;
            }
        }
    }
    AloneInputs::Dropped
}

/// [`drop_partial_inputs`] for each of `scorers` scorer models' inputs from the reading alone;
/// whether any was left out.
fn drop_partial_scorer_alone(contexts: &mut [EncodedContext], scorers: usize) -> bool {
    let inputs: Vec<AloneInputs> = (0..scorers)
        .map(|k| {
            let columns = SCORER_ALONE_FEATURES.map(|f| k * SCORER_FEATURES + f);
            drop_partial_inputs(contexts, scorer_of, &columns)
        })
        .collect();
    inputs.contains(&AloneInputs::Dropped)
}

/// Zero mean, unit variance per feature over every option of the run, in place; a missing
/// value (NaN) becomes the mean (0) and a constant feature becomes 0. Two passes in f64. The MLP
/// inputs and the scorer features are standardised alike, each feature on its own.
fn standardise(contexts: &mut [EncodedContext]) {
    standardise_features(contexts, MLP_FEATURES, mlp_of);
    let scorer_width = contexts.first().map_or(0, |c| c.gold.scorer.len());
    standardise_features(contexts, scorer_width, scorer_of);
}

fn mlp_of(e: &mut EncodedEnding) -> &mut [f32] {
    &mut e.mlp
}

fn scorer_of(e: &mut EncodedEnding) -> &mut [f32] {
    &mut e.scorer
}

fn standardise_features(
    contexts: &mut [EncodedContext],
    width: usize,
    features: fn(&mut EncodedEnding) -> &mut [f32],
) {
    if width == 0 {
        return;
    }
    let mut sum = vec![0.0f64; width];
    let mut n = vec![0usize; width];
    for_each_option(contexts, features, |values| {
        for (f, &v) in values.iter().enumerate() {
            if !v.is_nan() {
                sum[f] += f64::from(v);
                n[f] += 1;
            }
        }
    });
    let mean: Vec<f64> = (0..width)
        .map(|f| if n[f] > 0 { sum[f] / n[f] as f64 } else { 0.0 })
        .collect();
    let mut squares = vec![0.0f64; width];
    for_each_option(contexts, features, |values| {
        for (f, &v) in values.iter().enumerate() {
            if !v.is_nan() {
                squares[f] += (f64::from(v) - mean[f]).powi(2);
            }
        }
    });
    let std: Vec<f64> = (0..width)
        .map(|f| {
            let var = if n[f] > 0 {
                squares[f] / n[f] as f64
            } else {
                0.0
            };
            if var > 1e-12 {
                var.sqrt()
            } else {
                1.0
            }
        })
        .collect();
    contexts.par_iter_mut().for_each(|c| {
        for e in std::iter::once(&mut c.gold).chain(c.candidates.iter_mut()) {
            for (f, v) in features(e).iter_mut().enumerate() {
                *v = if v.is_nan() {
                    0.0
                } else {
                    ((f64::from(*v) - mean[f]) / std[f]) as f32
                };
            }
        }
    });
}

fn for_each_option(
    contexts: &mut [EncodedContext],
    features: fn(&mut EncodedEnding) -> &mut [f32],
    mut visit: impl FnMut(&[f32]),
) {
    for c in contexts {
        for e in std::iter::once(&mut c.gold).chain(c.candidates.iter_mut()) {
            visit(features(e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn option(mlp: [f32; MLP_FEATURES]) -> EncodedEnding {
        EncodedEnding {
            ending_id: 0,
            mlp,
            scorer: Box::default(),
            words: Box::default(),
            lstm: Box::default(),
            subwords: Box::default(),
            sentence: Box::default(),
        }
    }

    /// A pool grown without the ending-alone pass beside one that had it: the found ending has
    /// `lp_alone`, the grown candidate not; the inputs go constant for every option, so nothing
    /// tells them apart, while a run where every option has them keeps them.
    #[test]
    fn ending_alone_inputs_some_options_lack_are_dropped_for_all() {
        let context = |gold: f32, candidate: f32| {
            let mut values = [[0.5f32; MLP_FEATURES], [0.25f32; MLP_FEATURES]];
            values[0][ALONE_FEATURES[0]] = gold;
            values[1][ALONE_FEATURES[0]] = candidate;
            EncodedContext {
                example_id: 1,
                group: "v".into(),
                n_sent2: 0,
                gold: option(values[0]),
                candidates: vec![option(values[1])],
            }
        };
        let alone = |contexts: &[EncodedContext]| -> Vec<f32> {
            let c = &contexts[0];
            [&c.gold, &c.candidates[0]]
                .iter()
                .flat_map(|e| ALONE_FEATURES.map(|f| e.mlp[f]))
                .collect()
        };
        let drop_alone = |contexts: &mut [EncodedContext]| {
            drop_partial_inputs(contexts, mlp_of, &ALONE_FEATURES)
        };
        let mut complete = vec![context(-1.0, -2.0)];
        assert_eq!(drop_alone(&mut complete), AloneInputs::All);
        standardise(&mut complete);
        assert!(alone(&complete).iter().any(|&v| v != 0.0));

        let mut mixed = vec![context(-1.0, f32::NAN)];
        assert_eq!(drop_alone(&mut mixed), AloneInputs::Dropped);
        standardise(&mut mixed);
        assert_eq!(alone(&mixed), vec![0.0; 4]);
        // The other inputs are untouched.
        assert_ne!(mixed[0].gold.mlp[0], mixed[0].candidates[0].mlp[0]);
        let mut without = vec![context(f32::NAN, f32::NAN)];
        assert_eq!(drop_alone(&mut without), AloneInputs::None);
    }

    /// Two scorers: the first read every option alone as well (an earlier afkit), the second
    /// only some (a pool grown since). Only the second's alone inputs are left out.
    #[test]
    fn a_scorers_alone_inputs_some_options_lack_are_dropped_for_all() {
        let scorer_option = |second_alone: f32| {
            let mut e = option([0.0; MLP_FEATURES]);
            let mut values = vec![-1.0f32; 2 * SCORER_FEATURES];
            for f in SCORER_ALONE_FEATURES {
                values[SCORER_FEATURES + f] = second_alone;
            }
            e.scorer = values.into();
            e
        };
        let mut contexts = vec![EncodedContext {
            example_id: 1,
            group: "v".into(),
            n_sent2: 0,
            gold: scorer_option(-2.0),
            candidates: vec![scorer_option(f32::NAN)],
        }];
        assert!(drop_partial_scorer_alone(&mut contexts, 2));
        for e in [&contexts[0].gold, &contexts[0].candidates[0]] {
            for f in 0..SCORER_FEATURES {
                let second_alone = SCORER_ALONE_FEATURES.contains(&f);
                assert_eq!(e.scorer[f], -1.0, "first scorer, feature {f}");
                assert_eq!(
                    e.scorer[SCORER_FEATURES + f].is_nan(),
                    second_alone,
                    "second scorer, feature {f}"
                );
            }
        }
        assert!(!drop_partial_scorer_alone(&mut contexts, 2));
    }

    #[test]
    fn the_mlp_reads_how_each_ending_relates_to_its_context() {
        let ending = |id, text: &str| PoolEnding {
            id,
            text: text.into(),
            ..PoolEnding::default()
        };
        let context = PoolContext {
            example_id: 1,
            group: "v".into(),
            sent1: "A man throws a red ball over a fence.".into(),
            sent2: "The dog".into(),
            ctx_logprob: None,
            n_tok_sent1: None,
            n_tok_sent2: None,
            gold: ending(1, "catches the red ball."),
            candidates: vec![ending(2, "sings an opera on stage.")],
        };
        let tagger = afkit_engine::text::Tagger::shipped();
        let cfg = EncodeConfig::default();
        let words = ContextWords::new(&context.sent1, &context.sent2);
        let inputs: Vec<[Option<f64>; MLP_FEATURES]> = [&context.gold, &context.candidates[0]]
            .iter()
            .map(|e| {
                let option = tokenise_option(&[], &words, &e.text, &cfg, false, tagger);
                mlp_inputs(&context, e, &option)
            })
            .collect();
        let sent1_share = LM_FEATURES;
        assert_eq!(inputs[0][sent1_share], Some(0.5), "red, ball of four words");
        assert_eq!(inputs[1][sent1_share], Some(0.0));
        let novelty = LM_FEATURES + 2;
        assert_eq!(inputs[1][novelty], Some(1.0));
        // Missing LM scores stay missing for standardising to impute.
        assert_eq!(inputs[0][0], None);
    }

    #[test]
    fn min_contexts_sends_words_of_too_few_contexts_to_unk_however_often_they_occur() {
        let ending = |id, text: &str| PoolEnding {
            id,
            text: text.into(),
            ..PoolEnding::default()
        };
        // "zebra" fills one context's pool; "walks" appears once in each of two contexts.
        let context = |id: i64, endings: [&str; 3]| PoolContext {
            example_id: id,
            group: format!("v{id}"),
            sent1: "Someone stands in a field.".into(),
            sent2: "It".into(),
            ctx_logprob: None,
            n_tok_sent1: None,
            n_tok_sent2: None,
            gold: ending(id * 10, endings[0]),
            candidates: vec![
                ending(id * 10 + 1, endings[1]),
                ending(id * 10 + 2, endings[2]),
            ],
        };
        // Six contexts: enough for a rule asking two (the rule needs three times as many).
        let mut chunk = vec![
            context(1, ["walks.", "zebra zebra.", "zebra."]),
            context(2, ["walks.", "runs.", "runs."]),
        ];
        chunk.extend((3..=6).map(|id| context(id, ["sits.", "sits.", "sits."])));
        let vocabulary = |min_contexts| {
            let cfg = EncodeConfig {
                min_contexts,
                sentence_vectors: false,
                ..EncodeConfig::default()
            };
            let mut builder = Builder::new(cfg, true, &[]);
            builder.add(chunk.clone()).unwrap();
            let data = builder.finish();
            // The id of the ending's first word (after "It").
            let first_word = |c: usize, option: usize| {
                let c = &data.contexts[c];
                let e = if option == 0 {
                    &c.gold
                } else {
                    &c.candidates[option - 1]
                };
                e.words[c.n_sent2]
            };
            (first_word(0, 0), first_word(0, 1), first_word(1, 1))
        };
        let (walks, zebra, runs) = vocabulary(1);
        assert!(walks != UNK && zebra != UNK && runs != UNK);
        let (walks, zebra, runs) = vocabulary(2);
        assert_ne!(walks, UNK, "two contexts");
        assert_eq!(zebra, UNK, "three times, but in one context");
        assert_eq!(runs, UNK);
        // Asking three contexts of a word needs nine contexts: with six the rule is off.
        let (_, zebra, runs) = vocabulary(3);
        assert!(zebra != UNK && runs != UNK);
    }

    #[test]
    fn standardise_centres_scales_and_imputes_the_mean() {
        let mut first = [1.0; MLP_FEATURES];
        let mut second = [3.0; MLP_FEATURES];
        second[0] = f32::NAN;
        first[2] = 5.0;
        let mut contexts = vec![EncodedContext {
            example_id: 1,
            group: "v".into(),
            n_sent2: 0,
            gold: option(first),
            candidates: vec![option(second)],
        }];
        standardise(&mut contexts);
        let (a, b) = (contexts[0].gold.mlp, contexts[0].candidates[0].mlp);
        assert_eq!(b[0], 0.0, "missing → mean");
        assert_eq!(a[1], -1.0);
        assert_eq!(b[1], 1.0);
        assert_eq!(a[0], 0.0, "a constant feature carries no signal");
    }
}
