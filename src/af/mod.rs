//! Adversarial Filtering (SWAG Algorithm 1) with the four-model stylistic ensemble (SPEC §3).

use std::path::PathBuf;

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct FilterArgs {
    /// The project file.
    pub project: PathBuf,
    /// Negatives assigned per context during AF.
    #[arg(long, default_value_t = 9)]
    pub k: usize,
    /// Cap on the cheap MLP-only iterations that run first.
    #[arg(long)]
    pub mlp_iterations: Option<usize>,
    /// Cap on the full-ensemble iterations (the phase may stop earlier when it converges).
    #[arg(long)]
    pub ensemble_iterations: Option<usize>,
    /// Seed for splits, initial assignment and model initialisation (recorded).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

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

pub fn run_filter(_args: FilterArgs) -> Result<()> {
    bail!("filter is not implemented yet")
}

pub fn run_report(_args: ReportArgs) -> Result<()> {
    bail!("report is not implemented yet")
}
