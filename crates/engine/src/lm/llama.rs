//! A decoder of the llama shape (RMSNorm, rotary embeddings, grouped-query attention, a gated
//! feed-forward) over f32 weights dequantised from a GGUF file at load time, with the parts the
//! Qwen 2, Qwen 3 and Gemma 3 families add ([`super::family`]) switched on by the file's
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
//! Two engines ([`crate::device`]): with afkit's CPU kernels, the weights are packed for its
//! GEMM, the gated activation is one pass over host memory and [`Llama::slot_forward`] runs rows of any
//! contexts and lengths packed end to end with per-row attention: the decode step of continuous
//! batching, and the scoring of continuations. The generic engine keeps every tensor on the model's device
//! and uses candle ops only: [`Llama::prefill`], [`Llama::forward`] (which also decodes a batch
//! of rows of one context in lockstep) and the scoring functions run on any device.

use std::io::{Read, Seek};
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{DType, Device, Tensor, D};
use candle_nn::ops::{rms_norm, softmax_last_dim};
use candle_nn::rotary_emb::{rope, rope_i};
use rayon::prelude::*;

use super::adapter::Adapter;
use super::family::{Activation, Arch, Family, LocalLayers, RopeLayout};
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
    /// The family and what sets its forward pass apart from llama's.
    pub arch: Arch,
}

impl LlamaConfig {
    pub fn head_dim(&self) -> usize {
        self.arch.head_dim.unwrap_or(self.d_model / self.n_head)
    }

    /// Multiply-adds ×2 of one token's forward pass through the weight matrices (attention
    /// scores excluded): the yardstick for GFLOP/s figures.
    pub fn flops_per_token(&self) -> f64 {
        let hd = self.head_dim();
        let qkv = self.d_model * (self.n_head + 2 * self.n_kv_head) * hd;
        let per_layer = qkv + self.n_head * hd * self.d_model + 3 * self.d_model * self.d_ff;
        2.0 * (self.n_layer * per_layer + self.d_model * self.vocab) as f64
    }

