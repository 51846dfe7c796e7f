//! The decoder block's steps on afkit's packed CPU kernels ([`PackedKernels`]), the fast path of
//! [`super::llama::Llama::slot_forward`]: activations stay plain rows (tokens of any rows laid
//! end to end) between the packed matrix products, keys and values go into the rows' slots of a
//! [`SlotCache`], and each token attends over its own row's prefix and own tokens. The
//! arithmetic is the candle ops' ([`super::tensor_ops`]) on slices: candle's ops and the copies
//! in and out of tensors around every product cost a tenth of a decode step.

use anyhow::Result;
use rayon::prelude::*;

use super::block::{Block, Kernels, Projection, Rope, Vector};
use super::cache::{SlotCache, SlotRow};
use super::config::LlamaConfig;
use super::family::{Activation, RopeLayout};
use crate::simd::{axpy_lanes, dot_lanes, exp_lanes};

/// [`Kernels`] over plain rows for the tokens `fed`: each one's row and own position.
pub(crate) struct PackedKernels<'a> {
    pub cfg: &'a LlamaConfig,
    pub ropes: &'a [Rope],
    pub fed: &'a [(&'a SlotRow<'a>, usize)],
    pub cache: &'a mut SlotCache,
}

impl PackedKernels<'_> {
    /// Width of one token's Q, K and V side by side.
    fn qkv_width(&self) -> usize {
        (self.cfg.n_head + 2 * self.cfg.n_kv_head) * self.cfg.head_dim()
    }

    /// Calls `f` with each fed token's query heads and key heads (in its row of Q, K and V)
    /// and the token's absolute position.
    fn query_key_heads(&self, qkv: &mut [f32], mut f: impl FnMut(&mut [f32], &mut [f32], usize)) {
        let (nh, nkv, hd) = (self.cfg.n_head, self.cfg.n_kv_head, self.cfg.head_dim());
        for (qkv, &(row, own)) in qkv.chunks_exact_mut(self.qkv_width()).zip(self.fed) {
            let (q, kv) = qkv.split_at_mut(nh * hd);
            f(q, &mut kv[..nkv * hd], row.prefix.len + own);
        }
    }
}

impl Kernels for PackedKernels<'_> {
    type Rows = Vec<f32>;
    type Parts = Vec<f32>;
    type Heads = Vec<f32>;

    fn rms_norm(&self, x: &Vec<f32>, weight: &Vector) -> Result<Vec<f32>> {
        Ok(rms_norm_plain(x, &weight.plain, self.cfg.rms_eps))
    }

    fn linear(&self, x: &Vec<f32>, w: &Projection, _layer: usize) -> Result<Vec<f32>> {
        w.w.apply(x, self.fed.len())
    }

    fn project(&self, x: &Vec<f32>, w: &Projection, _layer: usize) -> Result<Vec<f32>> {
        w.w.apply(x, self.fed.len())
    }

    fn add_bias(&self, mut x: Vec<f32>, bias: &Vector) -> Result<Vec<f32>> {
        for row in x.chunks_exact_mut(bias.plain.len()) {
            add_into(row, &bias.plain);
        }
        Ok(x)
    }

    fn heads(&self, qkv: Vec<f32>) -> Result<Vec<f32>> {
        Ok(qkv)
    }

    fn norm_heads(
        &self,
        mut qkv: Vec<f32>,
        (q_norm, k_norm): &(Vector, Vector),
    ) -> Result<Vec<f32>> {
        self.query_key_heads(&mut qkv, |q, k, _| {
            norm_heads(q, &q_norm.plain, self.cfg.rms_eps);
            norm_heads(k, &k_norm.plain, self.cfg.rms_eps);
        });
        Ok(qkv)
    }

    fn rotate(&self, mut qkv: Vec<f32>, table: usize) -> Result<Vec<f32>> {
        let (table, layout) = (&self.ropes[table], self.cfg.arch.rope_layout());
        self.query_key_heads(&mut qkv, |q, k, position| {
            rotate(q, table, layout, position);
            rotate(k, table, layout, position);
        });
        Ok(qkv)
    }

    /// Writes each fed token's key and value into its row's slot of the cache, then runs each
    /// token's query heads against its row's prefix and own tokens up to it (within the block's
    /// window).
    fn attend(&mut self, block: &Block, qkv: Vec<f32>) -> Result<Vec<f32>> {
        let c = self.cfg;
        let (hd, nh, nkv) = (c.head_dim(), c.n_head, c.n_kv_head);
        let (width, layer) = (self.qkv_width(), block.layer);
        let stride = self.cache.row_stride;
        let (cache_k, cache_v) = &mut self.cache.kv[layer];
        for (&(row, own), qkv) in self.fed.iter().zip(qkv.chunks_exact(width)) {
            let at = stride * row.slot + own * nkv * hd;
            cache_k[at..at + nkv * hd].copy_from_slice(&qkv[nh * hd..][..nkv * hd]);
            cache_v[at..at + nkv * hd].copy_from_slice(&qkv[(nh + nkv) * hd..]);
        }
        let (cache_k, cache_v) = (&*cache_k, &*cache_v);
        let mut attn = vec![0f32; self.fed.len() * nh * hd];
        attn.par_chunks_mut(nh * hd)
            .zip(qkv.par_chunks(width))
            .zip(self.fed.par_iter())
            .for_each_init(Vec::new, |scores, ((out, qkv), &(row, own))| {
                let slot = stride * row.slot;
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
        Ok(attn)
    }

    fn gated(&self, gate_up: Vec<f32>, activation: Activation) -> Result<Vec<f32>> {
        Ok(gated_plain(&gate_up, self.fed.len(), activation))
    }

    fn add(&self, mut x: Vec<f32>, y: Vec<f32>) -> Result<Vec<f32>> {
        add_into(&mut x, &y);
        Ok(x)
    }
}

/// The gated feed-forward's `act(gate) ⊙ up` over plain rows (rows × 2·d_ff, gate then up in
/// each), one parallel pass.
pub(crate) fn gated_plain(gate_up: &[f32], rows: usize, activation: Activation) -> Vec<f32> {
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

/// RMS norm of each row of `x` (rows × weight's length).
pub(crate) fn rms_norm_plain(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
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

/// Rotary embedding of the heads in `x` (heads × head_dim) at `position`, pairs laid out as
/// `layout` says.
fn rotate(x: &mut [f32], table: &Rope, layout: RopeLayout, position: usize) {
    let half = table.cos_raw.len() / super::config::MAX_POSITIONS;
    let cos = &table.cos_raw[position * half..(position + 1) * half];
    let sin = &table.sin_raw[position * half..(position + 1) * half];
    for head in x.chunks_exact_mut(2 * half) {
        match layout {
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
