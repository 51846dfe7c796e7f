//! `afkit filter`: a resumable AF run.
//!
//! 1. Contexts with a complete pool of at least k candidates take part; each starts with k
//!    distinct pool endings drawn at random (`since_iteration = -1`).
//! 2. Phase 1 runs MLP-only iterations, phase 2 ensemble iterations; each phase ends at its cap
//!    or when it converges ([`Convergence`]: two quiet iterations in a row).
//! 3. Every iteration is committed whole (record, swaps, new assignment) in one transaction, and
//!    its randomness comes from (seed, iteration) alone, so a run interrupted by Ctrl-C or
//!    `kill -9` resumes after its last stored iteration and ends exactly where an uninterrupted
//!    run with the same seed ends.
//! 4. The final cross-fitted pass splits contexts into folds, trains the ensemble (the MLP when
//!    the run has no ensemble phase) on all folds but one and scores the held-out fold's gold and
//!    every pool ending: `af_folds`, `af_scores`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use rand::RngCore;
use serde::Serialize;

use super::algorithm::{
    choose_swaps, folds, initial_draw, iteration_stream, solved, split_80_20, Convergence,
    Replacement, FINAL_STREAM, INITIAL_STREAM,
};
use super::data::{Dataset, EncodeConfig, EncodedContext, EncodedEnding};
use super::discriminator::{Discriminator, DiscriminatorConfig, Texts};
use super::scorer::{store_scorer_scores, Scorer};
use super::train::{train, Choice, Scores, TrainConfig, Trained};
use afkit_engine::seed::{Key, Seed};
use afkit_engine::text::counted;
use afkit_store::af::{AfRun, Assignment, FinalScore, HeadAccuracy, IterationRecord, Phase, Swap};
use afkit_store::Store;

/// Every setting of an AF run, each default resolved: what `afkit filter` records with the run
/// (with the pool counts, [`RunParams`]) and compares when it resumes one.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// Negatives assigned per context (contexts whose pool is smaller are left out).
    pub k: usize,
    pub seed: Seed,
    /// Easy negatives replaced per held-out context and iteration.
    pub n_easy: usize,
    /// Which candidate replaces an easy negative (recorded only when not the default, so runs
    /// from before the choice existed keep their settings).
    #[serde(skip_serializing_if = "is_default")]
    pub replacement: Replacement,
    /// What AF's held-out splits and final folds keep together (recorded like `replacement`).
    #[serde(skip_serializing_if = "is_default")]
    pub hold_out: HoldOut,
    pub mlp_iterations: usize,
    /// 0: MLP-only AF; the final pass then scores with the MLP and no text is loaded.
    pub ensemble_iterations: usize,
    /// Folds of the final cross-fitted pass.
    pub folds: usize,
    pub convergence: Convergence,
    pub encode: EncodeConfig,
    pub train: TrainConfig,
    /// Further language models whose scores of every ending join the MLP's features (recorded
    /// only when there are some, so runs without scorers keep their earlier settings).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scorers: Vec<Scorer>,
    /// The fine-tuned adversary that joins the ensemble in its iterations and the final pass
    /// (recorded only when there is one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discriminator: Option<DiscriminatorConfig>,
    /// Start a new run even though the latest one is unfinished or up to date (not recorded).
    #[serde(skip)]
    pub new_run: bool,
    /// Folder of the shared embedding cache the sentence vectors are read from and added to;
    /// `None` embeds without it. Not recorded: the vectors are the same either way.
    #[serde(skip)]
    pub embedding_cache: Option<PathBuf>,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// `afkit filter`'s defaults: caps scaled for a two-core CPU (BENCHMARKS.md, "Filter").
impl Default for Config {
    fn default() -> Self {
        Config {
            k: 9,
            seed: Seed::default(),
            n_easy: 2,
            replacement: Replacement::default(),
            hold_out: HoldOut::default(),
            mlp_iterations: 20,
            ensemble_iterations: 3,
            folds: 5,
            convergence: Convergence::default(),
            encode: EncodeConfig::default(),
            train: TrainConfig::default(),
            scorers: Vec::new(),
            discriminator: None,
            new_run: false,
            embedding_cache: None,
        }
    }
}

impl Config {
    fn validate(&self) -> Result<()> {
        if self.k == 0 {
            bail!("--k must be at least 1");
        }
        if self.discriminator.is_some() && self.ensemble_iterations == 0 {
            bail!("--discriminator joins the ensemble: it needs --ensemble-iterations above 0");
        }
        if self.folds < 2 {
            bail!("--folds must be at least 2 (train on all folds but one, score that one)");
        }
        Ok(())
    }

