//! `afkit pool export` / `afkit pool import`: a project's pools as a bundle file, and back.

use std::path::PathBuf;

use anyhow::Result;

use afkit_engine::output::Output;
use afkit_engine::text::counted;
use afkit_generate::bundle::{export_bundle, import_bundle, ImportSummary, Unfit};
use afkit_store::Store;

#[derive(clap::Subcommand)]
pub enum PoolCommand {
    /// Write the project's pools, with every feature and score, to a bundle file.
    ///
    /// The bundle holds the generation jobs (model, its SHA-256, prompt, settings, seed), each
    /// pooled context's pool row, its generated endings with their LM features, the scorer
    /// models' scores of every ending (`filter --scorer`), growth rounds and the contexts a
    /// generation job could not use. It does not hold the corpus: contexts are named by their
    /// ingested id (e.g. `video#index`) with a hash of their text and found ending, so a bundle
    /// of a few MB can be kept in a repository while the corpus is ingested again. Nor does it
    /// hold sentence vectors (`filter` recomputes them) or AF runs. The same pools give the same
    /// bytes. A zip archive of JSON lines, format version 1.
    Export(ExportArgs),
    /// Add the pools of a bundle to a project that ingested the same contexts.
    ///
    /// Every context of the bundle must be in the project (same id) with the same text and found
    /// ending, and must not have a pool yet (a bundle adds pools, it never replaces one); the
    /// contexts its pools were primed with must be ingested too. The whole bundle is checked
    /// before anything is written, and the problems are listed by context id: one refused
    /// context refuses the bundle, unless `--leave-out-unfit` is given. Then everything is
    /// written in one transaction, so a killed import leaves the project as it was (run it
    /// again). After it, `afkit filter` works on the pools as in the project they came from:
    /// with the same settings and seed it makes the same choices.
    Import(ImportArgs),
}

#[derive(clap::Args)]
pub struct ExportArgs {
    /// The project file.
    pub project: PathBuf,
    /// The bundle to write (conventionally *.afpool.zip).
    pub file: PathBuf,
    /// Replace FILE even if afkit did not write it.
    #[arg(long)]
    pub force: bool,
}

#[derive(clap::Args)]
pub struct ImportArgs {
    /// The project file (with the bundle's contexts ingested).
    pub project: PathBuf,
    /// The bundle, from `afkit pool export`.
    pub file: PathBuf,
    /// Import the contexts that fit and leave out those that do not, each listed with its
    /// reason.
    ///
    /// For a corpus that ingests slightly differently from the one the bundle was made from
    /// (ingest's rules for splitting a caption change between afkit versions, and a context
    /// they now drop also leaves out every pool that was primed with it). Comparisons with
    /// figures made on the whole bundle are then on fewer contexts.
    #[arg(long)]
    pub leave_out_unfit: bool,
}

pub fn run_pool(command: PoolCommand) -> Result<()> {
    match command {
        PoolCommand::Export(args) => {
            let store = Store::open(&args.project)?;
            let s = export_bundle(&store, &args.file, &Output::new(args.force))?;
            println!(
                "wrote {} ({} bytes): {}, {} of them with a pool, {}",
                s.file.display(),
                s.bytes,
                counted(s.contexts, "context", "contexts"),
                s.pools,
                counted(s.endings, "generated ending", "generated endings")
            );
        }
        PoolCommand::Import(args) => {
            let mut store = Store::open(&args.project)?;
            let unfit = match args.leave_out_unfit {
                true => Unfit::LeaveOut,
                false => Unfit::Refuse,
            };
            let s = import_bundle(&mut store, &args.file, unfit)?;
            print_import(&s, &args.file);
        }
    }
    Ok(())
}

fn print_import(s: &ImportSummary, file: &std::path::Path) {
    println!(
        "imported {} ({} with a pool, {} generated endings) from {}",
        counted(s.contexts, "context", "contexts"),
        s.pools,
        s.endings,
        file.display()
    );
    if s.left_out.is_empty() {
        return;
    }
    println!(
        "left out {} the project cannot take:",
        counted(s.left_out.len(), "context", "contexts")
    );
    for l in &s.left_out {
        println!("  {}: {}", l.id, l.reason);
    }
}
