//! L2-regularised multinomial logistic regression, the linear model family of AFLite.
//!
//! The objective is scikit-learn's for `LogisticRegression(C=c)` with an intercept, so a Python
//! peer fits the same model: minimise `0.5·||W||² + C·Σᵢ CE(xᵢ, yᵢ)` with the intercept not
//! penalised. Like scikit-learn, two classes use one weight vector (sigmoid) and more than two
//! use one vector per class (softmax), and the objective is optimised divided by the number of
//! training rows, with convergence declared when every gradient entry is at most `tol`.
//!
//! The fit is L-BFGS, deterministic (no threads inside one fit, fixed summation order). Two
//! exact reparametrisations keep it well-conditioned without changing the optimum: features are
//! centred (the free intercept absorbs the shift) and every parameter is scaled by the inverse
//! square root of its curvature at the start, which equalises the intercept's curvature
//! (~¼ per row) and the weights' (feature variance, tiny for unit-length embeddings).

use afkit_engine::lbfgs::{self, Objective};
use afkit_engine::simd::{axpy_lanes, axpy_lanes_4, dot, dot_lanes, dot_lanes_4};

/// SciPy's L-BFGS-B default `ftol` (relative decrease of one step), on which scikit-learn's
/// fit also stops.
const SCIPY_FTOL: f64 = 64.0 * f64::EPSILON;

/// Options of one fit.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct FitOptions {
    /// Inverse regularisation strength (scikit-learn's `C`).
    pub c: f64,
    /// Stop when the largest absolute gradient entry of the per-row objective is at most this.
    pub tol: f64,
    /// Iteration cap (L-BFGS iterations).
    pub max_iter: usize,
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions {
            c: 1.0,
            tol: 1e-4,
            max_iter: 1000,
        }
    }
}

/// A fitted model over the classes it saw in training.
#[derive(Debug, Clone)]
pub(crate) struct LogReg {
    dim: usize,
    /// Original class ids of the model's outputs, ascending.
    classes: Vec<u32>,
    /// One row per output (1 for two classes, else one per class), over raw (uncentred) features.
    weights: Vec<f32>,
    bias: Vec<f32>,
    /// Whether the gradient tolerance was reached.
    pub converged: bool,
}

impl LogReg {
    /// Fits on `rows` rows of `x` (row-major, `dim` columns) with class ids `y`.
    pub(crate) fn fit(x: &[f32], dim: usize, y: &[u32], opts: &FitOptions) -> LogReg {
        let rows = y.len();
        assert_eq!(x.len(), rows * dim, "feature matrix does not match labels");
        assert!(rows > 0, "cannot fit on no rows");
        let mut classes: Vec<u32> = y.to_vec();
        classes.sort_unstable();
        classes.dedup();
        if classes.len() == 1 {
            // One class seen: the optimum puts the free intercept at infinity; predict it.
            return LogReg {
                dim,
                classes,
                weights: vec![0.0; dim],
                bias: vec![0.0],
                converged: true,
            };
        }
        let targets: Vec<u32> = y
            .iter()
            .map(|c| classes.binary_search(c).expect("class listed") as u32)
            .collect();
        let problem = Problem::new(x, dim, &targets, classes.len(), opts.c);
        let lbfgs = lbfgs::Options {
            tol: opts.tol,
            ftol: SCIPY_FTOL,
            max_iter: opts.max_iter,
        };
        let minimum = lbfgs::minimize(&problem, &lbfgs);
        let (weights, bias) = problem.raw_parameters(&minimum.x);
        LogReg {
            dim,
            classes,
            weights,
            bias,
            converged: minimum.converged,
        }
    }

    /// The predicted class id of one feature row.
    pub(crate) fn predict(&self, row: &[f32]) -> u32 {
        debug_assert_eq!(row.len(), self.dim);
        if self.classes.len() == 1 {
            return self.classes[0];
        }
        if self.bias.len() == 1 {
            let z = dot(&self.weights, row) + self.bias[0];
            return self.classes[usize::from(z > 0.0)];
        }
        let mut best = 0;
        let mut best_z = f32::NEG_INFINITY;
        for (k, w) in self.weights.chunks_exact(self.dim).enumerate() {
            let z = dot(w, row) + self.bias[k];
            if z > best_z {
                best_z = z;
                best = k;
            }
        }
        self.classes[best]
    }

