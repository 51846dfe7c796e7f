//! BERT (Devlin et al., 2019), defined once: the embeddings and the layers' weights, loaded from
//! the names Hugging Face's `BertModel` gives them, and the encoder's forward pass.
//!
//! The encoder is the embeddings (word piece + position + token type, normalised) followed by N
//! identical layers, each multi-head self-attention, add & norm, a feed-forward network with
//! GELU, add & norm. [`Layer::forward`] writes that once over a [`Run`], which says how the
//! operations are carried out and how the weights are held for them:
//!
//! - [`Tensors`] (`tensors`): candle tensors on a padded batch with an attention mask, with
//!   candle's fused ops or with differentiable ones that training passes gradients through. The
//!   weights as loaded ([`Bert`] without a parameter) are in this form; the cross-encoder trains
//!   them.
//! - [`Packed`] (`packed`): the same weights packed for afkit's GEMM kernels, multiplied in f32
//!   or bf16, on a ragged batch of sentences laid end to end; the sentence encoder runs them.

mod differentiable;
pub(crate) mod packed;
pub(crate) mod tensors;

use std::ops::Range;

use anyhow::{ensure, Result};
use candle_core::Tensor;
use candle_transformers::models::bert::{Config, HiddenAct};

/// How a BERT is run: the form its weights take for that and the operations a layer is made of.
pub(crate) trait Run {
    type Embeddings;
    /// The query, key and value projections and the number of heads.
    type Attention;
    /// A linear layer with a bias.
    type Dense;
    type Norm;
    /// The hidden states of a batch, one row per token.
    type Hidden;
    /// Where the tokens of each text of the batch are.
    type Batch;

    /// Every token's context vector: softmax(q·kᵀ / √d) · v per head over the tokens of its own
    /// text, the heads side by side.
    fn self_attention(
        &self,
        attention: &Self::Attention,
        x: &Self::Hidden,
        batch: &Self::Batch,
    ) -> Result<Self::Hidden>;

    /// `norm(dense(x) + residual)`: a sub-layer's output projection, its residual connection and
    /// its layer norm.
    fn add_and_norm(
        &self,
        dense: &Self::Dense,
        norm: &Self::Norm,
        x: &Self::Hidden,
        residual: &Self::Hidden,
        batch: &Self::Batch,
    ) -> Result<Self::Hidden>;

    /// `GELU(dense(x))` with the exact (erf) GELU: the feed-forward network's inner layer.
    fn gelu(
        &self,
        dense: &Self::Dense,
        x: &Self::Hidden,
        batch: &Self::Batch,
    ) -> Result<Self::Hidden>;
}

/// A BERT encoder: its embeddings and layers, held as `R` runs them.
pub(crate) struct Bert<R: Run> {
    pub(crate) embeddings: R::Embeddings,
    pub(crate) layers: Vec<Layer<R>>,
}

/// One transformer layer's weights.
pub(crate) struct Layer<R: Run> {
    pub(crate) attention: R::Attention,
    pub(crate) attention_output: R::Dense,
    pub(crate) attention_norm: R::Norm,
    pub(crate) intermediate: R::Dense,
    pub(crate) output: R::Dense,
    pub(crate) output_norm: R::Norm,
}

impl<R: Run> Layer<R> {
    /// The layer over the batch's hidden states `x`: self-attention, add & norm, the
    /// feed-forward network, add & norm.
    pub(crate) fn forward(&self, run: &R, x: &R::Hidden, batch: &R::Batch) -> Result<R::Hidden> {
        let context = run.self_attention(&self.attention, x, batch)?;
        let h = run.add_and_norm(
            &self.attention_output,
            &self.attention_norm,
            &context,
            x,
            batch,
        )?;
        let inner = run.gelu(&self.intermediate, &h, batch)?;
        run.add_and_norm(&self.output, &self.output_norm, &inner, &h, batch)
    }
}

impl<R: Run> Bert<R> {
    /// The `layers` (all of them: `0..self.layers.len()`) one after the other over the hidden
    /// states `x`, the embeddings' output or an earlier layer's.
    pub(crate) fn encode(
        &self,
        run: &R,
        layers: Range<usize>,
        mut x: R::Hidden,
        batch: &R::Batch,
    ) -> Result<R::Hidden> {
        for layer in &self.layers[layers] {
            x = layer.forward(run, &x, batch)?;
        }
        Ok(x)
    }
}

