//! Linear maps whose products, forward and backward, run on afkit's packed kernels inside
//! candle's autograd: for training on the CPU.
//!
//! The products are most of a training step's time. On a bf16 kernel each op rounds both
//! operands to bf16 and adds them in f32, as mixed-precision training does on accelerators: on
//! CPUs that multiply bf16 pairs in one instruction (AVX512-BF16, AMX) that is about twice the
//! multiply-adds of f32 per cycle, and bf16 keeps f32's exponent, so gradients neither overflow
//! nor vanish where f32's would not. On an f32 kernel the products are candle's own up to the
//! order of the additions, and faster: candle's GEMM packs the weight again on every call and
//! runs 256-bit FMAs even where the CPU has AVX-512.
//!
//! Two ops: [`dense`] for a layer that trains (the cross-encoder's: gradients for its input,
//! weight and bias) and [`frozen`] for a fixed weight that gradients only pass through (the
//! base matrices and output head under a LoRA adapter). Both take the weight packed both ways
//! round ([`PackedDense`]).

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, CustomOp3, Layout, Result, Shape, Tensor};

use super::{Kernel, PackedMatrix};

/// A linear layer's weight (outputs × inputs) packed for a kernel both ways round: as
/// `wᵀ` for the output and as `w` for the input's gradient. A trained weight is packed again
/// whenever it changes (once per training step) and used by every product until then.
pub(crate) struct PackedDense {
    transposed: PackedMatrix,
    plain: PackedMatrix,
}

impl PackedDense {
    pub(crate) fn new(w: &Tensor, kernel: Kernel) -> Result<Self> {
        let (outputs, inputs) = w.dims2()?;
        let values = flat(w)?;
        Ok(PackedDense {
            transposed: packed(
                &transposed(&values, outputs, inputs),
                inputs,
                outputs,
                kernel,
            )?,
            plain: packed(&values, outputs, inputs, kernel)?,
        })
    }

    /// The kernel both packings are for.
    pub(crate) fn kernel(&self) -> Kernel {
        self.plain.kernel()
    }

    /// Output columns.
    pub(crate) fn outputs(&self) -> usize {
        self.transposed.n
    }

    /// `x · wᵀ` for plain rows `x` (rows × inputs), without a gradient.
    pub(crate) fn apply(&self, x: &[f32], rows: usize) -> anyhow::Result<Vec<f32>> {
        self.transposed.apply(x, rows)
    }
}

/// `x · wᵀ + b` for `x` (rows × inputs) and a linear layer's `w` (outputs × inputs, packed in
/// `packed` with its current values) and `b` (outputs), every product on `packed`'s kernel.
pub(crate) fn dense(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    packed: Arc<PackedDense>,
) -> Result<Tensor> {
    x.apply_op3(w, b, TrainedDense { packed })
}

/// `x · wᵀ` for `x` (rows × inputs) and the fixed weight `w` packed in `packed`, the products
/// on its kernel; the gradient flows to `x` only.
pub(crate) fn frozen(x: &Tensor, packed: Arc<PackedDense>) -> Result<Tensor> {
    x.contiguous()?.apply_op1(FrozenDense { packed })
}

/// The values of a contiguous f32 tensor's storage.
pub(crate) fn values<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(all) = storage else {
        candle_core::bail!("{op} takes f32 tensors");
    };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&all[start..end]),
        None => candle_core::bail!("{op} takes contiguous tensors"),
    }
}

