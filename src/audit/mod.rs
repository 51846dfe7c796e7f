//! Bias audit of any SWAG-format dataset, and grading of predictions (SPEC §7).

use std::path::PathBuf;

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {
    /// A directory with train.csv and val.csv (SWAG regular columns).
    pub dataset: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct ScoreArgs {
    /// The split to grade against (SWAG CSV with labels).
    pub split: PathBuf,
    /// Predictions: one label per line, or JSONL with "id" and "label".
    pub predictions: PathBuf,
}

pub fn run(_args: Args) -> Result<()> {
    bail!("audit is not implemented yet")
}

pub fn run_score(_args: ScoreArgs) -> Result<()> {
    bail!("score is not implemented yet")
}
