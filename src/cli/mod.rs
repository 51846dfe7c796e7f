//! The command line: one subcommand per pipeline stage, each delegating to its module.
//!
//! The names and flags here are a stable interface for scripts; stage modules own their own
//! argument structs so that a stage's options live next to the code that reads them.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use crate::store::Store;

mod aflite;
mod annotate;
mod assemble;
mod audit;
mod device;
mod export;
mod filter;
mod generate;
mod ingest;
mod models;
mod report;
mod tagger;

#[derive(Parser)]
#[command(
    name = "afkit",
    version,
    about = "Build adversarial multiple-choice benchmarks, SWAG-style",
    long_about = "Build adversarial multiple-choice benchmarks, SWAG-style.\n\n\
        A project is one SQLite file. The pipeline:\n  \
        init → ingest → generate → filter (adversarial filtering) → annotate → assemble → export\n\
        plus `audit` (artifact report on any SWAG-format dataset) and `aflite` (de-bias an \
        existing labelled dataset).\n\nEvery stage is resumable after Ctrl-C and reproducible from \
        its recorded seed."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a new, empty project file.
    Init(InitArgs),
    /// Load contexts with their found endings (ActivityNet Captions JSON, JSONL or SWAG CSV).
    Ingest(ingest::Args),
    /// Show what the project holds, stage by stage.
    Status(StatusArgs),
    /// Train or evaluate afkit's part-of-speech tagger on CoNLL-U treebanks.
    #[command(subcommand)]
    Tagger(tagger::TaggerCommand),
    /// Fetch the default models (SmolLM2 generator, MiniLM encoder) into the model cache.
    #[command(subcommand)]
    Models(models::ModelsCommand),
    /// Sample counterfactual endings for every context and compute their LM features.
    Generate(generate::GenerateArgs),
    /// Import endings generated elsewhere and compute their LM features.
    ImportPool(generate::ImportPoolArgs),
    /// Adversarial filtering: pick the negatives a stylistic ensemble cannot tell from the found ending.
    Filter(filter::FilterArgs),
    /// Plot and summarise the AF run (accuracy by iteration, per model).
    Report(report::ReportArgs),
    /// Verify candidates in a terminal UI (likely / unlikely / gibberish, best / second best).
    Annotate(annotate::Args),
    /// Inter-annotator agreement, label distributions and annotator quality.
    Agreement(annotate::AgreementArgs),
    /// Export tasks to, or import results from, a crowdsourcing platform.
    #[command(subcommand)]
    Crowd(annotate::CrowdCommand),
    /// Build the final examples from the labels and split them by group.
    Assemble(assemble::Args),
    /// Write the assembled splits (SWAG CSVs, JSONL, dataset card).
    Export(export::Args),
    /// Audit a SWAG-format dataset for stylistic artifacts.
    Audit(audit::Args),
    /// Grade predicted labels against a split.
    Score(audit::ScoreArgs),
    /// AFLite: remove the most predictable examples of a labelled dataset.
    Aflite(aflite::Args),
}

#[derive(Args)]
struct InitArgs {
    /// Path of the project file to create (conventionally *.sqlite).
    project: PathBuf,
}

#[derive(Args)]
struct StatusArgs {
    /// The project file.
    project: PathBuf,
    /// Print one JSON object (a stable interface for scripts) instead of the table.
    #[arg(long)]
    json: bool,
}

/// Runs the command line and maps errors to an exit status: 1 for errors, 130 for Ctrl-C.
pub fn main() -> ExitCode {
    end_quietly_on_a_closed_pipe();
    crate::interrupt::install_handler();
    let cli = Cli::parse();
    match dispatch(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.is::<crate::interrupt::Interrupted>() => {
            eprintln!("interrupted: everything reported as done is saved; run the same command again to continue");
            ExitCode::from(130)
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// A reader that stops reading (`afkit status P | head -1`, `afkit export --help | grep -q ...`)
/// ends afkit quietly with status 0, as it ends ripgrep: Rust's `println!` panics on a closed
/// pipe, and SIGPIPE's default (death by signal) would fail such a pipeline under
/// `set -o pipefail`. Nothing is lost: every stage commits what it reports before it prints it.
fn end_quietly_on_a_closed_pipe() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        default_hook(info);
    }));
}

fn dispatch(command: Command) -> Result<()> {
    match command {
        Command::Init(args) => {
            Store::create(&args.project)?;
            println!("created project {}", args.project.display());
            Ok(())
        }
        Command::Ingest(args) => ingest::run(args),
        Command::Status(args) => status(args),
        Command::Tagger(command) => tagger::run_tagger(command),
        Command::Models(command) => models::run_models(command),
        Command::Generate(args) => generate::run(args),
        Command::ImportPool(args) => generate::import(args),
        Command::Filter(args) => filter::run(args),
        Command::Report(args) => report::run(args),
        Command::Annotate(args) => annotate::run(args),
        Command::Agreement(args) => annotate::run_agreement(args),
        Command::Crowd(command) => annotate::run_crowd(command),
        Command::Assemble(args) => assemble::run(args),
        Command::Export(args) => export::run(args),
        Command::Audit(args) => audit::run(args),
        Command::Score(args) => audit::run_score(args),
        Command::Aflite(args) => aflite::run(args),
    }
}

fn status(args: StatusArgs) -> Result<()> {
    let store = Store::open(&args.project)?;
    let s = store.status()?;
    if args.json {
        println!("{}", serde_json::to_string(&s)?);
        return Ok(());
    }
    println!("project      {}", args.project.display());
    println!("examples     {}", s.examples);
    let dropped: i64 = s.dropped.values().sum();
    println!("dropped      {dropped}");
    for (reason, n) in &s.dropped {
        println!("  {reason:<16} {n}");
    }
    println!(
        "pools        {} contexts, {} candidate endings ({} short of the requested count)",
        s.contexts_with_pool, s.candidates, s.pool_shortfalls
    );
    let waiting = s.contexts_without_pool - s.unusable_contexts;
    if waiting > 0 && s.contexts_with_pool > 0 {
        println!("  {waiting} contexts have no pool yet: run `afkit generate` again");
    }
    if s.unusable_contexts > 0 {
        println!(
            "  {} contexts are too long for the generating model and were skipped \
             (`afkit generate` lists them)",
            s.unusable_contexts
        );
    }
    println!(
        "filter       {} iterations{}",
        s.af_iterations,
        if s.af_finished {
            ", final scores done"
        } else {
            ""
        }
    );
    if s.af_stale_contexts > 0 && s.af_iterations > 0 {
        println!(
            "  {} contexts got a pool after the last AF run: its results are stale for them",
            s.af_stale_contexts
        );
    }
    if s.af_too_few_candidates > 0 && s.af_iterations > 0 {
        println!(
            "  {} contexts have fewer candidate endings than AF's k and were left out of it",
            s.af_too_few_candidates
        );
    }
    println!("annotation   {} labelled items", s.labelled_items);
    println!("assembled    {} examples", s.assembled);
    Ok(())
}
