//! The BERT encoder of all-MiniLM-L6-v2 (6 layers, 384 wide, 12 heads), written for sentence
//! embedding on a CPU.
//!
//! The sentences of a batch are laid end to end instead of being padded to the longest: every
//! linear layer then multiplies one tall matrix of real tokens, and attention, the only step that
//! must see sentence boundaries, runs per sentence. The weights go through `lm::linear`, which
//! packs them once for afkit's GEMM micro-kernels (AVX-512, or AVX2 with FMA, chosen at run time)
//! and falls back to candle's matmul elsewhere. What it computes is Hugging Face's `BertModel`
//! with an all-ones attention mask, followed by sentence-transformers' mean pooling, except
//! that the linear layers multiply in bf16 (operands rounded, sums in f32): on CPUs with
//! AVX512-BF16 that doubles their arithmetic rate, and the vectors stay within a cosine of
//! 0.9999 of sentence-transformers' f32 ones (BENCHMARKS.md, "AFLite"). Every other CPU
//! computes the same bits with f32 instructions, so a vector does not depend on the machine.

use anyhow::{ensure, Context, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{Config, HiddenAct};
use rayon::prelude::*;

use crate::lm::linear::{Linear, Precision};

pub struct MiniLm {
    word_embeddings: Vec<f32>,
    /// Position embeddings with the (only) token type's embedding already added.
    position_embeddings: Vec<f32>,
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
    width: usize,
    heads: usize,
    vocab: usize,
    max_positions: usize,
}

struct Layer {
    /// Query, key and value projections side by side (width × 3·width), one product for all three.
    qkv: Dense,
    attention_output: Dense,
    attention_norm: LayerNorm,
    intermediate: Dense,
    output: Dense,
    output_norm: LayerNorm,
}

/// Whether afkit's BERT layers (this encoder's and the cross-encoder's) run a model of `config`.
pub(crate) fn check_supported(config: &Config) -> Result<()> {
    ensure!(
        config.hidden_act == HiddenAct::Gelu,
        "only BERT models with the exact (erf) GELU are supported"
    );
    ensure!(
        config
            .hidden_size
            .is_multiple_of(config.num_attention_heads),
        "hidden size {} is not a multiple of {} heads",
        config.hidden_size,
        config.num_attention_heads
    );
    Ok(())
}

impl MiniLm {
    /// The encoder's weights from `vb` (the model's safetensors), described by `config`, with
    /// linear layers that multiply in `precision` (afkit embeds in bf16; f32 is the reference
    /// the tests hold it to).
    pub fn load(vb: VarBuilder, config: &Config, precision: Precision) -> Result<Self> {
        check_supported(config)?;
        let vb = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") {
            vb.pp("bert")
        } else {
            vb
        };
        let width = config.hidden_size;
        let eps = config.layer_norm_eps as f32;
        let emb = vb.pp("embeddings");
        let word_embeddings =
            rows(&emb.get((config.vocab_size, width), "word_embeddings.weight")?)?;
        let token_type = rows(&emb.get(
            (config.type_vocab_size, width),
            "token_type_embeddings.weight",
        )?)?;
        let mut position_embeddings = rows(&emb.get(
            (config.max_position_embeddings, width),
            "position_embeddings.weight",
        )?)?;
        for position in position_embeddings.chunks_exact_mut(width) {
            for (p, t) in position.iter_mut().zip(&token_type[..width]) {
                *p += t;
            }
        }
        let embedding_norm = LayerNorm::load(emb.pp("LayerNorm"), width, eps)?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| Layer::load(vb.pp(format!("encoder.layer.{i}")), config, precision))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            word_embeddings,
            position_embeddings,
            embedding_norm,
            layers,
            width,
            heads: config.num_attention_heads,
            vocab: config.vocab_size,
            max_positions: config.max_position_embeddings,
        })
    }

    /// The mean of the last layer's token vectors for each sentence (sentences × width), where a
    /// sentence is its word-piece ids, [CLS] and [SEP] included.
    pub fn mean_pooled(&self, sentences: &[&[u32]]) -> Result<Vec<f32>> {
        let width = self.width;
        if sentences.is_empty() {
            return Ok(Vec::new());
        }
        let spans = Spans::new(sentences);
        let mut x = Vec::with_capacity(spans.tokens * width);
        for ids in sentences {
            ensure!(!ids.is_empty(), "a text produced no word pieces");
            ensure!(
                ids.len() <= self.max_positions,
                "{} word pieces, more than the model's {} positions",
                ids.len(),
                self.max_positions
            );
            for (position, &id) in ids.iter().enumerate() {
                let id = id as usize;
                ensure!(id < self.vocab, "word piece {id} is outside the vocabulary");
                let word = &self.word_embeddings[id * width..(id + 1) * width];
                let pos = &self.position_embeddings[position * width..(position + 1) * width];
                x.extend(word.iter().zip(pos).map(|(w, p)| w + p));
            }
        }
        self.embedding_norm.apply(&mut x);
        for layer in &self.layers {
            x = layer.forward(x, &spans, self.heads, width)?;
        }
        let mut pooled = vec![0f32; sentences.len() * width];
        for (out, span) in pooled.chunks_exact_mut(width).zip(&spans.ranges) {
            for token in x[span.start * width..span.end * width].chunks_exact(width) {
                for (o, v) in out.iter_mut().zip(token) {
                    *o += v;
                }
            }
            let n = span.len() as f32;
            out.iter_mut().for_each(|o| *o /= n);
        }
        Ok(pooled)
    }
}

