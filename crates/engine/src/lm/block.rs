//! The decoder block, written once for every family and every engine:
//!
//! ```text
//! h       = RMSNorm(x)
//! q, k, v = h·Wq (+ bq), h·Wk (+ bk), h·Wv (+ bv)      biases: qwen2
//! q, k    = RMSNorm(q), RMSNorm(k), head by head        qwen3, gemma3
//! q, k    = RoPE(q), RoPE(k)                            gemma3's local layers: own base
//! a       = softmax(q·kᵀ/√d_head + causal mask)·v       K, V shared by groups of query heads
//! x       = x + PostNorm(a·Wo)                          PostNorm: gemma3
//! h       = RMSNorm(x)
//! x       = x + PostNorm((act(h·Wgate) ⊙ h·Wup)·Wdown)  act: SiLU; gemma3: GELU (tanh)
//! ```
//!
//! [`Block::forward`] is that structure, and [`load_block`] its weights; how each step is
//! computed belongs to a [`Kernels`]: candle ops over tensors on any device, with gradients and
//! LoRA's low-rank additions to the projections when training ([`super::tensor_ops`]), or
//! afkit's packed CPU kernels over plain rows with a KV cache in slots ([`super::packed`]).
//! Which parts a family switches on is [`super::family`]'s business; a block only holds the
//! weights of the parts it has.

use std::collections::BTreeMap;

use anyhow::Result;
use candle_core::{DType, Device, Tensor, Var};

use super::config::{LlamaConfig, MAX_POSITIONS};
use super::family::Activation;
use super::linear::Linear;
use crate::device::Compute;

/// A weight vector (a norm's weight, a bias), on the model's device and as plain values for the
/// packed kernels (read once at load, not on every step).
pub(crate) struct Vector {
    pub weight: Tensor,
    pub plain: Vec<f32>,
}

impl Vector {
    pub(crate) fn new(weight: Tensor) -> Result<Self> {
        let plain = weight.to_vec1()?;
        Ok(Vector { weight, plain })
    }
}

