//! Text processing shared by the stages: word tokenisation, afkit's own UPOS tagger, and the
//! splitter that cuts a second sentence into `sent2` and its ending before the main verb phrase.

use std::path::PathBuf;

use anyhow::{bail, Result};

#[derive(clap::Subcommand)]
pub enum TaggerCommand {
    /// Train an averaged-perceptron UPOS tagger on CoNLL-U treebanks.
    Train {
        /// Training treebanks in CoNLL-U format.
        #[arg(long, required = true, num_args = 1..)]
        conllu: Vec<PathBuf>,
        /// Where to write the trained weights.
        #[arg(long)]
        out: PathBuf,
    },
    /// Evaluate a tagger on CoNLL-U treebanks; prints "accuracy: 0.xxxx".
    Eval {
        /// Held-out treebanks in CoNLL-U format.
        #[arg(long, required = true, num_args = 1..)]
        conllu: Vec<PathBuf>,
        /// Weights to evaluate (default: the tagger shipped with afkit).
        #[arg(long)]
        model: Option<PathBuf>,
    },
}

pub fn run_tagger(_command: TaggerCommand) -> Result<()> {
    bail!("the tagger is not implemented yet")
}
