//! A llama-family decoder (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU) over f32
//! weights dequantised from a GGUF file at load time.
//!
//! Why not candle-transformers' `quantized_llama`: generation here decodes a batch of B rows that
//! all continue one context. The context's keys and values are computed once (the *prefix*) and
//! shared by every row; each row only caches the tokens it generated itself. Attention therefore
//! has two parts — queries against the shared prefix (one GEMM for the whole batch) and queries
//! against the row's own tokens — joined in one softmax. With f32 weights every projection of
//! the batch is one GEMM, which candle runs far faster on CPU than its quantised matmul.
//!
//! Rotary layout: llama.cpp's converter permutes the Q and K weights of `llama` GGUF files so
//! that rotary pairs are adjacent (interleaved), hence `rope_i`.
//!
//! Two engines ([`crate::device`]): with afkit's CPU kernels, the weights are packed for its
//! GEMM, SwiGLU is one pass over host memory and [`Llama::slot_forward`] runs rows of any
//! contexts and lengths packed end to end with per-row attention: the decode step of continuous
//! batching, and the scoring of continuations. The generic engine keeps every tensor on the model's device
//! and uses candle ops only: [`Llama::prefill`], [`Llama::forward`] (which also decodes a batch
//! of rows of one context in lockstep) and the scoring functions run on any device.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{DType, Device, Tensor, D};
use candle_nn::ops::{rms_norm, softmax_last_dim};
use candle_nn::rotary_emb::rope_i;
use rayon::prelude::*;

use super::adapt::Adapter;
use super::linear::Linear;
use crate::device::Compute;
use crate::simd::{axpy_lanes, dot_lanes, exp_lanes};

/// Rows whose output-head logits are held at once when scoring (256 × 49k vocabulary: 50 MB).
const HEAD_CHUNK: usize = 256;

/// Longest sequence (context + ending) the rotary tables cover.
pub const MAX_POSITIONS: usize = 4096;

#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub vocab: usize,
    pub d_model: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub d_ff: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
}

impl LlamaConfig {
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_head
    }

    /// Multiply-adds ×2 of one token's forward pass through the weight matrices (attention
    /// scores excluded): the yardstick for GFLOP/s figures.
    pub fn flops_per_token(&self) -> f64 {
        let hd = self.head_dim();
        let qkv = self.d_model * (self.n_head + 2 * self.n_kv_head) * hd;
        let per_layer = qkv + self.d_model * self.d_model + 3 * self.d_model * self.d_ff;
        2.0 * (self.n_layer * per_layer + self.d_model * self.vocab) as f64
    }

    pub(super) fn from_gguf(content: &Content) -> Result<Self> {
        let arch = content
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .map(String::as_str)
            .unwrap_or("llama");
        if arch != "llama" {
            bail!("architecture `{arch}` is not supported: afkit runs llama-family GGUF models (general.architecture = llama)");
        }
        let get = |key: &str| -> Result<&Value> {
            content
                .metadata
                .get(&format!("llama.{key}"))
                .with_context(|| format!("the GGUF metadata has no `llama.{key}`"))
        };
        let u = |key: &str| -> Result<usize> { Ok(get(key)?.to_u32()? as usize) };
        if let Some(kind) = content.metadata.get("llama.rope.scaling.type") {
            let kind = kind.to_string()?;
            if kind != "none" {
                bail!("rope scaling `{kind}` is not supported");
            }
        }
        if content.tensor_infos.contains_key("rope_freqs.weight") {
            bail!("rope frequency factors (rope_freqs.weight, Llama 3.1 style) are not supported");
        }
        let d_model = u("embedding_length")?;
        let n_head = u("attention.head_count")?;
        let cfg = LlamaConfig {
            vocab: content
                .tensor_infos
                .get("token_embd.weight")
                .context("the GGUF has no token_embd.weight tensor")?
                .shape
                .dims()[0],
            d_model,
            n_layer: u("block_count")?,
            n_head,
            n_kv_head: u("attention.head_count_kv").unwrap_or(n_head),
            d_ff: u("feed_forward_length")?,
            rope_theta: get("rope.freq_base")
                .and_then(|v| Ok(v.to_f32()?))
                .unwrap_or(10_000.0),
            rms_eps: get("attention.layer_norm_rms_epsilon")?.to_f32()?,
        };
        if let Ok(rope_dim) = u("rope.dimension_count") {
            if rope_dim != cfg.head_dim() {
                bail!(
                    "partial rotary embeddings ({rope_dim} of {} dims) are not supported",
                    cfg.head_dim()
                );
            }
        }
        if n_head % cfg.n_kv_head != 0 {
            bail!(
                "{n_head} query heads cannot share {} key/value heads",
                cfg.n_kv_head
            );
        }
        Ok(cfg)
    }
}

