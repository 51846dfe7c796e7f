//! Readers for the three input formats. Each turns a whole file into [`Record`]s or fails with
//! an error naming the file, the line or record, and what was expected; nothing is written to
//! the project before every file has been read.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use serde::de::{MapAccess, Visitor};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use afkit_engine::csv_lines::RecordLines;
use afkit_engine::json_errors::json_error_without_position;
use afkit_store::dataset::{FULL_COLUMNS, REGULAR_COLUMNS};

/// One input record: a first sentence and its (possibly unsplit) second sentence.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    pub(crate) ext_id: String,
    pub(crate) group: String,
    pub(crate) sent1: String,
    pub(crate) second: Second,
    /// Provenance carried over from a SWAG CSV.
    pub(crate) gold_source: Option<String>,
    /// Where the record is, for messages: "file:line" or "file: video ID".
    pub(crate) origin: String,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Second {
    /// The whole second sentence; afkit splits it.
    Unsplit(String),
    /// `sent2` and the ending as given by the input.
    Split { sent2: String, ending: String },
}

/// A file read whole: its raw bytes' checksum (for the source) and its records. Only ingest
/// looks inside; [`crate::Format::read`] hands it out so that a reader can be run on its own.
pub struct Parsed {
    pub(crate) sha256: String,
    pub(crate) records: Vec<Record>,
    /// Every sentence of the input once, for the rare-token counts.
    pub(crate) sentences: Vec<String>,
}

/// Reads a file as UTF-8 text without the byte-order mark some editors put first (the hash is of
/// the file as it is); an empty file, a missing file or invalid UTF-8 is an error.
fn read_text(path: &Path, expected: &str) -> Result<(String, String)> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let sha256 = format!("{:x}", Sha256::digest(&bytes));
    let text = String::from_utf8(bytes).map_err(|e| {
        let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
        let line = valid.iter().filter(|&&b| b == b'\n').count() + 1;
        anyhow!(
            "{}:{line}: invalid UTF-8 (byte {}); expected UTF-8 {expected}",
            path.display(),
            valid.len()
        )
    })?;
    let text = match text.strip_prefix('\u{feff}') {
        Some(rest) => rest.to_string(),
        None => text,
    };
    if text.trim().is_empty() {
        bail!("{}: the file is empty; expected {expected}", path.display());
    }
    Ok((text, sha256))
}

// ----- ActivityNet Captions JSON -----

const ACTIVITYNET: &str =
    "ActivityNet Captions JSON: {\"VIDEO_ID\": {\"sentences\": [\"...\", ...], ...}, ...}";

#[derive(Deserialize)]
struct Video {
    sentences: Vec<String>,
}

/// The top-level object, videos in file order (the record order of the project follows it).
struct Videos(Vec<(String, Video)>);

impl<'de> Deserialize<'de> for Videos {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Videos;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object mapping video ids to {\"sentences\": [...]}")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Videos, A::Error> {
                let mut videos = Vec::new();
                while let Some(entry) = map.next_entry::<String, Video>()? {
                    videos.push(entry);
                }
                Ok(Videos(videos))
            }
        }
        d.deserialize_map(V)
    }
}

/// Every consecutive pair of a video's sentences is a record `"<video>#<i>"` (pair `i` =
/// sentences `i` and `i + 1`, from 0), grouped by video.
pub(crate) fn read_activitynet(path: &Path) -> Result<Parsed> {
    let (text, sha256) = read_text(path, ACTIVITYNET)?;
    let videos: Videos = serde_json::from_str(&text).map_err(|e| {
        anyhow!(
            "{}:{}:{}: {}; expected {ACTIVITYNET}",
            path.display(),
            e.line(),
            e.column(),
            json_error_without_position(&e)
        )
    })?;
    let mut records = Vec::new();
    let mut sentences = Vec::new();
    for (video, v) in videos.0 {
        let captions: Vec<String> = v.sentences.iter().map(|s| clean_sentence(s)).collect();
        for (i, pair) in captions.windows(2).enumerate() {
            records.push(Record {
                ext_id: format!("{video}#{i}"),
                group: video.clone(),
                sent1: pair[0].clone(),
                second: Second::Unsplit(pair[1].clone()),
                gold_source: None,
                origin: format!("{}: video {video}, pair {i}", path.display()),
            });
        }
        sentences.extend(captions);
    }
    if records.is_empty() {
        bail!(
            "{}: no video has two or more sentences, so there is no example; expected {ACTIVITYNET}",
            path.display()
        );
    }
    Ok(Parsed {
        sha256,
        records,
        sentences,
    })
}