    /// The family of the final cross-fitted pass: the ensemble, unless the run has no ensemble
    /// phase, when the MLP that did the filtering also scores.
    pub fn final_family(&self) -> Phase {
        if self.ensemble_iterations > 0 {
            Phase::Ensemble
        } else {
            Phase::Mlp
        }
    }
}

/// What AF's held-out splits and final folds keep together.
///
/// AF swaps a held-out context's negatives for endings that a model trained on the other
/// contexts finds like real ones. Where those include contexts of the same video (ActivityNet's
/// `sent1` is often the previous caption's real ending), the model has read that video's real
/// endings when it scores the held-out one, as a model tested on the export's splits or in the
/// audit's folds never has. Holding out whole groups removes that; on 120 ActivityNet contexts it
/// did not cure the small-project overshoot it was tried against, and the models' rows rose
/// within noise (BENCHMARKS.md, "Replacing towards the gold"), so it is not the default yet.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HoldOut {
    /// Contexts one by one, whatever their group (the default).
    #[default]
    Context,
    /// Whole groups (the `group` given at ingest: an ActivityNet video), as the export's splits
    /// and the audit's folds are cut. A project with fewer groups than folds is held out context
    /// by context.
    Group,
}

/// Each context's group for the held-out splits and the final folds (`None`: a group of its
/// own): by context when the run says so or the project has fewer groups than folds.
fn split_groups<'a>(data: &'a Dataset, config: &Config) -> Vec<Option<&'a str>> {
    let groups: Vec<Option<&str>> = data
        .contexts
        .iter()
        .map(|c| Some(c.group.as_str()))
        .collect();
    if config.hold_out == HoldOut::Group
        && afkit_engine::folds::count_groups(&groups) >= config.folds
    {
        groups
    } else {
        vec![None; groups.len()]
    }
}

/// A run's settings and the pools it filters, stored as `af_runs.params`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunParams {
    #[serde(flatten)]
    pub config: Config,
    pub n_contexts: usize,
    pub n_excluded: usize,
}

/// What `filter` reports while it works. Every method has a default that does nothing.
pub trait Observer {
    /// Something worth telling the user (a resumed run, contexts left out, ...).
    fn note(&mut self, _message: &str) {}
    /// Pool endings given a sentence vector so far, of `total` missing ones.
    fn embedding(&mut self, _done: usize, _total: usize) {}
    /// Pool endings scored by the scorer model `name` so far, of `total` missing ones.
    fn scoring(&mut self, _name: &str, _done: usize, _total: usize) {}
    /// The run is ready: `done` of `total` iterations at most are already stored.
    fn iterations_started(&mut self, _run: &AfRun, _done: usize, _total: usize) {}
    fn phase_started(&mut self, _family: Phase) {}
    /// The phase `family` is over after `iterations` of at most `cap` (fewer: it converged).
    fn phase_ended(&mut self, _family: Phase, _iterations: usize, _cap: usize) {}
    fn iteration_done(&mut self, _record: &IterationRecord, _train_seconds: f64) {}
    fn final_pass_started(&mut self, _folds: usize) {}
    fn fold_done(&mut self) {}
}

/// An observer that does nothing.
pub struct Silent;
impl Observer for Silent {}

/// What a `filter` call did.
#[derive(Debug)]
pub enum Summary {
    /// The latest run is finished, with these settings, on the current pools: nothing ran.
    UpToDate,
    /// A run was started or resumed and is now finished.
    Finished {
        run_id: i64,
        /// Iterations the run has in all (a resumed run counts the stored ones).
        iterations: usize,
        /// Endings given a final cross-fitted score.
        scored: usize,
        /// Every head's held-out accuracy in the final pass (whose family is the config's
        /// `final_family()`).
        final_accuracy: HeadAccuracy,
        /// Where this call's time went.
        timings: Box<Timings>,
    },
}

/// Seconds this `filter` call spent in each stage of the run (a resumed run counts only the
/// iterations it ran itself).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Timings {
    /// Sentence vectors computed (or read from the shared cache) for endings without one.
    pub sentence_vectors: f64,
    /// Scorer models (`--scorer`) run on endings without their scores.
    pub scorers: f64,
    /// Pools, features and scores read into memory and tokenised.
    pub reading: f64,
    /// The MLP phase's iterations.
    pub mlp_iterations: f64,
    /// The ensemble phase's iterations, the fine-tuned adversary's share left out.
    pub ensemble_iterations: f64,
    /// The fine-tuned adversary (`--discriminator`) in the ensemble's iterations: training it
    /// and scoring the held-out pools with it.
    pub adversary: f64,
    /// The final cross-fitted pass, its scores stored.
    pub final_pass: f64,
}

