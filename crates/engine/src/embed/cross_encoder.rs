//! A multiple-choice cross-encoder: the MiniLM encoder fine-tuned end to end to pick the real
//! ending of a context.
//!
//! Each option is read together with its context as one pair, `[CLS] context [SEP] ending [SEP]`
//! (token type 0 up to the first [SEP], 1 after it), so attention relates every word of the
//! ending to every word of the context. The last layer is mean-pooled over the real tokens (how
//! the sentence model was trained to summarise a text), a linear head turns that into the
//! option's score, and the scores of a question's options go through a softmax; training
//! minimises the cross-entropy of the real ending with AdamW, a linear warm-up and linear decay,
//! in batches shuffled from a recorded seed. This is the fine-tuned BERT adversary of HellaSwag
//! at the size of a sentence encoder.
//!
//! The encoder is afkit's BERT (`bert`) run on candle tensors, with differentiable ops for the
//! layers it trains. The embeddings and the lowest `frozen_layers` layers stay fixed: their
//! output for a text never changes, so a training call computes it once per option (with the
//! packed forward below where scoring uses it, else candle's fused ops) and every epoch starts
//! above it. A step's questions run as two halves, each on a thread of its own
//! (`batch_gradients`). That, the truncation to `max_len` word pieces, a step's options run in
//! groups of similar lengths (little padding) and the number of epochs are what make the model
//! affordable on a CPU; [`Shape`]'s default is the measured compromise (training fewer layers
//! loses accuracy).
//!
//! Where the CPU multiplies bf16 faster than f32 (AMX tiles, AVX512-BF16) and afkit's kernels
//! are in use, the trained layers' linear products, forward and backward, run in bf16 with f32
//! sums (mixed precision); elsewhere in f32 with candle's matmul.
//!
//! Scoring needs no gradients: on afkit's CPU kernels it runs the current weights packed, over
//! ragged batches (`bert::Packed`), its products in bf16 where the CPU multiplies bf16 faster
//! than f32 and in f32 elsewhere; the generic engine scores with the candle forward.
//!
//! [`CrossEncoder::train`] continues from the model's current weights, so one model can be
//! trained again on new questions (a warm start) as often as a caller needs.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder};
use candle_transformers::models::bert::Config;
use rand::seq::SliceRandom;
use rand_distr::{Distribution, Normal};
use rayon::prelude::*;
use tokenizers::Tokenizer;

use super::bert::packed::{Packed, Spans};
use super::bert::tensors::Tensors;
use super::bert::Bert;
use crate::device::Compute;
use crate::lm::linear::{fast_precision, fast_training_kernel, Kernel};
use crate::seed::{Key, Seed};

/// One multiple-choice question: a context and its options (every question of one call has
/// the same number of options).
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    pub context: String,
    pub endings: Vec<String>,
}

/// What is fixed when a model is made: how much of each pair it reads and which layers train.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Word pieces per option, [CLS] and both [SEP]s included. The ending is kept whole where it
    /// fits; the context loses its first pieces (what is next to the ending matters most).
    pub max_len: usize,
    /// The lowest layers kept as the sentence model trained them (the embeddings always are).
    pub frozen_layers: usize,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            max_len: 64,
            frozen_layers: 2,
        }
    }
}

/// How one call of [`CrossEncoder::train`] fine-tunes the model.
#[derive(Debug, Clone, PartialEq)]
pub struct FineTuning {
    /// Passes over the questions.
    pub epochs: usize,
    /// Questions per optimiser step.
    pub batch: usize,
    /// Peak learning rate, reached at the end of the warm-up and then lowered linearly to 0.
    pub learning_rate: f64,
    /// Fraction of the steps spent raising the learning rate from 0.
    pub warmup: f64,
    pub weight_decay: f64,
    /// Seeds the order of the questions in each epoch (stream = the epoch).
    pub seed: Seed,
}

impl Default for FineTuning {
    fn default() -> Self {
        FineTuning {
            epochs: 2,
            batch: 16,
            learning_rate: 5e-5,
            warmup: 0.1,
            weight_decay: 0.01,
            seed: Seed::new(0),
        }
    }
}

/// How far a training call is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TrainingProgress {
    /// Options run through the frozen layers so far, of all.
    Frozen { done: usize, total: usize },
    /// Optimiser steps taken so far, of all, and the last step's loss.
    Step {
        done: usize,
        total: usize,
        loss: f32,
    },
}

/// What a training call did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainSummary {
    pub steps: usize,
    /// Mean loss over the last epoch's steps.
    pub last_epoch_loss: f32,
}

pub struct CrossEncoder {
    bert: Bert<Tensors>,
    head_weight: Tensor,
    head_bias: Tensor,
    /// Every parameter that training changes: the unfrozen layers and the head.
    trainable: Vec<Var>,
    shape: Shape,
    tokenizer: Tokenizer,
    special: Special,
    device: Device,
    /// Scoring and the frozen layers run the packed forward (afkit's CPU kernels) instead of
    /// candle's.
    packed_scoring: bool,
    /// The kernel the trained layers' linear products run on in training, where afkit's kernels
    /// are used: bf16 where the CPU multiplies bf16 faster than f32, else f32 (faster than
    /// candle's matmul, which packs the weights on every call). `None`: candle's f32 matmul.
    training_kernel: Option<Kernel>,
}

/// The word pieces that frame a pair.
#[derive(Debug, Clone, Copy)]
struct Special {
    cls: u32,
    sep: u32,
}

/// One option as word pieces with their token types.
struct Pair {
    ids: Vec<u32>,
    types: Vec<u32>,
}

