//! `afkit assemble`: flags → `assemble::run`, and its summary.

use std::path::PathBuf;

use anyhow::Result;

use super::progress::Notes;
use afkit_assemble::{self as assemble, Summary};
use afkit_engine::seed::Seed;
use afkit_store::dataset::Split;
use afkit_store::distractors::DistractorChoice;
use afkit_store::Store;

#[derive(clap::Args)]
#[command(
    after_long_help = "Rules (SWAG §3.5, stricter on one point): the found ending ranked best or second is gold \
(gold0/gold1, -orig or -reannot by annotation round) with the generations judged unlikely and \
not ranked best as distractors, up to four, taken in the order --distractors gives (SWAG also took \
generations judged likely, and those can be a second right answer); a generation ranked best over a second-ranked found ending adds a \
training-only example (gen-orig); an item whose found ending is outside the top two, or with fewer \
than three generations judged unlikely (too_few_non_gibberish, too_few_unlikely), is queued for \
re-annotation with the other endings replaced by scored pool endings never shown, in the same order; \
an item whose found ending is judged gibberish is dropped (found_gibberish: another round would show it again). \
A question whose deciding round accepted fewer generations than --choose-from gets one spare round \
(its found ending and up to five scored pool endings never shown; the summary counts them): its \
generations judged unlikely and not ranked best join the candidates, and the question is built \
meanwhile from what is in hand. Several annotators: a judgement needs half the votes (ties go to \
the more severe label), a rank a strict majority (ties go to the lower rank); broken flags are \
ignored. Re-running replaces the previous assembly; groups keep their split when seed and \
fractions are unchanged.

Unverified questions and distractors that could be right: a wrong answer could be right when a \
language model reading the context (a --scorer model of `afkit filter`, else the generator) finds \
it at least as likely per token as the found ending, or when its sentence vector nearly restates \
the found ending (cosine 0.8 or more). With --unverified a question that shows one is flagged \
(its `could_be_right` field in the export is true; the summary counts them); --could-be-right \
avoid takes such negatives last, leave-out also leaves out a question that still needs one. Taking \
them last made an export no more valid to a blind reader and easier for language models, hence \
not the default. Verified questions are never flagged: annotators labelled their distractors."
)]
pub struct Args {
    /// The project file.
    pub project: PathBuf,
    /// Skip verification: each context's found ending and distractors chosen among its assigned
    /// negatives (see --distractors), marked unverified.
    #[arg(long)]
    pub unverified: bool,
    /// With --unverified, negatives that could be right: `flag`, `avoid` or `leave-out`.
    ///
    /// flag (the default): keep the distractors' order and flag a question that shows one.
    /// avoid: take them last, flag a question that still shows one. leave-out: take them last,
    /// leave out a question that still needs one (see below).
    #[arg(
        long,
        value_enum,
        value_name = "WHAT",
        default_value_t,
        requires = "unverified",
        hide_possible_values = true
    )]
    pub could_be_right: assemble::CouldBeRight,
    /// How the distractors are chosen: `matched` to the found endings' scores, or `hardest`.
    ///
    /// They are chosen among the assigned negatives with --unverified, else among those the
    /// annotators accepted. matched: for each, a found ending of the same AF fold is drawn (from
    /// the recorded seed) and the candidate nearest its final scores (the ensemble's, the
    /// sentence model's, and the word-level heads' style score where those heads still found
    /// style after AF) is taken, so a style classifier finds the distractors as real-looking as
    /// the found endings, no more; hardest: the highest ensemble scores, which on the default
    /// recipe's pools overshoot further into an inverse artifact (classifiers below chance;
    /// docs/recipe.md, "Distractors matched to the real endings"). Audit both on a copy of the
    /// project.
    #[arg(long, value_enum, default_value = "matched")]
    pub distractors: DistractorChoice,
    /// Verified: endings judged unlikely a question should choose its three distractors from.
    ///
    /// A context whose deciding round of annotation accepted fewer gets one spare round: its
    /// found ending beside up to five scored pool endings no annotator has seen, whose
    /// generations judged unlikely (and not ranked best) join the candidates. Where a question
    /// has more than three, the three it shows are those that look most like real endings: to a
    /// character and a word n-gram model trained, cross-fitted by group, on the other questions'
    /// found against accepted endings, and to the generator's likelihood of them after the
    /// context. What annotators accept alone is easier to tell from the real ending than what AF
    /// chose; 3 asks for no spare round and keeps the --distractors order.
    #[arg(long, value_name = "N", default_value_t = 6,
          value_parser = clap::value_parser!(u16).range(3..=64))]
    pub choose_from: u16,
    /// Train,val,test fractions; groups (videos) never straddle two splits.
    #[arg(long, default_value = "0.8,0.1,0.1")]
    pub split: String,
    /// Seed for the split, the matched distractors and the order of re-annotation tasks
    /// (recorded).
    #[arg(long, default_value_t = Seed::default())]
    pub seed: Seed,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let fractions = args.split.parse()?;
    let mut store = Store::open(&args.project)?;
    let config = assemble::Config {
        fractions,
        seed: args.seed,
        unverified: args.unverified,
        distractors: args.distractors,
        could_be_right: args.could_be_right,
        choose_from: usize::from(args.choose_from),
    };
    let summary = assemble::run(&mut store, &config, &mut Notes)?;
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print_summary(&summary);
    }
    Ok(())
}