impl Timings {
    /// Every stage with its seconds, in the order the run goes through them.
    pub fn stages(&self) -> [(&'static str, f64); 7] {
        [
            ("sentence vectors", self.sentence_vectors),
            ("scorer models", self.scorers),
            ("reading pools", self.reading),
            ("MLP iterations", self.mlp_iterations),
            ("ensemble iterations", self.ensemble_iterations),
            ("fine-tuned adversary", self.adversary),
            ("final pass", self.final_pass),
        ]
    }
}

/// Runs AF on the project's pools: resumes the latest run when it is unfinished with the same
/// settings and pools, starts one otherwise, and does nothing when the latest run is finished
/// and up to date. Every iteration is committed on its own.
pub fn run(store: &mut Store, config: &Config, observer: &mut dyn Observer) -> Result<Summary> {
    config.validate()?;
    let _claim = store.claim_af_runs()?;
    let started = Instant::now();
    let mut timings = Timings::default();
    let data = load_pools(store, config, observer, &mut timings)?;
    let params = RunParams {
        config: config.clone(),
        n_contexts: data.contexts.len(),
        n_excluded: data.excluded,
    };
    if let Some(discriminator) = &config.discriminator {
        // Every model is loaded once before a run is created or marked running: a folder that
        // holds no model fails here, not after the MLP iterations.
        Discriminator::new(discriminator, Seed::new(0), &config.train.compute).map(drop)?;
    }
    let fingerprint = data.fingerprint();
    let Some(run) = resolve_run(store, &params, &fingerprint, &data, observer)? else {
        return Ok(Summary::UpToDate);
    };
    observer.note(&format!(
        "AF run {}: {}, k = {}, chance = {:.3} (pools read in {:.1} s)",
        run.id,
        counted(data.contexts.len(), "context", "contexts"),
        config.k,
        1.0 / (config.k as f64 + 1.0),
        started.elapsed().as_secs_f64()
    ));
    if config.hold_out == HoldOut::Group && split_groups(&data, config).iter().all(Option::is_none)
    {
        observer.note(&format!(
            "fewer than {} groups: contexts are held out one by one",
            config.folds
        ));
    }
    if data.with_text {
        observer.note(&format!(
            "texts encoded for the ensemble: vocabulary {} words, BiLSTM {} ids",
            data.vocab_size, data.lstm_vocab_size
        ));
    }
    let adversary = config
        .discriminator
        .as_ref()
        .map(|d| Adversary::open(store, &data, d, config))
        .transpose()?;
    let mut assignment = store.af_assignment(run.id)?;
    let iterations = run_iterations(
        store,
        (&run, &data),
        &mut assignment,
        config,
        adversary.as_ref(),
        observer,
        &mut timings,
    )?;
    let final_started = Instant::now();
    let (scored, final_accuracy) = finish_run(
        store,
        run.id,
        &data,
        &assignment,
        config,
        adversary.as_ref(),
        observer,
    )?;
    timings.final_pass = final_started.elapsed().as_secs_f64();
    Ok(Summary::Finished {
        run_id: run.id,
        iterations,
        scored,
        final_accuracy,
        timings: Box::new(timings),
    })
}

/// Reads the pools AF filters, embedding their sentences first where the run needs them, and
/// checks there are enough of them.
fn load_pools(
    store: &mut Store,
    config: &Config,
    observer: &mut dyn Observer,
    timings: &mut Timings,
) -> Result<Dataset> {
    // The text ids (words, BiLSTM ids) only for a run with an ensemble phase: MLP-only work
    // reads the LM features alone, which keeps a big project small.
    let with_text = config.final_family() == Phase::Ensemble;
    let started = Instant::now();
    if with_text && config.encode.sentence_vectors {
        let cache = config.embedding_cache.as_deref();
        super::data::store_sentence_vectors(store, cache, &mut |done, total| {
            observer.embedding(done, total)
        })?;
    }
    timings.sentence_vectors = started.elapsed().as_secs_f64();
    let started = Instant::now();
    for scorer in &config.scorers {
        store_scorer_scores(store, scorer, &mut |done, total| {
            observer.scoring(&scorer.name, done, total)
        })?;
    }
    timings.scorers = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let keys: Vec<String> = config.scorers.iter().map(|s| s.sha256.clone()).collect();
    let data = Dataset::load_scored(store, config.k, &config.encode, with_text, &keys)?;
    timings.reading = started.elapsed().as_secs_f64();
    if data.excluded > 0 {
        let (has, is) = if data.excluded == 1 {
            ("context has", "is")
        } else {
            ("contexts have", "are")
        };
        observer.note(&format!(
            "{} {has} fewer than k = {} candidate endings and {is} left out",
            data.excluded, config.k
        ));
    }
    let needed = 2 * config.folds.max(5);
    if data.contexts.len() < needed {
        bail!(
            "{}: only {} contexts have a pool of at least k = {} candidates; AF needs at least \
             {needed} (run `afkit generate` first, or lower --k)",
            store.path().display(),
            data.contexts.len(),
            config.k,
        );
    }
    Ok(data)
}

/// Runs iterations until both phases are over, committing each with its swaps; returns how many
/// the run has in all (a resumed run continues after the stored ones).
fn run_iterations(
    store: &mut Store,
    (run, data): (&AfRun, &Dataset),
    assignment: &mut Assignment,
    config: &Config,
    adversary: Option<&Adversary>,
    observer: &mut dyn Observer,
    timings: &mut Timings,
) -> Result<usize> {
    let mut history = store.af_iterations(run.id)?;
    let total = config.mlp_iterations + config.ensemble_iterations;
    observer.iterations_started(run, history.len(), total);
    let mut next = next_family(&history, config);
    while let Some(family) = next {
        afkit_engine::interrupt::check()?;
        let iteration = history.len();
        if iteration == 0 || history[iteration - 1].phase != family {
            observer.phase_started(family);
        }
        let started = Instant::now();
        let IterationOutcome {
            record,
            swaps,
            train_seconds,
            adversary_seconds,
        } = run_iteration(data, assignment, family, iteration, config, adversary)?;
        let seconds = started.elapsed().as_secs_f64();
        timings.adversary += adversary_seconds;
        match family {
            Phase::Mlp => timings.mlp_iterations += seconds,
            Phase::Ensemble => timings.ensemble_iterations += seconds - adversary_seconds,
        }
        store.commit_af_iteration(run.id, &record, &swaps)?;
        apply_swaps(assignment, &swaps);
        observer.iteration_done(&record, train_seconds);
        history.push(record);
        next = next_family(&history, config);
        if next != Some(family) {
            let iterations = history.iter().filter(|r| r.phase == family).count();
            let cap = match family {
                Phase::Mlp => config.mlp_iterations,
                Phase::Ensemble => config.ensemble_iterations,
            };
            observer.phase_ended(family, iterations, cap);
        }
    }
    afkit_engine::interrupt::check()?;
    Ok(history.len())
}

/// The final cross-fitted pass, stored with the run's folds; returns the number of endings
/// scored and every head's held-out accuracy.
fn finish_run(
    store: &mut Store,
    run_id: i64,
    data: &Dataset,
    assignment: &Assignment,
    config: &Config,
    adversary: Option<&Adversary>,
    observer: &mut dyn Observer,
) -> Result<(usize, HeadAccuracy)> {
    observer.final_pass_started(config.folds);
    let (fold_of, mut scores, accuracy) =
        final_pass(data, assignment, config, adversary, observer)?;
    // In key order, SQLite appends to the scores' B-tree instead of splitting pages all over it.
    scores.sort_unstable_by_key(|s| s.ending_id);
    let folds: Vec<(i64, usize)> = data
        .contexts
        .iter()
        .zip(&fold_of)
        .map(|(c, f)| (c.example_id, *f))
        .collect();
    store.finish_af_run(run_id, &folds, &scores, &accuracy)?;
    Ok((scores.len(), accuracy))
}

/// Picks the run to work on: resumes an unfinished run with the same parameters and pools,
/// starts a new one when asked or when the pools changed, and returns `None` when the latest run
/// is finished and up to date.
fn resolve_run(
    store: &mut Store,
    params: &RunParams,
    fingerprint: &str,
    data: &Dataset,
    observer: &mut dyn Observer,
) -> Result<Option<AfRun>> {
    let params_json = serde_json::to_value(params)?;
    if let Some(run) = store.latest_af_run()? {
        let same_pools = run.pool_fingerprint == fingerprint;
        let stored: serde_json::Value = serde_json::from_str(&run.params)?;
        let differing = differing_keys(&stored, &params_json);
        match (&run.finished_at, params.config.new_run, same_pools) {
            (None, false, true) => {
                if !differing.is_empty() {
                    bail!(
                        "AF run {} is unfinished and was started with other settings ({}); rerun \
                         with its settings to continue it, or pass --new-run to start over",
                        run.id,
                        differing.join(", ")
                    );
                }
                let done = store.af_iterations(run.id)?.len();
                observer.note(&format!(
                    "resuming AF run {} after {done} finished iterations",
                    run.id
                ));
                return Ok(Some(run));
            }
            (None, false, false) => bail!(
                "the pools changed since unfinished AF run {} started; pass --new-run to start \
                 a new run on the current pools",
                run.id
            ),
            (Some(_), false, true) if !differing.is_empty() => observer.note(&format!(
                "AF run {} finished with other settings ({}); starting a new run",
                run.id,
                differing.join(", ")
            )),
            (Some(finished), false, true) => {
                observer.note(&format!(
                    "AF run {} finished at {finished} on the current pools; nothing to do \
                     (pass --new-run to run AF again)",
                    run.id
                ));
                return Ok(None);
            }
            (Some(_), false, false) => observer.note(&format!(
                "the pools changed since AF run {} (contexts or endings were added or replaced); \
                 starting a new run",
                run.id
            )),
            (_, true, _) => {}
        }
        if run.finished_at.is_none() {
            store.abandon_af_run(run.id)?;
        }
    }
    let config = &params.config;
    let id = store.start_af_run(
        config.k,
        config.seed,
        &params_json.to_string(),
        fingerprint,
        &initial_assignment(data, config),
    )?;
    Ok(store.latest_af_run()?.filter(|r| r.id == id))
}

/// Every context's k distinct pool endings, drawn from the run's initial stream.
fn initial_assignment(data: &Dataset, config: &Config) -> Assignment {
    let mut rng = config.seed.stream(INITIAL_STREAM);
    data.contexts
        .iter()
        .map(|c| {
            let ids: Vec<i64> = c.candidates.iter().map(|e| e.ending_id).collect();
            (c.example_id, initial_draw(&ids, config.k, &mut rng))
        })
        .collect()
}

/// Settings that earlier versions recorded but that never changed a run: a run that records
/// them still matches today's settings. `train_fraction` was always 0.8 and the split was always
/// the fixed 80/20 one of [`split_80_20`].
const RETIRED_SETTINGS: &[&str] = &["train_fraction"];

/// The settings that differ between two recorded parameter sets, nested ones by their path
/// (`encode.min_contexts`), so that the message names what to pass to continue a run.
fn differing_keys(a: &serde_json::Value, b: &serde_json::Value) -> Vec<String> {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return vec!["params".into()];
    };
    let mut keys: Vec<String> = a
        .keys()
        .chain(b.keys())
        .filter(|k| !RETIRED_SETTINGS.contains(&k.as_str()))
        .filter(|k| a.get(*k) != b.get(*k))
        .flat_map(|k| match (a.get(k), b.get(k)) {
            (Some(x), Some(y)) if x.is_object() && y.is_object() => differing_keys(x, y)
                .into_iter()
                .map(|inner| format!("{k}.{inner}"))
                .collect(),
            _ => vec![k.clone()],
        })
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// The family of the next iteration, or `None` when both phases are over. A pure function of
/// the stored history, so a resumed run continues in the right phase.
pub(crate) fn next_family(history: &[IterationRecord], config: &Config) -> Option<Phase> {
    let rule = &config.convergence;
    let quiet = |phase: Phase| -> Vec<bool> {
        history
            .iter()
            .filter(|r| r.phase == phase)
            .map(|r| {
                let acc = match phase {
                    Phase::Mlp => r.accuracy.mlp,
                    Phase::Ensemble => r.accuracy.adversary.or(r.accuracy.ensemble),
                };
                rule.quiet(config.k, r.swaps, r.n_test, acc.unwrap_or(1.0))
            })
            .collect()
    };
    let mlp = quiet(Phase::Mlp);
    let ensemble = quiet(Phase::Ensemble);
    if ensemble.is_empty() && mlp.len() < config.mlp_iterations && !rule.converged(&mlp) {
        return Some(Phase::Mlp);
    }
    if ensemble.len() < config.ensemble_iterations && !rule.converged(&ensemble) {
        return Some(Phase::Ensemble);
    }
    None
}

/// The options of a context under the current assignment: gold first, then the k negatives.
fn choice<'a>(context: &'a EncodedContext, assigned: &[i64]) -> Choice<'a> {
    let mut options = Vec::with_capacity(assigned.len() + 1);
    options.push(&context.gold);
    options.extend(assigned.iter().map(|id| {
        context
            .candidate(*id)
            .expect("assigned endings come from the context's pool")
    }));
    Choice {
        options,
        n_sent2: context.n_sent2,
    }
}

