//! `afkit aflite`: flags → `aflite::Config`, a progress bar per round, the closing line.

use std::path::PathBuf;

use anyhow::Result;

use afkit_aflite::filter::{Observer, Round, Variant};
use afkit_aflite::logreg::FitOptions;
use afkit_aflite::{self as aflite, Features, SizeSpec, WarmupConfig};
use afkit_engine::seed::Seed;

#[derive(clap::Args)]
#[command(
    after_long_help = "Outputs: OUT (the retained examples, in the input's format), \
    OUT.scores.jsonl (one line per input example: id, score = its last predictability p̃, \
    removed_round = the round that removed it or null) and OUT.summary.json (parameters, seed, \
    rounds with |S|, removed counts and score histograms, wall time).\n\n\
    Sizes accept a fraction of the dataset (0.3) or a count (6000)."
)]
pub struct Args {
    /// Labelled dataset: JSONL ({"id", "text" or "text_a"/"text_b", "label"}) or CSV.
    ///
    /// A CSV has those columns. Without an id, an example is named by its record number (1-based).
    #[arg(long)]
    pub input: PathBuf,
    /// Where to write the retained subset (same format as the input).
    #[arg(long)]
    pub out: PathBuf,
    /// `minilm` (sentence embeddings) or a file of vectors, one row per example in input order.
    ///
    /// `minilm`: all-MiniLM-L6-v2 sentence embeddings; a pair becomes [u; v; |u−v|; u⊙v]. A
    /// file: a .npy float matrix, or .safetensors with one 2-D tensor.
    #[arg(long, default_value = "minilm")]
    pub features: String,
    /// Target size n: filtering never goes below it.
    #[arg(long, default_value = "0.3")]
    pub target_size: SizeSpec,
    /// Random partitions m per round.
    #[arg(long, default_value_t = 64, hide_short_help = true)]
    pub partitions: usize,
    /// Training-set size t of each partition (must be below n).
    #[arg(long, default_value = "0.2", hide_short_help = true)]
    pub train_size: SizeSpec,
    /// Slice size k: examples removed per round at most.
    #[arg(long, default_value = "0.05", hide_short_help = true)]
    pub slice: SizeSpec,
    /// Early-stopping threshold τ: only examples with predictability ≥ τ are removed.
    ///
    /// The run stops after a round in which fewer than k passed it.
    #[arg(long, default_value_t = 0.75)]
    pub tau: f64,
    /// greedy (k = 1), slicing (top k, the papers' AFLite) or sampling (k drawn ∝ p̃).
    #[arg(long, value_enum, default_value_t = Variant::Slicing)]
    pub variant: Variant,
    /// Seed of every random choice (partitions, tie-breaks, sampling, warm-up).
    #[arg(long, default_value_t = Seed::default())]
    pub seed: Seed,
    /// Inverse L2 strength C of the logistic regression (scikit-learn's parametrisation).
    #[arg(long, default_value_t = FitOptions::default().c, hide_short_help = true)]
    pub c: f64,
    /// Gradient tolerance of each fit (largest entry of the per-example objective's gradient).
    #[arg(long, default_value_t = FitOptions::default().tol, hide_short_help = true)]
    pub tol: f64,
    /// Iteration cap of each fit.
    #[arg(long, default_value_t = FitOptions::default().max_iter, hide_short_help = true)]
    pub max_iter: usize,
    /// Hold out this fraction to train a warm-up MLP whose hidden layer becomes the features.
    ///
    /// The held-out part (random) trains a one-hidden-layer MLP on the base features, and the
    /// rest is filtered with its hidden layer as Φ. The held-out part is left out of OUT.
    #[arg(long, hide_short_help = true)]
    pub warmup_fraction: Option<f64>,
    /// Hidden units of the warm-up MLP.
    #[arg(long, default_value_t = 256, hide_short_help = true)]
    pub warmup_hidden: usize,
    /// Training epochs of the warm-up MLP.
    #[arg(long, default_value_t = 30, hide_short_help = true)]
    pub warmup_epochs: usize,
    /// Folder of the MiniLM embedding cache; default $AFKIT_HOME/embeddings.
    ///
    /// One vector per distinct text, keyed by the SHA-256 of the model and the text, shared
    /// with `afkit audit` and `afkit filter`.
    #[arg(long, hide_short_help = true)]
    pub cache_dir: Option<PathBuf>,
    /// Embed again instead of reading or writing the cache.
    #[arg(long, hide_short_help = true)]
    pub no_cache: bool,
    /// Also write the base features (before any warm-up) as a float32 .npy matrix.
    ///
    /// One row per input example, e.g. to run another implementation on the same features.
    #[arg(long, hide_short_help = true)]
    pub write_features: Option<PathBuf>,
    /// Write every round's partitions as JSON lines (input row indices, 0-based).
    ///
    /// A header line {"seed", "examples", "tiebreak_rank"}, then {"round", "s", "train": [[...]
    /// × m]}.
    #[arg(long, hide_short_help = true)]
    pub dump_partitions: Option<PathBuf>,
    /// Replace output files that afkit did not write (or that were changed since).
    ///
    /// No output may be the input or the features file, with or without it.
    #[arg(long, hide_short_help = true)]
    pub force: bool,
}

