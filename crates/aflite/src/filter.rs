//! AFLite's filtering loop (Le Bras et al., Algorithm 1).
//!
//! While |S| > n: train the linear model on m random subsets of t examples of S, predict the
//! rest of S with each, and give every example its predictability p̃(i) = correct / predicted.
//! Remove up to min(k, |S| − n) examples with p̃(i) ≥ τ — the highest (slicing, greedy with
//! k = 1) or k drawn ∝ p̃ without replacement (sampling, the Gumbel top-k trick) — and stop
//! once fewer than k examples passed τ.

use std::time::Instant;

use anyhow::{bail, Result};
use rand::seq::index::sample;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use super::features::Matrix;
use super::logreg::{FitOptions, LogReg};
use afkit_engine::seed::Seed;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Variant {
    /// Remove the single most predictable example per round (k = 1).
    Greedy,
    /// Remove the k most predictable examples per round (the papers' AFLite).
    Slicing,
    /// Remove k examples drawn with probability ∝ p̃ (Gumbel top-k), without replacement.
    Sampling,
}

/// Resolved parameters (counts, not fractions).
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Params {
    pub target_size: usize,
    pub partitions: usize,
    pub train_size: usize,
    pub slice: usize,
    pub tau: f64,
    pub variant: Variant,
    pub seed: Seed,
    pub fit: FitOptions,
}

impl Params {
    /// Checks the parameters against a dataset of `size` examples (the paper's t < n, k ≥ 1).
    pub(crate) fn validate(&self, size: usize) -> Result<()> {
        if self.partitions == 0 {
            bail!("--partitions must be at least 1");
        }
        if self.slice == 0 {
            bail!("--slice must be at least 1");
        }
        if self.train_size == 0 || self.train_size >= self.target_size {
            bail!(
                "--train-size ({}) must be at least 1 and below --target-size ({}): every \
                 partition must leave examples to predict",
                self.train_size,
                self.target_size
            );
        }
        if self.target_size > size {
            bail!(
                "--target-size ({}) exceeds the dataset ({} examples)",
                self.target_size,
                size
            );
        }
        if !(0.0..=1.0).contains(&self.tau) {
            bail!("--tau must lie in [0, 1], got {}", self.tau);
        }
        Ok(())
    }

    /// The slice actually used: greedy removes one example per round.
    pub(crate) fn effective_slice(&self) -> usize {
        match self.variant {
            Variant::Greedy => 1,
            _ => self.slice,
        }
    }
}

/// Number of bins of the score histograms (over [0, 1]).
pub(crate) const HISTOGRAM_BINS: usize = 10;

#[derive(Debug, Clone, serde::Serialize)]
pub struct Round {
    /// 1-based.
    pub round: usize,
    /// |S| at the start of the round.
    pub size: usize,
    /// Examples with p̃ ≥ τ.
    pub passed_tau: usize,
    pub removed: usize,
    /// Mean p̃ over S (the representation bias R(Φ, S) of the paper's Eq. 5, per example).
    pub mean_score: f64,
    /// Counts of p̃ over S in equal-width bins over [0, 1].
    pub histogram: [usize; HISTOGRAM_BINS],
    /// Examples of S that no partition predicted (possible when t is close to |S|).
    pub unscored: usize,
    /// Fits that hit the iteration cap before the gradient tolerance.
    pub fits_not_converged: usize,
    pub seconds: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    TargetSizeReached,
    FewerThanKPassedTau,
    AlreadyAtTargetSize,
}

pub(crate) struct Outcome {
    /// Per example: the round in which it was removed (1-based), or `None` if retained.
    pub removed_round: Vec<Option<usize>>,
    /// Per example: its last predictability score, `None` if never predicted.
    pub score: Vec<Option<f64>>,
    pub rounds: Vec<Round>,
    pub stop: StopReason,
}

