//! The papers' warm-up: learn a task-specific representation Φ on a small held-out part of the
//! data, then filter the rest with it (Le Bras et al. fine-tune RoBERTa on 10%). Here the model is
//! a one-hidden-layer MLP over the base features, trained with AdamW, and Φ is its hidden layer.
//! The warm-up examples are not filtered and not written out: the model has seen their labels.

use anyhow::Result;
use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{loss, AdamW, Linear, Module, Optimizer, ParamsAdamW};
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::features::Matrix;
use afkit_engine::seed::Seed;

#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct WarmupOptions {
    pub hidden: usize,
    pub epochs: usize,
    pub batch_size: usize,
    pub learning_rate: f64,
    pub weight_decay: f64,
    pub seed: Seed,
}

/// The trained encoder (input → ReLU hidden layer) with its final training accuracy.
pub(crate) struct Warmup {
    hidden: Linear,
    /// The output layer, kept for the tests' predictions (Φ is the hidden layer alone).
    #[cfg(test)]
    output: Linear,
    pub train_accuracy: f64,
    pub final_loss: f64,
}

impl Warmup {
    /// Trains the MLP on `x` with class ids `y` (`classes` of them).
    pub(crate) fn train(
        x: &Matrix,
        y: &[u32],
        classes: usize,
        opts: &WarmupOptions,
    ) -> Result<Warmup> {
        let device = Device::Cpu;
        let mut rng = opts.seed.rng();
        let (w1, b1) = init_linear(x.cols, opts.hidden, &mut rng)?;
        let (w2, b2) = init_linear(opts.hidden, classes, &mut rng)?;
        let hidden = Linear::new(w1.as_tensor().clone(), Some(b1.as_tensor().clone()));
        let output = Linear::new(w2.as_tensor().clone(), Some(b2.as_tensor().clone()));
        let mut optimiser = AdamW::new(
            vec![w1, b1, w2, b2],
            ParamsAdamW {
                lr: opts.learning_rate,
                weight_decay: opts.weight_decay,
                ..Default::default()
            },
        )?;
        let xs = Tensor::from_slice(&x.data, (x.rows, x.cols), &device)?;
        let ys = Tensor::from_slice(y, x.rows, &device)?;
        let mut order: Vec<u32> = (0..x.rows as u32).collect();
        let mut final_loss = f64::NAN;
        for _ in 0..opts.epochs {
            afkit_engine::interrupt::check()?;
            order.shuffle(&mut rng);
            let mut total = 0.0;
            for batch in order.chunks(opts.batch_size) {
                let idx = Tensor::from_slice(batch, batch.len(), &device)?;
                let bx = xs.index_select(&idx, 0)?;
                let by = ys.index_select(&idx, 0)?;
                let logits = output.forward(&hidden.forward(&bx)?.relu()?)?;
                let l = loss::cross_entropy(&logits, &by)?;
                optimiser.backward_step(&l)?;
                total += l.to_scalar::<f32>()? as f64 * batch.len() as f64;
            }
            final_loss = total / x.rows as f64;
        }
        let predictions = output
            .forward(&hidden.forward(&xs)?.relu()?)?
            .argmax(D::Minus1)?;
        let correct = predictions
            .eq(&ys)?
            .to_dtype(DType::F32)?
            .sum_all()?
            .to_scalar::<f32>()?;
        Ok(Warmup {
            hidden,
            #[cfg(test)]
            output,
            train_accuracy: correct as f64 / x.rows as f64,
            final_loss,
        })
    }

    /// The MLP's predicted class ids for `x` (e.g. to check a filtered set stays learnable).
    #[cfg(test)]
    pub(crate) fn predict(&self, x: &Matrix) -> Result<Vec<u32>> {
        let xs = Tensor::from_slice(&x.data, (x.rows, x.cols), &Device::Cpu)?;
        let logits = self.output.forward(&self.hidden.forward(&xs)?.relu()?)?;
        Ok(logits.argmax(D::Minus1)?.to_vec1::<u32>()?)
    }

    /// Φ for `x`: the hidden layer's activations.
    pub(crate) fn represent(&self, x: &Matrix) -> Result<Matrix> {
        let xs = Tensor::from_slice(&x.data, (x.rows, x.cols), &Device::Cpu)?;
        let h = self.hidden.forward(&xs)?.relu()?;
        let (rows, cols) = h.dims2()?;
        Ok(Matrix::new(rows, cols, h.flatten_all()?.to_vec1::<f32>()?))
    }
}

/// PyTorch's default `nn.Linear` initialisation, U(−1/√fan_in, 1/√fan_in), from the seeded
/// generator (candle's own initialisers draw from an unseeded one).
fn init_linear(fan_in: usize, fan_out: usize, rng: &mut ChaCha8Rng) -> Result<(Var, Var)> {
    let bound = 1.0 / (fan_in as f32).sqrt();
    let mut draw =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-bound..bound)).collect() };
    let w = Tensor::from_vec(draw(fan_in * fan_out), (fan_out, fan_in), &Device::Cpu)?;
    let b = Tensor::from_vec(draw(fan_out), fan_out, &Device::Cpu)?;
    Ok((Var::from_tensor(&w)?, Var::from_tensor(&b)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_xor_and_is_deterministic() {
        // XOR is not linearly separable: the hidden layer must do the work.
        let mut rng = Seed::new(1).rng();
        let mut data = Vec::new();
        let mut y = Vec::new();
        for _ in 0..400 {
            let a: f32 = rng.random_range(-1.0..1.0);
            let b: f32 = rng.random_range(-1.0..1.0);
            data.extend([a, b]);
            y.push(u32::from((a > 0.0) != (b > 0.0)));
        }
        let x = Matrix::new(400, 2, data);
        let opts = WarmupOptions {
            hidden: 32,
            epochs: 60,
            batch_size: 32,
            learning_rate: 1e-2,
            weight_decay: 1e-4,
            seed: Seed::new(3),
        };
        let a = Warmup::train(&x, &y, 2, &opts).unwrap();
        assert!(a.train_accuracy > 0.9, "accuracy {}", a.train_accuracy);
        let b = Warmup::train(&x, &y, 2, &opts).unwrap();
        assert_eq!(a.represent(&x).unwrap(), b.represent(&x).unwrap());
        assert_eq!(a.represent(&x).unwrap().cols, 32);
    }
}
