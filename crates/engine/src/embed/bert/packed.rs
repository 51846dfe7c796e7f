//! BERT run on afkit's packed GEMM kernels over a ragged batch, on the CPU.
//!
//! The sentences of a batch are laid end to end instead of being padded to the longest: every
//! linear layer then multiplies one tall matrix of real tokens, and attention, the only step that
//! must see sentence boundaries, runs per sentence. The weights go through `lm::linear`, which
//! packs them once for afkit's GEMM micro-kernels (AVX-512, or AVX2 with FMA, chosen at run time)
//! and falls back to candle's matmul elsewhere. The products multiply in the [`Precision`] the
//! model was packed with: in bf16 the operands are rounded and the sums kept in f32, which on
//! CPUs with AVX512-BF16 doubles their arithmetic rate; every other CPU computes the same bits
//! with f32 instructions, so a result does not depend on the machine. A text is a single sentence
//! (token type 0) or a pair whose second segment has token type 1, and every token attends to all
//! of its own text's tokens.

use anyhow::{ensure, Context, Result};
use candle_core::Tensor;
use rayon::prelude::*;

use super::tensors::Tensors;
use super::{erf, Bert, Layer, Run};
use crate::lm::linear::{Linear, Precision};

/// Runs BERT's layers on packed weights. Hidden states are tokens × width, row-major, the
/// sentences of a batch one after the other; a batch is the [`Spans`] of its sentences.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Packed;

/// The embedding tables, looked up by word piece and position.
pub(crate) struct Embeddings {
    word: Vec<f32>,
    /// Position embeddings with the first token type's embedding already added.
    position: Vec<f32>,
    /// The second token type's embedding less the first's (empty for a model with one type).
    second_type: Vec<f32>,
    norm: LayerNorm,
    width: usize,
}

/// Query, key and value projections side by side (width × 3·width), one product for all three.
pub(crate) struct Attention {
    qkv: Dense,
    heads: usize,
}

impl Run for Packed {
    type Embeddings = Embeddings;
    type Attention = Attention;
    type Dense = Dense;
    type Norm = LayerNorm;
    type Hidden = Vec<f32>;
    type Batch = Spans;

    fn self_attention(
        &self,
        attention: &Attention,
        x: &Vec<f32>,
        spans: &Spans,
    ) -> Result<Vec<f32>> {
        let mut qkv = attention.qkv.weight.apply(x, spans.tokens)?;
        add_bias(&mut qkv, &attention.qkv.bias);
        let width = attention.qkv.bias.len() / 3;
        Ok(self_attention(&qkv, spans, attention.heads, width))
    }

    fn add_and_norm(
        &self,
        dense: &Dense,
        norm: &LayerNorm,
        x: &Vec<f32>,
        residual: &Vec<f32>,
        spans: &Spans,
    ) -> Result<Vec<f32>> {
        let mut h = dense.weight.apply(x, spans.tokens)?;
        norm.add_and_normalise(&mut h, &dense.bias, residual);
        Ok(h)
    }

    fn gelu(&self, dense: &Dense, x: &Vec<f32>, spans: &Spans) -> Result<Vec<f32>> {
        let mut inner = dense.weight.apply(x, spans.tokens)?;
        bias_gelu(&mut inner, &dense.bias);
        Ok(inner)
    }
}

impl Bert<Packed> {
    /// `bert`'s weights (on the CPU) packed for linear layers that multiply in `precision`.
    pub(crate) fn pack(bert: &Bert<Tensors>, precision: Precision) -> Result<Self> {
        let e = &bert.embeddings;
        let width = e.word.dim(1)?;
        let token_type = rows(&e.token_type)?;
        let mut position = rows(&e.position)?;
        for p in position.chunks_exact_mut(width) {
            for (p, t) in p.iter_mut().zip(&token_type[..width]) {
                *p += t;
            }
        }
        let second_type = match token_type.get(width..2 * width) {
            Some(second) => second.iter().zip(&token_type).map(|(b, a)| b - a).collect(),
            None => Vec::new(),
        };
        let embeddings = Embeddings {
            word: rows(&e.word)?,
            position,
            second_type,
            norm: LayerNorm::pack(&e.norm)?,
            width,
        };
        let layers = bert
            .layers
            .iter()
            .map(|layer| Layer::pack(layer, precision))
            .collect::<Result<_>>()?;
        Ok(Self { embeddings, layers })
    }
}

