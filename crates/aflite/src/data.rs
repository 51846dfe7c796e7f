//! The labelled dataset AFLite filters: JSONL (`{"id", "text" | "text_a"+"text_b", "label"}`)
//! or CSV with the same column names. Records are kept verbatim so that the retained subset is
//! written back in the input's own format, extra fields and columns included.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};

use afkit_engine::csv_lines::RecordLines;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Format {
    Jsonl,
    Csv,
}

impl Format {
    /// From the file name: `.jsonl`/`.ndjson`/`.json` are JSON lines, `.csv` is CSV.
    pub(crate) fn of(path: &Path) -> Result<Format> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("jsonl" | "ndjson" | "json") => Ok(Format::Jsonl),
            Some("csv") => Ok(Format::Csv),
            _ => bail!(
                "{}: cannot tell the format from the file name; expected a .jsonl or .csv file",
                path.display()
            ),
        }
    }
}

/// What a model sees of one example.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Text {
    Single(String),
    Pair(String, String),
}

#[derive(Debug, Clone)]
pub(crate) struct LabelledExample {
    pub id: String,
    pub text: Text,
    /// The label as written (numbers and booleans in their JSON spelling).
    pub label: String,
}

/// The original record, written back unchanged when the example is retained.
#[derive(Debug, Clone)]
enum Raw {
    Line(String),
    Record(csv::StringRecord),
}

pub(crate) struct LabelledDataset {
    pub format: Format,
    pub examples: Vec<LabelledExample>,
    raw: Vec<Raw>,
    csv_header: Option<csv::StringRecord>,
}

impl LabelledDataset {
    pub(crate) fn read(path: &Path) -> Result<LabelledDataset> {
        let format = Format::of(path)?;
        let (examples, raw, csv_header) = match format {
            Format::Jsonl => {
                let (e, r) = read_jsonl(path)?;
                (e, r, None)
            }
            Format::Csv => {
                let (e, r, h) = read_csv(path)?;
                (e, r, Some(h))
            }
        };
        if examples.is_empty() {
            bail!("{}: no examples", path.display());
        }
        let pairs = examples
            .iter()
            .filter(|e| matches!(e.text, Text::Pair(..)))
            .count();
        if pairs != 0 && pairs != examples.len() {
            let odd = examples
                .iter()
                .position(|e| matches!(e.text, Text::Pair(..)) != (pairs > examples.len() / 2))
                .expect("a mixed dataset has an odd one out");
            bail!(
                "{}: record {} mixes kinds: every record must have \"text\", or every record \
                 \"text_a\" and \"text_b\"",
                path.display(),
                odd + 1
            );
        }
        let mut seen = HashMap::new();
        for (i, e) in examples.iter().enumerate() {
            if let Some(first) = seen.insert(e.id.as_str(), i) {
                bail!(
                    "{}: record {} repeats the id {:?} of record {}",
                    path.display(),
                    i + 1,
                    e.id,
                    first + 1
                );
            }
        }
        Ok(LabelledDataset {
            format,
            examples,
            raw,
            csv_header,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.examples.len()
    }

    pub(crate) fn is_pairs(&self) -> bool {
        matches!(self.examples[0].text, Text::Pair(..))
    }

    /// The distinct labels, sorted; a label's class id is its position here.
    pub(crate) fn label_names(&self) -> Vec<String> {
        let set: BTreeSet<&str> = self.examples.iter().map(|e| e.label.as_str()).collect();
        set.into_iter().map(str::to_string).collect()
    }

    /// Writes the records at `keep` (input order) in the input's format.
    pub(crate) fn write_subset(&self, keep: &[usize], out: &mut dyn Write) -> Result<()> {
        match self.format {
            Format::Jsonl => {
                for &i in keep {
                    let Raw::Line(line) = &self.raw[i] else {
                        unreachable!("JSONL records are lines")
                    };
                    writeln!(out, "{line}")?;
                }
            }
            Format::Csv => {
                let mut writer = csv::Writer::from_writer(out);
                writer.write_record(self.csv_header.as_ref().expect("CSV has a header"))?;
                for &i in keep {
                    let Raw::Record(record) = &self.raw[i] else {
                        unreachable!("CSV records are records")
                    };
                    writer.write_record(record)?;
                }
                writer.flush()?;
            }
        }
        Ok(())
    }
}

fn read_jsonl(path: &Path) -> Result<(Vec<LabelledExample>, Vec<Raw>)> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut examples = Vec::new();
    let mut raw = Vec::new();
    let mut kinds = LabelKinds::default();
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line_no = n + 1;
        let mut line =
            line.with_context(|| format!("{}:{line_no}: cannot read", path.display()))?;
        if line_no == 1 {
            // A byte-order mark, as some editors write first, is not part of the record.
            if let Some(rest) = line.strip_prefix('\u{feff}') {
                line = rest.to_string();
            }
        }
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(&line)
            .with_context(|| format!("{}:{line_no}: expected a JSON object", path.display()))?;
        let Some(object) = value.as_object() else {
            bail!("{}:{line_no}: expected a JSON object", path.display());
        };
        let field = |name: &str| -> Result<Option<String>> {
            match object.get(name) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                    Ok(Some(v.to_string()))
                }
                Some(_) => bail!(
                    "{}:{line_no}: \"{name}\" must be a string, number or boolean",
                    path.display()
                ),
            }
        };
        let example = make_example(
            field("id")?,
            field("text")?,
            field("text_a")?,
            field("text_b")?,
            field("label")?,
            examples.len(),
        )
        .and_then(|e| kinds.check(&e.label, line_no as u64).map(|()| e))
        .with_context(|| format!("{}:{line_no}", path.display()))?;
        examples.push(example);
        raw.push(Raw::Line(line));
    }
    Ok((examples, raw))
}

