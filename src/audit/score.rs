//! `afkit score`: the accuracy of a model's predicted labels on a labelled split. The forms of
//! the predictions are in [`super::predictions`]; ids are the JSONL export's `id`, the CSV's id or
//! unnamed index column, or else the 0-based row number. Every split question needs exactly one
//! prediction.

use std::path::{Path, PathBuf};

use anyhow::Result;
use serde::Serialize;

use super::dataset;
use super::predictions::{self, Choice};

#[derive(clap::Args)]
#[command(
    long_about = "The accuracy of a model's predictions on a labelled split.\n\n\
    SPLIT is a SWAG CSV with labels or an afkit JSONL export (for a published export's test split: \
    OUT-test-answers.csv). PREDICTIONS may be: one label 0-3 per line in the split's order (a first \
    line pred, prediction or label is a header); JSON Lines with an id (id, idx or example_id) or in \
    order, and a label (label, prediction, pred, predicted_label) or scores (logits, scores, \
    probabilities; the highest wins); a JSON array or {\"predictions\": [...]} of labels or score \
    lists in order (Hugging Face Trainer.predict); or lm-evaluation-harness --log_samples output \
    (samples_TASK_*.jsonl), whose doc_id is the row and whose highest log-likelihood is the \
    prediction (the harness's acc; --norm: per character, its acc_norm)."
)]
pub struct ScoreArgs {
    /// The split to grade against (SWAG CSV with labels, or an afkit JSONL export).
    pub split: PathBuf,
    /// The predictions, in any of the forms above.
    pub predictions: PathBuf,
    /// For lm-evaluation-harness samples: pick the highest log-likelihood per character of the
    /// ending (the harness's acc_norm) instead of the highest log-likelihood (acc).
    #[arg(long)]
    pub norm: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct Score {
    pub accuracy: f64,
    pub correct: usize,
    pub total: usize,
}

pub fn run_score(args: ScoreArgs) -> Result<()> {
    let choice = if args.norm {
        Choice::PerCharacter
    } else {
        Choice::Total
    };
    let s = score(&args.split, &args.predictions, choice)?;
    if args.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        println!("accuracy: {:.4} ({} of {})", s.accuracy, s.correct, s.total);
    }
    Ok(())
}

pub fn score(split: &Path, predictions: &Path, choice: Choice) -> Result<Score> {
    let questions = dataset::read_split(split, true)?;
    let predicted = predictions::read(predictions, &questions, choice)?;
    let correct = questions
        .iter()
        .zip(&predicted)
        .filter(|(q, p)| q.label == Some(**p))
        .count();
    Ok(Score {
        accuracy: if questions.is_empty() {
            0.0
        } else {
            correct as f64 / questions.len() as f64
        },
        correct,
        total: questions.len(),
    })
}