/// The embedding tables and their layer norm, as the model stores them.
pub(crate) struct Embeddings {
    /// vocabulary × width
    pub(crate) word: Tensor,
    /// positions × width
    pub(crate) position: Tensor,
    /// token types × width
    pub(crate) token_type: Tensor,
    pub(crate) norm: Norm,
}

/// The query, key and value projections of a layer's self-attention.
pub(crate) struct Attention {
    pub(crate) query: Dense,
    pub(crate) key: Dense,
    pub(crate) value: Dense,
    pub(crate) heads: usize,
}

/// A linear layer `x · Wᵀ + b`.
pub(crate) struct Dense {
    /// outputs × inputs, as PyTorch stores it.
    pub(crate) weight: Tensor,
    pub(crate) bias: Tensor,
}

/// A layer norm over each row (biased variance, as PyTorch's).
pub(crate) struct Norm {
    pub(crate) weight: Tensor,
    pub(crate) bias: Tensor,
    pub(crate) eps: f64,
}

/// Whether afkit's BERT runs a model of `config`.
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

#[cfg(test)]
mod tests {
    use super::packed::{Packed, Spans};
    use super::tensors::Tensors;
    use super::*;
    use crate::lm::linear::Precision;
    use candle_core::{DType, Device};

    /// The packed forward in f32 over a ragged batch and the candle forward, fused and
    /// differentiable, over the same texts padded and masked give every token the same last
    /// hidden state: they are two ways of running one model. Two of the texts are pairs (token
    /// type 1 from their second segment on).
    #[test]
    fn packed_and_tensor_forwards_agree() {
        let config = Config {
            vocab_size: 50,
            hidden_size: 32,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            intermediate_size: 64,
            max_position_embeddings: 40,
            ..Config::default()
        };
        // Every weight random, biases and norms included.
        let weights = crate::fixtures::random_bert_weights(&config, crate::seed::Seed::new(1))
            .into_iter()
            .map(|(name, t)| (name, Tensor::randn(0f32, 0.5, t.shape(), &Device::Cpu)))
            .map(|(name, t)| (name, t.unwrap()))
            .collect();
        let vb = candle_nn::VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu);
        let bert = Bert::load(vb, &config).unwrap();
        let packed = Bert::pack(&bert, Precision::F32).unwrap();
        let sentences: Vec<Vec<u32>> =
            vec![vec![1, 7, 9, 2], (1..34).chain([2]).collect(), vec![1, 2]];
        let refs: Vec<&[u32]> = sentences.iter().map(|s| s.as_slice()).collect();
        let spans = Spans::new(&refs);
        let second_segments = [2, 10, 2];
        let x = packed
            .embeddings
            .forward(&refs, Some(&second_segments), &spans);
        let want = packed.encode(&Packed, 0..2, x.unwrap(), &spans).unwrap();

        let (n, longest, width) = (sentences.len(), 34, config.hidden_size);
        let padded = |value: &dyn Fn(usize, usize) -> u32| -> Tensor {
            let rows = (0..n).flat_map(|s| (0..longest).map(move |i| (s, i)));
            let values: Vec<u32> = rows.map(|(s, i)| value(s, i)).collect();
            Tensor::from_vec(values, (n, longest), &Device::Cpu).unwrap()
        };
        let ids = padded(&|s, i| sentences[s].get(i).copied().unwrap_or(0));
        let types = padded(&|s, i| u32::from(i >= second_segments[s] && i < sentences[s].len()));
        let mask: Vec<f32> = sentences
            .iter()
            .flat_map(|s| (0..longest).map(|i| if i < s.len() { 0.0 } else { -1e4 }))
            .collect();
        let mask = Tensor::from_vec(mask, (n, 1, 1, longest), &Device::Cpu).unwrap();
        for run in [Tensors::FUSED, Tensors::DIFFERENTIABLE] {
            let x = bert.embeddings.forward(&ids, &types);
            let x = x.unwrap().reshape((n * longest, width)).unwrap();
            let got = bert.encode(&run, 0..2, x, &mask).unwrap();
            let got = got.to_vec2::<f32>().unwrap();
            for (s, span) in spans.ranges.iter().enumerate() {
                for (j, row) in span.clone().enumerate() {
                    let want = &want[row * width..(row + 1) * width];
                    for (g, w) in got[s * longest + j].iter().zip(want) {
                        assert!(
                            (g - w).abs() < 1e-4,
                            "{run:?}, sentence {s}, token {j}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }
}
