//! The BiLSTM of the ensemble, written for candle's CPU autograd rather than with
//! `candle_nn::LSTM`.
//!
//! The parameters and the function are those of two `candle_nn::LSTM`s (same variable names,
//! initialisers and gate order i, f, g, o) over word ⊕ indicator embeddings; only the way the
//! graph is built differs, because on small tensors every candle op costs far more than its
//! arithmetic and the backward pass of some ops costs more than their forward pass:
//!
//! - The input projection `(e_word ⊕ e_indicator) W_ih^T + b_ih + b_hh` only ever sees
//!   (word, indicator) pairs from a small vocabulary, so it is one table lookup per step into a
//!   table computed once per batch, instead of a concatenation, two embedding lookups, a product
//!   and two bias broadcasts per step (each bias broadcast costs a strided reduction backwards).
//! - `W_hh` is transposed once per batch, not once per step: the gradient of a transpose is
//!   accumulated element by element through strides.
//! - Both directions run as one batched recurrence over (2, rows, ·) tensors, with one sigmoid
//!   over all four gates.
//! - Nothing slices a tensor that spans all time steps: in candle the gradient of a slice is
//!   materialised at the full size of what was sliced, which makes per-step slicing quadratic in
//!   the padded length.
//!
//! It is built from candle ops, so it runs unchanged on any device; with afkit's CPU kernels the
//! gate activations and the cell's tanh are the vectorised ops of [`super::gates`] instead of
//! candle's element-by-element `tanh` and sigmoid.

use candle_core::{Result, Tensor, D};
use candle_nn::{embedding, Embedding, Init, VarBuilder};

use super::gates;

/// Rows of both directions, in the layout of [`super::model::TextBatch`]: (rows, len) ids and
/// `sent2` indicators, forward and reversed (padding at the end of both).
pub(crate) struct BiLstmInput<'a> {
    pub ids: &'a Tensor,
    pub in_sent2: &'a Tensor,
    pub ids_rev: &'a Tensor,
    pub in_sent2_rev: &'a Tensor,
}

/// One direction's parameters, named as `candle_nn::LSTM` names them.
struct Direction {
    w_ih: Tensor,
    w_hh: Tensor,
    b_ih: Tensor,
    b_hh: Tensor,
}

impl Direction {
    fn new(input: usize, hidden: usize, suffix: &str, vb: &VarBuilder) -> Result<Self> {
        let kaiming = candle_nn::init::DEFAULT_KAIMING_UNIFORM;
        let zero = Init::Const(0.);
        Ok(Direction {
            w_ih: vb.get_with_hints(
                (4 * hidden, input),
                &format!("weight_ih_l0{suffix}"),
                kaiming,
            )?,
            w_hh: vb.get_with_hints(
                (4 * hidden, hidden),
                &format!("weight_hh_l0{suffix}"),
                kaiming,
            )?,
            b_ih: vb.get_with_hints(4 * hidden, &format!("bias_ih_l0{suffix}"), zero)?,
            b_hh: vb.get_with_hints(4 * hidden, &format!("bias_hh_l0{suffix}"), zero)?,
        })
    }
}

pub(crate) struct BiLstm {
    embed: Embedding,
    indicator: Embedding,
    forward: Direction,
    backward: Direction,
    hidden: usize,
    /// Gate activations from afkit's CPU ops rather than candle ops.
    cpu_kernels: bool,
}

impl BiLstm {
    /// `vb` is the model's prefix: embeddings under `embed` and `indicator`, the two directions
    /// under `lstm` (the backward one with candle's `_reverse` suffix).
    pub(crate) fn new(
        vocab: usize,
        word_dim: usize,
        indicator_dim: usize,
        hidden: usize,
        cpu_kernels: bool,
        vb: VarBuilder,
    ) -> Result<Self> {
        let input = word_dim + indicator_dim;
        let lstm = vb.pp("lstm");
        Ok(BiLstm {
            embed: embedding(vocab, word_dim, vb.pp("embed"))?,
            indicator: embedding(2, indicator_dim, vb.pp("indicator"))?,
            forward: Direction::new(input, hidden, "", &lstm)?,
            backward: Direction::new(input, hidden, "_reverse", &lstm)?,
            hidden,
            cpu_kernels,
        })
    }

