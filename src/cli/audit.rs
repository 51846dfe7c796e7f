//! `afkit audit` and `afkit score`: flags → `audit::Config`, and the accuracy tables.

use std::path::PathBuf;

use anyhow::{Context, Result};

use super::progress::Lines;
use afkit_audit::lm::LmSpec;
use afkit_audit::predictions::Choice;
use afkit_audit::{self as audit, cv, score::score};
use afkit_engine::device::{Compute, DeviceChoice};
use afkit_engine::embed::cross_encoder::{FineTuning, Shape};
use afkit_engine::seed::Seed;

// Help headings after the common options.
const BASELINES: &str = "Baselines";
const CACHE: &str = "Embedding cache";

/// How hard a SWAG-format dataset is: how often baselines find the real ending.
#[derive(clap::Args)]
#[command(
    long_about = "How hard a SWAG-format dataset is: how often style classifiers, relational \
features, language models and a fine-tuned encoder find the real ending (chance is 0.25).

`--cv K` gives the figure to trust: the labelled questions of train.csv, val.csv and test.csv \
are pooled, cut into K folds by group (one video never in two folds; seeded by --seed), and \
every baseline is trained on K-1 folds and tested on the held-out one. Without --cv the audit \
trains on train.csv and scores val.csv alone: a quick look at one small split, not the figure \
to report.",
    after_long_help = "Writes audit.md, audit.json and PNG bar charts (default DATASET/audit); \
--json prints the same summary as audit.json. docs/audit.md lists every baseline, the fields \
of audit.json and how the verdicts are reached.

Baselines under --cv: shortest and longest ending; word 1-2-gram and character 2-5-gram \
logistic regressions over the ending, sent2 + ending and the whole context + ending (ngram_*, \
char_*); relational features (how each ending relates to its context and to the other \
endings); LR on the MiniLM embedding of sent2 + ending (minilm_s2; --no-embed skips it); and \
MiniLM fine-tuned per fold as a cross-encoder (finetune_minilm; --no-finetune skips it; it \
takes minutes on a CPU, --device cuda runs it on a GPU). Without --cv: random, shortest, \
longest, the word n-gram LRs, PPMI word-label associations and KNN distances.

