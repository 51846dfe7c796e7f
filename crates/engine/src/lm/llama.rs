//! A decoder of the llama shape: token embeddings, a stack of [`super::block`]'s decoder blocks
//! (RMSNorm, rotary embeddings, grouped-query attention, a gated feed-forward), a final norm and
//! the output head, over f32 weights dequantised from a GGUF file at load time, with the parts
//! the Qwen 2, Qwen 3 and Gemma 3 families add ([`super::family`]) switched on by the file's
//! architecture. (`Llama` and `LlamaConfig` keep their names: every family is this one model.)
//!
//! Why not candle-transformers' `quantized_llama`: generation here decodes a batch of B rows that
//! all continue one context. The context's keys and values are computed once (the *prefix*) and
//! shared by every row; each row only caches the tokens it generated itself. Attention therefore
//! has two parts — queries against the shared prefix (one GEMM for the whole batch) and queries
//! against the row's own tokens — joined in one softmax. With f32 weights every projection of
//! the batch is one GEMM, which candle runs far faster on CPU than its quantised matmul.
//!
//! Rotary layout: llama.cpp's converter permutes the Q and K weights of `llama` GGUF files so
//! that rotary pairs are adjacent (interleaved), hence `rope_i`; the other families keep pairs
//! half a head apart (`rope`).
//!
//! Two engines ([`crate::device`]) run the same blocks through two sets of kernels. With afkit's
//! CPU kernels, the weights are packed for its GEMM, the gated activation is one pass over host
//! memory and [`Llama::slot_forward`] runs rows of any contexts and lengths packed end to end
//! with per-row attention ([`super::packed`]): the decode step of continuous batching, and the
//! scoring of continuations. The generic engine keeps every tensor on the model's device and
//! uses candle ops only ([`super::tensor_ops`]): [`Llama::prefill`], [`Llama::forward`] (which
//! also decodes a batch of rows of one context in lockstep) and the scoring functions run on any
//! device. LoRA training ([`super::adapt`]) runs the generic engine's blocks with gradients.

use std::io::{Read, Seek};
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::Content;
use candle_core::{Device, Tensor, D};
use rayon::prelude::*;

use super::adapter::Adapter;
use super::block::{load_block, Block, Lora, Rope, Vector};
use super::cache::{Prefix, RowCache, SlotCache, SlotRow};
use super::config::{LlamaConfig, MAX_POSITIONS};
use super::linear::{packed_kernel, Kernel, Linear, Precision};
use super::packed::{rms_norm_plain, PackedKernels};
use super::tensor_ops::{Pass, TensorKernels};
use crate::device::Compute;

/// Rows whose output-head logits are held at once when scoring (256 × 49k vocabulary: 50 MB).
const HEAD_CHUNK: usize = 256;

pub(crate) struct Llama {
    pub cfg: LlamaConfig,
    /// Where every tensor of the model lives.
    device: Device,
    /// afkit's CPU kernels run the model (see the module doc).
    cpu_kernels: bool,
    embed: Tensor,
    /// The output head, transposed (d_model × vocab); the embedding matrix when tied.
    head: Linear,
    blocks: Vec<Block>,
    final_norm: Vector,
    /// The model's rotary table, then the local layers' (when their base differs).
    ropes: Vec<Rope>,
    /// The f32 kernel tokens that share a prompt attend to it with, where afkit's CPU kernels
    /// run and this CPU has one (see [`super::packed`]); chosen with the weights' kernels.
    prefix_kernel: Option<Kernel>,
}

/// A weight dequantised to f32 on the CPU (the same values on every device), then moved to
/// `device`.
fn dequantised<R: Read + Seek>(
    content: &Content,
    file: &mut R,
    name: &str,
    device: &Device,
) -> Result<Tensor> {
    let q = content
        .tensor(file, name, &Device::Cpu)
        .with_context(|| format!("cannot read tensor `{name}`"))?;
    Ok(q.dequantize(&Device::Cpu)?.to_device(device)?)
}