/// One AF iteration: split, train, score the held-out pools, measure, choose swaps. Also returns
/// the time spent training.
pub(crate) fn run_iteration(
    data: &Dataset,
    assignment: &Assignment,
    family: Phase,
    iteration: usize,
    config: &Config,
    adversary: Option<&Adversary>,
) -> Result<IterationOutcome> {
    let started = Instant::now();
    let mut rng = config.seed.stream(iteration_stream(iteration));
    let (train_ids, test_ids) = split_80_20(&split_groups(data, config), &mut rng);
    let model_seed = Seed::new(rng.next_u64());
    let choices: Vec<Choice> = train_ids
        .iter()
        .map(|&i| choice(&data.contexts[i], &assignment[&data.contexts[i].example_id]))
        .collect();
    let model = train(data, &choices, family, &config.train, model_seed)?;
    // The fine-tuned adversary joins the ensemble's iterations only.
    let adversary = adversary.filter(|_| family == Phase::Ensemble);
    let adversary_started = Instant::now();
    let trained = adversary
        .map(|a| a.trained(data, &train_ids, assignment, model_seed))
        .transpose()?;
    let mut adversary_seconds = adversary_started.elapsed().as_secs_f64();
    let train_seconds = started.elapsed().as_secs_f64();
    let mut held_out = score_held_out(&model, data, &test_ids)?;
    if let (Some(a), Some(trained)) = (adversary, &trained) {
        let joined = Instant::now();
        a.join(trained, &mut held_out, data, &test_ids)?;
        adversary_seconds += joined.elapsed().as_secs_f64();
    }

    let mut swaps = Vec::new();
    for h in &held_out {
        let assigned = &assignment[&h.context.example_id];
        let decisive = h.decisive();
        let assigned_scores: Vec<(i64, f32)> = assigned
            .iter()
            .map(|id| (*id, decisive[h.position(*id)]))
            .collect();
        let unassigned: Vec<(i64, f32)> = h
            .context
            .candidates
            .iter()
            .enumerate()
            .filter(|(_, e)| !assigned.contains(&e.ending_id))
            .map(|(i, e)| (e.ending_id, decisive[i + 1]))
            .collect();
        for (slot, new_ending_id) in choose_swaps(
            decisive[0],
            &assigned_scores,
            &unassigned,
            config.n_easy,
            config.replacement,
        ) {
            swaps.push(Swap {
                example_id: h.context.example_id,
                slot,
                old_ending_id: assigned[slot],
                new_ending_id,
            });
        }
    }
    let record = IterationRecord {
        iteration,
        phase: family,
        swaps: swaps.len(),
        seconds: started.elapsed().as_secs_f64(),
        n_test: test_ids.len(),
        accuracy: accuracy(&held_out, assignment),
    };
    Ok(IterationOutcome {
        record,
        swaps,
        train_seconds,
        adversary_seconds,
    })
}

