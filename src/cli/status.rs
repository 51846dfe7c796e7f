//! `afkit status`: what the project holds, stage by stage.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use afkit_store::Store;

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
    // A context is an ingested input (its text and its real ending); a question is an assembled
    // four-way item built on one.
    println!("contexts     {}", s.examples);
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
    print_pools(&s);
    print_filter(&s);
    println!(
        "annotation   {}",
        afkit_engine::text::counted(s.labelled_items, "labelled item", "labelled items")
    );
    print_assembly_and_export(&s);
    Ok(())
}

/// `n` contexts, in words.
fn contexts(n: i64) -> String {
    afkit_engine::text::counted(n, "context", "contexts")
}

/// The pools: how many contexts have one, how many still wait for one, and how many cannot.
fn print_pools(s: &afkit_store::status::Status) {
    println!(
        "pools        {}, {} candidate endings ({} with fewer endings than asked for)",
        contexts(s.contexts_with_pool),
        s.candidates,
        s.pool_shortfalls
    );
    let waiting = s.contexts_without_pool - s.unusable_contexts;
    if waiting > 0 && s.contexts_with_pool > 0 {
        println!(
            "  {} without a pool yet (`afkit generate` samples them; --limit stops it early)",
            contexts(waiting)
        );
    }
    if s.unusable_contexts > 0 {
        println!(
            "  {} too long for the generating model, skipped (`afkit generate` lists them)",
            contexts(s.unusable_contexts)
        );
    }
}

/// The AF runs: iterations done, and the contexts they are stale for or leave out.
fn print_filter(s: &afkit_store::status::Status) {
    println!(
        "filter       {}{}",
        afkit_engine::text::counted(s.af_iterations, "iteration", "iterations"),
        if s.af_finished {
            ", final scores done"
        } else {
            ""
        }
    );
    if s.af_stale_contexts > 0 && s.af_iterations > 0 {
        println!(
            "  {} got a pool after the last AF run: its results are stale for them",
            contexts(s.af_stale_contexts)
        );
    }
    if s.af_too_few_candidates > 0 && s.af_iterations > 0 {
        println!(
            "  {} fewer candidate endings than AF's k (left out of AF)",
            afkit_engine::text::counted(s.af_too_few_candidates, "context has", "contexts have")
        );
    }
}

/// The assembly (which AF run it holds, and whether a newer one finished) and the latest
/// export (which assembly it holds), as the export's card states them.
fn print_assembly_and_export(s: &afkit_store::status::Status) {
    let questions = afkit_engine::text::counted(s.assembled, "question", "questions");
    match s.assembly {
        Some(a) if s.assembled > 0 => {
            println!(
                "assembled    {questions} (assembly {}, from AF run {})",
                a.number, a.af_run
            );
            if let Some(latest) = s.latest_finished_af_run.filter(|&l| l > a.af_run) {
                println!("  AF run {latest} finished since: `afkit assemble` again to use it");
            }
        }
        _ => println!("assembled    {questions}"),
    }
    if s.review_items > 0 {
        println!(
            "reviews      {} ({} as shown to reviewers, {} still wanting a review: `afkit crowd \
             review-export`)",
            s.reviews,
            afkit_engine::text::counted(s.review_items, "question", "questions"),
            s.review_items_wanting
        );
    }
    if let Some(e) = &s.last_export {
        let held = e.assembly.map_or_else(String::new, |a| {
            format!(": assembly {}, AF run {}", a.number, a.af_run)
        });
        println!("exported     {}{held} (seed {})", e.dir, e.seed);
        if e.assembly.is_some() && e.assembly != s.assembly {
            println!("  assembled again since: `afkit export` again to publish it");
        }
    }
}