    pub(super) fn from_gguf(content: &Content) -> Result<Self> {
        let arch = content
            .metadata
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .map(String::as_str)
            .unwrap_or("llama");
        let family = Family::from_architecture(arch)?;
        let key = |k: &str| format!("{arch}.{k}");
        let get = |k: &str| -> Result<&Value> {
            content
                .metadata
                .get(&key(k))
                .with_context(|| format!("the GGUF metadata has no `{}`", key(k)))
        };
        let u = |k: &str| -> Result<usize> { Ok(get(k)?.to_u32()? as usize) };
        let f = |k: &str| -> Result<f32> { Ok(get(k)?.to_f32()?) };
        if let Ok(kind) = get("rope.scaling.type") {
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
        let head_dim = u("attention.key_length").ok();
        if let (Some(k), Ok(v)) = (head_dim, u("attention.value_length")) {
            if k != v {
                bail!("keys of {k} and values of {v} dims per head are not supported");
            }
        }
        let local_layers = match family {
            Family::Gemma3 => Some(LocalLayers {
                window: u("attention.sliding_window")?,
                period: u("attention.sliding_window_type").unwrap_or(6),
                rope_theta: f("rope.local_freq_base").unwrap_or(10_000.0),
            }),
            _ => None,
        };
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
            rope_theta: f("rope.freq_base").unwrap_or(family.default_rope_theta()),
            rms_eps: f("attention.layer_norm_rms_epsilon")?,
            arch: Arch {
                family,
                head_dim: head_dim.filter(|&hd| hd != d_model / n_head),
                local_layers,
            },
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

/// A weight vector (a norm's weight, a bias), on the model's device and as plain values for the
/// packed pass (read once at load, not on every step).
struct Vector {
    weight: Tensor,
    plain: Vec<f32>,
}

impl Vector {
    fn new(weight: Tensor) -> Result<Self> {
        let plain = weight.to_vec1()?;
        Ok(Vector { weight, plain })
    }
}

/// One decoder block. Projection matrices are stored transposed (in × out) so that `x.matmul(w)`
/// maps a (tokens × in) activation; Q, K and V share one matrix, as do the gate and up
/// projections, so each is a single GEMM. The optional parts are the families' extras
/// ([`super::family`]).
struct Block {
    attn_norm: Vector,
    wqkv: Linear,
    /// Biases of Q, K and V side by side.
    qkv_bias: Option<Vector>,
    /// The norms of each query head and of each key head.
    qk_norm: Option<(Vector, Vector)>,
    wo: Linear,
    post_attn_norm: Option<Vector>,
    ffn_norm: Vector,
    w_gate_up: Linear,
    w_down: Linear,
    post_ffn_norm: Option<Vector>,
    /// Index of the block's rotary table in [`Llama::ropes`].
    rope: usize,
    /// How many positions back (its own included) a local layer's tokens see.
    window: Option<usize>,
}

/// The rotary embedding of one base: cosines and sines (position × head_dim/2) on the model's
/// device and as plain rows for the packed pass.
struct Rope {
    cos: Tensor,
    sin: Tensor,
    cos_raw: Vec<f32>,
    sin_raw: Vec<f32>,
}

impl Rope {
    fn new(head_dim: usize, theta: f32, device: &Device) -> Result<Self> {
        let (cos, sin) = rotary_tables(head_dim, theta)?;
        Ok(Rope {
            cos_raw: cos.flatten_all()?.to_vec1()?,
            sin_raw: sin.flatten_all()?.to_vec1()?,
            cos: cos.to_device(device)?,
            sin: sin.to_device(device)?,
        })
    }
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
    final_norm: Vector,
    /// The model's rotary table, then the local layers' (when their base differs).
    ropes: Vec<Rope>,
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
pub(super) fn rotary_tables(head_dim: usize, theta: f32) -> Result<(Tensor, Tensor)> {
    let half = head_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / theta.powf(2.0 * i as f32 / head_dim as f32))
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
pub(super) fn dequantised<R: Read + Seek>(
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

/// Reads block `i`'s weights through `load` (which applies any adapter): llama's matrices and
/// norms, plus what the model's family adds.
fn load_block(
    cfg: &LlamaConfig,
    i: usize,
    cpu_kernels: bool,
    load: &mut impl FnMut(&str) -> Result<Tensor>,
) -> Result<Block> {
    let mut w = |part: &str| load(&format!("blk.{i}.{part}.weight"));
    let linear = |w: Tensor| Linear::new(w, cpu_kernels);
    let (q, k, v) = (w("attn_q")?, w("attn_k")?, w("attn_v")?);
    let (gate, up) = (w("ffn_gate")?, w("ffn_up")?);
    let arch = &cfg.arch;
    let qk_norm = match arch.qk_norm() {
        true => Some((
            Vector::new(w("attn_q_norm")?)?,
            Vector::new(w("attn_k_norm")?)?,
        )),
        false => None,
    };
    let (post_attn_norm, post_ffn_norm) = match arch.post_norms() {
        true => (
            Some(Vector::new(w("post_attention_norm")?)?),
            Some(Vector::new(w("post_ffw_norm")?)?),
        ),
        false => (None, None),
    };
    let block = Block {
        attn_norm: Vector::new(w("attn_norm")?)?,
        wqkv: linear(Tensor::cat(&[q, k, v], 0)?.t()?)?,
        qkv_bias: None,
        qk_norm,
        wo: linear(w("attn_output")?.t()?)?,
        post_attn_norm,
        ffn_norm: Vector::new(w("ffn_norm")?)?,
        w_gate_up: linear(Tensor::cat(&[gate, up], 0)?.t()?)?,
        w_down: linear(w("ffn_down")?.t()?)?,
        post_ffn_norm,
        rope: usize::from(arch.window(i).is_some()),
        window: arch.window(i),
    };
    if !arch.qkv_bias() {
        return Ok(block);
    }
    let mut bias = |part: &str| load(&format!("blk.{i}.{part}.bias"));
    let (bq, bk, bv) = (bias("attn_q")?, bias("attn_k")?, bias("attn_v")?);
    Ok(Block {
        qkv_bias: Some(Vector::new(Tensor::cat(&[bq, bk, bv], 0)?)?),
        ..block
    })
}

impl Llama {
    /// Reads the weights of a GGUF file of one of the engine's families (`content` is its parsed header) onto
    /// `compute`'s device.
    /// With an `adapter`, the matrices it changes are loaded with its update added.
    pub fn from_gguf<R: Read + Seek>(
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
            true => Linear::new(load("output.weight")?.t()?, compute.cpu_kernels)?,
            false => Linear::new(embed.t()?, compute.cpu_kernels)?,
        };
        let blocks = (0..cfg.n_layer)
            .map(|i| load_block(&cfg, i, compute.cpu_kernels, &mut load))
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
        let mut x = self.embed.index_select(&ids.flatten_all()?, 0)?;
        let embed_scale = self.cfg.arch.embed_scale(self.cfg.d_model);
        if embed_scale != 1.0 {
            x = (x * f64::from(embed_scale))?;
        }
        let eps = self.cfg.rms_eps;
        for (layer, block) in self.blocks.iter().enumerate() {
            let h = rms_norm(&x, &block.attn_norm.weight, eps)?;
            let attn = self.attention(block, &h, (rows, steps), prefix, cache, layer)?;
            x = (x + post_norm(block.wo.forward(&attn)?, &block.post_attn_norm, eps)?)?;
            let h = rms_norm(&x, &block.ffn_norm.weight, eps)?;
            let act = self.gated(&block.w_gate_up.forward(&h)?)?;
            x = (x + post_norm(block.w_down.forward(&act)?, &block.post_ffn_norm, eps)?)?;
        }
        cache.len += steps;
        rms_norm(&x, &self.final_norm.weight, eps)?
            .reshape((rows, steps, self.cfg.d_model))
            .map_err(Into::into)
    }

    /// Queries, keys and values of `h` as heads (rows, heads, steps, hd), with the block's
    /// biases and head norms applied and the queries and keys rotated for positions
    /// `start..start + steps`.
    fn project_heads(
        &self,
        block: &Block,
        h: &Tensor,
        (rows, steps): (usize, usize),
        start: usize,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let c = &self.cfg;
        let (hd, nh, nkv) = (c.head_dim(), c.n_head, c.n_kv_head);
        let mut qkv = block.wqkv.forward(h)?;
        if let Some(bias) = &block.qkv_bias {
            qkv = qkv.broadcast_add(&bias.weight)?;
        }
        let heads = |offset: usize, n: usize| -> Result<Tensor> {
            Ok(qkv
                .narrow(1, offset * hd, n * hd)?
                .reshape((rows, steps, n, hd))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let (mut q, mut k) = (heads(0, nh)?, heads(nh, nkv)?);
        if let Some((q_norm, k_norm)) = &block.qk_norm {
            q = rms_norm(&q, &q_norm.weight, c.rms_eps)?;
            k = rms_norm(&k, &k_norm.weight, c.rms_eps)?;
        }
        let table = &self.ropes[block.rope];
        let cos = table.cos.narrow(0, start, steps)?;
        let sin = table.sin.narrow(0, start, steps)?;
        let rotate = |x: &Tensor| match c.arch.rope_layout() {
            RopeLayout::Adjacent => rope_i(x, &cos, &sin),
            RopeLayout::Halves => rope(x, &cos, &sin),
        };
        Ok((rotate(&q)?, rotate(&k)?, heads(nh + nkv, nkv)?))
    }

    fn attention(
        &self,
        block: &Block,
        h: &Tensor,
        (rows, steps): (usize, usize),
        prefix: Option<&Prefix>,
        cache: &mut RowCache,
        layer: usize,
    ) -> Result<Tensor> {
        let c = &self.cfg;
        let (hd, nh, nkv) = (c.head_dim(), c.n_head, c.n_kv_head);
        let group = nh / nkv;
        let plen = prefix.map_or(0, |p| p.len);
        let (q, k, v) = self.project_heads(block, h, (rows, steps), plen + cache.len)?;
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
        let own = if steps > 1 || block.window.is_some() {
            let mask = attention_mask(steps, (own_len - steps, 0), own_len, block.window);
            own.reshape((rows, nkv, group, steps, own_len))?
                .broadcast_add(&Tensor::from_vec(mask, (steps, own_len), &self.device)?)?
                .reshape((rows, nkv, group * steps, own_len))?
        } else {
            own
        };
        let out = match prefix {
            None => softmax_last_dim(&own)?.matmul(&v)?,
            Some(prefix) => {
                // Only a local layer hides prefix keys, those its window has passed.
                let mask = block
                    .window
                    .filter(|&w| plen + own_len > w)
                    .map(|w| {
                        let mask =
                            attention_mask(steps, (plen + own_len - steps, 0), plen, Some(w));
                        Tensor::from_vec(mask, (steps, plen), &self.device)
                    })
                    .transpose()?;
                attend_with_prefix(&q, &own, &v, &prefix.kv[layer], mask.as_ref())?
            }
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
        let embed_scale = c.arch.embed_scale(c.d_model);
        if embed_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= embed_scale);
        }
        for (layer, block) in self.blocks.iter().enumerate() {
            let h = rms_norm_plain(&x, &block.attn_norm.plain, c.rms_eps);
            let qkv = self.packed_qkv(block, &block.wqkv.apply(&h, n)?, &fed, layer, cache);
            let attn = self.packed_attention(block, &qkv, &fed, layer, cache);
            let out = block.wo.apply(&attn, n)?;
            add_into(
                &mut x,
                &post_norm_plain(out, &block.post_attn_norm, c.rms_eps),
            );
            let h = rms_norm_plain(&x, &block.ffn_norm.plain, c.rms_eps);
            let act = gated_plain(&block.w_gate_up.apply(&h, n)?, n, c.arch.activation());
            let out = block.w_down.apply(&act, n)?;
            add_into(
                &mut x,
                &post_norm_plain(out, &block.post_ffn_norm, c.rms_eps),
            );
        }
        Ok(rms_norm_plain(&x, &self.final_norm.plain, c.rms_eps))
    }

    /// The packed pass's queries, keys and values (one row of Q, K, V per fed token) with the
    /// block's biases and head norms applied and Q and K rotated; writes each token's key and
    /// value into its row's slot of `cache`.
    fn packed_qkv(
        &self,
        block: &Block,
        qkv: &[f32],
        fed: &[(&SlotRow, usize)],
        layer: usize,
        cache: &mut SlotCache,
    ) -> Vec<f32> {
        let c = &self.cfg;
        let (hd, nh, nkv) = (c.head_dim(), c.n_head, c.n_kv_head);
        let width = (nh + 2 * nkv) * hd;
        let mut qkv = qkv.to_vec();
        let (cache_k, cache_v) = &mut cache.kv[layer];
        for (&(row, own), qkv) in fed.iter().zip(qkv.chunks_exact_mut(width)) {
            if let Some(bias) = &block.qkv_bias {
                add_into(qkv, &bias.plain);
            }
            let (q, kv) = qkv.split_at_mut(nh * hd);
            let (k, v) = kv.split_at_mut(nkv * hd);
            if let Some((q_norm, k_norm)) = &block.qk_norm {
                norm_heads(q, &q_norm.plain, c.rms_eps);
                norm_heads(k, &k_norm.plain, c.rms_eps);
            }
            self.rotate(q, block.rope, row.prefix.len + own);
            self.rotate(k, block.rope, row.prefix.len + own);
            let at = cache.row_stride * row.slot + own * nkv * hd;
            cache_k[at..at + nkv * hd].copy_from_slice(k);
            cache_v[at..at + nkv * hd].copy_from_slice(v);
        }
        qkv
    }

    /// The packed pass's attention: each fed token's query heads against its row's prefix and
    /// own tokens up to it (within the block's window), as rows (tokens × heads·hd).
    fn packed_attention(
        &self,
        block: &Block,
        qkv: &[f32],
        fed: &[(&SlotRow, usize)],
        layer: usize,
        cache: &SlotCache,
    ) -> Vec<f32> {
        let c = &self.cfg;
        let (hd, nh, nkv) = (c.head_dim(), c.n_head, c.n_kv_head);
        let width = (nh + 2 * nkv) * hd;
        let mut attn = vec![0f32; fed.len() * nh * hd];
        let (cache_k, cache_v) = (&cache.kv[layer].0, &cache.kv[layer].1);
        attn.par_chunks_mut(nh * hd)
            .zip(qkv.par_chunks(width))
            .zip(fed.par_iter())
            .for_each_init(Vec::new, |scores, ((out, qkv), &(row, own))| {
                let slot = cache.row_stride * row.slot;
                let seen = slot..slot + (own + 1) * nkv * hd;
                let (pk, pv) = &row.prefix.raw_kv[layer];
                let position = row.prefix.len + own;
                RowAttention {
                    q: &qkv[..nh * hd],
                    prefix: (pk, pv),
                    own: (&cache_k[seen.clone()], &cache_v[seen]),
                    heads: (nh, nkv, hd),
                    first_key: block.window.map_or(0, |w| (position + 1).saturating_sub(w)),
                }
                .run(scores, out);
            });
        attn
    }

    /// Rotary embedding of the heads in `x` (heads × head_dim) at `position`, from rotary table
    /// `table`, pairs laid out as the family lays them.
    fn rotate(&self, x: &mut [f32], table: usize, position: usize) {
        let half = self.cfg.head_dim() / 2;
        let table = &self.ropes[table];
        let cos = &table.cos_raw[position * half..(position + 1) * half];
        let sin = &table.sin_raw[position * half..(position + 1) * half];
        for head in x.chunks_exact_mut(2 * half) {
            match self.cfg.arch.rope_layout() {
                RopeLayout::Adjacent => {
                    for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                        let (a, b) = (pair[0], pair[1]);
                        pair[0] = a * cos[i] - b * sin[i];
                        pair[1] = a * sin[i] + b * cos[i];
                    }
                }
                RopeLayout::Halves => {
                    let (low, high) = head.split_at_mut(half);
                    for (((a, b), &cos), &sin) in low.iter_mut().zip(high).zip(cos).zip(sin) {
                        (*a, *b) = (*a * cos - *b * sin, *a * sin + *b * cos);
                    }
                }
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

    /// The gated feed-forward's activation `act(gate) ⊙ up` of the gate and up projections side
    /// by side in each row (rows × 2·d_ff). With afkit's CPU kernels, one parallel pass over
    /// contiguous rows (candle's elementwise ops on the two strided halves cost as much as the
    /// matrix products at decode batch sizes); otherwise candle ops on the model's device.
    fn gated(&self, gate_up: &Tensor) -> Result<Tensor> {
        let (rows, width) = gate_up.dims2()?;
        let d_ff = width / 2;
        let activation = self.cfg.arch.activation();
        if self.cpu_kernels {
            let input = gate_up.flatten_all()?.to_vec1::<f32>()?;
            let out = gated_plain(&input, rows, activation);
            return Ok(Tensor::from_vec(out, (rows, d_ff), &Device::Cpu)?);
        }
        let gate = gate_up.narrow(1, 0, d_ff)?;
        let gate = match activation {
            Activation::Silu => gate.silu()?,
            // candle's `gelu` is the tanh approximation.
            Activation::GeluTanh => gate.gelu()?,
        };
        Ok((gate * gate_up.narrow(1, d_ff, d_ff)?)?)
    }
}

/// [`Llama::gated`] over plain rows (rows × 2·d_ff, gate then up in each).
fn gated_plain(gate_up: &[f32], rows: usize, activation: Activation) -> Vec<f32> {
    let d_ff = gate_up.len() / rows / 2;
    let mut out = vec![0f32; rows * d_ff];
    out.par_chunks_mut(d_ff)
        .zip(gate_up.par_chunks(2 * d_ff))
        .for_each(|(out, row)| {
            let (gate, up) = row.split_at(d_ff);
            match activation {
                Activation::Silu => crate::simd::swiglu(gate, up, out),
                Activation::GeluTanh => gelu_tanh_gate(gate, up, out),
            }
        });
    out
}

/// `gelu(gate) ⊙ up` with GELU's tanh approximation, tanh written through `exp_lanes` so that
/// the loop vectorises.
fn gelu_tanh_gate(gate: &[f32], up: &[f32], out: &mut [f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let inner = SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g);
        // tanh(y) = 1 - 2 / (e^2y + 1); |y| ≤ 10 keeps e^2y finite and tanh within 1e-8 of ±1.
        let tanh = 1.0 - 2.0 / (exp_lanes::<false>(2.0 * inner.clamp(-10.0, 10.0)) + 1.0);
        *o = 0.5 * g * (1.0 + tanh) * u;
    }
}

/// RMS norm over each head of `x` (heads × the weight's length), in place.
fn norm_heads(x: &mut [f32], weight: &[f32], eps: f32) {
    for head in x.chunks_exact_mut(weight.len()) {
        let input = head.to_vec();
        crate::simd::rms_norm(&input, weight, eps, head);
    }
}

/// `x` through the block's norm `norm`, if it has one (Gemma's norms after attention and after
/// the feed-forward).
fn post_norm(x: Tensor, norm: &Option<Vector>, eps: f32) -> Result<Tensor> {
    match norm {
        Some(norm) => Ok(rms_norm(&x, &norm.weight, eps)?),
        None => Ok(x),
    }
}

/// [`post_norm`] over plain rows.
fn post_norm_plain(x: Vec<f32>, norm: &Option<Vector>, eps: f32) -> Vec<f32> {
    match norm {
        Some(norm) => rms_norm_plain(&x, &norm.plain, eps),
        None => x,
    }
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
    /// Position of the first key the query sees (a local layer's window start; 0 elsewhere).
    first_key: usize,
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
        // Keys the window has passed: the first `skip_prefix` of the prefix, then the first
        // `skip_own` own ones.
        let skip_prefix = self.first_key.min(plen);
        let skip_own = self.first_key.saturating_sub(plen);
        let seen_prefix = plen - skip_prefix;
        let scale = 1.0 / (hd as f32).sqrt();
        for head in 0..nh {
            let kv_head = head / group;
            let qh = &q[head * hd..(head + 1) * hd];
            // Plain loops, no closures: a closure is compiled without the caller's target features.
            scores.clear();
            scores.resize(seen_prefix, 0.0);
            for (d, &qd) in qh.iter().enumerate() {
                let keys_d = &pk[(kv_head * hd + d) * plen..][skip_prefix..plen];
                axpy_lanes::<FMA>(qd * scale, keys_d, scores);
            }
            for j in skip_own..own_len {
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
            for (j, &p) in scores[..seen_prefix].iter().enumerate() {
                let at = (kv_head * plen + skip_prefix + j) * hd;
                axpy_lanes::<FMA>(p / total, &pv[at..][..hd], oh);
            }
            for (j, &p) in scores[seen_prefix..].iter().enumerate() {
                let at = ((skip_own + j) * nkv + kv_head) * hd;
                axpy_lanes::<FMA>(p / total, &own_v[at..][..hd], oh);
            }
        }
    }
}

/// An additive attention mask (steps × keys): query t sits at position `first_query + t`, key j
/// at `first_key + j`; a query sees no key after it and, with a `window`, none `window` or more
/// positions before it.
fn attention_mask(
    steps: usize,
    (first_query, first_key): (usize, usize),
    keys: usize,
    window: Option<usize>,
) -> Vec<f32> {
    let window = window.unwrap_or(usize::MAX);
    (0..steps)
        .flat_map(|t| {
            let query = first_query + t;
            (0..keys).map(move |j| {
                let key = first_key + j;
                if key > query || query - key >= window {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect()
}

/// Attention over the shared prompt prefix and the row's own tokens, one softmax over both.
/// `q`: (rows, kv heads, group·steps, hd); `own`: the masked scores against the own tokens;
/// `v`: the own values; `prefix`: the prefix's keys and values, (kv heads, plen, hd);
/// `prefix_mask`: what a local layer's window hides of the prefix.
fn attend_with_prefix(
    q: &Tensor,
    own: &Tensor,
    v: &Tensor,
    (pk, pv): &(Tensor, Tensor),
    prefix_mask: Option<&Tensor>,
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
    // A mask (steps × plen) hides prefix keys from every query head of a group alike.
    let shared = match prefix_mask {
        Some(mask) => {
            let steps = mask.dim(0)?;
            shared
                .reshape((rows, nkv, queries / steps, steps, plen))?
                .broadcast_add(mask)?
                .reshape((rows, nkv, queries, plen))?
        }
        None => shared,
    };
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