impl Args {
    fn config(self) -> aflite::Config {
        let features = if self.features == "minilm" {
            Features::MiniLm {
                cache: (!self.no_cache).then(|| {
                    self.cache_dir
                        .unwrap_or_else(afkit_engine::embed::default_cache_dir)
                }),
            }
        } else {
            Features::Vectors(PathBuf::from(&self.features))
        };
        aflite::Config {
            input: self.input,
            out: self.out,
            features,
            target_size: self.target_size,
            partitions: self.partitions,
            train_size: self.train_size,
            slice: self.slice,
            tau: self.tau,
            variant: self.variant,
            seed: self.seed,
            fit: FitOptions {
                c: self.c,
                tol: self.tol,
                max_iter: self.max_iter,
            },
            warmup: self.warmup_fraction.map(|fraction| WarmupConfig {
                fraction,
                hidden: self.warmup_hidden,
                epochs: self.warmup_epochs,
            }),
            write_features: self.write_features,
            dump_partitions: self.dump_partitions,
            force: self.force,
        }
    }
}

pub fn run(args: Args) -> Result<()> {
    let config = args.config();
    let mut progress = AfliteBars {
        partitions: config.partitions,
        bar: None,
        embedding: Default::default(),
    };
    let summary = aflite::run(&config, &mut progress)?;
    let stop = serde_json::to_value(summary.stop)?;
    eprintln!(
        "aflite: kept {} of {} examples after {} ({}); wrote {}",
        summary.kept,
        summary.filtered,
        afkit_engine::text::counted(summary.rounds, "round", "rounds"),
        stop.as_str().unwrap_or_default().replace('_', " "),
        config.out.display()
    );
    Ok(())
}

/// A progress bar per round over its partitions, a line per finished round, Ctrl-C.
struct AfliteBars {
    partitions: usize,
    /// The bar of the current round's partitions.
    bar: Option<indicatif::ProgressBar>,
    /// The bar of the texts embedded before the rounds.
    embedding: super::progress::Lines,
}

impl Observer for AfliteBars {
    fn partition_done(&self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    fn round_started(&mut self, round: usize, size: usize) {
        let bar = super::progress::bar(self.partitions as u64, "partitions");
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
        afkit_engine::interrupt::check()?;
        Ok(())
    }

    fn note(&mut self, message: &str) {
        eprintln!("{message}");
    }

    fn embedding(&mut self, done: usize, total: usize) {
        self.embedding
            .track(done, total, "texts embedded with MiniLM");
    }
}
