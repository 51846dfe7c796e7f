//! Training the stylistic model family on (k+1)-way choices and scoring endings with it.
//!
//! A training step takes a batch of contexts, lays out all their options (gold first, then the
//! k assigned negatives) as one padded batch of rows, scores every row with every head, and
//! reshapes each head's scores to (contexts, k+1) for a softmax cross-entropy with target 0. The
//! loss is the sum over heads. The batch runs as two halves on two threads whose gradients are
//! combined (see [`batch_gradients`]). AdamW (in one pass per parameter on the CPU, see
//! [`super::adamw`]) with gradient clipping by global norm. Parameters are
//! initialised from the seed (candle's CPU initialisers cannot be seeded) on the host and then
//! placed on the run's device, so a fixed seed gives identical initial models on every device
//! and identical trained models on the same machine and device.

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Result, Shape, Tensor, Var};
use candle_nn::init::{FanInOut, NormalOrUniform};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, ParamsAdamW, VarBuilder, VarMap};
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use super::adamw::Optimiser;
use super::data::{Dataset, EncodedEnding};
use super::model::{make_batch, Inputs, StylisticModel, DTYPE};
use super::settings::TrainConfig;
use afkit_engine::seed::{Key, Seed};
use afkit_store::af::Phase;

/// One training choice: the gold ending followed by its negatives, with the `sent2` length.
pub(crate) struct Choice<'a> {
    pub options: Vec<&'a EncodedEnding>,
    pub n_sent2: usize,
}

/// Per-head scores of a list of options, aligned with the input; `None` for absent heads.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scores {
    pub mlp: Vec<f32>,
    pub bow: Option<Vec<f32>>,
    pub cnn: Option<Vec<f32>>,
    pub lstm: Option<Vec<f32>>,
    pub subword: Option<Vec<f32>>,
    pub sentence: Option<Vec<f32>>,
    pub ensemble: Option<Vec<f32>>,
}

/// A trained model family.
pub(crate) struct Trained {
    model: StylisticModel,
    inputs: Inputs,
    device: Device,
}

