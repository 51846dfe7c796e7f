//! Adversarial Filtering (SWAG Algorithm 1) with the stylistic ensemble.
//!
//! Data flow: `Store::for_each_pool_context` (contexts with complete pools, streamed) →
//! [`data::Dataset`] (standardised LM features; tokens, tags and vocabularies when the run has an
//! ensemble phase) → per iteration
//! [`run`]: split, [`train::train`] a fresh [`model::StylisticModel`], score the held-out pools,
//! [`algorithm::choose_swaps`], commit → final cross-fitted pass → `af_folds`, `af_scores`.
//! [`report`] reads the stored iterations back for the plot, the markdown and the JSON.

pub mod algorithm;
pub mod bilstm;
pub mod data;
pub mod model;
pub mod report;
pub mod run;
pub mod train;
pub mod windows;

use std::path::PathBuf;

use anyhow::Result;

#[derive(clap::Args)]
pub struct FilterArgs {
    /// The project file.
    pub project: PathBuf,
    /// Negatives assigned per context during AF (contexts whose pool is smaller are left out).
    #[arg(long, default_value_t = 9)]
    pub k: usize,
    /// Cap on the cheap MLP-only iterations that run first (SWAG: 100 on GPUs) [default: 20].
    #[arg(long)]
    pub mlp_iterations: Option<usize>,
    /// Cap on the full-ensemble iterations (SWAG: 50). The phase stops earlier once it has
    /// converged: 2 iterations in a row with swaps below 1% of the held-out contexts or ensemble
    /// accuracy within two standard errors of chance [default: 10]. 0 runs MLP-only AF (for
    /// projects too big for the text models on this machine): the final cross-fitted pass then
    /// scores with the MLP, and the pools' texts are never loaded.
    #[arg(long)]
    pub ensemble_iterations: Option<usize>,
    /// Seed for splits, initial assignment, model initialisation and batch order (recorded).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Easy negatives replaced per held-out context and iteration (SWAG: N_easy = 2).
    #[arg(long, default_value_t = 2)]
    pub n_easy: usize,
    /// Start a new run even though the latest one is unfinished or finished on the same pools.
    #[arg(long)]
    pub new_run: bool,
    /// Training passes over the training contexts in an MLP-only iteration.
    #[arg(long, default_value_t = 10)]
    pub mlp_epochs: usize,
    /// Training passes in an ensemble iteration and in each fold of the final pass.
    #[arg(long, default_value_t = 4)]
    pub ensemble_epochs: usize,
    /// Contexts per optimisation step.
    #[arg(long, default_value_t = 32)]
    pub batch_contexts: usize,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 3e-3)]
    pub learning_rate: f64,
    /// Word-embedding size of the bag-of-words, CNN and BiLSTM models.
    #[arg(long, default_value_t = 64)]
    pub word_dim: usize,
    /// Hidden size of the MLP and the ensemble; the CNN uses half as many filters per width and
    /// the BiLSTM half as many units per direction.
    #[arg(long, default_value_t = 64)]
    pub hidden: usize,
    /// Words seen fewer times than this in the project's texts share the UNK embedding.
    #[arg(long, default_value_t = 2)]
    pub min_count: usize,
    /// Leave the subword model (hashed character n-grams of the ending) out of the ensemble.
    #[arg(long)]
    pub no_subword_model: bool,
    /// Leave the sentence model (MiniLM embedding of sent2 + ending) out of the ensemble; it
    /// needs the MiniLM model (`afkit models fetch`) and embeds every pool ending once per run.
    #[arg(long)]
    pub no_sentence_model: bool,
    /// Folds of the final cross-fitted scoring pass.
    #[arg(long, default_value_t = 5)]
    pub folds: usize,
    #[command(flatten)]
    pub device: crate::device::DeviceArgs,
}

/// Default caps, scaled for a two-core CPU (see BENCHMARKS.md, "Filter").
pub const DEFAULT_MLP_ITERATIONS: usize = 20;
pub const DEFAULT_ENSEMBLE_ITERATIONS: usize = 10;

#[derive(clap::Args)]
pub struct ReportArgs {
    /// The project file.
    pub project: PathBuf,
    /// Directory for af_accuracy.png and report.md.
    #[arg(long)]
    pub out: PathBuf,
    /// Also print the per-iteration record as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs candle's CPU ops on the calling thread unless `CANDLE_NUM_THREADS` is set. The
/// ensemble's tensors are small (a few hundred rows by tens of channels), and candle hands every
/// elementwise op above a few thousand elements to a spin-waiting worker pool: on two cores the
/// hand-offs cost more than the arithmetic, several times more when other processes compete for
/// the cores (one ensemble iteration: 8.8 s on one thread, 65 s on two, under load). Results do
/// not depend on the thread count. Call it from the command line's main thread before any candle
/// op, since candle sizes its pool once, on first use.
pub fn use_one_candle_thread() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}

pub fn run_filter(args: FilterArgs) -> Result<()> {
    run::filter(args)
}

pub fn run_report(args: ReportArgs) -> Result<()> {
    report::report(args)
}