impl Layer<Packed> {
    fn pack(layer: &Layer<Tensors>, precision: Precision) -> Result<Self> {
        let a = &layer.attention;
        let projections = [&a.query, &a.key, &a.value];
        let weights = projections
            .iter()
            .map(|d| Ok(d.weight.t()?.contiguous()?))
            .collect::<Result<Vec<_>>>()?;
        let mut bias = Vec::new();
        for d in projections {
            bias.extend(d.bias.to_vec1::<f32>()?);
        }
        let qkv = Dense::new(Tensor::cat(&weights, 1)?, bias, precision)?;
        let dense = |d: &super::Dense| Dense::pack(d, precision);
        Ok(Self {
            attention: Attention {
                qkv,
                heads: a.heads,
            },
            attention_output: dense(&layer.attention_output)?,
            attention_norm: LayerNorm::pack(&layer.attention_norm)?,
            intermediate: dense(&layer.intermediate)?,
            output: dense(&layer.output)?,
            output_norm: LayerNorm::pack(&layer.output_norm)?,
        })
    }
}

impl Embeddings {
    /// Values per hidden state.
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// The normalised sum of the word piece, position and token type embeddings of `sentences`
    /// (each its word-piece ids, [CLS] and [SEP] included), laid end to end as `spans` places
    /// them. `second_segments` gives, per sentence, where its token type 1 begins (none: every
    /// token has type 0).
    pub(crate) fn forward(
        &self,
        sentences: &[&[u32]],
        second_segments: Option<&[usize]>,
        spans: &Spans,
    ) -> Result<Vec<f32>> {
        let width = self.width;
        let (vocab, positions) = (self.word.len() / width, self.position.len() / width);
        ensure!(
            second_segments.is_none() || !self.second_type.is_empty(),
            "the model has a single token type, and pairs need two"
        );
        let mut x = Vec::with_capacity(spans.tokens * width);
        for (s, ids) in sentences.iter().enumerate() {
            ensure!(!ids.is_empty(), "a text produced no word pieces");
            ensure!(
                ids.len() <= positions,
                "{} word pieces, more than the model's {positions} positions",
                ids.len(),
            );
            let second = second_segments.map_or(ids.len(), |starts| starts[s]);
            for (position, &id) in ids.iter().enumerate() {
                let id = id as usize;
                ensure!(id < vocab, "word piece {id} is outside the vocabulary");
                let word = &self.word[id * width..(id + 1) * width];
                let pos = &self.position[position * width..(position + 1) * width];
                let start = x.len();
                x.extend(word.iter().zip(pos).map(|(w, p)| w + p));
                if position >= second {
                    for (v, t) in x[start..].iter_mut().zip(&self.second_type) {
                        *v += t;
                    }
                }
            }
        }
        self.norm.apply(&mut x);
        Ok(x)
    }
}

/// Where each sentence's tokens lie in the batch's rows.
pub(crate) struct Spans {
    pub(crate) ranges: Vec<std::ops::Range<usize>>,
    pub(crate) tokens: usize,
}

impl Spans {
    pub(crate) fn new(sentences: &[&[u32]]) -> Self {
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

/// [`attend`] compiled for AVX2 and FMA, which the baseline x86-64 build lacks (it has
/// four-lane vectors and separate multiplies and adds).
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

/// A linear layer with a bias, `x · W + b`, its weight packed.
pub(crate) struct Dense {
    weight: Linear,
    bias: Vec<f32>,
}

impl Dense {
    fn pack(dense: &super::Dense, precision: Precision) -> Result<Self> {
        let w = dense.weight.t()?.contiguous()?;
        Self::new(w, dense.bias.to_vec1::<f32>()?, precision)
    }

    /// A layer of weight `w` (inputs × outputs) and `bias`.
    fn new(w: Tensor, bias: Vec<f32>, precision: Precision) -> Result<Self> {
        let weight = match precision {
            Precision::F32 => Linear::new(w, true)?,
            Precision::Bf16 => Linear::bf16(w)?,
            Precision::Bf16Tiles => Linear::bf16_tiles(w)?,
            Precision::Int8 => Linear::int8(w)?,
        };
        Ok(Self { weight, bias })
    }
}

/// A layer norm's scale and shift as plain vectors.
pub(crate) struct LayerNorm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    fn pack(norm: &super::Norm) -> Result<Self> {
        Ok(Self {
            gamma: norm.weight.to_vec1()?,
            beta: norm.bias.to_vec1()?,
            eps: norm.eps as f32,
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

/// A tensor's values as one flat row-major vector.
fn rows(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?
        .to_vec1::<f32>()
        .context("cannot read the encoder's weights")
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