/// Trains a fresh model family of `family` on `choices` (every choice must have the same number
/// of options). `seed` fixes the initial parameters and the order of the batches.
pub(crate) fn train(
    data: &Dataset,
    choices: &[Choice<'_>],
    family: Phase,
    cfg: &TrainConfig,
    seed: Seed,
) -> anyhow::Result<Trained> {
    let device = cfg.compute.device.clone();
    let varmap = VarMap::new();
    let init = SeededInit {
        varmap: varmap.clone(),
        seed,
    };
    let vb = VarBuilder::from_backend(Box::new(init), DTYPE, device.clone());
    let inputs = Inputs::of(data);
    let model = StylisticModel::new(family, inputs, &cfg.model, cfg.compute.cpu_kernels, vb)?;
    // Sorted by name: the var map's HashMap order is arbitrary, and the order of the gradient
    // norm's sum must not be.
    let vars: Vec<Var> = {
        let data = varmap.data().lock().expect("var map lock");
        let mut named: Vec<(&String, &Var)> = data.iter().collect();
        named.sort_by(|a, b| a.0.cmp(b.0));
        named.into_iter().map(|(_, v)| v.clone()).collect()
    };
    let mut optimiser = Optimiser::new(
        vars.clone(),
        ParamsAdamW {
            lr: cfg.learning_rate,
            weight_decay: cfg.weight_decay,
            ..ParamsAdamW::default()
        },
    )?;
    let epochs = match family {
        Phase::Mlp => cfg.mlp_epochs,
        Phase::Style | Phase::Ensemble => cfg.ensemble_epochs,
    };
    let text = (family != Phase::Mlp).then_some(inputs);
    let mut rng = seed.key(Key::BatchOrder).rng();
    let mut order: Vec<usize> = (0..choices.len()).collect();
    for _ in 0..epochs {
        order.shuffle(&mut rng);
        for batch_ids in order.chunks(cfg.batch_contexts.max(1)) {
            let Some(mut grads) =
                batch_gradients(&model, choices, batch_ids, text, &vars, &device)?
            else {
                continue;
            };
            clip_global_norm(&mut grads, &vars, cfg.clip_norm)?;
            optimiser.step(&grads)?;
        }
    }
    Ok(Trained {
        model,
        inputs,
        device,
    })
}

/// Gradients of one batch's loss (the sum over heads of each head's mean cross-entropy), or
/// `None` when no head exists.
///
/// candle runs each elementwise op on one thread (`afkit_engine::runtime::use_one_candle_thread`),
/// so the batch is split in two, each half scored and differentiated on a thread of its own with
/// its loss weighted by its share of the contexts, and the halves' gradients are added: the mean
/// over the batch, as one pass would give up to rounding. The split is fixed (contexts by their
/// longest option, shorter half first, which also pads each half less), so the result does not
/// depend on the number of threads.
fn batch_gradients(
    model: &StylisticModel,
    choices: &[Choice<'_>],
    batch_ids: &[usize],
    text: Option<Inputs>,
    vars: &[Var],
    device: &Device,
) -> anyhow::Result<Option<GradStore>> {
    let longest = |i: &usize| {
        let options = &choices[*i].options;
        options.iter().map(|e| e.words.len()).max().unwrap_or(0)
    };
    let mut by_length = batch_ids.to_vec();
    by_length.sort_by_key(longest);
    let (short, long) = by_length.split_at(by_length.len() / 2);
    let n = batch_ids.len() as f64;
    let half = |ids: &[usize]| -> anyhow::Result<Option<GradStore>> {
        let Some(loss) = batch_loss(model, choices, ids, text, device)? else {
            return Ok(None);
        };
        Ok(Some((loss * (ids.len() as f64 / n))?.backward()?))
    };
    let (short_grads, long_grads) = rayon::join(|| half(short), || half(long));
    match (short_grads?, long_grads?) {
        (Some(mut grads), Some(mut long_grads)) => {
            for var in vars {
                if let Some(b) = long_grads.remove(var) {
                    let sum = match grads.remove(var) {
                        Some(a) => (a + b)?,
                        None => b,
                    };
                    grads.insert(var, sum);
                }
            }
            Ok(Some(grads))
        }
        // A one-context batch has an empty short half; without heads neither half has a loss.
        (one, None) | (None, one) => Ok(one),
    }
}

/// The summed heads' mean cross-entropy over `batch_ids`' choices (target: the gold option,
/// first), or `None` for an empty batch or a model without heads.
fn batch_loss(
    model: &StylisticModel,
    choices: &[Choice<'_>],
    batch_ids: &[usize],
    text: Option<Inputs>,
    device: &Device,
) -> anyhow::Result<Option<Tensor>> {
    let Some(&first) = batch_ids.first() else {
        return Ok(None);
    };
    let n_options = choices[first].options.len();
    let rows: Vec<(&EncodedEnding, usize)> = batch_ids
        .iter()
        .flat_map(|&i| {
            choices[i]
                .options
                .iter()
                .map(move |e| (*e, choices[i].n_sent2))
        })
        .collect();
    let batch = make_batch(&rows, text, model.cnn_layout(), device)?;
    let scores = model.forward(&batch)?;
    let targets = Tensor::zeros(batch_ids.len(), DType::U32, device)?;
    let mut loss: Option<Tensor> = None;
    for head in scores.all() {
        let logits = head.reshape((batch_ids.len(), n_options))?;
        let l = candle_nn::loss::cross_entropy(&logits, &targets)?;
        loss = Some(match loss {
            None => l,
            Some(sum) => (sum + l)?,
        });
    }
    Ok(loss)
}

impl Trained {
    pub(crate) fn family(&self) -> Phase {
        self.model.family()
    }

    /// Scores options given as (ending, `sent2` length). Rows are sorted by length and scored in
    /// chunks so that padding stays small.
    pub(crate) fn score(&self, options: &[(&EncodedEnding, usize)]) -> anyhow::Result<Scores> {
        const CHUNK: usize = 512;
        let text = (self.family() != Phase::Mlp).then_some(self.inputs);
        let with_text = text.is_some();
        let mut order: Vec<usize> = (0..options.len()).collect();
        order.sort_by_key(|&i| options[i].0.words.len());
        let n = options.len();
        let mut out = Scores {
            mlp: vec![0.0; n],
            bow: with_text.then(|| vec![0.0; n]),
            cnn: with_text.then(|| vec![0.0; n]),
            lstm: with_text.then(|| vec![0.0; n]),
            subword: (with_text && self.inputs.subword_buckets > 0).then(|| vec![0.0; n]),
            sentence: (with_text && self.inputs.sentence_dim > 0).then(|| vec![0.0; n]),
            ensemble: with_text.then(|| vec![0.0; n]),
        };
        for chunk in order.chunks(CHUNK) {
            let rows: Vec<(&EncodedEnding, usize)> = chunk.iter().map(|&i| options[i]).collect();
            let batch = make_batch(&rows, text, self.model.cnn_layout(), &self.device)?;
            let scores = self.model.forward(&batch)?;
            scatter(&mut out.mlp, chunk, &scores.mlp)?;
            for (dst, src) in [
                (&mut out.bow, &scores.bow),
                (&mut out.cnn, &scores.cnn),
                (&mut out.lstm, &scores.lstm),
                (&mut out.subword, &scores.subword),
                (&mut out.sentence, &scores.sentence),
                (&mut out.ensemble, &scores.ensemble),
            ] {
                if let (Some(dst), Some(src)) = (dst.as_mut(), src) {
                    scatter(dst, chunk, src)?;
                }
            }
        }
        Ok(out)
    }
}

fn scatter(dst: &mut [f32], positions: &[usize], values: &Tensor) -> Result<()> {
    for (&p, v) in positions.iter().zip(values.to_vec1::<f32>()?) {
        dst[p] = v;
    }
    Ok(())
}

/// Rescales all gradients together so that their global L2 norm is at most `max_norm`.
fn clip_global_norm(grads: &mut GradStore, vars: &[Var], max_norm: f64) -> Result<f64> {
    let mut squared = 0.0f64;
    for var in vars {
        if let Some(g) = grads.get(var) {
            squared += f64::from(g.sqr()?.sum_all()?.to_scalar::<f32>()?);
        }
    }
    let norm = squared.sqrt();
    if norm > max_norm {
        let scale = max_norm / (norm + 1e-6);
        for var in vars {
            if let Some(g) = grads.remove(var) {
                grads.insert(var, (g * scale)?);
            }
        }
    }
    Ok(norm)
}

/// A variable store whose initial values come from the model's seed: each variable from a seed
/// of its own, derived with the variable's name as the key, with the distributions candle-nn
/// asks for.
struct SeededInit {
    varmap: VarMap,
    seed: Seed,
}

impl SeededInit {
    fn sample(&self, shape: &Shape, init: Init, name: &str, device: &Device) -> Result<Tensor> {
        let mut rng = self.seed.key(Key::ModelInit(name)).rng();
        let n = shape.elem_count();
        let uniform = |rng: &mut ChaCha8Rng, lo: f64, hi: f64| -> Vec<f32> {
            (0..n).map(|_| rng.random_range(lo..hi) as f32).collect()
        };
        let normal = |rng: &mut ChaCha8Rng, mean: f64, std: f64| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    let z: f64 = StandardNormal.sample(rng);
                    (mean + std * z) as f32
                })
                .collect()
        };
        let values = match init {
            Init::Const(c) => vec![c as f32; n],
            Init::Uniform { lo, up } => uniform(&mut rng, lo, up),
            Init::Randn { mean, stdev } => normal(&mut rng, mean, stdev),
            Init::Kaiming {
                dist,
                fan,
                non_linearity,
            } => {
                let fan = match fan {
                    FanInOut::FanIn => FanInOut::FanIn.for_shape(shape),
                    FanInOut::FanOut => FanInOut::FanOut.for_shape(shape),
                };
                let std = non_linearity.gain() / (fan as f64).sqrt();
                match dist {
                    NormalOrUniform::Uniform => {
                        let bound = 3f64.sqrt() * std;
                        uniform(&mut rng, -bound, bound)
                    }
                    NormalOrUniform::Normal => normal(&mut rng, 0.0, std),
                }
            }
        };
        Tensor::from_vec(values, shape.clone(), device)
    }
}

