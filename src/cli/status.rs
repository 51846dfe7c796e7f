//! `afkit status`: what the project holds, stage by stage.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::store::Store;

#[derive(Args)]
pub struct StatusArgs {
    /// The project file.
    pub project: PathBuf,
    /// Print one JSON object (a stable interface for scripts) instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: StatusArgs) -> Result<()> {
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
    if s.adapters > 0 {
        println!(
            "adapters     {} (`afkit generate` samples each context with its fold's)",
            s.adapters
        );
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
