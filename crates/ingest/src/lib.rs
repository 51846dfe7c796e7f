//! Ingest: load contexts with their found endings into the project.
//!
//! Three phases, so that bad input never half-writes a project:
//! 1. read and validate every file whole ([`Format::read`]): any error names the file, the line
//!    or record and what was expected, before anything is written;
//! 2. split second sentences before their main verb phrase and apply the filters
//!    ([`filters`]), in parallel;
//! 3. write everything in ONE transaction: a crash, a kill or Ctrl-C leaves the project as it
//!    was, and re-running the same command is idempotent (examples are keyed by their stable
//!    `ext_id`).

mod filters;
mod input;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use afkit_store::examples::NewExample;
use afkit_store::Store;
use filters::{Outcome, TokenCounts};
use input::{Parsed, Record};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// ActivityNet Captions JSON: {video_id: {sentences: [...], ...}}.
    Activitynet,
    /// SWAG release CSV (regular or full column set), taken as already split.
    SwagCsv,
    /// JSON Lines: {"id", "sent1", "sent2"?, "ending", "group"?} per line, or questions as
    /// afkit's export or HellaSwag write them.
    Jsonl,
}

impl Format {
    /// The format the files' extensions name (`.jsonl`, `.csv`, `.json`), for an ingest
    /// without `--format`: every file must have one, and the same.
    pub fn infer(files: &[PathBuf]) -> Result<Format> {
        let mut inferred: Option<(Format, &PathBuf)> = None;
        for file in files {
            let extension = file.extension().map(|e| e.to_string_lossy().to_lowercase());
            let format = match extension.as_deref() {
                Some("jsonl") => Format::Jsonl,
                Some("csv") => Format::SwagCsv,
                Some("json") => Format::Activitynet,
                _ => bail!(
                    "{}: cannot tell the input format from the file name (.jsonl is jsonl, .csv \
                     swag-csv, .json activitynet): give --format jsonl, swag-csv or activitynet",
                    file.display()
                ),
            };
            match inferred {
                Some((first, first_file)) if first != format => bail!(
                    "{} is {} by its extension but {} is {}: one ingest reads one format; \
                     ingest them separately or give --format",
                    first_file.display(),
                    first.name(),
                    file.display(),
                    format.name()
                ),
                _ => inferred = Some((format, file)),
            }
        }
        inferred
            .map(|(format, _)| format)
            .context("no input file given")
    }

    /// Reads and validates one file of this format whole, before anything is written; an error
    /// names the file, the line or record, and what was expected.
    pub fn read(self, path: &Path) -> Result<Parsed> {
        match self {
            Format::Activitynet => input::read_activitynet(path),
            Format::Jsonl => input::read_jsonl(path),
            Format::SwagCsv => input::read_swag_csv(path),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Format::Activitynet => "activitynet",
            Format::SwagCsv => "swag-csv",
            Format::Jsonl => "jsonl",
        }
    }
}

/// What one ingest call did.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Summary {
    /// Input records read.
    pub records: usize,
    /// New examples stored.
    pub kept: usize,
    /// Records already in the project (or repeated in the input).
    pub already_present: usize,
    /// Records not kept, by reason.
    pub dropped: BTreeMap<String, usize>,
    pub seconds: f64,
}

/// What `ingest` does.
#[derive(Debug, Clone)]
pub struct Config {
    /// The input format of every file.
    pub format: Format,
    pub files: Vec<PathBuf>,
    /// Drop records with a token seen fewer times in the ingested corpus (not for SWAG CSV).
    pub min_token_count: Option<u32>,
}

/// What `ingest` reports while it works. Every method has a default that does nothing.
pub trait Observer {
    /// `done` of `total` records have been split and filtered.
    fn records(&mut self, _done: usize, _total: usize) {}
}

/// An observer that ignores everything.
pub struct Silent;

impl Observer for Silent {}