/// Hooks for the caller: progress and the partitions file. Defaults do nothing.
pub trait Observer: Sync {
    /// Before each round's fits: the round (1-based), S (example indices) and the training
    /// indices of every partition.
    fn partitions(&mut self, _round: usize, _s: &[usize], _train: &[Vec<usize>]) -> Result<()> {
        Ok(())
    }
    /// After each partition's fit (called from worker threads).
    fn partition_done(&self) {}
    fn round_started(&mut self, _round: usize, _size: usize) {}
    fn round_done(&mut self, _round: &Round) {}
    /// Something worth telling the user (the warm-up starting, ...).
    fn note(&mut self, _message: &str) {}
    /// `done` of `total` distinct texts embedded with MiniLM (those the cache held come first).
    fn embedding(&mut self, _done: usize, _total: usize) {}
    /// Between rounds; an error stops the run (Ctrl-C).
    fn check(&self) -> Result<()> {
        Ok(())
    }
}

/// An observer that does nothing.
pub struct Silent;
impl Observer for Silent {}

/// A random rank per example, drawn once from the seed, that orders examples with equal p̃
/// (scores are fractions of m predictions, so ties are common) without favouring input order.
pub(crate) fn tiebreak_ranks(n: usize, seed: Seed) -> Vec<u32> {
    let mut rng = seed.rng();
    let perm = sample(&mut rng, n, n).into_vec();
    let mut rank = vec![0u32; n];
    for (r, i) in perm.into_iter().enumerate() {
        rank[i] = r as u32;
    }
    rank
}

/// The stream of the draws made round by round (stream 0 gives the tie-break ranks).
const ROUNDS_STREAM: u64 = 1;

/// Runs AFLite on `features` (one row per example) with class ids `labels`.
pub(crate) fn run(
    features: &Matrix,
    labels: &[u32],
    params: &Params,
    observer: &mut dyn Observer,
) -> Result<Outcome> {
    let total = labels.len();
    assert_eq!(features.rows, total, "one feature row per example");
    params.validate(total)?;
    let k = params.effective_slice();
    // One stream for the tie-break ranks, one for everything drawn round by round.
    let tiebreak = tiebreak_ranks(total, params.seed);
    let mut rng = params.seed.stream(ROUNDS_STREAM);

    let mut s: Vec<usize> = (0..total).collect();
    let mut removed_round = vec![None; total];
    let mut score = vec![None; total];
    let mut rounds = Vec::new();
    let mut stop = StopReason::AlreadyAtTargetSize;

    while s.len() > params.target_size {
        observer.check()?;
        let started = Instant::now();
        let round_no = rounds.len() + 1;
        observer.round_started(round_no, s.len());
        let decision = decide(
            (features, labels),
            params,
            (&s, &tiebreak),
            (round_no, &mut rng),
            observer,
        )?;
        for (&i, sc) in s.iter().zip(&decision.scores) {
            score[i] = *sc;
        }
        for &p in &decision.chosen {
            removed_round[s[p]] = Some(round_no);
        }
        let round = decision.round(round_no, s.len(), started);
        observer.round_done(&round);
        rounds.push(round);
        s.retain(|&i| removed_round[i].is_none());

        if decision.passed.len() < k {
            stop = StopReason::FewerThanKPassedTau;
            break;
        }
        stop = StopReason::TargetSizeReached;
    }
    Ok(Outcome {
        removed_round,
        score,
        rounds,
        stop,
    })
}

/// What a round found about the members of S, by their position in it.
struct Decision {
    /// Each member's predictability (`None` when no partition held it out).
    scores: Vec<Option<f64>>,
    /// The members whose predictability reaches τ.
    passed: Vec<usize>,
    /// The members removed.
    chosen: Vec<usize>,
    /// Fits of the round's models that stopped before converging.
    not_converged: usize,
}

impl Decision {
    /// The record of round `round_no` over an S of `size` members, begun at `started`.
    fn round(&self, round_no: usize, size: usize, started: Instant) -> Round {
        let (histogram, mean_score, scored) = score_histogram(&self.scores);
        Round {
            round: round_no,
            size,
            passed_tau: self.passed.len(),
            removed: self.chosen.len(),
            mean_score,
            histogram,
            unscored: size - scored,
            fits_not_converged: self.not_converged,
            seconds: started.elapsed().as_secs_f64(),
        }
    }
}

