//! Cross-validated style baselines (`afkit audit DIR --cv K`).
//!
//! A val split of a few dozen to a few hundred questions measures a baseline's accuracy with a
//! standard error of several points, too coarse to tell whether a change to generation helped.
//! Here every labelled question of the dataset is pooled, the pool is cut into K folds by group
//! (`folds`), and every baseline is trained on K − 1 folds and tested on the held-out one, K
//! times: each question is tested once, by a model that never saw its video. The report gives the
//! mean of the K fold accuracies and its standard error (sample standard deviation / √K).
//!
//! Every baseline is a 4-way choice: a score per option, the highest wins, ties split evenly
//! (`ngram::tie_aware_accuracy`). The trained ones are `ngram`'s logistic regression (linear score
//! per option, softmax over the four, L2-regularised L-BFGS, λ chosen on a seeded split of the
//! training folds alone) on different features: word 1–2-grams, character 2–5-grams (`grams`),
//! MiniLM sentence embeddings, or the relations of each ending to its context (`relational`).
//! `finetune_minilm` ([`fine_tune`]) is of another kind: the MiniLM encoder itself, fine-tuned per
//! fold as a cross-encoder that reads each ending with its context (`embed::cross_encoder`), run
//! after the others because it takes every core for minutes.

use std::path::Path;
use std::sync::Mutex;

use anyhow::{bail, Result};
use rand::Rng;
use rayon::prelude::*;
use serde::{Serialize, Serializer};

use super::dataset::Question;
use super::grams::{self, Grams, View};
use super::knn::Encode;
use super::ngram::{self, Features};
use super::observer::Observer;
use afkit_engine::device::Compute;
use afkit_engine::embed::cross_encoder::{self, CrossEncoder};
use afkit_engine::seed::{Key, Seed};

/// One baseline of the cross-validated audit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// Picks the ending with the fewest word tokens.
    Shortest,
    /// Picks the ending with the most word tokens.
    Longest,
    /// Word 1–2-gram logistic regression.
    Words(View),
    /// Character 2–5-gram (subword) logistic regression.
    Chars(View),
    /// Logistic regression on the MiniLM embedding of sent2 + ending.
    MiniLm,
    /// Logistic regression on how each ending relates to its context and to the other endings
    /// (`relational`): word overlap, novelty, agreement among the options.
    Relational,
    /// The MiniLM encoder fine-tuned as a multiple-choice cross-encoder ([`fine_tune`]; not in
    /// [`Baseline::ALL`], which [`cross_validate`] measures).
    FineTunedMiniLm,
}

impl Baseline {
    /// Every baseline, in report order.
    pub(crate) const ALL: [Baseline; 10] = [
        Baseline::Shortest,
        Baseline::Longest,
        Baseline::Words(View::Ending),
        Baseline::Words(View::Sent2),
        Baseline::Words(View::Context),
        Baseline::Chars(View::Ending),
        Baseline::Chars(View::Sent2),
        Baseline::Chars(View::Context),
        Baseline::MiniLm,
        Baseline::Relational,
    ];