/// Ingests the config's files into the project in one transaction.
pub fn run(store: &mut Store, config: &Config, observer: &mut dyn Observer) -> Result<Summary> {
    let Config {
        format,
        ref files,
        min_token_count,
    } = *config;
    let started = Instant::now();
    let parsed = read_files(format, files)?;

    let filtered = format != Format::SwagCsv;
    let n_records: usize = parsed.iter().map(|(_, p)| p.records.len()).sum();
    let filter = (filtered, min_token_count);
    let outcomes = process_records(&parsed, filter, n_records, observer)?;

    let options = match (min_token_count, filtered) {
        (Some(n), true) => format!("{{\"min_token_count\":{n}}}"),
        _ => "{}".to_string(),
    };
    let mut summary = Summary {
        records: n_records,
        ..Summary::default()
    };
    store.transaction(|tx| {
        let mut seen: HashMap<String, String> = HashMap::new();
        for ((path, p), outcomes) in parsed.iter().zip(outcomes) {
            let source = tx.upsert_source(
                &path.display().to_string(),
                format.name(),
                &p.sha256,
                &options,
            )?;
            for (record, outcome) in p.records.iter().zip(outcomes) {
                if let Some(first) = seen.get(&record.ext_id) {
                    check_same(record, first, &outcome, tx)?;
                    summary.already_present += 1;
                    continue;
                }
                seen.insert(record.ext_id.clone(), record.origin.clone());
                store_outcome(tx, source, record, outcome, &mut summary)?;
                afkit_engine::interrupt::check()?;
            }
        }
        Ok(())
    })?;
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// Reads every file in `format`, in order.
fn read_files(format: Format, files: &[PathBuf]) -> Result<Vec<(PathBuf, Parsed)>> {
    let mut parsed: Vec<(PathBuf, Parsed)> = Vec::with_capacity(files.len());
    for path in files {
        parsed.push((path.clone(), format.read(path)?));
        afkit_engine::interrupt::check()?;
    }
    Ok(parsed)
}

/// What becomes of each record of each file (of `n_records` in all): with `filtered`, the
/// filters run, dropping records with a token seen fewer than `min_token_count` times in all
/// the files.
fn process_records(
    parsed: &[(PathBuf, Parsed)],
    (filtered, min_token_count): (bool, Option<u32>),
    n_records: usize,
    observer: &mut dyn Observer,
) -> Result<Vec<Vec<Outcome>>> {
    let counts = match min_token_count {
        Some(n) if filtered => Some((
            n,
            TokenCounts::from_sentences(parsed.iter().flat_map(|(_, p)| &p.sentences)),
        )),
        _ => None,
    };
    let mut outcomes: Vec<Vec<Outcome>> = Vec::with_capacity(parsed.len());
    let mut done = 0;
    observer.records(done, n_records);
    for (_, p) in parsed {
        outcomes.push(filters::process_all(
            &p.records,
            filtered,
            counts.as_ref().map(|(n, c)| (*n, c)),
            &mut |n| {
                done += n;
                observer.records(done, n_records);
            },
        )?);
    }
    Ok(outcomes)
}

/// Stores a record's example, or why it was dropped, unless the project already has the id.
fn store_outcome(
    tx: &Store,
    source: i64,
    record: &Record,
    outcome: Outcome,
    summary: &mut Summary,
) -> Result<()> {
    match outcome {
        Outcome::Kept(example) => {
            if tx.insert_example(source, &example)? {
                summary.kept += 1;
            } else {
                check_same(record, "the project", &Outcome::Kept(example), tx)?;
                summary.already_present += 1;
            }
        }
        Outcome::Dropped(reason) => {
            if tx.example_text_by_ext_id(&record.ext_id)?.is_some() {
                summary.already_present += 1;
            } else {
                tx.insert_dropped(source, &record.ext_id, reason)?;
                *summary.dropped.entry(reason.to_string()).or_default() += 1;
            }
        }
    }
    Ok(())
}

/// A record whose id is already taken must be the same example (its second sentence may be
/// split differently, e.g. by another tagger version); otherwise the input is inconsistent.
fn check_same(record: &Record, first: &str, outcome: &Outcome, store: &Store) -> Result<()> {
    let Some((sent1, sent2, ending)) = store.example_text_by_ext_id(&record.ext_id)? else {
        return Ok(());
    };
    let stored = input::normalise_space(&format!("{sent2} {ending}"));
    let incoming = match outcome {
        Outcome::Kept(NewExample {
            sent1: s1,
            sent2,
            ending,
            ..
        }) => (
            s1.clone(),
            input::normalise_space(&format!("{sent2} {ending}")),
        ),
        Outcome::Dropped(_) => return Ok(()),
    };
    if incoming != (sent1, stored) {
        bail!(
            "{}: id {:?} is already used by a different example (in {first}); \
             expected ids that identify one example",
            record.origin,
            record.ext_id
        );
    }
    Ok(())
}
