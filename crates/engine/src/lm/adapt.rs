//! Adapting the generator to a corpus: low-rank updates (LoRA) of the top layers' weight
//! matrices, trained on the corpus's own text by next-token prediction.
//!
//! A general-purpose LM writes in its own register; a stylistic classifier spots that register.
//! Training on the user's corpus moves the model's register towards the corpus's. Each adapted
//! matrix becomes `W + (alpha / rank) · B · A` with `A` (rank × in) and `B` (out × rank): few
//! parameters, so a few hundred steps on a few thousand sentences neither overfit badly nor take
//! long, and the adapter is merged into `W` when the model is loaded, so sampling with it costs
//! nothing extra.
//!
//! Only the top layers are adapted. The layers below stay frozen, so their outputs are computed
//! once for the whole corpus and reused by every step and epoch: training costs about what the
//! top layers and the output head cost, not the whole model.
//!
//! The model is [`super::llama`]'s, loaded for the generic engine on the CPU, and its blocks
//! ([`super::block`]) run the pass: the adapter enters as a low-rank addition to the adapted
//! projections, and while training the block's steps are candle compositions that have
//! gradients ([`Pass::Train`]); where no gradient flows (the frozen layers, evaluation),
//! candle's fused kernels. The weight products, most of the time, run on afkit's kernels
//! ([`Products::fastest`]: in bf16 where the CPU multiplies bf16 faster than f32, else in f32):
//! the base matrices never change, so each is packed once, both ways round for the gradient's
//! way back, where candle's matmul would pack it again on every call.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::ops::log_softmax;
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};

use super::adapter::{Adapter, BaseModel};
use super::block::{Lora, LoraPair};
use super::config::LlamaConfig;
use super::family::Arch;
use super::linear::{fast_training_kernel, Kernel, Linear, PackedMatrix};
use super::llama::Llama;
use super::model::read_header;
use super::tokenizer::GgufTokenizer;
use crate::device::Compute;
use crate::models::{DefaultModel, SMOLLM2_HUB_ID};
use crate::seed::Seed;

pub(crate) use super::tensor_ops::Pass;

/// A weight matrix of the model as loaded (candle's f32) packed for `kernel`: for the
/// forward pass alone in the frozen blocks (below `first`), which only ever run once over the
/// corpus without gradients; packed both ways round, to pass gradients back, in the adapted
/// blocks and the output head.
fn packed_form(
    layer: Option<usize>,
    first: usize,
    linear: &Linear,
    kernel: Kernel,
) -> Result<Linear> {
    let Linear::Dense(w) = linear else {
        bail!("the model to adapt is loaded with candle's weights");
    };
    match layer {
        Some(layer) if layer < first => Ok(Linear::Packed(PackedMatrix::pack(w, kernel)?)),
        _ => Linear::frozen(w, kernel),
    }
}

/// Sequences per matrix product in the frozen layers' single pass.
const FROZEN_BATCH: usize = 8;

/// The weight matrices of a block that LoRA adapts, by their GGUF names.
pub(crate) const ADAPTED: [&str; 7] = [
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// Which matrices are adapted, and how.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LoraShape {
    pub rank: usize,
    /// The update is scaled by alpha / rank.
    pub alpha: f32,
    /// The top this many blocks are adapted; the others stay frozen.
    pub top_layers: usize,
}

/// The arithmetic of the model's weight products while it is adapted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Products {
    /// f32, candle's matmul.
    Candle,
    /// afkit's `Kernel` (one of this CPU's; bf16 operands and f32 sums on a bf16 kernel),
    /// forward and backward: the base matrices and the output head packed once, since only the
    /// adapter trains.
    Packed(Kernel),
}

impl Products {
    /// bf16 where this CPU multiplies bf16 faster than f32 (AVX512-BF16 or AMX, as
    /// `AFKIT_SIMD` allows), the rule the language models' other passes follow; else afkit's
    /// f32 kernel; candle's matmul on a CPU with neither (or in a debug build).
    pub fn fastest() -> Self {
        fast_training_kernel().map_or(Products::Candle, Products::Packed)
    }
}

