//! The decoder block's steps on afkit's packed CPU kernels ([`PackedKernels`]), the fast path of
//! [`super::llama::Llama::slot_forward`]: activations stay plain rows (tokens of any rows laid
//! end to end) between the packed matrix products, keys and values go into the rows' slots of a
//! [`SlotCache`], and each token attends over its own row's prefix and own tokens. The
//! arithmetic is the candle ops' ([`super::tensor_ops`]) on slices: candle's ops and the copies
//! in and out of tensors around every product cost a tenth of a decode step.

use anyhow::Result;
use rayon::prelude::*;

use super::block::{Block, Kernels, Projection, Rope, Vector};
use super::cache::{Prefix, SlotCache, SlotRow};
use super::config::LlamaConfig;
use super::family::{Activation, RopeLayout};
use super::linear::{Kernel, Linear};
use crate::simd::{axpy_lanes, dot_lanes, exp_lanes, sum_lanes};

/// [`Kernels`] over plain rows for the tokens `fed`: each one's row and own position.
pub(crate) struct PackedKernels<'a> {
    pub cfg: &'a LlamaConfig,
    pub ropes: &'a [Rope],
    pub fed: &'a [(&'a SlotRow<'a>, usize)],
    pub cache: &'a mut SlotCache,
    /// The kernel of the shared-prefix products ([`SharedPrefix`]); without one every token
    /// attends alone.
    pub prefix_kernel: Option<Kernel>,
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
    /// window): tokens that share a prefix and see all of it together (see [`SharedPrefix`]),
    /// the rest one by one.
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
        let first_key = |&(row, own): &(&SlotRow, usize)| {
            block
                .window
                .map_or(0, |w| (row.prefix.len + own + 1).saturating_sub(w))
        };
        let own_keys = |&(row, own): &(&SlotRow, usize)| {
            let seen = stride * row.slot..stride * row.slot + (own + 1) * nkv * hd;
            (&cache_k[seen.clone()], &cache_v[seen])
        };
        let groups = match self.prefix_kernel {
            Some(_) => SharedPrefix::groups(self.fed, first_key),
            None => Vec::new(),
        };
        let mut attn = vec![0f32; self.fed.len() * nh * hd];
        let mut alone = vec![true; self.fed.len()];
        if let Some(kernel) = self.prefix_kernel {
            groups.iter().flatten().for_each(|&t| alone[t] = false);
            let shared: Vec<SharedPrefix> = groups
                .iter()
                .map(|tokens| SharedPrefix {
                    prefix: self.fed[tokens[0]].0.prefix,
                    tokens,
                    queries: &qkv,
                    width,
                    heads: (nh, nkv, hd),
                })
                .collect();
            let own_keys = |t: usize| own_keys(&self.fed[t]);
            attend_shared(&shared, (layer, kernel), own_keys, &mut attn)?;
        }
        attn.par_chunks_mut(nh * hd)
            .enumerate()
            .filter(|(t, _)| alone[*t])
            .for_each_init(Vec::new, |scores, (t, out)| {
                let fed_token = &self.fed[t];
                let (pk, pv) = &fed_token.0.prefix.raw_kv[layer];
                RowAttention {
                    q: &qkv[t * width..][..nh * hd],
                    prefix: (pk, pv),
                    own: own_keys(fed_token),
                    heads: (nh, nkv, hd),
                    first_key: first_key(fed_token),
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

/// The attention of every group of tokens that share a prefix, written into `attn` (fed tokens
/// × heads × head_dim): one parallel pass over every group's key/value heads, the products
/// inside on the same threads (a pass per head left the threads waiting between small
/// products). The products run on `kernel`; `own_keys` gives a fed token's own keys and values
/// up to it.
fn attend_shared<'k>(
    shared: &[SharedPrefix],
    (layer, kernel): (usize, Kernel),
    own_keys: impl Fn(usize) -> (&'k [f32], &'k [f32]) + Sync,
    attn: &mut [f32],
) -> Result<()> {
    let tasks: Vec<(&SharedPrefix, usize)> = shared
        .iter()
        .flat_map(|s| (0..s.heads.1).map(move |kv_head| (s, kv_head)))
        .collect();
    let outputs = tasks
        .par_iter()
        .map(|&(s, kv_head)| {
            let packed = s.prefix.packed(layer, (s.heads.1, s.heads.2), kernel)?;
            s.head_output(kv_head, &packed[kv_head], &own_keys)
        })
        .collect::<Result<Vec<_>>>()?;
    for (&(s, kv_head), output) in tasks.iter().zip(outputs) {
        s.write(kv_head, &output, attn);
    }
    Ok(())
}

impl Prefix {
    /// Layer `layer`'s keys (transposed, head_dim × len) and values (len × head_dim) of each
    /// key/value head as matrices packed for `kernel`, packed on first use and kept while the
    /// prefix lives.
    fn packed(
        &self,
        layer: usize,
        (nkv, hd): (usize, usize),
        kernel: Kernel,
    ) -> Result<&[(Linear, Linear)]> {
        if let Some(packed) = self.packed_kv[layer].get() {
            return Ok(packed);
        }
        let (keys, values) = &self.raw_kv[layer];
        let per_head = hd * self.len;
        let packed = (0..nkv)
            .map(|h| {
                let range = h * per_head..(h + 1) * per_head;
                Ok((
                    Linear::packed_rows(&keys[range.clone()], hd, kernel)?,
                    Linear::packed_rows(&values[range], self.len, kernel)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(self.packed_kv[layer].get_or_init(|| packed))
    }
}

/// Tokens of one prefix that see all of it, attending together: for each key/value head, the
/// scores of all their query heads against the prefix's keys are one matrix product, and so are
/// the prefix values' weighted sums. One token at a time, every query head streamed the whole
/// prefix's keys and values again (a prompt of style examples is hundreds of tokens); as
/// products, they are read once per step at the speed of the weight products. The packed
/// kernels add each product in the order a token alone does, so the results are the same bits.
struct SharedPrefix<'a> {
    prefix: &'a Prefix,
    /// Indices into the pass's fed tokens.
    tokens: &'a [usize],
    /// Every fed token's Q, K and V side by side (`width` values a token).
    queries: &'a [f32],
    width: usize,
    /// (query heads, key/value heads, head dim).
    heads: (usize, usize, usize),
}

impl SharedPrefix<'_> {
    /// Fewest tokens that attend together: below it, packing the matrices costs more than the
    /// products save.
    const MIN_TOKENS: usize = 4;

    /// The groups of at least [`Self::MIN_TOKENS`] fed tokens that share a prefix and see all
    /// of it (their window starts at 0); the other tokens attend alone. The products add in the
    /// order a token alone does (see [`softmax_with_own`]) only on the packed kernels.
    fn groups(
        fed: &[(&SlotRow, usize)],
        first_key: impl Fn(&(&SlotRow, usize)) -> usize,
    ) -> Vec<Vec<usize>> {
        let mut by_prefix: Vec<(&Prefix, Vec<usize>)> = Vec::new();
        for (t, fed_token) in fed.iter().enumerate() {
            if first_key(fed_token) > 0 {
                continue;
            }
            let prefix = fed_token.0.prefix;
            match by_prefix.iter_mut().find(|(p, _)| std::ptr::eq(*p, prefix)) {
                Some((_, tokens)) => tokens.push(t),
                None => by_prefix.push((prefix, vec![t])),
            }
        }
        by_prefix
            .into_iter()
            .map(|(_, tokens)| tokens)
            .filter(|tokens| tokens.len() >= Self::MIN_TOKENS)
            .collect()
    }

    /// The attention output of key/value head `kv_head`'s query heads for each token (tokens ×
    /// query heads of the group × head_dim). `keys` and `values` are the prefix's for that head;
    /// `own_keys` gives a token's own keys and values up to it.
    fn head_output<'k>(
        &self,
        kv_head: usize,
        (keys, values): &(Linear, Linear),
        own_keys: impl Fn(usize) -> (&'k [f32], &'k [f32]) + Sync,
    ) -> Result<Vec<f32>> {
        let (nh, nkv, hd) = self.heads;
        let group = nh / nkv;
        let scale = 1.0 / (hd as f32).sqrt();
        let rows = self.tokens.len() * group;
        let query_of = |r: usize| {
            let (t, query) = self.row(kv_head, r);
            (t, &self.queries[t * self.width + query * hd..][..hd])
        };
        // One query row per (token, query head of this key/value head), scaled as a token alone
        // scales it.
        let q: Vec<f32> = (0..rows)
            .flat_map(|r| query_of(r).1.iter().map(|&x| x * scale))
            .collect();
        let mut weights = keys.apply(&q, rows)?;
        let plen = weights.len() / rows;
        let head = KeyHead {
            index: kv_head,
            heads: nkv,
            dim: hd,
        };
        // Each row's own scores after its prefix scores, one softmax over both.
        let own_weights: Vec<Vec<f32>> = weights
            .par_chunks_mut(plen)
            .enumerate()
            .map(|(r, prefix_scores)| {
                let (t, q) = query_of(r);
                softmax_with_own(prefix_scores, (q, scale), head.keys(own_keys(t).0))
            })
            .collect();
        let mut mixed = values.apply(&weights, rows)?;
        for (r, (out, own)) in mixed.chunks_exact_mut(hd).zip(&own_weights).enumerate() {
            add_weighted(out, own, head.keys(own_keys(query_of(r).0).1));
        }
        Ok(mixed)
    }

    /// Copies [`Self::head_output`]'s rows for `kv_head` into `out` (fed tokens × heads ×
    /// head_dim).
    fn write(&self, kv_head: usize, output: &[f32], out: &mut [f32]) {
        let (nh, _, hd) = self.heads;
        for (r, row) in output.chunks_exact(hd).enumerate() {
            let (t, query) = self.row(kv_head, r);
            out[(t * nh + query) * hd..][..hd].copy_from_slice(row);
        }
    }

    /// The fed token and the query head of row `r` of key/value head `kv_head`'s products (a
    /// row per token and query head of the key/value head's group).
    fn row(&self, kv_head: usize, r: usize) -> (usize, usize) {
        let group = self.heads.0 / self.heads.1;
        (self.tokens[r / group], kv_head * group + r % group)
    }
}

/// One key/value head's slice of a row's own keys or values (own tokens × key/value heads ×
/// head dim).
#[derive(Clone, Copy)]
struct KeyHead {
    index: usize,
    heads: usize,
    dim: usize,
}

impl KeyHead {
    /// Each own token's slice for this head.
    fn keys(self, own: &[f32]) -> impl Iterator<Item = &[f32]> {
        own.chunks_exact(self.heads * self.dim)
            .map(move |token| &token[self.index * self.dim..][..self.dim])
    }
}

/// Scores `q` (unscaled, and its scale) against `own_keys`, then turns the prefix's scores (in
/// place) and the own ones (returned) into one softmax: the arithmetic of [`RowAttention`], in
/// its order, so that a token gets the same bits alone or with others.
fn softmax_with_own<'k>(
    prefix: &mut [f32],
    (q, scale): (&[f32], f32),
    own_keys: impl Iterator<Item = &'k [f32]>,
) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::avx2_fma() {
            // SAFETY: the CPU supports the features the function is compiled for.
            return unsafe { softmax_with_own_avx2_fma(prefix, (q, scale), own_keys) };
        }
    }
    softmax_with_own_lanes::<false>(prefix, (q, scale), own_keys)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_with_own_avx2_fma<'k>(
    prefix: &mut [f32],
    (q, scale): (&[f32], f32),
    own_keys: impl Iterator<Item = &'k [f32]>,
) -> Vec<f32> {
    softmax_with_own_lanes::<true>(prefix, (q, scale), own_keys)
}