--lm MODEL adds the model's zero-shot accuracy, scored as lm-evaluation-harness scores the \
export's afkit_swag task (rows lm:MODEL:acc and lm:MODEL:acc_norm). --control DIR audits a \
second dataset the same way (typically `afkit export --negatives random`) and sets its numbers \
beside this one's. The report ends with one verdict per family (style, relational, LM \
zero-shot, fine-tuned): every row off chance in either direction, \"too few questions to \
tell\" when the interval is ±10 points or wider, and how far from the control. A row is off \
chance when it is more than two standard errors from 0.250 and it is its family's only row; \
among n rows of a family the bar rises (Bonferroni: 2.8 standard errors for the nine style \
rows), since the best of several rows strays further by chance. Under --cv a row's standard \
error is never below the scatter of the same baseline on --chance-copies relabelled copies."
)]
pub struct Args {
    /// A directory with train.csv and val.csv (SWAG regular columns; with --cv, also test.csv).
    pub dataset: PathBuf,
    /// Cross-validate over every labelled split in K folds by group (K >= 2): the figure to
    /// trust. Without it, one train -> val split.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(2..))]
    pub cv: Option<u64>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Where to write audit.md and the PNG charts (default: DATASET/audit).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seed for the λ-selection split, the KNN sample and the --cv folds (recorded in the report).
    #[arg(long, default_value_t = Seed::default())]
    pub seed: Seed,
    /// PPMI: words listed per label.
    #[arg(long, default_value_t = 15, help_heading = BASELINES, hide_short_help = true)]
    pub ppmi_top: usize,
    /// PPMI: skip words seen fewer times than this in all endings.
    #[arg(long, default_value_t = 5, help_heading = BASELINES, hide_short_help = true)]
    pub ppmi_min_count: u64,
    /// Skip the KNN distances (they need the MiniLM encoder).
    #[arg(long, help_heading = BASELINES, hide_short_help = true)]
    pub no_knn: bool,
    /// KNN: at most this many questions per split are embedded (a seeded sample).
    #[arg(long, default_value_t = 2000, help_heading = BASELINES, hide_short_help = true)]
    pub knn_max: usize,
    /// Skip everything that needs the MiniLM encoder: the KNN distances and the minilm_s2
    /// baseline of --cv.
    #[arg(long, help_heading = BASELINES, hide_short_help = true)]
    pub no_embed: bool,
    /// Folder of the MiniLM embedding cache; default $AFKIT_HOME/embeddings.
    ///
    /// One vector per distinct text, shared with `afkit filter` and `afkit aflite`: an audit of
    /// the AF export and one of its random control share every context and gold ending.
    #[arg(long, help_heading = CACHE, hide_short_help = true)]
    pub cache_dir: Option<PathBuf>,
    /// Embed every text again instead of reading or writing the cache.
    #[arg(long, help_heading = CACHE, hide_short_help = true)]
    pub no_cache: bool,
    /// Also measure this language model's zero-shot accuracy (repeatable): `smollm2` or the
    /// path of a GGUF file.
    #[arg(long, value_name = "MODEL")]
    pub lm: Vec<String>,
    /// Audit this dataset too, the same way, and report it beside DATASET (e.g. the export with
    /// random negatives).
    #[arg(long, value_name = "DIR")]
    pub control: Option<PathBuf>,
    /// Replace report files at OUT that afkit did not write (or that were changed since); the
    /// dataset's CSV files are never written over.
    #[arg(long, hide_short_help = true)]
    pub force: bool,
    /// --cv: train every baseline but finetune_minilm again on this many copies of the
    /// questions whose answers are drawn at random. How far the copies scatter around 0.250 is
    /// how far the baseline strays from chance on a benchmark of this size with nothing to find;
    /// a row's ± is never below it (0: no copies, the folds' standard error alone).
    #[arg(long, value_name = "N", default_value_t = 19, hide_short_help = true)]
    pub chance_copies: usize,
    /// Skip --cv's fine-tuned cross-encoder (finetune_minilm), the slowest baseline.
    #[arg(long)]
    pub no_finetune: bool,
    /// finetune_minilm: passes over each fold's training questions.
    #[arg(long, value_name = "N", default_value_t = FineTuning::default().epochs, hide_short_help = true)]
    pub finetune_epochs: usize,
    /// finetune_minilm: word pieces per option, [CLS] and [SEP]s included (the context is cut
    /// from its start when the pair is longer).
    #[arg(long, value_name = "N", default_value_t = Shape::default().max_len, hide_short_help = true)]
    pub finetune_max_len: usize,
    /// finetune_minilm: the encoder's lowest layers kept fixed (the embeddings always are);
    /// fewer train more of the model and take longer.
    #[arg(long, value_name = "N", default_value_t = Shape::default().frozen_layers, hide_short_help = true)]
    pub finetune_frozen_layers: usize,
    /// Where finetune_minilm runs: `cpu`, or `cuda` (`cuda:N`) with an afkit built with
    /// `--features cuda`.
    #[arg(long, default_value = "cpu", value_name = "cpu|cuda|cuda:N")]
    pub device: DeviceChoice,
}

impl Args {
    fn config(&self) -> Result<audit::Config> {
        let skip_knn = if self.no_knn {
            Some("--no-knn")
        } else if self.no_embed {
            Some("--no-embed")
        } else {
            None
        };
        let lm = self.lm_specs()?;
        let skip_fine_tune = if self.no_finetune {
            Some("--no-finetune")
        } else if self.no_embed {
            Some("--no-embed")
        } else {
            None
        };
        let fine_tune = self.fine_tune(skip_fine_tune)?;
        Ok(audit::Config {
            dataset: self.dataset.clone(),
            out: self
                .out
                .clone()
                .unwrap_or_else(|| self.dataset.join("audit")),
            cv: self.cv.map(|k| k as usize),
            seed: self.seed,
            ppmi_top: self.ppmi_top,
            ppmi_min_count: self.ppmi_min_count,
            skip_knn: skip_knn.map(String::from),
            knn_max: self.knn_max,
            no_embed: self.no_embed,
            embedding_cache: (!self.no_cache).then(|| {
                self.cache_dir
                    .clone()
                    .unwrap_or_else(afkit_engine::embed::default_cache_dir)
            }),
            lm,
            control: self.control.clone(),
            force: self.force,
            chance_copies: self.chance_copies,
            skip_fine_tune: skip_fine_tune.map(String::from),
            fine_tune,
        })
    }

