//! The BiLSTM's gate activations and cell tanh as CPU ops whose loops vectorise.
//!
//! candle's CPU `tanh` calls the C library's scalar `tanhf` once per element and its sigmoid
//! `expf`; once the CNN ran on packed texts, those calls took a sixth of an ensemble iteration
//! (profile of one iteration on 231 contexts). Here tanh is the odd rational approximation Eigen
//! uses for f32 (13th over 6th degree on the input clamped to ±7.9; within 4e-7 of tanh, unit
//! test), the sigmoid is 0.5 + 0.5·tanh(x/2), and both run in plain loops the compiler
//! vectorises: 8 lanes inside an AVX2 function chosen at run time, 4 with the SSE2 baseline. The
//! loops use no fused multiply-adds, so both paths give the same bits. The backward passes use
//! the outputs, as candle's do. On other devices the BiLSTM uses candle's ops.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};

use super::windows::f32_data;

/// Gate pre-activations (…, 4 · hidden) in candle's LSTM order i, f, g, o → the sigmoid of i,
/// f and o and the tanh of g, same shape. CPU tensors only.
pub(crate) fn gate_activations(gates: &Tensor, hidden: usize) -> Result<Tensor> {
    gates.contiguous()?.apply_op1(Activation {
        gates_of: Some(hidden),
    })
}

/// tanh of every element. CPU tensors only.
pub(crate) fn tanh(xs: &Tensor) -> Result<Tensor> {
    xs.contiguous()?.apply_op1(Activation { gates_of: None })
}

/// `gates_of: Some(hidden)`: rows of four gates, the third under tanh and the others under the
/// sigmoid; `None`: tanh everywhere.
#[derive(Clone, Copy)]
struct Activation {
    gates_of: Option<usize>,
}

impl Activation {
    /// Calls `f(range, function)` for the runs of `len` elements that share a function.
    fn runs(&self, len: usize, mut f: impl FnMut(std::ops::Range<usize>, Function)) {
        match self.gates_of {
            None => f(0..len, Function::Tanh),
            Some(h) => {
                for row in (0..len).step_by(4 * h) {
                    f(row..row + 2 * h, Function::Sigmoid);
                    f(row + 2 * h..row + 3 * h, Function::Tanh);
                    f(row + 3 * h..row + 4 * h, Function::Sigmoid);
                }
            }
        }
    }

    fn check(&self, len: usize, last_dim: usize) -> Result<()> {
        if let Some(h) = self.gates_of {
            if last_dim != 4 * h || !len.is_multiple_of(4 * h) {
                candle_core::bail!("gate activations: last dimension {last_dim} is not 4 × {h}")
            }
        }
        Ok(())
    }
}

impl CustomOp1 for Activation {
    fn name(&self) -> &'static str {
        "lstm-activation"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let xs = f32_data(storage, layout, self.name())?;
        let shape = layout.shape();
        self.check(xs.len(), shape.dims().last().copied().unwrap_or(0))?;
        let mut out = vec![0f32; xs.len()];
        self.runs(xs.len(), |run, function| {
            map(&xs[run.clone()], &mut out[run], function)
        });
        Ok((CpuStorage::F32(out), shape.clone()))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let grad = res.apply_op2_no_bwd(&grad_res.contiguous()?, &ActivationGrad(*self))?;
        Ok(Some(grad))
    }
}

/// The adjoint of [`Activation`] from its output y: the gradient times 1 − y² under tanh and
/// y (1 − y) under the sigmoid.
struct ActivationGrad(Activation);

impl CustomOp2 for ActivationGrad {
    fn name(&self) -> &'static str {
        "lstm-activation-grad"
    }

    fn cpu_fwd(
        &self,
        res: &CpuStorage,
        res_layout: &Layout,
        grad: &CpuStorage,
        grad_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ys = f32_data(res, res_layout, self.name())?;
        let grad = f32_data(grad, grad_layout, self.name())?;
        let mut out = vec![0f32; ys.len()];
        self.0.runs(ys.len(), |run, function| {
            let pairs = ys[run.clone()].iter().zip(&grad[run.clone()]);
            for (o, (&y, &g)) in out[run].iter_mut().zip(pairs) {
                *o = match function {
                    Function::Tanh => g * (1.0 - y * y),
                    Function::Sigmoid => g * (y * (1.0 - y)),
                };
            }
        });
        Ok((CpuStorage::F32(out), res_layout.shape().clone()))
    }
}

#[derive(Clone, Copy)]
enum Function {
    Tanh,
    Sigmoid,
}

