//! Ingest: load contexts with their found endings into the project (SPEC §1).

use std::path::PathBuf;

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {
    /// The project file.
    pub project: PathBuf,
    /// Input format of every FILE.
    #[arg(long, value_enum)]
    pub format: Format,
    /// Drop examples containing a token seen fewer than N times in the ingested corpus
    /// (SWAG footnote 2 uses 4 on the full corpus; on a small corpus it drops nearly everything).
    #[arg(long, value_name = "N")]
    pub min_token_count: Option<u32>,
    /// Input files.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// ActivityNet Captions JSON: {video_id: {sentences: [...], ...}}.
    Activitynet,
    /// SWAG release CSV (regular or full column set), taken as already split.
    SwagCsv,
    /// JSON Lines: {"id", "sent1", "sent2"?, "ending", "group"?} per line.
    Jsonl,
}

pub fn run(_args: Args) -> Result<()> {
    bail!("ingest is not implemented yet")
}
