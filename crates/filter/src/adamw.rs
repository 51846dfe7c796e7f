//! AdamW for the CPU in one pass over each parameter.
//!
//! candle's `AdamW` updates a parameter with thirteen tensor ops, each a pass over the whole
//! parameter into a freshly allocated tensor. The ensemble's embedding tables hold most of its
//! two million parameters and are updated whole at every step (their gradients are dense), so
//! that came to 15% of an AF iteration. [`FusedAdamW`] does the same arithmetic, op for op in
//! f32 with the same constants, in one loop that updates the parameter and its moments in place:
//! the results are bit for bit candle's (unit test below). Other devices keep candle's.

use std::cell::RefCell;

use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, Layout, Result, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rayon::prelude::*;

/// AdamW on the run's device: [`FusedAdamW`] for parameters in host memory, candle's otherwise.
pub(crate) enum Optimiser {
    Fused(FusedAdamW),
    Candle(AdamW),
}

impl Optimiser {
    pub(crate) fn new(vars: Vec<Var>, params: ParamsAdamW) -> Result<Self> {
        if vars
            .iter()
            .all(|v| v.device().is_cpu() && v.dtype() == candle_core::DType::F32)
        {
            Ok(Optimiser::Fused(FusedAdamW::new(vars, params)))
        } else {
            Ok(Optimiser::Candle(AdamW::new(vars, params)?))
        }
    }

    pub(crate) fn step(&mut self, grads: &GradStore) -> Result<()> {
        match self {
            Optimiser::Fused(fused) => fused.step(grads),
            Optimiser::Candle(adamw) => adamw.step(grads),
        }
    }
}

/// AdamW over f32 parameters in host memory, the moments kept beside them as plain vectors.
pub(crate) struct FusedAdamW {
    vars: Vec<(Var, Vec<f32>, Vec<f32>)>,
    params: ParamsAdamW,
    step_t: i32,
}

impl FusedAdamW {
    pub(crate) fn new(vars: Vec<Var>, params: ParamsAdamW) -> Self {
        let vars = vars
            .into_iter()
            .filter(|var| var.dtype().is_float())
            .map(|var| {
                let n = var.elem_count();
                (var, vec![0f32; n], vec![0f32; n])
            })
            .collect();
        FusedAdamW {
            vars,
            params,
            step_t: 0,
        }
    }

