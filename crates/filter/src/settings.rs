//! The parts a run's [`crate::Config`] is made of, each with `filter`'s defaults: how texts
//! are encoded ([`EncodeConfig`]), how the stylistic models are sized and trained
//! ([`ModelConfig`], [`TrainConfig`]), the fine-tuned adversary ([`DiscriminatorConfig`]), which
//! candidate replaces an easy negative ([`Replacement`]), when a phase stops ([`Convergence`])
//! and the scorer models whose readings join the MLP's features ([`Scorer`]). They are recorded
//! with the run; the code they set lives in `data`, `model`, `train`, `discriminator`,
//! `algorithm` and `scorer`.

use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;

use afkit_engine::device::Compute;
use afkit_engine::embed::cross_encoder::{self, Shape};

/// How a run's texts become the models' inputs: the vocabulary's thresholds and which text
/// models get inputs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct EncodeConfig {
    /// Tokens seen fewer times than this in the run's texts map to UNK.
    pub min_count: usize,
    /// Tokens seen in the texts of fewer contexts than this map to UNK: an embedding learnt from
    /// a few contexts' real endings makes AF pick distractors that imitate those endings
    /// (BENCHMARKS.md, "Words need twenty contexts"). Applied only to runs of at least three
    /// times as many contexts.
    #[serde(skip_serializing_if = "is_one")]
    pub min_contexts: usize,
    /// Words kept by the BiLSTM; the rest become their UPOS tag.
    pub lstm_top_words: usize,
    /// Longest token sequence (`sent2 + ending`) fed to the text models; the rest is cut.
    pub max_tokens: usize,
    /// Hash buckets of the subword model's character n-grams; 0 leaves the model out.
    pub subword_buckets: usize,
    /// Give the sentence model MiniLM embeddings of every `sent2 + ending`.
    pub sentence_vectors: bool,
}

/// `min_contexts` of the vocabulary before the rule existed, left out of the recorded settings so
/// that runs recorded then still match the settings they ran with.
fn is_one(n: &usize) -> bool {
    *n == 1
}

impl Default for EncodeConfig {
    fn default() -> Self {
        EncodeConfig {
            min_count: 2,
            min_contexts: 20,
            lstm_top_words: 100,
            max_tokens: 64,
            subword_buckets: 1 << 14,
            sentence_vectors: true,
        }
    }
}

/// Layer sizes of the stylistic models.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ModelConfig {
    pub word_dim: usize,
    pub indicator_dim: usize,
    pub mlp_hidden: usize,
    pub cnn_filters: usize,
    pub lstm_hidden: usize,
    pub ensemble_hidden: usize,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            word_dim: 64,
            indicator_dim: 8,
            mlp_hidden: 64,
            cnn_filters: 32,
            lstm_hidden: 32,
            ensemble_hidden: 64,
        }
    }
}

/// Optimisation settings of one training run.
#[derive(Debug, Clone, Serialize)]
pub struct TrainConfig {
    /// Passes over the training contexts in MLP-only iterations.
    pub mlp_epochs: usize,
    /// Passes over the training contexts in ensemble iterations and the final pass.
    pub ensemble_epochs: usize,
    /// Contexts per optimisation step (each brings k+1 rows).
    pub batch_contexts: usize,
    pub learning_rate: f64,
    pub weight_decay: f64,
    /// Gradients are rescaled when their global L2 norm exceeds this.
    pub clip_norm: f64,
    pub model: ModelConfig,
    /// Where training and scoring run. Not a setting of the run's results (they agree across
    /// devices up to rounding), so it is not stored with them and a run may resume elsewhere.
    #[serde(skip)]
    pub compute: Compute,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            mlp_epochs: 10,
            ensemble_epochs: 4,
            batch_contexts: 32,
            learning_rate: 3e-3,
            weight_decay: 0.01,
            clip_norm: 5.0,
            model: ModelConfig::default(),
            compute: Compute::cpu(),
        }
    }
}

