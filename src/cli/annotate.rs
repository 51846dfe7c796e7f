//! `afkit annotate`, `afkit agreement` and `afkit crowd`: flags, and what they print.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};

use afkit_annotate::tasks::{self, PolicyRequest};
use afkit_annotate::{self as annotate, agreement, crowd};
use afkit_engine::output::Output;
use afkit_engine::seed::Seed;
use afkit_store::Store;

/// Verify candidates in a terminal UI: label every ending, pick the best two.
#[derive(clap::Args)]
#[command(
    long_about = "Verify candidates in a terminal UI, as SWAG's human verification did: for each \
    item (a context and six shuffled endings: the found one and five of its AF negatives, \
    matched to the found endings' final scores so that none looks more real than real endings) \
    label every ending likely / unlikely / gibberish and pick the best and the second-best ending.\n\n\
    Keys are shown on screen; ? shows the instructions. Each submission is committed to the \
    project file before the next item shows; after a crash, kill or dropped connection, run the \
    same command again to resume at the item you had on screen.\n\n\
    Several annotators can work at once on one project file (one terminal each, different \
    --annotator names). The first --agreement-items items go to --replicas annotators each (for \
    `afkit agreement`), the rest to one annotator each; nobody gets an item twice. Tasks are \
    made from the latest finished `afkit filter` run when annotation first starts."
)]
pub struct Args {
    /// The project file.
    pub project: PathBuf,
    /// Your annotator name; restarting with the same name resumes where you stopped.
    #[arg(long)]
    pub annotator: String,
    #[command(flatten)]
    pub hand_out: HandOut,
    /// The order you are handed items in: `seeded`, the project's order (agreement items
    /// first), or `risk`: first the items whose shown wrong endings could most be right (a
    /// language model finds them at least as likely as the found ending, or they restate it;
    /// see `afkit assemble --help`), the ones an unverified export would flag. Your own
    /// unfinished item still comes back first; other annotators keep their own order.
    #[arg(long, value_enum, default_value = "seeded")]
    pub order: annotate::Order,
    /// Replay keys from FILE instead of the keyboard (tests, benchmarks).
    #[arg(long, hide = true, value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// Pause between replayed keys, in milliseconds.
    #[arg(long, hide = true, default_value_t = 0)]
    pub script_delay_ms: u64,
    /// Append per-event timings (draw, claim, commit) as JSON lines to FILE.
    #[arg(long, hide = true, value_name = "FILE")]
    pub timings: Option<PathBuf>,
}

/// Inter-annotator agreement, label distributions and annotator quality.
#[derive(clap::Args)]
#[command(
    long_about = "Inter-annotator agreement, label distributions and annotator quality.\n\n\
    Krippendorff's α (nominal) and pairwise percent agreement over the items with at least two \
    annotators, separately for the ranking {best, second, neither} and for the labels {likely, \
    unlikely, gibberish} (each ending of an item is one unit); the label distribution of found \
    vs generated endings (the layout of SWAG Table 2); human accuracy (how often annotators rank \
    the found ending best, with a 95% interval); and per annotator: items, items/hour, accuracy, \
    how often the found ending is in their top two, agreement with the others on shared items, \
    and a flag for annotators far below the rest (the rule is printed with the table).\n\n\
    --json keys: alpha_rank, ppa_rank, alpha_label, ppa_label, items, submissions, broken, \
    found_top2_rate, human_accuracy, distribution {found, generated}, annotators [...], flag_rule."
)]
pub struct AgreementArgs {
    /// The project file.
    pub project: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Subcommand)]
