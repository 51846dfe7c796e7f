//! `afkit export`: flags → `export::Options`, and the files written.

use std::path::PathBuf;

use anyhow::Result;

use super::progress::Notes;
use afkit_engine::seed::Seed;
use afkit_export::{self as export, parse_license, Negatives, Options};
use afkit_store::Store;

/// Help heading after the common options.
const PUBLISHING: &str = "Publishing";

/// Write the assembled splits (SWAG CSVs, JSONL, dataset card).
#[derive(clap::Args)]
#[command(long_about = "Write the assembled splits as a dataset folder.\n\n\
    OUT holds train/val/test.csv (SWAG's regular columns after an unnamed row-number column, as in \
    the SWAG release), train/val_full.csv (SWAG's full columns, in the release's order), \
    jsonl/{train,val,test}.jsonl (afkit's and HellaSwag's fields), lm_eval/ (lm-evaluation-harness \
    tasks afkit_swag and afkit_hellaswag, run from OUT with --include_path lm_eval) and README.md, \
    the dataset card with the metadata the Hugging Face Hub reads: datasets.load_dataset(OUT) and \
    load_dataset(OUT, \"full\") load it.\n\n\
    The folder is ready to publish: the test split's labels are -1 in it, and test_full.csv is not \
    written. The answers go to OUT-test-answers.csv beside the folder (the labelled test.csv: keep \
    it, and grade test predictions with `afkit score OUT-test-answers.csv PREDICTIONS`). \
    --with-test-labels keeps every label in the folder instead, for internal use.")]
pub struct Args {
    /// The project file.
    pub project: PathBuf,
    /// Output directory.
    ///
    /// Exporting onto a previous export replaces only the files an export wrote there; everything else in the folder (an audit, a git repository, your files) stays.
    #[arg(long)]
    pub out: PathBuf,
    /// Replace files at OUT that afkit did not write, or that were changed since.
    ///
    /// This covers the answers file beside OUT too; without it such a file stops the export before anything is written.
    #[arg(long)]
    pub force: bool,
    /// `adversarial` (the AF negatives) or `random` (a control from the pre-AF pool).
    #[arg(long, value_enum, default_value = "adversarial")]
    pub negatives: Negatives,
    /// Seed for the ending order of each example and for the random control (recorded).
    #[arg(long, default_value_t = Seed::default())]
    pub seed: Seed,
    /// Keep the test split's labels in OUT, for internal measurement.
    ///
    /// The labels and test_full.csv stay in OUT; without this flag they are withheld, so OUT can be
    /// published.
    #[arg(long, help_heading = PUBLISHING)]
    pub with_test_labels: bool,
    /// The dataset's licence, as a Hugging Face Hub licence id (cc-by-4.0, apache-2.0, ...).
    ///
    /// It goes into the card's metadata; the terms of your inputs and generator decide it.
    #[arg(long, default_value = "unknown", value_parser = parse_license, help_heading = PUBLISHING)]
    pub license: String,
    /// The dataset's name in the card (its title and the Hub's pretty_name) [default: the project
    /// file's name without its extension].
    #[arg(long, value_parser = parse_name, help_heading = PUBLISHING)]
    pub name: Option<String>,
}

fn parse_name(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        Err("expected a name with at least one visible character".into())
    } else {
        Ok(text.trim().to_string())
    }
}

pub fn run(args: Args) -> Result<()> {
    let mut store = Store::open(&args.project)?;
    let options = Options {
        negatives: args.negatives,
        seed: args.seed,
        with_test_labels: args.with_test_labels,
        license: args.license,
        name: args.name,
    };
    let config = export::Config {
        out: args.out.clone(),
        options,
        force: args.force,
    };
    let summary = export::run(&mut store, &config, &mut Notes)?;
    println!("exported to {}", args.out.display());
    for (name, (bytes, _)) in &summary.files {
        println!("  {name:<28} {bytes:>10} bytes");
    }
    if let Some(answers) = &summary.answers {
        println!(
            "the test answers are in {} (keep it private)",
            answers.display()
        );
    }
    Ok(())
}
