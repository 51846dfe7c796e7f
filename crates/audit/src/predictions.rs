//! Reading a model's predictions for `afkit score`, in the forms evaluation tools write them:
//!
//! - one label (0-3) per line, in the split's row order (a first line `pred`, `prediction` or
//!   `label` is a header and skipped);
//! - JSON Lines with an id (`id`, `idx` or `example_id`, matched to the split's ids) or in row
//!   order without one, and a label (`label`, `prediction`, `pred`, `predicted_label`) or scores
//!   (`logits`, `scores`, `probabilities`: the highest wins);
//! - one JSON document: an array, or an object with `predictions` (Hugging Face's `Trainer.predict`
//!   output), of labels or of score lists, in row order;
//! - lm-evaluation-harness `--log_samples` output (`samples_TASK_*.jsonl`): `doc_id` is the row,
//!   and the choice with the highest log-likelihood is the prediction (the harness's `acc`), or
//!   the highest per character of the ending with `norm` (its `acc_norm`).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::dataset::{id_text, Question};

const ID_KEYS: [&str; 3] = ["id", "idx", "example_id"];
const LABEL_KEYS: [&str; 4] = ["label", "prediction", "pred", "predicted_label"];
const SCORE_KEYS: [&str; 3] = ["logits", "scores", "probabilities"];
const HEADERS: [&str; 3] = ["pred", "prediction", "label"];

/// How to pick the harness's prediction from its log-likelihoods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Highest log-likelihood (`acc`).
    Total,
    /// Highest log-likelihood per character of the ending (`acc_norm`).
    PerCharacter,
}

/// One prediction as read: where it belongs and the predicted label.
struct Entry {
    line: usize,
    key: Key,
    label: usize,
}

enum Key {
    /// Matched to the split by id.
    Id(String),
    /// The split's row (the harness's `doc_id`).
    Row(usize),
    /// The next row.
    InOrder,
}

/// The predictions in split order, one per question.
pub(crate) fn read(path: &Path, questions: &[Question], choice: Choice) -> Result<Vec<usize>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read predictions {}", path.display()))?;
    let at = |line: usize| format!("{}: line {line}", path.display());
    let entries = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Array(items)) => document(&items, &at)?,
        Ok(Value::Object(doc)) if doc.contains_key("predictions") => match &doc["predictions"] {
            Value::Array(items) => document(items, &at)?,
            _ => bail!("{}: \"predictions\" is not an array", at(1)),
        },
        _ if text.trim_start().starts_with('{') => json_lines(&text, questions, choice, &at)?,
        _ => plain_lines(&text, &at)?,
    };
    if choice == Choice::PerCharacter && !entries.iter().all(|e| matches!(e.key, Key::Row(_))) {
        bail!(
            "{}: --norm needs lm-evaluation-harness samples (their log-likelihoods)",
            path.display()
        );
    }
    align(entries, questions, path)
}

/// A label (number or digit string) or a list of scores (the highest wins).
fn label_of(value: &Value, at: &str) -> Result<usize> {
    if let Value::Array(scores) = value {
        let scores: Vec<f64> = scores.iter().filter_map(number).collect();
        if scores.len() != 4 {
            bail!("{at}: expected 4 scores, one per ending");
        }
        return Ok(argmax(&scores));
    }
    let text = id_text(value);
    match text.trim().parse::<usize>() {
        Ok(l) if l < 4 => Ok(l),
        _ => bail!("{at}: label {text:?} is not 0, 1, 2 or 3"),
    }
}

/// A JSON number, or a string holding one (the harness writes log-likelihoods either way).
fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// The first index of the largest value, as numpy's argmax.
fn argmax(values: &[f64]) -> usize {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best
}

fn document(items: &[Value], at: &dyn Fn(usize) -> String) -> Result<Vec<Entry>> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            Ok(Entry {
                line: i + 1,
                key: Key::InOrder,
                label: label_of(v, &format!("{} (prediction {})", at(1), i + 1))?,
            })
        })
        .collect()
}

fn plain_lines(text: &str, at: &dyn Fn(usize) -> String) -> Result<Vec<Entry>> {
    let mut entries = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || (entries.is_empty() && HEADERS.contains(&line)) {
            continue;
        }
        entries.push(Entry {
            line: i + 1,
            key: Key::InOrder,
            label: label_of(&Value::String(line.to_string()), &at(i + 1))?,
        });
    }
    Ok(entries)
}