// ----- JSONL -----

const JSONL: &str = "one JSON object per line: a context with its ending, {\"id\", \"sent1\", \
     \"sent2\" (optional), \"ending\", \"group\" (optional)}, or a question as afkit's export or \
     HellaSwag writes it, {\"id\" or \"ind\", \"sent1\" or \"ctx_a\", \"sent2\" or \"ctx_b\", \
     \"endings\", \"label\", \"group\" or \"source_id\" (optional)}";

#[derive(Deserialize)]
#[serde(untagged)]
enum Id {
    Text(String),
    Number(i64),
}

impl Id {
    fn text(&self) -> String {
        match self {
            Id::Text(s) => s.trim().to_string(),
            Id::Number(n) => n.to_string(),
        }
    }
}

/// A line in any of the accepted forms; afkit's export has both its own and HellaSwag's names.
#[derive(Deserialize)]
struct JsonlLine {
    id: Option<Id>,
    ind: Option<Id>,
    sent1: Option<String>,
    ctx_a: Option<String>,
    sent2: Option<String>,
    ctx_b: Option<String>,
    ending: Option<String>,
    endings: Option<Vec<String>>,
    /// A number in afkit's export, a string ("0".."3", "" when withheld) in HellaSwag.
    label: Option<Id>,
    group: Option<String>,
    source_id: Option<String>,
    gold_source: Option<String>,
}

/// The found ending of a line: `ending`, or the labelled one of `endings`.
fn found_ending(line: &JsonlLine, at: &str) -> Result<String> {
    if let Some(ending) = &line.ending {
        return Ok(ending.clone());
    }
    let Some(endings) = &line.endings else {
        bail!("{at}: no \"ending\" and no \"endings\"; expected {JSONL}");
    };
    let label = line.label.as_ref().map(Id::text).unwrap_or_default();
    match label.parse::<usize>() {
        Ok(i) if i < endings.len() => Ok(endings[i].clone()),
        _ if label == "-1" || label.is_empty() => bail!(
            "{at}: the label is withheld ({label:?}), so the found ending is unknown; expected a \
             labelled split (a published afkit export keeps its test answers in OUT-test-answers.csv: \
             ingest that with --format swag-csv)"
        ),
        _ => bail!(
            "{at}: label {label:?}; expected the position of the found ending among the {} endings",
            endings.len()
        ),
    }
}

/// One record per non-blank line; without `sent2`, the ending is the whole second sentence.
/// Questions whose gold is a generated ending (afkit's `gen-orig` training examples) are skipped:
/// their context comes with its found ending on another line.
pub(crate) fn read_jsonl(path: &Path) -> Result<Parsed> {
    let (text, sha256) = read_text(path, JSONL)?;
    let mut records = Vec::new();
    let mut sentences = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let at = format!("{}:{}", path.display(), i + 1);
        if line.trim().is_empty() {
            continue;
        }
        let r: JsonlLine = serde_json::from_str(line).map_err(|e| {
            anyhow!(
                "{at}:{}: {}; expected {JSONL}",
                e.column(),
                json_error_without_position(&e)
            )
        })?;
        if r.gold_source
            .as_deref()
            .is_some_and(|s| s.starts_with("gen"))
        {
            continue;
        }
        let id = r.id.as_ref().or(r.ind.as_ref()).map(Id::text);
        let Some(id) = id.filter(|id| !id.is_empty()) else {
            bail!("{at}: no \"id\" (or \"ind\"), or an empty one; expected a non-empty id");
        };
        let Some(sent1) = r.sent1.as_ref().or(r.ctx_a.as_ref()) else {
            bail!("{at}: no \"sent1\" (or \"ctx_a\"); expected {JSONL}");
        };
        let sent1 = clean_sentence(sent1);
        let ending = found_ending(&r, &at)?;
        let second = match r.sent2.as_ref().or(r.ctx_b.as_ref()) {
            Some(sent2) => Second::Split {
                sent2: normalise_space(sent2),
                ending: clean_sentence(&ending),
            },
            None => Second::Unsplit(clean_sentence(&ending)),
        };
        sentences.push(sent1.clone());
        sentences.push(match &second {
            Second::Unsplit(s) => s.clone(),
            Second::Split { sent2, ending } => format!("{sent2} {ending}"),
        });
        let group = r.group.or(r.source_id);
        records.push(Record {
            group: group.map_or_else(|| id.clone(), |g| g.trim().to_string()),
            ext_id: id,
            sent1,
            second,
            gold_source: None,
            origin: at,
        });
    }
    Ok(Parsed {
        sha256,
        records,
        sentences,
    })
}