    /// Weights (one row per output) and intercepts over the raw features.
    #[cfg(test)]
    fn coefficients(&self) -> (&[f32], &[f32]) {
        (&self.weights, &self.bias)
    }
}

/// The objective in the scaled, centred parametrisation. Parameters: `outputs × dim` weights,
/// then `outputs` intercepts; the optimiser works on `v` with `w = scale ⊙ v`.
struct Problem<'a> {
    x: &'a [f32],
    dim: usize,
    y: &'a [u32],
    /// 1 (sigmoid) for two classes, else the number of classes (softmax).
    outputs: usize,
    mean: Vec<f32>,
    /// Penalty weight of the per-row objective: 1 / (C · rows).
    lambda: f64,
    scale: Vec<f64>,
}

impl<'a> Problem<'a> {
    fn new(x: &'a [f32], dim: usize, y: &'a [u32], classes: usize, c: f64) -> Self {
        let rows = y.len();
        let outputs = if classes == 2 { 1 } else { classes };
        let mean64 = column_sums(x, dim, |v, _| v)
            .into_iter()
            .map(|m| m / rows as f64)
            .collect::<Vec<_>>();
        let mean32: Vec<f32> = mean64.iter().map(|&m| m as f32).collect();
        let var = column_sums(x, dim, |v, j| {
            let d = v - mean32[j];
            d * d
        });
        let lambda = 1.0 / (c * rows as f64);
        // Curvature of the per-row objective at w = 0: p(1-p) ≤ ¼ times the feature variance,
        // plus the penalty; the intercepts' is ¼.
        let mut scale = Vec::with_capacity(outputs * (dim + 1));
        for _ in 0..outputs {
            scale.extend(
                var.iter()
                    .map(|s| 1.0 / (0.25 * s / rows as f64 + lambda).sqrt()),
            );
        }
        scale.extend(std::iter::repeat_n(2.0, outputs));
        Problem {
            x,
            dim,
            y,
            outputs,
            mean: mean32,
            lambda,
            scale,
        }
    }

    /// Weights and intercepts for raw features: `b_raw = b − W·mean`.
    fn raw_parameters(&self, v: &[f64]) -> (Vec<f32>, Vec<f32>) {
        let w: Vec<f64> = v.iter().zip(&self.scale).map(|(a, s)| a * s).collect();
        let nw = self.outputs * self.dim;
        let weights: Vec<f32> = w[..nw].iter().map(|&a| a as f32).collect();
        let bias = (0..self.outputs)
            .map(|k| {
                let wm: f64 = weights[k * self.dim..(k + 1) * self.dim]
                    .iter()
                    .zip(&self.mean)
                    .map(|(&a, &m)| a as f64 * m as f64)
                    .sum();
                (w[nw + k] - wm) as f32
            })
            .collect();
        (weights, bias)
    }
}

impl Objective for Problem<'_> {
    fn dim(&self) -> usize {
        self.outputs * (self.dim + 1)
    }

    /// Objective value; writes the gradient with respect to `v` (scaled space) into `grad` and
    /// returns also the largest absolute gradient entry with respect to the real parameters.
    fn value_grad(&self, v: &[f64], grad: &mut [f64]) -> (f64, f64) {
        let (dim, outputs) = (self.dim, self.outputs);
        let rows = self.y.len();
        let nw = outputs * dim;
        let w: Vec<f64> = v.iter().zip(&self.scale).map(|(a, s)| a * s).collect();
        let (weights, bias) = self.raw_parameters(v);

        let (loss, residual_sum, xtr) = self.data_term(&weights, &bias);

        let n = rows as f64;
        let mut penalty = 0f64;
        let mut max_abs = 0f64;
        for k in 0..outputs {
            for j in 0..dim {
                let idx = k * dim + j;
                // Gradient of Σ CE over centred features: Xᵀr − mean·Σr.
                let g =
                    (xtr[idx] - self.mean[j] as f64 * residual_sum[k]) / n + self.lambda * w[idx];
                penalty += w[idx] * w[idx];
                max_abs = max_abs.max(g.abs());
                grad[idx] = g * self.scale[idx];
            }
            let g = residual_sum[k] / n;
            max_abs = max_abs.max(g.abs());
            grad[nw + k] = g * self.scale[nw + k];
        }
        (loss / n + 0.5 * self.lambda * penalty, max_abs)
    }
}

