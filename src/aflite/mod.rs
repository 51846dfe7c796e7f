//! AFLite: lightweight adversarial filtering of an existing labelled dataset (SPEC §6).

use std::path::PathBuf;

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Labelled dataset: JSONL ({"id", "text" or "text_a"/"text_b", "label"}) or CSV.
    #[arg(long)]
    pub input: PathBuf,
    /// Where to write the retained subset (same format as the input).
    #[arg(long)]
    pub out: PathBuf,
    /// `minilm` (sentence embeddings) or a file of vectors (.npy or .safetensors), one row per example.
    #[arg(long, default_value = "minilm")]
    pub features: String,
}

pub fn run(_args: Args) -> Result<()> {
    bail!("aflite is not implemented yet")
}