/// How an adapter is trained.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TrainSettings {
    pub epochs: usize,
    pub learning_rate: f64,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per training sequence (the document-start token included).
    pub seq_len: usize,
    /// Fixes the initial adapter and the order of the sequences.
    pub seed: Seed,
}

/// Everything that makes a set of adapters, recorded with each of them: the project's groups
/// are dealt into `folds` parts and each part gets the adapter trained on the others.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdapterSettings {
    pub folds: usize,
    pub lora: LoraShape,
    pub train: TrainSettings,
}

/// The model being adapted: the base model on the generic engine, and the LoRA pairs of its top
/// blocks.
pub struct AdaptModel {
    llama: Llama,
    lora: Lora,
    shape: LoraShape,
    /// What PEFT's config names as the base model.
    peft_name: String,
}

/// A step of training, for progress reports.
pub struct StepReport {
    pub step: usize,
    pub steps: usize,
    /// The pass over the sequences this step belongs to, from 1, of `epochs`.
    pub epoch: usize,
    pub epochs: usize,
    pub loss: f32,
}

/// What a training run did.
#[derive(Debug, Clone, Serialize)]
pub struct TrainReport {
    pub sequences: usize,
    pub tokens: usize,
    pub steps: usize,
    pub first_loss: f32,
    pub last_loss: f32,
    /// Seconds the training took (the held-out measure not included).
    pub seconds: f64,
    /// Mean next-token loss of the held-out sequences without the adapter, and with it.
    pub heldout_loss_base: f64,
    pub heldout_loss_adapted: f64,
}

impl AdaptModel {
    /// Reads a llama-family GGUF file, to adapt its top `shape.top_layers` blocks with
    /// `products`.
    pub fn load(
        path: &Path,
        shape: LoraShape,
        products: Products,
    ) -> Result<(Self, GgufTokenizer)> {
        let (content, tokenizer, mut file) = read_header(path)?;
        let cfg = LlamaConfig::from_gguf(&content)
            .with_context(|| format!("{} is not a usable llama model", path.display()))?;
        if cfg.arch != Arch::default() {
            bail!(
                "{}: adapters are trained for llama-family models only (this one is {})",
                path.display(),
                cfg.arch.family.architecture()
            );
        }
        if shape.rank == 0 || shape.top_layers == 0 || shape.top_layers > cfg.n_layer {
            bail!(
                "LoRA needs a rank ≥ 1 and 1 to {} top layers (got rank {}, {} layers)",
                cfg.n_layer,
                shape.rank,
                shape.top_layers
            );
        }
        let compute = Compute {
            cpu_kernels: false,
            ..Compute::cpu()
        };
        let mut llama = Llama::from_gguf(&content, &mut file, path, &compute, None)?;
        let first = cfg.n_layer - shape.top_layers;
        if let Products::Packed(kernel) = products {
            llama.convert_linears(|layer, linear| packed_form(layer, first, linear, kernel))?;
        }
        let lora = Lora {
            first,
            blocks: Vec::new(),
            scale: shape.alpha / shape.rank as f32,
        };
        let mut model = AdaptModel {
            llama,
            lora,
            shape,
            peft_name: peft_base_name(path),
        };
        model.fresh_adapter(Seed::default())?;
        Ok((model, tokenizer))
    }

    /// Starts a new adapter: A random (from `seed`), B zero, so that the adapted model starts as
    /// the base model.
    pub(crate) fn fresh_adapter(&mut self, seed: Seed) -> Result<()> {
        let mut rng = seed.rng();
        let cfg = &self.llama.cfg;
        self.lora.blocks = (0..self.shape.top_layers)
            .map(|_| new_pairs(cfg, self.shape.rank, &mut rng))
            .collect::<Result<_>>()?;
        Ok(())
    }

    /// Blocks that stay frozen (below the adapted ones).
    pub fn frozen_layers(&self) -> usize {
        self.first_adapted()
    }

    fn first_adapted(&self) -> usize {
        self.lora.first
    }

