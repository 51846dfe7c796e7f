//! The mean of a row's embeddings (bag of words, bag of subwords) as one candle op with its own
//! backward pass.
//!
//! Built from candle ops, the mean looks every id up into a (rows, len, dim) tensor, multiplies
//! it by the padding mask and sums over the ids; the backward pass makes two more tensors of that
//! size before scattering into the table. An ending has 100–200 hashed character n-grams, so for
//! the subword model those tensors were the largest of a training step, and their reductions
//! and fills took a quarter of an ensemble iteration's time. Here the forward pass adds each
//! row's table rows into one vector and the backward pass adds each row's gradient onto the table
//! rows it read, in the same order as candle's ops, so the results do not change. The op has a
//! CPU kernel only; on other devices the models use candle ops.

use std::sync::Arc;

use candle_core::{bail, CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};

use super::windows::f32_data;

/// The mean over each row of `ids` (rows, len; 0 = padding, not counted) of the rows of
/// `table` (vocabulary, dim) they name, divided by `lengths` (rows, 1: the number of real ids,
/// at least 1) → (rows, dim). CPU tensors only.
pub(crate) fn bag_mean(table: &Tensor, ids: &Tensor, lengths: &Tensor) -> Result<Tensor> {
    let (rows, len) = ids.dims2()?;
    let op = BagMean {
        ids: Arc::new(ids.flatten_all()?.to_vec1::<u32>()?),
        lengths: Arc::new(lengths.flatten_all()?.to_vec1::<f32>()?),
        rows,
        len,
    };
    table.contiguous()?.apply_op1(op)
}

/// The ids and lengths are shared with the backward op rather than copied.
#[derive(Clone)]
struct BagMean {
    ids: Arc<Vec<u32>>,
    lengths: Arc<Vec<f32>>,
    rows: usize,
    len: usize,
}

impl BagMean {
    /// The real ids of row `r`.
    fn row_ids(&self, r: usize) -> impl Iterator<Item = usize> + '_ {
        self.ids[r * self.len..(r + 1) * self.len]
            .iter()
            .filter(|&&id| id != 0)
            .map(|&id| id as usize)
    }
}

impl CustomOp1 for BagMean {
    fn name(&self) -> &'static str {
        "bag-mean"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (vocab, dim) = layout.shape().dims2()?;
        let table = f32_data(storage, layout, self.name())?;
        if self.ids.iter().any(|&id| id as usize >= vocab) {
            bail!(
                "{}: an id is outside the table of {vocab} rows",
                self.name()
            )
        }
        let mut out = vec![0f32; self.rows * dim];
        for (r, sum) in out.chunks_exact_mut(dim).enumerate() {
            for id in self.row_ids(r) {
                for (s, v) in sum.iter_mut().zip(&table[id * dim..(id + 1) * dim]) {
                    *s += v;
                }
            }
            let length = self.lengths[r];
            sum.iter_mut().for_each(|s| *s /= length);
        }
        Ok((CpuStorage::F32(out), Shape::from((self.rows, dim))))
    }

    fn bwd(&self, table: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let grad = grad_res.contiguous()?.apply_op1_no_bwd(&BagMeanGrad {
            bag: self.clone(),
            vocab: table.dim(0)?,
        })?;
        Ok(Some(grad))
    }
}

/// The adjoint of [`BagMean`]: (rows, dim) → (vocabulary, dim), each row's gradient divided by
/// its length and added onto every table row it read.
struct BagMeanGrad {
    bag: BagMean,
    vocab: usize,
}

impl CustomOp1 for BagMeanGrad {
    fn name(&self) -> &'static str {
        "bag-mean-grad"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, dim) = layout.shape().dims2()?;
        let grad = f32_data(storage, layout, self.name())?;
        let mut out = vec![0f32; self.vocab * dim];
        let mut share = vec![0f32; dim];
        for (r, g) in grad.chunks_exact(dim).enumerate().take(rows) {
            let length = self.bag.lengths[r];
            for (s, g) in share.iter_mut().zip(g) {
                *s = g / length;
            }
            for id in self.bag.row_ids(r) {
                for (o, s) in out[id * dim..(id + 1) * dim].iter_mut().zip(&share) {
                    *o += s;
                }
            }
        }
        Ok((CpuStorage::F32(out), Shape::from((self.vocab, dim))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// The candle-ops mean the op replaces.
    fn with_candle_ops(table: &Tensor, ids: &Tensor, lengths: &Tensor) -> Result<Tensor> {
        let mask = ids
            .ne(0u32)?
            .to_dtype(candle_core::DType::F32)?
            .unsqueeze(2)?;
        let (rows, len) = ids.dims2()?;
        let looked_up = table
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((rows, len, ()))?;
        looked_up
            .broadcast_mul(&mask)?
            .sum(1)?
            .broadcast_div(lengths)
    }

    #[test]
    fn equals_candle_ops_forward_and_gradient() -> Result<()> {
        let device = Device::Cpu;
        let table = Var::randn(0f32, 1.0, (11, 5), &device)?;
        // Three rows of different lengths, one with a repeated id and one all padding.
        let ids = Tensor::new(&[[3u32, 7, 3, 0], [10, 1, 0, 0], [0, 0, 0, 0]], &device)?;
        let lengths = Tensor::new(&[[3f32], [2.], [1.]], &device)?;
        let ours = bag_mean(&table, &ids, &lengths)?;
        let theirs = with_candle_ops(&table, &ids, &lengths)?;
        let diff = (&ours - &theirs)?.abs()?.flatten_all()?.max(0)?;
        assert_eq!(diff.to_scalar::<f32>()?, 0.0);

        let weights = Tensor::randn(0f32, 1.0, ours.shape(), &device)?;
        let g_ours = (ours * &weights)?.sum_all()?.backward()?;
        let g_theirs = (theirs * &weights)?.sum_all()?.backward()?;
        let (a, b) = (g_ours.get(&table).unwrap(), g_theirs.get(&table).unwrap());
        let diff = (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        assert!(diff < 1e-6, "gradient differs by {diff}");
        Ok(())
    }

    #[test]
    fn an_id_outside_the_table_is_an_error() {
        let device = Device::Cpu;
        let table = Tensor::zeros((4, 2), candle_core::DType::F32, &device).unwrap();
        let ids = Tensor::new(&[[1u32, 4]], &device).unwrap();
        let lengths = Tensor::new(&[[2f32]], &device).unwrap();
        assert!(bag_mean(&table, &ids, &lengths).is_err());
    }
}