/// Per column j, `Σᵢ f(x[i][j], j)`: summed in f32 over blocks of rows (vectorised), the blocks
/// in f64.
fn column_sums(x: &[f32], dim: usize, f: impl Fn(f32, usize) -> f32) -> Vec<f64> {
    const BLOCK: usize = 256;
    let mut total = vec![0f64; dim];
    let mut block = vec![0f32; dim];
    for rows in x.chunks(BLOCK * dim) {
        block.fill(0.0);
        for row in rows.chunks_exact(dim) {
            for (j, (acc, &v)) in block.iter_mut().zip(row).enumerate() {
                *acc += f(v, j);
            }
        }
        for (t, &b) in total.iter_mut().zip(&block) {
            *t += b as f64;
        }
    }
    total
}

impl Problem<'_> {
    /// The data part of the objective at raw `weights`/`bias`: the summed cross-entropy, the
    /// summed residuals `Σ r` and `Xᵀr` (the hot loop of every fit: one dot and one axpy per row
    /// and output). Runs the AVX2+FMA build of the loop where the CPU has it (see
    /// [`afkit_engine::simd`]).
    fn data_term(&self, weights: &[f32], bias: &[f32]) -> (f64, Vec<f64>, Vec<f64>) {
        #[cfg(target_arch = "x86_64")]
        {
            if afkit_engine::simd::avx2_fma() {
                // SAFETY: the CPU supports the features the function is compiled for.
                return unsafe { self.data_term_avx2_fma(weights, bias) };
            }
        }
        self.data_term_generic::<false>(weights, bias)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn data_term_avx2_fma(
        &self,
        weights: &[f32],
        bias: &[f32],
    ) -> (f64, Vec<f64>, Vec<f64>) {
        self.data_term_generic::<true>(weights, bias)
    }

    #[inline(always)]
    fn data_term_generic<const FMA: bool>(
        &self,
        weights: &[f32],
        bias: &[f32],
    ) -> (f64, Vec<f64>, Vec<f64>) {
        let (x, dim, y, outputs) = (self.x, self.dim, self.y, self.outputs);
        let rows = y.len();
        let nw = outputs * dim;
        let mut loss = 0f64;
        let mut residual_sum = vec![0f64; outputs];
        let mut xtr = vec![0f64; nw];
        // Accumulate Xᵀr in f32 over blocks of rows, then in f64, for speed without drift.
        const BLOCK: usize = 256;
        let mut block_acc = vec![0f32; nw];
        let mut z = vec![0f64; outputs];
        let mut r = vec![0f32; outputs];
        for (block_start, xb) in (0..rows).step_by(BLOCK).zip(x.chunks(BLOCK * dim)) {
            block_acc.fill(0.0);
            let mut rest = xb;
            if outputs == 1 {
                // Two classes: four rows at a time share the reads of the weights and of the
                // block's sums; each row's dot product and additions are the one-row loop's.
                let mut quads = xb.chunks_exact(QUAD * dim);
                for (q, quad) in quads.by_ref().enumerate() {
                    let first = block_start + q * QUAD;
                    let rows: [&[f32]; QUAD] =
                        std::array::from_fn(|j| &quad[j * dim..(j + 1) * dim]);
                    let dots = dot_lanes_4::<FMA>(weights, rows);
                    let residuals: [f32; QUAD] = std::array::from_fn(|j| {
                        let r =
                            binary_residual(&mut loss, (dots[j] + bias[0]) as f64, y[first + j]);
                        residual_sum[0] += r as f64;
                        r
                    });
                    axpy_lanes_4::<FMA>(residuals, rows, &mut block_acc);
                }
                rest = quads.remainder();
            }
            let first = block_start + (xb.len() - rest.len()) / dim;
            for (i, row) in (first..).zip(rest.chunks_exact(dim)) {
                for k in 0..outputs {
                    z[k] =
                        (dot_lanes::<FMA>(&weights[k * dim..(k + 1) * dim], row) + bias[k]) as f64;
                }
                if outputs == 1 {
                    r[0] = binary_residual(&mut loss, z[0], y[i]);
                } else {
                    softmax_residuals(&mut loss, &z, y[i] as usize, &mut r);
                }
                for k in 0..outputs {
                    residual_sum[k] += r[k] as f64;
                    axpy_lanes::<FMA>(r[k], row, &mut block_acc[k * dim..(k + 1) * dim]);
                }
            }
            for (acc, &b) in xtr.iter_mut().zip(&block_acc) {
                *acc += b as f64;
            }
        }
        (loss, residual_sum, xtr)
    }
}

