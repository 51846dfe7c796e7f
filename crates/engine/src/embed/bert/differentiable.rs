//! Layer norm, softmax and GELU as single candle ops with their own backward pass, for the
//! layers the cross-encoder trains on the CPU; and a linear layer whose products, forward and
//! backward, run on afkit's bf16 kernels.
//!
//! Built from candle's elementary ops (as they are on other devices), a layer norm is nine ops
//! forward and more backward, the softmax five, GELU's derivative ten, each allocating and
//! walking a tensor as large as the activations: in a profile of the fine-tuning they took more
//! time than the matrix products. Fused, each is one pass forward and one backward over rows
//! that stay in cache. The backward passes recompute what they need from the op's input and
//! output instead of keeping intermediates.
//!
//! Rows are processed in fixed chunks on rayon's threads and per-chunk sums are added in chunk
//! order, so the results do not depend on the number of threads.
//!
//! The linear layer ([`dense_bf16`]) rounds both operands of each of its three products (the
//! output, the input's gradient, the weight's gradient) to bf16 and adds their products in f32,
//! as mixed-precision training does on accelerators. On CPUs that multiply bf16 pairs in one
//! instruction (AVX512-BF16, AMX) that is about twice the multiply-adds of f32 per cycle, and
//! the products are most of a training step's time; bf16 keeps f32's exponent, so gradients
//! neither overflow nor vanish where f32's would not.

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use crate::lm::linear::{Kernel, PackedMatrix};

/// Rows per parallel task: enough work to pay for the task, few enough to spread a small batch.
const CHUNK_ROWS: usize = 32;

/// `(x - mean) / sqrt(var + eps) · gamma + beta` over the last dimension of `x`.
pub(crate) fn layer_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Result<Tensor> {
    x.apply_op3(gamma, beta, LayerNorm { eps: eps as f32 })
}

/// The softmax over the last dimension of `x`.
pub(crate) fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    x.apply_op1(Softmax)
}

/// The exact GELU, `x · Φ(x)`, elementwise.
pub(crate) fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    x.apply_op1(GeluErf)
}

/// A linear layer's weight (outputs × inputs) packed for a bf16 kernel both ways round: as
/// `wᵀ` for the output and as `w` for the input's gradient. Packed once per training step (the
/// weights change only when the optimiser steps), then used by every product of the step.
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
}

/// `x · wᵀ + b` for `x` (rows × inputs) and a linear layer's `w` (outputs × inputs, packed in
/// `packed` with its current values) and `b` (outputs), every product's operands in bf16.
pub(crate) fn dense_bf16(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    packed: Arc<PackedDense>,
) -> Result<Tensor> {
    x.apply_op3(w, b, DenseBf16 { packed })
}

/// The values of a contiguous f32 tensor's storage.
fn values<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(all) = storage else {
        candle_core::bail!("{op} takes f32 tensors");
    };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&all[start..end]),
        None => candle_core::bail!("{op} takes contiguous tensors"),
    }
}

/// A tensor's values as one row-major vector (a copy).
fn flat(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

struct LayerNorm {
    eps: f32,
}

/// A row's mean and 1 / standard deviation.
fn moments(row: &[f32], eps: f32) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = row.iter().sum::<f32>() / n;
    let variance = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    (mean, 1.0 / (variance + eps).sqrt())
}

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "fused-layer-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let x = values(s1, l1, self.name())?;
        let gamma = values(s2, l2, self.name())?;
        let beta = values(s3, l3, self.name())?;
        let width = gamma.len();
        let mut y = vec![0f32; x.len()];
        y.par_chunks_mut(width * CHUNK_ROWS)
            .zip(x.par_chunks(width * CHUNK_ROWS))
            .for_each(|(y, x)| {
                for (y, x) in y.chunks_exact_mut(width).zip(x.chunks_exact(width)) {
                    let (mean, inv_std) = moments(x, self.eps);
                    for (((y, x), g), b) in y.iter_mut().zip(x).zip(gamma).zip(beta) {
                        *y = (x - mean) * inv_std * g + b;
                    }
                }
            });
        Ok((CpuStorage::F32(y), l1.shape().clone()))
    }

    /// With x̂ the normalised row and g = dy · gamma: dx = (g - mean(g) - x̂ · mean(g · x̂)) / std,
    /// dgamma = Σ dy · x̂ and dbeta = Σ dy over the rows.
    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        _beta: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (xs, dys, gammas) = (flat(x)?, flat(dy)?, flat(gamma)?);
        let width = gammas.len();
        let mut dx = vec![0f32; xs.len()];
        let partial: Vec<(Vec<f32>, Vec<f32>)> = dx
            .par_chunks_mut(width * CHUNK_ROWS)
            .zip(xs.par_chunks(width * CHUNK_ROWS))
            .zip(dys.par_chunks(width * CHUNK_ROWS))
            .map(|((dx, x), dy)| self.rows_backward(dx, x, dy, &gammas))
            .collect();
        let (mut dgamma, mut dbeta) = (vec![0f32; width], vec![0f32; width]);
        for (g, b) in partial {
            dgamma.iter_mut().zip(g).for_each(|(s, v)| *s += v);
            dbeta.iter_mut().zip(b).for_each(|(s, v)| *s += v);
        }
        let device = x.device();
        Ok((
            Some(Tensor::from_vec(dx, x.shape(), device)?),
            Some(Tensor::from_vec(dgamma, width, device)?),
            Some(Tensor::from_vec(dbeta, width, device)?),
        ))
    }
}

