//! `afkit filter`: flags → `afkit_filter::Config`, progress bars and the per-iteration lines.

use std::path::PathBuf;
use std::sync::LazyLock;

use anyhow::Result;

use super::device::DeviceArgs;
use afkit_engine::device::Compute;
use afkit_engine::seed::Seed;
use afkit_engine::text::counted;
use afkit_filter::settings::{
    DiscriminatorConfig, EncodeConfig, ModelConfig, Replacement, Scorer, TrainConfig,
    DEFAULT_SCORER,
};
use afkit_filter::{self as filter, Config};
use afkit_store::af::{AfRun, HeadAccuracy, IterationRecord, Phase};
use afkit_store::Store;

/// The defaults shown in `--help` are the stage's own.
static DEFAULTS: LazyLock<Config> = LazyLock::new(Config::default);

// Help headings, most used first.
const RUN: &str = "The run";
const TRAINING: &str = "Training the classifiers";
const MODELS: &str = "Models in the ensemble";

/// The fine-tuned adversaries `--discriminator` knows.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum DiscriminatorArg {
    /// The shipped MiniLM sentence encoder, fine-tuned as a cross-encoder (the default).
    Minilm,
    /// No fine-tuned adversary: the stylistic ensemble (and the scorers' features) alone.
    None,
}

