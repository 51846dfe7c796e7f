//! Limited-memory BFGS for the smooth convex objectives of afkit's linear models: AFLite's
//! logistic regression and the audit's n-gram choice classifiers. One minimiser, so that both
//! stop by the same rules and a fix to one is a fix to both.
//!
//! Memory 10, two-loop recursion, backtracking (Armijo) line search. Deterministic: the same
//! objective gives the same iterates. It stops when the objective's own stopping measure (for
//! example the largest gradient entry in the model's natural parametrisation) reaches `tol`, when
//! the relative decrease of one step falls to `ftol` (SciPy's L-BFGS-B rule, which
//! scikit-learn's fit also stops on), when no step along the search direction decreases the
//! objective, or after `max_iter` iterations.

/// A differentiable objective over `dim` parameters.
pub trait Objective {
    fn dim(&self) -> usize;

    /// The value at `x`; writes the gradient into `grad` and also returns the measure compared
    /// with [`Options::tol`] (any non-negative quantity that is zero at the optimum).
    fn value_grad(&self, x: &[f64], grad: &mut [f64]) -> (f64, f64);
}

#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Converged once the objective's stopping measure is at most this.
    pub tol: f64,
    /// Stop once a step decreases the objective by at most this, relative to its size.
    pub ftol: f64,
    pub max_iter: usize,
}

/// Where the minimiser stopped.
#[derive(Debug, Clone)]
pub struct Minimum {
    pub x: Vec<f64>,
    pub iterations: usize,
    /// Whether the stopping measure reached `tol`.
    pub converged: bool,
}

const MEMORY: usize = 10;
/// Halvings of the step before the line search gives up.
const MAX_HALVINGS: usize = 40;

/// The curvature pairs (s, y, 1 / sᵀy) of the last [`MEMORY`] steps.
#[derive(Default)]
struct History {
    pairs: Vec<(Vec<f64>, Vec<f64>, f64)>,
}

impl History {
    /// Keeps a pair only where it has positive curvature, so the implied Hessian stays positive
    /// definite.
    fn push(&mut self, s: Vec<f64>, y: Vec<f64>) {
        let sy = dot(&s, &y);
        if sy > 0.0 && sy > 1e-16 * dot(&y, &y) {
            if self.pairs.len() == MEMORY {
                self.pairs.remove(0);
            }
            self.pairs.push((s, y, 1.0 / sy));
        }
    }

    /// −H·grad by the two-loop recursion.
    fn direction(&self, grad: &[f64]) -> Vec<f64> {
        let mut d = grad.to_vec();
        let mut alpha = [0f64; MEMORY];
        for (i, (s, y, rho)) in self.pairs.iter().enumerate().rev() {
            alpha[i] = rho * dot(s, &d);
            axpy(-alpha[i], y, &mut d);
        }
        if let Some((s, y, _)) = self.pairs.last() {
            let gamma = dot(s, y) / dot(y, y);
            d.iter_mut().for_each(|v| *v *= gamma);
        }
        for (i, (s, y, rho)) in self.pairs.iter().enumerate() {
            let beta = rho * dot(y, &d);
            axpy(alpha[i] - beta, s, &mut d);
        }
        d.iter_mut().for_each(|v| *v = -*v);
        d
    }
}

