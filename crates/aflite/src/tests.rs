//! AFLite's filter on the papers' synthetic experiment (artifacts filtered out, the task still
//! learnable by a non-linear model) and the invariants of every round, property-tested.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

use super::features::Matrix;
use super::filter::{self, Observer, Params, Round, StopReason, Variant};
use super::logreg::{FitOptions, LogReg};
use super::warmup::{Warmup, WarmupOptions};
use afkit_engine::seed::Seed;

/// Le Bras et al. §3.1 / Figure 2: two concentric circles (the real task, not linearly
/// separable) plus two class-specific Gaussian "artifact" features on 75% of each class and
/// uninformative noise in their place on the rest. Returns features, labels, has-artifact flags.
fn circles_with_artifacts(per_class: usize, seed: Seed) -> (Matrix, Vec<u32>, Vec<bool>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed.value());
    let jitter = Normal::new(0.0, 0.08).unwrap();
    let artifact = Normal::new(0.0, 0.35).unwrap();
    let noise = Normal::new(0.0, 0.6).unwrap();
    let mut data = Vec::new();
    let mut labels = Vec::new();
    let mut flags = Vec::new();
    for class in 0..2u32 {
        let radius = if class == 0 { 1.0 } else { 2.0 };
        let centre = if class == 0 { -0.6 } else { 0.6 };
        for i in 0..per_class {
            let angle: f64 = rng.random_range(0.0..std::f64::consts::TAU);
            let r = radius + jitter.sample(&mut rng);
            data.push((r * angle.cos()) as f32);
            data.push((r * angle.sin()) as f32);
            let has_artifact = i < per_class * 3 / 4;
            for _ in 0..2 {
                let v = if has_artifact {
                    centre + artifact.sample(&mut rng)
                } else {
                    noise.sample(&mut rng)
                };
                data.push(v as f32);
            }
            labels.push(class);
            flags.push(has_artifact);
        }
    }
    (Matrix::new(labels.len(), 4, data), labels, flags)
}

/// Held-out accuracy: train on a random half of `rows`, test on the other half.
fn holdout_accuracy(
    x: &Matrix,
    y: &[u32],
    rows: &[usize],
    fit_predict: impl Fn(&Matrix, &[u32], &Matrix) -> Vec<u32>,
) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    let mut order = rows.to_vec();
    rand::seq::SliceRandom::shuffle(&mut order[..], &mut rng);
    let (train, test) = order.split_at(order.len() / 2);
    let ytr: Vec<u32> = train.iter().map(|&i| y[i]).collect();
    let predictions = fit_predict(&x.select(train), &ytr, &x.select(test));
    let correct = test
        .iter()
        .zip(&predictions)
        .filter(|(&i, &p)| y[i] == p)
        .count();
    correct as f64 / test.len() as f64
}

fn linear(train: &Matrix, y: &[u32], test: &Matrix) -> Vec<u32> {
    let model = LogReg::fit(&train.data, train.cols, y, &FitOptions::default());
    (0..test.rows).map(|i| model.predict(test.row(i))).collect()
}

fn mlp(train: &Matrix, y: &[u32], test: &Matrix) -> Vec<u32> {
    let opts = WarmupOptions {
        hidden: 64,
        epochs: 150,
        batch_size: 32,
        learning_rate: 1e-2,
        weight_decay: 1e-4,
        seed: Seed::new(7),
    };
    Warmup::train(train, y, 2, &opts)
        .unwrap()
        .predict(test)
        .unwrap()
}

#[test]
fn synthetic_artifacts_are_filtered_out_but_the_task_stays_learnable() {
    let (x, y, has_artifact) = circles_with_artifacts(400, Seed::new(1));
    let n = y.len();
    let all: Vec<usize> = (0..n).collect();
    let linear_before = holdout_accuracy(&x, &y, &all, linear);
    assert!(
        linear_before > 0.8,
        "the artifacts should make the task linearly solvable, got {linear_before}"
    );

    let params = Params {
        target_size: n * 3 / 10,
        partitions: 32,
        train_size: n / 5,
        slice: n / 20,
        tau: 0.75,
        variant: Variant::Slicing,
        seed: Seed::new(3),
        fit: FitOptions::default(),
    };
    let outcome = filter::run(&x, &y, &params, &mut filter::Silent).unwrap();
    let kept: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&i| outcome.removed_round[i].is_none())
        .collect();
    let removed: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&i| outcome.removed_round[i].is_some())
        .collect();

    let linear_after = holdout_accuracy(&x, &y, &kept, linear);
    let mlp_after = holdout_accuracy(&x, &y, &kept, mlp);
    let artifact_share =
        removed.iter().filter(|&&i| has_artifact[i]).count() as f64 / removed.len() as f64;
    eprintln!(
        "kept {} of {n}; linear {linear_before:.3} → {linear_after:.3}; MLP after {mlp_after:.3}; \
         artifacts among removed {artifact_share:.3}",
        kept.len()
    );
    assert!(
        linear_after < 0.65,
        "after AFLite a linear model should be near chance, got {linear_after}"
    );
    assert!(
        mlp_after > 0.85,
        "a non-linear model should still separate the circles, got {mlp_after}"
    );
    // 75% of all points carry artifacts; the removed set must be clearly richer in them and the
    // retained set clearly poorer.
    assert!(
        artifact_share > 0.8,
        "removed set should be dominated by artifact-carrying points (base rate 0.75), got {artifact_share}"
    );
    let kept_share = kept.iter().filter(|&&i| has_artifact[i]).count() as f64 / kept.len() as f64;
    assert!(
        kept_share < 0.55,
        "retained set should have lost most artifact-carrying points, still {kept_share}"
    );
}