    pub(crate) fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.step_t += 1;
        let p = &self.params;
        // candle applies each scalar as an f32 affine map `x · mul + add`; these are its
        // constants, converted as it converts them.
        let constants = Constants {
            beta1: p.beta1 as f32,
            one_minus_beta1: (1.0 - p.beta1) as f32,
            beta2: p.beta2 as f32,
            one_minus_beta2: (1.0 - p.beta2) as f32,
            scale_m: (1.0 / (1.0 - p.beta1.powi(self.step_t))) as f32,
            scale_v: (1.0 / (1.0 - p.beta2.powi(self.step_t))) as f32,
            decay: (1.0 - p.lr * p.weight_decay) as f32,
            eps: p.eps as f32,
            lr: p.lr as f32,
        };
        for (var, m, v) in &mut self.vars {
            let Some(grad) = grads.get(var) else {
                continue;
            };
            let update = Update {
                constants,
                moments: RefCell::new((m.as_mut_slice(), v.as_mut_slice())),
            };
            var.as_tensor().inplace_op2(&grad.contiguous()?, &update)?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
struct Constants {
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    scale_m: f32,
    scale_v: f32,
    decay: f32,
    eps: f32,
    lr: f32,
}

impl Constants {
    /// One element's update, as candle's `AdamW::step` computes it (every `+ 0.0` and `· 1.0`
    /// is the other half of one of its affine maps; they matter for the sign of a zero).
    #[inline(always)]
    fn apply(&self, theta: &mut f32, m: &mut f32, v: &mut f32, g: f32) {
        let next_m = (*m * self.beta1 + 0.0) + (g * self.one_minus_beta1 + 0.0);
        let next_v = (*v * self.beta2 + 0.0) + ((g * g) * self.one_minus_beta2 + 0.0);
        let m_hat = next_m * self.scale_m + 0.0;
        let v_hat = next_v * self.scale_v + 0.0;
        let decayed = *theta * self.decay + 0.0;
        let adjusted = m_hat / (v_hat.sqrt() * 1.0 + self.eps);
        *theta = decayed - (adjusted * self.lr + 0.0);
        *m = next_m;
        *v = next_v;
    }
}

/// The in-place op: the parameter is the tensor updated, the gradient its operand.
struct Update<'a> {
    constants: Constants,
    moments: RefCell<(&'a mut [f32], &'a mut [f32])>,
}

/// Elements per parallel task: large enough that a task outweighs its hand-off.
const CHUNK: usize = 1 << 14;

impl candle_core::InplaceOp2 for Update<'_> {
    fn name(&self) -> &'static str {
        "adamw-step"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let (CpuStorage::F32(theta), CpuStorage::F32(grad)) = (s1, s2) else {
            candle_core::bail!("adamw-step: the fused AdamW updates f32 parameters only");
        };
        let (Some((t0, t1)), Some((g0, g1))) = (l1.contiguous_offsets(), l2.contiguous_offsets())
        else {
            candle_core::bail!("adamw-step: parameter or gradient is not contiguous");
        };
        let (theta, grad) = (&mut theta[t0..t1], &grad[g0..g1]);
        let mut moments = self.moments.borrow_mut();
        let (m, v) = &mut *moments;
        if theta.len() != grad.len() || theta.len() != m.len() {
            candle_core::bail!("adamw-step: parameter, gradient and moments differ in size");
        }
        let c = self.constants;
        theta
            .par_chunks_mut(CHUNK)
            .zip(m.par_chunks_mut(CHUNK))
            .zip(v.par_chunks_mut(CHUNK))
            .zip(grad.par_chunks(CHUNK))
            .for_each(|(((theta, m), v), grad)| {
                for (((t, m), v), &g) in theta.iter_mut().zip(m).zip(v).zip(grad) {
                    c.apply(t, m, v, g);
                }
            });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// Several steps of both optimisers from the same start, with weight decay and gradients
    /// that include zeros of either sign, leave the same bits in every parameter.
    #[test]
    fn fused_steps_equal_candles_bit_for_bit() -> anyhow::Result<()> {
        let device = Device::Cpu;
        let shapes: [&[usize]; 3] = [&[40_000, 3], &[7], &[5, 4]];
        let start: Vec<Tensor> = shapes
            .iter()
            .map(|&s| Tensor::randn(0f32, 1.0, s, &device))
            .collect::<Result<_>>()?;
        let vars = |start: &[Tensor]| -> Result<Vec<Var>> {
            start.iter().map(|t| Var::from_tensor(&t.copy()?)).collect()
        };
        let params = ParamsAdamW {
            lr: 3e-3,
            weight_decay: 0.01,
            ..ParamsAdamW::default()
        };
        let (ours, theirs) = (vars(&start)?, vars(&start)?);
        let mut fused = FusedAdamW::new(ours.clone(), params.clone());
        let mut candle = AdamW::new(theirs.clone(), params)?;
        for step in 0..5 {
            let loss = |vars: &[Var]| -> Result<Tensor> {
                let mut total = Tensor::zeros((), candle_core::DType::F32, &device)?;
                for (i, var) in vars.iter().enumerate() {
                    // Relu zeroes part of each gradient; the scale changes it per step.
                    let term = (var.as_tensor().relu()?.sqr()? * (1.0 + (i + step) as f64))?;
                    total = (total + term.sum_all()?)?;
                }
                Ok(total)
            };
            fused.step(&loss(&ours)?.backward()?)?;
            candle.step(&loss(&theirs)?.backward()?)?;
        }
        for (a, b) in ours.iter().zip(&theirs) {
            let bits = |v: &Var| -> Result<Vec<u32>> {
                Ok(v.flatten_all()?
                    .to_vec1::<f32>()?
                    .iter()
                    .map(|x| x.to_bits())
                    .collect())
            };
            assert_eq!(bits(a)?, bits(b)?);
        }
        Ok(())
    }
}
