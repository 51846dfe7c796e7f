//! The command line: one subcommand per pipeline stage. Each command's file here (`cli/NAME.rs`)
//! holds its flags, turns them into the stage's plain config, and prints what the stage returns;
//! the stages themselves never see clap.
//!
//! The names and flags are a stable interface for scripts.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use afkit_store::Store;

mod aflite;
mod annotate;
mod assemble;
mod audit;
mod device;
mod export;
mod filter;
mod generate;
mod ingest;
mod lm;
mod models;
mod pool;
mod progress;
mod report;
mod review;
mod status;
mod tagger;

#[derive(Parser)]
#[command(
    name = "afkit",
    version,
    // Short enough for one screen: the version flag and the help command are listed by --help
    // only, and no blank line parts the summary from the usage or the usage from the commands.
    disable_version_flag = true,
    disable_help_subcommand = true,
    help_template = "{about-with-newline}{usage-heading} {usage}\n{all-args}{after-help}",
    about = "Build adversarial multiple-choice benchmarks, SWAG-style",
    after_long_help = "A project is one SQLite file. The pipeline:\n  \
        init → ingest → lm adapt → generate → filter (adversarial filtering) → annotate → \
        assemble (→ crowd review-export / review-import → assemble) → export\n\
        `lm adapt` matters most: it fine-tunes the generator on the corpus, so that its endings \
        are hard to tell from the real ones before filtering starts. Then `audit DIR --cv 5` \
        says how hard the export is; `aflite` de-biases an existing labelled dataset.\n\n\
        Every stage is resumable after Ctrl-C and reproducible from its recorded seed. \
        `afkit COMMAND -h` lists a command's common flags, `--help` all of them."
)]
struct Cli {
    /// Print version.
    #[arg(short = 'V', long, action = clap::ArgAction::Version, hide_short_help = true)]
    version: Option<bool>,
    #[command(subcommand)]
    command: Command,
}

// A command whose flags' struct has a `long_about` (ingest, annotate, agreement, export, score)
// takes its one-line help from that struct's doc comment: one on its variant here would
// replace the long description with nothing.
#[derive(Subcommand)]
enum Command {
    /// Create a new, empty project file.
    Init(InitArgs),
    Ingest(ingest::Args),
    /// Show what the project holds, stage by stage.
    Status(status::StatusArgs),
    /// Train or evaluate afkit's part-of-speech tagger on CoNLL-U treebanks.
    #[command(subcommand)]
    Tagger(tagger::TaggerCommand),
    /// Fetch the default models (SmolLM2 generator, MiniLM encoder) into the model cache.
    #[command(subcommand)]
    Models(models::ModelsCommand),
    /// Adapt the generator to the project's corpus (`lm adapt`), the step that matters most.
    #[command(subcommand)]
    Lm(lm::LmCommand),
    /// Sample counterfactual endings for every context and compute their LM features.
    Generate(generate::GenerateArgs),
    /// Import endings generated elsewhere and compute their LM features.
    ImportPool(generate::ImportPoolArgs),
    /// Move pools between projects: `pool export` writes a bundle, `pool import` reads one.
    #[command(subcommand)]
    Pool(pool::PoolCommand),
    /// Adversarial filtering: the negatives classifiers cannot tell from the found ending.
    Filter(filter::FilterArgs),
    /// Plot and summarise the AF run (accuracy by iteration, per model).
    Report(report::ReportArgs),
    Annotate(annotate::Args),
    Agreement(annotate::AgreementArgs),
    /// Annotation tasks and question reviews out as CSV, results back in.
    #[command(subcommand)]
    Crowd(annotate::CrowdCommand),
    /// Build the final examples from the labels and split them by group.
    Assemble(assemble::Args),
    Export(export::Args),
    Audit(audit::Args),
    Score(audit::ScoreArgs),
    /// AFLite: remove the most predictable examples of a labelled dataset.
    Aflite(aflite::Args),
    /// Print the help of a command (`afkit help lm adapt` is `afkit lm adapt --help`).
    #[command(hide = true)]
    Help {
        command: Vec<String>,
    },
}

#[derive(Args)]
struct InitArgs {
    /// Path of the project file to create (conventionally *.sqlite).
    project: PathBuf,
}

/// Runs the command line and maps errors to an exit status: 1 for errors, 130 for Ctrl-C.
pub fn main() -> ExitCode {
    afkit_engine::runtime::prepare();
    end_quietly_on_a_closed_pipe();
    afkit_engine::interrupt::install_handler();
    let cli = Cli::parse();
    match dispatch(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.is::<afkit_engine::interrupt::Interrupted>() => {
            eprintln!("interrupted: everything reported as done is saved; run the same command again to continue");
            ExitCode::from(130)
        }
        Err(err) => {
            eprintln!("error: {}", message(&err));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes as `{:#}` writes them (`a: b: c`), without the backtrace candle
/// appends to its errors when `RUST_BACKTRACE` is set: afkit's message is what the user needs.
fn message(err: &anyhow::Error) -> String {
    err.chain()
        .map(|cause| match cause.downcast_ref::<candle_core::Error>() {
            Some(e) => without_backtrace(e),
            None => cause.to_string(),
        })
        .collect::<Vec<_>>()
        .join(": ")
}

fn without_backtrace(err: &candle_core::Error) -> String {
    match err {
        candle_core::Error::WithBacktrace { inner, .. } => without_backtrace(inner),
        candle_core::Error::Context { inner, context } => {
            format!("{context}: {}", without_backtrace(inner))
        }
        candle_core::Error::WithPath { inner, path } => {
            format!("{}: {}", path.display(), without_backtrace(inner))
        }
        other => other.to_string(),
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
        Command::Status(args) => status::run(args),
        Command::Tagger(command) => tagger::run_tagger(command),
        Command::Models(command) => models::run_models(command),
        Command::Lm(command) => lm::run_lm(command),
        Command::Generate(args) => generate::run(args),
        Command::ImportPool(args) => generate::import(args),
        Command::Pool(command) => pool::run_pool(command),
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
        Command::Help { command } => {
            let argv = std::iter::once("afkit".to_string())
                .chain(command)
                .chain(std::iter::once("--help".to_string()));
            // Prints the help and exits, as clap's own help command did.
            Cli::parse_from(argv);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// clap's own consistency checks of every command (names, conflicts, defaults that parse as
    /// their flag's type), which it otherwise makes only when a command is first parsed.
    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
