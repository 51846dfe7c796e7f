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

use crate::lm::linear::Linear;

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

impl MiniLm {
    /// The encoder's weights from `vb` (the model's safetensors), described by `config`.
    pub fn load(vb: VarBuilder, config: &Config) -> Result<Self> {
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
            .map(|i| Layer::load(vb.pp(format!("encoder.layer.{i}")), config))
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
    fn load(vb: VarBuilder, config: &Config) -> Result<Self> {
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
        let qkv = Dense::new(Tensor::cat(&weights, 1)?, bias)?;
        Ok(Self {
            qkv,
            attention_output: Dense::load(attention.pp("output.dense"), width, width)?,
            attention_norm: LayerNorm::load(attention.pp("output.LayerNorm"), width, eps)?,
            intermediate: Dense::load(vb.pp("intermediate.dense"), width, inner)?,
            output: Dense::load(vb.pp("output.dense"), inner, width)?,
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

/// One sentence's attention: `rows` are its tokens' fused projections, `out` its tokens'
/// context vectors (zeroed).
#[inline(always)]
fn attend<const FMA: bool>(rows: &[f32], out: &mut [f32], heads: usize, width: usize) {
    let head = width / heads;
    let scale = 1.0 / (head as f32).sqrt();
    let mut scores = vec![0f32; rows.len() / (3 * width)];
    for h in 0..heads {
        let (q0, k0, v0) = (h * head, width + h * head, 2 * width + h * head);
        for (i, query) in rows.chunks_exact(3 * width).enumerate() {
            let q = &query[q0..q0 + head];
            for (score, key) in scores.iter_mut().zip(rows.chunks_exact(3 * width)) {
                *score = crate::simd::dot_lanes::<FMA>(q, &key[k0..k0 + head]) * scale;
            }
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut total = 0.0;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                total += *s;
            }
            let o = &mut out[i * width + h * head..i * width + (h + 1) * head];
            for (p, value) in scores.iter().zip(rows.chunks_exact(3 * width)) {
                crate::simd::axpy_lanes::<FMA>(p / total, &value[v0..v0 + head], o);
            }
        }
    }
}

/// A linear layer with a bias, `x · W + b`.
struct Dense {
    weight: Linear,
    bias: Vec<f32>,
}

impl Dense {
    fn load(vb: VarBuilder, inputs: usize, outputs: usize) -> Result<Self> {
        let (w, b) = Self::weights(vb, inputs, outputs)?;
        Self::new(w, b)
    }

    /// The weight as (inputs × outputs), transposed from PyTorch's (outputs × inputs), and the bias.
    fn weights(vb: VarBuilder, inputs: usize, outputs: usize) -> Result<(Tensor, Vec<f32>)> {
        let w = vb.get((outputs, inputs), "weight")?.t()?.contiguous()?;
        let b = vb.get(outputs, "bias")?.to_vec1::<f32>()?;
        Ok((w, b))
    }

    fn new(w: Tensor, bias: Vec<f32>) -> Result<Self> {
        Ok(Self {
            weight: Linear::bf16(w)?,
            bias,
        })
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

    fn tiny_config() -> Config {
        serde_json::from_value(serde_json::json!({
            "vocab_size": 50, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 64, "hidden_act": "gelu",
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

    /// Sentences of different lengths in one ragged batch give what candle's `BertModel` gives
    /// each of them alone, mean-pooled.
    #[test]
    fn matches_candle_bert_sentence_by_sentence() {
        let config = tiny_config();
        let weights = random_weights(&config);
        let vb = VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu);
        let ours = MiniLm::load(vb.clone(), &config).unwrap();
        let theirs = BertModel::load(vb, &config).unwrap();
        let sentences: Vec<Vec<u32>> = vec![
            vec![1, 7, 9, 2],
            vec![1, 3, 2],
            vec![1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 2],
            vec![1, 2],
        ];
        let refs: Vec<&[u32]> = sentences.iter().map(|s| s.as_slice()).collect();
        let got = ours.mean_pooled(&refs).unwrap();
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
            let row = &got[i * 32..(i + 1) * 32];
            for (g, w) in row.iter().zip(&want) {
                assert!((g - w).abs() < 1e-4, "sentence {i}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn refuses_ids_outside_the_vocabulary_and_overlong_sentences() {
        let config = tiny_config();
        let vb = VarBuilder::from_tensors(random_weights(&config), DType::F32, &Device::Cpu);
        let model = MiniLm::load(vb, &config).unwrap();
        let err = model.mean_pooled(&[&[1, 50, 2]]).unwrap_err();
        assert!(err.to_string().contains("outside the vocabulary"), "{err}");
        let long = vec![1u32; 17];
        let err = model.mean_pooled(&[&long]).unwrap_err();
        assert!(err.to_string().contains("16 positions"), "{err}");
    }
}