fn json_lines(
    text: &str,
    questions: &[Question],
    choice: Choice,
    at: &dyn Fn(usize) -> String,
) -> Result<Vec<Entry>> {
    let mut entries = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = at(i + 1);
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("{at}: expected one JSON object per line"))?;
        let entry = if v.get("doc_id").is_some() {
            harness_sample(&v, questions, choice, &at, i + 1)?
        } else {
            let key = match ID_KEYS.iter().find_map(|k| v.get(*k)) {
                Some(id) => Key::Id(id_text(id)),
                None => Key::InOrder,
            };
            let Some(value) = LABEL_KEYS.iter().chain(&SCORE_KEYS).find_map(|k| v.get(*k)) else {
                bail!(
                    "{at}: expected a label ({}) or scores ({})",
                    LABEL_KEYS.join(", "),
                    SCORE_KEYS.join(", ")
                );
            };
            Entry {
                line: i + 1,
                key,
                label: label_of(value, &at)?,
            }
        };
        entries.push(entry);
    }
    Ok(entries)
}

/// One lm-evaluation-harness sample: its row, checked against the split's endings where the
/// sample carries them, and the choice its log-likelihoods pick.
fn harness_sample(
    v: &Value,
    questions: &[Question],
    choice: Choice,
    at: &str,
    line: usize,
) -> Result<Entry> {
    let row = v["doc_id"]
        .as_u64()
        .with_context(|| format!("{at}: doc_id is not a row number"))? as usize;
    let Some(question) = questions.get(row) else {
        bail!(
            "{at}: doc_id {row}, but the split has {} questions; expected samples of this split",
            questions.len()
        );
    };
    let doc = &v["doc"];
    let endings: Option<Vec<String>> = match doc.get("endings") {
        Some(Value::Array(e)) => Some(e.iter().map(id_text).collect()),
        _ => (0..4)
            .map(|i| doc.get(format!("ending{i}")).map(id_text))
            .collect(),
    };
    if endings.is_some_and(|e| e != question.endings) {
        bail!("{at}: the endings of doc_id {row} differ from the split's question {row}; expected samples of this split");
    }
    let resps = v
        .get("filtered_resps")
        .or_else(|| v.get("resps"))
        .and_then(Value::as_array)
        .with_context(|| format!("{at}: no filtered_resps (the choices' log-likelihoods)"))?;
    let lls: Option<Vec<f64>> = resps
        .iter()
        .map(|r| match r {
            Value::Array(pair) => pair.first().and_then(number),
            other => number(other),
        })
        .collect();
    let Some(mut lls) = lls.filter(|l| l.len() == 4) else {
        bail!("{at}: expected 4 log-likelihoods in filtered_resps, one per ending");
    };
    if choice == Choice::PerCharacter {
        for (ll, ending) in lls.iter_mut().zip(&question.endings) {
            *ll /= ending.chars().count().max(1) as f64;
        }
    }
    Ok(Entry {
        line,
        key: Key::Row(row),
        label: argmax(&lls),
    })
}

/// Puts the entries in split order: by id, by row, or in file order; every question needs
/// exactly one.
fn align(entries: Vec<Entry>, questions: &[Question], path: &Path) -> Result<Vec<usize>> {
    if entries.iter().all(|e| matches!(e.key, Key::InOrder)) {
        if entries.len() != questions.len() {
            bail!(
                "{}: {} predictions for {} questions (in split order)",
                path.display(),
                entries.len(),
                questions.len()
            );
        }
        return Ok(entries.into_iter().map(|e| e.label).collect());
    }
    let index: HashMap<&str, usize> = questions
        .iter()
        .enumerate()
        .map(|(i, q)| (q.id.as_str(), i))
        .collect();
    let mut out: Vec<Option<usize>> = vec![None; questions.len()];
    for e in entries {
        let at = format!("{}: line {}", path.display(), e.line);
        let row = match &e.key {
            Key::Row(row) => *row,
            Key::Id(id) => *index
                .get(id.as_str())
                .with_context(|| format!("{at}: id {id:?} is not in the split"))?,
            Key::InOrder => bail!("{at}: no id, while other predictions have one"),
        };
        if out[row].replace(e.label).is_some() {
            bail!("{at}: a second prediction for {:?}", questions[row].id);
        }
    }
    if let Some(missing) = out.iter().position(Option::is_none) {
        bail!(
            "{}: no prediction for id {:?}",
            path.display(),
            questions[missing].id
        );
    }
    Ok(out.into_iter().flatten().collect())
}
