//! Reading SWAG-format splits for the audit and for `afkit score`: the regular CSV columns
//! (`sent1`, `sent2`, `ending0..3`, `label`; `video-id` and an id column when present) found by
//! header name, so the SWAG release (with its leading unnamed index column) and afkit's own
//! exports both read; JSONL in afkit's export form (`id`, `group`, `sent1`, `sent2`, `endings`,
//! `label`). A label of -1 (how a published split withholds its answers) reads as no label.

use std::path::Path;

use anyhow::{bail, Context, Result};

use afkit_store::dataset::{Split, COULD_BE_RIGHT_COLUMN};

/// The regular CSV's columns that make a question: both halves of the context and the four
/// endings. Found by name, so files with extra or reordered columns read too.
const QUESTION_COLUMNS: [&str; 6] = ["sent1", "sent2", "ending0", "ending1", "ending2", "ending3"];

/// The regular CSV's group column: questions from one source video share it.
const GROUP_COLUMN: &str = "video-id";

/// The regular CSV's answer column: the gold ending's position (0-3).
const LABEL_COLUMN: &str = "label";

/// One 4-way question.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Question {
    /// The id column (`id` or the release's unnamed index), else the 0-based row number.
    pub id: String,
    /// The `video-id` column (JSONL: `group`), when present and not empty: questions of one group
    /// share a source video, so cross-validation keeps them in one fold.
    pub group: Option<String>,
    pub sent1: String,
    pub sent2: String,
    pub endings: [String; 4],
    pub label: Option<usize>,
    /// afkit's flag that a distractor could be right too (`could-be-right` in the regular CSV,
    /// `could_be_right` in the JSONL); `None` where the file does not carry it.
    pub could_be_right: Option<bool>,
}

/// Reads a split; `need_labels` makes a missing or empty label an error.
pub(crate) fn read_split(path: &Path, need_labels: bool) -> Result<Vec<Question>> {
    let is_jsonl = path.extension().is_some_and(|e| e == "jsonl");
    let questions = if is_jsonl {
        read_jsonl(path)?
    } else {
        read_csv(path)?
    };
    if need_labels {
        if let Some(i) = questions.iter().position(|q| q.label.is_none()) {
            bail!(
                "{}: record {} has no label (expected 0-3; a published afkit export withholds its \
                 test answers: use OUT-test-answers.csv)",
                path.display(),
                i + 1
            );
        }
    }
    Ok(questions)
}

fn read_csv(path: &Path) -> Result<Vec<Question>> {
    let mut reader = csv::ReaderBuilder::new()
        .flexible(false)
        .from_path(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let headers = reader
        .headers()
        .with_context(|| format!("{}: cannot read the header line", path.display()))?
        .clone();
    let col = |name: &str| headers.iter().position(|h| h == name);
    let mut idx = [0usize; 6];
    for (slot, name) in idx.iter_mut().zip(QUESTION_COLUMNS) {
        *slot = col(name).with_context(|| {
            format!(
                "{}: no column {name:?} in the header (expected SWAG regular columns: sent1, sent2, ending0..ending3, label)",
                path.display()
            )
        })?;
    }
    let label_col = col(LABEL_COLUMN);
    let id_col = col("id").or_else(|| col(""));
    let group_col = col(GROUP_COLUMN);
    let flag_col = col(COULD_BE_RIGHT_COLUMN);
    let mut out = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let line = i + 2;
        let record = record
            .with_context(|| format!("{}: line {line}: malformed CSV record", path.display()))?;
        let field = |c: usize| record.get(c).unwrap_or("").to_string();
        let label = match label_col.map(|c| record.get(c).unwrap_or("").trim()) {
            None | Some("") | Some("-1") => None,
            Some(text) => match text.parse::<usize>() {
                Ok(l) if l < 4 => Some(l),
                _ => bail!(
                    "{}: line {line}: label {text:?} is not 0, 1, 2 or 3",
                    path.display()
                ),
            },
        };
        out.push(Question {
            id: id_col.map(field).unwrap_or_else(|| i.to_string()),
            group: group_col.map(field).filter(|g| !g.is_empty()),
            sent1: field(idx[0]),
            sent2: field(idx[1]),
            endings: [field(idx[2]), field(idx[3]), field(idx[4]), field(idx[5])],
            label,
            could_be_right: flag_col.and_then(|c| match record.get(c).unwrap_or("").trim() {
                "1" | "true" => Some(true),
                "0" | "false" => Some(false),
                _ => None,
            }),
        });
    }
    Ok(out)
}

/// The `skipped` reason of a split file whose labels are all empty (or that has no label column).
pub(crate) const NO_LABELS: &str = "no labels";