// ----- SWAG CSV -----

/// The full CSV's annotation types (likely / unlikely) of the gold and each distractor; empty
/// where nobody judged the ending.
const FULL_TYPE_COLUMNS: [&str; 5] = [
    "gold-type",
    "distractor-0-type",
    "distractor-1-type",
    "distractor-2-type",
    "distractor-3-type",
];

/// The full columns ingest requires: all but the type columns, which it does not read, so a full
/// file without them is taken too.
fn swag_full_required() -> Vec<&'static str> {
    FULL_COLUMNS
        .into_iter()
        .filter(|c| !FULL_TYPE_COLUMNS.contains(c))
        .collect()
}

/// SWAG release CSV, regular or full columns, taken as already split. The gold ending is
/// `ending<label>` (regular) or `gold-ending` (full). The id is `"<video-id>:<h>"` with `h` the
/// first 12 hex digits of the SHA-256 of `sent1`, `sent2` and the gold ending (NUL-separated):
/// stable across row order and across regular/full files, so re-ingesting (or ingesting an
/// afkit export) never duplicates an example.
pub(crate) fn read_swag_csv(path: &Path) -> Result<Parsed> {
    let expected = format!(
        "a SWAG CSV with the regular columns ({}) or the full columns ({}, ...)",
        REGULAR_COLUMNS.join(", "),
        swag_full_required().join(", ")
    );
    let (text, sha256) = read_text(path, &expected)?;
    let mut lines = RecordLines::new(text.as_bytes());
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(text.as_bytes());
    let header: Vec<String> = reader
        .headers()
        .map_err(|e| {
            let line = lines.line_of_position(e.position());
            anyhow!("{}:{line}: {e}; expected {expected}", path.display())
        })?
        .iter()
        .map(|h| h.trim().to_string())
        .collect();
    let columns = SwagColumns::find(&header, path, &expected)?;
    let mut records = Vec::new();
    let mut sentences = Vec::new();
    for row in reader.records() {
        let row = row.map_err(|e| {
            let line = lines.line_of_position(e.position());
            anyhow!("{}:{line}: {e}; expected {expected}", path.display())
        })?;
        let origin = format!(
            "{}:{}",
            path.display(),
            lines.line_of_position(row.position())
        );
        if row.len() != header.len() {
            bail!(
                "{origin}: expected {} fields like the header, found {}",
                header.len(),
                row.len()
            );
        }
        let record = columns.record(&row, origin)?;
        if let Second::Split { sent2, ending } = &record.second {
            sentences.push(record.sent1.clone());
            sentences.push(format!("{sent2} {ending}"));
        }
        records.push(record);
    }
    if records.is_empty() {
        bail!(
            "{}: a header but no rows; expected {expected}",
            path.display()
        );
    }
    Ok(Parsed {
        sha256,
        records,
        sentences,
    })
}

/// Where a SWAG CSV keeps the columns ingest reads, and whether it is the full or the regular
/// layout (the full one names the gold ending; the regular one points at it with `label`).
struct SwagColumns {
    full: bool,
    index: std::collections::HashMap<&'static str, usize>,
}

impl SwagColumns {
    fn find(header: &[String], path: &Path, expected: &str) -> Result<SwagColumns> {
        let column = |name: &str| header.iter().position(|h| h == name);
        let full = column("gold-ending").is_some();
        let required = if full {
            swag_full_required()
        } else {
            REGULAR_COLUMNS.to_vec()
        };
        let mut index = std::collections::HashMap::new();
        for name in required {
            let i = column(name).with_context(|| {
                format!(
                    "{}:1: the header has no column `{name}`; expected {expected}",
                    path.display()
                )
            })?;
            index.insert(name, i);
        }
        Ok(SwagColumns { full, index })
    }