#[derive(clap::Args)]
pub struct FilterArgs {
    /// The project file.
    pub project: PathBuf,
    /// Negatives per context (contexts with smaller pools are left out).
    #[arg(long, default_value_t = DEFAULTS.k, help_heading = RUN)]
    pub k: usize,
    /// Cap on the cheap MLP-only iterations that run first (SWAG: 100 on GPUs).
    #[arg(long, default_value_t = DEFAULTS.mlp_iterations, help_heading = RUN, hide_short_help = true)]
    pub mlp_iterations: usize,
    /// Cap on the full-ensemble iterations (SWAG: 50); default 8 with the fine-tuned adversary,
    /// 3 without it.
    ///
    /// With the adversary, each iteration trains a fresh cross-encoder on a new 80/20 split, so
    /// that over the iterations most contexts are held out at least once. Without it the cap is
    /// low because with in-domain pools (`lm adapt`) more iterations overshoot: the stylistic
    /// classifiers end up preferring the distractors to the real ending, an artifact of its own.
    /// The phase stops earlier once it has converged, from its fifth iteration: 2 iterations in a
    /// row with swaps below 1% of the held-out contexts or the ensemble's accuracy (with the
    /// cross-encoder's) within two standard errors of chance (see also `--style-iterations`). 0 runs
    /// MLP-only AF (for projects too big for the text models on this machine): the final
    /// cross-fitted pass then scores with the MLP, and the pools' texts are never loaded.
    #[arg(long, help_heading = RUN, hide_short_help = true)]
    pub ensemble_iterations: Option<usize>,
    /// Cap on the style iterations: the ensemble without the fine-tuned adversary, run between
    /// the MLP-only and the ensemble iterations; default 20 with the adversary, none without it.
    ///
    /// The ensemble phase goes by the deciding score, which carries the language models'
    /// features that the pools cannot answer; alone, on a large project it leaves distractors
    /// whose words still tell them from the real endings. A style iteration costs a few seconds
    /// where an adversary iteration costs a cross-encoder's training, and goes by the stylistic
    /// classifiers (bag-of-words, CNN, BiLSTM, subword, sentence) alone. One whose classifiers
    /// read, on their mean, within two standard errors of chance swaps nothing (its swaps would
    /// follow noise), and two such iterations in a row end the phase, as they do after a few on a
    /// small project; the ensemble phase then also ends, from its fifth iteration, once those
    /// classifiers and the cross-encoder both read at chance. Without an adversary the ensemble
    /// phase is the style phase: raise `--ensemble-iterations` instead.
    #[arg(long, help_heading = RUN, hide_short_help = true)]
    pub style_iterations: Option<usize>,
    /// Seed of the run (recorded).
    ///
    /// It seeds the splits, the initial assignment, model initialisation and batch order.
    #[arg(long, default_value_t = DEFAULTS.seed, help_heading = RUN)]
    pub seed: Seed,
    /// Easy negatives replaced per held-out context and iteration (SWAG: N_easy = 2).
    #[arg(long, default_value_t = DEFAULTS.n_easy, help_heading = RUN, hide_short_help = true)]
    pub n_easy: usize,
    /// Which pool ending replaces an easy negative: the highest-scoring or the one nearest the
    /// real ending.
    ///
    /// `highest` (SWAG's rule, the default) takes the highest-scoring pool ending; it pushes the
    /// negatives past the real ending, so that on small projects the audit's classifiers pick the
    /// real ending less often than chance, an artifact of its own. `nearest-gold` takes the one
    /// that outscores the easy negative and scores nearest the real ending: it overshoots less on
    /// style but leaves more for language models to find (BENCHMARKS.md compares the two).
    #[arg(long, value_enum, default_value_t = DEFAULTS.replacement, help_heading = RUN, hide_short_help = true)]
    pub replace_with: Replacement,
    /// What held-out contexts and final folds keep together: single contexts or whole groups.
    ///
    /// `context` (the default) holds out single contexts; `group` whole groups (an ActivityNet
    /// video), as the export's splits and the audit's folds are cut. With `context` a model may have trained on a context of the same video when it scores a
    /// held-out one, so it knows that video's real endings; `group` rules that out.
    #[arg(long, value_enum, default_value_t = DEFAULTS.hold_out, help_heading = RUN, hide_short_help = true)]
    pub hold_out: filter::HoldOut,
    /// How the iterations choose the fifth of the contexts they hold out: at random or in turns.
    ///
    /// An iteration replaces the negatives of the contexts it holds out only. `random` (SWAG's
    /// rule, the default) draws each iteration's fifth afresh: after five iterations about a
    /// third of the contexts were never held out, and some were held out three times. `rotating`
    /// deals each phase's contexts into five folds and holds out one per iteration, so every
    /// context is filtered once in every five iterations; on small projects it filtered further
    /// and pushed the style classifiers further below chance (BENCHMARKS.md).
    #[arg(long, value_enum, default_value_t = DEFAULTS.turns, help_heading = RUN, hide_short_help = true)]
    pub turns: filter::HeldOutTurns,
    /// Start a new run instead of resuming or keeping the latest one.
    ///
    /// Without it an unfinished latest run resumes, and one finished on the same pools stands.
    #[arg(long, help_heading = RUN)]
    pub new_run: bool,
    /// Training passes over the training contexts in an MLP-only iteration.
    #[arg(long, default_value_t = DEFAULTS.train.mlp_epochs, help_heading = TRAINING, hide_short_help = true)]
    pub mlp_epochs: usize,
    /// Training passes in an ensemble iteration and in each fold of the final pass.
    #[arg(long, default_value_t = DEFAULTS.train.ensemble_epochs, help_heading = TRAINING, hide_short_help = true)]
    pub ensemble_epochs: usize,
    /// Contexts per optimisation step.
    #[arg(long, default_value_t = DEFAULTS.train.batch_contexts, help_heading = TRAINING, hide_short_help = true)]
    pub batch_contexts: usize,
    /// AdamW learning rate.
    #[arg(long, default_value_t = DEFAULTS.train.learning_rate, help_heading = TRAINING, hide_short_help = true)]
    pub learning_rate: f64,
    /// Word-embedding size of the bag-of-words, CNN and BiLSTM models.
    #[arg(long, default_value_t = DEFAULTS.train.model.word_dim, help_heading = TRAINING, hide_short_help = true)]
    pub word_dim: usize,
    /// Hidden size of the MLP and the ensemble.
    ///
    /// The CNN uses half as many filters per width and the BiLSTM half as many units per
    /// direction.
    #[arg(long, default_value_t = DEFAULTS.train.model.mlp_hidden, help_heading = TRAINING, hide_short_help = true)]
    pub hidden: usize,
    /// Words seen fewer times than this in the project's texts share the UNK embedding.
    #[arg(long, default_value_t = DEFAULTS.encode.min_count, help_heading = TRAINING, hide_short_help = true)]
    pub min_count: usize,
    /// Words seen in the texts of fewer contexts than this share the UNK embedding.
    ///
    /// A word found in a few contexts' texts teaches the word models only about those
    /// contexts' real endings; AF then favours other contexts' endings that contain it,
    /// distractors that imitate particular real endings rather than the style of all of them.
    /// On a small project a classifier trained on the export learns that imitation and picks
    /// the real ending less often than chance; raising this limit counters it (BENCHMARKS.md has
    /// the measurements), but check a small export's audit for rows under chance. A run of fewer
    /// than three times as many contexts as this keeps every word seen twice.
    #[arg(long, default_value_t = DEFAULTS.encode.min_contexts, help_heading = TRAINING, hide_short_help = true)]
    pub min_contexts: usize,
    /// Leave the subword model (hashed character n-grams of the ending) out of the ensemble.
    #[arg(long, help_heading = MODELS, hide_short_help = true)]
    pub no_subword_model: bool,
    /// Leave the sentence model (MiniLM embedding of sent2 + ending) out of the ensemble.
    ///
    /// It needs the MiniLM model (`afkit models fetch`) and embeds every pool ending once per run.
    #[arg(long, help_heading = MODELS, hide_short_help = true)]
    pub no_sentence_model: bool,
    /// Language model reading every ending (repeatable).
    ///
    /// `smollm2`, `gemma3` or the path of a GGUF file. Each ending is scored after its context
    /// (sent1 + " " + sent2, as lm-evaluation-harness poses the question); the log-likelihood,
    /// whole, per character and per token, joins the MLP's features, so AF prefers distractors
    /// this model finds as likely as the real ending. Scored once per ending and stored in the
    /// project (an interrupted scoring resumes).
    #[arg(
        long = "scorer",
        value_name = "MODEL",
        default_values_t = [DEFAULT_SCORER.to_string()],
        help_heading = MODELS
    )]
    pub scorers: Vec<String>,
    /// No scorer model: AF faces the stylistic ensemble alone.
    ///
    /// Faster, and models that read the context and the ending together (the fine-tuned
    /// cross-encoder of `audit`) then find the real ending more often.
    #[arg(long, conflicts_with = "scorers", help_heading = MODELS)]
    pub no_scorer: bool,
    /// Language model that holds distractors to a fluency floor: `gemma3`, `smollm2`, a GGUF
    /// file, or `none` (the default).
    ///
    /// After AF it reads every found ending and assigned negative after its context; negatives
    /// it finds less likely per token than all but --fluency-quantile of the found endings are
    /// refused: `assemble --unverified` takes them only for a context with too few others. Read
    /// once per ending and stored; another quantile reads nothing again. Off by default: it
    /// removes broken distractors but leaves more that could be right (docs/recipe.md).
    #[arg(
        long,
        value_name = "MODEL",
        default_value = "none",
        hide_short_help = true,
        help_heading = MODELS
    )]
    pub fluency_reader: String,
    /// Share of the found endings allowed under the fluency floor (0 to 0.5).
    ///
    /// Higher refuses more negatives, broken ones and a few sound ones with them.
    #[arg(long, value_name = "SHARE", default_value_t = filter::fluency::DEFAULT_QUANTILE, help_heading = MODELS, hide_short_help = true)]
    pub fluency_quantile: f64,
    /// Fine-tuned adversary: `minilm` or `none`.
    ///
    /// The adversary beside the stylistic ensemble. `minilm` is the default, except with --ensemble-iterations 0.
    /// The MiniLM encoder (`afkit models fetch`) fine-tuned as a multiple-choice cross-encoder
    /// on `[context] [SEP] [ending]`: it reads the context and the ending together, as the
    /// models a benchmark measures do. A fresh copy trains in every ensemble iteration (and one
    /// per fold of the final pass), and AF acts on its scores and the ensemble's together.
    /// Fine-tuning an encoder is far slower than training the stylistic models: `--device cuda`
    /// where there is a GPU.
    #[arg(long, value_enum, value_name = "NAME", hide_possible_values = true, help_heading = MODELS)]
    pub discriminator: Option<DiscriminatorArg>,
    /// The model folder the discriminator fine-tunes instead of the shipped MiniLM: any BERT
    /// model in Hugging Face's layout (config.json, tokenizer.json, model.safetensors).
    #[arg(long, value_name = "DIR", help_heading = MODELS, hide_short_help = true)]
    pub discriminator_model: Option<PathBuf>,
    /// Folder of the MiniLM embedding cache; default $AFKIT_HOME/embeddings.
    ///
    /// The sentence model reads it first (one vector per distinct text, shared with `afkit
    /// audit` and `afkit aflite`). Projects that share contexts and endings embed them once.
    #[arg(long, help_heading = MODELS, hide_short_help = true)]
    pub cache_dir: Option<PathBuf>,
    /// Embed every pool ending again instead of reading or writing the cache.
    #[arg(long, help_heading = MODELS, hide_short_help = true)]
    pub no_cache: bool,
    /// Folds of the final cross-fitted scoring pass; default 3 with the fine-tuned adversary, 5
    /// without it.
    ///
    /// Each fold trains the models on the other folds and scores its own contexts' pools. With
    /// the adversary, a fold's cross-encoder costs most of the pass: three folds train on two
    /// thirds of the contexts each instead of four fifths, half the training of five, and on
    /// held-out contexts the audit did not tell their exports apart.
    #[arg(long, help_heading = RUN, hide_short_help = true)]
    pub folds: Option<usize>,
    #[command(flatten, next_help_heading = "Device")]
    pub device: DeviceArgs,
}