    /// The key in the report.
    pub fn name(self) -> &'static str {
        let view = |v: View| match v {
            View::Ending => 0,
            View::Sent2 => 1,
            View::Context => 2,
        };
        match self {
            Baseline::Shortest => "shortest",
            Baseline::Longest => "longest",
            Baseline::Words(v) => ["ngram_end", "ngram_s2", "ngram_ctx"][view(v)],
            Baseline::Chars(v) => ["char_end", "char_s2", "char_ctx"][view(v)],
            Baseline::MiniLm => "minilm_s2",
            Baseline::Relational => "relational",
            Baseline::FineTunedMiniLm => "finetune_minilm",
        }
    }

    /// What the baseline sees, for the report.
    pub(crate) fn description(self) -> &'static str {
        match self {
            Baseline::Shortest => "picks the ending with the fewest word tokens",
            Baseline::Longest => "picks the ending with the most word tokens",
            Baseline::Words(View::Ending) => "word 1–2-gram LR on the ending",
            Baseline::Words(View::Sent2) => "word 1–2-gram LR on sent2 + ending",
            Baseline::Words(View::Context) => "word 1–2-gram LR on sent1 + sent2 + ending",
            Baseline::Chars(View::Ending) => "character 2–5-gram LR on the ending",
            Baseline::Chars(View::Sent2) => "character 2–5-gram LR on sent2 + ending",
            Baseline::Chars(View::Context) => "character 2–5-gram LR on sent1 + sent2 + ending",
            Baseline::MiniLm => "LR on the MiniLM embedding of sent2 + ending",
            Baseline::Relational => {
                "LR on word overlap and novelty against sent1, sent2 and the other endings"
            }
            Baseline::FineTunedMiniLm => {
                "MiniLM fine-tuned as a cross-encoder on sent1 + sent2 [SEP] ending"
            }
        }
    }
}

/// One baseline's cross-validated accuracy, or why it was not measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(untagged)]
pub enum CvResult {
    Measured {
        /// Mean of the fold accuracies.
        mean: f64,
        /// Sample standard deviation of the fold accuracies / √K.
        se: f64,
        /// Accuracy on each held-out fold.
        folds: Vec<f64>,
        /// The λ chosen in each fold (trained baselines only).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        lambda: Vec<f64>,
        /// The questions each fold's model was trained on (the fine-tuned baseline only: how
        /// much it had to learn from is part of what its accuracy means).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        train_questions: Vec<usize>,
        /// The same baseline on relabelled copies of the questions ([`Chance`]; not measured
        /// for the fine-tuned baseline, nor with `--chance-copies` below 2).
        #[serde(skip_serializing_if = "Option::is_none")]
        chance: Option<Chance>,
    },
    Skipped {
        skipped: String,
    },
}

/// How far a baseline strays from chance where nothing tells the real ending: its accuracy on
/// copies of the questions whose answers were drawn at random among their four options.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Chance {
    /// Each copy's accuracy (the mean of its folds).
    pub copies: Vec<f64>,
    /// Their sample standard deviation: how widely a benchmark of this size without a tell
    /// scatters around 0.250 for this baseline.
    pub sd: f64,
}

impl Chance {
    fn of(copies: Vec<f64>) -> Chance {
        let (_, var) = mean_and_sample_variance(&copies);
        Chance {
            sd: var.sqrt(),
            copies,
        }
    }
}

impl CvResult {
    /// The result with the relabelled copies' spread, where the baseline was measured and at
    /// least two copies were made.
    fn with_chance(mut self, copies: Vec<f64>) -> CvResult {
        if let CvResult::Measured { chance, .. } = &mut self {
            *chance = (copies.len() >= 2).then(|| Chance::of(copies));
        }
        self
    }

    /// "trained on N questions per fold" (or "N–M"), where the baseline reports them.
    pub fn trained_on(&self) -> Option<String> {
        let CvResult::Measured {
            train_questions, ..
        } = self
        else {
            return None;
        };
        let (min, max) = (train_questions.iter().min()?, train_questions.iter().max()?);
        Some(if min == max {
            format!("trained on {min} questions per fold")
        } else {
            format!("trained on {min}–{max} questions per fold")
        })
    }
}

/// The cross-validated audit (`--json`'s `cv` object).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CvReport {
    /// K.
    pub folds: usize,
    /// Labelled questions pooled from the split files.
    pub questions: usize,
    /// Distinct groups (video ids) among them.
    pub groups: usize,
    pub seed: Seed,
    /// Questions in each fold.
    pub fold_sizes: Vec<usize>,
    /// Baseline → result, in report order (a map from `Baseline::name` in JSON).
    #[serde(serialize_with = "ordered_map")]
    pub baselines: Vec<(Baseline, CvResult)>,
    /// Seconds per baseline: its features or scores, then its fits summed over the folds (they
    /// run in parallel, so the sum can exceed the wall time). Reported in the audit's timings.
    #[serde(skip)]
    pub timings: Vec<super::timing::Timing>,
}