impl Layer {
    fn load(vb: VarBuilder, config: &Config, precision: Precision) -> Result<Self> {
        let (width, inner) = (config.hidden_size, config.intermediate_size);
        let eps = config.layer_norm_eps as f32;
        let attention = vb.pp("attention");
        let projections = ["query", "key", "value"]
            .map(|name| Dense::weights(attention.pp("self").pp(name), width, width));
        let mut weights = Vec::with_capacity(3);
        let mut bias = Vec::with_capacity(3 * width);
        for projection in projections {
            let (w, b) = projection?;
            weights.push(w);
            bias.extend(b);
        }
        let qkv = Dense::new(Tensor::cat(&weights, 1)?, bias, precision)?;
        let dense = |vb: VarBuilder, inputs, outputs| Dense::load(vb, inputs, outputs, precision);
        Ok(Self {
            qkv,
            attention_output: dense(attention.pp("output.dense"), width, width)?,
            attention_norm: LayerNorm::load(attention.pp("output.LayerNorm"), width, eps)?,
            intermediate: dense(vb.pp("intermediate.dense"), width, inner)?,
            output: dense(vb.pp("output.dense"), inner, width)?,
            output_norm: LayerNorm::load(vb.pp("output.LayerNorm"), width, eps)?,
        })
    }

    /// One transformer layer over the batch's tokens `x` (tokens × width).
    fn forward(&self, x: Vec<f32>, spans: &Spans, heads: usize, width: usize) -> Result<Vec<f32>> {
        let tokens = spans.tokens;
        let mut qkv = self.qkv.weight.apply(&x, tokens)?;
        add_bias(&mut qkv, &self.qkv.bias);
        let context = self_attention(&qkv, spans, heads, width);
        let mut h = self.attention_output.weight.apply(&context, tokens)?;
        self.attention_norm
            .add_and_normalise(&mut h, &self.attention_output.bias, &x);
        let mut inner = self.intermediate.weight.apply(&h, tokens)?;
        bias_gelu(&mut inner, &self.intermediate.bias);
        let mut out = self.output.weight.apply(&inner, tokens)?;
        self.output_norm
            .add_and_normalise(&mut out, &self.output.bias, &h);
        Ok(out)
    }
}

/// Where each sentence's tokens lie in the batch's rows.
struct Spans {
    ranges: Vec<std::ops::Range<usize>>,
    tokens: usize,
}

