//! Export: write the assembled splits as a dataset folder that loads wherever benchmarks are
//! loaded: SWAG CSVs (regular and full), JSONL with HellaSwag's fields, a `README.md` dataset card
//! whose YAML header the Hugging Face Hub and `datasets.load_dataset` read, and
//! lm-evaluation-harness tasks. The test split's labels are withheld from the folder by default
//! and written beside it for the maintainer.
//!
//! Deterministic: the same project and arguments give byte-identical files (every shuffle is
//! seeded, rows follow assembly order, the card holds no clock time or path). Written through
//! `output`: each file goes to a temporary file renamed into place once all are complete, the
//! folder and the answers file beside it as one unit (an interrupted export is finished by the
//! next one, never left as new questions beside old answers), and an export onto a previous one replaces only the files an export wrote there (the folder's
//! ledger lists them), leaving everything else in the folder (an audit, a git repository, the
//! user's own files) alone.

mod card;
mod harness;
mod hub;
mod layout;
mod options;
mod rows;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use afkit_engine::models::hex;
use afkit_engine::output::Output;
use afkit_store::assemble::{AssembledExample, AssemblyInfo};
use afkit_store::dataset::Split;
use afkit_store::export::ExportInfo;
use afkit_store::Store;
use layout::{Layout, CARD};
pub use options::{Negatives, Options};

/// A licence id goes into the card's YAML header: lowercase letters, digits, `.` and `-`.
pub fn parse_license(text: &str) -> Result<String, String> {
    let valid = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-'));
    if valid {
        Ok(text.to_string())
    } else {
        Err(format!(
            "{text:?}: expected a Hugging Face Hub licence id such as cc-by-4.0, apache-2.0 or other"
        ))
    }
}

/// Where a published export's test answers go: beside OUT, named after it.
fn answers_path(out: &Path) -> Result<PathBuf> {
    let name = out
        .file_name()
        .with_context(|| format!("{}: expected a directory name for --out", out.display()))?;
    Ok(out.with_file_name(format!("{}-test-answers.csv", name.to_string_lossy())))
}

/// What `export` does.
#[derive(Debug, Clone)]
pub struct Config {
    /// The dataset folder to write.
    pub out: PathBuf,
    pub options: Options,
    /// Replace files at `out` (and the answers file beside it) that afkit did not write.
    pub force: bool,
}

/// What `export` reports while it works. Every method has a default that does nothing.
pub trait Observer {
    fn note(&mut self, _message: &str) {}
}

/// An observer that ignores everything.
pub struct Silent;

impl Observer for Silent {}

/// What an export wrote.
#[derive(Debug, serde::Serialize)]
pub struct Summary {
    /// File name → (size, SHA-256); the answers file under its own path.
    pub files: BTreeMap<String, (usize, String)>,
    /// The test answers beside the folder, when they were withheld from it.
    pub answers: Option<PathBuf>,
}

/// Writes the export (and, unless the test labels stay in it, the answers file beside it) and
/// records it. Files afkit did not write are replaced only with `force`; the project is never
/// written over.
pub fn run(store: &mut Store, config: &Config, observer: &mut dyn Observer) -> Result<Summary> {
    let Config {
        ref out,
        ref options,
        force,
    } = *config;
    let output = Output::new(force).protect_project(store.path());
    let answers_target = answers_path(out)?;
    prepare_destination(&output, out, &answers_target, options, observer)?;
    let (examples, left_out) = examples_to_export(store, options, observer)?;
    let assembly = store.assembly_info()?;
    warn_if_a_newer_af_run(store, assembly, observer)?;
    let mut rows = rows::build(&examples, options.seed);
    let passed = store.review_passed()?;
    for (row, ex) in rows.iter_mut().zip(&examples) {
        row.could_be_right = could_be_right(store, ex, passed.get(&ex.example_id))?;
    }
    let layout = Layout::new(options.with_test_labels)
        .with_present(|split| rows.iter().any(|r| r.split == split));
    for split in Split::ALL.into_iter().filter(|s| !layout.present(*s)) {
        observer.note(&format!(
            "the {split} split has no examples: it gets no files and no place in the card"
        ));
    }
    let card_inputs = card::CardInputs::read(store, options, layout, left_out)?;
    let files = folder_files(&rows, &card_inputs)?;
    let answers = if layout.with_test_labels || !layout.present(Split::Test) {
        None
    } else {
        let test: Vec<&rows::Row> = rows.iter().filter(|r| r.split == Split::Test).collect();
        Some((answers_target, rows::regular_csv(&test, true)?))
    };
    // The folder and the answers beside it are one unit: an interrupted export leaves the old
    // ones or the new ones, never new questions beside old answers.
    output.folder_and_beside(out, &files, WRITER, answers.as_slice())?;
    let written = written_files(&files, answers.as_ref());
    record(store, out, options, assembly, &written)?;
    Ok(Summary {
        files: written,
        answers: answers.map(|(path, _)| path),
    })
}

/// Readies OUT and the answers file's place beside it: an earlier export killed while its files
/// were being put in place is finished first (its journal is in OUT, or beside it where the
/// answers file goes), and an answers file afkit did not write stops the export unless forced.
fn prepare_destination(
    output: &Output,
    out: &Path,
    answers_target: &Path,
    options: &Options,
    observer: &mut dyn Observer,
) -> Result<()> {
    for folder in [out, answers_target.parent().unwrap_or(Path::new("."))] {
        if let Some(note) = output.finish_interrupted(folder)? {
            observer.note(&note);
        }
    }
    if !options.with_test_labels {
        output.check(answers_target)?;
    }
    Ok(())
}