fn read_csv(path: &Path) -> Result<(Vec<LabelledExample>, Vec<Raw>, csv::StringRecord)> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut lines = RecordLines::new(&bytes);
    let mut reader = csv::ReaderBuilder::new().from_reader(bytes.as_slice());
    let header = reader
        .headers()
        .map_err(|e| {
            let line = lines.line_of_position(e.position());
            anyhow!("{}:{line}: cannot read the header row: {e}", path.display())
        })?
        .clone();
    let column = |name: &str| header.iter().position(|h| h.trim() == name);
    let (id_col, text_col, a_col, b_col) = (
        column("id"),
        column("text"),
        column("text_a"),
        column("text_b"),
    );
    let Some(label_col) = column("label") else {
        bail!(
            "{}: the header has no \"label\" column (expected id, text or text_a/text_b, label)",
            path.display()
        );
    };
    if text_col.is_none() && (a_col.is_none() || b_col.is_none()) {
        bail!(
            "{}: the header needs a \"text\" column or both \"text_a\" and \"text_b\"",
            path.display()
        );
    }
    let mut examples = Vec::new();
    let mut raw = Vec::new();
    let mut kinds = LabelKinds::default();
    for record in reader.records() {
        let record = record.map_err(|e| {
            let line = lines.line_of_position(e.position());
            anyhow!("{}:{line}: malformed CSV: {e}", path.display())
        })?;
        let line = lines.line_of_position(record.position());
        let get = |col: Option<usize>| -> Option<String> {
            col.and_then(|c| record.get(c))
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let example = make_example(
            get(id_col),
            get(text_col),
            get(a_col),
            get(b_col),
            get(Some(label_col)),
            examples.len(),
        )
        .and_then(|e| kinds.check(&e.label, line).map(|()| e))
        .with_context(|| format!("{}:{line}", path.display()))?;
        examples.push(example);
        raw.push(Raw::Record(record));
    }
    Ok((examples, raw, header))
}

/// What a label is: a class name, either a whole number (`0`, `1`, `-1`) or a word
/// (`entailment`, `true`), the same kind on every line. A fraction or an exponent (`0.5`, `1e30`)
/// is a score, not a class, and a word among numbers is a typo: either would silently become a
/// class of its own, so both are refused.
#[derive(Default)]
struct LabelKinds {
    /// Whether the first label was a number, and its line.
    first: Option<(bool, u64, String)>,
}

impl LabelKinds {
    fn check(&mut self, label: &str, line: u64) -> Result<()> {
        let is_number = label.parse::<i64>().is_ok();
        let looks_numeric = label
            .starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+' || c == '.')
            && label.parse::<f64>().is_ok();
        if !is_number && looks_numeric {
            bail!(
                "label {label} is not a class: expected a whole number (0, 1, 2, ...) or a class                  name such as entailment"
            );
        }
        if label.trim().is_empty() || label.trim() != label {
            bail!("label {label:?} is not a class name: expected no spaces around it");
        }
        match &self.first {
            None => self.first = Some((is_number, line, label.to_string())),
            Some((first_is_number, first_line, first)) if *first_is_number != is_number => bail!(
                "label {label:?} is {} but line {first_line}'s label {first:?} is {}: every label                  must be a whole number, or every label a class name",
                if is_number { "a number" } else { "a name" },
                if *first_is_number { "a number" } else { "a name" },
            ),
            Some(_) => {}
        }
        Ok(())
    }
}