/// One round over S: models trained on partitions drawn from `rng` score its members (each
/// example's features and label), and up to the slice of those reaching τ are chosen for
/// removal, never taking S below the target size.
fn decide(
    (features, labels): (&Matrix, &[u32]),
    params: &Params,
    (s, tiebreak): (&[usize], &[u32]),
    (round_no, rng): (usize, &mut ChaCha8Rng),
    observer: &mut dyn Observer,
) -> Result<Decision> {
    let train_sets = draw_train_sets(rng, s, params);
    observer.partitions(round_no, s, &train_sets)?;

    let (correct, predicted, not_converged) =
        predict_partitions(features, labels, s, &train_sets, &params.fit, &*observer);

    let scores = predictability(&correct, &predicted);
    let passed = passing_tau(&scores, params.tau);
    let limit = params.effective_slice().min(s.len() - params.target_size);
    let chosen = choose(&passed, &scores, s, tiebreak, limit, params.variant, rng);
    Ok(Decision {
        scores,
        passed,
        chosen,
        not_converged,
    })
}

/// The positions in S whose predictability reaches τ.
fn passing_tau(scores: &[Option<f64>], tau: f64) -> Vec<usize> {
    (0..scores.len())
        .filter(|&p| scores[p].is_some_and(|v| v >= tau))
        .collect()
}

/// Per member of S: the fraction of the models that saw it held out and predicted its label
/// right (`None` when no partition held it out).
fn predictability(correct: &[u32], predicted: &[u32]) -> Vec<Option<f64>> {
    correct
        .iter()
        .zip(predicted)
        .map(|(&c, &p)| (p > 0).then(|| c as f64 / p as f64))
        .collect()
}

/// One training set per partition: `train_size` members of S drawn without replacement, in S's
/// order.
fn draw_train_sets(rng: &mut ChaCha8Rng, s: &[usize], params: &Params) -> Vec<Vec<usize>> {
    (0..params.partitions)
        .map(|_| {
            let mut positions = sample(rng, s.len(), params.train_size).into_vec();
            positions.sort_unstable();
            positions.into_iter().map(|p| s[p]).collect()
        })
        .collect()
}

/// The bin of a predictability score in [0, 1] among [`HISTOGRAM_BINS`] equal bins.
pub(crate) fn score_bin(score: f64) -> usize {
    ((score * HISTOGRAM_BINS as f64) as usize).min(HISTOGRAM_BINS - 1)
}

/// The round's score histogram, the mean score (0 when nothing was scored) and how many
/// examples were scored.
fn score_histogram(scores: &[Option<f64>]) -> ([usize; HISTOGRAM_BINS], f64, usize) {
    let mut histogram = [0usize; HISTOGRAM_BINS];
    let mut sum = 0.0;
    let mut scored = 0;
    for &v in scores.iter().flatten() {
        histogram[score_bin(v)] += 1;
        sum += v;
        scored += 1;
    }
    let mean = if scored > 0 { sum / scored as f64 } else { 0.0 };
    (histogram, mean, scored)
}

/// Positions of S predicted by every model in turn before moving on: 64 rows of 384 f32 stay in
/// a core's L2 cache while each model's weights pass over them.
const PREDICT_CHUNK: usize = 64;