/// What one iteration did, to commit and report.
pub(crate) struct IterationOutcome {
    pub record: IterationRecord,
    pub swaps: Vec<Swap>,
    /// Seconds spent training (the rest is scoring and bookkeeping).
    pub train_seconds: f64,
    /// Seconds of those and of the scoring spent on the fine-tuned adversary.
    pub adversary_seconds: f64,
}

/// The fine-tuned adversary of a run: its settings and the texts it reads. Each use trains a
/// fresh model (see `discriminator.rs` for why none is carried between iterations).
pub(crate) struct Adversary {
    texts: Texts,
    config: DiscriminatorConfig,
    compute: afkit_engine::device::Compute,
    head_seed: Seed,
}

impl Adversary {
    fn open(
        store: &Store,
        data: &Dataset,
        config: &DiscriminatorConfig,
        run: &Config,
    ) -> Result<Adversary> {
        Ok(Adversary {
            texts: Texts::load(store, data)?,
            config: config.clone(),
            compute: run.train.compute.clone(),
            head_seed: run.seed.key(Key::DiscriminatorHead),
        })
    }

    /// A fresh model trained on the contexts `train_ids` under `assignment`, its draws from
    /// `model_seed` (the seed the iteration's or fold's other models train from).
    fn trained(
        &self,
        data: &Dataset,
        train_ids: &[usize],
        assignment: &Assignment,
        model_seed: Seed,
    ) -> Result<Discriminator> {
        let mut model = Discriminator::new(&self.config, self.head_seed, &self.compute)?;
        let seed = model_seed.key(Key::Discriminator);
        model.train(data, &self.texts, train_ids, assignment, seed)?;
        Ok(model)
    }