    /// Input projections (with both biases) of every (id, indicator) pair, row `2 · id +
    /// indicator`: (2 · vocab, 4 · hidden).
    fn projection_table(&self, dir: &Direction) -> Result<Tensor> {
        let word_dim = self.embed.hidden_size();
        let w_word = dir.w_ih.narrow(1, 0, word_dim)?;
        let w_indicator = dir.w_ih.narrow(1, word_dim, dir.w_ih.dim(1)? - word_dim)?;
        let bias = (&dir.b_ih + &dir.b_hh)?;
        let words = self
            .embed
            .embeddings()
            .matmul(&w_word.t()?)?
            .broadcast_add(&bias)?;
        let indicators = self.indicator.embeddings().matmul(&w_indicator.t()?)?;
        let (vocab, gates) = words.dims2()?;
        words
            .unsqueeze(1)?
            .broadcast_add(&indicators.unsqueeze(0)?)?
            .reshape((vocab * 2, gates))
    }

    /// Hidden states of both directions, (2, rows, len, hidden): index 0 the forward direction
    /// over `ids`, 1 the backward direction over `ids_rev` (time runs over the reversed rows).
    pub(crate) fn hidden_states(&self, input: &BiLstmInput<'_>) -> Result<Tensor> {
        let (rows, len) = input.ids.dims2()?;
        let h = self.hidden;
        // Both directions' tables stacked; the backward direction's rows come after the forward's.
        let table = Tensor::cat(
            &[
                self.projection_table(&self.forward)?,
                self.projection_table(&self.backward)?,
            ],
            0,
        )?;
        let offset = table.dim(0)? as u32 / 2;
        let w_hh_t = Tensor::stack(&[self.forward.w_hh.t()?, self.backward.w_hh.t()?], 0)?;
        // (len, 2 · rows) table rows, time-major so that each step reads one contiguous row.
        let keys = Tensor::cat(
            &[
                pair_keys(input.ids, input.in_sent2, 0)?,
                pair_keys(input.ids_rev, input.in_sent2_rev, offset)?,
            ],
            0,
        )?
        .t()?
        .contiguous()?;
        let device = table.device();
        let mut state_h = Tensor::zeros((2, rows, h), table.dtype(), device)?;
        let mut state_c = state_h.clone();
        let mut hidden = Vec::with_capacity(len);
        for t in 0..len {
            let projected = table
                .index_select(&keys.get(t)?, 0)?
                .reshape((2, rows, 4 * h))?;
            let gates = (projected + state_h.matmul(&w_hh_t)?)?;
            let (in_gate, forget_gate, cell_gate, out_gate) = if self.cpu_kernels {
                let act = gates::gate_activations(&gates, h)?;
                let gate = |i: usize| act.narrow(D::Minus1, i * h, h);
                (gate(0)?, gate(1)?, gate(2)?, gate(3)?)
            } else {
                let sig = candle_nn::ops::sigmoid(&gates)?;
                (
                    sig.narrow(D::Minus1, 0, h)?,
                    sig.narrow(D::Minus1, h, h)?,
                    gates.narrow(D::Minus1, 2 * h, h)?.tanh()?,
                    sig.narrow(D::Minus1, 3 * h, h)?,
                )
            };
            state_c = ((forget_gate * &state_c)? + (in_gate * cell_gate)?)?;
            let cell_tanh = if self.cpu_kernels {
                gates::tanh(&state_c)?
            } else {
                state_c.tanh()?
            };
            state_h = (out_gate * cell_tanh)?;
            hidden.push(state_h.clone());
        }
        Tensor::stack(&hidden, 2)
    }
}

