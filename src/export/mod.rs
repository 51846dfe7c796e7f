//! Export: write the assembled splits as a dataset folder that loads wherever benchmarks are
//! loaded: SWAG CSVs (regular and full), JSONL with HellaSwag's fields, a `README.md` dataset card
//! whose YAML header the Hugging Face Hub and `datasets.load_dataset` read, and
//! lm-evaluation-harness tasks. The test split's labels are withheld from the folder by default
//! and written beside it for the maintainer.
//!
//! Deterministic: the same project and arguments give byte-identical files (every shuffle is
//! seeded, rows follow assembly order, the card holds no clock time or path). Atomic: the files
//! are written into a temporary directory beside `--out` and renamed into place, so `--out` is
//! always either the previous complete export or the new one, never a half-written mix.

pub mod card;
pub mod harness;
pub mod hub;
pub mod layout;
pub mod rows;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::dataset::Split;
use crate::models::hex;
use crate::store::Store;
use layout::{Layout, CARD, LEGACY_CARD};

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

/// The export's settings, as recorded and as the card reports them.
#[derive(Debug, Clone)]
pub struct Options {
    pub negatives: Negatives,
    pub seed: u64,
    pub layout: Layout,
    pub license: String,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Negatives {
    Adversarial,
    Random,
}

impl Negatives {
    fn as_str(self) -> &'static str {
        match self {
            Negatives::Adversarial => "adversarial",
            Negatives::Random => "random",
        }
    }
}

/// Where a published export's test answers go: beside OUT, named after it.
pub fn answers_path(out: &Path) -> Result<PathBuf> {
    let name = out
        .file_name()
        .with_context(|| format!("{}: expected a directory name for --out", out.display()))?;
    Ok(out.with_file_name(format!("{}-test-answers.csv", name.to_string_lossy())))
}

/// Writes the export (and, unless the test labels stay in it, the answers file beside it) and
/// records it; returns file name → (size, SHA-256), the answers file under its own name.
pub fn export(
    store: &Store,
    out: &Path,
    options: &Options,
) -> Result<BTreeMap<String, (usize, String)>> {
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
    let rows = rows::build(&examples, options.seed);
    let card_inputs = card::CardInputs::read(store, options, left_out)?;
    let files = folder_files(&rows, &card_inputs, options)?;
    let answers = if options.layout.with_test_labels {
        None
    } else {
        let test: Vec<&rows::Row> = rows.iter().filter(|r| r.split == Split::Test).collect();
        Some((answers_path(out)?, rows::regular_csv(&test, true)?))
    };
    write_atomically(out, &files, answers.as_ref())?;

    let mut summary: BTreeMap<String, (usize, String)> = files
        .iter()
        .map(|(name, bytes)| (name.clone(), summarise(bytes)))
        .collect();
    if let Some((path, bytes)) = &answers {
        summary.insert(path.display().to_string(), summarise(bytes));
    }
    let hashes: BTreeMap<&String, &String> = summary.iter().map(|(n, (_, h))| (n, h)).collect();
    let dir = fs::canonicalize(out).unwrap_or_else(|_| out.to_path_buf());
    store.record_export(
        &dir.to_string_lossy(),
        options.negatives.as_str(),
        options.seed,
        &serde_json::to_string(&hashes)?,
    )?;
    Ok(summary)
}

/// Every file of the folder: path relative to it → contents.
fn folder_files(
    rows: &[rows::Row],
    card_inputs: &card::CardInputs,
    options: &Options,
) -> Result<BTreeMap<String, Vec<u8>>> {
    let layout = &options.layout;
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for split in Split::ALL {
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
        license: &options.license,
        rows: rows.len(),
    };
    let mut readme = hub::front_matter(&meta, layout);
    readme.push_str(&card::render(card_inputs, rows));
    files.insert(CARD.into(), readme.into_bytes());
    Ok(files)
}

fn summarise(bytes: &[u8]) -> (usize, String) {
    (bytes.len(), hex(&Sha256::digest(bytes)))
}