    /// The `--lm` models, each with the name its rows get.
    fn lm_specs(&self) -> Result<Vec<LmSpec>> {
        self.lm
            .iter()
            .map(|name| {
                let path = afkit_engine::models::generator_gguf(name)
                    .with_context(|| format!("--lm {name}"))?;
                // A file's rows are named by its stem (`lm:SmolLM2-360M.Q8_0:acc`).
                let shown = match std::path::Path::new(name).file_stem() {
                    Some(stem) if path.as_os_str() == name.as_str() => {
                        stem.to_string_lossy().into_owned()
                    }
                    _ => name.clone(),
                };
                Ok(LmSpec { name: shown, path })
            })
            .collect()
    }

    /// The fine-tuned baseline's settings, and where it runs (`skip_fine_tune`: why it does not).
    fn fine_tune(&self, skip_fine_tune: Option<&str>) -> Result<cv::FineTune> {
        Ok(cv::FineTune {
            shape: Shape {
                max_len: self.finetune_max_len,
                frozen_layers: self.finetune_frozen_layers,
            },
            train: FineTuning {
                epochs: self.finetune_epochs,
                ..Default::default()
            },
            // Opened only when the baseline runs, so a CPU-only build audits without it.
            compute: match skip_fine_tune.or(self.cv.is_none().then_some("no --cv")) {
                Some(_) => Compute::cpu(),
                None => Compute::open(self.device, None)?,
            },
        })
    }
}

pub fn run(args: Args) -> Result<()> {
    afkit_engine::runtime::use_one_candle_thread();
    let config = args.config()?;
    let mut progress = AuditBars::default();
    let summary = audit::run(&config, &mut progress)?;
    progress.0.clear();
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
        return Ok(());
    }
    match summary {
        audit::Summary::CrossValidated(audit) => {
            print_cv_table(&audit);
            print_timings(&audit.findings);
        }
        audit::Summary::Holdout(report) => {
            print_holdout(&report, &config.dataset);
            print_timings(&report.findings);
        }
    }
    println!("report: {}", config.out.join("audit.md").display());
    Ok(())
}

/// One bar at a time (texts embedded, fits, questions scored), with notes above it on stderr.
#[derive(Default)]
struct AuditBars(Lines);

impl audit::Observer for AuditBars {
    fn note(&mut self, message: &str) {
        self.0.say(message, false);
    }

    fn counting(&mut self, total: usize, unit: &str) {
        self.0.start(total, unit);
    }

    fn counted(&mut self, n: usize) {
        if let Some(bar) = self.0.bar() {
            bar.inc(n as u64);
        }
    }
}

fn print_holdout(report: &audit::AuditReport, dataset: &std::path::Path) {
    println!(
        "train {} -> val {} questions (chance 0.250; ± is the se of a proportion)",
        report.n_train, report.n_val
    );
    print_rows(&report.findings, report.control.is_some());
    print_verdicts(&report.findings);
    print_could_be_right(report.findings.could_be_right.as_ref());
    println!(
        "a single train -> val split: `afkit audit {} --cv 5` gives the figure to trust",
        dataset.display()
    );
}

