//! AF's phases: MLP-only iterations, then style iterations (the ensemble before the fine-tuned
//! adversary joins), then ensemble iterations, each until its cap or until it converges. Every
//! iteration is committed whole before the next starts, and which phase comes next is read from
//! the stored iterations, so a resumed run carries on where it stopped.

use std::time::Instant;

use anyhow::Result;

use super::adversary::Adversary;
use super::config::Config;
use super::held_out::mean_of_read;
use super::iteration::{apply_swaps, run_iteration, IterationOutcome};
use super::observer::{Observer, Timings};
use crate::data::Dataset;
use afkit_store::af::{AfRun, Assignment, HeadAccuracy, IterationRecord, Phase, Swap};
use afkit_store::Store;

/// Runs iterations until every phase is over, committing each with its swaps; returns how many
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
    let total = config.mlp_iterations + config.style_iterations + config.ensemble_iterations;
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
            mut record,
            mut swaps,
            train_seconds,
            adversary_seconds,
        } = run_iteration(
            data,
            assignment,
            (family, iteration, turn),
            config,
            adversary,
        )?;
        withhold_quiet_style_swaps(&mut record, &mut swaps, config);
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

/// The phase of the next iteration, or `None` when every phase is over: MLP-only, then style,
/// then ensemble iterations, each until its cap or until it converges. A pure function of the
/// stored history, so a resumed run continues in the right phase.
fn next_family(history: &[IterationRecord], config: &Config) -> Option<Phase> {
    let rule = &config.convergence;
    let phase_quiet = |phase: Phase| -> Vec<bool> {
        history
            .iter()
            .filter(|r| r.phase == phase)
            .map(|r| quiet(r, config))
            .collect()
    };
    let (mlp, style, ensemble) = (
        phase_quiet(Phase::Mlp),
        phase_quiet(Phase::Style),
        phase_quiet(Phase::Ensemble),
    );
    let later_begun = !style.is_empty() || !ensemble.is_empty();
    if !later_begun && mlp.len() < config.mlp_iterations && !rule.converged(&mlp) {
        return Some(Phase::Mlp);
    }
    if ensemble.is_empty() && style.len() < config.style_iterations && !rule.settled(&style) {
        return Some(Phase::Style);
    }
    if ensemble.len() < config.ensemble_iterations && !rule.converged(&ensemble) {
        return Some(Phase::Ensemble);
    }
    None
}

/// Drops the swaps of a style iteration whose stylistic classifiers already read at chance: they
/// would follow the noise of models that find no style, and on a small project every such
/// iteration pushed the audit's style rows further under chance. The iteration is still stored,
/// as a measurement.
fn withhold_quiet_style_swaps(
    record: &mut IterationRecord,
    swaps: &mut Vec<Swap>,
    config: &Config,
) {
    if record.phase == Phase::Style && quiet(record, config) {
        swaps.clear();
        record.swaps = 0;
    }
}

/// Whether an iteration was quiet ([`crate::algorithm::Convergence::quiet`]), read on the models
/// its phase goes by: the MLP; the stylistic classifiers; the deciding score, or else, in a run
/// with style iterations, the stylistic classifiers and the fine-tuned cross-encoder together.
/// The deciding score carries the MLP's language-model features, which the pools may never
/// answer, so a phase read on it alone runs to its cap though nothing else is left to find.
fn quiet(record: &IterationRecord, config: &Config) -> bool {
    let accuracy = &record.accuracy;
    let at_chance = |read: Option<f64>| {
        let rule = &config.convergence;
        rule.quiet(config.k, record.swaps, record.n_test, read.unwrap_or(1.0))
    };
    match record.phase {
        Phase::Mlp => at_chance(accuracy.mlp),
        Phase::Style => at_chance(style_accuracy(accuracy)),
        Phase::Ensemble => {
            at_chance(accuracy.adversary.or(accuracy.ensemble))
                || (config.style_iterations > 0
                    && at_chance(style_accuracy(accuracy))
                    && accuracy.minilm.is_none_or(|m| at_chance(Some(m))))
        }
    }
}