#[inline(always)]
fn softmax_with_own_lanes<'k, const FMA: bool>(
    prefix: &mut [f32],
    (q, scale): (&[f32], f32),
    own_keys: impl Iterator<Item = &'k [f32]>,
) -> Vec<f32> {
    let mut own = Vec::new();
    for key in own_keys {
        own.push(dot_lanes::<FMA>(q, key) * scale);
    }
    normalise_lanes::<FMA>(prefix, &mut own);
    own
}

/// Scores (the prefix's, then the own ones) turned into softmax weights in place. The
/// exponentials and each part's sum run in passes of their own, which vectorise; a row gets the
/// same bits wherever its scores are split the same way.
#[inline(always)]
fn normalise_lanes<const FMA: bool>(prefix: &mut [f32], own: &mut [f32]) {
    let max = crate::simd::max(prefix).max(crate::simd::max(own));
    for s in prefix.iter_mut() {
        *s = exp_lanes::<FMA>(*s - max);
    }
    for s in own.iter_mut() {
        *s = exp_lanes::<FMA>(*s - max);
    }
    let total = sum_lanes(prefix) + sum_lanes(own);
    for s in prefix.iter_mut() {
        *s /= total;
    }
    for s in own.iter_mut() {
        *s /= total;
    }
}

/// `out += Σ weights[j] · values[j]`, in order, as [`RowAttention`] adds them.
fn add_weighted<'v>(out: &mut [f32], weights: &[f32], values: impl Iterator<Item = &'v [f32]>) {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::avx2_fma() {
            // SAFETY: the CPU supports the features the function is compiled for.
            return unsafe { add_weighted_avx2_fma(out, weights, values) };
        }
    }
    add_weighted_lanes::<false>(out, weights, values)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn add_weighted_avx2_fma<'v>(
    out: &mut [f32],
    weights: &[f32],
    values: impl Iterator<Item = &'v [f32]>,
) {
    add_weighted_lanes::<true>(out, weights, values)
}

#[inline(always)]
fn add_weighted_lanes<'v, const FMA: bool>(
    out: &mut [f32],
    weights: &[f32],
    values: impl Iterator<Item = &'v [f32]>,
) {
    for (&w, value) in weights.iter().zip(values) {
        axpy_lanes::<FMA>(w, value, out);
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
            // Split where a grouped token's scores are split (see `softmax_with_own`).
            let (prefix_scores, own_scores) = scores.split_at_mut(seen_prefix);
            normalise_lanes::<FMA>(prefix_scores, own_scores);
            let oh = &mut out[head * hd..(head + 1) * hd];
            oh.fill(0.0);
            for (j, &p) in scores[..seen_prefix].iter().enumerate() {
                let at = (kv_head * plen + skip_prefix + j) * hd;
                axpy_lanes::<FMA>(p, &pv[at..][..hd], oh);
            }
            for (j, &p) in scores[seen_prefix..].iter().enumerate() {
                let at = ((skip_own + j) * nkv + kv_head) * hd;
                axpy_lanes::<FMA>(p, &own_v[at..][..hd], oh);
            }
        }
    }
}
