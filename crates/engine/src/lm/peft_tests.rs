//! Adapters for other engines: a LoRA adapter written in PEFT's format is loaded by the real
//! `peft` library onto the same base model (transformers reading the GGUF), and gives the
//! log-probabilities afkit's own adapted forward pass gives.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use candle_core::{Device, Tensor};
use rand_distr::{Distribution, Normal};

use super::adapt::ADAPTED;
use super::adapter::{Adapter, BaseModel};
use super::model::{read_header, LanguageModel};
use crate::device::Compute;
use crate::models::DefaultModel;
use crate::seed::Seed;

/// The python that has torch, transformers, peft and gguf, from `AFKIT_PEFT_PYTHON`.
fn peft_python() -> PathBuf {
    let python = std::env::var_os("AFKIT_PEFT_PYTHON")
        .expect("set AFKIT_PEFT_PYTHON to a python with torch, transformers, peft and gguf");
    let has = Command::new(&python)
        .args(["-c", "import torch, transformers, peft, gguf"])
        .output();
    assert!(
        has.is_ok_and(|o| o.status.success()),
        "{python:?} cannot import torch, transformers, peft and gguf"
    );
    PathBuf::from(python)
}

/// An adapter of every matrix of the top layer with random A and B (a trained adapter would do
/// as well; random ones change every output, so the check is not helped by a small update).
fn random_adapter(model: &std::path::Path, layer: usize) -> Adapter {
    let (content, _, _) = read_header(model).unwrap();
    let normal = Normal::new(0.0f32, 0.1).unwrap();
    let mut rng = Seed::new(3).rng();
    let rank = 4;
    let mut updates = BTreeMap::new();
    for matrix in ADAPTED {
        let name = format!("blk.{layer}.{matrix}.weight");
        // GGUF dimensions run fastest first: (in, out).
        let dims = content.tensor_infos[&name].shape.dims().to_vec();
        let (input, out) = (dims[1], dims[0]);
        let mut random =
            |n: usize| -> Vec<f32> { (0..n).map(|_| normal.sample(&mut rng)).collect() };
        let a = Tensor::from_vec(random(rank * input), (rank, input), &Device::Cpu).unwrap();
        let b = Tensor::from_vec(random(out * rank), (out, rank), &Device::Cpu).unwrap();
        updates.insert(name, (a, b));
    }
    Adapter {
        scale: 2.0,
        updates,
    }
}

/// The log-probabilities of `tokens` under transformers + peft (`scripts/peft_logprobs.py`):
/// the base model's, and with the PEFT adapter in `peft_dir`.
fn peft_logprobs(
    python: &Path,
    gguf: &Path,
    peft_dir: &Path,
    tokens: &[u32],
) -> (Vec<f64>, Vec<f64>) {
    let out = Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/peft_logprobs.py"
        ))
        .arg(gguf)
        .arg(peft_dir)
        .arg(serde_json::to_string(tokens).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "peft_logprobs.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let values = |key: &str| -> Vec<f64> {
        theirs[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    (values("base"), values("adapted"))
}

/// SmolLM2 with a random adapter on its top layer: the log-probabilities of a sentence under
/// afkit's engine (adapter merged into the weights) and under transformers + peft (the
/// exported PEFT adapter) agree within 2e-3 nats a token, and the adapter moves them.
#[test]
#[ignore = "needs python with torch, transformers, peft and gguf: AFKIT_PEFT_PYTHON=PYTHON cargo test --release -p afkit-engine -- --ignored peft_adapter"]
fn peft_adapter_gives_afkits_adapted_log_probabilities() {
    let python = peft_python();
    DefaultModel::SmolLm2.ensure().expect("fetch SmolLM2");
    let gguf = DefaultModel::smollm2_gguf();
    let base = LanguageModel::load(&gguf).unwrap();
    let top = 29;
    let adapter = random_adapter(&gguf, top);
    let dir = tempfile::tempdir().unwrap();
    let peft_dir = dir.path().join("peft");
    adapter
        .save_peft(
            &peft_dir,
            &BaseModel {
                architecture: "llama".into(),
                n_head: 9,
                n_kv_head: 3,
                name: "HuggingFaceTB/SmolLM2-135M-Instruct".into(),
            },
        )
        .unwrap();

    let mut tokens = vec![base.tokenizer.doc_start];
    tokens.extend(
        base.tokenizer
            .encode("A man is standing on a ladder. He paints the wall of the house blue.")
            .unwrap(),
    );
    let (_, base_lps) = base.llama.prefill(&tokens).unwrap();
    let adapted = LanguageModel::load_adapted(&gguf, &Compute::cpu(), Some(&adapter)).unwrap();
    let (_, ours) = adapted.llama.prefill(&tokens).unwrap();

    let (their_base, their_adapted) = peft_logprobs(&python, &gguf, &peft_dir, &tokens);
    assert_eq!(their_adapted.len(), ours.len());
    let largest = |a: &[f64], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - f64::from(*y)).abs())
            .fold(0.0, f64::max)
    };
    assert!(
        largest(&their_base, &base_lps) < 2e-3,
        "the base models differ by {}",
        largest(&their_base, &base_lps)
    );
    assert!(
        largest(&their_adapted, &base_lps) > 0.05,
        "the adapter must change the outputs (peft moved them by {}, afkit by {})",
        largest(&their_adapted, &base_lps),
        ours.iter()
            .zip(&base_lps)
            .map(|(a, b)| f64::from((a - b).abs()))
            .fold(0.0, f64::max)
    );
    assert!(
        largest(&their_adapted, &ours) < 2e-3,
        "peft's adapted model and afkit's differ by {} nats",
        largest(&their_adapted, &ours)
    );
}