    /// The adapter as trained so far, under the GGUF names of the matrices it changes.
    pub(crate) fn adapter(&self) -> Adapter {
        let first = self.first_adapted();
        let mut updates = BTreeMap::new();
        for (i, pairs) in self.lora.blocks.iter().enumerate() {
            for (part, pair) in pairs {
                updates.insert(
                    format!("blk.{}.{part}.weight", first + i),
                    (pair.a.as_tensor().detach(), pair.b.as_tensor().detach()),
                );
            }
        }
        Adapter {
            scale: self.lora.scale,
            updates,
        }
    }

    /// What engines loading this model's adapters need to know of it.
    fn base_model(&self) -> BaseModel {
        BaseModel {
            architecture: self.llama.cfg.arch.family.architecture().to_string(),
            n_head: self.llama.cfg.n_head,
            n_kv_head: self.llama.cfg.n_kv_head,
            name: self.peft_name.clone(),
        }
    }

    /// Writes the adapter as trained so far into `folder`: afkit's own file `name` (what
    /// `generate` reads) and, before it, the formats inference engines load beside it:
    /// `STEM.peft/` (PEFT: transformers, vLLM's `--lora-modules`) and `STEM.lora.gguf`
    /// (llama.cpp's `--lora`). Each is written under a temporary name and then renamed, so a
    /// fold whose own file is there has all three.
    pub fn write_adapter(&self, folder: &Path, name: &str) -> Result<()> {
        let adapter = self.adapter();
        let base = self.base_model();
        let stem = name.trim_end_matches(".safetensors");
        let peft = folder.join(format!("{stem}.peft"));
        let partial = folder.join(format!("{stem}.peft.partial"));
        if partial.exists() {
            std::fs::remove_dir_all(&partial)?;
        }
        adapter.save_peft(&partial, &base)?;
        if peft.exists() {
            std::fs::remove_dir_all(&peft)?;
        }
        std::fs::rename(&partial, &peft)
            .with_context(|| format!("cannot move the PEFT adapter into {}", peft.display()))?;
        let gguf = folder.join(format!("{stem}.lora.gguf"));
        let partial = folder.join(format!("{stem}.lora.gguf.partial"));
        adapter.save_gguf(&partial, &base)?;
        std::fs::rename(&partial, &gguf)
            .with_context(|| format!("cannot move the GGUF adapter into {}", gguf.display()))?;
        let path = folder.join(name);
        let partial = folder.join(format!("{name}.partial"));
        adapter.save(&partial)?;
        std::fs::rename(&partial, &path)
            .with_context(|| format!("cannot move the adapter into {}", path.display()))
    }

    /// The frozen blocks' output for each sequence (all but its last token, which is only a
    /// target): the input of the first adapted block, computed once.
    pub fn frozen_states(&self, sequences: &[Vec<u32>]) -> Result<Vec<Tensor>> {
        let mut states = Vec::with_capacity(sequences.len());
        // Sequences of one length run together: bigger matrix products.
        for chunk in sequences.chunk_by(|a, b| a.len() == b.len()) {
            for batch in chunk.chunks(FROZEN_BATCH) {
                let ids: Vec<u32> = batch
                    .iter()
                    .flat_map(|s| s[..s.len() - 1].to_vec())
                    .collect();
                let steps = batch[0].len() - 1;
                let ids = Tensor::from_vec(ids, (batch.len() * steps,), &Device::Cpu)?;
                let x = self.llama.run_blocks(
                    self.llama.embed_tokens(&ids)?,
                    0..self.first_adapted(),
                    (batch.len(), steps),
                    Pass::Infer,
                    None,
                )?;
                let x = x.reshape((batch.len(), steps, self.llama.cfg.d_model))?;
                for row in 0..batch.len() {
                    states.push(x.narrow(0, row, 1)?.contiguous()?.detach());
                }
            }
        }
        Ok(states)
    }