/// `dst[i] = function(src[i])`, with AVX2 where the CPU has it.
fn map(src: &[f32], dst: &mut [f32], function: Function) {
    #[cfg(target_arch = "x86_64")]
    if afkit_engine::simd::avx2_fma() {
        // SAFETY: the CPU runs AVX2 and FMA instructions (checked just above).
        unsafe { map_avx2(src, dst, function) };
        return;
    }
    map_portable(src, dst, function)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn map_avx2(src: &[f32], dst: &mut [f32], function: Function) {
    map_portable(src, dst, function)
}

#[inline(always)]
fn map_portable(src: &[f32], dst: &mut [f32], function: Function) {
    match function {
        Function::Tanh => {
            for (d, &x) in dst.iter_mut().zip(src) {
                *d = tanh_f32(x);
            }
        }
        Function::Sigmoid => {
            for (d, &x) in dst.iter_mut().zip(src) {
                *d = 0.5 + 0.5 * tanh_f32(0.5 * x);
            }
        }
    }
}

/// tanh(x) as Eigen's `generic_fast_tanh_float` computes it without fused multiply-adds.
#[inline(always)]
fn tanh_f32(x: f32) -> f32 {
    const CLAMP: f32 = 7.905_311;
    const ALPHA: [f32; 7] = [
        4.893_524_6e-3,
        6.372_619_5e-4,
        1.485_722_35e-5,
        5.122_297_3e-8,
        -8.604_672e-11,
        2.000_188e-13,
        -2.760_768_4e-16,
    ];
    const BETA: [f32; 4] = [4.893_525e-3, 2.268_434_7e-3, 1.185_347_1e-4, 1.198_258_4e-6];
    let c = x.clamp(-CLAMP, CLAMP);
    let c2 = c * c;
    let mut p = ALPHA[6];
    for a in ALPHA[..6].iter().rev() {
        p = p * c2 + a;
    }
    let mut q = BETA[3];
    for b in BETA[..3].iter().rev() {
        q = q * c2 + b;
    }
    let y = c * p / q;
    // Near 0 the rational's rounding dominates; tanh(x) is x there to f32 precision.
    if x.abs() < 4e-4 {
        x
    } else {
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn tanh_is_within_4e_7_of_the_exact_value() {
        let mut worst = 0f64;
        for i in -200_000..=200_000 {
            let x = i as f32 * 1e-4;
            let err = (f64::from(tanh_f32(x)) - f64::from(x).tanh()).abs();
            worst = worst.max(err);
        }
        assert!(worst < 4e-7, "worst error {worst}");
        assert_eq!(tanh_f32(100.0), tanh_f32(20.0));
        assert!(tanh_f32(f32::NAN).is_nan());
    }

    #[test]
    fn both_cpu_paths_give_the_same_bits() {
        let src: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.0213).collect();
        for function in [Function::Tanh, Function::Sigmoid] {
            let (mut a, mut b) = (vec![0f32; src.len()], vec![0f32; src.len()]);
            map(&src, &mut a, function);
            map_portable(&src, &mut b, function);
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }

    #[test]
    fn gate_activations_match_candle_forward_and_gradient() -> Result<()> {
        let device = Device::Cpu;
        let h = 3;
        let gates = Var::randn(0f32, 2.0, (2, 5, 4 * h), &device)?;
        let ours = gate_activations(&gates, h)?;
        let sig = candle_nn::ops::sigmoid(&gates)?;
        let theirs = Tensor::cat(
            &[
                sig.narrow(2, 0, 2 * h)?,
                gates.narrow(2, 2 * h, h)?.tanh()?,
                sig.narrow(2, 3 * h, h)?,
            ],
            2,
        )?;
        let max_diff = |a: &Tensor, b: &Tensor| -> Result<f32> {
            (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()
        };
        assert!(max_diff(&ours, &theirs)? < 1e-6);

        let weights = Tensor::randn(0f32, 1.0, ours.shape(), &device)?;
        let g_ours = (&ours * &weights)?.sum_all()?.backward()?;
        let g_theirs = (&theirs * &weights)?.sum_all()?.backward()?;
        let (a, b) = (g_ours.get(&gates).unwrap(), g_theirs.get(&gates).unwrap());
        // A saturated gate's derivative (1 − tanh², σ(1 − σ)) is a difference of numbers near
        // 1, exact to a few units in the last place of 1; the weights scale that error.
        let largest_weight = weights.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        assert!(max_diff(a, b)? < 1e-6 * largest_weight.max(1.0));

        let plain = tanh(&gates)?;
        assert!(max_diff(&plain, &gates.as_tensor().tanh()?)? < 1e-6);
        assert!(gate_activations(&gates, 2).is_err());
        Ok(())
    }
}
