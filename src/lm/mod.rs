//! The language-model engine: GGUF loading, the llama forward pass and its CPU kernels, the
//! tokenizer, token sampling and the LM features the AF perplexity MLP reads. It knows nothing of
//! projects: the `generate` stage drives it. Also `afkit models` (the default model cache).

pub mod features;
pub mod linear;
pub mod llama;
pub mod local;
pub mod model;
pub mod openai;
pub mod sampler;
#[cfg(test)]
mod tests;
pub mod tokenizer;

use anyhow::Result;

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