/// Whether `dir` holds a previous afkit export (its card), so that replacing it loses nothing
/// of the user's.
fn is_previous_export(dir: &Path) -> bool {
    let card = fs::read_to_string(dir.join(CARD)).unwrap_or_default();
    let header = card
        .strip_prefix("---\n")
        .and_then(|rest| rest.split("\n---\n").next());
    let tag = format!("- {}", hub::AFKIT_TAG);
    let tagged = header.is_some_and(|h| h.lines().any(|l| l == tag));
    tagged || dir.join(LEGACY_CARD).exists()
}

/// Writes `files` into a fresh temporary directory beside `out`, then swaps it in, then moves the
/// answers file (staged beside it as well) to its place. An existing `out` must be empty or a
/// previous export; it is replaced whole.
fn write_atomically(
    out: &Path,
    files: &BTreeMap<String, Vec<u8>>,
    answers: Option<&(PathBuf, Vec<u8>)>,
) -> Result<()> {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).with_context(|| format!("cannot create {}", parent.display()))?;
    if out.exists() {
        if !out.is_dir() {
            bail!("{} exists and is not a directory", out.display());
        }
        let empty = fs::read_dir(out)?.next().is_none();
        if !empty && !is_previous_export(out) {
            bail!(
                "{} exists and is not an afkit export (no afkit {CARD}); choose an empty or new directory",
                out.display()
            );
        }
    }
    let staged_answers = answers
        .map(|(_, bytes)| stage_file(&parent, bytes))
        .transpose()?;
    let staged = stage_folder(&parent, files)?;
    swap_in(&staged, out, &parent)?;
    if let (Some(temp), Some((path, _))) = (staged_answers, answers) {
        temp.persist(path)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Writes `bytes` to a durable temporary file in `parent`, to be renamed into place.
fn stage_file(parent: &Path, bytes: &[u8]) -> Result<tempfile::NamedTempFile> {
    let mut temp = tempfile::Builder::new()
        .prefix(".afkit-answers-")
        .tempfile_in(parent)
        .with_context(|| format!("cannot create a temporary file in {}", parent.display()))?;
    std::io::Write::write_all(&mut temp, bytes)?;
    temp.as_file().sync_all()?;
    Ok(temp)
}

/// Writes `files` (paths relative to the folder) into a new durable temporary folder in `parent`.
fn stage_folder(parent: &Path, files: &BTreeMap<String, Vec<u8>>) -> Result<PathBuf> {
    let staging = tempfile::Builder::new()
        .prefix(".afkit-export-")
        .tempdir_in(parent)
        .with_context(|| {
            format!(
                "cannot create a temporary directory in {}",
                parent.display()
            )
        })?;
    for (name, bytes) in files {
        let path = staging.path().join(name);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
        crate::interrupt::check()?;
    }
    // Make the staged files durable before they become visible under `out`.
    for name in files.keys() {
        fs::File::open(staging.path().join(name))?.sync_all()?;
    }
    Ok(staging.keep())
}

/// Renames the staged folder to `out`, moving a previous `out` aside first and removing it after.
fn swap_in(staged: &Path, out: &Path, parent: &Path) -> Result<()> {
    if out.exists() {
        let old = tempfile::Builder::new()
            .prefix(".afkit-old-")
            .tempdir_in(parent)?
            .keep();
        fs::remove_dir(&old)?;
        fs::rename(out, &old)
            .with_context(|| format!("cannot move the old {} aside", out.display()))?;
        if let Err(err) = fs::rename(staged, out) {
            let _ = fs::rename(&old, out);
            let _ = fs::remove_dir_all(staged);
            return Err(err)
                .with_context(|| format!("cannot move the new export to {}", out.display()));
        }
        fs::remove_dir_all(&old)
            .with_context(|| format!("cannot remove the old export {}", old.display()))?;
    } else if let Err(err) = fs::rename(staged, out) {
        let _ = fs::remove_dir_all(staged);
        return Err(err).with_context(|| format!("cannot move the export to {}", out.display()));
    }
    Ok(())
}