/// Table rows `offset + 2 · id + indicator` of (rows, len) ids and indicators.
fn pair_keys(ids: &Tensor, in_sent2: &Tensor, offset: u32) -> Result<Tensor> {
    let keys: Vec<u32> = ids
        .flatten_all()?
        .to_vec1::<u32>()?
        .into_iter()
        .zip(in_sent2.flatten_all()?.to_vec1::<u32>()?)
        .map(|(id, ind)| offset + 2 * id + ind)
        .collect();
    Tensor::from_vec(keys, ids.shape(), ids.device())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Module, Var};
    use candle_nn::rnn::{Direction as CandleDirection, LSTMConfig, RNN};
    use candle_nn::VarMap;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The reference: two `candle_nn::LSTM`s over the concatenated embeddings, as the ensemble
    /// computed its BiLSTM before.
    fn reference(model: &BiLstm, vb: VarBuilder, input: &BiLstmInput<'_>) -> Result<Tensor> {
        let (word_dim, hidden) = (model.embed.hidden_size(), model.hidden);
        let in_dim = word_dim + model.indicator.hidden_size();
        let backward_cfg = LSTMConfig {
            direction: CandleDirection::Backward,
            ..LSTMConfig::default()
        };
        let fwd = candle_nn::lstm(in_dim, hidden, LSTMConfig::default(), vb.pp("lstm"))?;
        let bwd = candle_nn::lstm(in_dim, hidden, backward_cfg, vb.pp("lstm"))?;
        let run = |lstm: &candle_nn::LSTM, ids: &Tensor, ind: &Tensor| -> Result<Tensor> {
            let xs = Tensor::cat(
                &[model.embed.forward(ids)?, model.indicator.forward(ind)?],
                2,
            )?;
            lstm.states_to_tensor(&lstm.seq(&xs)?)
        };
        Tensor::stack(
            &[
                run(&fwd, input.ids, input.in_sent2)?,
                run(&bwd, input.ids_rev, input.in_sent2_rev)?,
            ],
            0,
        )
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    }

    #[test]
    fn equals_candle_lstm_forward_and_gradients() -> Result<()> {
        equals_candle_lstm(false)
    }

    #[test]
    fn with_cpu_gate_activations_equals_candle_lstm_forward_and_gradients() -> Result<()> {
        equals_candle_lstm(true)
    }

    fn equals_candle_lstm(cpu_kernels: bool) -> Result<()> {
        let device = Device::Cpu;
        let (vocab, rows, len) = (13, 7, 9);
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
        let model = BiLstm::new(vocab, 6, 3, 5, cpu_kernels, vb.clone())?;
        // Non-zero biases, so that folding them into the table is tested too.
        for (name, var) in varmap.data().lock().unwrap().iter() {
            if name.contains("bias") {
                var.set(&Tensor::randn(0f32, 0.5, var.shape(), &device)?)?;
            }
        }
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut ids = vec![0u32; rows * len];
        let mut ind = vec![0u32; rows * len];
        let mut ids_rev = vec![0u32; rows * len];
        let mut ind_rev = vec![0u32; rows * len];
        for r in 0..rows {
            for t in 0..len {
                ids[r * len + t] = rng.random_range(0..vocab as u32);
                ind[r * len + t] = rng.random_range(0..2);
                ids_rev[r * len + t] = rng.random_range(0..vocab as u32);
                ind_rev[r * len + t] = rng.random_range(0..2);
            }
        }
        let ids_t = |v: Vec<u32>| Tensor::from_vec(v, (rows, len), &device);
        let (ids, ind, ids_rev, ind_rev) =
            (ids_t(ids)?, ids_t(ind)?, ids_t(ids_rev)?, ids_t(ind_rev)?);
        let input = BiLstmInput {
            ids: &ids,
            in_sent2: &ind,
            ids_rev: &ids_rev,
            in_sent2_rev: &ind_rev,
        };
        // A loss that weighs every hidden state differently.
        let weights = Tensor::randn(0f32, 1.0, (2, rows, len, 5), &device)?;
        let ours = model.hidden_states(&input)?;
        let theirs = reference(&model, vb, &input)?;
        assert_eq!(ours.dims(), theirs.dims());
        assert!(max_abs_diff(&ours, &theirs) < 1e-5);

        let vars: Vec<(String, Var)> = {
            let data = varmap.data().lock().unwrap();
            let mut named: Vec<_> = data.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
            named.sort_by(|a, b| a.0.cmp(&b.0));
            named
        };
        assert_eq!(
            vars.len(),
            10,
            "embeddings and two directions' weights and biases"
        );
        let g_ours = (ours * &weights)?.sum_all()?.backward()?;
        let g_theirs = (theirs * &weights)?.sum_all()?.backward()?;
        for (name, var) in &vars {
            let a = g_ours.get(var).expect("gradient");
            let b = g_theirs.get(var).expect("gradient");
            let scale = b.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?.max(1.0);
            assert!(max_abs_diff(a, b) / scale < 1e-5, "gradient of {name}");
        }
        Ok(())
    }
}