impl LayerNorm {
    /// The backward pass of a chunk of rows: fills `dx`, returns the chunk's (dgamma, dbeta).
    fn rows_backward(
        &self,
        dx: &mut [f32],
        x: &[f32],
        dy: &[f32],
        gamma: &[f32],
    ) -> (Vec<f32>, Vec<f32>) {
        let width = gamma.len();
        let (mut dgamma, mut dbeta) = (vec![0f32; width], vec![0f32; width]);
        let mut normalised = vec![0f32; width];
        let rows = dx
            .chunks_exact_mut(width)
            .zip(x.chunks_exact(width))
            .zip(dy.chunks_exact(width));
        for ((dx, x), dy) in rows {
            let (mean, inv_std) = moments(x, self.eps);
            let (mut g_mean, mut gx_mean) = (0f32, 0f32);
            for i in 0..width {
                let xhat = (x[i] - mean) * inv_std;
                normalised[i] = xhat;
                let g = dy[i] * gamma[i];
                g_mean += g;
                gx_mean += g * xhat;
                dgamma[i] += dy[i] * xhat;
                dbeta[i] += dy[i];
            }
            let n = width as f32;
            let (g_mean, gx_mean) = (g_mean / n, gx_mean / n);
            for i in 0..width {
                let g = dy[i] * gamma[i];
                dx[i] = (g - g_mean - normalised[i] * gx_mean) * inv_std;
            }
        }
        (dgamma, dbeta)
    }
}

struct Softmax;

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "fused-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = values(storage, layout, self.name())?;
        let width = *layout.dims().last().unwrap_or(&1);
        let mut y = x.to_vec();
        y.par_chunks_mut(width * CHUNK_ROWS).for_each(|chunk| {
            for row in chunk.chunks_exact_mut(width) {
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for v in row.iter_mut() {
                    *v = (*v - max).exp();
                    sum += *v;
                }
                row.iter_mut().for_each(|v| *v /= sum);
            }
        });
        Ok((CpuStorage::F32(y), layout.shape().clone()))
    }

    /// dx = y · (dy - Σ dy · y) along each row.
    fn bwd(&self, x: &Tensor, y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let (ys, mut dx) = (flat(y)?, flat(dy)?);
        let width = *x.dims().last().unwrap_or(&1);
        dx.par_chunks_mut(width * CHUNK_ROWS)
            .zip(ys.par_chunks(width * CHUNK_ROWS))
            .for_each(|(dx, y)| {
                for (dx, y) in dx.chunks_exact_mut(width).zip(y.chunks_exact(width)) {
                    let dot: f32 = dx.iter().zip(y).map(|(d, y)| d * y).sum();
                    dx.iter_mut().zip(y).for_each(|(d, y)| *d = y * (*d - dot));
                }
            });
        Ok(Some(Tensor::from_vec(dx, x.shape(), x.device())?))
    }
}

struct GeluErf;

/// Elements per parallel task of GELU.
const GELU_CHUNK: usize = 16 * 1024;

