//! Each family's forward pass against an independent one: candle-transformers' quantized Qwen 2,
//! Qwen 3 and Gemma 3 models, loading the same random GGUF file that afkit writes. Log-probs of
//! a fixed token sequence must agree within [`TOLERANCE`] on both of afkit's engines, whole
//! (prefill) and as a continuation of the document-start token (the scoring path).

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Content};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor, D};

use super::config::LlamaConfig;
use super::family::{Arch, Family, LocalLayers};
use super::model::LanguageModel;
use crate::device::Compute;
use crate::fixtures::{write_random_gguf, RANDOM_GGUF_VOCAB};
use crate::seed::Seed;

/// Largest difference in a token's log-probability (nats) between afkit and the reference: f32
/// sums taken in different orders over a few layers differ by about 1e-5; a wrong norm,
/// rotation or bias moves log-probs by tenths.
const TOLERANCE: f32 = 2e-3;

/// A fixed token sequence of the random vocabularies (document start first).
fn tokens(doc_start: u32) -> Vec<u32> {
    let mut ids = vec![doc_start];
    ids.extend([
        270u32, 70, 33, 262, 101, 280, 44, 45, 267, 90, 120, 5, 271, 200,
    ]);
    ids
}

fn config(family: Family) -> LlamaConfig {
    LlamaConfig {
        vocab: RANDOM_GGUF_VOCAB,
        d_model: 64,
        n_layer: 4,
        n_head: 4,
        n_kv_head: 2,
        d_ff: 96,
        rope_theta: 10_000.0,
        rms_eps: 1e-6,
        arch: Arch {
            family,
            // Heads wider than d_model / n_head, as Qwen 3 and Gemma 3 have them.
            head_dim: (family != Family::Qwen2).then_some(24),
            local_layers: (family == Family::Gemma3).then_some(LocalLayers {
                window: 64,
                period: 2,
                rope_theta: 1_000.0,
            }),
        },
    }
}

/// Log-probs of each token after the first, from candle's reference model fed one token at a
/// time through its own cache.
fn reference_logprobs(path: &Path, family: Family, ids: &[u32]) -> Vec<f32> {
    use candle_transformers::models::{quantized_gemma3, quantized_qwen2, quantized_qwen3};
    let mut file = BufReader::new(File::open(path).unwrap());
    let content = Content::read(&mut file).unwrap();
    let dev = Device::Cpu;
    let mut step: Box<dyn FnMut(u32, usize) -> Tensor> = match family {
        Family::Qwen2 => {
            let mut m = quantized_qwen2::ModelWeights::from_gguf(content, &mut file, &dev).unwrap();
            Box::new(move |t, pos| m.forward(&Tensor::new(&[[t]], &dev).unwrap(), pos).unwrap())
        }
        Family::Qwen3 => {
            let mut m = quantized_qwen3::ModelWeights::from_gguf(content, &mut file, &dev).unwrap();
            Box::new(move |t, pos| m.forward(&Tensor::new(&[[t]], &dev).unwrap(), pos).unwrap())
        }
        Family::Gemma3 => {
            let mut m =
                quantized_gemma3::ModelWeights::from_gguf(content, &mut file, &dev).unwrap();
            Box::new(move |t, pos| m.forward(&Tensor::new(&[[t]], &dev).unwrap(), pos).unwrap())
        }
        Family::Llama => unreachable!("llama has its own fixtures"),
    };
    let mut out = Vec::new();
    for (pos, pair) in ids.windows(2).enumerate() {
        let logits = step(pair[0], pos).flatten_all().unwrap();
        let lsm = candle_nn::ops::log_softmax(&logits, D::Minus1).unwrap();
        out.push(lsm.to_vec1::<f32>().unwrap()[pair[1] as usize]);
    }
    out
}

/// afkit's log-probs of `ids[1..]` on `compute`: from a prefill of the whole sequence, and as a
/// scored continuation of the first token.
fn afkit_logprobs(path: &Path, compute: &Compute, ids: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let lm = LanguageModel::load_on(path, compute).unwrap();
    assert_eq!(lm.tokenizer.doc_start, ids[0]);
    let (_, whole) = lm.llama.prefill(ids).unwrap();
    let scored = lm
        .llama
        .score_continuations(&lm.doc_prefix, &[ids[1..].to_vec()])
        .unwrap()
        .remove(0);
    (whole, scored)
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        worst < TOLERANCE,
        "{what}: log-probs differ by up to {worst}\n got {got:?}\nwant {want:?}"
    );
}