/// An RMS norm's weight, on the model's device and as plain values for the packed pass (read
/// once at load, not on every step).
struct Norm {
    weight: Tensor,
    plain: Vec<f32>,
}

impl Norm {
    fn new(weight: Tensor) -> Result<Self> {
        let plain = weight.to_vec1()?;
        Ok(Norm { weight, plain })
    }
}

/// One decoder block. Projection matrices are stored transposed (in × out) so that `x.matmul(w)`
/// maps a (tokens × in) activation; Q, K and V share one matrix, as do the gate and up
/// projections, so each is a single GEMM.
struct Block {
    attn_norm: Norm,
    wqkv: Linear,
    wo: Linear,
    ffn_norm: Norm,
    w_gate_up: Linear,
    w_down: Linear,
}

pub struct Llama {
    pub cfg: LlamaConfig,
    /// Where every tensor of the model lives.
    device: Device,
    /// afkit's CPU kernels run the model (see the module doc).
    cpu_kernels: bool,
    embed: Tensor,
    /// The output head, transposed (d_model × vocab); the embedding matrix when tied.
    head: Linear,
    blocks: Vec<Block>,
    final_norm: Norm,
    cos: Tensor,
    sin: Tensor,
    /// `cos`/`sin` as plain rows (position × head_dim/2), for the packed pass.
    cos_raw: Vec<f32>,
    sin_raw: Vec<f32>,
}

/// Keys and values of a context, shared by every row decoded after it: per layer
/// (kv_heads × len × head_dim).
pub struct Prefix {
    kv: Vec<(Tensor, Tensor)>,
    /// The same keys, transposed (kv_heads × head_dim × len), and values (kv_heads × len ×
    /// head_dim) as plain rows, for the packed pass: with keys transposed, a query's scores
    /// against the whole prefix are a sum of scaled key rows (vertical vector arithmetic, no
    /// per-key horizontal sums). Empty under the generic engine, which has no packed pass.
    raw_kv: Vec<(Vec<f32>, Vec<f32>)>,
    pub len: usize,
    /// Log-probabilities of the next token after the prefix.
    pub next_logprobs: Vec<f32>,
}

/// A row of [`Llama::slot_forward`]: its cache slot, its prefix, the tokens it feeds and the own
/// position of the first of them (0 for the first token after the prefix).
pub struct SlotRow<'a> {
    pub slot: usize,
    pub prefix: &'a Prefix,
    pub position: usize,
    pub tokens: &'a [u32],
}

/// Keys and values of the tokens each decoding row generated itself, in fixed slots: a slot
/// holds one row at a time and is reused as soon as its row finishes (continuous batching).
/// Per layer, (slot × position × kv_heads × head_dim), allocated once.
pub struct SlotCache {
    kv: Vec<(Vec<f32>, Vec<f32>)>,
    slots: usize,
    max_len: usize,
    row_stride: usize,
}

impl SlotCache {
    /// Room for `slots` rows of up to `max_len` own tokens each.
    pub fn new(cfg: &LlamaConfig, slots: usize, max_len: usize) -> Self {
        let row_stride = max_len * cfg.n_kv_head * cfg.head_dim();
        let layer = || {
            (
                vec![0f32; slots * row_stride],
                vec![0f32; slots * row_stride],
            )
        };
        SlotCache {
            kv: (0..cfg.n_layer).map(|_| layer()).collect(),
            slots,
            max_len,
            row_stride,
        }
    }
}