    /// Mean next-token loss of `sequences` (whose frozen states are `states`), with the
    /// adapter (`adapted`) or without it (the base model).
    pub(crate) fn loss(
        &self,
        sequences: &[&Vec<u32>],
        states: &[&Tensor],
        adapted: bool,
        pass: Pass,
    ) -> Result<Tensor> {
        let x = Tensor::cat(states, 0)?;
        let (rows, steps, d) = x.dims3()?;
        let x = self.llama.run_blocks(
            x.reshape((rows * steps, d))?,
            self.first_adapted()..self.llama.cfg.n_layer,
            (rows, steps),
            pass,
            adapted.then_some(&self.lora),
        )?;
        let logits = self.llama.head_logits(&self.llama.final_norm(&x, pass)?)?;
        let targets: Vec<u32> = sequences
            .iter()
            .flat_map(|s| s[1..].iter().copied())
            .collect();
        let targets = Tensor::new(targets.as_slice(), &Device::Cpu)?.unsqueeze(1)?;
        let picked = log_softmax(&logits, D::Minus1)?.gather(&targets, 1)?;
        Ok(picked.mean_all()?.neg()?)
    }

    /// Trains a fresh adapter (its A drawn from `init`) on the `training` sequences (each
    /// `seq_len` tokens, starting with the document-start token) with their frozen states, by
    /// next-token prediction, then measures it on the `heldout` ones. `progress` hears of every
    /// step.
    pub fn train(
        &mut self,
        init: Seed,
        (sequences, states): (&[&Vec<u32>], &[&Tensor]),
        heldout: (&[Vec<u32>], &[Tensor]),
        settings: &TrainSettings,
        progress: &mut dyn FnMut(&StepReport),
    ) -> Result<TrainReport> {
        self.fresh_adapter(init)?;
        let started = Instant::now();
        let (steps, first_loss, last_loss) = self.fit(sequences, states, settings, progress)?;
        let seconds = started.elapsed().as_secs_f64();
        let (heldout_loss_base, heldout_loss_adapted) =
            self.evaluate(heldout.0, heldout.1, settings.batch)?;
        Ok(TrainReport {
            sequences: sequences.len(),
            tokens: sequences.iter().map(|s| s.len()).sum(),
            steps,
            first_loss,
            last_loss,
            seconds,
            heldout_loss_base,
            heldout_loss_adapted,
        })
    }

    /// Trains the LoRA pairs on `sequences`; returns the steps taken and the first and the last
    /// step's loss.
    fn fit(
        &mut self,
        sequences: &[&Vec<u32>],
        states: &[&Tensor],
        settings: &TrainSettings,
        progress: &mut dyn FnMut(&StepReport),
    ) -> Result<(usize, f32, f32)> {
        if sequences.is_empty() {
            bail!(
                "nothing to train on: the corpus has no sequence of {} tokens",
                settings.seq_len
            );
        }
        let mut optimizer = self.optimizer(settings.learning_rate)?;
        let batch = settings.batch.max(1);
        let steps = settings.epochs * sequences.len().div_ceil(batch);
        let mut rng = settings.seed.rng();
        let mut order: Vec<usize> = (0..sequences.len()).collect();
        let (mut first_loss, mut last_loss, mut step) = (f32::NAN, f32::NAN, 0);
        for epoch in 1..=settings.epochs {
            order.shuffle(&mut rng);
            for chunk in order.chunks(batch) {
                crate::interrupt::check()?;
                let seqs: Vec<&Vec<u32>> = chunk.iter().map(|&i| sequences[i]).collect();
                let st: Vec<&Tensor> = chunk.iter().map(|&i| states[i]).collect();
                let loss = self.loss(&seqs, &st, true, Pass::Train)?;
                optimizer.backward_step(&loss)?;
                last_loss = loss.to_scalar::<f32>()?;
                if step == 0 {
                    first_loss = last_loss;
                }
                step += 1;
                progress(&StepReport {
                    step,
                    steps,
                    epoch,
                    epochs: settings.epochs,
                    loss: last_loss,
                });
            }
        }
        Ok((steps, first_loss, last_loss))
    }

    /// AdamW without weight decay over every LoRA pair.
    fn optimizer(&self, learning_rate: f64) -> Result<AdamW> {
        let vars: Vec<Var> = self
            .lora
            .blocks
            .iter()
            .flat_map(|pairs| pairs.values())
            .flat_map(|p| [p.a.clone(), p.b.clone()])
            .collect();
        Ok(AdamW::new(
            vars,
            ParamsAdamW {
                lr: learning_rate,
                weight_decay: 0.0,
                ..Default::default()
            },
        )?)
    }