/// A tensor's values as one row-major vector (a copy).
pub(crate) fn flat(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

/// The row-major `k` × `n` matrix `m` packed for `kernel`.
fn packed(m: &[f32], k: usize, n: usize, kernel: Kernel) -> Result<PackedMatrix> {
    PackedMatrix::pack_rows(m, k, n, kernel).map_err(candle_error)
}

/// `a · m` for `a` (rows × m's k, row-major).
fn product(m: &PackedMatrix, a: &[f32], rows: usize) -> Result<Vec<f32>> {
    m.apply(a, rows).map_err(candle_error)
}

/// An error of afkit's kernels as a candle op returns it.
fn candle_error(e: anyhow::Error) -> candle_core::Error {
    candle_core::Error::Msg(format!("{e:#}"))
}

/// Sides of the square tiles [`transposed`] copies: a tile's rows and columns stay in cache.
const TILE: usize = 32;

/// The `cols` × `rows` transpose of a row-major `rows` × `cols` matrix.
fn transposed(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; m.len()];
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    t[c * rows + r] = m[r * cols + c];
                }
            }
        }
    }
    t
}

struct TrainedDense {
    packed: Arc<PackedDense>,
}

impl CustomOp3 for TrainedDense {
    fn name(&self) -> &'static str {
        "packed-dense"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        _s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (rows, _) = l1.shape().dims2()?;
        let (outputs, _) = l2.shape().dims2()?;
        let x = values(s1, l1, self.name())?;
        let b = values(s3, l3, self.name())?;
        let mut y = product(&self.packed.transposed, x, rows)?;
        for row in y.chunks_exact_mut(outputs) {
            row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
        }
        Ok((CpuStorage::F32(y), Shape::from((rows, outputs))))
    }

    /// dx = dy · w, dw = dyᵀ · x, db = Σ dy over the rows.
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let ((rows, inputs), outputs) = (x.dims2()?, w.dim(0)?);
        let (xs, dys) = (flat(x)?, flat(dy)?);
        let dx = product(&self.packed.plain, &dys, rows)?;
        let packed_x = packed(&xs, rows, inputs, self.packed.kernel())?;
        let dw = product(&packed_x, &transposed(&dys, rows, outputs), outputs)?;
        let mut db = vec![0f32; outputs];
        for row in dys.chunks_exact(outputs) {
            db.iter_mut().zip(row).for_each(|(s, v)| *s += v);
        }
        let device = x.device();
        Ok((
            Some(Tensor::from_vec(dx, (rows, inputs), device)?),
            Some(Tensor::from_vec(dw, (outputs, inputs), device)?),
            Some(Tensor::from_vec(db, outputs, device)?),
        ))
    }
}

struct FrozenDense {
    packed: Arc<PackedDense>,
}

