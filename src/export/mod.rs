//! Export: write the assembled splits as SWAG CSVs, JSONL and a dataset card (SPEC §9).
//!
//! Deterministic: the same project and arguments give byte-identical files (every shuffle is
//! seeded, rows follow assembly order, the card holds no clock time or path). Atomic: the files
//! are written into a temporary directory beside `--out` and renamed into place, so `--out` is
//! always either the previous complete export or the new one, never a half-written mix.

pub mod card;
pub mod rows;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::assemble::split::SPLIT_NAMES;
use crate::store::{assemble as assembled_db, export as export_db, Store};

#[derive(clap::Args)]
pub struct Args {
    /// The project file.
    pub project: PathBuf,
    /// Output directory (replaced whole if it holds a previous export).
    #[arg(long)]
    pub out: PathBuf,
    /// `adversarial` (the AF negatives) or `random` (a control drawn from the pre-AF pool).
    #[arg(long, value_enum, default_value = "adversarial")]
    pub negatives: Negatives,
    /// Seed for the ending order of each example and for the random control (recorded).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
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

/// The file name that marks a directory as an afkit export (safe to replace).
const CARD: &str = "DATASET_CARD.md";

pub fn run(args: Args) -> Result<()> {
    let store = Store::open(&args.project)?;
    let files = export(&store, &args.out, args.negatives, args.seed)?;
    println!("exported to {}", args.out.display());
    for (name, (bytes, _)) in &files {
        println!("  {name:<20} {bytes:>10} bytes");
    }
    Ok(())
}

/// Writes the export and records it; returns file name → (size, SHA-256).
pub fn export(
    store: &Store,
    out: &Path,
    negatives: Negatives,
    seed: u64,
) -> Result<BTreeMap<String, (usize, String)>> {
    let conn = store.conn();
    let mut examples = assembled_db::assembled_examples(conn)?;
    if examples.is_empty() {
        bail!(
            "{} has no assembled examples: run `afkit assemble` first",
            store.path().display()
        );
    }
    let left_out = if negatives == Negatives::Random {
        rows::randomise(
            &mut examples,
            |example_id| assembled_db::pool_texts(conn, example_id),
            seed,
        )?
    } else {
        Vec::new()
    };
    let rows = rows::build(&examples, seed);
    let card_inputs = card::CardInputs::read(store, negatives.as_str(), seed, left_out)?;

    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for split in SPLIT_NAMES {
        let in_split: Vec<&rows::Row> = rows.iter().filter(|r| r.split == split).collect();
        files.insert(format!("{split}.csv"), rows::regular_csv(&in_split, true)?);
        files.insert(format!("{split}_full.csv"), rows::full_csv(&in_split)?);
        files.insert(format!("{split}.jsonl"), rows::jsonl(&in_split)?);
        if split == "test" {
            files.insert(
                "test_unlabeled.csv".into(),
                rows::regular_csv(&in_split, false)?,
            );
        }
    }
    files.insert(CARD.into(), card::render(&card_inputs, &rows).into_bytes());
    write_atomically(out, &files)?;

    let summary: BTreeMap<String, (usize, String)> = files
        .iter()
        .map(|(name, bytes)| (name.clone(), (bytes.len(), hex(&Sha256::digest(bytes)))))
        .collect();
    let hashes: BTreeMap<&String, &String> = summary.iter().map(|(n, (_, h))| (n, h)).collect();
    let dir = fs::canonicalize(out).unwrap_or_else(|_| out.to_path_buf());
    export_db::record_export(
        conn,
        &dir.to_string_lossy(),
        negatives.as_str(),
        seed,
        &serde_json::to_string(&hashes)?,
    )?;
    Ok(summary)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `files` into a fresh temporary directory beside `out`, then swaps it in. An existing
/// `out` must be empty or a previous export (it holds a dataset card); it is replaced whole.
fn write_atomically(out: &Path, files: &BTreeMap<String, Vec<u8>>) -> Result<()> {
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
        if !empty && !out.join(CARD).exists() {
            bail!(
                "{} exists and is not an afkit export (no {CARD}); choose an empty or new directory",
                out.display()
            );
        }
    }
    let staging = tempfile::Builder::new()
        .prefix(".afkit-export-")
        .tempdir_in(&parent)
        .with_context(|| {
            format!(
                "cannot create a temporary directory in {}",
                parent.display()
            )
        })?;
    for (name, bytes) in files {
        let path = staging.path().join(name);
        fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
        crate::interrupt::check()?;
    }
    // Make the staged files durable before they become visible under `out`.
    for name in files.keys() {
        fs::File::open(staging.path().join(name))?.sync_all()?;
    }
    let staged = staging.keep();
    if out.exists() {
        let old = tempfile::Builder::new()
            .prefix(".afkit-old-")
            .tempdir_in(&parent)?
            .keep();
        fs::remove_dir(&old)?;
        fs::rename(out, &old)
            .with_context(|| format!("cannot move the old {} aside", out.display()))?;
        if let Err(err) = fs::rename(&staged, out) {
            let _ = fs::rename(&old, out);
            let _ = fs::remove_dir_all(&staged);
            return Err(err)
                .with_context(|| format!("cannot move the new export to {}", out.display()));
        }
        fs::remove_dir_all(&old)
            .with_context(|| format!("cannot remove the old export {}", old.display()))?;
    } else {
        fs::rename(&staged, out)
            .with_context(|| format!("cannot move the export to {}", out.display()))?;
    }
    Ok(())
}
