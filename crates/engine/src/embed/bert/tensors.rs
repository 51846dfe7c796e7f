//! BERT run on candle tensors over a padded batch, on any of candle's devices.
//!
//! candle-transformers' BERT cannot be trained: its layer norm is a fused op without a backward
//! pass, so no gradient reaches the layers under the last norm. [`Tensors::DIFFERENTIABLE`]
//! runs the layer norm, the softmax and GELU as ops that pass gradients back: on the CPU
//! afkit's fused ones with their own backward pass (`differentiable`), on other devices built
//! from candle's elementary ops; [`Tensors::differentiable_packed`] also runs the linear layers'
//! products, forward and backward, on afkit's kernels. [`Tensors::FUSED`] uses
//! candle's fused ones, without a backward pass, for layers that are not trained.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Result;
use candle_core::{Tensor, TensorId, Var, D};

use candle_nn::VarBuilder;
use candle_transformers::models::bert::Config;

use super::differentiable;
use super::{check_supported, Attention, Bert, Dense, Embeddings, Layer, Norm, Run};
use crate::lm::linear::trainable::{self, PackedDense};
use crate::lm::linear::Kernel;

/// Runs BERT's layers with candle ops. Hidden states are (batch · tokens) × width, the rows of
/// each text padded to the batch's longest; a batch is its additive attention mask
/// (batch × 1 × 1 × tokens: 0 on a text's tokens, a large negative number on its padding).
#[derive(Clone)]
pub(crate) struct Tensors {
    differentiable: bool,
    /// The linear layers whose products run on afkit's kernels (on CPU tensors), by their
    /// weight's id: candle's f32 matmul for the others.
    packed_products: Option<Arc<HashMap<TensorId, Arc<PackedDense>>>>,
}

impl std::fmt::Debug for Tensors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensors")
            .field("differentiable", &self.differentiable)
            .field(
                "packed_layers",
                &self.packed_products.as_ref().map(|m| m.len()),
            )
            .finish()
    }
}

impl Tensors {
    /// candle's fused layer norm and softmax: gradients stop at them.
    pub(crate) const FUSED: Tensors = Tensors {
        differentiable: false,
        packed_products: None,
    };
    /// Layer norm and softmax from ops that pass gradients back; the linear products in f32
    /// with candle's matmul.
    pub(crate) const DIFFERENTIABLE: Tensors = Tensors {
        differentiable: true,
        packed_products: None,
    };

    /// [`Self::DIFFERENTIABLE`] with the products of `layers`' linear layers on `kernel` (one
    /// of this CPU's, bf16 or f32), their weights packed as they are now: made again whenever
    /// the weights change.
    pub(crate) fn differentiable_packed<'a>(
        layers: impl IntoIterator<Item = &'a Layer<Tensors>>,
        kernel: Kernel,
    ) -> Result<Tensors> {
        let mut packed = HashMap::new();
        for layer in layers {
            for dense in layer.dense_layers() {
                let weights = Arc::new(PackedDense::new(&dense.weight, kernel)?);
                packed.insert(dense.weight.id(), weights);
            }
        }
        Ok(Tensors {
            differentiable: true,
            packed_products: Some(Arc::new(packed)),
        })
    }

    fn dense(&self, dense: &Dense, x: &Tensor) -> Result<Tensor> {
        let packed = self.packed_products.as_ref();
        match packed.and_then(|p| p.get(&dense.weight.id())) {
            Some(packed) if x.device().is_cpu() => Ok(trainable::dense(
                &x.contiguous()?,
                &dense.weight,
                &dense.bias,
                packed.clone(),
            )?),
            _ => dense.forward(x),
        }
    }

    fn norm(&self, norm: &Norm, x: &Tensor) -> Result<Tensor> {
        match (self.differentiable, x.device().is_cpu()) {
            (false, _) => norm.fused(x),
            (true, true) => Ok(differentiable::layer_norm(
                &x.contiguous()?,
                &norm.weight,
                &norm.bias,
                norm.eps,
            )?),
            (true, false) => norm.composite(x),
        }
    }

    fn softmax(&self, scores: &Tensor) -> Result<Tensor> {
        Ok(match (self.differentiable, scores.device().is_cpu()) {
            (false, _) => candle_nn::ops::softmax_last_dim(scores)?,
            (true, true) => differentiable::softmax_last_dim(&scores.contiguous()?)?,
            (true, false) => candle_nn::ops::softmax(scores, D::Minus1)?,
        })
    }
}

impl Run for Tensors {
    type Embeddings = Embeddings;
    type Attention = Attention;
    type Dense = Dense;
    type Norm = Norm;
    type Hidden = Tensor;
    type Batch = Tensor;

    fn self_attention(&self, attention: &Attention, x: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let (b, _, _, t) = mask.dims4()?;
        let width = x.dim(1)?;
        let heads = attention.heads;
        let head = width / heads;
        let split = |d: &Dense| -> Result<Tensor> {
            Ok(self
                .dense(d, x)?
                .reshape((b, t, heads, head))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let (q, k, v) = (
            split(&attention.query)?,
            split(&attention.key)?,
            split(&attention.value)?,
        );
        let scores = (q.matmul(&k.t()?)? / (head as f64).sqrt())?.broadcast_add(mask)?;
        Ok(self
            .softmax(&scores)?
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b * t, width))?)
    }

    fn add_and_norm(
        &self,
        dense: &Dense,
        norm: &Norm,
        x: &Tensor,
        residual: &Tensor,
        _: &Tensor,
    ) -> Result<Tensor> {
        self.norm(norm, &(self.dense(dense, x)? + residual)?)
    }