/// Fits one model per partition in parallel; per position of S returns how often it was
/// predicted correctly and predicted at all, plus the number of fits that did not converge.
///
/// The predictions go through S once for all models, chunk by chunk: streaming S once per
/// model had been a sixth of the filter's time on 20k × 384.
fn predict_partitions(
    features: &Matrix,
    labels: &[u32],
    s: &[usize],
    train_sets: &[Vec<usize>],
    fit: &FitOptions,
    observer: &dyn Observer,
) -> (Vec<u32>, Vec<u32>, usize) {
    let models: Vec<LogReg> = train_sets
        .par_iter()
        .map(|train| {
            // Copied out: the fit passes over its rows dozens of times, and rows scattered
            // over the matrix make those passes far slower than one copy costs.
            let x = features.select(train);
            let y: Vec<u32> = train.iter().map(|&i| labels[i]).collect();
            let model = LogReg::fit(&x.data, features.cols, &y, fit);
            observer.partition_done();
            model
        })
        .collect();
    // trained_on[m][p]: whether model m was fitted on position p of S (train sets are drawn
    // from S in its order).
    let trained_on: Vec<Vec<bool>> = train_sets
        .iter()
        .map(|train| {
            let mut t = train.iter().peekable();
            s.iter()
                .map(|&i| t.next_if(|&&j| j == i).is_some())
                .collect()
        })
        .collect();
    let mut correct = vec![0u32; s.len()];
    let mut predicted = vec![0u32; s.len()];
    correct
        .par_chunks_mut(PREDICT_CHUNK)
        .zip(predicted.par_chunks_mut(PREDICT_CHUNK))
        .enumerate()
        .for_each(|(chunk, (correct, predicted))| {
            let first = chunk * PREDICT_CHUNK;
            for (model, trained_on) in models.iter().zip(&trained_on) {
                for (p, (c, n)) in (first..).zip(correct.iter_mut().zip(predicted.iter_mut())) {
                    if trained_on[p] {
                        continue;
                    }
                    let i = s[p];
                    *n += 1;
                    *c += u32::from(model.predict(features.row(i)) == labels[i]);
                }
            }
        });
    let not_converged = models.iter().filter(|m| !m.converged).count();
    (correct, predicted, not_converged)
}

/// Positions (into S) of the examples to remove this round.
fn choose(
    passed: &[usize],
    scores: &[Option<f64>],
    s: &[usize],
    tiebreak: &[u32],
    limit: usize,
    variant: Variant,
    rng: &mut ChaCha8Rng,
) -> Vec<usize> {
    let score = |p: usize| scores[p].expect("passed examples are scored");
    let mut ranked: Vec<(f64, u32, usize)> = match variant {
        Variant::Greedy | Variant::Slicing => passed
            .iter()
            .map(|&p| (score(p), tiebreak[s[p]], p))
            .collect(),
        Variant::Sampling => passed
            .iter()
            .map(|&p| {
                // Gumbel top-k: the k largest ln p̃ + G are k draws ∝ p̃ without replacement.
                let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
                (score(p).ln() - (-u.ln()).ln(), tiebreak[s[p]], p)
            })
            .collect(),
    };
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    ranked.truncate(limit);
    let mut chosen: Vec<usize> = ranked.into_iter().map(|(_, _, p)| p).collect();
    chosen.sort_unstable();
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiebreak_is_a_permutation() {
        let mut r = tiebreak_ranks(50, Seed::new(9));
        r.sort_unstable();
        assert_eq!(r, (0..50).collect::<Vec<u32>>());
    }

    #[test]
    fn slicing_takes_highest_scores_then_tiebreak() {
        let scores = vec![Some(0.9), Some(1.0), Some(0.9), Some(0.8)];
        let s = vec![0, 1, 2, 3];
        let tiebreak = vec![3, 0, 1, 2];
        let mut rng = Seed::new(0).rng();
        let chosen = choose(
            &[0, 1, 2, 3],
            &scores,
            &s,
            &tiebreak,
            2,
            Variant::Slicing,
            &mut rng,
        );
        // 1.0 first, then of the two 0.9s the one with the lower rank (position 2).
        assert_eq!(chosen, vec![1, 2]);
    }

    #[test]
    fn gumbel_sampling_follows_the_scores() {
        // Two candidates, p̃ = 0.9 and 0.1 (of the sum 1.0): one draw picks the first ~90%.
        let scores = vec![Some(0.9), Some(0.1)];
        let mut rng = Seed::new(5).rng();
        let draws = 4000;
        let first = (0..draws)
            .filter(|_| {
                choose(
                    &[0, 1],
                    &scores,
                    &[0, 1],
                    &[0, 1],
                    1,
                    Variant::Sampling,
                    &mut rng,
                ) == vec![0]
            })
            .count();
        let share = first as f64 / draws as f64;
        assert!((share - 0.9).abs() < 0.02, "share {share}");
    }
}