/// A projection (in × out) whose output columns are the GGUF matrices `parts` side by side
/// (Q, K and V; gate and up), so that the engine runs it as one matrix product.
pub(crate) struct Projection {
    pub w: Linear,
    /// Each part's GGUF name (as LoRA updates name them) and output width.
    pub parts: Vec<(&'static str, usize)>,
}

/// One decoder block's weights. The optional parts are the families' extras.
pub(crate) struct Block {
    /// The block's place in the stack: which cache and adapter entries are its.
    pub layer: usize,
    pub attn_norm: Vector,
    pub wqkv: Projection,
    /// Biases of Q, K and V side by side.
    pub qkv_bias: Option<Vector>,
    /// The norms of each query head and of each key head.
    pub qk_norm: Option<(Vector, Vector)>,
    pub wo: Projection,
    pub post_attn_norm: Option<Vector>,
    pub ffn_norm: Vector,
    pub w_gate_up: Projection,
    pub w_down: Projection,
    pub post_ffn_norm: Option<Vector>,
    /// Index of the block's rotary table (0: the model's, 1: the local layers').
    pub rope: usize,
    /// How many positions back (its own included) a local layer's tokens see.
    pub window: Option<usize>,
    /// The feed-forward's gate nonlinearity.
    pub activation: Activation,
}

/// The trainable pair of one adapted matrix: its update is `scale · B·A`, A (rank × in), B
/// (out × rank).
pub(crate) struct LoraPair {
    pub a: Var,
    pub b: Var,
}

/// A LoRA adapter being trained: per adapted block (the top ones, from `first`), its pairs by
/// GGUF matrix name.
pub(crate) struct Lora {
    pub first: usize,
    pub blocks: Vec<BTreeMap<&'static str, LoraPair>>,
    pub scale: f32,
}

impl Lora {
    /// The pair adapting part `name` of block `layer`, if it is adapted.
    pub(crate) fn pair(&self, layer: usize, name: &str) -> Option<&LoraPair> {
        let i = layer.checked_sub(self.first)?;
        self.blocks.get(i)?.get(name)
    }
}

/// The rotary embedding of one base: cosines and sines (position × head_dim/2) on the model's
/// device and as plain rows for the packed pass.
pub(crate) struct Rope {
    pub cos: Tensor,
    pub sin: Tensor,
    pub cos_raw: Vec<f32>,
    pub sin_raw: Vec<f32>,
}

impl Rope {
    pub(crate) fn new(head_dim: usize, theta: f32, device: &Device) -> Result<Self> {
        let (cos, sin) = rotary_tables(head_dim, theta)?;
        Ok(Rope {
            cos_raw: cos.flatten_all()?.to_vec1()?,
            sin_raw: sin.flatten_all()?.to_vec1()?,
            cos: cos.to_device(device)?,
            sin: sin.to_device(device)?,
        })
    }
}

/// Cosines and sines of the rotary embedding (position × head_dim/2) on the CPU.
fn rotary_tables(head_dim: usize, theta: f32) -> Result<(Tensor, Tensor)> {
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

/// How an engine computes the steps of [`Block::forward`].
pub(crate) trait Kernels {
    /// Activations, one row per token (tokens × width).
    type Rows;
    /// A projection's output, as its parts.
    type Parts;
    /// Queries, keys and values, as heads.
    type Heads;

    fn rms_norm(&self, x: &Self::Rows, weight: &Vector) -> Result<Self::Rows>;
    /// `x · W` for a projection of one part, in block `layer`.
    fn linear(&self, x: &Self::Rows, w: &Projection, layer: usize) -> Result<Self::Rows>;
    /// `x · W` for a projection of several parts, in block `layer`.
    fn project(&self, x: &Self::Rows, w: &Projection, layer: usize) -> Result<Self::Parts>;
    /// Adds a bias over all the parts, side by side.
    fn add_bias(&self, x: Self::Parts, bias: &Vector) -> Result<Self::Parts>;
    /// Q, K and V as heads.
    fn heads(&self, qkv: Self::Parts) -> Result<Self::Heads>;
    /// RMS norm of each query head and of each key head.
    fn norm_heads(&self, heads: Self::Heads, norms: &(Vector, Vector)) -> Result<Self::Heads>;
    /// Rotates the queries and keys at their positions with rotary table `table`.
    fn rotate(&self, heads: Self::Heads, table: usize) -> Result<Self::Heads>;
    /// Attention of the queries over the keys they may see (the engine's caches included);
    /// keeps the keys and values for later steps. Rows of the heads' outputs side by side.
    fn attend(&mut self, block: &Block, heads: Self::Heads) -> Result<Self::Rows>;
    /// `act(gate) ⊙ up` of the gate and up projections.
    fn gated(&self, gate_up: Self::Parts, activation: Activation) -> Result<Self::Rows>;
    /// `x + y`.
    fn add(&self, x: Self::Rows, y: Self::Rows) -> Result<Self::Rows>;
}

impl Block {
    /// The block over `x` (tokens × d_model): attention then the gated feed-forward, each
    /// normed on the way in (and, for Gemma, on the way out) and added to the residual stream.
    pub(crate) fn forward<K: Kernels>(&self, x: K::Rows, k: &mut K) -> Result<K::Rows> {
        let h = k.rms_norm(&x, &self.attn_norm)?;
        let attn = self.attention(&h, k)?;
        let out = k.linear(&attn, &self.wo, self.layer)?;
        let x = k.add(x, self.post_norm(out, &self.post_attn_norm, k)?)?;

        let h = k.rms_norm(&x, &self.ffn_norm)?;
        let gate_up = k.project(&h, &self.w_gate_up, self.layer)?;
        let act = k.gated(gate_up, self.activation)?;
        let out = k.linear(&act, &self.w_down, self.layer)?;
        k.add(x, self.post_norm(out, &self.post_ffn_norm, k)?)
    }

    /// Grouped-query attention over `h`: Q, K and V projected (with Qwen 2's biases), the
    /// query and key heads normed (Qwen 3, Gemma 3) and rotated, then attended (the caller
    /// projects the result through `Wo`).
    fn attention<K: Kernels>(&self, h: &K::Rows, k: &mut K) -> Result<K::Rows> {
        let mut qkv = k.project(h, &self.wqkv, self.layer)?;
        if let Some(bias) = &self.qkv_bias {
            qkv = k.add_bias(qkv, bias)?;
        }
        let mut heads = k.heads(qkv)?;
        if let Some(norms) = &self.qk_norm {
            heads = k.norm_heads(heads, norms)?;
        }
        let heads = k.rotate(heads, self.rope)?;
        k.attend(self, heads)
    }

    /// `x` through `norm`, if the block has it.
    fn post_norm<K: Kernels>(&self, x: K::Rows, norm: &Option<Vector>, k: &K) -> Result<K::Rows> {
        match norm {
            Some(norm) => k.rms_norm(&x, norm),
            None => Ok(x),
        }
    }
}

/// Reads block `layer`'s weights through `load` (which applies any adapter): llama's matrices
/// and norms, plus what the model's family adds. Matrices are stored transposed (in × out), Q,
/// K and V side by side, gate and up side by side.
pub(crate) fn load_block(
    cfg: &LlamaConfig,
    layer: usize,
    compute: &Compute,
    load: &mut impl FnMut(&str) -> Result<Tensor>,
) -> Result<Block> {
    let mut w = |part: &str| load(&format!("blk.{layer}.{part}.weight"));
    let projection = |parts: Vec<(&'static str, Tensor)>| -> Result<Projection> {
        let widths = parts.iter().map(|(name, w)| Ok((*name, w.dim(0)?)));
        let widths = widths.collect::<Result<_>>()?;
        let matrices: Vec<&Tensor> = parts.iter().map(|(_, w)| w).collect();
        let w = Linear::fastest(Tensor::cat(&matrices, 0)?.t()?, compute)?;
        Ok(Projection { w, parts: widths })
    };
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
    let qkv = vec![
        ("attn_q", w("attn_q")?),
        ("attn_k", w("attn_k")?),
        ("attn_v", w("attn_v")?),
    ];
    let gate_up = vec![("ffn_gate", w("ffn_gate")?), ("ffn_up", w("ffn_up")?)];
    let block = Block {
        layer,
        attn_norm: Vector::new(w("attn_norm")?)?,
        wqkv: projection(qkv)?,
        qkv_bias: None,
        qk_norm,
        wo: projection(vec![("attn_output", w("attn_output")?)])?,
        post_attn_norm,
        ffn_norm: Vector::new(w("ffn_norm")?)?,
        w_gate_up: projection(gate_up)?,
        w_down: projection(vec![("ffn_down", w("ffn_down")?)])?,
        post_ffn_norm,
        rope: usize::from(arch.window(layer).is_some()),
        window: arch.window(layer),
        activation: arch.activation(),
    };
    let qkv_bias = arch.qkv_bias().then(|| load_qkv_bias(layer, load));
    Ok(Block {
        qkv_bias: qkv_bias.transpose()?,
        ..block
    })
}

/// Qwen 2's biases of Q, K and V of block `layer`, side by side.
fn load_qkv_bias(layer: usize, load: &mut impl FnMut(&str) -> Result<Tensor>) -> Result<Vector> {
    let mut bias = |part: &str| load(&format!("blk.{layer}.{part}.bias"));
    let (bq, bk, bv) = (bias("attn_q")?, bias("attn_k")?, bias("attn_v")?);
    Vector::new(Tensor::cat(&[bq, bk, bv], 0)?)
}
