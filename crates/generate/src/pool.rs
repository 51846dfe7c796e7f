//! A context's pool as the project stores it, and the local model that scores pools.

use std::path::Path;

use anyhow::Result;

use afkit_engine::device::Compute;
use afkit_engine::lm::features::ContextFeatures;
use afkit_engine::lm::local::LocalLm;
use afkit_engine::lm::model::LanguageModel;
use afkit_engine::lm::sampler::{SampledEnding, SamplingParams};
use afkit_engine::models::sha256_file;
use afkit_store::examples::Example;
use afkit_store::pool::NewPool;

/// The local model on `compute`'s device.
pub(super) fn load_local(
    path: &Path,
    params: SamplingParams,
    compute: &Compute,
) -> Result<LocalLm> {
    let model = LanguageModel::load_on(path, compute)?;
    Ok(LocalLm::new(model, params, Some(sha256_file(path)?)))
}

pub(super) fn new_pool(
    ex: &Example,
    generation_id: i64,
    requested: usize,
    endings: &[SampledEnding],
    f: &ContextFeatures,
    seconds: f64,
) -> NewPool {
    NewPool {
        example_id: ex.id,
        generation_id,
        requested,
        ctx_logprob: f.ctx_logprob,
        n_tok_sent1: f.n_tok_sent1,
        n_tok_sent2: f.n_tok_sent2,
        seconds,
        gold: f.gold.clone(),
        candidates: endings
            .iter()
            .zip(&f.endings)
            .map(|(e, f)| (e.text.clone(), f.clone()))
            .collect(),
        style_examples: Vec::new(),
        draws: None,
    }
}