/// The size and SHA-256 of every file written: the folder's by name, the answers file by path.
fn written_files(
    files: &BTreeMap<String, Vec<u8>>,
    answers: Option<&(PathBuf, Vec<u8>)>,
) -> BTreeMap<String, (usize, String)> {
    let mut written: BTreeMap<String, (usize, String)> = files
        .iter()
        .map(|(name, bytes)| (name.clone(), summarise(bytes)))
        .collect();
    if let Some((path, bytes)) = answers {
        written.insert(path.display().to_string(), summarise(bytes));
    }
    written
}

/// Records the export in the project: where it went, with which negatives, seed and assembly,
/// and the hash of every file written.
fn record(
    store: &Store,
    out: &Path,
    options: &Options,
    assembly: Option<AssemblyInfo>,
    written: &BTreeMap<String, (usize, String)>,
) -> Result<()> {
    let hashes: BTreeMap<&String, &String> = written.iter().map(|(n, (_, h))| (n, h)).collect();
    let dir = fs::canonicalize(out).unwrap_or_else(|_| out.to_path_buf());
    let info = ExportInfo {
        dir: dir.to_string_lossy().into_owned(),
        negatives: options.negatives.as_str().to_string(),
        seed: options.seed,
        assembly,
    };
    store.record_export(&info, &serde_json::to_string(&hashes)?)?;
    Ok(())
}

/// The assembled examples, with random distractors for the control (and the contexts it leaves
/// out, whose pools have too few other endings).
fn examples_to_export(
    store: &Store,
    options: &Options,
    observer: &mut dyn Observer,
) -> Result<(Vec<AssembledExample>, Vec<String>)> {
    let mut examples = store.assembled_examples()?;
    if examples.is_empty() {
        bail!(
            "{} has no assembled examples: run `afkit assemble` first",
            store.path().display()
        );
    }
    let left_out = if options.negatives == Negatives::Random {
        rows::randomise(
            &mut examples,
            |example_id| store.pool_candidate_texts(example_id),
            options.seed,
        )?
    } else {
        Vec::new()
    };
    if !left_out.is_empty() {
        observer.note(&format!(
            "the random control leaves out {} (fewer than three other endings in the pool; \
             the card lists them)",
            afkit_engine::text::counted(left_out.len(), "context", "contexts")
        ));
    }
    Ok((examples, left_out))
}

/// Whether a question could have a second right answer: an unverified one (or any with random
/// negatives, which no annotator saw) with a shown distractor that could be right
/// (`afkit_store::risk`) and that no review of its context passed (`passed`). Verified questions
/// never: annotators labelled their distractors.
fn could_be_right(
    store: &Store,
    ex: &AssembledExample,
    passed: Option<&HashMap<i64, i64>>,
) -> Result<bool> {
    if ex.verified && ex.distractors.iter().all(|d| d.2.is_some()) {
        return Ok(false);
    }
    let read_by_a_person = |e: &i64| passed.is_some_and(|p| p.contains_key(e));
    let shown: Vec<i64> = ex
        .distractors
        .iter()
        .take(3)
        .map(|d| d.0)
        .filter(|e| !read_by_a_person(e))
        .collect();
    afkit_store::risk::question_could_be_right(store, ex.found_ending_id, &shown)
}

/// An AF run that finished after the assembly is not in the export: say so, since the card and
/// `status` credit the assembly's run.
fn warn_if_a_newer_af_run(
    store: &Store,
    assembly: Option<AssemblyInfo>,
    observer: &mut dyn Observer,
) -> Result<()> {
    let (Some(assembly), Some(latest)) = (assembly, store.latest_finished_af_run()?) else {
        return Ok(());
    };
    if latest.id > assembly.af_run {
        observer.note(&format!(
            "warning: this exports assembly {} of AF run {}, but AF run {} finished since: run \
             `afkit assemble` again to export the newer run",
            assembly.number, assembly.af_run, latest.id
        ));
    }
    Ok(())
}

/// Who wrote a file, in the ledger: a re-export removes the files an export wrote before and no
/// longer writes.
const WRITER: &str = "export";

/// Every file of the folder: path relative to it → contents.
fn folder_files(
    rows: &[rows::Row],
    card_inputs: &card::CardInputs,
) -> Result<BTreeMap<String, Vec<u8>>> {
    let layout = &card_inputs.layout;
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for split in Split::ALL.into_iter().filter(|s| layout.present(*s)) {
        let in_split: Vec<&rows::Row> = rows.iter().filter(|r| r.split == split).collect();
        let labelled = layout.labelled(split);
        files.insert(
            layout.regular(split),
            rows::regular_csv(&in_split, labelled)?,
        );
        if layout.has_full(split) {
            files.insert(layout.full(split), rows::full_csv(&in_split)?);
        }
        files.insert(layout.jsonl(split), rows::jsonl(&in_split, labelled)?);
    }
    for (path, text) in harness::task_files(layout) {
        files.insert(path, text.into_bytes());
    }
    let meta = hub::HubMeta {
        pretty_name: &card_inputs.project_name,
        license: &card_inputs.license,
        rows: rows.len(),
        examples: Split::ALL.map(|split| rows.iter().filter(|r| r.split == split).count()),
        files: &files,
    };
    let mut readme = hub::front_matter(&meta, layout);
    readme.push_str(&card::render(card_inputs, rows));
    files.insert(CARD.into(), readme.into_bytes());
    Ok(files)
}

fn summarise(bytes: &[u8]) -> (usize, String) {
    (bytes.len(), hex(&Sha256::digest(bytes)))
}
