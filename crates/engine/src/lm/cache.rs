//! What a decoder keeps of the tokens it has read: a context's keys and values shared by every
//! row decoded after it, and each row's own, in lockstep rows or in fixed slots.

use std::sync::OnceLock;

use anyhow::Result;
use candle_core::Tensor;

use super::config::LlamaConfig;
use super::linear::Linear;

/// Keys and values of a context, shared by every row decoded after it: per layer
/// (kv_heads × len × head_dim).
pub(crate) struct Prefix {
    pub(super) kv: Vec<(Tensor, Tensor)>,
    /// The same keys, transposed (kv_heads × head_dim × len), and values (kv_heads × len ×
    /// head_dim) as plain rows, for the packed pass: with keys transposed, a query's scores
    /// against the whole prefix are a sum of scaled key rows (vertical vector arithmetic, no
    /// per-key horizontal sums). Empty under the generic engine, which has no packed pass.
    pub(super) raw_kv: Vec<(Vec<f32>, Vec<f32>)>,
    /// Per layer and key/value head, the transposed keys (head_dim × len) and the values (len ×
    /// head_dim) as matrices, packed the first time several tokens attend to the prefix together
    /// (see [`super::packed`]). Empty under the generic engine.
    pub(super) packed_kv: Vec<OnceLock<Vec<(Linear, Linear)>>>,
    pub len: usize,
    /// Log-probabilities of the next token after the prefix.
    pub next_logprobs: Vec<f32>,
}

/// A row of [`Llama::slot_forward`]: its cache slot, its prefix, the tokens it feeds and the own
/// position of the first of them (0 for the first token after the prefix).
pub(crate) struct SlotRow<'a> {
    pub slot: usize,
    pub prefix: &'a Prefix,
    pub position: usize,
    pub tokens: &'a [u32],
}

/// Keys and values of the tokens each decoding row generated itself, in fixed slots: a slot
/// holds one row at a time and is reused as soon as its row finishes (continuous batching).
/// Per layer, (slot × position × kv_heads × head_dim), allocated once.
pub(crate) struct SlotCache {
    pub(super) kv: Vec<(Vec<f32>, Vec<f32>)>,
    pub(super) slots: usize,
    pub(super) max_len: usize,
    pub(super) row_stride: usize,
}

impl SlotCache {
    /// Room for `slots` rows of up to `max_len` own tokens each.
    pub(crate) fn new(cfg: &LlamaConfig, slots: usize, max_len: usize) -> Self {
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
pub(crate) struct RowCache {
    pub(super) kv: Vec<(Tensor, Tensor)>,
    pub len: usize,
}

impl RowCache {
    /// Keeps only the rows at `rows` (indices into the current rows, in their new order): the
    /// lockstep decode drops rows that have stopped.
    pub(crate) fn keep_rows(&mut self, rows: &[u32]) -> Result<()> {
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