/// Ensemble iterations when the fine-tuned adversary takes part (see `--ensemble-iterations`).
const ADVERSARY_ENSEMBLE_ITERATIONS: usize = 8;

/// Style iterations before the fine-tuned adversary joins (see `--style-iterations`).
const ADVERSARY_STYLE_ITERATIONS: usize = 20;

/// Final folds when the fine-tuned adversary takes part (see `--folds`).
const ADVERSARY_FOLDS: usize = 3;

impl FilterArgs {
    /// The fine-tuned adversary of the run: MiniLM unless told otherwise or the run has no
    /// ensemble phase for it to join.
    fn discriminator(&self) -> Option<DiscriminatorConfig> {
        match self.discriminator {
            Some(DiscriminatorArg::None) => None,
            None if self.ensemble_iterations == Some(0) => None,
            Some(DiscriminatorArg::Minilm) | None => Some(DiscriminatorConfig {
                model: self.discriminator_model.clone(),
                ..Default::default()
            }),
        }
    }

    fn config(&self, compute: Compute) -> Result<Config> {
        let defaults = Config::default();
        Ok(Config {
            k: self.k,
            seed: self.seed,
            n_easy: self.n_easy,
            replacement: self.replace_with,
            hold_out: self.hold_out,
            turns: self.turns,
            mlp_iterations: self.mlp_iterations,
            style_iterations: self.style_iterations(),
            ensemble_iterations: self.ensemble_iterations(),
            folds: self.folds(),
            encode: self.encode_config(defaults.encode),
            train: self.train_config(compute, defaults.train),
            scorers: self.scorer_models()?,
            discriminator: self.discriminator(),
            new_run: self.new_run,
            embedding_cache: (!self.no_cache).then(|| {
                self.cache_dir
                    .clone()
                    .unwrap_or_else(afkit_engine::embed::default_cache_dir)
            }),
            ..defaults
        })
    }

