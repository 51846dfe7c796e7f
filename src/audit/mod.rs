//! Bias audit of any SWAG-format dataset, and grading of predictions.
//!
//! The audit asks how far a 4-way question can be answered without understanding it: by chance,
//! by ending length, by n-gram style of the ending / second sentence / whole text (SWAG Table 3,
//! left columns), which words give the gold away (PPMI), and how close held-out items sit to the
//! training items (KNN distances, AFLite Table 3). It reads only the dataset directory, so it
//! works on afkit's exports, the SWAG release, or anyone's SWAG-format data.

pub mod cv;
pub mod dataset;
pub mod folds;
pub mod grams;
pub mod knn;
pub mod ngram;
pub mod ppmi;
pub mod predictions;
pub mod report;
pub mod score;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::dataset::Split;
use dataset::Question;

pub use score::{run_score, ScoreArgs};

#[derive(clap::Args)]
#[command(
    after_help = "Writes audit.md, audit.json and PNG bar charts (default DATASET/audit). \
Baselines, scored on val as a 4-way choice: random (expected accuracy of a uniform guess), \
shortest and longest ending (ties split evenly), and 1-2-gram logistic regressions trained on \
train over the ending (ngram_end), sent2 + ending (ngram_s2) and sent1 + sent2 + ending \
(ngram_ctx); PPMI word-label associations; KNN distances with MiniLM embeddings.

With --cv K the audit cross-validates instead, the figure to trust: the labelled questions of \
train.csv, val.csv and test.csv are pooled (a file without labels is skipped with a note), cut \
into K folds by video-id (one video never in two folds; seeded by --seed), and every baseline is \
trained on K-1 folds and tested on the held-out one; audit.md, audit.json and accuracy.png then \
hold this table and the PPMI words of the pool (no train/val table, no KNN). Baselines: \
shortest, longest, word 1-2-gram LR (ngram_end, ngram_s2, ngram_ctx), character 2-5-gram LR \
(char_end, char_s2, char_ctx: subwords of each word, case and punctuation kept) and LR on the \
MiniLM embedding of sent2 + ending (minilm_s2; --no-embed skips it). --json prints {\"cv\": {\"folds\": K, \"questions\": N, \
\"groups\": G, \"seed\": S, \"fold_sizes\": [..], \"baselines\": {NAME: {\"mean\": M, \"se\": SE, \
\"folds\": [accuracy per fold], \"lambda\": [chosen per fold]} or {\"skipped\": WHY}}}, \
\"files\": [{\"file\", \"questions\", \"skipped\"}], \"ppmi\": [..]}; mean is the mean fold \
accuracy and se the standard deviation of the fold accuracies / sqrt(K)."
)]
pub struct Args {
    /// A directory with train.csv and val.csv (SWAG regular columns; with --cv, also test.csv).
    pub dataset: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Where to write audit.md and the PNG charts (default: DATASET/audit).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seed for the λ-selection split, the KNN sample and the --cv folds (recorded in the report).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// PPMI: words listed per label.
    #[arg(long, default_value_t = 15)]
    pub ppmi_top: usize,
    /// PPMI: skip words seen fewer times than this in all endings.
    #[arg(long, default_value_t = 5)]
    pub ppmi_min_count: u64,
    /// Skip the KNN distances (they need the MiniLM encoder).
    #[arg(long)]
    pub no_knn: bool,
    /// KNN: at most this many questions per split are embedded (a seeded sample).
    #[arg(long, default_value_t = 2000)]
    pub knn_max: usize,
    /// Cross-validate over all labelled splits in K folds (K >= 2) instead of train -> val.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(2..))]
    pub cv: Option<u64>,
    /// Skip everything that needs the MiniLM encoder: the KNN distances and the minilm_s2
    /// baseline of --cv.
    #[arg(long)]
    pub no_embed: bool,
}

/// KNN result, or why it was not measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(untagged)]
pub enum Knn {
    Measured(knn::KnnReport),
    Skipped { skipped: String },
}

/// The audit's findings; `--json` prints this (accuracies are fractions).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AuditReport {
    pub n_train: usize,
    pub n_val: usize,
    pub seed: u64,
    pub random: f64,
    pub shortest: f64,
    pub longest: f64,
    pub ngram_end: f64,
    pub ngram_s2: f64,
    pub ngram_ctx: f64,
    /// Regularisation strengths chosen for ngram_end, ngram_s2, ngram_ctx.
    pub lambda: [f64; 3],
    pub ppmi: Vec<ppmi::Association>,
    pub knn: Knn,
}