impl Llama {
    /// Reads the weights of a GGUF file of one of the engine's families (`content` is its parsed header) onto
    /// `compute`'s device.
    /// With an `adapter`, the matrices it changes are loaded with its update added.
    pub(crate) fn from_gguf<R: Read + Seek>(
        content: &Content,
        file: &mut R,
        path: &Path,
        compute: &Compute,
        adapter: Option<&Adapter>,
    ) -> Result<Self> {
        let cfg = LlamaConfig::from_gguf(content)
            .with_context(|| format!("{} is not a usable llama model", path.display()))?;
        let mut load = |name: &str| -> Result<Tensor> {
            let w = dequantised(content, file, name, &Device::Cpu)?;
            let w = match adapter.map(|a| a.delta(name)).transpose()?.flatten() {
                Some(delta) => (w + delta)?,
                None => w,
            };
            Ok(w.to_device(&compute.device)?)
        };
        let embed = load("token_embd.weight")?;
        let head = match content.tensor_infos.contains_key("output.weight") {
            true => Linear::fastest(load("output.weight")?.t()?, compute)?,
            false => Linear::fastest(embed.t()?, compute)?,
        };
        let blocks = (0..cfg.n_layer)
            .map(|i| load_block(&cfg, i, compute, &mut load))
            .collect::<Result<Vec<_>>>()?;
        let final_norm = Vector::new(load("output_norm.weight")?)?;
        let mut ropes = vec![Rope::new(cfg.head_dim(), cfg.rope_theta, &compute.device)?];
        if let Some(local) = &cfg.arch.local_layers {
            ropes.push(Rope::new(
                cfg.head_dim(),
                local.rope_theta,
                &compute.device,
            )?);
        }
        Ok(Llama {
            cfg,
            device: compute.device.clone(),
            cpu_kernels: compute.cpu_kernels,
            embed,
            head,
            blocks,
            final_norm,
            ropes,
            prefix_kernel: packed_kernel(Precision::F32).filter(|_| compute.cpu_kernels),
        })
    }

    /// Replaces each weight matrix with `convert`'s form of it, given the block's layer (`None`
    /// for the output head) and the matrix as it is.
    pub(crate) fn convert_linears(
        &mut self,
        mut convert: impl FnMut(Option<usize>, &Linear) -> Result<Linear>,
    ) -> Result<()> {
        self.head = convert(None, &self.head)?;
        for block in &mut self.blocks {
            let layer = block.layer;
            let projections = [
                &mut block.wqkv,
                &mut block.wo,
                &mut block.w_gate_up,
                &mut block.w_down,
            ];
            for projection in projections {
                projection.w = convert(Some(layer), &projection.w)?;
            }
        }
        Ok(())
    }

    /// Whether afkit's CPU kernels run the model (else the generic engine, on any device).
    pub(crate) fn cpu_kernels(&self) -> bool {
        self.cpu_kernels
    }

    /// Runs a whole token sequence from position 0 and keeps its keys and values as a prefix.
    /// Also returns the log-probability of each token after the first, given those before it.
    pub(crate) fn prefill(&self, ids: &[u32]) -> Result<(Prefix, Vec<f32>)> {
        let (prefix, hidden) = self.prefix_and_states(ids)?;
        let token_logprobs = if ids.len() > 1 {
            self.target_logprobs(&hidden.narrow(0, 0, ids.len() - 1)?, &ids[1..])?
        } else {
            Vec::new()
        };
        Ok((prefix, token_logprobs))
    }

    /// [`Self::prefill`] without the tokens' log-probabilities, which take the output head at
    /// every position: a prompt that is only continued needs the head at its last one.
    pub(crate) fn prefix(&self, ids: &[u32]) -> Result<Prefix> {
        Ok(self.prefix_and_states(ids)?.0)
    }

