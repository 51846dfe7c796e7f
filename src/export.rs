//! Export: write the assembled splits as SWAG CSVs, JSONL and a dataset card (SPEC §9).

use std::path::PathBuf;

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {
    /// The project file.
    pub project: PathBuf,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// `adversarial` (the AF negatives) or `random` (a control drawn from the pre-AF pool).
    #[arg(long, value_enum, default_value = "adversarial")]
    pub negatives: Negatives,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Negatives {
    Adversarial,
    Random,
}

pub fn run(_args: Args) -> Result<()> {
    bail!("export is not implemented yet")
}