/// Records what the filter reports, round by round.
#[derive(Default)]
struct Recorder {
    rounds: Vec<Round>,
    sizes: Vec<usize>,
}

impl Observer for Recorder {
    fn partitions(
        &mut self,
        _round: usize,
        s: &[usize],
        train: &[Vec<usize>],
    ) -> anyhow::Result<()> {
        self.sizes.push(s.len());
        for t in train {
            assert!(t.iter().all(|i| s.contains(i)), "training rows come from S");
        }
        Ok(())
    }
    fn round_done(&mut self, round: &Round) {
        self.rounds.push(round.clone());
    }
}

fn random_problem(rows: usize, dim: usize, signal: f32, seed: Seed) -> (Matrix, Vec<u32>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed.value());
    let mut data = Vec::with_capacity(rows * dim);
    let mut y = Vec::with_capacity(rows);
    for _ in 0..rows {
        let class = rng.random_range(0..3u32);
        for j in 0..dim {
            let shift = if j as u32 == class { signal } else { 0.0 };
            data.push(shift + rng.random_range(-1.0f32..1.0));
        }
        y.push(class);
    }
    (Matrix::new(rows, dim, data), y)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn filter_invariants(
        rows in 40usize..120,
        signal in 0.0f32..3.0,
        n_frac in 0.2f64..0.7,
        t_frac in 0.05f64..0.9,
        k in 1usize..15,
        m in 1usize..8,
        tau in 0.0f64..1.0,
        variant_index in 0usize..3,
        seed in 0u64..1000,
    ) {
        let (x, y) = random_problem(rows, 3, signal, Seed::new(seed));
        let target = ((rows as f64 * n_frac) as usize).max(2);
        let train = ((target as f64 * t_frac) as usize).clamp(1, target - 1);
        let variant = [Variant::Greedy, Variant::Slicing, Variant::Sampling][variant_index];
        let params = Params {
            target_size: target, partitions: m, train_size: train, slice: k, tau, variant, seed: Seed::new(seed),
            fit: FitOptions::default(),
        };
        let k_eff = params.effective_slice();
        let mut rec = Recorder::default();
        let outcome = filter::run(&x, &y, &params, &mut rec).unwrap();

        let retained = outcome.removed_round.iter().filter(|r| r.is_none()).count();
        prop_assert!(retained >= target, "never below n: kept {} < {}", retained, target);
        prop_assert_eq!(rec.rounds.len(), outcome.rounds.len());
        for (i, round) in outcome.rounds.iter().enumerate() {
            prop_assert!(round.removed <= k_eff, "round removed {} > k {}", round.removed, k_eff);
            prop_assert!(round.removed <= round.size - target);
            prop_assert!(round.removed <= round.passed_tau);
            prop_assert_eq!(
                outcome.removed_round.iter().filter(|r| **r == Some(round.round)).count(),
                round.removed
            );
            // Every removed example scored at least τ in its round.
            for (e, r) in outcome.removed_round.iter().enumerate() {
                if *r == Some(round.round) {
                    prop_assert!(outcome.score[e].unwrap() >= tau);
                }
            }
            let last = i + 1 == outcome.rounds.len();
            if round.passed_tau < k_eff {
                prop_assert!(last, "the run must stop once fewer than k pass τ");
            }
            if !last {
                prop_assert!(round.size - round.removed > target);
            }
        }
        match outcome.stop {
            StopReason::FewerThanKPassedTau => {
                prop_assert!(outcome.rounds.last().unwrap().passed_tau < k_eff)
            }
            StopReason::TargetSizeReached => prop_assert_eq!(retained, target),
            StopReason::AlreadyAtTargetSize => prop_assert_eq!(rows, target),
        }

        // Deterministic for a seed.
        let again = filter::run(&x, &y, &params, &mut filter::Silent).unwrap();
        prop_assert_eq!(&again.removed_round, &outcome.removed_round);
        prop_assert_eq!(&again.score, &outcome.score);
    }
}