impl CustomOp1 for GeluErf {
    fn name(&self) -> &'static str {
        "fused-gelu-erf"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let mut y = values(storage, layout, self.name())?.to_vec();
        y.par_chunks_mut(GELU_CHUNK).for_each(|chunk| {
            for v in chunk {
                *v = 0.5 * *v * (1.0 + super::erf(*v * std::f32::consts::FRAC_1_SQRT_2));
            }
        });
        Ok((CpuStorage::F32(y), layout.shape().clone()))
    }

    /// d/dx x · Φ(x) = Φ(x) + x · φ(x).
    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let (xs, mut dx) = (flat(x)?, flat(dy)?);
        const INV_SQRT_2PI: f32 = 0.398_942_3;
        dx.par_chunks_mut(GELU_CHUNK)
            .zip(xs.par_chunks(GELU_CHUNK))
            .for_each(|(dx, x)| {
                for (d, &x) in dx.iter_mut().zip(x) {
                    let cdf = 0.5 * (1.0 + super::erf(x * std::f32::consts::FRAC_1_SQRT_2));
                    let pdf = INV_SQRT_2PI * (-0.5 * x * x).exp();
                    *d *= cdf + x * pdf;
                }
            });
        Ok(Some(Tensor::from_vec(dx, x.shape(), x.device())?))
    }
}

struct DenseBf16 {
    packed: Arc<PackedDense>,
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

impl CustomOp3 for DenseBf16 {
    fn name(&self) -> &'static str {
        "bf16-dense"
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
        let packed_x = packed(&xs, rows, inputs, self.packed.plain.kernel())?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var, D};

