//! `afkit filter`: a resumable AF run.
//!
//! 1. Contexts with a complete pool of at least k candidates take part; each starts with k
//!    distinct pool endings drawn at random (`since_iteration = -1`; [`resume`]).
//! 2. Phase 1 runs MLP-only iterations, phase 2 style iterations (the ensemble without the
//!    fine-tuned adversary; in runs with the adversary), phase 3 ensemble iterations; each
//!    phase ends at its cap or when it converges ([`crate::algorithm::Convergence`]: two quiet
//!    iterations in a row; [`phases`]). An iteration trains on 80% of the contexts, scores the
//!    held-out pools and replaces the negatives the model spotted easily ([`iteration`]); with
//!    `--turns rotating` the held-out fifths of a phase take turns, so five iterations hold out
//!    every context once.
//! 3. Every iteration is committed whole (record, swaps, new assignment) in one transaction, and
//!    its randomness comes from (seed, iteration) alone, so a run interrupted by Ctrl-C or
//!    `kill -9` resumes after its last stored iteration and ends exactly where an uninterrupted
//!    run with the same seed ends.
//! 4. The final cross-fitted pass splits contexts into folds, trains the ensemble (the MLP when
//!    the run has no ensemble phase) on all folds but one and scores the held-out fold's gold and
//!    every pool ending: `af_folds`, `af_scores` ([`final_pass`]).

mod adversary;
pub(crate) mod config;
mod final_pass;
mod held_out;
mod iteration;
pub(crate) mod observer;
mod phases;
mod resume;

use std::time::Instant;

use anyhow::{bail, Result};

use crate::data::{store_sentence_vectors, AloneInputs, Dataset};
use crate::scorer::store_scorer_scores;
use adversary::{check_model_loads, Adversary};
use afkit_engine::text::counted;
use afkit_store::af::{AfRun, HeadAccuracy, Phase};
use afkit_store::Store;
use config::{split_groups, Config, HoldOut, RunParams};
use final_pass::finish_run;
use observer::{Observer, Timings};
use phases::run_iterations;
use resume::resolve_run;

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
        /// The models that scored the final pass: the ensemble, or the MLP in a run without an
        /// ensemble phase.
        final_family: Phase,
        /// Every head's held-out accuracy in the final pass.
        final_accuracy: HeadAccuracy,
        /// Where this call's time went.
        timings: Box<Timings>,
    },
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
    if let Some(discriminator) = &config.discriminator {
        check_model_loads(discriminator, config)?;
    }
    let params = RunParams::new(config, &data);
    let Some(run) = resolve_run(store, &params, &data.fingerprint(), &data, observer)? else {
        return Ok(Summary::UpToDate);
    };
    note_run_started(observer, &run, &data, config, started);
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
        final_family: config.final_family(),
        final_accuracy,
        timings: Box::new(timings),
    })
}

/// Tells the observer what the run works on: its contexts and chance, how contexts are held
/// out, and the vocabularies of the ensemble's texts.
fn note_run_started(
    observer: &mut dyn Observer,
    run: &AfRun,
    data: &Dataset,
    config: &Config,
    started: Instant,
) {
    observer.note(&format!(
        "AF run {}: {}, k = {}, chance = {:.3} (pools read in {:.1} s)",
        run.id,
        counted(data.contexts.len(), "context", "contexts"),
        config.k,
        1.0 / (config.k as f64 + 1.0),
        started.elapsed().as_secs_f64()
    ));
    if config.hold_out == HoldOut::Group && split_groups(data, config).iter().all(Option::is_none) {
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
}

/// Computes and stores what the pools' endings lack: sentence vectors where the run reads texts,
/// and every scorer model's scores.
fn store_missing_features(
    store: &mut Store,
    config: &Config,
    with_text: bool,
    observer: &mut dyn Observer,
    timings: &mut Timings,
) -> Result<()> {
    let started = Instant::now();
    if with_text && config.encode.sentence_vectors {
        let cache = config.embedding_cache.as_deref();
        store_sentence_vectors(store, cache, &mut |done, total| {
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
    Ok(())
}

/// Tells the user when ending-alone inputs some options have were left out for all, and when a
/// run without a scorer reads nothing but the generator's conditional log-probabilities.
fn note_alone_inputs(data: &Dataset, no_scorer: bool, observer: &mut dyn Observer) {
    match data.alone_inputs {
        AloneInputs::Dropped => observer.note(
            "note: some pools have the generator's ending-alone scores and others not, so this \
             run leaves them out",
        ),
        AloneInputs::None if no_scorer => observer.note(
            "note: the pools have no ending-alone scores (`generate --alone-scores`); with \
             --no-scorer the MLP reads no language model's view of an ending but the generator's",
        ),
        AloneInputs::All | AloneInputs::None => {}
    }
    if data.scorer_alone_dropped {
        observer.note(
            "note: an earlier afkit's scorer read some endings alone as well and others not, so \
             this run leaves that reading out",
        );
    }
}

/// Reads the pools AF filters, once their endings have every feature the run reads, and checks
/// there are enough of them.
fn load_pools(
    store: &mut Store,
    config: &Config,
    observer: &mut dyn Observer,
    timings: &mut Timings,
) -> Result<Dataset> {
    // The text ids (words, BiLSTM ids) only for a run with an ensemble phase: MLP-only work
    // reads the LM features alone, which keeps a big project small.
    let with_text = config.final_family() == Phase::Ensemble;
    store_missing_features(store, config, with_text, observer, timings)?;
    let started = Instant::now();
    let keys: Vec<String> = config.scorers.iter().map(|s| s.sha256.clone()).collect();
    let data = Dataset::load(store, config.k, &config.encode, with_text, &keys)?;
    timings.reading = started.elapsed().as_secs_f64();
    if data.set_aside_by_review > 0 {
        observer.note(&format!(
            "{} pool endings that reviews vetoed are left out",
            data.set_aside_by_review
        ));
    }
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
    note_alone_inputs(&data, config.scorers.is_empty(), observer);
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