/// Minimises `objective` from the origin.
pub fn minimize(objective: &impl Objective, opts: &Options) -> Minimum {
    let n = objective.dim();
    let mut x = vec![0f64; n];
    let mut grad = vec![0f64; n];
    let (mut f, mut measure) = objective.value_grad(&x, &mut grad);
    let mut history = History::default();
    let mut new_x = vec![0f64; n];
    let mut new_grad = vec![0f64; n];
    let stop = |x: Vec<f64>, iterations: usize, measure: f64| Minimum {
        x,
        iterations,
        converged: measure <= opts.tol,
    };

    for iteration in 0..opts.max_iter {
        if measure <= opts.tol {
            return stop(x, iteration, measure);
        }
        let mut direction = history.direction(&grad);
        let mut slope = dot(&grad, &direction);
        if slope >= 0.0 {
            // Not a descent direction (numerical trouble): restart from steepest descent.
            history = History::default();
            direction = grad.iter().map(|g| -g).collect();
            slope = -dot(&grad, &grad);
        }
        // Without curvature information the gradient's scale is unknown: a first step of unit
        // length at most.
        let step = if history.pairs.is_empty() {
            1.0 / dot(&grad, &grad).sqrt().max(1.0)
        } else {
            1.0
        };
        let accepted = line_search(
            objective,
            (&x, f),
            (&direction, slope),
            step,
            (&mut new_x, &mut new_grad),
        );
        let Some((nf, new_measure)) = accepted else {
            // No decrease possible at machine precision: this is as converged as it gets.
            return stop(x, iteration, measure);
        };
        let s = new_x.iter().zip(&x).map(|(a, b)| a - b).collect();
        let y = new_grad.iter().zip(&grad).map(|(a, b)| a - b).collect();
        history.push(s, y);
        let relative_decrease = (f - nf) / f.abs().max(nf.abs()).max(1.0);
        std::mem::swap(&mut x, &mut new_x);
        std::mem::swap(&mut grad, &mut new_grad);
        f = nf;
        measure = new_measure;
        if relative_decrease <= opts.ftol {
            return stop(x, iteration + 1, measure);
        }
    }
    stop(x, opts.max_iter, measure)
}

/// Backtracking from `x` (value `f`) along `direction` (slope `slope` there): halves the step
/// from `step` until the value decreases enough (Armijo), leaving that point and its gradient in
/// `new_x` and `new_grad`, and gives its value and convergence measure; `None` when no halving
/// decreases it enough.
fn line_search(
    objective: &impl Objective,
    (x, f): (&[f64], f64),
    (direction, slope): (&[f64], f64),
    mut step: f64,
    (new_x, new_grad): (&mut [f64], &mut [f64]),
) -> Option<(f64, f64)> {
    for _ in 0..MAX_HALVINGS {
        for ((nx, &a), &d) in new_x.iter_mut().zip(x).zip(direction) {
            *nx = a + step * d;
        }
        let (nf, new_measure) = objective.value_grad(new_x, new_grad);
        if nf <= f + 1e-4 * step * slope {
            return Some((nf, new_measure));
        }
        step *= 0.5;
    }
    None
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn axpy(alpha: f64, x: &[f64], y: &mut [f64]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// ½ Σ aᵢ (xᵢ − cᵢ)²: a separable quadratic with known minimiser c.
    struct Quadratic {
        a: Vec<f64>,
        c: Vec<f64>,
    }

    impl Objective for Quadratic {
        fn dim(&self) -> usize {
            self.a.len()
        }

        fn value_grad(&self, x: &[f64], grad: &mut [f64]) -> (f64, f64) {
            let mut value = 0.0;
            let mut largest = 0f64;
            for i in 0..x.len() {
                let d = x[i] - self.c[i];
                value += 0.5 * self.a[i] * d * d;
                grad[i] = self.a[i] * d;
                largest = largest.max(grad[i].abs());
            }
            (value, largest)
        }
    }

    proptest! {
        #[test]
        fn finds_the_minimiser_of_ill_conditioned_quadratics(
            terms in prop::collection::vec((1e-3f64..1e3, -10f64..10.0), 1..30),
        ) {
            let (a, c): (Vec<f64>, Vec<f64>) = terms.into_iter().unzip();
            let objective = Quadratic { a: a.clone(), c: c.clone() };
            let opts = Options { tol: 1e-9, ftol: 0.0, max_iter: 1000 };
            let min = minimize(&objective, &opts);
            prop_assert!(min.converged, "stopped after {} iterations", min.iterations);
            for i in 0..a.len() {
                prop_assert!((a[i] * (min.x[i] - c[i])).abs() <= 1e-9);
            }
        }
    }

    #[test]
    fn gives_up_at_the_iteration_cap_without_claiming_convergence() {
        let objective = Quadratic {
            a: vec![1.0, 1e3],
            c: vec![5.0, -5.0],
        };
        let opts = Options {
            tol: 0.0,
            ftol: 0.0,
            max_iter: 1,
        };
        let min = minimize(&objective, &opts);
        assert_eq!(min.iterations, 1);
        assert!(!min.converged);
    }
}