    /// `--style-iterations`, which run only before the fine-tuned adversary joins.
    fn style_iterations(&self) -> usize {
        self.given_or_by_adversary(
            self.style_iterations,
            ADVERSARY_STYLE_ITERATIONS,
            DEFAULTS.style_iterations,
        )
    }

    /// `--ensemble-iterations`, whose default is larger when the fine-tuned adversary joins.
    fn ensemble_iterations(&self) -> usize {
        self.given_or_by_adversary(
            self.ensemble_iterations,
            ADVERSARY_ENSEMBLE_ITERATIONS,
            DEFAULTS.ensemble_iterations,
        )
    }

    /// `--folds`, whose default is smaller when the fine-tuned adversary joins.
    fn folds(&self) -> usize {
        self.given_or_by_adversary(self.folds, ADVERSARY_FOLDS, DEFAULTS.folds)
    }

    /// The value the user gave, else the default for a run with the fine-tuned adversary or
    /// the one for a run without it.
    fn given_or_by_adversary(
        &self,
        given: Option<usize>,
        with_adversary: usize,
        without: usize,
    ) -> usize {
        given.unwrap_or(if self.discriminator().is_some() {
            with_adversary
        } else {
            without
        })
    }

    /// How texts are read: the vocabulary's thresholds and which text models get inputs.
    fn encode_config(&self, defaults: EncodeConfig) -> EncodeConfig {
        EncodeConfig {
            min_count: self.min_count,
            min_contexts: self.min_contexts,
            subword_buckets: if self.no_subword_model {
                0
            } else {
                defaults.subword_buckets
            },
            sentence_vectors: !self.no_sentence_model,
            ..defaults
        }
    }

    /// How each iteration's models are sized and trained, on `compute`.
    fn train_config(&self, compute: Compute, defaults: TrainConfig) -> TrainConfig {
        TrainConfig {
            mlp_epochs: self.mlp_epochs,
            ensemble_epochs: self.ensemble_epochs,
            batch_contexts: self.batch_contexts,
            learning_rate: self.learning_rate,
            model: ModelConfig {
                word_dim: self.word_dim,
                mlp_hidden: self.hidden,
                ensemble_hidden: self.hidden,
                cnn_filters: (self.hidden / 2).max(1),
                lstm_hidden: (self.hidden / 2).max(1),
                ..ModelConfig::default()
            },
            compute,
            ..defaults
        }
    }