fn check_family(family: Family, edit: impl Fn(&Path)) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("random.gguf");
    write_random_gguf(&path, &config(family), Seed::new(3)).unwrap();
    edit(&path);
    let doc_start = LanguageModel::load(&path).unwrap().tokenizer.doc_start;
    let ids = tokens(doc_start);
    let want = reference_logprobs(&path, family, &ids);
    for compute in [
        Compute::cpu_f32(),
        Compute {
            cpu_kernels: false,
            ..Compute::cpu()
        },
    ] {
        let (whole, scored) = afkit_logprobs(&path, &compute, &ids);
        let engine = if compute.cpu_kernels {
            "afkit kernels"
        } else {
            "generic"
        };
        assert_close(&format!("{family:?} prefill, {engine}"), &whole, &want);
        assert_close(&format!("{family:?} scoring, {engine}"), &scored, &want);
    }
}

#[test]
fn qwen2_matches_candles_reference() {
    check_family(Family::Qwen2, |_| {});
}

#[test]
fn qwen3_matches_candles_reference() {
    check_family(Family::Qwen3, |_| {});
}

/// candle's Gemma 3 gates its feed-forward with SiLU where Gemma uses GELU (tanh), so the
/// feed-forward outputs are zeroed here (`ffn_down` = 0): everything else — embedding scale,
/// head norms, the norms around attention, the local layers' rotary base — is compared. The
/// GELU gate is checked by the real model's fixture against transformers.
#[test]
fn gemma3_matches_candles_reference_without_the_feed_forward() {
    check_family(Family::Gemma3, zero_feed_forward_outputs);
}

/// Rewrites the GGUF at `path` with every `ffn_down` matrix zeroed.
fn zero_feed_forward_outputs(path: &Path) {
    rewrite_tensors(path, |name, t| {
        if !name.ends_with("ffn_down.weight") {
            return t;
        }
        let zeros = Tensor::zeros(t.shape(), DType::F32, &Device::Cpu).unwrap();
        QTensor::quantize(&zeros, GgmlDType::F32).unwrap()
    });
}

/// Rewrites the GGUF at `path`, each tensor replaced by `edit(name, tensor)`.
fn rewrite_tensors(path: &Path, edit: impl Fn(&str, QTensor) -> QTensor) {
    let mut file = BufReader::new(File::open(path).unwrap());
    let content = Content::read(&mut file).unwrap();
    let tensors: Vec<(String, QTensor)> = content
        .tensor_infos
        .keys()
        .map(|name| {
            let t = content.tensor(&mut file, name, &Device::Cpu).unwrap();
            (name.clone(), edit(name, t))
        })
        .collect();
    let metadata: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut out = BufWriter::new(File::create(path).unwrap());
    gguf_file::write(&mut out, &metadata, &tensor_refs).unwrap();
}

/// Every GGUF weight type candle reads loads (candle writes Q8_1 and
/// Q8K, llama.cpp's intermediate types, but reads neither back from a file): the matrices of a random model stored in each
/// type give log-probs close to the f32 model's. The bounds are about twice the mean
/// differences measured (random weights quantise worse than trained ones: 0.001 for F16, 0.03
/// for Q8_0, 0.4 for Q4_K, 1.1 for Q2_K).
#[test]
fn every_quantisation_candle_reads_loads() {
    use GgmlDType::*;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("random.gguf");
    // Rows of 256 values, the block of the k-quants.
    let cfg = LlamaConfig {
        d_model: 256,
        d_ff: 512,
        n_layer: 2,
        arch: Arch::default(),
        ..config(Family::Llama)
    };
    write_random_gguf(&path, &cfg, Seed::new(6)).unwrap();
    let ids = tokens(LanguageModel::load(&path).unwrap().tokenizer.doc_start);
    let (_, exact) = LanguageModel::load_on(&path, &Compute::cpu_f32())
        .unwrap()
        .llama
        .prefill(&ids)
        .unwrap();
    let types = [
        (F16, 0.005),
        (BF16, 0.02),
        (Q8_0, 0.1),
        (Q6K, 0.2),
        (Q5_0, 0.5),
        (Q5_1, 0.5),
        (Q5K, 0.5),
        (Q4_0, 1.0),
        (Q4_1, 1.0),
        (Q4K, 1.0),
        (Q3K, 1.5),
        (Q2K, 2.5),
    ];
    for (dtype, bound) in types {
        let quantised = dir.path().join(format!("{dtype:?}.gguf"));
        std::fs::copy(&path, &quantised).unwrap();
        rewrite_tensors(&quantised, |_, t| match t.shape().dims().len() {
            2 => QTensor::quantize(&t.dequantize(&Device::Cpu).unwrap(), dtype).unwrap(),
            _ => t,
        });
        let lm = LanguageModel::load_on(&quantised, &Compute::cpu_f32()).unwrap();
        let (_, got) = lm.llama.prefill(&ids).unwrap();
        let mean_diff = got
            .iter()
            .zip(&exact)
            .map(|(a, b)| (a - b).abs())
            .sum::<f32>()
            / got.len() as f32;
        assert!(
            mean_diff < bound,
            "{dtype:?}: log-probs {mean_diff} from the f32 model's on average"
        );
    }
}

