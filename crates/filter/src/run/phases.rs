//! AF's two phases: MLP-only iterations, then ensemble iterations, each until its cap or until
//! it converges. Every iteration is committed whole before the next starts, and which phase
//! comes next is read from the stored iterations, so a resumed run carries on where it stopped.

use std::time::Instant;

use anyhow::Result;

use super::adversary::Adversary;
use super::config::Config;
use super::iteration::{apply_swaps, run_iteration, IterationOutcome};
use super::observer::{Observer, Timings};
use crate::data::Dataset;
use afkit_store::af::{AfRun, Assignment, IterationRecord, Phase};
use afkit_store::Store;

/// Runs iterations until both phases are over, committing each with its swaps; returns how many
/// the run has in all (a resumed run continues after the stored ones).
pub(crate) fn run_iterations(
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
        let turn = history.iter().filter(|r| r.phase == family).count();
        if turn == 0 {
            observer.phase_started(family);
        }
        let started = Instant::now();
        let IterationOutcome {
            record,
            swaps,
            train_seconds,
            adversary_seconds,
        } = run_iteration(
            data,
            assignment,
            (family, iteration, turn),
            config,
            adversary,
        )?;
        timings.add_iteration(family, started.elapsed().as_secs_f64(), adversary_seconds);
        store.commit_af_iteration(run.id, &record, &swaps)?;
        apply_swaps(assignment, &swaps);
        observer.iteration_done(&record, train_seconds);
        history.push(record);
        next = next_family(&history, config);
        if next != Some(family) {
            let iterations = history.iter().filter(|r| r.phase == family).count();
            observer.phase_ended(family, iterations, config.iteration_cap(family));
        }
    }
    afkit_engine::interrupt::check()?;
    Ok(history.len())
}

/// The family of the next iteration, or `None` when both phases are over. A pure function of
/// the stored history, so a resumed run continues in the right phase.
fn next_family(history: &[IterationRecord], config: &Config) -> Option<Phase> {
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
