//! Scoring speed of the default models: each context's prompt is run once, then its gold ending
//! and four others are scored after it and after the document-start token alone — the work of
//! AF's LM features ([`afkit_engine::lm::features::features`]) — on afkit's CPU kernels. The
//! same 40 contexts go to every model fetched into `$AFKIT_HOME` (SmolLM2-135M, Gemma-3-270M);
//! models not fetched are skipped with a note. Tokens are counted with each model's own
//! tokenizer (prompt tokens plus ending tokens scored twice), so contexts per second compare the
//! models on the same text.
//!
//! `cargo bench --bench lm_scoring` (set `RAYON_NUM_THREADS` to fix the thread count).

use std::time::Instant;

use afkit_engine::lm::features::features;
use afkit_engine::lm::local::LocalLm;
use afkit_engine::lm::model::LanguageModel;
use afkit_engine::lm::sampler::{SampledEnding, SamplingParams};
use afkit_engine::models::DefaultModel;

const SUBJECTS: [&str; 5] = [
    "A man in a red shirt",
    "The young woman",
    "A group of kids",
    "An old man with a hat",
    "Two girls",
];
const ACTIONS: [&str; 8] = [
    "is standing on a ladder next to the house",
    "walks onto the stage holding a violin",
    "is kneeling in the garden pulling weeds",
    "sits at a table covered with paint and brushes",
    "jumps into the swimming pool",
    "is mixing flour and eggs in a large bowl",
    "ties the laces of a pair of running shoes",
    "stands in front of a mirror brushing her hair",
];
const ENDINGS: [&str; 6] = [
    "then picks up a bucket and starts washing the windows carefully.",
    "smiles at the camera and waves before walking away.",
    "puts everything back into the box and closes the lid.",
    "continues for a while as the people around them clap.",
    "stops, looks at the result and laughs loudly.",
    "hands the tool to the person next to them and steps back.",
];

/// 40 prompts (context sentence plus the start of the next one) with five endings each.
fn inputs() -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for (i, subject) in SUBJECTS.iter().enumerate() {
        for (j, action) in ACTIONS.iter().enumerate() {
            let prompt = format!("{subject} {action}. The person");
            let endings = (0..5)
                .map(|k| ENDINGS[(i + j + k) % ENDINGS.len()].to_string())
                .collect();
            out.push((prompt, endings));
        }
    }
    out
}

fn bench(name: &str, lm: &LocalLm) {
    let inputs = inputs();
    let tok = &lm.model.tokenizer;
    let mut tokens = 0;
    for (prompt, endings) in &inputs {
        tokens += tok.encode(prompt).unwrap().len();
        for e in endings {
            tokens += 2 * lm.ending_tokens(e).unwrap().len();
        }
    }
    // One untimed round first: page the weights in, warm the caches.
    let run = || {
        for (prompt, endings) in &inputs {
            let (gold, others) = endings.split_first().unwrap();
            let others: Vec<SampledEnding> = others
                .iter()
                .map(|text| SampledEnding {
                    text: text.clone(),
                    tokens: None,
                })
                .collect();
            features(lm, prompt, prompt, ("", ""), gold, &others, true).unwrap();
        }
    };
    run();
    let rounds = 3;
    let start = Instant::now();
    for _ in 0..rounds {
        run();
    }
    let secs = start.elapsed().as_secs_f64() / rounds as f64;
    println!(
        "{name}: {} contexts, {tokens} tokens in {secs:.2} s per round: {:.0} tokens/s, {:.1} \
         contexts/s ({:.2} GFLOP per token)",
        inputs.len(),
        tokens as f64 / secs,
        inputs.len() as f64 / secs,
        lm.model.flops_per_token() / 1e9
    );
}

fn main() {
    println!("threads: {}", rayon::current_num_threads());
    for (name, path) in [
        ("SmolLM2-135M (Q4_1)", DefaultModel::smollm2_gguf()),
        ("Gemma-3-270M (Q4_K_M)", DefaultModel::gemma3_gguf()),
    ] {
        if !path.is_file() {
            println!("{name}: skipped, {} is absent", path.display());
            continue;
        }
        let model = LanguageModel::load(&path).unwrap();
        bench(name, &LocalLm::new(model, SamplingParams::default(), None));
    }
}