/// Keys and values of the tokens each row generated itself: per layer (rows × kv_heads × len ×
/// head_dim).
#[derive(Default)]
pub struct RowCache {
    kv: Vec<(Tensor, Tensor)>,
    pub len: usize,
}

impl RowCache {
    /// Keeps only the rows at `rows` (indices into the current rows, in their new order): the
    /// lockstep decode drops rows that have stopped.
    pub fn keep_rows(&mut self, rows: &[u32]) -> Result<()> {
        let Some((k, _)) = self.kv.first() else {
            return Ok(());
        };
        let rows = Tensor::new(rows, k.device())?;
        for (k, v) in &mut self.kv {
            *k = k.index_select(&rows, 0)?;
            *v = v.index_select(&rows, 0)?;
        }
        Ok(())
    }
}

/// Cosines and sines of the rotary embedding (position × head_dim/2) on the CPU.
pub(super) fn rotary_tables(cfg: &LlamaConfig) -> Result<(Tensor, Tensor)> {
    let half = cfg.head_dim() / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / cfg.rope_theta.powf(2.0 * i as f32 / cfg.head_dim() as f32))
        .collect();
    let inv_freq = Tensor::from_vec(inv_freq, (1, half), &Device::Cpu)?;
    let positions = Tensor::arange(0u32, MAX_POSITIONS as u32, &Device::Cpu)?
        .to_dtype(DType::F32)?
        .reshape((MAX_POSITIONS, 1))?;
    let angles = positions.matmul(&inv_freq)?;
    Ok((angles.cos()?, angles.sin()?))
}

/// A weight dequantised to f32 on the CPU (the same values on every device), then moved to
/// `device`.
pub(super) fn dequantised(
    content: &Content,
    file: &mut BufReader<File>,
    name: &str,
    device: &Device,
) -> Result<Tensor> {
    let q = content
        .tensor(file, name, &Device::Cpu)
        .with_context(|| format!("cannot read tensor `{name}`"))?;
    Ok(q.dequantize(&Device::Cpu)?.to_device(device)?)
}

impl Llama {
    /// Reads the weights of a llama-family GGUF file (`content` is its parsed header) onto
    /// `compute`'s device.
    /// With an `adapter`, the matrices it changes are loaded with its update added.
    pub fn from_gguf(
        content: &Content,
        file: &mut BufReader<File>,
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
        let linear = |w: Tensor| Linear::new(w, compute.cpu_kernels);
        let embed = load("token_embd.weight")?;
        let head = if content.tensor_infos.contains_key("output.weight") {
            linear(load("output.weight")?.t()?)?
        } else {
            linear(embed.t()?)?
        };
        let mut blocks = Vec::with_capacity(cfg.n_layer);
        for i in 0..cfg.n_layer {
            let mut w = |part: &str| load(&format!("blk.{i}.{part}.weight"));
            let (q, k, v) = (w("attn_q")?, w("attn_k")?, w("attn_v")?);
            let (gate, up) = (w("ffn_gate")?, w("ffn_up")?);
            blocks.push(Block {
                attn_norm: Norm::new(w("attn_norm")?)?,
                wqkv: linear(Tensor::cat(&[q, k, v], 0)?.t()?)?,
                wo: linear(w("attn_output")?.t()?)?,
                ffn_norm: Norm::new(w("ffn_norm")?)?,
                w_gate_up: linear(Tensor::cat(&[gate, up], 0)?.t()?)?,
                w_down: linear(w("ffn_down")?.t()?)?,
            });
        }
        let final_norm = load("output_norm.weight")?;
        Llama::assemble(cfg, compute, embed, head, blocks, final_norm)
    }

    fn assemble(
        cfg: LlamaConfig,
        compute: &Compute,
        embed: Tensor,
        head: Linear,
        blocks: Vec<Block>,
        final_norm: Tensor,
    ) -> Result<Self> {
        let (cos, sin) = rotary_tables(&cfg)?;
        Ok(Llama {
            cos_raw: cos.flatten_all()?.to_vec1()?,
            sin_raw: sin.flatten_all()?.to_vec1()?,
            cos: cos.to_device(&compute.device)?,
            sin: sin.to_device(&compute.device)?,
            cfg,
            device: compute.device.clone(),
            cpu_kernels: compute.cpu_kernels,
            embed,
            head,
            blocks,
            final_norm: Norm::new(final_norm)?,
        })
    }