impl SimpleBackend for SeededInit {
    fn get(&self, s: Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> Result<Tensor> {
        let mut data = self.varmap.data().lock().expect("var map lock");
        if let Some(var) = data.get(name) {
            if var.shape() != &s {
                candle_core::bail!("shape mismatch on {name}: {s:?} <> {:?}", var.shape());
            }
            return Ok(var.as_tensor().clone());
        }
        let var = Var::from_tensor(&self.sample(&s, h, name, dev)?.to_dtype(dtype)?)?;
        let tensor = var.as_tensor().clone();
        data.insert(name.to_string(), var);
        Ok(tensor)
    }

    fn get_unchecked(&self, name: &str, _dtype: DType, _dev: &Device) -> Result<Tensor> {
        let data = self.varmap.data().lock().expect("var map lock");
        match data.get(name) {
            Some(var) => Ok(var.as_tensor().clone()),
            None => candle_core::bail!("no variable {name}"),
        }
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.varmap
            .data()
            .lock()
            .map(|d| d.contains_key(name))
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::EncodedContext;
    use afkit_engine::device::Compute;

    /// Contexts of a gold ending and three negatives with random words, tags and LM features.
    fn synthetic_dataset(contexts: usize) -> Dataset {
        let mut rng = Seed::new(3).rng();
        let mut ending = |id: i64| {
            let len = rng.random_range(3..14);
            EncodedEnding {
                ending_id: id,
                mlp: std::array::from_fn(|_| rng.random_range(-2.0..2.0)),
                scorer: Box::default(),
                words: (0..len).map(|_| rng.random_range(1..40)).collect(),
                lstm: (0..len).map(|_| rng.random_range(1..20)).collect(),
                subwords: (0..3 * len).map(|_| rng.random_range(1..=64)).collect(),
                sentence: (0..8).map(|_| rng.random_range(-0.5..0.5)).collect(),
            }
        };
        let contexts = (0..contexts as i64)
            .map(|c| EncodedContext {
                example_id: c,
                group: format!("v{c}"),
                n_sent2: 2,
                gold: ending(10 * c),
                candidates: (1..4).map(|j| ending(10 * c + j)).collect(),
            })
            .collect();
        Dataset {
            contexts,
            vocab_size: 40,
            lstm_vocab_size: 20,
            with_text: true,
            subword_buckets: 64,
            sentence_dim: 8,
            scorer_features: 0,
            excluded: 0,
            set_aside_by_review: 0,
            alone_inputs: crate::data::AloneInputs::All,
            scorer_alone_dropped: false,
        }
    }

    /// Every context as a training choice, gold first.
    fn gold_first_choices(data: &Dataset) -> Vec<Choice<'_>> {
        data.contexts
            .iter()
            .map(|c| Choice {
                options: std::iter::once(&c.gold).chain(&c.candidates).collect(),
                n_sent2: c.n_sent2,
            })
            .collect()
    }

    /// The options of the choices, in order, as scoring rows.
    fn rows<'a>(choices: &[Choice<'a>]) -> Vec<(&'a EncodedEnding, usize)> {
        choices
            .iter()
            .flat_map(|c| c.options.iter().map(move |e| (*e, c.n_sent2)))
            .collect()
    }

    /// The two halves' gradients, weighted by their contexts, are the whole batch's gradient
    /// (one pass over all its rows) up to rounding, for every parameter of every model.
    #[test]
    fn split_batch_gradients_equal_the_whole_batch_gradient() -> anyhow::Result<()> {
        let data = synthetic_dataset(11);
        let choices = gold_first_choices(&data);
        let cfg = TrainConfig::default();
        let varmap = VarMap::new();
        let init = SeededInit {
            varmap: varmap.clone(),
            seed: Seed::new(5),
        };
        let vb = VarBuilder::from_backend(Box::new(init), DTYPE, Device::Cpu);
        let inputs = Inputs::of(&data);
        let model = StylisticModel::new(Phase::Ensemble, inputs, &cfg.model, true, vb)?;
        let vars: Vec<Var> = varmap.all_vars();
        let ids: Vec<usize> = (0..choices.len()).rev().collect();
        let text = Some(inputs);
        let whole = batch_loss(&model, &choices, &ids, text, &Device::Cpu)?
            .expect("heads")
            .backward()?;
        let split =
            batch_gradients(&model, &choices, &ids, text, &vars, &Device::Cpu)?.expect("heads");
        let mut compared = 0;
        for var in &vars {
            let (Some(w), Some(s)) = (whole.get(var), split.get(var)) else {
                assert!(whole.get(var).is_none() && split.get(var).is_none());
                continue;
            };
            let w: Vec<f32> = w.flatten_all()?.to_vec1()?;
            let s: Vec<f32> = s.flatten_all()?.to_vec1()?;
            for (a, b) in w.iter().zip(&s) {
                assert!((a - b).abs() <= 1e-5 + 1e-3 * a.abs(), "{a} vs {b}");
            }
            compared += 1;
        }
        assert!(compared > 10, "only {compared} parameters have gradients");
        Ok(())
    }

    /// Each of the two models beyond SWAG's four finds a tell only it can see: a subword id
    /// that every found ending has (a few times, like a habit of spelling) and no negative, and a sentence-vector direction likewise.
    /// The word ids, tags and LM features carry no signal.
    #[test]
    fn subword_and_sentence_models_learn_their_tells() -> anyhow::Result<()> {
        let mut data = synthetic_dataset(64);
        for c in &mut data.contexts {
            let mut gold_subwords = c.gold.subwords.to_vec();
            gold_subwords.extend([65; 4]);
            c.gold.subwords = gold_subwords.into();
            c.gold.sentence[0] = 1.0;
            for e in &mut c.candidates {
                e.sentence[0] = -1.0;
            }
        }
        data.subword_buckets = 65;
        let choices = gold_first_choices(&data);
        let options = rows(&choices);
        let cfg = TrainConfig {
            ensemble_epochs: 30,
            batch_contexts: 16,
            ..TrainConfig::default()
        };
        let scores =
            train(&data, &choices, Phase::Ensemble, &cfg, Seed::new(1))?.score(&options)?;
        let solved = |head: &[f32]| {
            head.chunks(4)
                .filter(|s| s[1..].iter().all(|&n| s[0] > n))
                .count() as f64
                / 64.0
        };
        let subword = solved(scores.subword.as_deref().expect("a subword head"));
        let sentence = solved(scores.sentence.as_deref().expect("a sentence head"));
        assert!(subword > 0.9, "subword head solves {subword}");
        assert!(sentence > 0.9, "sentence head solves {sentence}");
        Ok(())
    }

    /// The generic path (candle ops only, what a GPU runs) scores like afkit's CPU kernels: the
    /// same initial model gives the same scores; after training, where rounding differences in
    /// the gradients reach the parameters through AdamW (which scales every update to about the
    /// learning rate), they stay within a few steps' worth. On the CPU, and on the first GPU in
    /// a build with the `cuda` feature.
    #[test]
    fn generic_path_scores_like_the_cpu_kernels() -> anyhow::Result<()> {
        let data = synthetic_dataset(24);
        let choices = gold_first_choices(&data);
        let options = rows(&choices);
        let scores = |epochs: usize, compute: Compute| -> anyhow::Result<Vec<Vec<f32>>> {
            let cfg = TrainConfig {
                ensemble_epochs: epochs,
                batch_contexts: 8,
                compute,
                ..TrainConfig::default()
            };
            let s = train(&data, &choices, Phase::Ensemble, &cfg, Seed::new(5))?.score(&options)?;
            Ok([s.bow, s.cnn, s.lstm, s.subword, s.sentence, s.ensemble]
                .into_iter()
                .map(|h| h.expect("an ensemble head"))
                .chain([s.mlp])
                .collect())
        };
        let mut devices = vec![Device::Cpu];
        if candle_core::utils::cuda_is_available() {
            devices.push(Device::new_cuda(0)?);
        }
        for (epochs, tolerance) in [(0, 1e-5), (3, 1e-2)] {
            let kernels = scores(epochs, Compute::cpu())?;
            for device in &devices {
                let generic = Compute {
                    device: device.clone(),
                    cpu_kernels: false,
                    lm_products: afkit_engine::device::LmProducts::F32,
                };
                for (k, g) in kernels.iter().zip(scores(epochs, generic)?) {
                    let worst = k
                        .iter()
                        .zip(&g)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    assert!(
                        worst < tolerance,
                        "{device:?}, {epochs} epochs: scores differ by up to {worst}"
                    );
                }
            }
            // Scores vary across options (a broken model scoring all alike would pass).
            let cnn = &kernels[1];
            assert!(cnn.iter().any(|&x| (x - cnn[0]).abs() > 1e-3));
        }
        Ok(())
    }
}