impl CustomOp1 for FrozenDense {
    fn name(&self) -> &'static str {
        "packed-frozen-dense"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, _) = layout.shape().dims2()?;
        let x = values(storage, layout, self.name())?;
        let y = product(&self.packed.transposed, x, rows)?;
        Ok((
            CpuStorage::F32(y),
            Shape::from((rows, self.packed.outputs())),
        ))
    }

    /// dx = dy · w.
    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let rows = x.dim(0)?;
        let dx = product(&self.packed.plain, &flat(dy)?, rows)?;
        Ok(Some(Tensor::from_vec(dx, x.shape(), x.device())?))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::lm::linear::Precision;
    use candle_core::{Device, Var};

    /// A matrix of values in [-2, 2] from `seed`.
    pub(crate) fn random(shape: (usize, usize), seed: u64) -> Tensor {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let n = shape.0 * shape.1;
        let v: Vec<f32> = (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state % 20_001) as f32 / 5_000.0 - 2.0
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    /// The bf16 kernels this CPU runs (the AVX2 one on any CPU with AVX2 and FMA).
    pub(crate) fn bf16_kernels() -> Vec<Kernel> {
        let kernels: Vec<Kernel> = Kernel::supported()
            .into_iter()
            .filter(|k| matches!(k.precision(), Precision::Bf16 | Precision::Bf16Tiles))
            .collect();
        assert!(!kernels.is_empty(), "x86-64 CPUs afkit runs on have AVX2");
        kernels
    }

    /// Mean absolute difference over mean absolute value: each operand is within 2⁻⁹ of itself
    /// in bf16, so products are within about 0.4%, and sums of them no further.
    fn relative(a: &Tensor, b: &Tensor) -> f32 {
        let mean_abs = |t: &Tensor| flat(t).unwrap().iter().map(|v| v.abs()).sum::<f32>();
        mean_abs(&(a - b).unwrap()) / mean_abs(b)
    }

    /// The f32 kernels this CPU runs.
    pub(crate) fn f32_kernels() -> Vec<Kernel> {
        Kernel::supported()
            .into_iter()
            .filter(|k| k.precision() == Precision::F32)
            .collect()
    }

    /// Errors of bf16 rounding on a bf16 kernel; on an f32 kernel, of f32 sums added in
    /// another order than candle's.
    fn assert_kernel_rounding(kernel: Kernel, errors: &[f32]) {
        let within = |e: f32| match kernel.precision() {
            Precision::F32 => e < 1e-5,
            _ => e > 0.0 && e < 4e-3,
        };
        assert!(
            errors.iter().all(|&e| within(e)),
            "{kernel:?}: relative errors {errors:?}"
        );
    }

    #[test]
    fn the_packed_linear_layer_and_its_gradients_match_candles_up_to_the_kernels_rounding() {
        // An odd number of rows and inputs: the kernels pad pairs of steps.
        let x = Var::from_tensor(&random((37, 45), 12)).unwrap();
        let w = Var::from_tensor(&random((70, 45), 13)).unwrap();
        let b = Var::from_tensor(&random((1, 70), 14).flatten_all().unwrap()).unwrap();
        let upstream = random((37, 70), 15);
        let loss = |y: &Tensor| (y * &upstream).unwrap().sum_all().unwrap();
        let plain = x
            .as_tensor()
            .matmul(&w.as_tensor().t().unwrap())
            .unwrap()
            .broadcast_add(b.as_tensor())
            .unwrap();
        let gp = loss(&plain).backward().unwrap();
        for kernel in bf16_kernels().into_iter().chain(f32_kernels()) {
            let packed = Arc::new(PackedDense::new(w.as_tensor(), kernel).unwrap());
            let y = dense(x.as_tensor(), w.as_tensor(), b.as_tensor(), packed).unwrap();
            let gb = loss(&y).backward().unwrap();
            let errors = [
                relative(&y, &plain),
                relative(gb.get(&x).unwrap(), gp.get(&x).unwrap()),
                relative(gb.get(&w).unwrap(), gp.get(&w).unwrap()),
            ];
            assert_kernel_rounding(kernel, &errors);
            let (db, dbp) = (flat(gb.get(&b).unwrap()), flat(gp.get(&b).unwrap()));
            for (v, p) in db.unwrap().iter().zip(dbp.unwrap()) {
                assert!((v - p).abs() <= 1e-5 * (1.0 + p.abs()), "{v} vs {p}");
            }
        }
    }

    #[test]
    fn the_frozen_product_and_its_input_gradient_match_candles_up_to_the_kernels_rounding() {
        let x = Var::from_tensor(&random((29, 33), 21)).unwrap();
        let w = random((50, 33), 22);
        let upstream = random((29, 50), 23);
        let loss = |y: &Tensor| (y * &upstream).unwrap().sum_all().unwrap();
        let plain = x.as_tensor().matmul(&w.t().unwrap()).unwrap();
        let gp = loss(&plain).backward().unwrap();
        for kernel in bf16_kernels().into_iter().chain(f32_kernels()) {
            let packed = Arc::new(PackedDense::new(&w, kernel).unwrap());
            let y = frozen(x.as_tensor(), packed.clone()).unwrap();
            let gb = loss(&y).backward().unwrap();
            let errors = [
                relative(&y, &plain),
                relative(gb.get(&x).unwrap(), gp.get(&x).unwrap()),
            ];
            assert_kernel_rounding(kernel, &errors);
            let rows = packed.apply(&flat(x.as_tensor()).unwrap(), 29).unwrap();
            assert_eq!(
                rows,
                flat(&y).unwrap(),
                "the plain rows are the op's output"
            );
        }
    }
}