    /// One row as a record; `origin` is `file:line`, for errors and provenance.
    fn record(&self, row: &csv::StringRecord, origin: String) -> Result<Record> {
        let get = |name: &str| row[self.index[name]].trim().to_string();
        let gold = if self.full {
            get("gold-ending")
        } else {
            let label = get("label");
            match label.parse::<usize>() {
                Ok(l) if l < 4 => get(&format!("ending{l}")),
                _ if label == "-1" => bail!(
                    "{origin}: label -1: this split's answers are withheld; expected a labelled \
                     file (a published afkit export keeps its test answers in OUT-test-answers.csv)"
                ),
                _ => bail!("{origin}: label {label:?}; expected 0, 1, 2 or 3"),
            }
        };
        let (video, sent1, sent2) = (get("video-id"), get("sent1"), get("sent2"));
        let digest = Sha256::digest(format!("{sent1}\0{sent2}\0{gold}").as_bytes());
        let hash: String = format!("{digest:x}").chars().take(12).collect();
        Ok(Record {
            ext_id: format!("{video}:{hash}"),
            group: video,
            sent1,
            second: Second::Split {
                sent2,
                ending: gold,
            },
            gold_source: Some(get("gold-source")).filter(|s| !s.is_empty()),
            origin,
        })
    }
}

// ----- normalisation -----