/// The stylistic classifiers' mean held-out accuracy: the heads that read only the texts, not
/// the language models' features, which the pools may never answer. The audit's n-gram and
/// sentence-vector rows mirror them.
fn style_accuracy(accuracy: &HeadAccuracy) -> Option<f64> {
    let heads = [
        accuracy.bow,
        accuracy.cnn,
        accuracy.lstm,
        accuracy.subword,
        accuracy.sentence,
    ];
    mean_of_read(heads.into_iter().flatten())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An iteration of `phase` whose held-out 30 contexts had 20 swaps; the style heads read
    /// `style` (the sentence head not trained), the MLP and the deciding scores 0.5.
    fn record(history: &[IterationRecord], phase: Phase, style: f64) -> IterationRecord {
        let text = (phase != Phase::Mlp).then_some(style);
        IterationRecord {
            iteration: history.len(),
            phase,
            swaps: 20,
            seconds: 1.0,
            n_test: 30,
            accuracy: HeadAccuracy {
                mlp: Some(0.5),
                bow: text,
                cnn: text,
                lstm: text,
                subword: text,
                ensemble: text.map(|_| 0.5),
                adversary: (phase == Phase::Ensemble).then_some(0.5),
                ..HeadAccuracy::default()
            },
        }
    }

    fn config() -> Config {
        Config {
            mlp_iterations: 2,
            style_iterations: 4,
            ensemble_iterations: 3,
            ..Config::default()
        }
    }

    /// The iterations of a whole run under `config`, each made by `make` from the history
    /// before it and the phase `next_family` chose.
    fn replay(
        config: &Config,
        make: impl Fn(&[IterationRecord], Phase) -> IterationRecord,
    ) -> Vec<IterationRecord> {
        let mut history: Vec<IterationRecord> = Vec::new();
        while let Some(phase) = next_family(&history, config) {
            let next = make(&history, phase);
            history.push(next);
        }
        history
    }

    /// The phases `next_family` chooses when every style iteration reads `style`, until the run
    /// is over.
    fn phases_with_style_at(style: f64) -> Vec<Phase> {
        let history = replay(&config(), |history, phase| record(history, phase, style));
        history.iter().map(|r| r.phase).collect()
    }

    #[test]
    fn style_iterations_run_between_the_mlp_and_the_ensemble_until_their_cap() {
        use Phase::*;
        // Chance 0.1 and 30 held out: style is at chance up to 0.1 + 2·sqrt(0.09/30) ≈ 0.21.
        assert_eq!(
            phases_with_style_at(0.3),
            [Mlp, Mlp, Style, Style, Style, Style, Ensemble, Ensemble, Ensemble]
        );
    }

    #[test]
    fn the_style_phase_stops_after_two_iterations_at_chance() {
        use Phase::*;
        assert_eq!(
            phases_with_style_at(0.2),
            [Mlp, Mlp, Style, Style, Ensemble, Ensemble, Ensemble]
        );
    }

    #[test]
    fn a_run_without_style_iterations_goes_from_the_mlp_to_the_ensemble() {
        let config = Config {
            style_iterations: 0,
            ..config()
        };
        let history = replay(&config, |history, phase| record(history, phase, 0.3));
        assert!(history.iter().all(|r| r.phase != Phase::Style));
        assert_eq!(history.len(), 5);
    }

    #[test]
    fn the_ensemble_phase_ends_at_its_floor_once_style_and_the_cross_encoder_read_at_chance() {
        // The deciding score stays at 0.5; the floor is five iterations.
        let config = Config {
            ensemble_iterations: 8,
            ..config()
        };
        let ensemble_with = |style: f64, cross_encoder: f64| {
            let history = replay(&config, |history, phase| {
                let mut record = record(history, phase, style);
                record.accuracy.minilm = (phase == Phase::Ensemble).then_some(cross_encoder);
                record
            });
            history
                .iter()
                .filter(|r| r.phase == Phase::Ensemble)
                .count()
        };
        assert_eq!(ensemble_with(0.15, 0.15), 5);
        assert_eq!(
            ensemble_with(0.15, 0.4),
            8,
            "the cross-encoder still finds the ending"
        );
        assert_eq!(ensemble_with(0.3, 0.15), 8, "style is left");
    }

    #[test]
    fn a_style_iteration_that_finds_style_at_chance_swaps_nothing() {
        let swap = Swap {
            example_id: 1,
            slot: 0,
            old_ending_id: 2,
            new_ending_id: 3,
        };
        let committed = |phase: Phase, style: f64| {
            let mut record = record(&[], phase, style);
            let mut swaps = vec![swap; record.swaps];
            withhold_quiet_style_swaps(&mut record, &mut swaps, &config());
            (record.swaps, swaps.len())
        };
        assert_eq!(committed(Phase::Style, 0.15), (0, 0));
        assert_eq!(committed(Phase::Style, 0.3), (20, 20));
        assert_eq!(
            committed(Phase::Ensemble, 0.15),
            (20, 20),
            "the ensemble's own rule"
        );
    }

    #[test]
    fn the_style_reading_is_the_mean_of_the_heads_that_were_trained() {
        let accuracy = HeadAccuracy {
            mlp: Some(0.9),
            bow: Some(0.2),
            cnn: Some(0.4),
            ensemble: Some(0.9),
            ..HeadAccuracy::default()
        };
        assert!((style_accuracy(&accuracy).unwrap() - 0.3).abs() < 1e-12);
        assert_eq!(style_accuracy(&HeadAccuracy::default()), None);
    }
}