    /// Mean next-token loss over `sequences`, with and without the adapter: (base, adapted).
    pub(crate) fn evaluate(
        &self,
        sequences: &[Vec<u32>],
        states: &[Tensor],
        batch: usize,
    ) -> Result<(f64, f64)> {
        let (mut base, mut adapted, mut weight) = (0.0, 0.0, 0.0);
        let all: Vec<usize> = (0..sequences.len()).collect();
        for chunk in all.chunks(batch.max(1)) {
            let seqs: Vec<&Vec<u32>> = chunk.iter().map(|&i| &sequences[i]).collect();
            let st: Vec<&Tensor> = chunk.iter().map(|&i| &states[i]).collect();
            let n = chunk.len() as f64;
            let loss = |adapted| -> Result<f64> {
                let loss = self.loss(&seqs, &st, adapted, Pass::Infer)?;
                Ok(f64::from(loss.to_scalar::<f32>()?))
            };
            base += n * loss(false)?;
            adapted += n * loss(true)?;
            weight += n;
        }
        if weight == 0.0 {
            bail!("nothing to evaluate on");
        }
        Ok((base / weight, adapted / weight))
    }
}

/// Cuts the corpus's lines, in the given order, into training sequences of exactly `seq_len`
/// tokens: the document-start token, then the lines' tokens as one stream (each line ends with
/// a newline, as in a style primer). The stream's tail shorter than a sequence is dropped.
pub fn pack_sequences(
    tokenizer: &GgufTokenizer,
    lines: &[String],
    seq_len: usize,
) -> Result<Vec<Vec<u32>>> {
    if seq_len < 2 {
        bail!("a training sequence needs at least 2 tokens");
    }
    let mut stream = Vec::new();
    for line in lines {
        stream.extend(tokenizer.encode(&format!("{line}\n"))?);
    }
    Ok(stream
        .chunks_exact(seq_len - 1)
        .map(|chunk| {
            let mut seq = Vec::with_capacity(seq_len);
            seq.push(tokenizer.doc_start);
            seq.extend_from_slice(chunk);
            seq
        })
        .collect())
}

/// What PEFT's config names as the base model: the Hub id of the default generator, else the
/// GGUF file the adapters are trained on.
fn peft_base_name(model: &Path) -> String {
    if model == DefaultModel::smollm2_gguf() {
        SMOLLM2_HUB_ID.to_string()
    } else {
        model.display().to_string()
    }
}

/// The (out × in) shape of block matrix `part` (a GGUF name).
fn matrix_shape(cfg: &LlamaConfig, part: &str) -> (usize, usize) {
    let (d, hd) = (cfg.d_model, cfg.head_dim());
    match part {
        "attn_q" => (cfg.n_head * hd, d),
        "attn_k" | "attn_v" => (cfg.n_kv_head * hd, d),
        "attn_output" => (d, cfg.n_head * hd),
        "ffn_down" => (d, cfg.d_ff),
        _ => (cfg.d_ff, d),
    }
}