impl Spans {
    fn new(sentences: &[&[u32]]) -> Self {
        let mut start = 0;
        let ranges = sentences
            .iter()
            .map(|s| {
                start += s.len();
                start - s.len()..start
            })
            .collect();
        Spans {
            ranges,
            tokens: start,
        }
    }
}

/// softmax(q·kᵀ / √d) · v per sentence and head, from the fused projections `qkv`
/// (tokens × 3·width: queries, keys, values); returns tokens × width, heads side by side.
fn self_attention(qkv: &[f32], spans: &Spans, heads: usize, width: usize) -> Vec<f32> {
    let mut context = vec![0f32; spans.tokens * width];
    let mut outputs = Vec::with_capacity(spans.ranges.len());
    let mut rest = context.as_mut_slice();
    for span in &spans.ranges {
        let (mine, tail) = rest.split_at_mut(span.len() * width);
        outputs.push((span.clone(), mine));
        rest = tail;
    }
    outputs.into_par_iter().for_each(|(span, out)| {
        let rows = &qkv[span.start * 3 * width..span.end * 3 * width];
        #[cfg(target_arch = "x86_64")]
        {
            if crate::simd::avx2_fma() {
                // SAFETY: the CPU supports the features the function is compiled for.
                return unsafe { attend_avx2_fma(rows, out, heads, width) };
            }
        }
        attend::<false>(rows, out, heads, width)
    });
    context
}

/// [`attend`] compiled for AVX2 and FMA: the attention was a tenth of the encoder's time in
/// the baseline x86-64 build (four-lane vectors, separate multiplies and adds).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2_fma(rows: &[f32], out: &mut [f32], heads: usize, width: usize) {
    attend::<true>(rows, out, heads, width)
}

/// Keys scored, or value columns summed, per block: two 256-bit registers of accumulators that
/// stay in registers across a whole loop.
const LANES: usize = 16;

/// One sentence's attention: `rows` are its tokens' fused projections, `out` its tokens'
/// context vectors (zeroed).
///
/// Sentences are short (a dozen word pieces is typical), so the work is small products whose
/// cost was their overhead: a 32-long dot product per query and key ends in a horizontal sum,
/// and adding each weighted value into the output in memory chains every key's addition to the
/// last one's store. Instead each head's keys are transposed once, so that one query's scores
/// for 16 keys build up in registers over the head's dimensions, and the output is summed over
/// the keys 16 columns at a time, also in registers.
#[inline(always)]
fn attend<const FMA: bool>(rows: &[f32], out: &mut [f32], heads: usize, width: usize) {
    let head = width / heads;
    let tokens = rows.len() / (3 * width);
    // Keys padded with zeros to whole blocks; the padded scores are never read.
    let padded = tokens.next_multiple_of(LANES);
    let scale = 1.0 / (head as f32).sqrt();
    let mut keys = vec![0f32; head * padded];
    let mut scores = vec![0f32; padded];
    for h in 0..heads {
        let (q0, k0, v0) = (h * head, width + h * head, 2 * width + h * head);
        transpose_keys(rows, k0..k0 + head, width, &mut keys);
        for (i, query) in rows.chunks_exact(3 * width).enumerate() {
            score_keys::<FMA>(&query[q0..q0 + head], &keys, scale, &mut scores);
            let weights = &mut scores[..tokens];
            let total = exp_shifted_by_max::<FMA>(weights);
            let out = &mut out[i * width + h * head..i * width + (h + 1) * head];
            sum_values::<FMA>(weights, total, rows, v0, width, out);
        }
    }
}