fn print_cv_table(audit: &audit::CvAudit) {
    let cv = &audit.cv;
    println!(
        "{}-fold cross-validation by group: {} questions, {} groups, seed {} (chance 0.250)",
        cv.folds, cv.questions, cv.groups, cv.seed
    );
    print_rows(&audit.findings, audit.control.is_some());
    let copies = cv.baselines.iter().find_map(|(_, result)| match result {
        cv::CvResult::Measured {
            chance: Some(chance),
            ..
        } => Some(chance.copies.len()),
        _ => None,
    });
    if let Some(copies) = copies {
        println!(
            "± is never below the scatter of a baseline's {copies} relabelled copies (answers \
             drawn at random: what it reaches with nothing to find)"
        );
    }
    for (baseline, result) in &cv.baselines {
        if let cv::CvResult::Skipped { skipped } = result {
            println!("{:<22} skipped: {skipped}", baseline.name());
        } else if let Some(trained_on) = result.trained_on() {
            println!("{:<22} {trained_on}", baseline.name());
        }
    }
    print_verdicts(&audit.findings);
    print_could_be_right(audit.findings.could_be_right.as_ref());
}

fn print_could_be_right(flag: Option<&audit::CouldBeRight>) {
    if let Some(flag) = flag {
        println!("{}", flag.sentence());
    }
}

/// One line per measured row, with where it stands against chance; with a control, its
/// mean ± se and the difference in points.
fn print_rows(findings: &audit::Findings, with_control: bool) {
    if with_control {
        println!(
            "{:<22} {:>13} {:>13} {:>6}",
            "baseline", "mean ± se", "control", "diff"
        );
    } else {
        println!("{:<22} {:>13}", "baseline", "mean ± se");
    }
    for row in &findings.summary {
        let measured = format!("{:.3} ± {:.3}", row.mean, row.se);
        if !with_control {
            println!("{:<22} {measured:>13}  {}", row.name, row.standing.words());
            continue;
        }
        let control = row
            .control
            .map_or("-".to_string(), |c| format!("{:.3} ± {:.3}", c.mean, c.se));
        let diff = row
            .difference
            .map_or("-".to_string(), |d| format!("{:+.1}", d * 100.0));
        println!("{:<22} {measured:>13} {control:>13} {diff:>6}", row.name);
    }
}

fn print_verdicts(findings: &audit::Findings) {
    println!("verdicts:");
    for v in &findings.verdicts {
        println!("  {}: {}", v.family, v.text);
    }
}

/// Grade predicted labels against a split.
#[derive(clap::Args)]
#[command(
    long_about = "The accuracy of a model's predictions on a labelled split.\n\n\
    SPLIT is a SWAG CSV with labels or an afkit JSONL export (for a published export's test split: \
    OUT-test-answers.csv). PREDICTIONS may be: one label 0-3 per line in the split's order (a first \
    line pred, prediction or label is a header); JSON Lines with an id (id, idx or example_id) or in \
    order, and a label (label, prediction, pred, predicted_label) or scores (logits, scores, \
    probabilities; the highest wins); a JSON array or {\"predictions\": [...]} of labels or score \
    lists in order (Hugging Face Trainer.predict); or lm-evaluation-harness --log_samples output \
    (samples_TASK_*.jsonl), whose doc_id is the row and whose highest log-likelihood is the \
    prediction (the harness's acc; --norm: per character, its acc_norm)."
)]
pub struct ScoreArgs {
    /// The split to grade against (SWAG CSV with labels, or an afkit JSONL export).
    pub split: PathBuf,
    /// The predictions, in any of the forms above.
    pub predictions: PathBuf,
    /// For lm-evaluation-harness samples: pick the highest log-likelihood per character of the
    /// ending (the harness's acc_norm) instead of the highest log-likelihood (acc).
    #[arg(long)]
    pub norm: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run_score(args: ScoreArgs) -> Result<()> {
    let choice = if args.norm {
        Choice::PerCharacter
    } else {
        Choice::Total
    };
    let s = score(&args.split, &args.predictions, choice)?;
    if args.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        println!("accuracy: {:.4} ({} of {})", s.accuracy, s.correct, s.total);
    }
    Ok(())
}

/// `time: ngram_end 0.4 s, knn 2.1 s, lm:smollm2 30.2 s`: seconds per baseline and model.
fn print_timings(findings: &audit::Findings) {
    let parts: Vec<String> = findings
        .timings
        .iter()
        .map(|t| format!("{} {:.1} s", t.name, t.seconds))
        .collect();
    if !parts.is_empty() {
        println!("time: {}", parts.join(", "));
    }
}