impl AuditReport {
    pub fn accuracies(&self) -> [(&'static str, f64); 6] {
        [
            ("random", self.random),
            ("shortest", self.shortest),
            ("longest", self.longest),
            ("ngram_end", self.ngram_end),
            ("ngram_s2", self.ngram_s2),
            ("ngram_ctx", self.ngram_ctx),
        ]
    }
}

pub fn run(args: Args) -> Result<()> {
    if let Some(k) = args.cv {
        return run_cv(&args, k as usize);
    }
    let train = dataset::read_split(&args.dataset.join(Split::Train.regular_csv()), true)?;
    let val = dataset::read_split(&args.dataset.join(Split::Val.regular_csv()), true)?;
    if train.is_empty() || val.is_empty() {
        bail!(
            "{}: train.csv and val.csv need at least one question each (train {}, val {})",
            args.dataset.display(),
            train.len(),
            val.len()
        );
    }
    let knn = if args.no_knn || args.no_embed {
        Knn::Skipped {
            skipped: if args.no_knn {
                "--no-knn"
            } else {
                "--no-embed"
            }
            .into(),
        }
    } else {
        measure_knn(&train, &val, args.knn_max, args.seed)?
    };
    let report = audit(
        &train,
        &val,
        args.seed,
        args.ppmi_top,
        args.ppmi_min_count,
        knn,
    );
    let out = args.out.unwrap_or_else(|| args.dataset.join("audit"));
    report::write(&out, &report)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        for (name, acc) in report.accuracies() {
            println!("{name:<10} {acc:.3}");
        }
        println!("report: {}", out.join("audit.md").display());
    }
    Ok(())
}

/// The cross-validated audit; `--cv K --json` prints this.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CvAudit {
    pub cv: cv::CvReport,
    /// The split files and how many questions each gave to the pool.
    pub files: Vec<dataset::PooledFile>,
    /// PPMI word-label associations over the pooled questions.
    pub ppmi: Vec<ppmi::Association>,
}

fn run_cv(args: &Args, k: usize) -> Result<()> {
    let (questions, files) = dataset::read_labelled_splits(&args.dataset)?;
    for f in files
        .iter()
        .filter(|f| f.skipped.as_deref() == Some(dataset::NO_LABELS))
    {
        eprintln!(
            "note: {} skipped: it has no labels",
            args.dataset.join(&f.file).display()
        );
    }
    let encoder = if args.no_embed {
        Err("--no-embed".to_string())
    } else {
        crate::embed::SentenceEncoder::load_default().map_err(|err| {
            eprintln!("minilm_s2 skipped: {err:#}");
            format!("MiniLM encoder unavailable: {err:#}")
        })
    };
    let encode = |texts: &[&str], progress: &mut dyn FnMut(usize)| match &encoder {
        Ok(encoder) => encoder.encode_with_progress(texts, progress),
        Err(why) => bail!("{why}"),
    };
    let embedder = match &encoder {
        Ok(_) => cv::Embedder::Encoder(&encode),
        Err(why) => cv::Embedder::Unavailable(why.clone()),
    };
    let files_read = Split::ALL.map(|s| args.dataset.join(s.regular_csv()).display().to_string());
    let cv = cv::cross_validate(&questions, k, args.seed, &cv::Baseline::ALL, &embedder)
        .with_context(|| format!("--cv {k} on {}", files_read.join(", ")))?;
    let pooled: Vec<&Question> = questions.iter().collect();
    let audit = CvAudit {
        cv,
        files,
        ppmi: ppmi::top_associations(&pooled, args.ppmi_top, args.ppmi_min_count),
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.dataset.join("audit"));
    report::write_cv(&out, &audit)?;
    if args.json {
        println!("{}", serde_json::to_string(&audit)?);
    } else {
        print_cv_table(&audit.cv);
        println!("report: {}", out.join("audit.md").display());
    }
    Ok(())
}

fn print_cv_table(cv: &cv::CvReport) {
    println!(
        "{}-fold cross-validation by group: {} questions, {} groups, seed {} (chance 0.250)",
        cv.folds, cv.questions, cv.groups, cv.seed
    );
    println!("{:<10} {:>6} {:>7}", "baseline", "mean", "± se");
    for (baseline, result) in &cv.baselines {
        let name = baseline.name();
        match result {
            cv::CvResult::Measured { mean, se, .. } => {
                println!("{name:<10} {mean:>6.3} {:>7}", format!("± {se:.3}"))
            }
            cv::CvResult::Skipped { skipped } => println!("{name:<10} skipped: {skipped}"),
        }
    }
}

