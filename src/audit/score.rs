//! `afkit score`: the accuracy of a model's predicted labels on a labelled split.
//!
//! Predictions are either one label (0-3) per line, in the split's row order, or JSONL objects
//! `{"id", "label"}` matched to the split by id (the JSONL export's `id`, the CSV's id / unnamed
//! index column, or else the 0-based row number). Every split question needs exactly one
//! prediction.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::dataset::{self, id_text};

#[derive(clap::Args)]
pub struct ScoreArgs {
    /// The split to grade against (SWAG CSV with labels, or an afkit JSONL export).
    pub split: PathBuf,
    /// Predictions: one label per line, or JSONL with "id" and "label".
    pub predictions: PathBuf,
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
    let s = score(&args.split, &args.predictions)?;
    if args.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        println!("accuracy: {:.4} ({} of {})", s.accuracy, s.correct, s.total);
    }
    Ok(())
}

pub fn score(split: &Path, predictions: &Path) -> Result<Score> {
    let questions = dataset::read_split(split, true)?;
    let predicted = read_predictions(
        predictions,
        &questions.iter().map(|q| q.id.as_str()).collect::<Vec<_>>(),
    )?;
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

/// Reads predictions and returns them in split order.
fn read_predictions(path: &Path, ids: &[&str]) -> Result<Vec<usize>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read predictions {}", path.display()))?;
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, l.trim()))
        .collect();
    let parse_label = |line: usize, v: &str| -> Result<usize> {
        match v.parse::<usize>() {
            Ok(l) if l < 4 => Ok(l),
            _ => bail!(
                "{}: line {line}: label {v:?} is not 0, 1, 2 or 3",
                path.display()
            ),
        }
    };
    if lines.first().is_some_and(|(_, l)| l.starts_with('{')) {
        let index: HashMap<&str, usize> = ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
        let mut out: Vec<Option<usize>> = vec![None; ids.len()];
        for (line, l) in lines {
            let v: serde_json::Value = serde_json::from_str(l).with_context(|| {
                format!(
                    "{}: line {line}: expected {{\"id\", \"label\"}}",
                    path.display()
                )
            })?;
            let (Some(id), Some(label)) = (v.get("id"), v.get("label")) else {
                bail!(
                    "{}: line {line}: expected {{\"id\", \"label\"}}",
                    path.display()
                );
            };
            let id = id_text(id);
            let Some(&row) = index.get(id.as_str()) else {
                bail!(
                    "{}: line {line}: id {id:?} is not in the split",
                    path.display()
                );
            };
            if out[row].is_some() {
                bail!(
                    "{}: line {line}: a second prediction for id {id:?}",
                    path.display()
                );
            }
            out[row] = Some(parse_label(line, &id_text(label))?);
        }
        if let Some(missing) = out.iter().position(Option::is_none) {
            bail!(
                "{}: no prediction for id {:?}",
                path.display(),
                ids[missing]
            );
        }
        Ok(out.into_iter().flatten().collect())
    } else {
        if lines.len() != ids.len() {
            bail!(
                "{}: {} predictions for {} questions (one label 0-3 per line, in split order)",
                path.display(),
                lines.len(),
                ids.len()
            );
        }
        lines
            .into_iter()
            .map(|(line, l)| parse_label(line, l))
            .collect()
    }
}