fn print_summary(s: &Summary) {
    let kind = if s.unverified {
        "unverified"
    } else {
        "verified"
    };
    let matched_on = match s.matched_on.as_slice() {
        [] => String::new(),
        axes => format!(" on the {} scores", axes.join(", ")),
    };
    println!(
        "assembled {kind} questions from AF run {} (distractors: {}{matched_on})",
        s.af_run, s.distractors
    );
    for split in Split::ALL {
        let name = split.as_str();
        let examples = s.examples.get(name).copied().unwrap_or(0);
        let groups = s.groups.get(name).copied().unwrap_or(0);
        println!(
            "  {name:<6} {:>14} from {}",
            afkit_engine::text::counted(examples, "question", "questions"),
            afkit_engine::text::counted(groups, "group", "groups")
        );
    }
    println!(
        "  (a question is four-way: a context, its real ending and three distractors; a group is \
         the source its contexts came from, e.g. one video, and is never split)"
    );
    for (source, n) in &s.gold_sources {
        println!("  {source:<14} {n:>7}");
    }
    if s.unverified {
        print_unverified(s);
    } else {
        print_verified(s);
    }
    print_reviews(s);
}

/// What question reviews (`afkit crowd review-export`) changed.
fn print_reviews(s: &Summary) {
    if s.review_set_aside == 0 && s.review_too_few == 0 {
        return;
    }
    println!(
        "reviews set aside {} (named also plausible or broken, or picked over the real \
         ending); questions changed since their review go out with `afkit crowd review-export`",
        afkit_engine::text::counted(s.review_set_aside, "candidate", "candidates")
    );
    if s.review_too_few > 0 {
        let what = if s.unverified {
            "left out"
        } else {
            "waiting for a spare round"
        };
        println!(
            "  questions with fewer than three distractors left ({what}): {}",
            s.review_too_few
        );
    }
}

/// What verified assembly did besides the questions: re-annotation queued, contexts that cannot
/// be refilled or await labels, and what was dropped or withheld.
fn print_verified(s: &Summary) {
    let queued: usize = s.reannotation_queued.values().sum();
    println!("re-annotation queued: {queued}");
    for (reason, n) in &s.reannotation_queued {
        println!("  {reason:<24} {n}");
    }
    if !s.cannot_refill.is_empty() {
        println!(
            "cannot be refilled (too few scored pool endings left): {} ({})",
            s.cannot_refill.len(),
            s.cannot_refill
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    print_choice(s);
    println!("contexts awaiting labels: {}", s.awaiting_labels);
    if s.broken > 0 {
        println!("flagged broken: {}", s.broken);
    }
    for (reason, n) in &s.dropped {
        println!("dropped ({reason}): {n}");
    }
    if s.generated_gold_withheld_from_eval > 0 {
        println!(
            "generation-as-gold withheld from val/test contexts: {}",
            s.generated_gold_withheld_from_eval
        );
    }
    if s.generated_gold_too_few_distractors > 0 {
        println!(
            "generation-as-gold skipped (fewer than 3 distractors): {}",
            s.generated_gold_too_few_distractors
        );
    }
}

/// How many endings judged unlikely the verified questions chose from, and the spare rounds
/// asked for more.
fn print_choice(s: &Summary) {
    if !s.candidates_per_question.is_empty() {
        let counts: Vec<String> = s
            .candidates_per_question
            .iter()
            .map(|(n, questions)| format!("{n}: {questions}"))
            .collect();
        println!(
            "questions by endings judged unlikely to choose from: {} ({} chosen by how real they look)",
            counts.join(", "),
            s.chosen_after_annotation
        );
    }
    if s.spare_rounds_queued > 0 {
        println!(
            "spare rounds queued: {} (annotate them, then assemble again to choose among more)",
            s.spare_rounds_queued
        );
    }
    if s.spare_rounds_awaiting_labels > 0 {
        println!(
            "questions built while their spare round awaits labels: {}",
            s.spare_rounds_awaiting_labels
        );
    }
    if s.spare_pool_empty > 0 {
        println!(
            "questions with too few to choose from and no unseen pool ending left: {}",
            s.spare_pool_empty
        );
    }
}

fn print_unverified(s: &Summary) {
    if s.too_few_negatives > 0 {
        println!(
            "contexts skipped (fewer than 3 assigned negatives): {}",
            s.too_few_negatives
        );
    }
    let built: usize = s.examples.values().sum();
    println!(
        "could be right (a distractor as likely as the found ending, or restating it): {} \
         flagged of {built} questions, {} left out",
        s.could_be_right_flagged, s.could_be_right_left_out
    );
    if s.unjudged_negatives > 0 {
        println!(
            "  {} could not be judged (no scorer or generator likelihood, no sentence vectors)",
            afkit_engine::text::counted(s.unjudged_negatives, "negative", "negatives")
        );
    }
    if s.under_fluency_floor > 0 {
        println!(
            "contexts with a distractor under the fluency floor (fewer than 3 above it): {}",
            s.under_fluency_floor
        );
    }
}
