//! What a `generate` call does (plain data, recorded with the generation) and what it reports
//! while it works.

use std::path::PathBuf;

use anyhow::{bail, Result};

use super::prompt::PromptTemplate;
use afkit_engine::device::Compute;
use afkit_engine::lm::openai::OpenAiConfig;
use afkit_engine::lm::sampler::SamplingParams;
use afkit_engine::seed::Seed;

/// Everything a `generate` call does, resolved: plain data, recorded with the generation.
pub struct Config {
    /// The GGUF file that samples (without a server) and scores the LM features.
    pub model: PathBuf,
    /// `Some`: an OpenAI-compatible server samples and the local model only scores.
    pub server: Option<OpenAiConfig>,
    /// Unique endings to sample per context (N⁻).
    pub n_neg: usize,
    /// Only the first N contexts that have no pool yet (or N starved pools with `grow`).
    pub limit: Option<usize>,
    pub seed: Seed,
    pub template: PromptTemplate,
    /// Real context + ending pairs from other groups shown before each context; 0 for none.
    pub style_examples: usize,
    /// Sampled endings must pass the rules ingest applies to found ones.
    pub ending_rules: bool,
    /// Also score every ending after the document start alone (the MLP's `lp_alone`).
    pub alone_scores: bool,
    /// Grow starved pools instead of making new ones.
    pub grow: Option<Growth>,
    /// Whether each context is sampled with its fold's adapter (`lm adapt`).
    pub adapters: AdapterUse,
    pub sampling: SamplingParams,
    /// Where the local model runs.
    pub compute: Compute,
}

/// `generate --grow`: more endings for the pools the latest AF run found starved.
#[derive(Clone, Copy, Debug)]
pub struct Growth {
    /// Endings to add per starved pool.
    pub per_context: usize,
    /// Pools already this large are left as they are.
    pub max_pool: usize,
}

impl Config {
    pub(super) fn validate(&self) -> Result<()> {
        if self.n_neg == 0 {
            bail!("--n-neg must be at least 1");
        }
        if self.grow.is_some_and(|g| g.per_context == 0) {
            bail!("--grow must be at least 1");
        }
        if self.adapters == AdapterUse::Require && self.server.is_some() {
            bail!("--adapted samples with the local model; it cannot be combined with a server");
        }
        if self.sampling.batch == 0 || self.sampling.max_draws_per_ending == 0 {
            bail!("--batch and --max-draws-per-ending must be at least 1");
        }
        Ok(())
    }
}

/// What `generate` reports while it works. Every method has a default that does nothing.
pub trait Observer {
    /// Something worth telling the user (the model being loaded, nothing to do, ...).
    fn note(&mut self, _message: &str) {}
    /// The number of contexts this call will work on, and the endings each asks for (0 where
    /// the call does not sample: `import-pool`).
    fn started(&mut self, _contexts: usize, _endings_each: usize) {}
    /// One more ending kept for a context still being sampled (it moves progress within a
    /// batch of contexts sampled together).
    fn ending_kept(&mut self) {}
    /// A context left out because it does not fit the model (recorded in the project).
    fn skipped(&mut self, _ext_id: &str, _reason: &str) {}
    /// One more context done (its pool committed, or passed over) with `kept` endings, those
    /// told by [`Observer::ending_kept`]; the endings per second so far, where the call
    /// measures them.
    fn context_done(&mut self, _kept: usize, _endings_per_second: Option<f64>) {}
}

/// Whether `generate` samples with the project's adapters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterUse {
    /// The project's newest complete set for the model, if it has one.
    Auto,
    /// The project's newest complete set; an error without one (`--adapted`).
    Require,
    /// The model alone (`--no-adapters`).
    Off,
}