/// The text of option `o` of a question that one n-gram classifier sees.
type View = dyn Fn(&Question, usize) -> String;

/// Everything but the KNN distances (which need the encoder), from labelled train and val.
pub fn audit(
    train: &[Question],
    val: &[Question],
    seed: u64,
    ppmi_top: usize,
    ppmi_min_count: u64,
    knn: Knn,
) -> AuditReport {
    let gold: Vec<usize> = val
        .iter()
        .map(|q| q.label.expect("labels checked on read"))
        .collect();
    let lengths = |q: &Question| -> [f64; 4] {
        std::array::from_fn(|o| ngram::words(&q.endings[o]).len() as f64)
    };
    let shortest: Vec<[f64; 4]> = val.iter().map(|q| lengths(q).map(|l| -l)).collect();
    let longest: Vec<[f64; 4]> = val.iter().map(lengths).collect();
    let views: [&View; 3] = [
        &|q: &Question, o: usize| q.endings[o].clone(),
        &|q: &Question, o: usize| format!("{} {}", q.sent2, q.endings[o]),
        &|q: &Question, o: usize| format!("{} {} {}", q.sent1, q.sent2, q.endings[o]),
    ];
    let mut ngram_acc = [0.0; 3];
    let mut lambda = [0.0; 3];
    let bar = crate::progress::bar(3, "n-gram classifiers");
    for (i, view) in views.iter().enumerate() {
        let vocab = ngram::Vocabulary::fit(
            train
                .iter()
                .flat_map(|q| (0..4).map(move |o| view(q, o)))
                .collect::<Vec<_>>()
                .iter()
                .map(String::as_str),
        );
        let encode = |qs: &[Question]| -> Vec<ngram::Choice> {
            qs.iter()
                .map(|q| ngram::Choice {
                    options: std::array::from_fn(|o| vocab.features(&view(q, o))),
                    gold: q.label.expect("labels checked on read"),
                })
                .collect()
        };
        (ngram_acc[i], lambda[i]) =
            ngram::train_and_evaluate(&encode(train), &encode(val), vocab.len(), seed);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let all: Vec<&Question> = train.iter().chain(val).collect();
    AuditReport {
        n_train: train.len(),
        n_val: val.len(),
        seed,
        random: ngram::tie_aware_accuracy(&vec![[0.0; 4]; val.len()], &gold),
        shortest: ngram::tie_aware_accuracy(&shortest, &gold),
        longest: ngram::tie_aware_accuracy(&longest, &gold),
        ngram_end: ngram_acc[0],
        ngram_s2: ngram_acc[1],
        ngram_ctx: ngram_acc[2],
        lambda,
        ppmi: ppmi::top_associations(&all, ppmi_top, ppmi_min_count),
        knn,
    }
}

/// A seeded sample of at most `max` questions, in their original order.
fn sample(questions: &[Question], max: usize, seed: u64) -> Vec<&Question> {
    if questions.len() <= max {
        return questions.iter().collect();
    }
    let mut idx: Vec<usize> = (0..questions.len()).collect();
    idx.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    idx.truncate(max);
    idx.sort_unstable();
    idx.into_iter().map(|i| &questions[i]).collect()
}

/// KNN distances with MiniLM; when the encoder cannot be loaded (no cached model and no pip),
/// the audit goes on without them and says why.
fn measure_knn(train: &[Question], val: &[Question], max: usize, seed: u64) -> Result<Knn> {
    let encoder = match crate::embed::SentenceEncoder::load_default() {
        Ok(encoder) => encoder,
        Err(err) => {
            eprintln!("KNN distances skipped: {err:#}");
            return Ok(Knn::Skipped {
                skipped: format!("MiniLM encoder unavailable: {err:#}"),
            });
        }
    };
    let encode = |texts: &[&str], progress: &mut dyn FnMut(usize)| {
        encoder.encode_with_progress(texts, progress)
    };
    let (train, val) = (
        sample(train, max, seed),
        sample(val, max, seed.wrapping_add(1)),
    );
    Ok(Knn::Measured(knn::measure(
        &encode,
        "all-MiniLM-L6-v2",
        &train,
        &val,
    )?))
}