/// `a·b + c`, fused where the build has FMA.
#[inline(always)]
fn fma<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// One head's keys (columns `dims` of each token's projections) block by block of 16 keys,
/// dimension by dimension: `keys[(block · head + d) · 16 + l]` is dimension d of key 16 · block + l.
#[inline(always)]
fn transpose_keys(rows: &[f32], dims: std::ops::Range<usize>, width: usize, keys: &mut [f32]) {
    let head = dims.len();
    for (j, row) in rows.chunks_exact(3 * width).enumerate() {
        let (block, l) = (j / LANES, j % LANES);
        for (d, &k) in row[dims.clone()].iter().enumerate() {
            keys[(block * head + d) * LANES + l] = k;
        }
    }
}

/// `scale · q·k` for every key, 16 keys at a time with their sums in registers.
#[inline(always)]
fn score_keys<const FMA: bool>(q: &[f32], keys: &[f32], scale: f32, scores: &mut [f32]) {
    for (block_keys, out) in keys
        .chunks_exact(q.len() * LANES)
        .zip(scores.chunks_exact_mut(LANES))
    {
        let mut acc = [0f32; LANES];
        for (&qd, k) in q.iter().zip(block_keys.chunks_exact(LANES)) {
            for (a, &kj) in acc.iter_mut().zip(k) {
                *a = fma::<FMA>(qd, kj, *a);
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            *o = a * scale;
        }
    }
}

/// Replaces each score by `exp(score − max)` and returns their sum; the exponentials are
/// computed apart from the sum so that they vectorise.
#[inline(always)]
fn exp_shifted_by_max<const FMA: bool>(scores: &mut [f32]) -> f32 {
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for s in scores.iter_mut() {
        *s = crate::simd::exp_lanes::<FMA>(*s - max);
    }
    scores.iter().sum()
}

/// `out = Σⱼ weights[j] · value_j / total` over the head's value columns starting at `v0`, 16
/// columns at a time with their sums in registers; `out` must be zeroed (its columns past the
/// last whole block are added to one by one).
#[inline(always)]
fn sum_values<const FMA: bool>(
    weights: &[f32],
    total: f32,
    rows: &[f32],
    v0: usize,
    width: usize,
    out: &mut [f32],
) {
    let head = out.len();
    let mut blocks = out.chunks_exact_mut(LANES);
    for (block, o) in blocks.by_ref().enumerate() {
        let mut acc = [0f32; LANES];
        for (&p, value) in weights.iter().zip(rows.chunks_exact(3 * width)) {
            let v = &value[v0 + block * LANES..][..LANES];
            for (a, &vc) in acc.iter_mut().zip(v) {
                *a = fma::<FMA>(p, vc, *a);
            }
        }
        for (o, a) in o.iter_mut().zip(acc) {
            *o = a / total;
        }
    }
    let tail = blocks.into_remainder();
    let first = head - tail.len();
    for (p, value) in weights.iter().zip(rows.chunks_exact(3 * width)) {
        let v = &value[v0 + first..v0 + head];
        crate::simd::axpy_lanes::<FMA>(p / total, v, tail);
    }
}

/// A linear layer with a bias, `x · W + b`.
struct Dense {
    weight: Linear,
    bias: Vec<f32>,
}

impl Dense {
    fn load(vb: VarBuilder, inputs: usize, outputs: usize, precision: Precision) -> Result<Self> {
        let (w, b) = Self::weights(vb, inputs, outputs)?;
        Self::new(w, b, precision)
    }

    /// The weight as (inputs × outputs), transposed from PyTorch's (outputs × inputs), and the bias.
    fn weights(vb: VarBuilder, inputs: usize, outputs: usize) -> Result<(Tensor, Vec<f32>)> {
        let w = vb.get((outputs, inputs), "weight")?.t()?.contiguous()?;
        let b = vb.get(outputs, "bias")?.to_vec1::<f32>()?;
        Ok((w, b))
    }

    fn new(w: Tensor, bias: Vec<f32>, precision: Precision) -> Result<Self> {
        let weight = match precision {
            Precision::F32 => Linear::new(w, true)?,
            Precision::Bf16 => Linear::bf16(w)?,
        };
        Ok(Self { weight, bias })
    }
}

struct LayerNorm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    fn load(vb: VarBuilder, width: usize, eps: f32) -> Result<Self> {
        Ok(Self {
            gamma: vb.get(width, "weight")?.to_vec1()?,
            beta: vb.get(width, "bias")?.to_vec1()?,
            eps,
        })
    }

    /// `x + bias + residual`, then each row normalised (biased variance, as PyTorch's
    /// LayerNorm), in place: one pass over the rows for the three steps.
    fn add_and_normalise(&self, x: &mut [f32], bias: &[f32], residual: &[f32]) {
        let width = self.gamma.len();
        x.par_chunks_mut(width * 64)
            .zip(residual.par_chunks(width * 64))
            .for_each(|(x, residual)| {
                #[cfg(target_arch = "x86_64")]
                {
                    if crate::simd::avx2_fma() {
                        // SAFETY: the CPU supports the features the function is compiled for.
                        return unsafe { self.add_and_normalise_avx2_fma(x, bias, residual) };
                    }
                }
                self.add_and_normalise_rows(x, bias, residual)
            });
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn add_and_normalise_avx2_fma(&self, x: &mut [f32], bias: &[f32], residual: &[f32]) {
        self.add_and_normalise_rows(x, bias, residual)
    }

    #[inline(always)]
    fn add_and_normalise_rows(&self, x: &mut [f32], bias: &[f32], residual: &[f32]) {
        let width = self.gamma.len();
        for (row, res) in x.chunks_exact_mut(width).zip(residual.chunks_exact(width)) {
            for ((v, b), r) in row.iter_mut().zip(bias).zip(res) {
                *v += b + r;
            }
            self.normalise(row);
        }
    }

    /// Normalises each row of `x` in place.
    fn apply(&self, x: &mut [f32]) {
        let width = self.gamma.len();
        x.par_chunks_mut(width * 64).for_each(|x| {
            x.chunks_exact_mut(width)
                .for_each(|row| self.normalise(row))
        });
    }

    #[inline(always)]
    fn normalise(&self, row: &mut [f32]) {
        let n = row.len() as f32;
        let mean = lane_sum(row.iter().copied()) / n;
        let var = lane_sum(row.iter().map(|v| (v - mean) * (v - mean))) / n;
        let inv = 1.0 / (var + self.eps).sqrt();
        for ((v, g), b) in row.iter_mut().zip(&self.gamma).zip(&self.beta) {
            *v = (*v - mean) * inv * g + b;
        }
    }
}

/// A sum in eight independent lanes, so that it vectorises (`Iterator::sum` adds one value
/// after the other).
#[inline(always)]
fn lane_sum(values: impl Iterator<Item = f32>) -> f32 {
    let mut lanes = [0f32; 8];
    for (i, v) in values.enumerate() {
        lanes[i % 8] += v;
    }
    lanes.iter().sum()
}

/// Adds `bias` to every row of `x`.
fn add_bias(x: &mut [f32], bias: &[f32]) {
    let width = bias.len();
    x.par_chunks_mut(width * 64).for_each(|x| {
        for row in x.chunks_exact_mut(width) {
            row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
        }
    });
}

/// The exact GELU of `x + bias`, `v · Φ(v) = v/2 · (1 + erf(v/√2))`, in place. The intermediate
/// layer's output is the model's largest activation, so the loop is compiled a second time for
/// AVX2 and FMA and chosen at run time (see `crate::simd`).
fn bias_gelu(x: &mut [f32], bias: &[f32]) {
    x.par_chunks_mut(bias.len() * 16).for_each(|chunk| {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::simd::avx2_fma() {
                // SAFETY: the CPU supports the features the function is compiled for.
                return unsafe { bias_gelu_avx2_fma(chunk, bias) };
            }
        }
        bias_gelu_rows(chunk, bias)
    });
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn bias_gelu_avx2_fma(x: &mut [f32], bias: &[f32]) {
    bias_gelu_rows(x, bias)
}

#[inline(always)]
fn bias_gelu_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            let u = *v + b;
            *v = 0.5 * u * (1.0 + erf(u * std::f32::consts::FRAC_1_SQRT_2));
        }
    }
}

