//! `afkit ingest`: flags → `ingest::run`, its progress bar and its summary.

use std::path::PathBuf;

use anyhow::Result;

use super::progress::Lines;
use afkit_ingest::{self as ingest, Format};
use afkit_store::Store;

/// Load contexts with their found endings (ActivityNet Captions JSON, JSONL or SWAG CSV).
#[derive(clap::Args)]
#[command(
    long_about = "Load contexts with their found endings into the project.\n\n\
    activitynet: ActivityNet Captions JSON; every pair of consecutive captions of a video is one \
    example (id \"VIDEO#i\", group = video). The second caption is tokenised, tagged with afkit's \
    tagger and split before its main verb phrase into sent2 and the ending.\n\
    jsonl: {\"id\", \"sent1\", \"sent2\"?, \"ending\", \"group\"?} per line; without sent2 the \
    ending is the whole second sentence and is split as above; group defaults to the id. Questions \
    as afkit's export (jsonl/*.jsonl) or HellaSwag write them read too: \"ctx_a\"/\"ctx_b\" for \
    sent1/sent2, \"ind\" for the id, \"source_id\" for the group, and the found ending is \
    endings[label]; afkit's gen-orig questions (a generated gold) are skipped.\n\
    swag-csv: a SWAG release CSV (regular or full columns), taken as already split.\n\n\
    In every format a context (sent1 + sent2) of more than 256 tokens is dropped as long_context: \
    no caption pair is that long, and generation could not use it. ActivityNet and JSONL records are also \
    filtered, each drop counted by reason: no_verb_phrase, short_context (sent1 + sent2 under 6 \
    tokens), short_ending (under 5 tokens), long_ending (over 25 tokens; tokens include \
    punctuation) and, with --min-token-count N, rare_token.\n\n\
    All files of one call are written in one transaction: on any error nothing is written. \
    Re-ingesting the same input is a no-op."
)]
pub struct Args {
    /// The project file.
    pub project: PathBuf,
    /// Input format of every FILE [default: from the extension: .jsonl jsonl, .csv swag-csv,
    /// .json activitynet].
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Drop examples containing a token seen fewer than N times in the ingested corpus
    /// (SWAG footnote 2 uses 4 on the full corpus; on a small corpus it drops nearly everything).
    #[arg(long, value_name = "N")]
    pub min_token_count: Option<u32>,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Input files.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

pub fn run(args: Args) -> Result<()> {
    let mut store = Store::open(&args.project)?;
    let config = ingest::Config {
        format: match args.format {
            Some(format) => format,
            None => Format::infer(&args.files)?,
        },
        files: args.files.clone(),
        min_token_count: args.min_token_count,
    };
    let mut progress = IngestBars::default();
    let summary = ingest::run(&mut store, &config, &mut progress)?;
    progress.0.clear();
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
        return Ok(());
    }
    let dropped: usize = summary.dropped.values().sum();
    println!(
        "read {} from {} in {:.2} s ({:.0} records/s)",
        afkit_engine::text::counted(summary.records, "record", "records"),
        afkit_engine::text::counted(args.files.len(), "file", "files"),
        summary.seconds,
        summary.records as f64 / summary.seconds.max(1e-9)
    );
    println!("  kept             {}", summary.kept);
    println!("  already present  {}", summary.already_present);
    println!("  dropped          {dropped}");
    for (reason, n) in &summary.dropped {
        println!("    {reason:<15}{n}");
    }
    Ok(())
}

/// The bar of records split and filtered.
#[derive(Default)]
struct IngestBars(Lines);

impl ingest::Observer for IngestBars {
    fn records(&mut self, done: usize, total: usize) {
        self.0.track(done, total, "records");
    }
}