impl Pair {
    /// Where the ending's pieces (token type 1) begin.
    fn second_segment(&self) -> usize {
        self.types
            .iter()
            .position(|&t| t == 1)
            .unwrap_or(self.ids.len())
    }
}

impl CrossEncoder {
    /// The sentence model in `dir` (`config.json`, `tokenizer.json`, `model.safetensors`) with a
    /// new head whose weights are drawn from `seed`, on `compute`'s device.
    pub fn load(dir: &Path, shape: Shape, seed: Seed, compute: &Compute) -> Result<Self> {
        let config_path = dir.join("config.json");
        let config: Config = serde_json::from_str(
            &std::fs::read_to_string(&config_path)
                .with_context(|| format!("cannot read {}", config_path.display()))?,
        )
        .with_context(|| format!("{} is not a BERT config", config_path.display()))?;
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&tokenizer_path)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("cannot load {}", tokenizer_path.display()))?;
        let weights_path = dir.join("model.safetensors");
        let weights = candle_core::safetensors::load(&weights_path, &compute.device)
            .with_context(|| format!("cannot read {}", weights_path.display()))?;
        Self::from_weights(&config, weights, tokenizer, shape, seed, compute)
            .with_context(|| format!("{} is not a BERT model", weights_path.display()))
    }

    /// A model from BERT weights named as Hugging Face's `BertModel` names them (a `bert.`
    /// prefix is allowed) and a tokenizer with `[CLS]` and `[SEP]`.
    pub(crate) fn from_weights(
        config: &Config,
        weights: HashMap<String, Tensor>,
        mut tokenizer: Tokenizer,
        shape: Shape,
        seed: Seed,
        compute: &Compute,
    ) -> Result<Self> {
        check_shape(config, shape)?;
        let device = &compute.device;
        let special = prepare_tokenizer(&mut tokenizer)?;
        let mut bert = Bert::load(
            VarBuilder::from_tensors(weights, DType::F32, device),
            config,
        )?;
        let mut trainable = Vec::new();
        for layer in &mut bert.layers[shape.frozen_layers..] {
            trainable.extend(layer.make_trainable()?);
        }
        let (head_weight, head_bias) = new_head(config, seed, device)?;
        let (head_weight_t, head_bias_t) = (
            head_weight.as_tensor().clone(),
            head_bias.as_tensor().clone(),
        );
        trainable.extend([head_weight, head_bias]);
        Ok(CrossEncoder {
            bert,
            head_weight: head_weight_t,
            head_bias: head_bias_t,
            trainable,
            shape,
            tokenizer,
            special,
            device: device.clone(),
            packed_scoring: compute.cpu_kernels,
            training_kernel: fast_training_kernel().filter(|_| compute.cpu_kernels),
        })
    }

    /// Trains the model further on `questions`, whose real endings are `gold` (indices into
    /// each question's options). `progress` hears the frozen layers' pass and every step.
    pub fn train(
        &mut self,
        questions: &[Question],
        gold: &[usize],
        config: &FineTuning,
        progress: &mut dyn FnMut(TrainingProgress),
    ) -> Result<TrainSummary> {
        ensure!(
            config.batch > 0,
            "the batch must hold at least one question"
        );
        let options = labelled_options(questions, gold)?;
        let pairs = self.pairs(questions)?;
        let states = self.frozen_states(&pairs, progress)?;
        let batches_per_epoch = questions.len().div_ceil(config.batch);
        let total = batches_per_epoch * config.epochs;
        let mut optimiser = AdamW::new(
            self.trainable.clone(),
            ParamsAdamW {
                lr: config.learning_rate,
                weight_decay: config.weight_decay,
                ..Default::default()
            },
        )?;
        let warmup = ((total as f64 * config.warmup).ceil() as usize).max(1);
        let mut step = 0;
        let mut last_epoch_loss = f32::NAN;
        for epoch in 0..config.epochs {
            let mut order: Vec<usize> = (0..questions.len()).collect();
            order.shuffle(&mut config.seed.stream(epoch as u64));
            let mut losses = 0f32;
            for batch in order.chunks(config.batch) {
                crate::interrupt::check()?;
                let run = self.training_run()?;
                let (grads, loss) = self.batch_gradients(&run, &states, batch, gold, options)?;
                optimiser.set_learning_rate(learning_rate(config, step, warmup, total));
                optimiser.step(&grads)?;
                losses += loss;
                step += 1;
                progress(TrainingProgress::Step {
                    done: step,
                    total,
                    loss,
                });
            }
            last_epoch_loss = losses / batches_per_epoch as f32;
        }
        Ok(TrainSummary {
            steps: total,
            last_epoch_loss,
        })
    }

    /// How the trained layers run for the next step: their linear products on
    /// [`Self::training_kernel`], the weights packed as they are now, or on candle's matmul.
    fn training_run(&self) -> Result<Tensors> {
        match self.training_kernel {
            Some(kernel) => Tensors::differentiable_packed(
                &self.bert.layers[self.shape.frozen_layers..],
                kernel,
            ),
            None => Ok(Tensors::DIFFERENTIABLE),
        }
    }

    /// The gradients of the mean cross-entropy over the `batch` of questions, and that loss.
    /// Where candle runs its elementwise ops on the calling thread
    /// ([`crate::runtime::use_one_candle_thread`], as `filter` and `audit` set it), the batch runs
    /// as two halves on rayon's threads, each loss weighted by its share, and the gradients are
    /// added: the same mean, on both cores. Otherwise candle's worker pool spreads each op over
    /// the cores, and the pool takes one caller at a time.
    fn batch_gradients(
        &self,
        run: &Tensors,
        states: &[Tensor],
        batch: &[usize],
        gold: &[usize],
        options: usize,
    ) -> Result<(GradStore, f32)> {
        let in_halves = candle_core::utils::barrier_pool().n_workers() == 0;
        self.gradients(run, states, batch, gold, options, in_halves)
    }

    /// [`Self::batch_gradients`], the batch in two halves on rayon's threads or in one piece.
    fn gradients(
        &self,
        run: &Tensors,
        states: &[Tensor],
        batch: &[usize],
        gold: &[usize],
        options: usize,
        in_halves: bool,
    ) -> Result<(GradStore, f32)> {
        let half = |questions: &[usize]| -> Result<(GradStore, f32)> {
            let rows: Vec<usize> = questions
                .iter()
                .flat_map(|&q| q * options..(q + 1) * options)
                .collect();
            let scores = self.upper_scores(run, states, &rows, options)?;
            let targets: Vec<u32> = questions.iter().map(|&q| gold[q] as u32).collect();
            let targets = Tensor::new(targets, &self.device)?;
            let share = questions.len() as f64 / batch.len() as f64;
            let loss = (candle_nn::loss::cross_entropy(&scores, &targets)? * share)?;
            Ok((loss.backward()?, loss.to_scalar::<f32>()?))
        };
        if batch.len() < 2 || !in_halves {
            return half(batch);
        }
        let (first, second) = batch.split_at(batch.len() / 2);
        let (a, b) = rayon::join(|| half(first), || half(second));
        let ((mut grads, loss_a), (mut more, loss_b)) = (a?, b?);
        for var in &self.trainable {
            if let Some(g) = more.remove(var) {
                let sum = match grads.remove(var) {
                    Some(f) => (f + g)?,
                    None => g,
                };
                grads.insert(var, sum);
            }
        }
        Ok((grads, loss_a + loss_b))
    }

    /// Each question's option scores (higher: more likely the real ending), in order. The
    /// questions may have different numbers of options: each option is scored on its own.
    pub fn score(&self, questions: &[Question]) -> Result<Vec<Vec<f32>>> {
        let pairs = self.pairs(questions)?;
        let flat = match self.packed_scoring {
            true => self.score_packed(&pairs)?,
            false => self.score_tensors(&pairs)?,
        };
        let mut rest = flat.as_slice();
        Ok(questions
            .iter()
            .map(|q| {
                let (own, tail) = rest.split_at(q.endings.len());
                rest = tail;
                own.to_vec()
            })
            .collect())
    }

    /// Each pair's score through the current weights packed for afkit's kernels.
    fn score_packed(&self, pairs: &[Pair]) -> Result<Vec<f32>> {
        let bert = Bert::pack(&self.bert, fast_precision())?;
        let head: Vec<f32> = self.head_weight.flatten_all()?.to_vec1()?;
        let bias = self.head_bias.flatten_all()?.to_vec1::<f32>()?[0];
        let width = head.len();
        let mut scores = Vec::with_capacity(pairs.len());
        packed_states(&bert, pairs, 0..bert.layers.len(), |states| {
            let sum: f32 = states
                .chunks_exact(width)
                .flat_map(|row| row.iter().zip(&head).map(|(v, w)| v * w))
                .sum();
            scores.push(sum / (states.len() / width) as f32 + bias);
            Ok(())
        })?;
        Ok(scores)
    }

    /// Each pair's score through the candle forward, padded batches of similar lengths.
    fn score_tensors(&self, pairs: &[Pair]) -> Result<Vec<f32>> {
        // Options of similar lengths together, so a batch pads little.
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        order.sort_by_key(|&r| pairs[r].ids.len());
        // Batches on rayon's threads: `filter` and `audit` run candle's elementwise ops on the
        // calling thread, and each batch is the same computation whichever thread runs it.
        let scored: Vec<Vec<f32>> = order
            .par_chunks(SCORE_BATCH_OPTIONS)
            .map(|batch| -> Result<Vec<f32>> {
                crate::interrupt::check()?;
                let batch_pairs: Vec<&Pair> = batch.iter().map(|&r| &pairs[r]).collect();
                let (hidden, mask) = self.lower(&batch_pairs)?;
                Ok(self
                    .upper(&Tensors::DIFFERENTIABLE, &hidden, &mask)?
                    .to_vec1::<f32>()?)
            })
            .collect::<Result<_>>()?;
        let mut flat = vec![0f32; pairs.len()];
        for (batch, s) in order.chunks(SCORE_BATCH_OPTIONS).zip(scored) {
            for (&r, v) in batch.iter().zip(s) {
                flat[r] = v;
            }
        }
        Ok(flat)
    }

    /// Every option of every question as a framed, truncated pair, question by question.
    fn pairs(&self, questions: &[Question]) -> Result<Vec<Pair>> {
        let pieces = |texts: Vec<&str>| -> Result<Vec<Vec<u32>>> {
            Ok(self
                .tokenizer
                .encode_batch(texts, false)
                .map_err(anyhow::Error::msg)
                .context("cannot tokenise the questions")?
                .into_iter()
                .map(|e| e.get_ids().to_vec())
                .collect())
        };
        let contexts = pieces(questions.iter().map(|q| q.context.as_str()).collect())?;
        let endings = pieces(
            questions
                .iter()
                .flat_map(|q| q.endings.iter().map(String::as_str))
                .collect(),
        )?;
        let context_of = questions
            .iter()
            .enumerate()
            .flat_map(|(q, question)| std::iter::repeat_n(q, question.endings.len()));
        Ok(endings
            .iter()
            .zip(context_of)
            .map(|(ending, q)| frame(&contexts[q], ending, self.shape.max_len, self.special))
            .collect())
    }

    /// The frozen layers' output of every pair: each pair's own rows (its length × width), in
    /// the order given.
    fn frozen_states(
        &self,
        pairs: &[Pair],
        progress: &mut dyn FnMut(TrainingProgress),
    ) -> Result<Vec<Tensor>> {
        match self.packed_scoring {
            true => self.frozen_states_packed(pairs, progress),
            false => self.frozen_states_tensors(pairs, progress),
        }
    }

    /// [`Self::frozen_states`] through candle's forward, in padded batches of similar lengths.
    fn frozen_states_tensors(
        &self,
        pairs: &[Pair],
        progress: &mut dyn FnMut(TrainingProgress),
    ) -> Result<Vec<Tensor>> {
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        order.sort_by_key(|&i| pairs[i].ids.len());
        let mut states = vec![None; pairs.len()];
        let mut done = 0;
        for batch in order.chunks(FROZEN_BATCH) {
            crate::interrupt::check()?;
            let batch_pairs: Vec<&Pair> = batch.iter().map(|&i| &pairs[i]).collect();
            let (hidden, _) = self.lower(&batch_pairs)?;
            for (row, &i) in batch.iter().enumerate() {
                let len = pairs[i].ids.len();
                states[i] = Some(hidden.get(row)?.narrow(0, 0, len)?.contiguous()?);
            }
            done += batch.len();
            progress(TrainingProgress::Frozen {
                done,
                total: pairs.len(),
            });
        }
        Ok(states
            .into_iter()
            .map(|s| s.expect("every pair was run"))
            .collect())
    }

    /// [`Self::frozen_states`] through the frozen layers packed for afkit's kernels, as scoring
    /// runs them: ragged batches, no padding, each product spread over the threads.
    fn frozen_states_packed(
        &self,
        pairs: &[Pair],
        progress: &mut dyn FnMut(TrainingProgress),
    ) -> Result<Vec<Tensor>> {
        let bert = Bert::pack(&self.bert, fast_precision())?;
        let width = bert.embeddings.width();
        let mut states = Vec::with_capacity(pairs.len());
        packed_states(&bert, pairs, 0..self.shape.frozen_layers, |rows| {
            let shape = (rows.len() / width, width);
            states.push(Tensor::from_slice(rows, shape, &self.device)?);
            progress(TrainingProgress::Frozen {
                done: states.len(),
                total: pairs.len(),
            });
            Ok(())
        })?;
        Ok(states)
    }

    /// Embeddings and frozen layers of a padded batch: (batch × longest × width, the additive
    /// attention mask batch × 1 × 1 × longest).
    fn lower(&self, pairs: &[&Pair]) -> Result<(Tensor, Tensor)> {
        let longest = pairs.iter().map(|p| p.ids.len()).max().unwrap_or(0);
        let pad = |f: &dyn Fn(&Pair) -> &[u32]| -> Vec<u32> {
            pairs
                .iter()
                .flat_map(|p| {
                    let v = f(p);
                    v.iter()
                        .copied()
                        .chain(std::iter::repeat_n(0, longest - v.len()))
                })
                .collect()
        };
        let shape = (pairs.len(), longest);
        let ids = Tensor::from_vec(pad(&|p| &p.ids), shape, &self.device)?;
        let types = Tensor::from_vec(pad(&|p| &p.types), shape, &self.device)?;
        let lengths: Vec<usize> = pairs.iter().map(|p| p.ids.len()).collect();
        let mask = self.attention_mask(&lengths, longest)?;
        let x = self.bert.embeddings.forward(&ids, &types)?;
        let (b, t, width) = x.dims3()?;
        let x = self.bert.encode(
            &Tensors::FUSED,
            0..self.shape.frozen_layers,
            x.reshape((b * t, width))?,
            &mask,
        )?;
        let x = x.reshape((b, t, width))?;
        Ok((x, mask))
    }

    /// Option scores (rows / options × options) of the given rows of `states`, through the
    /// trained layers and the head, differentiable. The rows run in groups of similar lengths,
    /// each padded to its own longest (a batch of random questions padded to its longest is a
    /// third padding), and their scores are put back in row order.
    fn upper_scores(
        &self,
        run: &Tensors,
        states: &[Tensor],
        rows: &[usize],
        options: usize,
    ) -> Result<Tensor> {
        let length = |i: usize| states[rows[i]].dims()[0];
        let mut by_length: Vec<usize> = (0..rows.len()).collect();
        by_length.sort_by_key(|&i| length(i));
        let groups = by_length
            .chunks(TRAIN_GROUP_ROWS)
            .map(|group| {
                let own: Vec<usize> = group.iter().map(|&i| rows[i]).collect();
                self.padded_scores(run, states, &own)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut place = vec![0u32; rows.len()];
        for (sorted, &i) in by_length.iter().enumerate() {
            place[i] = sorted as u32;
        }
        let place = Tensor::new(place, &self.device)?;
        Tensor::cat(&groups, 0)?
            .index_select(&place, 0)?
            .reshape((rows.len() / options, options))
            .map_err(Into::into)
    }

    /// One score per given row of `states`, the rows padded to the longest of them.
    fn padded_scores(&self, run: &Tensors, states: &[Tensor], rows: &[usize]) -> Result<Tensor> {
        let lengths: Vec<usize> = rows
            .iter()
            .map(|&r| states[r].dim(0))
            .collect::<Result<_, _>>()?;
        let longest = lengths.iter().copied().max().unwrap_or(0);
        let width = states[rows[0]].dim(1)?;
        let padded = rows
            .iter()
            .zip(&lengths)
            .map(|(&r, &len)| {
                if len == longest {
                    Ok(states[r].clone())
                } else {
                    let zeros = Tensor::zeros((longest - len, width), DType::F32, &self.device)?;
                    Tensor::cat(&[&states[r], &zeros], 0)
                }
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let hidden = Tensor::stack(&padded, 0)?;
        let mask = self.attention_mask(&lengths, longest)?;
        self.upper(run, &hidden, &mask)
    }

    /// The trained layers, mean pooling over the real tokens and the head: one score per row.
    fn upper(&self, run: &Tensors, hidden: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (b, t, width) = hidden.dims3()?;
        let x = self.bert.encode(
            run,
            self.shape.frozen_layers..self.bert.layers.len(),
            hidden.reshape((b * t, width))?,
            mask,
        )?;
        let x = x.reshape((b, t, width))?;
        // The additive mask is 0 on real tokens and -1e4 on padding: 1 + mask/1e4 is 1 and 0.
        let keep = ((mask.reshape((b, t, 1))? * 1e-4)? + 1.0)?;
        let pooled = x
            .broadcast_mul(&keep)?
            .sum(1)?
            .broadcast_div(&keep.sum(1)?)?;
        Ok(pooled
            .matmul(&self.head_weight)?
            .broadcast_add(&self.head_bias)?
            .flatten_all()?)
    }

    /// 0 where a row has a token, -10,000 on its padding (batch × 1 × 1 × longest).
    fn attention_mask(&self, lengths: &[usize], longest: usize) -> Result<Tensor> {
        let mask: Vec<f32> = lengths
            .iter()
            .flat_map(|&len| (0..longest).map(move |i| if i < len { 0.0 } else { -1e4 }))
            .collect();
        Ok(Tensor::from_vec(
            mask,
            (lengths.len(), 1, 1, longest),
            &self.device,
        )?)
    }
}

/// A new scoring head (weight, bias), initialised as BERT initialises a new layer: normal with
/// its initializer_range, drawn from `seed`, and a zero bias.
fn new_head(config: &Config, seed: Seed, device: &Device) -> Result<(Var, Var)> {
    let width = config.hidden_size;
    let normal = Normal::new(0.0, config.initializer_range as f32)?;
    let mut rng = seed.key(Key::CrossEncoderHead).rng();
    let head: Vec<f32> = (0..width).map(|_| normal.sample(&mut rng)).collect();
    Ok((
        Var::from_tensor(&Tensor::from_vec(head, (width, 1), device)?)?,
        Var::zeros(1, DType::F32, device)?,
    ))
}

/// Whether `shape` fits a BERT model of `config` that the cross-encoder can run.
fn check_shape(config: &Config, shape: Shape) -> Result<()> {
    super::bert::check_supported(config)?;
    ensure!(
        shape.frozen_layers <= config.num_hidden_layers,
        "{} frozen layers, but the model has {}",
        shape.frozen_layers,
        config.num_hidden_layers
    );
    ensure!(
        (4..=config.max_position_embeddings).contains(&shape.max_len),
        "max length {} is not within 4..={}",
        shape.max_len,
        config.max_position_embeddings
    );
    Ok(())
}

/// The tokenizer's `[CLS]` and `[SEP]`, with its own truncation and padding turned off: pairs
/// are framed and cut here, one option at a time.
fn prepare_tokenizer(tokenizer: &mut Tokenizer) -> Result<Special> {
    let token = |name: &str| {
        tokenizer
            .token_to_id(name)
            .with_context(|| format!("the tokenizer has no {name} token"))
    };
    let special = Special {
        cls: token("[CLS]")?,
        sep: token("[SEP]")?,
    };
    tokenizer
        .with_truncation(None)
        .map_err(anyhow::Error::msg)?;
    tokenizer.with_padding(None);
    Ok(special)
}

/// Runs `pairs` through `bert`'s embeddings and `layers` in ragged batches of
/// [`PACKED_BATCH_TOKENS`] word pieces (each product spread over the threads) and hands `each`
/// every pair's hidden states (its length × width, row-major), in order.
fn packed_states(
    bert: &Bert<Packed>,
    pairs: &[Pair],
    layers: Range<usize>,
    mut each: impl FnMut(&[f32]) -> Result<()>,
) -> Result<()> {
    let width = bert.embeddings.width();
    let mut rest = pairs;
    while !rest.is_empty() {
        crate::interrupt::check()?;
        let mut tokens = 0;
        let take = rest
            .iter()
            .take_while(|p| {
                tokens += p.ids.len();
                tokens <= PACKED_BATCH_TOKENS
            })
            .count()
            .max(1);
        let (batch, tail) = rest.split_at(take);
        rest = tail;
        let ids: Vec<&[u32]> = batch.iter().map(|p| p.ids.as_slice()).collect();
        let second: Vec<usize> = batch.iter().map(Pair::second_segment).collect();
        let spans = Spans::new(&ids);
        let x = bert.embeddings.forward(&ids, Some(&second), &spans)?;
        let x = bert.encode(&Packed, layers.clone(), x, &spans)?;
        for span in &spans.ranges {
            each(&x[span.start * width..span.end * width])?;
        }
    }
    Ok(())
}

/// Options run through the frozen layers in one product.
const FROZEN_BATCH: usize = 64;
/// Options of one training step run through the trained layers together (with their lengths
/// sorted, so that each group pads little).
const TRAIN_GROUP_ROWS: usize = 8;
/// Options scored in one candle forward pass.
const SCORE_BATCH_OPTIONS: usize = 64;
/// Word pieces of one packed batch (scoring, the frozen layers): tall enough products for the
/// kernels, hidden states of a few megabytes.
const PACKED_BATCH_TOKENS: usize = 4096;

/// The number of options of every question, given that `gold` labels each of them with one.
fn labelled_options(questions: &[Question], gold: &[usize]) -> Result<usize> {
    ensure!(
        questions.len() == gold.len(),
        "{} questions but {} gold labels",
        questions.len(),
        gold.len()
    );
    let options = options_per_question(questions)?;
    if let Some(q) = gold.iter().position(|&g| g >= options) {
        bail!(
            "question {} has gold option {} of {options}",
            q + 1,
            gold[q]
        );
    }
    Ok(options)
}

fn options_per_question(questions: &[Question]) -> Result<usize> {
    let options = questions.first().map_or(0, |q| q.endings.len());
    if let Some(q) = questions.iter().position(|q| q.endings.len() != options) {
        bail!(
            "question {} has {} options, question 1 has {options}",
            q + 1,
            questions[q].endings.len()
        );
    }
    ensure!(
        questions.is_empty() || options >= 2,
        "a question needs at least two options"
    );
    Ok(options)
}

/// `[CLS] context [SEP] ending [SEP]` in at most `max_len` pieces: the ending keeps its first
/// pieces up to what is left after half the budget for the context (or the whole context when
/// it is shorter), and the context keeps its last pieces.
fn frame(context: &[u32], ending: &[u32], max_len: usize, special: Special) -> Pair {
    let budget = max_len - 3;
    let ending_len = ending.len().min(budget - context.len().min(budget / 2));
    let context_len = context.len().min(budget - ending_len);
    let context = &context[context.len() - context_len..];
    let mut ids = Vec::with_capacity(context_len + ending_len + 3);
    ids.push(special.cls);
    ids.extend_from_slice(context);
    ids.push(special.sep);
    let first_segment = ids.len();
    ids.extend_from_slice(&ending[..ending_len]);
    ids.push(special.sep);
    let types = (0..ids.len())
        .map(|i| u32::from(i >= first_segment))
        .collect();
    Pair { ids, types }
}

/// The learning rate of step `step`: linear from 0 to the peak over `warmup` steps, then
/// linear to 0 at `total`.
fn learning_rate(config: &FineTuning, step: usize, warmup: usize, total: usize) -> f64 {
    let peak = config.learning_rate;
    if step < warmup {
        peak * (step + 1) as f64 / warmup as f64
    } else {
        peak * (total - step) as f64 / (total - warmup).max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    const WORDS: [&str; 24] = [
        "man", "woman", "dog", "ball", "runs", "jumps", "throws", "catches", "the", "a", "park",
        "water", "slowly", "quickly", "red", "blue", "kitchen", "cuts", "stirs", "bowl", "then",
        "rope", "climbs", "smiles",
    ];
    /// The word that marks the real ending in the planted-tell data.
    const MARKER: &str = "indeed";

    /// A word-level tokenizer over `WORDS`, the marker and BERT's special tokens.
    fn tokenizer() -> Tokenizer {
        let vocab: serde_json::Map<String, serde_json::Value> =
            ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
                .into_iter()
                .chain(WORDS)
                .chain([MARKER])
                .enumerate()
                .map(|(i, w)| (w.to_string(), serde_json::json!(i)))
                .collect();
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
        });
        json.to_string().parse().unwrap()
    }

    fn tiny_config() -> Config {
        Config {
            vocab_size: WORDS.len() + 5,
            hidden_size: 32,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            intermediate_size: 64,
            max_position_embeddings: 64,
            ..Config::default()
        }
    }

    fn tiny_model(frozen_layers: usize) -> CrossEncoder {
        let config = tiny_config();
        let shape = Shape {
            max_len: 24,
            frozen_layers,
        };
        CrossEncoder::from_weights(
            &config,
            crate::fixtures::random_bert_weights(&config, crate::seed::Seed::new(5)),
            tokenizer(),
            shape,
            Seed::new(1),
            &Compute::cpu(),
        )
        .unwrap()
    }

    fn phrase(rng: &mut impl Rng, words: usize) -> String {
        (0..words)
            .map(|_| WORDS[rng.random_range(0..WORDS.len())])
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// `n` four-way questions of random words with gold labels drawn from `seed`; with
    /// `marked`, the real ending (only) carries the marker word.
    fn questions(n: usize, marked: bool, seed: Seed) -> (Vec<Question>, Vec<usize>) {
        let mut rng = seed.rng();
        (0..n)
            .map(|_| {
                let gold = rng.random_range(0..4);
                let context = phrase(&mut rng, 8);
                let endings = (0..4)
                    .map(|o| {
                        let mut e = phrase(&mut rng, 5);
                        if marked && o == gold {
                            let at = rng.random_range(0..=5);
                            let mut words: Vec<&str> = e.split(' ').collect();
                            words.insert(at, MARKER);
                            e = words.join(" ");
                        }
                        e
                    })
                    .collect();
                (Question { context, endings }, gold)
            })
            .unzip()
    }

    fn accuracy(model: &CrossEncoder, questions: &[Question], gold: &[usize]) -> f64 {
        let scores = model.score(questions).unwrap();
        let right = scores
            .iter()
            .zip(gold)
            .filter(|(s, &g)| s.iter().enumerate().all(|(o, &x)| o == g || x < s[g]))
            .count();
        right as f64 / gold.len() as f64
    }

    fn fine_tuning(seed: Seed) -> FineTuning {
        FineTuning {
            epochs: 4,
            batch: 8,
            learning_rate: 3e-3,
            seed,
            ..Default::default()
        }
    }

    #[test]
    fn frames_pairs_within_the_length_keeping_the_ending_and_the_end_of_the_context() {
        let special = Special { cls: 100, sep: 101 };
        let pair = frame(&[1, 2, 3], &[7, 8], 16, special);
        assert_eq!(pair.ids, [100, 1, 2, 3, 101, 7, 8, 101]);
        assert_eq!(pair.types, [0, 0, 0, 0, 0, 1, 1, 1]);
        let context: Vec<u32> = (1..=20).collect();
        let pair = frame(&context, &[50, 51, 52], 10, special);
        assert_eq!(pair.ids, [100, 17, 18, 19, 20, 101, 50, 51, 52, 101]);
        let ending: Vec<u32> = (50..70).collect();
        let pair = frame(&context, &ending, 11, special);
        assert_eq!(pair.ids.len(), 11);
        assert_eq!(pair.ids[1..5], [17, 18, 19, 20]);
        assert_eq!(pair.ids[6..10], [50, 51, 52, 53]);
    }

    #[test]
    fn finds_a_planted_tell() {
        let (train, train_gold) = questions(240, true, Seed::new(1));
        let (test, test_gold) = questions(200, true, Seed::new(2));
        let mut model = tiny_model(1);
        let before = accuracy(&model, &test, &test_gold);
        let summary = model
            .train(&train, &train_gold, &fine_tuning(Seed::new(3)), &mut |_| {})
            .unwrap();
        let after = accuracy(&model, &test, &test_gold);
        assert!(
            after >= 0.9,
            "accuracy {after} (before training {before}), {summary:?}"
        );
    }

    #[test]
    fn stays_at_chance_on_shuffled_labels() {
        let (train, train_gold) = questions(240, false, Seed::new(4));
        let (test, test_gold) = questions(400, false, Seed::new(5));
        let mut model = tiny_model(0);
        model
            .train(&train, &train_gold, &fine_tuning(Seed::new(6)), &mut |_| {})
            .unwrap();
        let acc = accuracy(&model, &test, &test_gold);
        let se = (0.25f64 * 0.75 / test.len() as f64).sqrt();
        assert!((acc - 0.25).abs() <= 2.0 * se, "accuracy {acc}, se {se}");
    }

    #[test]
    fn training_is_reproducible_from_the_seed_and_continues_from_the_weights() {
        let (train, gold) = questions(48, true, Seed::new(7));
        let run = |seed: Seed| {
            let mut model = tiny_model(1);
            let mut losses = Vec::new();
            model
                .train(&train, &gold, &fine_tuning(seed), &mut |p| {
                    if let TrainingProgress::Step { loss, .. } = p {
                        losses.push(loss)
                    }
                })
                .unwrap();
            (model, losses)
        };
        let (mut a, losses_a) = run(Seed::new(9));
        let (b, losses_b) = run(Seed::new(9));
        let (_, losses_c) = run(Seed::new(10));
        assert_eq!(losses_a, losses_b);
        assert_eq!(a.score(&train).unwrap(), b.score(&train).unwrap());
        assert_ne!(losses_a, losses_c, "another seed shuffles another way");
        // A second call starts from the trained weights: its first batch (the same questions as
        // the first call's first batch, same seed) has a lower loss than under the fresh model.
        let mut again = Vec::new();
        a.train(&train, &gold, &fine_tuning(Seed::new(9)), &mut |p| {
            if let TrainingProgress::Step { loss, .. } = p {
                again.push(loss)
            }
        })
        .unwrap();
        assert!(again[0] < losses_a[0] - 0.05, "{again:?} vs {losses_a:?}");
    }

    /// Training runs a batch's options in groups of similar lengths: each option's score is
    /// the one it gets with the whole batch padded together, in the batch's order.
    #[test]
    fn options_grouped_by_length_score_as_the_batch_padded_together() {
        let model = tiny_model(1);
        let mut rng = Seed::new(9).rng();
        let questions: Vec<Question> = (0..7)
            .map(|_| Question {
                context: phrase(&mut rng, 6),
                endings: (0..4)
                    .map(|_| {
                        let words = rng.random_range(1..12);
                        phrase(&mut rng, words)
                    })
                    .collect(),
            })
            .collect();
        let pairs = model.pairs(&questions).unwrap();
        let states = model.frozen_states(&pairs, &mut |_| {}).unwrap();
        let rows: Vec<usize> = (0..pairs.len()).rev().collect();
        let run = model.training_run().unwrap();
        let grouped: Vec<Vec<f32>> = model
            .upper_scores(&run, &states, &rows, 4)
            .unwrap()
            .to_vec2()
            .unwrap();
        let together: Vec<f32> = model
            .padded_scores(&run, &states, &rows)
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!(pairs.iter().any(|p| p.ids.len() != pairs[0].ids.len()));
        for (g, t) in grouped.concat().iter().zip(&together) {
            assert!((g - t).abs() < 1e-4, "{g} against {t}");
        }
    }

    #[test]
    fn gradients_reach_every_trained_layer_and_no_frozen_one() {
        let mut model = tiny_model(1);
        let (train, gold) = questions(8, true, Seed::new(11));
        let frozen_before = model.bert.layers[0]
            .attention
            .query
            .weight
            .to_vec2::<f32>()
            .unwrap();
        let trained_before = model.bert.layers[1]
            .attention
            .query
            .weight
            .to_vec2::<f32>()
            .unwrap();
        model
            .train(&train, &gold, &fine_tuning(Seed::new(1)), &mut |_| {})
            .unwrap();
        assert_eq!(
            model.bert.layers[0]
                .attention
                .query
                .weight
                .to_vec2::<f32>()
                .unwrap(),
            frozen_before
        );
        assert_ne!(
            model.bert.layers[1]
                .attention
                .query
                .weight
                .to_vec2::<f32>()
                .unwrap(),
            trained_before
        );
    }

    #[test]
    #[cfg_attr(offline, ignore = "AFKIT_TEST_OFFLINE is set: MiniLM is not fetched")]
    fn the_sentence_model_fine_tuned_finds_a_planted_tell() {
        let dir = crate::models::DefaultModel::MiniLm
            .ensure()
            .expect("fetch MiniLM");
        let mut model =
            CrossEncoder::load(&dir, Shape::default(), Seed::new(1), &Compute::cpu()).unwrap();
        let (train, train_gold) = questions(160, true, Seed::new(12));
        let (test, test_gold) = questions(100, true, Seed::new(13));
        let config = FineTuning {
            epochs: 3,
            batch: 8,
            learning_rate: 1e-4,
            seed: Seed::new(14),
            ..Default::default()
        };
        model
            .train(&train, &train_gold, &config, &mut |_| {})
            .unwrap();
        let acc = accuracy(&model, &test, &test_gold);
        assert!(acc >= 0.9, "accuracy {acc}");
    }

    /// The packed scoring forward and the candle one give every option the same score: in f32
    /// up to the order of additions, in bf16 within its rounding.
    #[test]
    fn packed_scoring_agrees_with_the_candle_forward() {
        let model = tiny_model(1);
        let (questions, _) = questions(12, true, Seed::new(9));
        let pairs = model.pairs(&questions).unwrap();
        assert_near_candle(
            &model.score_packed(&pairs).unwrap(),
            &model.score_tensors(&pairs).unwrap(),
        );
    }

    /// Asserts that values of the packed forward equal candle's: in f32 up to the order of
    /// additions, in bf16 (where this CPU's packed kernels use it) within its rounding.
    fn assert_near_candle(packed: &[f32], candle: &[f32]) {
        assert_eq!(packed.len(), candle.len());
        let bf16 = fast_precision() != crate::lm::linear::Precision::F32;
        let tolerance = if bf16 { 0.05 } else { 1e-4 };
        for (p, c) in packed.iter().zip(candle) {
            assert!((p - c).abs() <= tolerance * (1.0 + c.abs()), "{p} vs {c}");
        }
    }

    /// A step's gradients and loss with its questions in two halves equal those of the whole
    /// batch in one piece, up to the order of additions.
    #[test]
    fn a_batch_in_halves_gives_the_gradients_of_the_whole() {
        let model = tiny_model(1);
        let (questions, gold) = questions(7, true, Seed::new(15));
        let pairs = model.pairs(&questions).unwrap();
        let states = model.frozen_states(&pairs, &mut |_| {}).unwrap();
        let batch: Vec<usize> = vec![6, 0, 3, 5, 1, 2, 4];
        let run = model.training_run().unwrap();
        let gradients = |in_halves| model.gradients(&run, &states, &batch, &gold, 4, in_halves);
        let (whole, whole_loss) = gradients(false).unwrap();
        let (halves, halves_loss) = gradients(true).unwrap();
        assert!(
            (whole_loss - halves_loss).abs() < 1e-5,
            "{whole_loss} vs {halves_loss}"
        );
        let values = |grads: &GradStore, var: &Var| -> Vec<f32> {
            let g = grads.get(var).unwrap().flatten_all().unwrap();
            g.to_vec1::<f32>().unwrap()
        };
        // Some gradients are zero but for rounding (a key's bias moves no softmax): each
        // difference is measured against the largest gradient of all.
        let scale = model
            .trainable
            .iter()
            .flat_map(|var| values(&whole, var))
            .fold(0f32, |m, v| m.max(v.abs()));
        assert!(scale > 0.0);
        for var in &model.trainable {
            for (w, h) in values(&whole, var).iter().zip(values(&halves, var)) {
                assert!((w - h).abs() <= 1e-4 * scale, "{w} vs {h}");
            }
        }
    }

    /// The frozen layers packed for afkit's kernels give every pair the hidden states candle's
    /// forward gives it: in f32 up to the order of additions, in bf16 within its rounding.
    #[test]
    fn packed_frozen_layers_agree_with_the_candle_forward() {
        let model = tiny_model(1);
        let (questions, _) = questions(12, true, Seed::new(9));
        let pairs = model.pairs(&questions).unwrap();
        let packed = model.frozen_states_packed(&pairs, &mut |_| {}).unwrap();
        let candle = model.frozen_states_tensors(&pairs, &mut |_| {}).unwrap();
        assert_eq!(packed.len(), candle.len());
        let values = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for (p, c) in packed.iter().zip(&candle) {
            assert_eq!(p.dims(), c.dims());
            assert_near_candle(&values(p), &values(c));
        }
    }

    #[test]
    fn trains_on_equal_option_counts_and_scores_any() {
        let mut model = tiny_model(0);
        let q = |n: usize, word: &str| Question {
            context: "the man".into(),
            endings: (0..n).map(|i| format!("{word} {i}")).collect(),
        };
        let err = model
            .train(
                &[q(4, "runs"), q(3, "runs")],
                &[0, 0],
                &fine_tuning(Seed::new(1)),
                &mut |_| {},
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("question 2 has 3 options"), "{err}");
        let together = model.score(&[q(4, "runs"), q(2, "sits")]).unwrap();
        assert_eq!(together[0].len(), 4);
        assert_eq!(together[1].len(), 2);
        for (question, scores) in [q(4, "runs"), q(2, "sits")].iter().zip(&together) {
            let alone = model.score(std::slice::from_ref(question)).unwrap();
            for (a, b) in alone[0].iter().zip(scores) {
                assert!((a - b).abs() < 1e-4, "{a} vs {b}");
            }
        }
    }
}