pub enum CrowdCommand {
    /// Write annotation tasks as CSV for a crowdsourcing platform.
    #[command(
        long_about = "Write annotation tasks as CSV for a crowdsourcing platform, one row per \
        item that still needs annotators.\n\n\
        Columns: item_id (the project's fingerprint and the item's number, e.g. \
        3f9a0c1b2d4e-17: quote it back in the results; `crowd import` takes it only into this \
        project), assignments (annotators still wanted), \
        context (sent1 + sent2), sent1, sent2, ending_1 .. ending_6 (the endings in the item's \
        recorded shuffled order; empty when an item has fewer). Tasks are made from the latest \
        finished AF run if they do not exist yet; the first --agreement-items items want \
        --replicas workers each (as with `afkit annotate`).\n\n\
        Beside OUT it writes OUT's name with .instructions.md (tasks.csv: \
        tasks.instructions.md): the instructions `afkit annotate` shows, for the task page, so \
        that crowd workers label by the same rules.\n\n\
        Text cells that begin with =, +, -, @ (or fullwidth ＝ ＋ － ＠, also behind a byte \
        order mark or a zero-width space), a tab or a carriage return are written with a \
        leading ' (apostrophe), so that a spreadsheet shows them as text instead of running them \
        as a formula; the command says how many. The dataset files of `afkit export` keep every \
        text as it is."
    )]
    Export {
        project: PathBuf,
        /// The CSV file to write (never the project; an existing file afkit did not write needs
        /// --force).
        #[arg(long)]
        out: PathBuf,
        /// Export every open item, also those that have all their annotators.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        hand_out: HandOut,
        /// Replace OUT even if afkit did not write it (or it was changed since).
        #[arg(long)]
        force: bool,
    },
    /// Read crowd results (afkit's columns or Mechanical Turk's) into the project.
    #[command(long_about = "Read crowd results into the project's label tables.\n\n\
        afkit's result columns: worker_id, item_id, label_1 .. label_6 (likely | unlikely | \
        gibberish, one per ending of the item, in the exported order), best and second (ending \
        numbers 1-6), and optionally seconds (time on the item), submitted_at (RFC 3339 UTC) and \
        broken (true: the worker flags the item as broken, as x does in `afkit annotate`; its \
        labels may then be empty; Answer.broken on Mechanical Turk).\n\n\
        Mechanical Turk batch results are read too: WorkerId, Input.item_id, Answer.label_1 .. \
        Answer.label_6, Answer.best, Answer.second (or one true/false column per choice, e.g. \
        Answer.best.3, as crowd-radio-group writes them), WorkTimeInSeconds; rows whose \
        AssignmentStatus is Rejected are skipped.\n\n\
        Every row is validated: items of another project (the item id's fingerprint), texts \
        that do not match the item (context, sent1, sent2 and ending_* columns, Input.* on \
        Mechanical Turk, compared wherever the file carries them), a wrong number of fields, \
        unknown or replaced items, missing or invalid labels, best or \
        second missing, equal, or gibberish, and duplicate worker/item pairs (in the file or \
        already in the project) are reported with their line number and not imported. The valid \
        rows are imported in one transaction; with --strict nothing is imported if any row is \
        invalid. An item id without a fingerprint (a task file from an older afkit) is taken only \
        when the row carries the item's context and endings and they match. The command fails when no row could be imported and some row was invalid (a file \
        imported again, whose rows are all in the project already, is not a failure).")]
    Import {
        project: PathBuf,
        file: PathBuf,
        /// Import nothing (and fail) if any row is invalid.
        #[arg(long)]
        strict: bool,
    },
    #[command(flatten)]
    Review(super::review::ReviewCommand),
}

/// How items are handed out, chosen when the tasks are made (by `annotate` or `crowd export`).
#[derive(clap::Args)]
pub struct HandOut {
    /// Items (in a fixed seeded order) that go to several annotators to measure agreement
    /// [default: 100, or what the project recorded].
    #[arg(long, value_name = "M")]
    pub agreement_items: Option<i64>,
    /// Annotators per agreement item [default: 3, or what the project recorded].
    #[arg(long, value_name = "R")]
    pub replicas: Option<i64>,
    /// Seed of the item order and of the ending shuffles; fixed once tasks exist [default: 0].
    #[arg(long)]
    pub seed: Option<Seed>,
}

impl HandOut {
    fn request(&self) -> PolicyRequest {
        PolicyRequest {
            agreement_items: self.agreement_items,
            replicas: self.replicas,
            seed: self.seed,
        }
    }
}