/// One example from its fields; `index` (0-based) names examples without an id.
fn make_example(
    id: Option<String>,
    text: Option<String>,
    text_a: Option<String>,
    text_b: Option<String>,
    label: Option<String>,
    index: usize,
) -> Result<LabelledExample> {
    let Some(label) = label else {
        bail!("expected a \"label\"");
    };
    let text = match (text, text_a, text_b) {
        (Some(t), None, None) => Text::Single(t),
        (None, Some(a), Some(b)) => Text::Pair(a, b),
        (Some(_), _, _) => bail!("expected either \"text\" or \"text_a\"/\"text_b\", not both"),
        _ => bail!("expected \"text\", or both \"text_a\" and \"text_b\""),
    };
    Ok(LabelledExample {
        id: id.unwrap_or_else(|| (index + 1).to_string()),
        text,
        label,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_that_are_not_class_names_are_refused_by_line() {
        let dir = tempfile::tempdir().unwrap();
        for (label, says) in [
            ("0.5", "not a class"),
            ("1e30", "not a class"),
            ("\"x\"", "every label"),
            ("1.0", "not a class"),
        ] {
            let body = format!(
                "{{\"text\": \"a\", \"label\": 0}}\n{{\"text\": \"b\", \"label\": 1}}\n\
                 {{\"text\": \"c\", \"label\": {label}}}\n"
            );
            let p = write(dir.path(), "d.jsonl", &body);
            let err = format!("{:#}", LabelledDataset::read(&p).err().unwrap());
            assert!(
                err.contains("d.jsonl:3") && err.contains(says),
                "{label}: {err}"
            );
        }
        let p = write(
            dir.path(),
            "n.csv",
            "text,label\na,entail\nb,contra\nc,-1\n",
        );
        let err = format!("{:#}", LabelledDataset::read(&p).err().unwrap());
        assert!(
            err.contains("n.csv:4") && err.contains("every label"),
            "{err}"
        );
        let p = write(dir.path(), "ok.csv", "text,label\na,-1\nb,2\n");
        assert_eq!(LabelledDataset::read(&p).unwrap().label_names().len(), 2);
    }

    fn write(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn jsonl_round_trips_verbatim() {
        let dir = tempfile::tempdir().unwrap();
        let body = "{\"id\": \"a\", \"text\": \"x\", \"label\": 1, \"extra\": [1]}\n\
                    {\"id\": \"b\", \"text\": \"y\", \"label\": 0}\n";
        let p = write(dir.path(), "d.jsonl", body);
        let d = LabelledDataset::read(&p).unwrap();
        assert_eq!(d.label_names(), vec!["0", "1"]);
        let mut out = Vec::new();
        d.write_subset(&[0], &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            body.lines().next().unwrap().to_string() + "\n"
        );
    }

    #[test]
    fn errors_name_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            "d.jsonl",
            "{\"id\": 1, \"text\": \"x\", \"label\": \"a\"}\n{\"id\": 2, \"text\": \"y\"}\n",
        );
        let err = format!("{:#}", LabelledDataset::read(&p).err().unwrap());
        assert!(err.contains("d.jsonl:2") && err.contains("label"), "{err}");
    }

    #[test]
    fn csv_pairs_and_missing_ids() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            "d.csv",
            "text_a,text_b,label,note\n\"p, q\",h,entail,z\nq,h2,contra,\n",
        );
        let d = LabelledDataset::read(&p).unwrap();
        assert!(d.is_pairs());
        assert_eq!(d.examples[0].id, "1");
        assert_eq!(d.examples[0].text, Text::Pair("p, q".into(), "h".into()));
        let mut out = Vec::new();
        d.write_subset(&[1], &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "text_a,text_b,label,note\nq,h2,contra,\n"
        );
    }

    #[test]
    fn duplicate_ids_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            "d.jsonl",
            "{\"id\": 1, \"text\": \"x\", \"label\": 0}\n{\"id\": 1, \"text\": \"y\", \"label\": 1}\n",
        );
        let err = format!("{:#}", LabelledDataset::read(&p).err().unwrap());
        assert!(err.contains("record 2 repeats"), "{err}");
    }
}