    fn random(shape: (usize, usize), seed: u64) -> Tensor {
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

    fn close(a: &Tensor, b: &Tensor, tolerance: f32) {
        let (a, b) = (flat(a).unwrap(), flat(b).unwrap());
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= tolerance * (1.0 + y.abs()), "{x} vs {y}");
        }
    }

    /// The value and the gradients of `sum(op(x) · w)` (w fixed, so every output's gradient
    /// differs) through the fused op and through candle's elementary ops agree.
    #[test]
    fn layer_norm_and_its_gradients_match_candles_elementary_ops() {
        let x = Var::from_tensor(&random((70, 48), 1)).unwrap();
        let gamma =
            Var::from_tensor(&(random((1, 48), 2).flatten_all().unwrap() + 1.0).unwrap()).unwrap();
        let beta = Var::from_tensor(&random((1, 48), 3).flatten_all().unwrap()).unwrap();
        let w = random((70, 48), 4);
        let eps = 1e-12;
        let composite = |x: &Tensor| -> Tensor {
            let centred = x
                .broadcast_sub(&x.mean_keepdim(D::Minus1).unwrap())
                .unwrap();
            let variance = centred.sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
            let scale = (variance + eps).unwrap().sqrt().unwrap();
            let normed = centred.broadcast_div(&scale).unwrap();
            let scaled = normed.broadcast_mul(gamma.as_tensor()).unwrap();
            scaled.broadcast_add(beta.as_tensor()).unwrap()
        };
        let fused = layer_norm(x.as_tensor(), gamma.as_tensor(), beta.as_tensor(), eps).unwrap();
        let plain = composite(x.as_tensor());
        close(&fused, &plain, 1e-5);
        let loss = |y: &Tensor| (y * &w).unwrap().sum_all().unwrap();
        let (gf, gp) = (
            loss(&fused).backward().unwrap(),
            loss(&plain).backward().unwrap(),
        );
        for var in [&x, &gamma, &beta] {
            close(gf.get(var).unwrap(), gp.get(var).unwrap(), 1e-4);
        }
    }

    #[test]
    fn softmax_and_gelu_and_their_gradients_match_candles_elementary_ops() {
        // Rows of attention scores with masked padding, as the encoder feeds them.
        let mut scores = flat(&(random((40, 24), 5) * 3.0).unwrap()).unwrap();
        for row in scores.chunks_exact_mut(24) {
            row[20..].iter_mut().for_each(|v| *v -= 1e4);
        }
        let x =
            Var::from_tensor(&Tensor::from_vec(scores, (40, 24), &Device::Cpu).unwrap()).unwrap();
        let w = random((40, 24), 6);
        let loss = |y: &Tensor| (y * &w).unwrap().sum_all().unwrap();
        let fused = softmax_last_dim(x.as_tensor()).unwrap();
        let plain = candle_nn::ops::softmax(x.as_tensor(), D::Minus1).unwrap();
        close(&fused, &plain, 1e-6);
        let (gf, gp) = (
            loss(&fused).backward().unwrap(),
            loss(&plain).backward().unwrap(),
        );
        close(gf.get(&x).unwrap(), gp.get(&x).unwrap(), 1e-5);

        let x = Var::from_tensor(&(random((30, 64), 7) * 2.5).unwrap()).unwrap();
        let w = random((30, 64), 8);
        let loss = |y: &Tensor| (y * &w).unwrap().sum_all().unwrap();
        let fused = gelu_erf(x.as_tensor()).unwrap();
        let plain = x.as_tensor().gelu_erf().unwrap();
        close(&fused, &plain, 1e-5);
        let (gf, gp) = (
            loss(&fused).backward().unwrap(),
            loss(&plain).backward().unwrap(),
        );
        close(gf.get(&x).unwrap(), gp.get(&x).unwrap(), 1e-4);
    }

    /// The bf16 kernels this CPU runs (the AVX2 one on any CPU with AVX2 and FMA).
    fn bf16_kernels() -> Vec<Kernel> {
        Kernel::supported()
            .into_iter()
            .filter(|k| k.precision() != crate::lm::linear::Precision::F32)
            .collect()
    }

    #[test]
    fn the_bf16_linear_layer_and_its_gradients_match_f32_up_to_bf16_rounding() {
        let kernels = bf16_kernels();
        assert!(!kernels.is_empty(), "x86-64 CPUs afkit runs on have AVX2");
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
        // Mean absolute difference over mean absolute value: each operand is within 2⁻⁹ of
        // itself in bf16, so products are within about 0.4%, and sums of them no further.
        let relative = |a: &Tensor, b: &Tensor| {
            let mean_abs = |t: &Tensor| flat(t).unwrap().iter().map(|v| v.abs()).sum::<f32>();
            mean_abs(&(a - b).unwrap()) / mean_abs(b)
        };
        for kernel in kernels {
            let packed = Arc::new(PackedDense::new(w.as_tensor(), kernel).unwrap());
            let y = dense_bf16(x.as_tensor(), w.as_tensor(), b.as_tensor(), packed).unwrap();
            let gb = loss(&y).backward().unwrap();
            let errors = [
                relative(&y, &plain),
                relative(gb.get(&x).unwrap(), gp.get(&x).unwrap()),
                relative(gb.get(&w).unwrap(), gp.get(&w).unwrap()),
            ];
            for e in errors {
                assert!(
                    e > 0.0 && e < 4e-3,
                    "{kernel:?}: relative errors {errors:?}"
                );
            }
            close(gb.get(&b).unwrap(), gp.get(&b).unwrap(), 1e-5);
        }
    }

    #[test]
    fn results_do_not_depend_on_the_number_of_threads() {
        let x = Var::from_tensor(&random((300, 48), 9)).unwrap();
        let gamma = Var::from_tensor(&random((1, 48), 10).flatten_all().unwrap()).unwrap();
        let beta = Var::from_tensor(&random((1, 48), 11).flatten_all().unwrap()).unwrap();
        let w = Var::from_tensor(&random((40, 48), 16)).unwrap();
        let bias = Var::from_tensor(&random((1, 40), 17).flatten_all().unwrap()).unwrap();
        let packed = Arc::new(PackedDense::new(w.as_tensor(), bf16_kernels()[0]).unwrap());
        let run = || {
            let y = layer_norm(x.as_tensor(), gamma.as_tensor(), beta.as_tensor(), 1e-12).unwrap();
            let y = dense_bf16(&y, w.as_tensor(), bias.as_tensor(), packed.clone()).unwrap();
            let y = gelu_erf(&softmax_last_dim(&y).unwrap()).unwrap();
            let grads = y.sum_all().unwrap().backward().unwrap();
            [&x, &gamma, &beta, &w, &bias].map(|v| flat(grads.get(v).unwrap()).unwrap())
        };
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let many = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        assert_eq!(one.install(run), many.install(run));
    }
}
