//! The fine-tuned adversary (`afkit filter --discriminator minilm`): HellaSwag's lesson at the
//! size of a sentence encoder. The stylistic models read the ending alone or `sent2 + ending`;
//! the MiniLM cross-encoder (`embed::cross_encoder`) reads the whole context and the ending
//! together, as the models a benchmark is meant to measure do.
//!
//! In every ensemble iteration a fresh copy (the shipped sentence model, a new head) trains on the
//! iteration's training contexts, each posed as the benchmark poses a question, the real ending
//! beside `negatives` of the context's assigned negatives, and then scores the gold and every
//! pool ending of the held-out contexts; the final cross-fitted pass trains one per fold. AF acts
//! on its scores together with the stylistic ensemble's (see `run/adversary.rs`,
//! `Adversary::join`).
//!
//! It is not carried from one iteration to the next: each iteration draws a new 80/20 split, so a
//! carried model has already trained on the real endings of most contexts a later split holds out,
//! and then recognises them: its held-out accuracy climbs while the stylistic heads fall, and AF
//! would chase the model's memory of the real endings, not what gives a negative away
//! (BENCHMARKS.md, "A fresh adversary in every iteration"). A fresh model per iteration also
//! makes a resumed run need no stored weights.

use std::collections::{HashMap, HashSet};

use anyhow::{Context, Result};
use rand::seq::IndexedRandom;

use super::data::Dataset;
use super::settings::DiscriminatorConfig;
use afkit_engine::device::Compute;
use afkit_engine::embed::cross_encoder::{self, CrossEncoder, Question, Shape};
use afkit_engine::seed::{Key, Seed};
use afkit_store::af::Assignment;
use afkit_store::Store;

/// What the cross-encoder reads and the stylistic dataset does not keep: each context's
/// startphrase (`sent1 + " " + sent2`) and every pool ending's text.
pub(crate) struct Texts {
    contexts: HashMap<i64, String>,
    endings: HashMap<i64, String>,
}

impl Texts {
    /// The texts of the contexts in `data`, read from the project.
    pub(crate) fn load(store: &Store, data: &Dataset) -> Result<Texts> {
        let wanted: HashSet<i64> = data.contexts.iter().map(|c| c.example_id).collect();
        let mut texts = Texts {
            contexts: HashMap::new(),
            endings: HashMap::new(),
        };
        store.for_each_pool_context(None, &[], |c| {
            if wanted.contains(&c.example_id) {
                let startphrase = afkit_store::dataset::startphrase(&c.sent1, &c.sent2);
                texts.contexts.insert(c.example_id, startphrase);
                for e in std::iter::once(c.gold).chain(c.candidates) {
                    texts.endings.insert(e.id, e.text);
                }
            }
            Ok(())
        })?;
        Ok(texts)
    }

    fn context(&self, example_id: i64) -> &str {
        &self.contexts[&example_id]
    }

    fn ending(&self, ending_id: i64) -> String {
        self.endings[&ending_id].clone()
    }
}

/// The cross-encoder AF trains and asks.
pub(crate) struct Discriminator {
    model: CrossEncoder,
    config: DiscriminatorConfig,
}

impl Discriminator {
    /// The shipped sentence model (or `config.model`) with a new head drawn from `seed`.
    pub(crate) fn new(config: &DiscriminatorConfig, seed: Seed, compute: &Compute) -> Result<Self> {
        let dir = match &config.model {
            Some(dir) => dir.clone(),
            None => afkit_engine::models::DefaultModel::MiniLm.ensure()?,
        };
        let shape = Shape {
            max_len: config.max_len,
            frozen_layers: config.frozen_layers,
        };
        let model = CrossEncoder::load(&dir, shape, seed, compute).with_context(|| {
            format!(
                "cannot load the discriminator's model from {}",
                dir.display()
            )
        })?;
        Ok(Discriminator {
            model,
            config: config.clone(),
        })
    }

    /// Trains on the contexts `ids` (indices into `data.contexts`): each the real ending
    /// and [`DiscriminatorConfig::negatives`] of its assigned negatives, drawn from `seed`,
    /// which also orders the batches.
    pub(crate) fn train(
        &mut self,
        data: &Dataset,
        texts: &Texts,
        ids: &[usize],
        assignment: &Assignment,
        seed: Seed,
    ) -> Result<()> {
        let mut rng = seed.key(Key::DiscriminatorNegatives).rng();
        let questions: Vec<Question> = ids
            .iter()
            .map(|&i| {
                let c = &data.contexts[i];
                let negatives =
                    assignment[&c.example_id].choose_multiple(&mut rng, self.config.negatives);
                Question {
                    context: texts.context(c.example_id).to_string(),
                    endings: std::iter::once(c.gold.ending_id)
                        .chain(negatives.copied())
                        .map(|id| texts.ending(id))
                        .collect(),
                }
            })
            .collect();
        let gold = vec![0; questions.len()];
        let config = cross_encoder::FineTuning {
            epochs: self.config.epochs,
            batch: self.config.batch,
            learning_rate: self.config.learning_rate,
            seed,
            ..Default::default()
        };
        self.model.train(&questions, &gold, &config, &mut |_| {})?;
        Ok(())
    }

    /// Each of the contexts' scores: the gold first, then every candidate in pool order.
    pub(crate) fn score(
        &self,
        data: &Dataset,
        texts: &Texts,
        ids: &[usize],
    ) -> Result<Vec<Vec<f32>>> {
        let questions: Vec<Question> = ids
            .iter()
            .map(|&i| {
                let c = &data.contexts[i];
                Question {
                    context: texts.context(c.example_id).to_string(),
                    endings: std::iter::once(&c.gold)
                        .chain(&c.candidates)
                        .map(|e| texts.ending(e.ending_id))
                        .collect(),
                }
            })
            .collect();
        self.model.score(&questions)
    }
}