/// A block's fresh LoRA pairs: A random (drawn from `rng`, matrix by matrix in [`ADAPTED`]'s
/// order), B zero.
fn new_pairs(
    cfg: &LlamaConfig,
    rank: usize,
    rng: &mut ChaCha8Rng,
) -> Result<BTreeMap<&'static str, LoraPair>> {
    let mut pairs = BTreeMap::new();
    for part in ADAPTED {
        let (out, input) = matrix_shape(cfg, part);
        let normal = Normal::new(0.0, 1.0 / (input as f64).sqrt())?;
        let a: Vec<f32> = (0..rank * input)
            .map(|_| normal.sample(rng) as f32)
            .collect();
        let a = Var::from_tensor(&Tensor::from_vec(a, (rank, input), &Device::Cpu)?)?;
        let b = Var::zeros((out, rank), DType::F32, &Device::Cpu)?;
        pairs.insert(part, LoraPair { a, b });
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Compute;
    use crate::fixtures::{write_random_gguf, RANDOM_GGUF_VOCAB};
    use crate::lm::model::LanguageModel;

    fn tiny_model(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("tiny.gguf");
        let cfg = LlamaConfig {
            vocab: RANDOM_GGUF_VOCAB,
            d_model: 64,
            n_layer: 3,
            n_head: 4,
            n_kv_head: 2,
            d_ff: 128,
            rope_theta: 10_000.0,
            rms_eps: 1e-5,
            arch: Default::default(),
        };
        write_random_gguf(&path, &cfg, Seed::new(5)).unwrap();
        path
    }

    const SHAPE: LoraShape = LoraShape {
        rank: 4,
        alpha: 8.0,
        top_layers: 2,
    };

    /// Mean next-token loss of `seq` under the decoding engine (the model `generate` loads).
    fn engine_loss(model: &LanguageModel, seq: &[u32]) -> f64 {
        let (_, logprobs) = model.llama.prefill(seq).unwrap();
        -logprobs.iter().map(|&l| f64::from(l)).sum::<f64>() / logprobs.len() as f64
    }

    #[test]
    fn training_lowers_the_loss_and_the_merged_model_scores_as_the_trained_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = tiny_model(dir.path());
        let (mut model, tokenizer) = AdaptModel::load(&path, SHAPE, Products::Candle).unwrap();
        let lines: Vec<String> = (0..40)
            .map(|i| format!("the man throws the ball {}.", ["far", "high"][i % 2]))
            .collect();
        let seqs = pack_sequences(&tokenizer, &lines, 24).unwrap();
        assert!(seqs.len() >= 8 && seqs.iter().all(|s| s.len() == 24));
        let states = model.frozen_states(&seqs).unwrap();
        let settings = TrainSettings {
            epochs: 6,
            learning_rate: 1e-2,
            batch: 4,
            seq_len: 24,
            seed: Seed::new(3),
        };
        let (refs, state_refs): (Vec<_>, Vec<_>) = seqs.iter().zip(&states).unzip();
        let mut reported = Vec::new();
        let report = model
            .train(
                Seed::default(),
                (&refs, &state_refs),
                (&seqs, &states),
                &settings,
                &mut |step| reported.push((step.epoch, step.epochs)),
            )
            .unwrap();
        assert_eq!(reported.len(), report.steps);
        let per_epoch = seqs.len().div_ceil(settings.batch);
        let expected: Vec<_> = (1..=settings.epochs)
            .flat_map(|e| std::iter::repeat_n((e, settings.epochs), per_epoch))
            .collect();
        assert_eq!(reported, expected, "each step reports its epoch");
        assert!(report.last_loss < 0.8 * report.first_loss, "{report:?}");
        let (base, adapted) = (report.heldout_loss_base, report.heldout_loss_adapted);
        assert!(adapted < base - 0.5, "base {base}, adapted {adapted}");

        // The adapter, saved and merged into the weights at load time, gives the decoding
        // engine exactly the trained model, and the base model without it.
        let file = dir.path().join("fold.safetensors");
        model.adapter().save(&file).unwrap();
        let adapter = Adapter::load(&file).unwrap();
        for compute in [
            Compute::cpu_f32(),
            Compute {
                cpu_kernels: false,
                ..Compute::cpu()
            },
        ] {
            let merged = LanguageModel::load_adapted(&path, &compute, Some(&adapter)).unwrap();
            let plain = LanguageModel::load_on(&path, &compute).unwrap();
            let (b, a) = model.evaluate(&seqs[..1], &states[..1], 1).unwrap();
            assert!((engine_loss(&merged, &seqs[0]) - a).abs() < 1e-3);
            assert!((engine_loss(&plain, &seqs[0]) - b).abs() < 1e-3);
        }
    }

    #[test]
    fn a_fresh_adapter_leaves_the_model_unchanged_and_the_seed_fixes_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = tiny_model(dir.path());
        let (mut model, tokenizer) = AdaptModel::load(&path, SHAPE, Products::Candle).unwrap();
        let seqs = pack_sequences(&tokenizer, &["a dog runs on the grass.".into()], 8).unwrap();
        let states = model.frozen_states(&seqs).unwrap();
        let (base, adapted) = model.evaluate(&seqs, &states, 1).unwrap();
        assert!((base - adapted).abs() < 1e-6);
        // Training's differentiable ops compute what the fused kernels compute.
        let loss = |pass| {
            let l = model.loss(&[&seqs[0]], &[&states[0]], true, pass).unwrap();
            l.to_scalar::<f32>().unwrap()
        };
        assert!((loss(Pass::Train) - loss(Pass::Infer)).abs() < 1e-4);
        let a0 = model.adapter().updates["blk.2.attn_q.weight"]
            .0
            .to_vec2::<f32>()
            .unwrap();
        model.fresh_adapter(Seed::new(0)).unwrap();
        let again = model.adapter().updates["blk.2.attn_q.weight"]
            .0
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(a0, again);
        model.fresh_adapter(Seed::new(1)).unwrap();
        let other = model.adapter().updates["blk.2.attn_q.weight"]
            .0
            .to_vec2::<f32>()
            .unwrap();
        assert_ne!(a0, other);
        assert_eq!(model.adapter().updates.len(), 2 * ADAPTED.len());
    }

    /// With every weight product on afkit's kernels (the frozen blocks', the adapted ones'
    /// forward and backward, the output head's) an adapter trains as it does with candle's f32
    /// matmul, up to bf16 rounding on a bf16 kernel and to the order of f32 sums on an f32 one.
    #[test]
    fn packed_products_train_the_adapter_as_candles_do_up_to_rounding() {
        let dir = tempfile::tempdir().unwrap();
        let path = tiny_model(dir.path());
        let lines: Vec<String> = (0..40)
            .map(|i| format!("the woman kicks the ball {}.", ["low", "hard"][i % 2]))
            .collect();
        let settings = TrainSettings {
            epochs: 6,
            learning_rate: 1e-2,
            batch: 4,
            seq_len: 24,
            seed: Seed::new(4),
        };
        let train = |products| {
            let (mut model, tokenizer) = AdaptModel::load(&path, SHAPE, products).unwrap();
            let seqs = pack_sequences(&tokenizer, &lines, 24).unwrap();
            let states = model.frozen_states(&seqs).unwrap();
            let (refs, state_refs): (Vec<_>, Vec<_>) = seqs.iter().zip(&states).unzip();
            let training = (refs.as_slice(), state_refs.as_slice());
            let heldout = (seqs.as_slice(), states.as_slice());
            model
                .train(Seed::default(), training, heldout, &settings, &mut |_| {})
                .unwrap()
        };
        let f32 = train(Products::Candle);
        let near = |a: f64, b: f64, tolerance: f64| (a - b).abs() <= tolerance * b.abs();
        for kernel in crate::lm::linear::trainable::tests::bf16_kernels() {
            let bf16 = train(Products::Packed(kernel));
            let why = format!("{kernel:?}: {bf16:?} against f32's {f32:?}");
            assert_ne!(bf16.first_loss, f32.first_loss, "{why}");
            let first = (f64::from(bf16.first_loss), f64::from(f32.first_loss));
            assert!(near(first.0, first.1, 5e-3), "{why}");
            assert!(
                near(bf16.heldout_loss_base, f32.heldout_loss_base, 5e-3),
                "{why}"
            );
            let adapted = (bf16.heldout_loss_adapted, f32.heldout_loss_adapted);
            assert!(near(adapted.0, adapted.1, 0.05), "{why}");
            assert!(adapted.0 < bf16.heldout_loss_base - 0.5, "{why}");
        }
        // On the f32 kernels only the order of the additions differs from candle's.
        for kernel in crate::lm::linear::trainable::tests::f32_kernels() {
            let packed = train(Products::Packed(kernel));
            let why = format!("{kernel:?}: {packed:?} against candle's {f32:?}");
            let first = (f64::from(packed.first_loss), f64::from(f32.first_loss));
            assert!(near(first.0, first.1, 1e-5), "{why}");
            let adapted = (packed.heldout_loss_adapted, f32.heldout_loss_adapted);
            assert!(near(adapted.0, adapted.1, 1e-3), "{why}");
        }
    }
}