/// A local layer's window, on both engines: a sequence several windows long gives the same
/// log-probs packed (per-token attention) and through candle ops (masks), from the whole
/// sequence and as continuations of a prefix longer than the window.
#[test]
fn gemma3_sliding_window_agrees_across_engines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("random.gguf");
    let mut cfg = config(Family::Gemma3);
    cfg.arch.local_layers.as_mut().unwrap().window = 5;
    write_random_gguf(&path, &cfg, Seed::new(4)).unwrap();
    let ids: Vec<u32> = (0..40).map(|i| 4 + (i * 37 % 280) as u32).collect();
    let mut results = Vec::new();
    for compute in [
        Compute::cpu_f32(),
        Compute {
            cpu_kernels: false,
            ..Compute::cpu()
        },
    ] {
        let lm = LanguageModel::load_on(&path, &compute).unwrap();
        let (_, whole) = lm.llama.prefill(&ids).unwrap();
        let (prefix, _) = lm.llama.prefill(&ids[..12]).unwrap();
        let tail = lm
            .llama
            .score_continuations(&prefix, &[ids[12..].to_vec(), ids[12..20].to_vec()])
            .unwrap();
        // The continuation's log-probs are the whole sequence's from token 12 on.
        assert_close("continuation vs whole", &tail[0], &whole[11..]);
        assert_close("short continuation vs whole", &tail[1], &whole[11..19]);
        results.push(whole);
    }
    assert_close("engines", &results[0], &results[1]);
    // The window matters: without it the log-probs differ.
    let mut wide = cfg.clone();
    wide.arch.local_layers.as_mut().unwrap().window = 1000;
    write_random_gguf(&path, &wide, Seed::new(4)).unwrap();
    let (_, unwindowed) = LanguageModel::load_on(&path, &Compute::cpu_f32())
        .unwrap()
        .llama
        .prefill(&ids)
        .unwrap();
    let moved = unwindowed
        .iter()
        .zip(&results[0])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(moved > 0.01, "a 5-token window changed nothing ({moved})");
}

#[test]
fn sentencepiece_vocabulary_round_trips_with_byte_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("random.gguf");
    write_random_gguf(&path, &config(Family::Gemma3), Seed::new(3)).unwrap();
    let tok = LanguageModel::load(&path).unwrap().tokenizer;
    assert_eq!(tok.doc_start, 2, "Gemma documents start with <bos>");
    assert!(tok.is_end_of_generation(1));
    // "the" merges to ▁the after a space; "Z" and "é" are not pieces and fall back to bytes.
    let ids = tok.encode("a the Zé.").unwrap();
    let pieces: Vec<String> = ids.iter().map(|&i| tok.decode(&[i]).unwrap()).collect();
    assert_eq!(tok.decode(&ids).unwrap(), "a the Zé.");
    assert!(ids.contains(&289), "▁the is one token: {pieces:?}");
    assert!(
        ids.contains(&(4 + 0x5A)),
        "Z falls back to its byte: {ids:?}"
    );
    assert!(tok.starts_word[289] && !tok.starts_word[288]);
}