/// Rows a two-class fit takes at a time.
const QUAD: usize = 4;

/// A two-class row with score `z` and class index `target` (0 or 1): adds its cross-entropy to
/// `loss` and returns its residual σ(z) − target.
#[inline(always)]
fn binary_residual(loss: &mut f64, z: f64, target: u32) -> f32 {
    let target = target as f64;
    let (softplus, sigmoid) = softplus_sigmoid(z);
    *loss += softplus - target * z;
    (sigmoid - target) as f32
}

/// A row of several classes with scores `z` and class index `target`: adds its cross-entropy
/// to `loss` and sets its residuals softmax(z) − one-hot(target) in `r`.
#[inline(always)]
fn softmax_residuals(loss: &mut f64, z: &[f64], target: usize, r: &mut [f32]) {
    let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = z.iter().map(|&a| (a - max).exp()).sum();
    *loss += max + sum.ln() - z[target];
    for k in 0..z.len() {
        let p = (z[k] - max).exp() / sum;
        r[k] = (p - if k == target { 1.0 } else { 0.0 }) as f32;
    }
}

/// `(ln(1 + eᶻ), 1 / (1 + e⁻ᶻ))` from one exponential, without overflow.
#[inline(always)]
fn softplus_sigmoid(z: f64) -> (f64, f64) {
    let e = (-z.abs()).exp();
    let softplus = z.max(0.0) + e.ln_1p();
    let sigmoid = if z >= 0.0 {
        1.0 / (1.0 + e)
    } else {
        e / (1.0 + e)
    };
    (softplus, sigmoid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use afkit_engine::seed::Seed;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The gradient of scikit-learn's objective written out plainly in f64, independent of the
    /// optimised code path: for the fitted raw weights it must vanish.
    fn reference_gradient(x: &[f32], dim: usize, y: &[u32], model: &LogReg, c: f64) -> Vec<f64> {
        let (w, b) = model.coefficients();
        let outputs = b.len();
        let mut g = vec![0f64; outputs * (dim + 1)];
        for (row, &yi) in x.chunks_exact(dim).zip(y) {
            let z: Vec<f64> = (0..outputs)
                .map(|k| {
                    b[k] as f64
                        + (0..dim)
                            .map(|j| w[k * dim + j] as f64 * row[j] as f64)
                            .sum::<f64>()
                })
                .collect();
            let r: Vec<f64> = if outputs == 1 {
                vec![1.0 / (1.0 + (-z[0]).exp()) - yi as f64]
            } else {
                let m = z.iter().cloned().fold(f64::MIN, f64::max);
                let s: f64 = z.iter().map(|a| (a - m).exp()).sum();
                (0..outputs)
                    .map(|k| (z[k] - m).exp() / s - f64::from(k as u32 == yi))
                    .collect()
            };
            for k in 0..outputs {
                for j in 0..dim {
                    g[k * dim + j] += c * r[k] * row[j] as f64;
                }
                g[outputs * dim + k] += c * r[k];
            }
        }
        for k in 0..outputs * dim {
            g[k] += w[k] as f64;
        }
        g
    }

    fn blobs(rows: usize, dim: usize, classes: u32, seed: Seed) -> (Vec<f32>, Vec<u32>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed.value());
        let mut x = Vec::with_capacity(rows * dim);
        let mut y = Vec::with_capacity(rows);
        for _ in 0..rows {
            let c = rng.random_range(0..classes);
            for j in 0..dim {
                let centre = if j as u32 % classes == c { 1.0 } else { 0.0 };
                // Offset 3: centring must not be needed by the caller.
                x.push(3.0 + centre + rng.random_range(-1.5f32..1.5));
            }
            y.push(c);
        }
        (x, y)
    }

    #[test]
    fn binary_fit_zeroes_the_reference_gradient() {
        let (x, y) = blobs(400, 7, 2, Seed::new(1));
        let opts = FitOptions {
            // Near the floor that f32 sums of 400 rows leave for the per-row gradient.
            tol: 1e-6,
            ..Default::default()
        };
        let model = LogReg::fit(&x, 7, &y, &opts);
        assert!(model.converged);
        let g = reference_gradient(&x, 7, &y, &model, 1.0);
        let worst = g.iter().fold(0f64, |a, b| a.max(b.abs()));
        // The summed objective's gradient is 400× the per-row one; f32 weights bound precision.
        assert!(worst < 1e-2, "largest gradient entry {worst}");
        // And the solution is not trivial.
        assert!(model.coefficients().0.iter().any(|w| w.abs() > 0.1));
    }

    #[test]
    fn multinomial_fit_zeroes_the_reference_gradient() {
        let (x, y) = blobs(600, 6, 3, Seed::new(2));
        let opts = FitOptions {
            tol: 1e-5,
            ..Default::default()
        };
        let model = LogReg::fit(&x, 6, &y, &opts);
        assert!(model.converged);
        assert_eq!(model.coefficients().1.len(), 3);
        let g = reference_gradient(&x, 6, &y, &model, 1.0);
        let worst = g.iter().fold(0f64, |a, b| a.max(b.abs()));
        // Summed over 600 rows: below 1e-4 per row, against entries of order 100 at w = 0.
        assert!(worst < 0.06, "largest gradient entry {worst}");
        let correct = x
            .chunks_exact(6)
            .zip(&y)
            .filter(|(row, &c)| model.predict(row) == c)
            .count();
        assert!(correct as f64 / 600.0 > 0.8, "train accuracy {correct}/600");
    }

    /// One feature, two points (x = −1, y = 0) and (x = 1, y = 1): by symmetry b = 0 and the
    /// weight solves w = 2C·σ(−w), i.e. w = 2C / (1 + eʷ).
    #[test]
    fn matches_the_closed_form_symmetric_solution() {
        let x = [-1.0f32, 1.0];
        let y = [0u32, 1];
        for c in [0.5, 1.0, 4.0] {
            let model = LogReg::fit(
                &x,
                1,
                &y,
                &FitOptions {
                    c,
                    tol: 1e-10,
                    max_iter: 1000,
                },
            );
            let (w, b) = model.coefficients();
            let w = w[0] as f64;
            // Solve the fixed point by bisection.
            let (mut lo, mut hi) = (0.0f64, 2.0 * c);
            for _ in 0..100 {
                let mid = 0.5 * (lo + hi);
                if mid - 2.0 * c / (1.0 + mid.exp()) > 0.0 {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            assert!((w - lo).abs() < 1e-5, "C={c}: w={w}, closed form {lo}");
            assert!(b[0].abs() < 1e-5, "C={c}: b={}", b[0]);
        }
    }

    #[test]
    fn single_class_training_set_predicts_that_class() {
        let model = LogReg::fit(&[0.0, 1.0, 2.0], 1, &[4, 4, 4], &FitOptions::default());
        assert_eq!(model.predict(&[10.0]), 4);
    }

    #[test]
    fn fit_is_deterministic() {
        let (x, y) = blobs(300, 5, 3, Seed::new(3));
        let a = LogReg::fit(&x, 5, &y, &FitOptions::default());
        let b = LogReg::fit(&x, 5, &y, &FitOptions::default());
        assert_eq!(a.coefficients(), b.coefficients());
    }
}
