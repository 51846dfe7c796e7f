//! Layer norm, softmax and GELU as single candle ops with their own backward pass, for the
//! layers the cross-encoder trains on the CPU.
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
//! The linear layers' packed products are `lm::linear::trainable`'s.

use candle_core::{CpuStorage, CustomOp1, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use crate::lm::linear::trainable::{flat, values};

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::lm::linear::trainable::tests::{bf16_kernels, random};
    use crate::lm::linear::trainable::{dense, PackedDense};
    use candle_core::{Device, Var, D};

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
            let y = dense(&y, w.as_tensor(), bias.as_tensor(), packed.clone()).unwrap();
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