    /// Adds `model`'s scores of the held-out contexts `ids` as the `minilm` head, and the
    /// `adversary` head AF then acts on: the sum of the ensemble's and MiniLM's scores, each
    /// standardised over the context's gold and pool. Both heads are logits, but of different
    /// confidence: summed raw, the stylistic ensemble's wider spread outvoted the cross-encoder,
    /// which then still picked the real ending among ten 39% of the time after AF (against 19%
    /// for the ensemble). Standardised, each member has the same say in which ending is easy.
    fn join(
        &self,
        model: &Discriminator,
        held_out: &mut [HeldOut],
        data: &Dataset,
        ids: &[usize],
    ) -> Result<()> {
        let scores = model.score(data, &self.texts, ids)?;
        for (h, s) in held_out.iter_mut().zip(scores) {
            let both: Vec<f32> = standardised(h.decisive())
                .iter()
                .zip(standardised(&s))
                .map(|(a, b)| a + b)
                .collect();
            h.heads.push(("minilm", s));
            h.heads.push(("adversary", both));
        }
        Ok(())
    }
}

/// `scores` shifted and scaled to mean 0 and standard deviation 1 (only shifted when they are
/// all equal).
fn standardised(scores: &[f32]) -> Vec<f32> {
    let n = scores.len().max(1) as f32;
    let mean = scores.iter().sum::<f32>() / n;
    let sd = (scores.iter().map(|s| (s - mean).powi(2)).sum::<f32>() / n).sqrt();
    let scale = if sd > 0.0 { 1.0 / sd } else { 1.0 };
    scores.iter().map(|s| (s - mean) * scale).collect()
}

