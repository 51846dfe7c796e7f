//! The decoder block's steps as candle ops ([`TensorKernels`]): the generic engine on any device
//! (prefill, scoring and lockstep decoding over a shared prefix and the rows' own caches), and
//! LoRA training, where the ops must have gradients ([`Pass::Train`]) and adapted projections
//! add their low-rank updates.

use anyhow::{bail, Result};
use candle_core::{Tensor, D};
use candle_nn::ops::{rms_norm, rms_norm_slow, softmax_last_dim};
use candle_nn::rotary_emb::{rope, rope_i, rope_i_slow, rope_slow};

use super::block::{Block, Kernels, Lora, Projection, Rope, Vector};
use super::cache::{Prefix, RowCache};
use super::config::LlamaConfig;
use super::family::{Activation, RopeLayout};
use super::packed::gated_plain;

/// Which ops a forward pass runs: compositions with gradients while training, candle's fused
/// kernels (which have no backward pass) where no gradient flows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Pass {
    Train,
    Infer,
}

impl Pass {
    pub(crate) fn rms_norm(self, x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
        Ok(match self {
            Pass::Train => rms_norm_slow(x, weight, eps)?,
            Pass::Infer => rms_norm(x, weight, eps)?,
        })
    }

    fn rope(self, layout: RopeLayout, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        Ok(match (self, layout) {
            (Pass::Train, RopeLayout::Adjacent) => rope_i_slow(x, cos, sin)?,
            (Pass::Train, RopeLayout::Halves) => rope_slow(x, cos, sin)?,
            (Pass::Infer, RopeLayout::Adjacent) => rope_i(x, cos, sin)?,
            (Pass::Infer, RopeLayout::Halves) => rope(x, cos, sin)?,
        })
    }

    fn softmax(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Pass::Train => {
                let max = x.max_keepdim(D::Minus1)?.detach();
                let e = x.broadcast_sub(&max)?.exp()?;
                Ok(e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?)
            }
            Pass::Infer => Ok(softmax_last_dim(x)?),
        }
    }

    /// The score a mask gives the keys a query must not see: finite while training, so that
    /// the backward pass never multiplies an infinity by zero.
    fn hidden(self) -> f32 {
        match self {
            Pass::Train => -1e9,
            Pass::Infer => f32::NEG_INFINITY,
        }
    }
}

/// A projection's output: its parts, and the whole when one matrix product computed them.
pub(crate) struct Parts {
    whole: Option<Tensor>,
    parts: Vec<Tensor>,
}

/// [`Kernels`] of candle ops for `rows` rows of `steps` tokens each, every row at the same
/// positions: after `prefix` (if any) and the rows' own `cache` (if kept).
pub(crate) struct TensorKernels<'a> {
    pub cfg: &'a LlamaConfig,
    pub ropes: &'a [Rope],
    pub pass: Pass,
    /// afkit's CPU kernels run the model: the gate's activation is one pass over host rows.
    pub cpu_kernels: bool,
    pub lora: Option<&'a Lora>,
    pub rows: usize,
    pub steps: usize,
    pub prefix: Option<&'a Prefix>,
    pub cache: Option<&'a mut RowCache>,
}

impl TensorKernels<'_> {
    /// Position of the first fed token.
    fn start(&self) -> usize {
        self.prefix.map_or(0, |p| p.len) + self.cache.as_ref().map_or(0, |c| c.len)
    }

    /// `parts`, the columns of `x · w` part by part, each with its LoRA update where that
    /// matrix is adapted: `scale · x·Aᵀ·Bᵀ`, per matrix. While training, the gradient must flow
    /// back through `w` to `x`, so `w` must be in a form that passes gradients.
    fn with_updates(
        &self,
        x: &Tensor,
        w: &Projection,
        layer: usize,
        (lora, parts): (&Lora, Vec<Tensor>),
    ) -> Result<Vec<Tensor>> {
        if self.pass == Pass::Train && !w.w.passes_gradients() {
            bail!("LoRA training needs weight products that pass gradients back");
        }
        let updated = parts.into_iter().zip(&w.parts).map(|(y, (name, _))| {
            let Some(pair) = lora.pair(layer, name) else {
                return Ok(y);
            };
            let low = x
                .matmul(&pair.a.as_tensor().t()?)?
                .matmul(&pair.b.as_tensor().t()?)?;
            Ok((y + (low * f64::from(lora.scale))?)?)
        });
        updated.collect()
    }

    /// Keys and values of the block at `layer` after those of the rows' own cache, which keeps
    /// them.
    fn remember(&mut self, layer: usize, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        let Some(cache) = self.cache.as_deref_mut() else {
            return Ok((k, v));
        };
        let (k, v) = match cache.kv.get(layer) {
            Some((k0, v0)) => (Tensor::cat(&[k0, &k], 2)?, Tensor::cat(&[v0, &v], 2)?),
            None => (k, v),
        };
        if cache.kv.len() > layer {
            cache.kv[layer] = (k.clone(), v.clone());
        } else {
            cache.kv.push((k.clone(), v.clone()));
        }
        Ok((k, v))
    }
}