    /// Whether afkit's CPU kernels run the model (else the generic engine, on any device).
    pub fn cpu_kernels(&self) -> bool {
        self.cpu_kernels
    }

    /// Runs a whole token sequence from position 0 and keeps its keys and values as a prefix.
    /// Also returns the log-probability of each token after the first, given those before it.
    pub fn prefill(&self, ids: &[u32]) -> Result<(Prefix, Vec<f32>)> {
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
        let token_logprobs = if ids.len() > 1 {
            self.target_logprobs(&hidden.narrow(0, 0, ids.len() - 1)?, &ids[1..])?
        } else {
            Vec::new()
        };
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
        Ok((
            Prefix {
                kv,
                raw_kv,
                len: ids.len(),
                next_logprobs,
            },
            token_logprobs,
        ))
    }

    /// The model's hidden states (after the final norm) for `ids` (rows × tokens), which
    /// continue `prefix` (if any) and the rows' own cache; appends the new keys and values to
    /// `cache`. Every row is at the same position: rows are right-padded, and padding only ever
    /// follows a row's real tokens, which causal attention keeps from looking at it.
    pub fn forward(
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
        let cos = self.cos.narrow(0, start, steps)?;
        let sin = self.sin.narrow(0, start, steps)?;
        let mut x = self.embed.index_select(&ids.flatten_all()?, 0)?;
        for (layer, block) in self.blocks.iter().enumerate() {
            let h = rms_norm(&x, &block.attn_norm.weight, self.cfg.rms_eps)?;
            let attn = self.attention(
                block,
                &h,
                rows,
                steps,
                (&cos, &sin),
                prefix.map(|p| &p.kv[layer]),
                cache,
                layer,
            )?;
            x = (x + block.wo.forward(&attn)?)?;
            let h = rms_norm(&x, &block.ffn_norm.weight, self.cfg.rms_eps)?;
            let act = self.swiglu(&block.w_gate_up.forward(&h)?)?;
            x = (x + block.w_down.forward(&act)?)?;
        }
        cache.len += steps;
        rms_norm(&x, &self.final_norm.weight, self.cfg.rms_eps)?
            .reshape((rows, steps, self.cfg.d_model))
            .map_err(Into::into)
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        block: &Block,
        h: &Tensor,
        rows: usize,
        steps: usize,
        (cos, sin): (&Tensor, &Tensor),
        prefix: Option<&(Tensor, Tensor)>,
        cache: &mut RowCache,
        layer: usize,
    ) -> Result<Tensor> {
        let c = &self.cfg;
        let (hd, nh, nkv) = (c.head_dim(), c.n_head, c.n_kv_head);
        let group = nh / nkv;
        let qkv = block.wqkv.forward(h)?;
        let heads = |offset: usize, n: usize| -> Result<Tensor> {
            Ok(qkv
                .narrow(1, offset * hd, n * hd)?
                .reshape((rows, steps, n, hd))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let q = rope_i(&heads(0, nh)?, cos, sin)?;
        let k = rope_i(&heads(nh, nkv)?, cos, sin)?;
        let v = heads(nh + nkv, nkv)?;
        let (k, v) = match cache.kv.get(layer) {
            Some((k0, v0)) => (Tensor::cat(&[k0, &k], 2)?, Tensor::cat(&[v0, &v], 2)?),
            None => (k, v),
        };
        if cache.kv.len() > layer {
            cache.kv[layer] = (k.clone(), v.clone());
        } else {
            cache.kv.push((k.clone(), v.clone()));
        }
        let own_len = k.dim(2)?;
        // Query heads of one key/value group are adjacent: (rows, kv_heads, group·steps, hd).
        let q = (q.reshape((rows, nkv, group * steps, hd))? * (1.0 / (hd as f64).sqrt()))?;
        // Scores against the row's own tokens, causal: query t sits at own position
        // own_len - steps + t.
        let own = q.matmul(&k.transpose(2, 3)?)?;
        let own = if steps > 1 {
            own.reshape((rows, nkv, group, steps, own_len))?
                .broadcast_add(&causal_mask(steps, own_len, &self.device)?)?
                .reshape((rows, nkv, group * steps, own_len))?
        } else {
            own
        };
        let out = match prefix {
            None => softmax_last_dim(&own)?.matmul(&v)?,
            Some(prefix) => attend_with_prefix(&q, &own, &v, prefix)?,
        };
        // (rows, kv, group·steps, hd) → (rows·steps, heads·hd)
        Ok(out
            .reshape((rows, nh, steps, hd))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((rows * steps, nh * hd))?)
    }

    /// One step of the generic engine's lockstep decode: `tokens[i]` continues row i of `cache`,
    /// every row at the same position after `prefix`. Returns each row's logits as plain rows
    /// (rows × vocab) for the sampler.
    pub fn step_lockstep(
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
    pub fn slot_forward(&self, rows: &[SlotRow], cache: &mut SlotCache) -> Result<Vec<f32>> {
        if !self.cpu_kernels {
            bail!("the packed forward pass runs with afkit's CPU kernels only");
        }
        let c = &self.cfg;
        let (hd, nh, nkv) = (c.head_dim(), c.n_head, c.n_kv_head);
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
        let n = ids.len();
        // Activations stay plain rows between the packed products: candle's ops and the copies
        // in and out of tensors around every product were a tenth of a decode step.
        let mut x: Vec<f32> = self
            .embed
            .index_select(&Tensor::new(ids, &Device::Cpu)?, 0)?
            .flatten_all()?
            .to_vec1()?;
        let width = (nh + 2 * nkv) * hd;
        for (layer, block) in self.blocks.iter().enumerate() {
            let h = rms_norm_plain(&x, &block.attn_norm.plain, c.rms_eps);
            let mut qkv = block.wqkv.apply(&h, n)?;
            let (cache_k, cache_v) = &mut cache.kv[layer];
            for (&(row, own), qkv) in fed.iter().zip(qkv.chunks_exact_mut(width)) {
                let (q, kv) = qkv.split_at_mut(nh * hd);
                let (k, v) = kv.split_at_mut(nkv * hd);
                self.rotate(q, row.prefix.len + own);
                self.rotate(k, row.prefix.len + own);
                let at = cache.row_stride * row.slot + own * nkv * hd;
                cache_k[at..at + nkv * hd].copy_from_slice(k);
                cache_v[at..at + nkv * hd].copy_from_slice(v);
            }
            let mut attn = vec![0f32; n * nh * hd];
            let (cache_k, cache_v) = (&cache.kv[layer].0, &cache.kv[layer].1);
            attn.par_chunks_mut(nh * hd)
                .zip(qkv.par_chunks(width))
                .zip(fed.par_iter())
                .for_each_init(Vec::new, |scores, ((out, qkv), &(row, own))| {
                    let slot = cache.row_stride * row.slot;
                    let seen = slot..slot + (own + 1) * nkv * hd;
                    let (pk, pv) = &row.prefix.raw_kv[layer];
                    RowAttention {
                        q: &qkv[..nh * hd],
                        prefix: (pk, pv),
                        own: (&cache_k[seen.clone()], &cache_v[seen]),
                        heads: (nh, nkv, hd),
                    }
                    .run(scores, out);
                });
            add_into(&mut x, &block.wo.apply(&attn, n)?);
            let h = rms_norm_plain(&x, &block.ffn_norm.plain, c.rms_eps);
            let act = swiglu_plain(&block.w_gate_up.apply(&h, n)?, n, c.d_ff);
            add_into(&mut x, &block.w_down.apply(&act, n)?);
        }
        Ok(rms_norm_plain(&x, &self.final_norm.plain, c.rms_eps))
    }

    /// Rotary embedding of the heads in `x` (heads × head_dim, pairs adjacent) at `position`.
    fn rotate(&self, x: &mut [f32], position: usize) {
        let half = self.cfg.head_dim() / 2;
        let cos = &self.cos_raw[position * half..(position + 1) * half];
        let sin = &self.sin_raw[position * half..(position + 1) * half];
        for head in x.chunks_exact_mut(2 * half) {
            for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * cos[i] - b * sin[i];
                pair[1] = a * sin[i] + b * cos[i];
            }
        }
    }

    /// Log-softmax over the vocabulary for each row of `hidden` (n × d_model).
    pub fn log_softmax_rows(&self, hidden: &Tensor) -> Result<Vec<Vec<f32>>> {
        let logits = self.head.forward(hidden)?;
        Ok(candle_nn::ops::log_softmax(&logits, D::Minus1)?.to_vec2()?)
    }

    /// Raw logits for each row of `hidden` (plain rows, n × d_model), as plain rows (n × vocab).
    pub fn logits(&self, hidden: &[f32]) -> Result<Vec<f32>> {
        self.head.apply(hidden, hidden.len() / self.cfg.d_model)
    }

    /// `log p(targets[i] | hidden[i])` for each row, computing the output head in chunks so
    /// that a long batch never holds all its logits at once. With afkit's CPU kernels the
    /// log-normaliser is summed as the sampler sums it, so a scored ending's log-probs are the
    /// ones recorded while sampling it; elsewhere candle's log-softmax runs on the device.
    pub fn target_logprobs(&self, hidden: &Tensor, targets: &[u32]) -> Result<Vec<f32>> {
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
    pub fn score_continuations(&self, prefix: &Prefix, seqs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
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

    /// SwiGLU of the gate and up projections side by side in each row (rows × 2·d_ff):
    /// `silu(gate) ⊙ up`. With afkit's CPU kernels, one parallel pass over contiguous rows
    /// (candle's elementwise ops on the two strided halves cost as much as the matrix products
    /// at decode batch sizes); otherwise candle ops on the model's device.
    fn swiglu(&self, gate_up: &Tensor) -> Result<Tensor> {
        let (rows, width) = gate_up.dims2()?;
        let d_ff = width / 2;
        if !self.cpu_kernels {
            let gate = gate_up.narrow(1, 0, d_ff)?;
            return Ok((gate.silu()? * gate_up.narrow(1, d_ff, d_ff)?)?);
        }
        swiglu_rows(gate_up, rows, d_ff)
    }
}

/// [`Llama::swiglu`] as one pass over host memory.
fn swiglu_rows(gate_up: &Tensor, rows: usize, d_ff: usize) -> Result<Tensor> {
    let input = gate_up.flatten_all()?.to_vec1::<f32>()?;
    Ok(Tensor::from_vec(
        swiglu_plain(&input, rows, d_ff),
        (rows, d_ff),
        &Device::Cpu,
    )?)
}

/// [`swiglu_rows`] over plain rows (rows × 2·d_ff, gate then up in each).
fn swiglu_plain(gate_up: &[f32], rows: usize, d_ff: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * d_ff];
    out.par_chunks_mut(d_ff)
        .zip(gate_up.par_chunks(2 * d_ff))
        .for_each(|(out, row)| {
            let (gate, up) = row.split_at(d_ff);
            crate::simd::swiglu(gate, up, out);
        });
    out
}

/// RMS norm of each row of `x` (rows × weight's length).
fn rms_norm_plain(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (out, x) in out
        .chunks_exact_mut(weight.len())
        .zip(x.chunks_exact(weight.len()))
    {
        crate::simd::rms_norm(x, weight, eps, out);
    }
    out
}

/// `x += y`, element by element.
fn add_into(x: &mut [f32], y: &[f32]) {
    for (x, y) in x.iter_mut().zip(y) {
        *x += y;
    }
}

/// One token's attention in the packed pass: each query head against the prefix's keys and then
/// the row's own keys up to the token (one softmax over both), values summed into the output
/// (heads × head_dim). Prefix keys are (kv_heads × hd × len), prefix values (kv_heads × len ×
/// hd); own keys and values (len × kv_heads × hd).
struct RowAttention<'a> {
    q: &'a [f32],
    prefix: (&'a [f32], &'a [f32]),
    own: (&'a [f32], &'a [f32]),
    /// (query heads, key/value heads, head dim).
    heads: (usize, usize, usize),
}

impl RowAttention<'_> {
    /// Writes the row's attention output into `out`; `scores` is scratch space.
    fn run(&self, scores: &mut Vec<f32>, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::simd::avx2_fma() {
                // SAFETY: the CPU supports the features the function is compiled for.
                return unsafe { self.run_avx2_fma(scores, out) };
            }
        }
        self.run_generic::<false>(scores, out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run_avx2_fma(&self, scores: &mut Vec<f32>, out: &mut [f32]) {
        self.run_generic::<true>(scores, out)
    }

    #[inline(always)]
    fn run_generic<const FMA: bool>(&self, scores: &mut Vec<f32>, out: &mut [f32]) {
        let (q, (pk, pv), (own_k, own_v), (nh, nkv, hd)) =
            (self.q, self.prefix, self.own, self.heads);
        let group = nh / nkv;
        let plen = pk.len() / (nkv * hd);
        let own_len = own_k.len() / (nkv * hd);
        let scale = 1.0 / (hd as f32).sqrt();
        for head in 0..nh {
            let kv_head = head / group;
            let qh = &q[head * hd..(head + 1) * hd];
            // Plain loops, no closures: a closure is compiled without the caller's target features.
            scores.clear();
            scores.resize(plen, 0.0);
            for (d, &qd) in qh.iter().enumerate() {
                let keys_d = &pk[(kv_head * hd + d) * plen..][..plen];
                axpy_lanes::<FMA>(qd * scale, keys_d, scores);
            }
            for j in 0..own_len {
                let key = &own_k[(j * nkv + kv_head) * hd..][..hd];
                scores.push(dot_lanes::<FMA>(qh, key) * scale);
            }
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut total = 0f32;
            for s in scores.iter_mut() {
                *s = exp_lanes::<FMA>(*s - max);
                total += *s;
            }
            let oh = &mut out[head * hd..(head + 1) * hd];
            oh.fill(0.0);
            for (j, &p) in scores[..plen].iter().enumerate() {
                axpy_lanes::<FMA>(p / total, &pv[(kv_head * plen + j) * hd..][..hd], oh);
            }
            for (j, &p) in scores[plen..].iter().enumerate() {
                axpy_lanes::<FMA>(p / total, &own_v[(j * nkv + kv_head) * hd..][..hd], oh);
            }
        }
    }
}

/// The causal mask of `steps` new queries over a row's `own_len` tokens: query t sits at
/// position own_len - steps + t and sees nothing after it.
fn causal_mask(steps: usize, own_len: usize, device: &Device) -> Result<Tensor> {
    let mask: Vec<f32> = (0..steps)
        .flat_map(|t| {
            (0..own_len).map(move |s| {
                if s > own_len - steps + t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect();
    Ok(Tensor::from_vec(mask, (steps, own_len), device)?)
}

/// Attention over the shared prompt prefix and the row's own tokens, one softmax over both.
/// `q`: (rows, kv heads, group·steps, hd); `own`: the masked scores against the own tokens;
/// `v`: the own values; `prefix`: the prefix's keys and values, (kv heads, plen, hd).
fn attend_with_prefix(
    q: &Tensor,
    own: &Tensor,
    v: &Tensor,
    (pk, pv): &(Tensor, Tensor),
) -> Result<Tensor> {
    let (rows, nkv, queries, hd) = q.dims4()?;
    let (plen, own_len) = (pk.dim(1)?, own.dim(3)?);
    // All rows' queries against the shared prefix in one GEMM per key/value head.
    let q_shared = q
        .transpose(0, 1)?
        .contiguous()?
        .reshape((nkv, rows * queries, hd))?;
    let shared = q_shared
        .matmul(&pk.t()?)?
        .reshape((nkv, rows, queries, plen))?
        .transpose(0, 1)?
        .contiguous()?;
    let probs = softmax_last_dim(&Tensor::cat(&[&shared, own], 3)?)?;
    let p_shared = probs
        .narrow(3, 0, plen)?
        .transpose(0, 1)?
        .contiguous()?
        .reshape((nkv, rows * queries, plen))?;
    let from_shared = p_shared
        .matmul(pv)?
        .reshape((nkv, rows, queries, hd))?
        .transpose(0, 1)?;
    let from_own = probs.narrow(3, plen, own_len)?.contiguous()?.matmul(v)?;
    Ok((from_shared + from_own)?)
}