    /// The prefix of `ids` and the hidden states of all its positions.
    fn prefix_and_states(&self, ids: &[u32]) -> Result<(Prefix, Tensor)> {
        if ids.is_empty() {
            bail!("cannot run the model on an empty token sequence");
        }
        if ids.len() >= MAX_POSITIONS {
            bail!(
                "sequence of {} tokens is longer than {MAX_POSITIONS}",
                ids.len()
            );
        }
        let input = Tensor::new(ids, &self.device)?.reshape((1, ids.len()))?;
        let mut cache = RowCache::default();
        let hidden = self.forward(&input, None, &mut cache)?.squeeze(0)?;
        let last = hidden.narrow(0, ids.len() - 1, 1)?;
        let next_logprobs = self.log_softmax_rows(&last)?.remove(0);
        let kv: Vec<(Tensor, Tensor)> = cache
            .kv
            .into_iter()
            .map(|(k, v)| Ok((k.squeeze(0)?, v.squeeze(0)?)))
            .collect::<Result<_>>()?;
        let raw_kv = if self.cpu_kernels {
            kv.iter()
                .map(|(k, v)| {
                    Ok((
                        k.transpose(1, 2)?.flatten_all()?.to_vec1()?,
                        v.flatten_all()?.to_vec1()?,
                    ))
                })
                .collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        let packed_kv = raw_kv.iter().map(|_| OnceLock::new()).collect();
        let prefix = Prefix {
            kv,
            raw_kv,
            packed_kv,
            len: ids.len(),
            next_logprobs,
        };
        Ok((prefix, hidden))
    }

    /// The model's hidden states (after the final norm) for `ids` (rows × tokens), which
    /// continue `prefix` (if any) and the rows' own cache; appends the new keys and values to
    /// `cache`. Every row is at the same position: rows are right-padded, and padding only ever
    /// follows a row's real tokens, which causal attention keeps from looking at it.
    pub(crate) fn forward(
        &self,
        ids: &Tensor,
        prefix: Option<&Prefix>,
        cache: &mut RowCache,
    ) -> Result<Tensor> {
        let (rows, steps) = ids.dims2()?;
        let start = prefix.map_or(0, |p| p.len) + cache.len;
        if start + steps > MAX_POSITIONS {
            bail!("sequence longer than {MAX_POSITIONS} tokens");
        }
        let x = self.embed_tokens(&ids.flatten_all()?)?;
        let mut kernels = TensorKernels {
            cfg: &self.cfg,
            ropes: &self.ropes,
            pass: Pass::Infer,
            cpu_kernels: self.cpu_kernels,
            lora: None,
            rows,
            steps,
            prefix,
            cache: Some(cache),
        };
        let x = self
            .blocks
            .iter()
            .try_fold(x, |x, block| block.forward(x, &mut kernels))?;
        cache.len += steps;
        self.final_norm(&x, Pass::Infer)?
            .reshape((rows, steps, self.cfg.d_model))
            .map_err(Into::into)
    }

    /// The embeddings of `ids` (tokens × d_model), scaled as the family scales them.
    pub(crate) fn embed_tokens(&self, ids: &Tensor) -> Result<Tensor> {
        let x = self.embed.index_select(ids, 0)?;
        match self.cfg.arch.embed_scale(self.cfg.d_model) {
            1.0 => Ok(x),
            scale => Ok((x * f64::from(scale))?),
        }
    }

    /// Blocks `layers` over `x` (rows·steps × d_model): `rows` rows of `steps` tokens each from
    /// position 0, nothing cached. LoRA training's pass: with `lora`'s updates when given and,
    /// under [`Pass::Train`], ops that have gradients.
    pub(crate) fn run_blocks(
        &self,
        x: Tensor,
        layers: std::ops::Range<usize>,
        (rows, steps): (usize, usize),
        pass: Pass,
        lora: Option<&Lora>,
    ) -> Result<Tensor> {
        let mut kernels = TensorKernels {
            cfg: &self.cfg,
            ropes: &self.ropes,
            pass,
            cpu_kernels: self.cpu_kernels,
            lora,
            rows,
            steps,
            prefix: None,
            cache: None,
        };
        self.blocks[layers]
            .iter()
            .try_fold(x, |x, block| block.forward(x, &mut kernels))
    }

    /// The final norm of hidden states `x`.
    pub(crate) fn final_norm(&self, x: &Tensor, pass: Pass) -> Result<Tensor> {
        pass.rms_norm(x, &self.final_norm.weight, self.cfg.rms_eps)
    }

    /// The output head's logits for each row of `x` (n × d_model), as a tensor.
    pub(crate) fn head_logits(&self, x: &Tensor) -> Result<Tensor> {
        self.head.forward(x)
    }

    /// One step of the generic engine's lockstep decode: `tokens[i]` continues row i of `cache`,
    /// every row at the same position after `prefix`. Returns each row's logits as plain rows
    /// (rows × vocab) for the sampler.
    pub(crate) fn step_lockstep(
        &self,
        tokens: &[u32],
        prefix: &Prefix,
        cache: &mut RowCache,
    ) -> Result<Vec<f32>> {
        let rows = tokens.len();
        let ids = Tensor::from_slice(tokens, (rows, 1), &self.device)?;
        let hidden = self
            .forward(&ids, Some(prefix), cache)?
            .reshape((rows, self.cfg.d_model))?;
        self.head.forward_rows(&hidden)
    }

    /// The packed forward pass of afkit's CPU kernels: each row feeds its `tokens` at its own
    /// positions `position..` after its prefix, all rows' tokens laid end to end (no padding),
    /// one GEMM per projection over all of them. Each token's key and value go into its row's
    /// slot of `cache`; attention runs per token over its row's prefix and the row's own tokens
    /// up to it, so rows of any context, length and age share the pass. A decode step of
    /// continuous batching is the case of one token per row; scoring continuations feeds each
    /// whole continuation at once. Returns hidden states as plain rows (tokens × d_model, in the
    /// rows' order) after the final norm.
    pub(crate) fn slot_forward(&self, rows: &[SlotRow], cache: &mut SlotCache) -> Result<Vec<f32>> {
        if !self.cpu_kernels {
            bail!("the packed forward pass runs with afkit's CPU kernels only");
        }
        let c = &self.cfg;
        if let Some(r) = rows
            .iter()
            .find(|r| r.position + r.tokens.len() > cache.max_len || r.slot >= cache.slots)
        {
            bail!(
                "row of {} tokens from own position {} in slot {} is outside the cache ({} slots \
                 × {} tokens)",
                r.tokens.len(),
                r.position,
                r.slot,
                cache.slots,
                cache.max_len
            );
        }
        // Each fed token: its row and its own position.
        let fed: Vec<(&SlotRow, usize)> = rows
            .iter()
            .flat_map(|r| (0..r.tokens.len()).map(move |j| (r, r.position + j)))
            .collect();
        let ids: Vec<u32> = rows.iter().flat_map(|r| r.tokens.iter().copied()).collect();
        let mut x: Vec<f32> = self
            .embed
            .index_select(&Tensor::new(ids, &Device::Cpu)?, 0)?
            .flatten_all()?
            .to_vec1()?;
        let embed_scale = c.arch.embed_scale(c.d_model);
        if embed_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= embed_scale);
        }
        let mut kernels = PackedKernels {
            cfg: c,
            ropes: &self.ropes,
            fed: &fed,
            cache,
            prefix_kernel: self.prefix_kernel,
        };
        let x = self
            .blocks
            .iter()
            .try_fold(x, |x, block| block.forward(x, &mut kernels))?;
        Ok(rms_norm_plain(&x, &self.final_norm.plain, c.rms_eps))
    }

    /// Log-softmax over the vocabulary for each row of `hidden` (n × d_model).
    pub(crate) fn log_softmax_rows(&self, hidden: &Tensor) -> Result<Vec<Vec<f32>>> {
        let logits = self.head.forward(hidden)?;
        Ok(candle_nn::ops::log_softmax(&logits, D::Minus1)?.to_vec2()?)
    }

    /// Raw logits for each row of `hidden` (plain rows, n × d_model), as plain rows (n × vocab).
    pub(crate) fn logits(&self, hidden: &[f32]) -> Result<Vec<f32>> {
        self.head.apply(hidden, hidden.len() / self.cfg.d_model)
    }

    /// `log p(targets[i] | hidden[i])` for each row, computing the output head in chunks so
    /// that a long batch never holds all its logits at once. With afkit's CPU kernels the
    /// log-normaliser is summed as the sampler sums it, so a scored ending's log-probs are the
    /// ones recorded while sampling it; elsewhere candle's log-softmax runs on the device.
    pub(crate) fn target_logprobs(&self, hidden: &Tensor, targets: &[u32]) -> Result<Vec<f32>> {
        let n = hidden.dim(0)?;
        if n != targets.len() {
            bail!("{n} hidden states for {} targets", targets.len());
        }
        if self.cpu_kernels {
            return self.target_logprobs_plain(&hidden.flatten_all()?.to_vec1()?, targets);
        }
        let mut out = Vec::with_capacity(n);
        for start in (0..n).step_by(HEAD_CHUNK) {
            let len = HEAD_CHUNK.min(n - start);
            let logits = self.head.forward(&hidden.narrow(0, start, len)?)?;
            let lsm = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
            let idx = Tensor::new(&targets[start..start + len], &self.device)?.reshape((len, 1))?;
            out.extend(lsm.gather(&idx, 1)?.flatten_all()?.to_vec1::<f32>()?);
        }
        Ok(out)
    }

    /// [`Llama::target_logprobs`] for hidden states as plain rows (afkit's CPU kernels): one pass
    /// per row for the log-normaliser, as the sampler takes it.
    fn target_logprobs_plain(&self, hidden: &[f32], targets: &[u32]) -> Result<Vec<f32>> {
        let (d, vocab) = (self.cfg.d_model, self.cfg.vocab);
        if hidden.len() != targets.len() * d {
            bail!(
                "{} hidden values for {} targets",
                hidden.len(),
                targets.len()
            );
        }
        let mut out = Vec::with_capacity(targets.len());
        for (hidden, targets) in hidden
            .chunks(HEAD_CHUNK * d)
            .zip(targets.chunks(HEAD_CHUNK))
        {
            let logits = self.head.apply(hidden, targets.len())?;
            out.par_extend(logits.par_chunks(vocab).zip(targets).map(|(row, &t)| {
                let max = crate::simd::max(row);
                let log_z = crate::simd::sum_exp_shifted(row, max, None).ln();
                row[t as usize] - max - log_z as f32
            }));
        }
        Ok(out)
    }

    /// Per-token log-probabilities of each sequence in `seqs` as a continuation of `prefix`:
    /// `result[r][j] = log p(seqs[r][j] | prefix, seqs[r][..j])`. Rows run as one batch: packed
    /// end to end with afkit's CPU kernels, else right-padded to the longest.
    pub(crate) fn score_continuations(
        &self,
        prefix: &Prefix,
        seqs: &[Vec<u32>],
    ) -> Result<Vec<Vec<f32>>> {
        let longest = seqs.iter().map(Vec::len).max().unwrap_or(0);
        let mut out: Vec<Vec<f32>> = seqs
            .iter()
            .map(|s| {
                s.first()
                    .map(|&t| vec![prefix.next_logprobs[t as usize]])
                    .unwrap_or_default()
            })
            .collect();
        if longest < 2 {
            return Ok(out);
        }
        // Every token but the last is fed; the hidden state after it predicts the next one.
        let targets: Vec<u32> = seqs
            .iter()
            .flat_map(|s| s.iter().skip(1).copied())
            .collect();
        let lps = if self.cpu_kernels {
            self.target_logprobs_plain(&self.packed_continuations(prefix, seqs)?, &targets)?
        } else {
            self.target_logprobs(&self.padded_continuations(prefix, seqs)?, &targets)?
        };
        let mut lps = lps.into_iter();
        for (r, s) in seqs.iter().enumerate() {
            out[r].extend(lps.by_ref().take(s.len().saturating_sub(1)));
        }
        Ok(out)
    }

    /// Hidden states of every fed token of `seqs` (all but each one's last), in order, as plain
    /// rows from one [`Llama::slot_forward`] with a slot per sequence.
    fn packed_continuations(&self, prefix: &Prefix, seqs: &[Vec<u32>]) -> Result<Vec<f32>> {
        let fed = |s: &[u32]| s.len().saturating_sub(1);
        let longest = seqs.iter().map(|s| fed(s)).max().unwrap_or(0);
        let mut cache = SlotCache::new(&self.cfg, seqs.len(), longest);
        let rows: Vec<SlotRow> = seqs
            .iter()
            .enumerate()
            .map(|(slot, s)| SlotRow {
                slot,
                prefix,
                position: 0,
                tokens: &s[..fed(s)],
            })
            .collect();
        self.slot_forward(&rows, &mut cache)
    }

    /// Hidden states of every fed token of `seqs` (all but each one's last), in order, from one
    /// [`Llama::forward`] over the rows right-padded to the longest.
    fn padded_continuations(&self, prefix: &Prefix, seqs: &[Vec<u32>]) -> Result<Tensor> {
        let steps = seqs
            .iter()
            .map(Vec::len)
            .max()
            .unwrap_or(0)
            .saturating_sub(1);
        // Padded with token 0, never attended to by real tokens.
        let mut ids = vec![0u32; seqs.len() * steps];
        for (r, s) in seqs.iter().enumerate() {
            for (j, &t) in s.iter().take(steps).enumerate() {
                ids[r * steps + j] = t;
            }
        }
        let input = Tensor::from_vec(ids, (seqs.len(), steps), &self.device)?;
        let hidden = self
            .forward(&input, Some(prefix), &mut RowCache::default())?
            .reshape((seqs.len() * steps, self.cfg.d_model))?;
        let positions: Vec<u32> = seqs
            .iter()
            .enumerate()
            .flat_map(|(r, s)| (0..s.len().saturating_sub(1)).map(move |j| (r * steps + j) as u32))
            .collect();
        Ok(hidden.index_select(&Tensor::new(positions.as_slice(), &self.device)?, 0)?)
    }
}
