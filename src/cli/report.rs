//! `afkit report`: the latest AF run's plot and summary, and its iterations as JSON.

use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;

use afkit_engine::output::Output;
use afkit_filter::report::report;
use afkit_store::af::{HeadAccuracy, Phase};
use afkit_store::Store;

#[derive(clap::Args)]
pub struct ReportArgs {
    /// The project file.
    pub project: PathBuf,
    /// Directory for af_accuracy.png and report.md.
    #[arg(long)]
    pub out: PathBuf,
    /// Also print the per-iteration record as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Replace files at OUT that afkit did not write (or that were changed since).
    #[arg(long)]
    pub force: bool,
}

/// One element of the `--json` output's `iterations` array (a stable interface for scripts).
#[derive(Serialize)]
struct JsonIteration {
    iteration: usize,
    phase: Phase,
    swaps: usize,
    seconds: f64,
    accuracy: HeadAccuracy,
}

pub fn run(args: ReportArgs) -> Result<()> {
    let store = Store::open(&args.project)?;
    let written = report(&store, &args.out, &Output::new(args.force))?;
    if args.json {
        let rows: Vec<JsonIteration> = written
            .iterations
            .iter()
            .map(|r| JsonIteration {
                iteration: r.iteration,
                phase: r.phase,
                swaps: r.swaps,
                seconds: r.seconds,
                accuracy: r.accuracy,
            })
            .collect();
        println!("{}", serde_json::json!({ "iterations": rows }));
    } else {
        println!(
            "wrote {} and {}",
            written.png.display(),
            written.markdown.display()
        );
    }
    Ok(())
}
