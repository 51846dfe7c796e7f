//! The fine-tuned adversary (`--discriminator`) within a run: a fresh cross-encoder trained
//! beside the ensemble, whose scores join the ensemble's before AF acts on them.

use anyhow::Result;

use super::config::Config;
use super::held_out::{mean_and_spread, HeldOut};
use crate::data::Dataset;
use crate::discriminator::{Discriminator, Texts};
use crate::settings::DiscriminatorConfig;
use afkit_engine::seed::{Key, Seed};
use afkit_store::af::Assignment;
use afkit_store::Store;

/// Loads the adversary's model once and drops it: a folder that holds no model fails before a
/// run is created or marked running, not after the MLP iterations.
pub(crate) fn check_model_loads(config: &DiscriminatorConfig, run: &Config) -> Result<()> {
    Discriminator::new(config, head_seed(run), &run.train.compute).map(drop)
}

/// The seed of every adversary's new head in a run.
fn head_seed(run: &Config) -> Seed {
    run.seed.key(Key::DiscriminatorHead)
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
    pub(crate) fn open(
        store: &Store,
        data: &Dataset,
        config: &DiscriminatorConfig,
        run: &Config,
    ) -> Result<Adversary> {
        Ok(Adversary {
            texts: Texts::load(store, data)?,
            config: config.clone(),
            compute: run.train.compute.clone(),
            head_seed: head_seed(run),
        })
    }

    /// A fresh model trained on the contexts `train_ids` under `assignment`, its draws from
    /// `model_seed` (the seed the iteration's or fold's other models train from).
    pub(crate) fn trained(
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
    /// confidence: summed raw, the stylistic ensemble's wider spread would outvote the
    /// cross-encoder, leaving endings it finds easy in the pool (BENCHMARKS.md, "A fresh
    /// adversary in every iteration"). Standardised, each member has the same say in which
    /// ending is easy.
    pub(crate) fn join(
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
    let (mean, sd) = mean_and_spread(scores);
    let scale = 1.0 / sd;
    scores.iter().map(|s| (s - mean) * scale).collect()
}

#[cfg(test)]
mod tests {
    use super::standardised;
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
