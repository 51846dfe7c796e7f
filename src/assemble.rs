//! Assemble: turn verified (or unverified) candidates into final examples and splits (SPEC §5).

use std::path::PathBuf;

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {
    /// The project file.
    pub project: PathBuf,
    /// Skip verification: gold + the three hardest assigned negatives, marked unverified.
    #[arg(long)]
    pub unverified: bool,
    /// Train,val,test fractions; groups (videos) never straddle two splits.
    #[arg(long, default_value = "0.8,0.1,0.1")]
    pub split: String,
    /// Seed for the split (recorded).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

pub fn run(_args: Args) -> Result<()> {
    bail!("assemble is not implemented yet")
}