/// What became of one split file when pooling.
#[derive(Debug, Clone, serde::Serialize, PartialEq)]
pub struct PooledFile {
    pub file: String,
    /// Questions taken from it (0 when skipped).
    pub questions: usize,
    /// Why it was not pooled (absent, or has no labels).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

/// The labelled questions of every split's regular CSV in `dir`, pooled in [`Split::ALL`] order. A file
/// that is absent, has no label column or has only empty labels (an unlabelled test split) is
/// skipped and reported as such; a file where some labels are empty and others not is an error.
pub(crate) fn read_labelled_splits(dir: &Path) -> Result<(Vec<Question>, Vec<PooledFile>)> {
    let mut pooled = Vec::new();
    let mut files = Vec::new();
    for split in Split::ALL {
        let name = split.regular_csv();
        let path = dir.join(&name);
        let skip = |why: &str| PooledFile {
            file: name.clone(),
            questions: 0,
            skipped: Some(why.into()),
        };
        if !path.exists() {
            files.push(skip("absent"));
            continue;
        }
        let questions = read_split(&path, false)?;
        if questions.iter().all(|q| q.label.is_none()) {
            files.push(skip(NO_LABELS));
            continue;
        }
        // Some labels but not all: name the first unlabelled record.
        let questions = read_split(&path, true)?;
        files.push(PooledFile {
            file: name.clone(),
            questions: questions.len(),
            skipped: None,
        });
        pooled.extend(questions);
    }
    Ok((pooled, files))
}

#[derive(serde::Deserialize)]
struct JsonQuestion {
    id: serde_json::Value,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    sent1: String,
    #[serde(default)]
    sent2: String,
    endings: [String; 4],
    label: Option<i64>,
    #[serde(default)]
    could_be_right: Option<bool>,
}

fn read_jsonl(path: &Path) -> Result<Vec<Question>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let q: JsonQuestion = serde_json::from_str(line).with_context(|| {
            format!(
                "{}: line {}: expected {{\"id\", \"sent1\", \"sent2\", \"endings\": [4 strings], \"label\"}}",
                path.display(),
                i + 1
            )
        })?;
        let label = match q.label {
            None | Some(-1) => None,
            Some(l @ 0..=3) => Some(l as usize),
            Some(_) => bail!(
                "{}: line {}: label must be 0-3 (or -1 for none)",
                path.display(),
                i + 1
            ),
        };
        out.push(Question {
            id: id_text(&q.id),
            group: q.group.filter(|g| !g.is_empty()),
            sent1: q.sent1,
            sent2: q.sent2,
            endings: q.endings,
            label,
            could_be_right: q.could_be_right,
        });
    }
    Ok(out)
}

/// An id as text, whether the JSON gave a string or a number.
pub(crate) fn id_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_columns_are_regular_columns() {
        let named = QUESTION_COLUMNS
            .iter()
            .chain([&GROUP_COLUMN, &LABEL_COLUMN]);
        for column in named {
            assert!(
                afkit_store::dataset::REGULAR_COLUMNS.contains(column),
                "{column}"
            );
        }
    }

    #[test]
    fn reads_swag_release_layout_and_reports_bad_labels() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("val.csv");
        std::fs::write(
            &path,
            ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n\
             7,anetv_x,5,\"A b. C\",A b.,C,gold0-orig,e0,e1,e2,e3,2\n",
        )
        .unwrap();
        let q = read_split(&path, true).unwrap();
        assert_eq!(q[0].id, "7");
        assert_eq!(q[0].group.as_deref(), Some("anetv_x"));
        assert_eq!(q[0].label, Some(2));
        assert_eq!(q[0].endings[3], "e3");
        std::fs::write(
            &path,
            "sent1,sent2,ending0,ending1,ending2,ending3,label\na,b,c,d,e,f,9\n",
        )
        .unwrap();
        let err = format!("{:#}", read_split(&path, true).unwrap_err());
        assert!(err.contains("line 2") && err.contains("label"), "{err}");
        let jsonl = dir.path().join("val.jsonl");
        std::fs::write(
            &jsonl,
            r#"{"id": 3, "group": "v9", "sent1": "a", "sent2": "b", "endings": ["c", "d", "e", "f"], "label": 1}"#,
        )
        .unwrap();
        let q = read_split(&jsonl, true).unwrap();
        assert_eq!((q[0].id.as_str(), q[0].group.as_deref()), ("3", Some("v9")));
        std::fs::write(&path, "sent1,ending0\na,b\n").unwrap();
        assert!(format!("{:#}", read_split(&path, true).unwrap_err()).contains("sent2"));
    }
}
