//! Gemma-3-270M (the Q4_K_M GGUF of `afkit models fetch gemma3`) against Hugging Face
//! transformers reading the same file: the tokenizer's ids and the forward pass's log-probs on
//! fixed texts, whole and as scored continuations. The reference is
//! `crates/engine/testdata/gemma3_270m_reference.json`, written by `scripts/gemma3_reference.py`.
//! The model is fetched into `$AFKIT_HOME` once, as the SmolLM2 tests fetch theirs; with
//! AFKIT_TEST_OFFLINE set the tests are ignored with that reason.

use std::sync::OnceLock;

use serde_json::Value;

use super::linear::fast_bf16_kernel;
use super::model::LanguageModel;
use super::tests::token_ids;
use crate::device::Compute;
use crate::models::{sha256_file, DefaultModel};

/// Largest difference in one token's log-probability (nats): both sides dequantise the same
/// weights and run in f32, so they differ only by summation order.
const TOLERANCE: f64 = 2e-3;

fn reference() -> Value {
    let text = include_str!("../../testdata/gemma3_270m_reference.json");
    serde_json::from_str(text).unwrap()
}

/// The model on afkit's kernels in f32 (`reduced: false`) or as generation runs it, with
/// bf16 products on AMX tiles or with AVX512-BF16 where the CPU has them.
fn gemma3(reduced: bool) -> &'static LanguageModel {
    static F32: OnceLock<LanguageModel> = OnceLock::new();
    static REDUCED: OnceLock<LanguageModel> = OnceLock::new();
    let (cell, compute) = match reduced {
        false => (&F32, Compute::cpu_f32()),
        true => (&REDUCED, Compute::cpu()),
    };
    cell.get_or_init(|| {
        DefaultModel::Gemma3.ensure().expect("fetch Gemma-3-270M");
        let path = DefaultModel::gemma3_gguf();
        let want = reference()["model_sha256"].as_str().unwrap().to_string();
        assert_eq!(sha256_file(&path).unwrap(), want, "a different Gemma file");
        LanguageModel::load_on(&path, &compute).unwrap()
    })
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn assert_close(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (*g as f64 - w).abs() < TOLERANCE,
            "{what}: token {i}: {g} vs transformers {w}"
        );
    }
}

#[test]
#[cfg_attr(
    offline,
    ignore = "AFKIT_TEST_OFFLINE is set: Gemma-3-270M is not fetched"
)]
fn gemma3_tokenizer_matches_transformers() {
    let lm = gemma3(false);
    for case in reference()["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let got = lm.tokenizer.encode(text).unwrap();
        assert_eq!(got, token_ids(&case["ids"]), "{text:?}");
        assert_eq!(lm.tokenizer.decode(&got).unwrap(), text);
    }
}

#[test]
#[cfg_attr(
    offline,
    ignore = "AFKIT_TEST_OFFLINE is set: Gemma-3-270M is not fetched"
)]
fn gemma3_forward_pass_matches_transformers() {
    let lm = gemma3(false);
    let reference = reference();
    assert_eq!(
        lm.tokenizer.doc_start as u64,
        reference["bos"].as_u64().unwrap()
    );
    for case in reference["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let ids = token_ids(&case["ids"]);
        let want = floats(&case["logprobs"]);
        let mut whole = vec![lm.tokenizer.doc_start];
        whole.extend(&ids);
        let (_, got) = lm.llama.prefill(&whole).unwrap();
        assert_close(&format!("prefill of {text:?}"), &got, &want);
        // The scoring path: the text after the document-start prefix, and its second half after
        // a prefix of its first half.
        let scored = lm
            .llama
            .score_continuations(&lm.doc_prefix, std::slice::from_ref(&ids))
            .unwrap();
        assert_close(&format!("scoring {text:?}"), &scored[0], &want);
        let half = ids.len() / 2;
        let (prefix, _) = lm.llama.prefill(&whole[..=half]).unwrap();
        let tail = lm
            .llama
            .score_continuations(&prefix, &[ids[half..].to_vec()])
            .unwrap();
        assert_close(&format!("second half of {text:?}"), &tail[0], &want[half..]);
    }
}

/// With reduced-precision products (what generation and scoring run where the CPU has them:
/// bf16 on AMX tiles or with AVX512-BF16), the forward pass stays near transformers' f32: each
/// operand keeps 8 significant bits, so a log-probability moves by about a hundredth of a nat
/// (on these texts in 2026-11: 0.01 on average, 0.05–0.07 at most), far less than the
/// differences between endings that the features and the audit read.
#[test]
#[cfg_attr(
    offline,
    ignore = "AFKIT_TEST_OFFLINE is set: Gemma-3-270M is not fetched"
)]
fn gemma3_in_reduced_precision_stays_near_transformers() {
    let Some(kernel) = fast_bf16_kernel() else {
        eprintln!("skipped: this CPU has neither AMX tiles nor AVX512-BF16 (or AFKIT_SIMD keeps them off)");
        return;
    };
    let lm = gemma3(true);
    let (mut total, mut worst, mut tokens) = (0f64, 0f64, 0usize);
    for case in reference()["cases"].as_array().unwrap() {
        let mut whole = vec![lm.tokenizer.doc_start];
        whole.extend(token_ids(&case["ids"]));
        let (_, got) = lm.llama.prefill(&whole).unwrap();
        for (g, w) in got.iter().zip(floats(&case["logprobs"])) {
            let diff = (*g as f64 - w).abs();
            (total, worst, tokens) = (total + diff, worst.max(diff), tokens + 1);
        }
    }
    let mean = total / tokens as f64;
    eprintln!("{kernel:?}: mean {mean:.4}, largest {worst:.4} nats from transformers");
    assert!(mean < 0.03 && worst < 0.2, "mean {mean}, largest {worst}");
}