    /// The scorer models (`--scorer`), fetched where needed; none with `--no-scorer`.
    fn scorer_models(&self) -> Result<Vec<Scorer>> {
        self.scorers
            .iter()
            .filter(|_| !self.no_scorer)
            .map(|name| Scorer::open(name, afkit_engine::models::generator_gguf(name)?))
            .collect()
    }
}

pub fn run(args: FilterArgs) -> Result<()> {
    afkit_engine::runtime::use_one_candle_thread();
    // The device first (a build without CUDA says so before any file is touched), the scorer
    // models (which may be fetched) once the project is known to exist.
    let compute = args.device.open()?;
    let mut store = Store::open(&args.project)?;
    let config = args.config(compute)?;
    let mut progress = FilterBars::default();
    let summary = filter::run(&mut store, &config, &mut progress)?;
    progress.0.clear();
    hold_to_fluency_floor(&mut store, &args, &mut progress)?;
    if let filter::Summary::Finished {
        run_id,
        iterations,
        scored,
        final_family,
        final_accuracy,
        timings,
    } = summary
    {
        println!(
            "final cross-fitted pass ({} folds, {}): {}",
            config.folds,
            final_family.name(),
            accuracy_text(&final_accuracy)
        );
        println!(
            "AF run {run_id} finished: {}; scores of {} stored (see `afkit report`)",
            counted(iterations, "iteration", "iterations"),
            counted(scored, "ending", "endings")
        );
        println!("{}", timings_text(&timings));
    }
    Ok(())
}

/// Holds the latest finished AF run to the fluency floor `--fluency-reader` and
/// `--fluency-quantile` ask for (or to none), and says what it refused.
fn hold_to_fluency_floor(
    store: &mut Store,
    args: &FilterArgs,
    progress: &mut FilterBars,
) -> Result<()> {
    let Some(run) = store.latest_finished_af_run()? else {
        return Ok(());
    };
    if args.fluency_reader == "none" {
        return store.set_fluency_floor(run.id, None);
    }
    let fluency = filter::fluency::Fluency {
        reader: args.fluency_reader.clone(),
        path: afkit_engine::models::generator_gguf(&args.fluency_reader)?,
        quantile: args.fluency_quantile,
    };
    let label = format!("endings read by {} for the fluency floor", fluency.reader);
    let summary = filter::fluency::hold_to_floor(store, run.id, &fluency, &mut |done, total| {
        progress.0.track(done, total, &label)
    })?;
    progress.0.clear();
    println!(
        "fluency floor ({}: {:.2} per token, reached by {:.0}% of the found endings): {} of {} \
         assigned negatives refused as distractors",
        summary.floor.reader,
        summary.floor.threshold,
        100.0 * (1.0 - summary.floor.quantile),
        summary.refused,
        summary.negatives
    );
    Ok(())
}

/// The stages `time:` names even when they took no time worth telling.
const ALWAYS_TIMED: [&str; 3] = ["MLP iterations", "ensemble iterations", "final pass"];

/// `time: sentence vectors 1.2 s, MLP iterations 30.0 s, ...`: the stages that took time in
/// this call (and the iterations and final pass always), in run order, with their total.
fn timings_text(timings: &filter::Timings) -> String {
    let stages = timings.stages();
    let total: f64 = stages.iter().map(|(_, s)| s).sum();
    let parts: Vec<String> = stages
        .iter()
        .filter(|(name, seconds)| *seconds >= 0.05 || ALWAYS_TIMED.contains(name))
        .map(|(name, seconds)| format!("{name} {seconds:.1} s"))
        .collect();
    format!("time: {total:.1} s in all; {}", parts.join(", "))
}

/// One progress bar at a time (embedding, iterations, folds), with lines printed above it.
#[derive(Default)]
struct FilterBars(super::progress::Lines);

impl filter::Observer for FilterBars {
    fn note(&mut self, message: &str) {
        self.0.say(message, true);
    }

    fn embedding(&mut self, done: usize, total: usize) {
        self.0
            .track(done, total, "endings embedded for the sentence model");
    }