pub fn run(args: Args) -> Result<()> {
    let mut store = Store::open(&args.project)?;
    let config = annotate::Config {
        annotator: args.annotator.clone(),
        policy: args.hand_out.request(),
        script: args
            .script
            .map(|file| (file, Duration::from_millis(args.script_delay_ms))),
        timings: args.timings,
        order: args.order,
    };
    let annotate::Outcome { summary, setup } = annotate::annotate(&mut store, &config)?;
    // After a hang-up there is no terminal left to print to; the work is saved either way.
    if setup.without_negatives > 0 {
        let _ = writeln!(
            std::io::stderr(),
            "note: {} of AF run {} without assigned negatives got no task",
            afkit_engine::text::counted(setup.without_negatives, "context", "contexts"),
            setup.run_id
        );
    }
    if setup.hardest_shown > 0 {
        let _ = writeln!(std::io::stderr(), "{}", hardest_shown_note(&setup));
    }
    let _ = writeln!(
        std::io::stdout(),
        "{}: {} submitted this session, {} in all; {} left for you. \
         Run the same command to continue.",
        config.annotator.trim(),
        summary.submitted,
        summary.done_total,
        afkit_engine::text::counted(summary.remaining, "item", "items")
    );
    Ok(())
}

pub fn run_agreement(args: AgreementArgs) -> Result<()> {
    let store = Store::open(&args.project)?;
    let submissions = store.all_submissions()?;
    let report = agreement::report(&submissions);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else if submissions.is_empty() {
        println!(
            "no submissions yet: annotate with `afkit annotate {} --annotator NAME`",
            args.project.display()
        );
    } else {
        print!("{report}");
    }
    Ok(())
}

/// Why some new tasks show the hardest negatives rather than matched ones.
fn hardest_shown_note(setup: &tasks::Setup) -> String {
    format!(
        "note: AF run {} kept no scores for the found endings, so {} new tasks show the five \
         hardest negatives instead of five matched to the found endings (`afkit filter --new-run` \
         makes a run with those scores)",
        setup.run_id, setup.hardest_shown
    )
}

pub fn run_crowd(command: CrowdCommand) -> Result<()> {
    match command {
        CrowdCommand::Export {
            project,
            out,
            all,
            hand_out,
            force,
        } => {
            let output = Output::new(force).protect_project(&project);
            output.check(&out)?;
            output.check(&crowd::instructions_path(&out))?;
            let mut store = Store::open(&project)?;
            let setup = tasks::ensure_tasks(&mut store, hand_out.request())?;
            if setup.hardest_shown > 0 {
                eprintln!("{}", hardest_shown_note(&setup));
            }
            let exported = crowd::export(&store, &out, all, &output)?;
            println!(
                "wrote {} to {}, and the instructions for the workers to {}",
                afkit_engine::text::counted(exported.rows, "item", "items"),
                out.display(),
                exported.instructions.display()
            );
            if exported.neutralised > 0 {
                println!(
                    "note: {} text cells began with =, +, -, @, a tab or a carriage return and \
                     were written with a leading ' so that spreadsheets show them as text",
                    exported.neutralised
                );
            }
            Ok(())
        }
        CrowdCommand::Import {
            project,
            file,
            strict,
        } => import(&project, &file, strict),
        CrowdCommand::Review(command) => super::review::run_review(command),
    }
}

fn import(project: &Path, file: &Path, strict: bool) -> Result<()> {
    let mut store = Store::open(project)?;
    let outcome = crowd::import(&mut store, file, strict)?;
    for r in &outcome.rejected {
        eprintln!("{}:{}: {}", file.display(), r.line, r.reason);
    }
    let layout = if outcome.mturk_layout {
        "Mechanical Turk batch results"
    } else {
        "afkit result columns"
    };
    if strict && !outcome.rejected.is_empty() {
        bail!(
            "{} of the rows in {} are invalid (listed above); nothing imported (--strict)",
            outcome.rejected.len(),
            file.display()
        );
    }
    let failed = outcome.rejected.iter().any(|r| !r.already_in_project);
    if outcome.imported == 0 && failed {
        bail!(
            "none of the {} rows in {} could be imported (listed above); nothing imported",
            outcome.rejected.len(),
            file.display()
        );
    }
    println!(
        "imported {} from {} ({layout}); {} rejected",
        afkit_engine::text::counted(outcome.imported, "submission", "submissions"),
        file.display(),
        afkit_engine::text::counted(outcome.rejected.len(), "row", "rows")
    );
    Ok(())
}