fn ordered_map<S: Serializer>(rows: &[(Baseline, CvResult)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(rows.iter().map(|(b, v)| (b.name(), v)))
}

/// Where the MiniLM baseline gets its embeddings.
pub(crate) enum Embedder<'a> {
    Encoder(&'a Encode<'a>),
    /// Not available; the reason goes into the report.
    Unavailable(String),
}

/// How a baseline scores the options of every question before the folds are cut.
enum Prepared {
    /// Fixed scores, no training.
    Scores(Vec<[f64; 4]>),
    /// Features for a logistic regression trained per fold.
    Features(Vec<[Features; 4]>),
    Skipped(String),
}

/// Cross-validates `baselines` over `questions` (all labelled) in `k` folds assigned by group
/// with `seed`, and again on `copies` relabelled copies ([`chance_copies`]); the same
/// input and seed give the same report. Fewer than `k` groups is an error (a fold would be
/// empty).
pub(crate) fn cross_validate(
    questions: &[Question],
    (k, seed): (usize, Seed),
    baselines: &[Baseline],
    embedder: &Embedder,
    copies: usize,
    observer: &mut dyn Observer,
) -> Result<CvReport> {
    let groups: Vec<Option<&str>> = questions.iter().map(|q| q.group.as_deref()).collect();
    let n_groups = afkit_engine::folds::count_groups(&groups);
    check_enough_groups(k, n_groups, questions.len())?;
    let fold_of = afkit_engine::folds::assign(&groups, k, seed);
    let gold: Vec<usize> = questions
        .iter()
        .map(|q| q.label.expect("labels checked on read"))
        .collect();
    let mut timings = Vec::new();
    let prepared = baselines
        .iter()
        .map(|&b| {
            super::timing::timed(&mut timings, b.name(), || {
                prepare(b, questions, embedder, observer)
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let (trained, fit_seconds) = fit_folds(&prepared, &fold_of, &gold, (k, seed), observer);
    for (b, seconds) in baselines.iter().zip(fit_seconds) {
        super::timing::add(&mut timings, b.name(), seconds);
    }
    let mut relabelled =
        || chance_copies(&prepared, &trained, &fold_of, (k, seed), copies, observer);
    // Without copies there is nothing to time, and no line for it in the report.
    let at_chance = if copies == 0 {
        relabelled()
    } else {
        super::timing::timed(&mut timings, "chance copies", relabelled)
    };
    let results = prepared
        .iter()
        .zip(trained)
        .zip(at_chance)
        .map(|((p, fits), copies)| result(p, fits, (&gold, &fold_of, k)).with_chance(copies));
    Ok(CvReport {
        folds: k,
        questions: questions.len(),
        groups: n_groups,
        seed,
        fold_sizes: (0..k)
            .map(|f| fold_of.iter().filter(|&&x| x == f).count())
            .collect(),
        baselines: baselines.iter().copied().zip(results).collect(),
        timings,
    })
}

/// One baseline's result over the `k` folds: from its fold fits (`fits`, for a trained
/// baseline) or from its fixed scores against `gold`.
fn result(
    p: &Prepared,
    fits: Vec<(f64, f64)>,
    (gold, fold_of, k): (&[usize], &[usize], usize),
) -> CvResult {
    match p {
        Prepared::Skipped(why) => CvResult::Skipped {
            skipped: why.clone(),
        },
        Prepared::Scores(scores) => {
            let accs = (0..k)
                .map(|f| fold_accuracy(scores, gold, fold_of, f))
                .collect();
            summarise(accs, Vec::new())
        }
        Prepared::Features(_) => {
            let (accs, lambdas) = fits.into_iter().unzip();
            summarise(accs, lambdas)
        }
    }
}

/// An error saying how to fix it when `n_groups` groups among `n_questions` questions are too
/// few for `k` folds (a fold would be empty).
fn check_enough_groups(k: usize, n_groups: usize, n_questions: usize) -> Result<()> {
    if n_groups < k {
        let fix = if n_groups >= 2 {
            format!("use --cv {n_groups} (the most folds these groups allow), or add questions from more groups")
        } else {
            "cross-validation needs questions from at least two groups: add questions from more groups".into()
        };
        bail!(
            "{k} folds need at least {k} groups (video-id values) of labelled questions; found {n_groups} in {n_questions} questions: {fix}"
        );
    }
    Ok(())
}

fn prepare(
    b: Baseline,
    questions: &[Question],
    embedder: &Embedder,
    observer: &mut dyn Observer,
) -> Result<Prepared> {
    let lengths = |q: &Question| -> [f64; 4] {
        std::array::from_fn(|o| ngram::words(&q.endings[o]).len() as f64)
    };
    Ok(match b {
        Baseline::Shortest => {
            Prepared::Scores(questions.iter().map(|q| lengths(q).map(|l| -l)).collect())
        }
        Baseline::Longest => Prepared::Scores(questions.iter().map(lengths).collect()),
        Baseline::Words(view) => {
            Prepared::Features(grams::featurise(questions, view, Grams::Words))
        }
        Baseline::Chars(view) => {
            Prepared::Features(grams::featurise(questions, view, Grams::Chars))
        }
        Baseline::FineTunedMiniLm => {
            Prepared::Skipped("measured by cv::fine_tune, not by cross_validate".into())
        }
        Baseline::MiniLm => match embedder {
            Embedder::Unavailable(why) => Prepared::Skipped(why.clone()),
            Embedder::Encoder(encode) => {
                Prepared::Features(grams::dense(&embed_options(questions, encode, observer)?))
            }
        },
        Baseline::Relational => Prepared::Features(super::relational::featurise(questions)),
    })
}

/// The MiniLM embedding of sent2 + " " + ending for every option (each distinct text once).
fn embed_options(
    questions: &[Question],
    encode: &Encode,
    observer: &mut dyn Observer,
) -> Result<Vec<[Vec<f32>; 4]>> {
    let texts: Vec<String> = questions
        .iter()
        .flat_map(|q| (0..4).map(move |o| View::Sent2.text(q, o)))
        .collect();
    let mut unique: Vec<&str> = Vec::new();
    let mut slot: std::collections::HashMap<&str, usize> = Default::default();
    let position: Vec<usize> = texts
        .iter()
        .map(|t| {
            *slot.entry(t.as_str()).or_insert_with(|| {
                unique.push(t.as_str());
                unique.len() - 1
            })
        })
        .collect();
    observer.counting(unique.len(), "texts embedded");
    let vectors = encode(&unique, &mut |n| observer.counted(n))?;
    Ok(position
        .chunks_exact(4)
        .map(|p| std::array::from_fn(|o| vectors[p[o]].clone()))
        .collect())
}

/// Trains and tests every (feature baseline, fold) pair in parallel; per baseline, the fold
/// accuracies and chosen λs in fold order (empty for baselines without features).
fn fit_folds(
    prepared: &[Prepared],
    fold_of: &[usize],
    gold: &[usize],
    (k, seed): (usize, Seed),
    observer: &mut dyn Observer,
) -> (Vec<Vec<(f64, f64)>>, Vec<f64>) {
    let jobs: Vec<(usize, usize)> = prepared
        .iter()
        .enumerate()
        .filter(|(_, p)| matches!(p, Prepared::Features(_)))
        .flat_map(|(b, _)| (0..k).map(move |f| (b, f)))
        .collect();
    observer.counting(jobs.len(), "fits");
    let observer = Mutex::new(observer);
    let done: Vec<((f64, f64), f64)> = jobs
        .par_iter()
        .map(|&(b, f)| {
            let started = std::time::Instant::now();
            let Prepared::Features(features) = &prepared[b] else {
                unreachable!("jobs are made for feature baselines only")
            };
            let train: Vec<usize> = (0..gold.len()).filter(|&q| fold_of[q] != f).collect();
            let test: Vec<usize> = (0..gold.len()).filter(|&q| fold_of[q] == f).collect();
            let (train, test, dim) = grams::restrict(features, gold, &train, &test);
            let fit = ngram::train_and_evaluate(&train, &test, dim, seed.plus(f as u64));
            observer.lock().expect("no fit panicked").counted(1);
            (fit, started.elapsed().as_secs_f64())
        })
        .collect();
    let mut out: Vec<Vec<(f64, f64)>> = vec![Vec::new(); prepared.len()];
    let mut seconds = vec![0.0; prepared.len()];
    for (&(b, _), (fit, s)) in jobs.iter().zip(done) {
        out[b].push(fit);
        seconds[b] += s;
    }
    (out, seconds)
}

/// Each baseline's accuracy (the mean of its folds) on `copies` relabelled copies of the
/// questions: every question's answer drawn uniformly among its four options (seeded per copy),
/// the folds and features unchanged, every model fitted again with the λ the real answers chose
/// in its fold (`fits`). Nothing can be learned there, so the copies scatter as the baseline's
/// accuracy would on a benchmark of this size without a tell. Five folds' standard error is
/// itself a guess from five numbers and understates that scatter on small sets. Empty for
/// skipped baselines.
fn chance_copies(
    prepared: &[Prepared],
    fits: &[Vec<(f64, f64)>],
    fold_of: &[usize],
    (k, seed): (usize, Seed),
    copies: usize,
    observer: &mut dyn Observer,
) -> Vec<Vec<f64>> {
    let golds: Vec<Vec<usize>> = (0..copies)
        .map(|copy| {
            let mut rng = seed.key(Key::ChanceCopy(copy)).rng();
            (0..fold_of.len()).map(|_| rng.random_range(0..4)).collect()
        })
        .collect();
    let jobs: Vec<(usize, usize, usize)> = (0..copies)
        .flat_map(|copy| (0..prepared.len()).map(move |b| (copy, b)))
        .filter(|&(_, b)| !matches!(prepared[b], Prepared::Skipped(_)))
        .flat_map(|(copy, b)| (0..k).map(move |f| (copy, b, f)))
        .collect();
    if !jobs.is_empty() {
        observer.counting(jobs.len(), "fits on relabelled copies");
    }
    let observer = Mutex::new(observer);
    let accuracies: Vec<f64> = jobs
        .par_iter()
        .map(|&(copy, b, f)| {
            let gold = &golds[copy];
            let accuracy = match &prepared[b] {
                Prepared::Scores(scores) => fold_accuracy(scores, gold, fold_of, f),
                Prepared::Features(features) => {
                    let (train, test): (Vec<usize>, Vec<usize>) =
                        (0..gold.len()).partition(|&q| fold_of[q] != f);
                    let (train, test, dim) = grams::restrict(features, gold, &train, &test);
                    ngram::fit_and_evaluate(&train, &test, dim, fits[b][f].1)
                }
                Prepared::Skipped(_) => unreachable!("no jobs for skipped baselines"),
            };
            observer.lock().expect("no fit panicked").counted(1);
            accuracy
        })
        .collect();
    let mut out = vec![Vec::with_capacity(copies); prepared.len()];
    for (job, folds) in jobs.chunks_exact(k).zip(accuracies.chunks_exact(k)) {
        out[job[0].1].push(folds.iter().sum::<f64>() / k as f64);
    }
    out
}

fn fold_accuracy(scores: &[[f64; 4]], gold: &[usize], fold_of: &[usize], f: usize) -> f64 {
    let (s, g): (Vec<[f64; 4]>, Vec<usize>) = (0..gold.len())
        .filter(|&q| fold_of[q] == f)
        .map(|q| (scores[q], gold[q]))
        .unzip();
    ngram::tie_aware_accuracy(&s, &g)
}

/// Mean and standard error (sample standard deviation / √K) of the fold accuracies.
fn summarise(folds: Vec<f64>, lambda: Vec<f64>) -> CvResult {
    let (mean, var) = mean_and_sample_variance(&folds);
    CvResult::Measured {
        mean,
        se: (var / folds.len() as f64).sqrt(),
        folds,
        lambda,
        train_questions: Vec::new(),
        chance: None,
    }
}

/// The mean of `values` and their sample variance (divided by n − 1, by 1 for a single value).
fn mean_and_sample_variance(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var)
}

/// How the fine-tuned baseline is made in every fold.
#[derive(Debug, Clone)]
pub struct FineTune {
    pub shape: cross_encoder::Shape,
    /// Its `seed` is replaced by each fold's own.
    pub train: cross_encoder::FineTuning,
    pub compute: Compute,
}

impl Default for FineTune {
    fn default() -> Self {
        FineTune {
            shape: Default::default(),
            train: Default::default(),
            compute: Compute::cpu(),
        }
    }
}

/// The fine-tuned baseline, cross-validated over the folds [`cross_validate`] deals with the
/// same `k` and `seed`: per fold, a cross-encoder fresh from the sentence model in `model_dir`
/// (`config.json`, `tokenizer.json`, `model.safetensors`) is trained on
/// the other folds and picks the highest-scoring option of each held-out question. Each fold's
/// head and batch order come from `seed` derived with `finetune fold F`.
pub(crate) fn fine_tune(
    questions: &[Question],
    (k, seed): (usize, Seed),
    model_dir: &Path,
    settings: &FineTune,
    observer: &mut dyn Observer,
) -> Result<CvResult> {
    let groups: Vec<Option<&str>> = questions.iter().map(|q| q.group.as_deref()).collect();
    let fold_of = afkit_engine::folds::assign(&groups, k, seed);
    let as_choice = |q: &Question| cross_encoder::Question {
        context: afkit_store::dataset::startphrase(&q.sent1, &q.sent2),
        endings: q.endings.to_vec(),
    };
    let mut accuracies = Vec::with_capacity(k);
    let mut train_questions = Vec::with_capacity(k);
    for f in 0..k {
        let (test, train): (Vec<usize>, Vec<usize>) =
            (0..questions.len()).partition(|&q| fold_of[q] == f);
        let gold = |qs: &[usize]| -> Vec<usize> {
            qs.iter()
                .map(|&q| questions[q].label.expect("labels checked on read"))
                .collect()
        };
        let choices = |qs: &[usize]| -> Vec<cross_encoder::Question> {
            qs.iter().map(|&q| as_choice(&questions[q])).collect()
        };
        let fold_seed = seed.key(Key::FinetuneFold(f));
        let mut model =
            CrossEncoder::load(model_dir, settings.shape, fold_seed, &settings.compute)?;
        let config = cross_encoder::FineTuning {
            seed: fold_seed,
            ..settings.train.clone()
        };
        let steps = train.len().div_ceil(config.batch.max(1)) * config.epochs;
        observer.counting(steps, &format!("finetune_minilm fold {}/{k}: steps", f + 1));
        // One report per optimiser step.
        model.train(&choices(&train), &gold(&train), &config, &mut |p| {
            if let cross_encoder::TrainingProgress::Step { .. } = p {
                observer.counted(1);
            }
        })?;
        let scores: Vec<[f64; 4]> = model
            .score(&choices(&test))?
            .iter()
            .map(|s| std::array::from_fn(|o| f64::from(s[o])))
            .collect();
        accuracies.push(ngram::tie_aware_accuracy(&scores, &gold(&test)));
        train_questions.push(train.len());
    }
    let mut result = summarise(accuracies, Vec::new());
    if let CvResult::Measured {
        train_questions: trained_on,
        ..
    } = &mut result
    {
        *trained_on = train_questions;
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::planted_questions;
    use crate::Silent;

    /// The shared synthetic questions as the audit reads them.
    fn questions(n: usize, per_video: usize, tell: bool, seed: Seed) -> Vec<Question> {
        planted_questions(n, per_video, tell, seed)
            .into_iter()
            .enumerate()
            .map(|(i, q)| Question {
                id: i.to_string(),
                group: Some(q.group),
                sent1: q.sent1,
                sent2: q.sent2,
                endings: q.endings,
                label: Some(q.label),
                could_be_right: None,
            })
            .collect()
    }

    /// Cross-validation in `k` folds, its progress unwatched.
    fn cv(
        qs: &[Question],
        k: usize,
        seed: u64,
        baselines: &[Baseline],
        embedder: &Embedder,
    ) -> CvReport {
        cross_validate(
            qs,
            (k, Seed::new(seed)),
            baselines,
            embedder,
            0,
            &mut Silent,
        )
        .unwrap()
    }

    fn mean(report: &CvReport, name: &str) -> f64 {
        match report.baselines.iter().find(|(b, _)| b.name() == name) {
            Some((_, CvResult::Measured { mean, .. })) => *mean,
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn cv_finds_a_planted_tell_with_words_and_characters() {
        let qs = questions(120, 3, true, Seed::new(1));
        let baselines = [
            Baseline::Words(View::Ending),
            Baseline::Chars(View::Ending),
            Baseline::Chars(View::Context),
        ];
        let r = cv(&qs, 5, 7, &baselines, &Embedder::Unavailable("test".into()));
        for name in ["ngram_end", "char_end", "char_ctx"] {
            assert_eq!(mean(&r, name), 1.0, "{name}: {r:?}");
        }
    }

    /// Without a signal every held-out label is uniform and independent of everything a model saw,
    /// so each of the N pooled test answers is right with probability exactly 1/4 (a tie among m
    /// options earns 1/m: same mean, smaller variance) and the mean of equal folds is within
    /// sd = sqrt(3/16 / N) of 0.25. N = 1200 gives sd = 0.0125, so ±0.05 is 4 sd: a seed that fails
    /// one of these four baselines by chance turns up about once in 4,000 seeds.
    #[test]
    fn cv_stays_at_chance_without_a_signal() {
        let qs = questions(1200, 4, false, Seed::new(2));
        let baselines = [
            Baseline::Shortest,
            Baseline::Longest,
            Baseline::Words(View::Ending),
            Baseline::Chars(View::Ending),
        ];
        let r = cv(&qs, 5, 3, &baselines, &Embedder::Unavailable("test".into()));
        assert_eq!(r.questions, 1200);
        assert_eq!(r.groups, 300);
        assert_eq!(r.fold_sizes, vec![240; 5], "300 groups of 4 deal evenly");
        for b in baselines {
            let acc = mean(&r, b.name());
            assert!((acc - 0.25).abs() < 0.05, "{}: {acc}", b.name());
        }
    }

    /// A tell is found on the real answers while the relabelled copies, whose answers are
    /// random, stay around chance: nothing in them can be learned. The same seed gives the
    /// same copies, and without copies no result claims a spread nor the report a time for them.
    #[test]
    fn relabelled_copies_scatter_around_chance_while_a_tell_stands_out() {
        let qs = questions(120, 3, true, Seed::new(1));
        let baselines = [Baseline::Words(View::Ending), Baseline::Chars(View::Ending)];
        let unavailable = Embedder::Unavailable("test".into());
        let run = |copies| {
            cross_validate(
                &qs,
                (5, Seed::new(7)),
                &baselines,
                &unavailable,
                copies,
                &mut Silent,
            )
            .unwrap()
        };
        let report = run(12);
        for (b, result) in &report.baselines {
            let CvResult::Measured {
                mean,
                chance: Some(chance),
                ..
            } = result
            else {
                panic!("{}: {result:?}", b.name())
            };
            assert_eq!(*mean, 1.0, "{}", b.name());
            assert_eq!(chance.copies.len(), 12);
            let centre = chance.copies.iter().sum::<f64>() / 12.0;
            assert!((centre - 0.25).abs() < 0.05, "{}: {chance:?}", b.name());
            assert!(
                chance.sd > 0.0 && chance.sd < 0.1,
                "{}: {chance:?}",
                b.name()
            );
        }
        assert_eq!(run(12).baselines, report.baselines);
        let timed_copies = |r: &CvReport| r.timings.iter().any(|t| t.name == "chance copies");
        assert!(timed_copies(&report));
        let without = run(0);
        for (_, result) in &without.baselines {
            assert!(matches!(result, CvResult::Measured { chance: None, .. }));
        }
        assert!(!timed_copies(&without), "no copies, no time line for them");
    }

    /// Twelve benchmarks of 100 questions with nothing to find (endings drawn from the same
    /// word lists, answers random), and four with a tell planted. With the copies' scatter as
    /// the floor of every standard error and the bar rising with the style rows, the style
    /// verdict calls at most one of the twelve off chance (a 5% test would call 0.6 of them on
    /// average; the folds' standard error at two standard errors a row called two of these), and
    /// every one with the tell above chance.
    #[test]
    fn the_style_verdict_finds_a_tell_and_does_not_find_what_is_not_there() {
        let unavailable = Embedder::Unavailable("test".into());
        let style_verdict = |tell: bool, seed: u64| {
            let qs = questions(100, 2, tell, Seed::new(seed));
            let report = cross_validate(
                &qs,
                (5, Seed::new(seed)),
                &Baseline::ALL,
                &unavailable,
                19,
                &mut Silent,
            )
            .unwrap();
            let rows = crate::findings::baseline_rows(&report);
            let (_, verdicts) = crate::verdict::judge(rows, None);
            verdicts[0].text.clone()
        };
        let off_chance = (0..12)
            .map(|seed| style_verdict(false, 100 + seed))
            .filter(|text| text.contains("points above chance") || text.starts_with("below"))
            .count();
        assert!(off_chance <= 1, "{off_chance} of 12 called off chance");
        for seed in 0..4 {
            let text = style_verdict(true, 100 + seed);
            assert!(text.contains("points above chance"), "{text}");
        }
    }

    #[test]
    fn the_minilm_baseline_learns_from_the_embeddings() {
        // A fake encoder: the first coordinate says whether the text has the tell, so a linear model
        // on it is perfect; the texts must be sent2 + ending.
        let encode =
            |texts: &[&str], progress: &mut dyn FnMut(usize)| -> anyhow::Result<Vec<Vec<f32>>> {
                progress(texts.len());
                assert!(texts.iter().all(|t| ["They ", "The man ", "A girl "]
                    .iter()
                    .any(|s| t.starts_with(s))));
                Ok(texts
                    .iter()
                    .map(|t| vec![if t.contains('!') { 1.0 } else { 0.0 }, 0.5])
                    .collect())
            };
        let qs = questions(60, 2, true, Seed::new(4));
        let r = cv(&qs, 3, 0, &[Baseline::MiniLm], &Embedder::Encoder(&encode));
        assert_eq!(mean(&r, "minilm_s2"), 1.0);
        let skipped = cv(
            &qs,
            3,
            0,
            &[Baseline::MiniLm],
            &Embedder::Unavailable("why".into()),
        );
        assert_eq!(
            skipped.baselines[0].1,
            CvResult::Skipped {
                skipped: "why".into()
            }
        );
    }
}