    fn scoring(&mut self, name: &str, done: usize, total: usize) {
        self.0
            .track(done, total, &format!("endings scored by {name}"));
    }

    fn iterations_started(&mut self, _run: &AfRun, done: usize, total: usize) {
        // Iterations an earlier process did are not part of this one's rate.
        let since = super::progress::Since {
            done: done as u64,
            ..Default::default()
        };
        self.0.start_from(total, since, "iterations");
    }

    fn phase_started(&mut self, family: Phase) {
        self.0
            .say(&format!("phase: {} iterations", family.name()), true);
        // An ensemble iteration takes minutes where an MLP-only one took seconds: the time per
        // iteration and the ETA start again with the phase.
        self.0.restart_rate();
    }

    /// A phase that converged early says so, and the bar's total drops the iterations it will
    /// not run.
    fn phase_ended(&mut self, family: Phase, iterations: usize, cap: usize) {
        if iterations >= cap {
            return;
        }
        self.0.say(
            &format!(
                "{} phase converged after {iterations} of at most {cap} iterations",
                family.name()
            ),
            true,
        );
        if let Some(bar) = self.0.bar() {
            let total = bar.length().unwrap_or(0);
            bar.set_length(total.saturating_sub((cap - iterations) as u64));
        }
    }

    fn iteration_done(&mut self, record: &IterationRecord, train_seconds: f64) {
        self.0.say(&iteration_line(record, train_seconds), true);
        if let Some(bar) = self.0.bar() {
            bar.inc(1);
        }
    }

    fn final_pass_started(&mut self, folds: usize) {
        self.0.start(folds, "folds");
    }

    fn fold_done(&mut self) {
        if let Some(bar) = self.0.bar() {
            bar.inc(1);
        }
    }
}

fn accuracy_text(a: &HeadAccuracy) -> String {
    a.named()
        .iter()
        // The stylistic heads keep their columns; the fine-tuned adversary's show when present.
        .filter(|(name, v)| v.is_some() || !matches!(*name, "minilm" | "adversary"))
        .map(|(name, v)| match v {
            Some(v) => format!("{name} {v:.3}"),
            None => format!("{name}   -  "),
        })
        .collect::<Vec<_>>()
        .join("  ")
}

/// An iteration's accuracies on its held-out contexts, and how many of their easy negatives
/// it replaced.
fn iteration_line(r: &IterationRecord, train_seconds: f64) -> String {
    format!(
        "iteration {:>4} {:<8} {}  replaced {:>5} easy negatives in {}  {:.1} s (training {:.1} s)",
        r.iteration,
        r.phase.name(),
        accuracy_text(&r.accuracy),
        r.swaps,
        counted(r.n_test, "held-out context", "held-out contexts"),
        r.seconds,
        train_seconds
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Filter {
        #[command(flatten)]
        args: FilterArgs,
    }

    fn parse(flags: &[&str]) -> Result<FilterArgs, clap::Error> {
        let argv = ["filter", "p.sqlite"].iter().chain(flags);
        Filter::try_parse_from(argv).map(|f| f.args)
    }

    #[test]
    fn the_default_recipe_reads_endings_with_the_generator_and_fine_tunes_minilm() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.scorers, [DEFAULT_SCORER]);
        assert!(!args.no_scorer);
        let discriminator = args.discriminator().expect("on by default");
        assert_eq!(discriminator.model, None, "the shipped MiniLM");
        let compute = Compute::cpu();
        let config = args.config(compute.clone()).unwrap();
        let caps = |c: &Config| (c.style_iterations, c.ensemble_iterations, c.folds);
        assert_eq!(caps(&config), (20, 8, 3));
        let style_only = parse(&["--discriminator", "none"]).unwrap();
        let config = style_only.config(compute.clone()).unwrap();
        assert_eq!(caps(&config), (0, 3, 5));
        let told = parse(&["--folds", "4"]).unwrap();
        assert_eq!(told.config(compute).unwrap().folds, 4);
    }

    #[test]
    fn either_model_can_be_left_out_and_mlp_only_runs_have_no_discriminator() {
        assert!(parse(&["--no-scorer"]).unwrap().no_scorer);
        assert!(parse(&["--discriminator", "none"])
            .unwrap()
            .discriminator()
            .is_none());
        assert!(parse(&["--ensemble-iterations", "0"])
            .unwrap()
            .discriminator()
            .is_none());
        let err = parse(&["--no-scorer", "--scorer", "gemma3"]).err().unwrap();
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
    }
}
