//! `afkit crowd review-export` and `afkit crowd review-import`: assembled questions out to
//! reviewers, their verdicts back in.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use afkit_annotate::crowd::instructions_path;
use afkit_annotate::review;
use afkit_engine::output::Output;
use afkit_engine::seed::Seed;
use afkit_engine::text::counted;
use afkit_store::review::ReviewTally;
use afkit_store::Store;

/// The review variants of `afkit crowd`.
#[derive(clap::Subcommand)]
pub enum ReviewCommand {
    /// Write the assembled questions that still want a review as CSV.
    #[command(
        long_about = "Write the assembled questions that still want a review as CSV, one \
        row per question, as a test taker sees it: the context and its four endings in a \
        shuffled order, the real one not marked.\n\n\
        The annotation rounds judge each ending on its own; read as a question, a wrong answer \
        can still fit as well as the real one, or be broken English. A reviewer picks the ending \
        that follows and names every other that could also follow (also_plausible) and every \
        broken one (broken). `afkit assemble` then never shows an ending a review named, or \
        picked over the real one, as a distractor of that context again: it takes the next \
        candidate, or asks for a spare round of annotation when too few are left. Run \
        review-export again after assembling: the questions that changed go out again, the others \
        keep their reviews.\n\n\
        Columns: item_id (the project's fingerprint, r and the item's number, e.g. \
        3f9a0c1b2d4e-r17: quote it back in the results), assignments (reviews still wanted), \
        context (sent1 + sent2), sent1, sent2, ending_a .. ending_d. Questions whose answer is a \
        generation (training examples of verified assembly) are not reviewed. Beside OUT it \
        writes OUT's name with .instructions.md: the instructions for the reviewers. Text cells \
        that a spreadsheet would run as a formula get a leading ' as in `crowd export`."
    )]
    #[command(name = "review-export")]
    Export {
        project: PathBuf,
        /// The CSV file to write (never the project; an existing file afkit did not write needs
        /// --force).
        #[arg(long)]
        out: PathBuf,
        /// Reviews wanted of each question (raised on questions that wanted fewer); any one
        /// review's verdicts count.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..=20))]
        reviewers: i64,
        /// Seed of the questions' order in the file (a caption's context is often the caption
        /// before it, which would give that question's answer away) and of the endings' order of
        /// a question new to review (recorded with it).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Replace OUT even if afkit did not write it (or it was changed since).
        #[arg(long)]
        force: bool,
    },
    /// Read reviewers' verdicts into the project.
    #[command(long_about = "Read reviewers' verdicts into the project.\n\n\
        Columns: worker_id, item_id, pick (the letter, A to D, of the ending the reviewer thinks \
        follows), also_plausible and broken (letters separated by spaces or commas, blank for \
        none), and optionally submitted_at (RFC 3339 UTC); the export's text columns, where the \
        file carries them, must match the item.\n\n\
        Every row is validated: items of another project, unknown items, letters other than A \
        to D, an empty pick, a wrong number of fields, texts that do not match, a reviewer's \
        second review of an item and reviews beyond those an item wants are reported with their \
        line and not imported. The valid rows are imported in one transaction; with --strict \
        nothing is imported if any row is invalid. Run `afkit assemble` afterwards: it sets \
        aside every ending a review named or picked over the real one.")]
    #[command(name = "review-import")]
    Import {
        project: PathBuf,
        file: PathBuf,
        /// Import nothing (and fail) if any row is invalid.
        #[arg(long)]
        strict: bool,
    },
}

pub fn run_review(command: ReviewCommand) -> Result<()> {
    match command {
        ReviewCommand::Export {
            project,
            out,
            reviewers,
            seed,
            force,
        } => {
            let output = Output::new(force).protect_project(&project);
            output.check(&out)?;
            output.check(&instructions_path(&out))?;
            let mut store = Store::open(&project)?;
            let exported = review::export(&mut store, &out, reviewers, Seed::new(seed), &output)?;
            println!(
                "wrote {} to {}, and the instructions for the reviewers to {}",
                counted(exported.rows, "question", "questions"),
                out.display(),
                exported.instructions.display()
            );
            println!(
                "  {} reviewed already; {} not to review (a generated answer, or fewer than \
                 three distractors)",
                exported.reviewed, exported.not_reviewable
            );
            Ok(())
        }
        ReviewCommand::Import {
            project,
            file,
            strict,
        } => import(&project, &file, strict),
    }
}

fn import(project: &Path, file: &Path, strict: bool) -> Result<()> {
    let mut store = Store::open(project)?;
    let outcome = review::import(&mut store, file, strict)?;
    for r in &outcome.rejected {
        eprintln!("{}:{}: {}", file.display(), r.line, r.reason);
    }
    if strict && !outcome.rejected.is_empty() {
        bail!(
            "{} of the rows in {} are invalid (listed above); nothing imported (--strict)",
            outcome.rejected.len(),
            file.display()
        );
    }
    if outcome.imported == 0 && !outcome.rejected.is_empty() {
        bail!(
            "none of the {} rows in {} could be imported (listed above); nothing imported",
            outcome.rejected.len(),
            file.display()
        );
    }
    println!(
        "imported {} from {}; {} rejected",
        counted(outcome.imported, "review", "reviews"),
        file.display(),
        counted(outcome.rejected.len(), "row", "rows")
    );
    print_tally(&outcome.tally);
    Ok(())
}

fn print_tally(t: &ReviewTally) {
    let share = |k: usize| 100.0 * k as f64 / t.reviews.max(1) as f64;
    println!(
        "the project's reviews: {} of {}; the reviewer picked the real ending in {} ({:.1}%)",
        counted(t.reviews, "review", "reviews"),
        counted(t.items, "question", "questions"),
        t.found_picked,
        share(t.found_picked)
    );
    println!(
        "  endings set aside as distractors: {} picked over the real ending, {} also plausible, \
         {} broken (to replace them: `afkit filter`, which leaves them out of a new AF run, then \
         `afkit assemble`)",
        t.vetoed_picked, t.vetoed_plausible, t.vetoed_broken
    );
    if t.found_broken > 0 {
        println!(
            "  {} real endings named broken (kept: a question is its real ending)",
            t.found_broken
        );
    }
}