/// erf as a rational function of x on [-4, 4] (beyond, erf is ±1 in f32), with the
/// coefficients of Eigen's and XLA's f32 `erf`: a few units in the last place, no branches, so
/// the GELU loop vectorises.
#[inline(always)]
fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = -2.726_142_3e-10_f32;
    p = p * x2 + 2.770_681_4e-8;
    p = p * x2 - 2.101_024e-6;
    p = p * x2 - 5.692_506_4e-5;
    p = p * x2 - 7.349_906_3e-4;
    p = p * x2 - 2.954_6e-3;
    p = p * x2 - 1.609_603_3e-2;
    let mut q = -1.456_607_2e-5_f32;
    q = q * x2 - 2.133_740_6e-4;
    q = q * x2 - 1.682_827e-3;
    q = q * x2 - 7.373_329e-3;
    q = q * x2 - 1.426_474e-2;
    (x * p / q).clamp(-1.0, 1.0)
}

/// A tensor's values as one flat row-major vector.
fn rows(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?
        .to_vec1::<f32>()
        .context("cannot read the encoder's weights")
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use candle_transformers::models::bert::BertModel;
    use std::collections::HashMap;

    #[test]
    fn erf_is_exact_to_a_few_ulp() {
        let reference = |x: f64| {
            // Abramowitz–Stegun 7.1.26 is too coarse; integrate e^{-t²} instead (Simpson).
            let n = 20_000;
            let h = x / n as f64;
            let f = |t: f64| (-t * t).exp();
            let mut s = f(0.0) + f(x);
            for i in 1..n {
                s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
            }
            s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
        };
        for i in -600..=600 {
            let x = i as f64 / 100.0;
            let got = erf(x as f32) as f64;
            assert!(
                (got - reference(x)).abs() < 3e-7,
                "erf({x}) = {got}, want {}",
                reference(x)
            );
        }
    }

    /// Heads of 8 (all columns in the attention's one-by-one tail) by default.
    fn tiny_config() -> Config {
        config_with(32, 4)
    }

    fn config_with(width: usize, heads: usize) -> Config {
        serde_json::from_value(serde_json::json!({
            "vocab_size": 50, "hidden_size": width, "num_hidden_layers": 2,
            "num_attention_heads": heads, "intermediate_size": 2 * width, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.0, "max_position_embeddings": 16, "type_vocab_size": 2,
            "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0,
            "model_type": "bert"
        }))
        .unwrap()
    }

    /// A BERT with random weights, every tensor `BertModel` and `MiniLm` read.
    fn random_weights(config: &Config) -> HashMap<String, Tensor> {
        let (w, inner) = (config.hidden_size, config.intermediate_size);
        let mut shapes: Vec<(String, Vec<usize>)> = vec![
            (
                "embeddings.word_embeddings.weight".into(),
                vec![config.vocab_size, w],
            ),
            (
                "embeddings.position_embeddings.weight".into(),
                vec![config.max_position_embeddings, w],
            ),
            (
                "embeddings.token_type_embeddings.weight".into(),
                vec![config.type_vocab_size, w],
            ),
            ("embeddings.LayerNorm.weight".into(), vec![w]),
            ("embeddings.LayerNorm.bias".into(), vec![w]),
        ];
        for l in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{l}");
            for name in ["query", "key", "value"] {
                shapes.push((format!("{p}.attention.self.{name}.weight"), vec![w, w]));
                shapes.push((format!("{p}.attention.self.{name}.bias"), vec![w]));
            }
            shapes.push((format!("{p}.attention.output.dense.weight"), vec![w, w]));
            shapes.push((format!("{p}.attention.output.dense.bias"), vec![w]));
            shapes.push((format!("{p}.intermediate.dense.weight"), vec![inner, w]));
            shapes.push((format!("{p}.intermediate.dense.bias"), vec![inner]));
            shapes.push((format!("{p}.output.dense.weight"), vec![w, inner]));
            shapes.push((format!("{p}.output.dense.bias"), vec![w]));
            for norm in ["attention.output.LayerNorm", "output.LayerNorm"] {
                shapes.push((format!("{p}.{norm}.weight"), vec![w]));
                shapes.push((format!("{p}.{norm}.bias"), vec![w]));
            }
        }
        shapes
            .into_iter()
            .map(|(name, shape)| {
                let t = Tensor::randn(0f32, 0.5, shape, &Device::Cpu).unwrap();
                (name, t)
            })
            .collect()
    }

    /// Sentences of different lengths in one ragged batch, the longest over two blocks of keys,
    /// give in f32 what candle's `BertModel` gives each of them alone, mean-pooled; in bf16 they
    /// stay within a cosine of 0.9999 of that. Heads of 8 (the attention's one-by-one tail), 32
    /// (two blocks of 16 columns) and 40 (both).
    #[test]
    fn matches_candle_bert_sentence_by_sentence() {
        let sentences: Vec<Vec<u32>> = vec![
            vec![1, 7, 9, 2],
            vec![1, 3, 2],
            (1..34).chain([2]).collect(),
            vec![1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 2],
            vec![1, 2],
        ];
        let refs: Vec<&[u32]> = sentences.iter().map(|s| s.as_slice()).collect();
        for (width, heads) in [(32, 4), (64, 2), (80, 2)] {
            let mut config = config_with(width, heads);
            config.max_position_embeddings = 40;
            let vb = VarBuilder::from_tensors(random_weights(&config), DType::F32, &Device::Cpu);
            let theirs = BertModel::load(vb.clone(), &config).unwrap();
            let f32_pooled = MiniLm::load(vb.clone(), &config, Precision::F32)
                .unwrap()
                .mean_pooled(&refs)
                .unwrap();
            let bf16_pooled = MiniLm::load(vb, &config, Precision::Bf16)
                .unwrap()
                .mean_pooled(&refs)
                .unwrap();
            for (i, ids) in sentences.iter().enumerate() {
                let t = Tensor::new(ids.as_slice(), &Device::Cpu)
                    .unwrap()
                    .unsqueeze(0)
                    .unwrap();
                let hidden = theirs.forward(&t, &t.zeros_like().unwrap(), None).unwrap();
                let want: Vec<f32> = hidden
                    .mean(1)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let row = |pooled: &[f32]| pooled[i * width..(i + 1) * width].to_vec();
                for (g, w) in row(&f32_pooled).iter().zip(&want) {
                    assert!(
                        (g - w).abs() < 1e-4,
                        "width {width}, sentence {i}: {g} vs {w}"
                    );
                }
                let cosine = cosine(&row(&bf16_pooled), &want);
                assert!(
                    cosine > 0.9999,
                    "width {width}, sentence {i}: cosine {cosine}"
                );
            }
        }
    }

    fn cosine(a: &[f32], b: &[f32]) -> f64 {
        let dot =
            |a: &[f32], b: &[f32]| -> f64 { a.iter().zip(b).map(|(x, y)| (x * y) as f64).sum() };
        dot(a, b) / (dot(a, a) * dot(b, b)).sqrt()
    }

    #[test]
    fn refuses_ids_outside_the_vocabulary_and_overlong_sentences() {
        let config = tiny_config();
        let vb = VarBuilder::from_tensors(random_weights(&config), DType::F32, &Device::Cpu);
        let model = MiniLm::load(vb, &config, Precision::Bf16).unwrap();
        let err = model.mean_pooled(&[&[1, 50, 2]]).unwrap_err();
        assert!(err.to_string().contains("outside the vocabulary"), "{err}");
        let long = vec![1u32; 17];
        let err = model.mean_pooled(&[&long]).unwrap_err();
        assert!(err.to_string().contains("16 positions"), "{err}");
    }
}