impl Kernels for TensorKernels<'_> {
    type Rows = Tensor;
    type Parts = Parts;
    type Heads = (Tensor, Tensor, Tensor);

    fn rms_norm(&self, x: &Tensor, weight: &Vector) -> Result<Tensor> {
        self.pass.rms_norm(x, &weight.weight, self.cfg.rms_eps)
    }

    fn linear(&self, x: &Tensor, w: &Projection, layer: usize) -> Result<Tensor> {
        match self.lora {
            Some(_) => Ok(self.project(x, w, layer)?.parts.remove(0)),
            None => w.w.forward(x),
        }
    }

    /// The product runs once for all parts; an adapter then adds its update part by part.
    fn project(&self, x: &Tensor, w: &Projection, layer: usize) -> Result<Parts> {
        let whole = w.w.forward(x)?;
        let parts = split_columns(&whole, w.parts.iter().map(|(_, n)| *n))?;
        Ok(match self.lora {
            None => Parts {
                whole: Some(whole),
                parts,
            },
            Some(lora) => Parts {
                whole: None,
                parts: self.with_updates(x, w, layer, (lora, parts))?,
            },
        })
    }

    fn add_bias(&self, x: Parts, bias: &Vector) -> Result<Parts> {
        let widths: Vec<usize> = x.parts.iter().map(|p| p.dim(1)).collect::<Result<_, _>>()?;
        if let Some(whole) = x.whole {
            let whole = whole.broadcast_add(&bias.weight)?;
            let parts = split_columns(&whole, widths)?;
            return Ok(Parts {
                whole: Some(whole),
                parts,
            });
        }
        let biases = split_columns(&bias.weight.unsqueeze(0)?, widths)?;
        let parts = x.parts.iter().zip(biases);
        let parts = parts.map(|(p, b)| Ok(p.broadcast_add(&b.squeeze(0)?)?));
        Ok(Parts {
            whole: None,
            parts: parts.collect::<Result<_>>()?,
        })
    }

    fn heads(&self, qkv: Parts) -> Result<Self::Heads> {
        let (rows, steps, hd) = (self.rows, self.steps, self.cfg.head_dim());
        let heads = |t: &Tensor| -> Result<Tensor> {
            let n = t.dim(1)? / hd;
            Ok(t.reshape((rows, steps, n, hd))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let [q, k, v] = &qkv.parts[..] else {
            bail!("Q, K and V are three parts");
        };
        Ok((heads(q)?, heads(k)?, heads(v)?))
    }

    fn norm_heads(&self, (q, k, v): Self::Heads, norms: &(Vector, Vector)) -> Result<Self::Heads> {
        Ok((
            self.rms_norm(&q, &norms.0)?,
            self.rms_norm(&k, &norms.1)?,
            v,
        ))
    }

    fn rotate(&self, (q, k, v): Self::Heads, table: usize) -> Result<Self::Heads> {
        let (table, start, steps) = (&self.ropes[table], self.start(), self.steps);
        let cos = table.cos.narrow(0, start, steps)?;
        let sin = table.sin.narrow(0, start, steps)?;
        let layout = self.cfg.arch.rope_layout();
        let rotate = |x: &Tensor| self.pass.rope(layout, x, &cos, &sin);
        Ok((rotate(&q)?, rotate(&k)?, v))
    }

    fn attend(&mut self, block: &Block, (q, k, v): Self::Heads) -> Result<Tensor> {
        let c = self.cfg;
        let (hd, nh, nkv) = (c.head_dim(), c.n_head, c.n_kv_head);
        let (rows, steps, group) = (self.rows, self.steps, nh / nkv);
        let plen = self.prefix.map_or(0, |p| p.len);
        let (k, v) = self.remember(block.layer, k, v)?;
        let own_len = k.dim(2)?;
        // Query heads of one key/value group are adjacent: (rows, kv_heads, group·steps, hd).
        let q = (q.reshape((rows, nkv, group * steps, hd))? * (1.0 / (hd as f64).sqrt()))?;
        // Scores against the row's own tokens, causal: query t sits at own position
        // own_len - steps + t.
        let own = q.matmul(&k.transpose(2, 3)?)?;
        let own = if steps > 1 || block.window.is_some() {
            let first = (own_len - steps, 0);
            let mask = attention_mask(steps, first, own_len, block.window, self.pass.hidden());
            own.reshape((rows, nkv, group, steps, own_len))?
                .broadcast_add(&Tensor::from_vec(mask, (steps, own_len), q.device())?)?
                .reshape((rows, nkv, group * steps, own_len))?
        } else {
            own
        };
        let out = match self.prefix {
            None => self.pass.softmax(&own)?.matmul(&v)?,
            Some(prefix) => {
                // Only a local layer hides prefix keys, those its window has passed.
                let mask = block.window.filter(|&w| plen + own_len > w).map(|w| {
                    let first = (plen + own_len - steps, 0);
                    let mask = attention_mask(steps, first, plen, Some(w), f32::NEG_INFINITY);
                    Tensor::from_vec(mask, (steps, plen), q.device())
                });
                let mask = mask.transpose()?;
                attend_with_prefix(&q, &own, &v, &prefix.kv[block.layer], mask.as_ref())?
            }
        };
        // (rows, kv, group·steps, hd) → (rows·steps, heads·hd)
        Ok(out
            .reshape((rows, nh, steps, hd))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((rows * steps, nh * hd))?)
    }

    /// With afkit's CPU kernels, one parallel pass over the host rows (candle's elementwise ops
    /// on the two strided halves cost as much as the matrix products at decode batch sizes);
    /// otherwise candle ops on the model's device.
    fn gated(&self, gate_up: Parts, activation: Activation) -> Result<Tensor> {
        let [gate, up] = &gate_up.parts[..] else {
            bail!("the gate and up projections are two parts");
        };
        if self.cpu_kernels {
            let whole = match gate_up.whole {
                Some(whole) => whole,
                None => Tensor::cat(&[gate, up], 1)?,
            };
            let (rows, width) = whole.dims2()?;
            let input = whole.flatten_all()?.to_vec1::<f32>()?;
            let out = gated_plain(&input, rows, activation);
            return Ok(Tensor::from_vec(out, (rows, width / 2), whole.device())?);
        }
        let gate = match activation {
            Activation::Silu => gate.silu()?,
            // candle's `gelu` is the tanh approximation.
            Activation::GeluTanh => gate.gelu()?,
        };
        Ok((gate * up)?)
    }

    fn add(&self, x: Tensor, y: Tensor) -> Result<Tensor> {
        Ok((x + y)?)
    }
}

/// The columns of `x` (rows × Σ widths) cut into consecutive parts of `widths`.
fn split_columns(x: &Tensor, widths: impl IntoIterator<Item = usize>) -> Result<Vec<Tensor>> {
    let mut at = 0;
    let mut parts = Vec::new();
    for width in widths {
        parts.push(x.narrow(1, at, width)?);
        at += width;
    }
    Ok(parts)
}

/// An additive attention mask (steps × keys): query t sits at position `first_query + t`, key j
/// at `first_key + j`; a query sees no key after it and, with a `window`, none `window` or more
/// positions before it. Keys it does not see score `hidden`.
fn attention_mask(
    steps: usize,
    (first_query, first_key): (usize, usize),
    keys: usize,
    window: Option<usize>,
    hidden: f32,
) -> Vec<f32> {
    let window = window.unwrap_or(usize::MAX);
    (0..steps)
        .flat_map(|t| {
            let query = first_query + t;
            (0..keys).map(move |j| {
                let key = first_key + j;
                if key > query || query - key >= window {
                    hidden
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