/// A held-out context's scores: position 0 is the gold, position i + 1 the context's i-th
/// candidate, per head (in [`named_heads`]' order).
struct HeldOut<'a> {
    context: &'a EncodedContext,
    heads: Vec<(&'static str, Vec<f32>)>,
}

impl HeldOut<'_> {
    /// The scores AF acts on (the last head: the ensemble, or the MLP in MLP-only iterations).
    fn decisive(&self) -> &[f32] {
        &self.heads.last().expect("at least the MLP head").1
    }

    fn head(&self, name: &str) -> Option<&[f32]> {
        self.heads
            .iter()
            .find(|(head, _)| *head == name)
            .map(|(_, scores)| scores.as_slice())
    }

    /// The final pass's record of position `i`: the decisive score and the sentence head's.
    fn final_score(&self, i: usize, ending_id: i64) -> FinalScore {
        FinalScore {
            ending_id,
            ensemble: self.decisive()[i],
            sentence: self.head("sentence").map(|s| s[i]),
        }
    }

    fn position(&self, ending_id: i64) -> usize {
        1 + self
            .context
            .candidates
            .iter()
            .position(|e| e.ending_id == ending_id)
            .expect("assigned endings come from the context's pool")
    }
}

/// Scores the gold and every pool ending of the given contexts in one batched pass.
fn score_held_out<'a>(
    model: &Trained,
    data: &'a Dataset,
    ids: &[usize],
) -> Result<Vec<HeldOut<'a>>> {
    let mut rows: Vec<(&EncodedEnding, usize)> = Vec::new();
    for &i in ids {
        let c = &data.contexts[i];
        rows.push((&c.gold, c.n_sent2));
        rows.extend(c.candidates.iter().map(|e| (e, c.n_sent2)));
    }
    let scores = model.score(&rows)?;
    let heads = named_heads(&scores);
    let mut out = Vec::with_capacity(ids.len());
    let mut offset = 0;
    for &i in ids {
        let c = &data.contexts[i];
        let n = c.candidates.len() + 1;
        out.push(HeldOut {
            context: c,
            heads: heads
                .iter()
                .map(|(name, s)| (*name, s[offset..offset + n].to_vec()))
                .collect(),
        });
        offset += n;
    }
    Ok(out)
}

/// The heads that exist, in the order mlp, bow, cnn, lstm, subword, sentence, ensemble (the
/// decisive head last).
fn named_heads(scores: &Scores) -> Vec<(&'static str, &[f32])> {
    let mut heads = vec![("mlp", scores.mlp.as_slice())];
    for (name, s) in [
        ("bow", &scores.bow),
        ("cnn", &scores.cnn),
        ("lstm", &scores.lstm),
        ("subword", &scores.subword),
        ("sentence", &scores.sentence),
        ("ensemble", &scores.ensemble),
    ] {
        if let Some(s) = s {
            heads.push((name, s.as_slice()));
        }
    }
    heads
}

/// Per head: the fraction of held-out contexts whose gold outscores all k assigned negatives.
fn accuracy(held_out: &[HeldOut], assignment: &Assignment) -> HeadAccuracy {
    let mut acc = HeadAccuracy::default();
    if held_out.is_empty() {
        return acc;
    }
    for head in 0..held_out[0].heads.len() {
        let correct = held_out
            .iter()
            .filter(|h| {
                let scores = &h.heads[head].1;
                let assigned: Vec<f32> = assignment[&h.context.example_id]
                    .iter()
                    .map(|id| scores[h.position(*id)])
                    .collect();
                solved(scores[0], &assigned)
            })
            .count();
        let value = Some(correct as f64 / held_out.len() as f64);
        match held_out[0].heads[head].0 {
            "mlp" => acc.mlp = value,
            "bow" => acc.bow = value,
            "cnn" => acc.cnn = value,
            "lstm" => acc.lstm = value,
            "subword" => acc.subword = value,
            "sentence" => acc.sentence = value,
            "minilm" => acc.minilm = value,
            "adversary" => acc.adversary = value,
            _ => acc.ensemble = value,
        }
    }
    acc
}

