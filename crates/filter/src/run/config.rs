//! A run's settings: [`Config`] with `afkit filter`'s defaults, what is recorded with the run
//! ([`RunParams`]), and how recorded settings are compared when a run is resumed.

use std::path::PathBuf;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::data::Dataset;
use crate::settings::{
    Convergence, DiscriminatorConfig, EncodeConfig, Replacement, Scorer, TrainConfig,
};
use afkit_engine::seed::Seed;
use afkit_store::af::Phase;

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
    /// How the iterations choose the contexts they hold out (recorded like `replacement`).
    #[serde(skip_serializing_if = "is_default")]
    pub turns: HeldOutTurns,
    pub mlp_iterations: usize,
    /// Cap on the style phase: ensemble iterations without the fine-tuned adversary, before it
    /// joins (recorded only when there are some, so earlier runs keep their settings).
    #[serde(skip_serializing_if = "is_default")]
    pub style_iterations: usize,
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
            turns: HeldOutTurns::default(),
            mlp_iterations: 20,
            style_iterations: 0,
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
    pub(crate) fn validate(&self) -> Result<()> {
        if self.k == 0 {
            bail!("--k must be at least 1");
        }
        if self.discriminator.is_some() && self.ensemble_iterations == 0 {
            bail!("--discriminator joins the ensemble: it needs --ensemble-iterations above 0");
        }
        if self.style_iterations > 0 && self.discriminator.is_none() {
            bail!(
                "--style-iterations runs the ensemble before the fine-tuned adversary joins; \
                 without an adversary the ensemble phase is the style phase: raise \
                 --ensemble-iterations instead"
            );
        }
        if self.folds < 2 {
            bail!("--folds must be at least 2 (train on all folds but one, score that one)");
        }
        Ok(())
    }

    /// The family of the final cross-fitted pass: the ensemble, unless the run has no ensemble
    /// phase, when the MLP that did the filtering also scores.
    pub(crate) fn final_family(&self) -> Phase {
        if self.ensemble_iterations > 0 {
            Phase::Ensemble
        } else {
            Phase::Mlp
        }
    }

    /// The most iterations the phase `family` may run.
    pub(crate) fn iteration_cap(&self, family: Phase) -> usize {
        match family {
            Phase::Mlp => self.mlp_iterations,
            Phase::Style => self.style_iterations,
            Phase::Ensemble => self.ensemble_iterations,
        }
    }
}

/// What AF's held-out splits and final folds keep together.
///
/// AF swaps a held-out context's negatives for endings that a model trained on the other
/// contexts finds like real ones. Where those include contexts of the same video (ActivityNet's
/// `sent1` is often the previous caption's real ending), the model has read that video's real
/// endings when it scores the held-out one, as a model tested on the export's splits or in the
/// audit's folds never has. Holding out whole groups removes that. It is not the default: it
/// has not been measured to make the exports harder (BENCHMARKS.md, "Replacing towards the
/// gold").
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

/// How AF's iterations choose the fifth of the contexts they hold out, and so which contexts
/// get their negatives replaced.
///
/// An iteration only replaces the negatives of the contexts it holds out. Drawn at random each
/// time, a fifth leaves a third of the contexts (0.8⁵) unfiltered by a phase's first five
/// iterations while others are held out two or three times; taken in turns, every context is
/// held out once in every five. Turns are not the default: on 150-context projects they made
/// the runs longer and pushed the character n-gram rows further under chance (BENCHMARKS.md,
/// "Held-out fifths in turns").
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HeldOutTurns {
    /// Each iteration draws its own fifth at random (SWAG's rule; the default).
    #[default]
    Random,
    /// Each phase deals the contexts into five folds (by group with `--hold-out group`) and
    /// holds out one fold per iteration, dealing afresh every five iterations.
    Rotating,
}

/// Each context's group for the held-out splits and the final folds (`None`: a group of its
/// own): by context when the run says so or the project has fewer groups than folds.
pub(crate) fn split_groups<'a>(data: &'a Dataset, config: &Config) -> Vec<Option<&'a str>> {
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
    /// Pool endings left out because reviews vetoed them (absent when none: runs before
    /// reviews existed match).
    #[serde(skip_serializing_if = "is_zero")]
    pub n_set_aside_by_review: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl RunParams {
    pub(crate) fn new(config: &Config, data: &Dataset) -> RunParams {
        RunParams {
            config: config.clone(),
            n_contexts: data.contexts.len(),
            n_excluded: data.excluded,
            n_set_aside_by_review: data.set_aside_by_review,
        }
    }
}

/// Settings that earlier versions recorded but that never changed a run: a run that records
/// them still matches today's settings. `train_fraction` was always 0.8 and the split was always
/// the fixed 80/20 one of [`crate::algorithm::split_80_20`].
const RETIRED_SETTINGS: &[&str] = &["train_fraction"];

/// The settings that differ between two recorded parameter sets, nested ones by their path
/// (`encode.min_contexts`), so that the message names what to pass to continue a run.
pub(crate) fn differing_keys(a: &serde_json::Value, b: &serde_json::Value) -> Vec<String> {
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

#[cfg(test)]
mod tests {
    use super::differing_keys;

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
}