/// Collapses runs of whitespace into single spaces and trims.
pub(crate) fn normalise_space(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A caption as a sentence: whitespace normalised, ending with punctuation (a period is added
/// when the caption has none, as many ActivityNet captions lack it).
pub(crate) fn clean_sentence(s: &str) -> String {
    let mut s = normalise_space(s);
    let ends_with_punct = s
        .chars()
        .next_back()
        .is_some_and(|c| matches!(c, '.' | '!' | '?' | '"' | '\'' | '”' | '’' | ')'));
    if !s.is_empty() && !ends_with_punct {
        s.push('.');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_columns_are_full_columns() {
        for column in FULL_TYPE_COLUMNS {
            assert!(FULL_COLUMNS.contains(&column), "{column}");
        }
    }

    fn write(dir: &tempfile::TempDir, name: &str, content: &[u8]) -> std::path::PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, content).unwrap();
        p
    }

    #[test]
    fn activitynet_pairs_in_file_order() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            &dir,
            "a.json",
            br#"{"v_b": {"sentences": ["A man walks in.", "  He sits   down"], "timestamps": []},
                 "v_a": {"sentences": ["One.", "Two.", "Three."]}}"#,
        );
        let parsed = read_activitynet(&p).unwrap();
        let ids: Vec<_> = parsed.records.iter().map(|r| r.ext_id.as_str()).collect();
        assert_eq!(ids, ["v_b#0", "v_a#0", "v_a#1"]);
        assert_eq!(
            parsed.records[0].second,
            Second::Unsplit("He sits down.".into())
        );
        assert_eq!(parsed.records[2].group, "v_a");
        assert_eq!(parsed.sentences.len(), 5);
    }

    #[test]
    fn a_byte_order_mark_before_json_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            &dir,
            "a.json",
            "\u{feff}{\"v\": {\"sentences\": [\"A man walks in.\", \"He sits down.\"]}}".as_bytes(),
        );
        assert_eq!(read_activitynet(&p).unwrap().records.len(), 1);
        let p = write(
            &dir,
            "a.jsonl",
            "\u{feff}{\"id\": \"x\", \"sent1\": \"A man walks in.\", \"sent2\": \"He\", \"ending\": \"sits down.\"}\n"
                .as_bytes(),
        );
        assert_eq!(read_jsonl(&p).unwrap().records.len(), 1);
    }

    #[test]
    fn errors_name_file_line_and_expectation() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(&dir, "bad.json", b"{\"v\": {\"sentences\": [\"a\",]}}");
        let err = format!("{:#}", read_activitynet(&p).err().unwrap());
        assert!(
            err.contains("bad.json:1:") && err.contains("expected ActivityNet"),
            "{err}"
        );
        let p = write(&dir, "missing.json", b"{\"v\": {\"timestamps\": []}}");
        let err = format!("{:#}", read_activitynet(&p).err().unwrap());
        assert!(err.contains("sentences"), "{err}");
        let p = write(
            &dir,
            "x.jsonl",
            b"{\"id\": \"1\", \"sent1\": \"a\", \"ending\": \"b\"}\n{\"id\": 2}\n",
        );
        let err = format!("{:#}", read_jsonl(&p).err().unwrap());
        assert!(err.contains("x.jsonl:2:") && err.contains("sent1"), "{err}");
        let p = write(&dir, "utf.jsonl", b"{\"id\": 1}\n\n{\"id\": \"\xff\"}\n");
        let err = format!("{:#}", read_jsonl(&p).err().unwrap());
        assert!(err.contains("utf.jsonl:3: invalid UTF-8"), "{err}");
        let p = write(&dir, "empty.csv", b"  \n");
        let err = format!("{:#}", read_swag_csv(&p).err().unwrap());
        assert!(err.contains("empty.csv: the file is empty"), "{err}");
        let err = format!(
            "{:#}",
            read_jsonl(&dir.path().join("nope.jsonl")).err().unwrap()
        );
        assert!(err.contains("nope.jsonl"), "{err}");
    }

    #[test]
    fn jsonl_questions_give_their_labelled_ending_and_skip_generated_golds() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            &dir,
            "q.jsonl",
            br#"{"id": "v1#0", "group": "v1", "sent1": "A man sits.", "sent2": "He", "ctx_a": "A man sits.", "ctx_b": "He", "endings": ["runs.", "stands up."], "label": 1, "gold_source": "gold1-orig"}
{"id": "v1#0:gen", "group": "v1", "sent1": "A man sits.", "sent2": "He", "endings": ["runs.", "stands up."], "label": 0, "gold_source": "gen-orig"}
"#,
        );
        let records = read_jsonl(&p).unwrap().records;
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].ext_id, "v1#0");
        assert_eq!(
            records[0].second,
            Second::Split {
                sent2: "He".into(),
                ending: "stands up.".into()
            }
        );
        let p = write(
            &dir,
            "bad.jsonl",
            br#"{"ind": 4, "ctx_a": "A man sits.", "endings": ["runs."], "label": "2"}"#,
        );
        let err = format!("{:#}", read_jsonl(&p).err().unwrap());
        assert!(
            err.contains("bad.jsonl:1: label \"2\"; expected the position"),
            "{err}"
        );
    }

    #[test]
    fn swag_csv_regular_and_full_give_the_same_ids() {
        let dir = tempfile::tempdir().unwrap();
        let regular = write(
            &dir,
            "r.csv",
            b",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n\
              0,anetv_x,7,A man sits. He,A man sits.,He,gold0-orig,runs.,\"stands up, then waves.\",jumps.,eats.,1\n",
        );
        let full = write(
            &dir,
            "f.csv",
            b"video-id,fold-ind,startphrase,sent1,sent2,gold-ending,distractor-0,distractor-1,distractor-2,distractor-3,gold-source,gold-type\n\
              anetv_x,7,A man sits. He,A man sits.,He,\"stands up, then waves.\",runs.,jumps.,eats.,,gold0-orig,likely\n",
        );
        let r = read_swag_csv(&regular).unwrap().records;
        let f = read_swag_csv(&full).unwrap().records;
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].ext_id, f[0].ext_id);
        assert_eq!(
            r[0].second,
            Second::Split {
                sent2: "He".into(),
                ending: "stands up, then waves.".into()
            }
        );
        assert_eq!(r[0].gold_source.as_deref(), Some("gold0-orig"));
        let short = write(
            &dir,
            "short.csv",
            b"video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n\
              v,1,a b,a,b,gold0-orig,x,y,z,w,0\nv,2,a b,a,b,gold0-orig,x,y,z\n",
        );
        let err = format!("{:#}", read_swag_csv(&short).err().unwrap());
        assert!(err.contains("short.csv:3: expected 11 fields"), "{err}");
        let no_col = write(&dir, "nc.csv", b"video-id,sent1\nv,a\n");
        let err = format!("{:#}", read_swag_csv(&no_col).err().unwrap());
        assert!(
            err.contains("nc.csv:1: the header has no column `fold-ind`"),
            "{err}"
        );
    }

    #[test]
    fn clean_sentence_adds_a_period() {
        assert_eq!(clean_sentence(" a  man walks "), "a man walks.");
        assert_eq!(clean_sentence("Really?"), "Really?");
        assert_eq!(clean_sentence("   "), "");
    }
}