fn apply_swaps(assignment: &mut Assignment, swaps: &[Swap]) {
    for s in swaps {
        if let Some(slots) = assignment.get_mut(&s.example_id) {
            slots[s.slot] = s.new_ending_id;
        }
    }
}

/// The final cross-fitted pass: returns each context's fold, the ensemble (and sentence model)
/// score of every gold and pool ending, and the held-out accuracy of every head over all folds.
fn final_pass(
    data: &Dataset,
    assignment: &Assignment,
    config: &Config,
    adversary: Option<&Adversary>,
    observer: &mut dyn Observer,
) -> Result<(Vec<usize>, Vec<FinalScore>, HeadAccuracy)> {
    let family = config.final_family();
    let mut rng = config.seed.stream(FINAL_STREAM);
    let fold_of = folds(&split_groups(data, config), config.folds, &mut rng);
    let mut scores = Vec::new();
    let mut held_out_all = Vec::new();
    for fold in 0..config.folds {
        afkit_engine::interrupt::check()?;
        let model_seed = Seed::new(rng.next_u64());
        let (test_ids, train_ids): (Vec<usize>, Vec<usize>) =
            (0..data.contexts.len()).partition(|&i| fold_of[i] == fold);
        let choices: Vec<Choice> = train_ids
            .iter()
            .map(|&i| choice(&data.contexts[i], &assignment[&data.contexts[i].example_id]))
            .collect();
        let model = train(data, &choices, family, &config.train, model_seed)?;
        let mut held_out = score_held_out(&model, data, &test_ids)?;
        if let Some(adversary) = adversary {
            let fold_model = adversary.trained(data, &train_ids, assignment, model_seed)?;
            adversary.join(&fold_model, &mut held_out, data, &test_ids)?;
        }
        for h in &held_out {
            scores.push(h.final_score(0, h.context.gold.ending_id));
            for (i, e) in h.context.candidates.iter().enumerate() {
                scores.push(h.final_score(i + 1, e.ending_id));
            }
        }
        held_out_all.extend(held_out);
        observer.fold_done();
    }
    let accuracy = accuracy(&held_out_all, assignment);
    Ok((fold_of, scores, accuracy))
}

#[cfg(test)]
mod tests {
    use super::{differing_keys, standardised};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn standardised_scores_keep_their_order_with_mean_0_and_sd_1(
            scores in proptest::collection::vec(-50.0f32..50.0, 2..80),
        ) {
            let z = standardised(&scores);
            for i in 0..scores.len() {
                for j in 0..scores.len() {
                    if scores[i] < scores[j] {
                        prop_assert!(z[i] <= z[j]);
                    }
                }
            }
            let n = z.len() as f32;
            let mean = z.iter().sum::<f32>() / n;
            prop_assert!(mean.abs() < 1e-3);
            let spread = scores.iter().any(|&s| (s - scores[0]).abs() > 1e-3);
            if spread {
                let sd = (z.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / n).sqrt();
                prop_assert!((sd - 1.0).abs() < 1e-2);
            }
        }
    }

    #[test]
    fn differing_settings_are_named_by_their_path() {
        let stored = serde_json::json!({"k": 9, "encode": {"min_count": 2}, "seed": 1});
        let now =
            serde_json::json!({"k": 9, "encode": {"min_count": 2, "min_contexts": 20}, "seed": 2});
        assert_eq!(
            differing_keys(&stored, &now),
            vec!["encode.min_contexts".to_string(), "seed".to_string()]
        );
    }

    #[test]
    fn a_run_recorded_with_a_retired_setting_matches_todays_settings() {
        let stored = serde_json::json!({"k": 9, "train_fraction": 0.8});
        let now = serde_json::json!({"k": 9});
        assert!(differing_keys(&stored, &now).is_empty());
    }

    #[test]
    fn a_wide_head_does_not_outvote_a_narrow_one_once_standardised() {
        // The wide head prefers ending 1, the narrow head ending 2, each with the same rank
        // pattern: standardised, they tie instead of the wide head deciding.
        let wide = [0.0, 30.0, -30.0];
        let narrow = [0.0, -0.3, 0.3];
        let sum: Vec<f32> = standardised(&wide)
            .iter()
            .zip(standardised(&narrow))
            .map(|(a, b)| a + b)
            .collect();
        assert!((sum[1] - sum[2]).abs() < 1e-5);
    }
}
