//! Scores endings with a language model, after their context and alone: the per-token
//! log-probabilities that `scripts/blind_signals.py` sets beside a blind reading's judgements.
//!
//! ```text
//! cargo run --release -p afkit-engine --example score_endings -- MODEL.gguf IN.json OUT.json
//! ```
//!
//! IN.json is a list of `{"key": ..., "context": "...", "options": ["...", ...]}`; OUT.json gets,
//! per item and in its order, `{"key", "options", "cond", "alone"}`: each option's tokens'
//! log-probabilities after the context (posed as `afkit audit --lm` poses a question) and after
//! no context.

use afkit_engine::lm::choice::{ChoiceQuestion, ChoiceScorer};
use afkit_engine::lm::model::LanguageModel;
use anyhow::{ensure, Context, Result};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Item {
    key: serde_json::Value,
    context: String,
    options: Vec<String>,
}

#[derive(Serialize)]
struct Scored<'a> {
    key: &'a serde_json::Value,
    options: &'a [String],
    cond: Vec<Vec<f32>>,
    alone: Vec<Vec<f32>>,
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    ensure!(
        args.len() == 3,
        "usage: score_endings MODEL.gguf IN.json OUT.json"
    );
    let model = LanguageModel::load(std::path::Path::new(&args[0]))?;
    let text =
        std::fs::read_to_string(&args[1]).with_context(|| format!("cannot read {}", args[1]))?;
    let items: Vec<Item> = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a list of items", args[1]))?;
    let scorer = ChoiceScorer::new(&model)?;
    let scored: Vec<Scored> = items
        .par_iter()
        .map(|item| {
            let posed = |context| ChoiceQuestion {
                context,
                options: &item.options,
            };
            Ok(Scored {
                key: &item.key,
                options: &item.options,
                cond: scorer.token_log_probs(&posed(&item.context))?,
                alone: scorer.token_log_probs(&posed(""))?,
            })
        })
        .collect::<Result<_>>()?;
    std::fs::write(&args[2], serde_json::to_string(&scored)?)
        .with_context(|| format!("cannot write {}", args[2]))
}