/// The fine-tuned adversary's settings (recorded with the run).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DiscriminatorConfig {
    /// A BERT-style model folder (`config.json`, `tokenizer.json`, `model.safetensors`) to
    /// fine-tune instead of the shipped MiniLM sentence encoder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<PathBuf>,
    /// Word pieces per option (context and ending), as in the audit's `finetune_minilm`.
    pub max_len: usize,
    /// The lowest encoder layers kept as the sentence model trained them.
    pub frozen_layers: usize,
    /// Passes over the training contexts each time it trains.
    pub epochs: usize,
    /// Negatives beside the real ending in a training question, drawn from the context's
    /// assigned ones: 3 poses the four-way question the benchmark asks.
    pub negatives: usize,
    /// Questions per optimiser step.
    pub batch: usize,
    pub learning_rate: f64,
}

impl Default for DiscriminatorConfig {
    fn default() -> Self {
        let shape = Shape::default();
        let train = cross_encoder::FineTuning::default();
        DiscriminatorConfig {
            model: None,
            max_len: shape.max_len,
            frozen_layers: shape.frozen_layers,
            epochs: 1,
            negatives: 3,
            batch: train.batch,
            learning_rate: train.learning_rate,
        }
    }
}

/// AF wants negatives its models cannot tell from the real ending, not negatives they prefer to
/// it. Taking the highest-scoring candidate every time pushes the assigned negatives past the
/// gold, and on a small project, where the held-out models are noisy, the audit's classifiers
/// then learn to avoid what AF favoured and pick the real ending *less* often than chance. Taking
/// the candidate nearest the gold brings the word n-gram baselines back to chance, but leaves
/// the character n-grams low and lets the language models find the real ending more often
/// (BENCHMARKS.md, "Replacing towards the gold"), so it is not the default.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Replacement {
    /// The highest-scoring candidate (SWAG's rule; the default).
    #[default]
    Highest,
    /// The candidate whose score is nearest the gold's: negatives as likely as the real ending
    /// to the models, no more.
    NearestGold,
}

/// The convergence rule of a phase: it stops once its last `patience` iterations were each
/// *quiet* — fewer swaps than 1% of the held-out contexts, or the held-out accuracy of the
/// models the phase goes by within two standard errors of chance, 1/(k+1) +
/// 2·sqrt(c(1−c)/n_test) (which models: `run/phases.rs`) — but never
/// before `min_iterations`. Each iteration holds out a fifth of the contexts, so five
/// iterations give every context about one turn ([`crate::HeldOutTurns`]); on a small project the held-out accuracy
/// is near chance from the start (its models train on a few dozen contexts), and without the
/// floor AF stopped after two iterations having filtered a third of the contexts.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Convergence {
    pub patience: usize,
    pub min_iterations: usize,
    pub min_swap_fraction: f64,
    pub chance_standard_errors: f64,
}

impl Default for Convergence {
    fn default() -> Self {
        Convergence {
            patience: 2,
            min_iterations: 5,
            min_swap_fraction: 0.01,
            chance_standard_errors: 2.0,
        }
    }
}

/// A scorer model of a run: the name the user gave and the SHA-256 of its GGUF file, which keys
/// its stored scores (both recorded with the run).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Scorer {
    pub name: String,
    pub sha256: String,
    /// Not recorded: the same file may live elsewhere when a run resumes.
    #[serde(skip)]
    pub path: PathBuf,
}

/// The scorer `filter` reads every ending with unless told otherwise: the default generator.
/// Its reading of each ending after its context keeps AF from settling on distractors that sit
/// oddly after their context: filtered without it, the fine-tuned cross-encoder of the audit
/// found the real ending more often on held-out captions (BENCHMARKS.md, "Filtering without the
/// scorer model").
pub const DEFAULT_SCORER: &str = "smollm2";

impl Scorer {
    /// The scorer in the GGUF file at `path`, hashed once.
    pub fn open(name: &str, path: PathBuf) -> Result<Scorer> {
        Ok(Scorer {
            name: name.to_string(),
            sha256: afkit_engine::models::sha256_file(&path)?,
            path,
        })
    }
}
