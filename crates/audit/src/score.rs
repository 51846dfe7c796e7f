//! `afkit score`: the accuracy of a model's predicted labels on a labelled split. The forms of
//! the predictions are in [`super::predictions`]; ids are the JSONL export's `id`, the CSV's id or
//! unnamed index column, or else the 0-based row number. Every split question needs exactly one
//! prediction.

use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use super::dataset;
use super::predictions::{self, Choice};

#[derive(Debug, Serialize, PartialEq)]
pub struct Score {
    pub accuracy: f64,
    pub correct: usize,
    pub total: usize,
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