    fn gelu(&self, dense: &Dense, x: &Tensor, _: &Tensor) -> Result<Tensor> {
        let x = self.dense(dense, x)?;
        Ok(match self.differentiable && x.device().is_cpu() {
            true => differentiable::gelu_erf(&x.contiguous()?)?,
            false => x.gelu_erf()?,
        })
    }
}

impl Embeddings {
    /// The normalised sum of the word piece, token type and position embeddings of a padded
    /// batch of `ids` and token `types` (batch × tokens each): batch × tokens × width.
    pub(crate) fn forward(&self, ids: &Tensor, types: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let positions = self.position.narrow(0, 0, t)?;
        let lookup = |table: &Tensor, ids: &Tensor| -> Result<Tensor> {
            Ok(table
                .index_select(&ids.flatten_all()?, 0)?
                .reshape((b, t, ()))?)
        };
        let x = (lookup(&self.word, ids)? + lookup(&self.token_type, types)?)?
            .broadcast_add(&positions)?;
        self.norm.fused(&x)
    }
}

impl Dense {
    /// `x` (rows × inputs) → rows × outputs.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.matmul(&self.weight.t()?)?.broadcast_add(&self.bias)?)
    }
}

impl Norm {
    fn fused(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::layer_norm(
            &x.contiguous()?,
            &self.weight,
            &self.bias,
            self.eps as f32,
        )?)
    }

    /// The layer norm from candle's elementary ops, which pass gradients back on any device.
    fn composite(&self, x: &Tensor) -> Result<Tensor> {
        let centred = x.broadcast_sub(&x.mean_keepdim(D::Minus1)?)?;
        let variance = centred.sqr()?.mean_keepdim(D::Minus1)?;
        Ok(centred
            .broadcast_div(&(variance + self.eps)?.sqrt()?)?
            .broadcast_mul(&self.weight)?
            .broadcast_add(&self.bias)?)
    }
}

impl Layer<Tensors> {
    /// The layer's six linear layers.
    fn dense_layers(&self) -> [&Dense; 6] {
        let a = &self.attention;
        [
            &a.query,
            &a.key,
            &a.value,
            &self.attention_output,
            &self.intermediate,
            &self.output,
        ]
    }

    /// Makes every weight of the layer a variable that an optimiser can change, and returns
    /// them.
    pub(crate) fn make_trainable(&mut self) -> Result<Vec<Var>> {
        let a = &mut self.attention;
        let dense = [
            &mut a.query,
            &mut a.key,
            &mut a.value,
            &mut self.attention_output,
            &mut self.intermediate,
            &mut self.output,
        ]
        .into_iter()
        .flat_map(|d| [&mut d.weight, &mut d.bias]);
        let norms = [&mut self.attention_norm, &mut self.output_norm]
            .into_iter()
            .flat_map(|n| [&mut n.weight, &mut n.bias]);
        dense
            .chain(norms)
            .map(|t| {
                let var = Var::from_tensor(t)?;
                *t = var.as_tensor().clone();
                Ok(var)
            })
            .collect()
    }
}

impl Bert<Tensors> {
    /// The model's weights from `vb` (a `bert.` prefix is allowed), described by `config`, as
    /// f32 tensors on `vb`'s device.
    pub(crate) fn load(vb: VarBuilder, config: &Config) -> Result<Self> {
        check_supported(config)?;
        let vb = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") {
            vb.pp("bert")
        } else {
            vb
        };
        let width = config.hidden_size;
        let emb = vb.pp("embeddings");
        let embeddings = Embeddings {
            word: emb.get((config.vocab_size, width), "word_embeddings.weight")?,
            position: emb.get(
                (config.max_position_embeddings, width),
                "position_embeddings.weight",
            )?,
            token_type: emb.get(
                (config.type_vocab_size, width),
                "token_type_embeddings.weight",
            )?,
            norm: Norm::load(emb.pp("LayerNorm"), config)?,
        };
        let layers = (0..config.num_hidden_layers)
            .map(|i| Layer::load(vb.pp(format!("encoder.layer.{i}")), config))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { embeddings, layers })
    }
}

impl Layer<Tensors> {
    fn load(vb: VarBuilder, config: &Config) -> Result<Self> {
        let (width, inner) = (config.hidden_size, config.intermediate_size);
        let attention = vb.pp("attention");
        let projection = |name: &str| Dense::load(attention.pp("self").pp(name), width, width);
        Ok(Self {
            attention: Attention {
                query: projection("query")?,
                key: projection("key")?,
                value: projection("value")?,
                heads: config.num_attention_heads,
            },
            attention_output: Dense::load(attention.pp("output.dense"), width, width)?,
            attention_norm: Norm::load(attention.pp("output.LayerNorm"), config)?,
            intermediate: Dense::load(vb.pp("intermediate.dense"), width, inner)?,
            output: Dense::load(vb.pp("output.dense"), inner, width)?,
            output_norm: Norm::load(vb.pp("output.LayerNorm"), config)?,
        })
    }
}

impl Dense {
    fn load(vb: VarBuilder, inputs: usize, outputs: usize) -> Result<Self> {
        Ok(Self {
            weight: vb.get((outputs, inputs), "weight")?,
            bias: vb.get(outputs, "bias")?,
        })
    }
}

impl Norm {
    fn load(vb: VarBuilder, config: &Config) -> Result<Self> {
        Ok(Self {
            weight: vb.get(config.hidden_size, "weight")?,
            bias: vb.get(config.hidden_size, "bias")?,
            eps: config.layer_norm_eps,
        })
    }
}
