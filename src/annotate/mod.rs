//! Human verification: the terminal UI, assignment of items to annotators, agreement statistics
//! and crowd import/export (SPEC §4).

use std::path::PathBuf;

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct Args {
    /// The project file.
    pub project: PathBuf,
    /// Your annotator name; restarting with the same name resumes where you stopped.
    #[arg(long)]
    pub annotator: String,
}

#[derive(clap::Args)]
pub struct AgreementArgs {
    /// The project file.
    pub project: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Subcommand)]
pub enum CrowdCommand {
    /// Write annotation tasks as CSV for a crowdsourcing platform.
    Export {
        project: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
    /// Read crowd results (afkit's columns or Mechanical Turk's batch results) into the project.
    Import { project: PathBuf, file: PathBuf },
}

pub fn run(_args: Args) -> Result<()> {
    bail!("annotate is not implemented yet")
}

pub fn run_agreement(_args: AgreementArgs) -> Result<()> {
    bail!("agreement is not implemented yet")
}

pub fn run_crowd(_command: CrowdCommand) -> Result<()> {
    bail!("crowd is not implemented yet")
}
