//! `afkit generate` and `afkit import-pool`: per context, sample (or read) candidate endings,
//! compute their LM features and store the pool in one transaction.

use std::collections::HashSet;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::features::{ContextFeatures, EndingFeatures};
use super::local::LocalLm;
use super::model::LanguageModel;
use super::openai::OpenAiSampler;
use super::prompt::PromptTemplate;
use super::sampler::{
    acceptable_ending, normalise_ending, EndingSampler, SampleRequest, SampledEnding,
    SamplingParams,
};
use super::{Backend, GenerateArgs, ImportPoolArgs};
use crate::device::Compute;
use crate::models::{sha256_file, DefaultModel};
use crate::store::examples::Example;
use crate::store::pool::{self, EndingLmFeatures, NewGeneration, NewPool};
use crate::store::Store;

/// The GGUF file for `--model`: the default model (fetched if needed) or a path.
pub fn resolve_model(model: &str) -> Result<PathBuf> {
    if model == "smollm2" {
        DefaultModel::SmolLm2.ensure()?;
        return Ok(DefaultModel::smollm2_gguf());
    }
    let path = PathBuf::from(model);
    if !path.is_file() {
        bail!("--model {model}: no such file (pass `smollm2` or the path of a llama-family .gguf)");
    }
    Ok(path)
}

/// The local model on the CPU with afkit's kernels (`import-pool` scores there).
fn load_local(model: &str, params: SamplingParams) -> Result<LocalLm> {
    load_local_on(model, params, &Compute::cpu())
}

/// The local model on `compute`'s device.
fn load_local_on(model: &str, params: SamplingParams, compute: &Compute) -> Result<LocalLm> {
    let path = resolve_model(model)?;
    let sha = sha256_file(&path)?;
    eprintln!("loading {}", path.display());
    let model = LanguageModel::load_on(&path, compute)?;
    Ok(LocalLm::new(model, params, Some(sha)))
}

/// A context's own sampling seed: the run's seed and the example id, hashed. Independent of the
/// order contexts are processed in, so a resumed run gives what an uninterrupted one would.
pub fn context_seed(seed: u64, ext_id: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(ext_id.as_bytes());
    u64::from_le_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
}

fn stored(f: &EndingFeatures) -> EndingLmFeatures {
    EndingLmFeatures {
        lp_cond: f.lp_cond,
        lp_alone: f.lp_alone,
        lp_final_punct: f.lp_final_punct,
        n_tok_ending: f.n_tok,
    }
}

fn new_pool(
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
        gold: stored(&f.gold),
        candidates: endings
            .iter()
            .zip(&f.endings)
            .map(|(e, f)| (e.text.clone(), stored(f)))
            .collect(),
    }
}

#[derive(Debug, Default, Serialize)]
struct Summary {
    contexts: usize,
    endings: usize,
    shortfall: usize,
    draws: usize,
    tokens_generated: usize,
    sampling_seconds: f64,
    feature_seconds: f64,
    total_seconds: f64,
    sampling_endings_per_second: f64,
    sampling_tokens_per_second: f64,
    endings_per_second: f64,
    /// Requests retried (openai backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    server_retries: Option<usize>,
    /// Weight-matrix arithmetic of the sampled tokens per second of sampling, in GFLOP/s.
    decode_gflops: f64,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let compute = args.device.open()?;
    let mut store = Store::open(&args.project)?;
    let template = PromptTemplate::load(&args.prompt)?;
    if args.n_neg == 0 {
        bail!("--n-neg must be at least 1");
    }
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        max_tokens: args.max_tokens,
        batch: args.batch.max(1),
        max_draws_per_ending: args.max_draws_per_ending.max(1),
        ..SamplingParams::default()
    };
    let todo = store.examples_without_pool(args.limit)?;
    if todo.is_empty() {
        eprintln!("every context already has a pool; nothing to generate");
        return Ok(());
    }
    let lm = load_local_on(&args.model, params.clone(), &compute)?;
    let remote = match args.backend {
        Backend::Local => None,
        Backend::Openai => Some(OpenAiSampler::new(
            (*args.openai).clone(),
            params.clone(),
            &lm.model.tokenizer,
        )?),
    };
    let sampler: &dyn EndingSampler = match &remote {
        Some(remote) => remote,
        None => &lm,
    };
    let (backend, model_name, sha) = sampler.describe();
    let mut params_json = serde_json::to_value(&params)?;
    params_json["n_neg"] = args.n_neg.into();
    if let Some(remote) = &remote {
        let (_, scorer, scorer_sha) = lm.describe();
        eprintln!(
            "note: the server samples; its token log-probs give lp_cond of the sampled endings \
             where its tokens equal the scoring model's ({scorer}); the gold ending's lp_cond, \
             lp_alone, ctx_logprob and lengths are computed locally with it"
        );
        params_json["server"] = remote.record();
        params_json["scorer"] = scorer.into();
        params_json["scorer_sha256"] = scorer_sha.into();
    }
    let generation_id = pool::find_or_insert_generation(
        store.conn(),
        &NewGeneration {
            backend,
            model: model_name,
            model_sha256: sha,
            prompt: template.name.clone(),
            params_json: params_json.to_string(),
            seed: args.seed,
        },
    )?;
    let bar = crate::progress::bar(todo.len() as u64, "contexts");
    let started = Instant::now();
    let mut summary = Summary::default();
    for chunk in todo.chunks(sampler.contexts_per_call(args.n_neg)) {
        crate::interrupt::check()?;
        let t0 = Instant::now();
        let requests: Vec<SampleRequest> = chunk
            .iter()
            .map(|ex| SampleRequest {
                prompt: template.render(&ex.sent1, &ex.sent2),
                exclude: vec![ex.ending.clone()],
                n: args.n_neg,
                seed: context_seed(args.seed, &ex.ext_id),
            })
            .collect();
        let pools = sampler.sample_many(&requests).with_context(|| {
            let ids: Vec<&str> = chunk.iter().map(|ex| ex.ext_id.as_str()).collect();
            format!("sampling endings for {}", ids.join(", "))
        })?;
        let sampling_seconds = t0.elapsed().as_secs_f64();
        summary.sampling_seconds += sampling_seconds;
        for ((ex, request), sampled) in chunk.iter().zip(&requests).zip(pools) {
            crate::interrupt::check()?;
            let t1 = Instant::now();
            let features = lm
                .features(
                    &request.prompt,
                    &ex.sent1,
                    &ex.sent2,
                    &ex.ending,
                    &sampled.endings,
                )
                .with_context(|| format!("scoring endings of {}", ex.ext_id))?;
            // The batch's sampling time is shared equally by its contexts.
            let seconds = sampling_seconds / chunk.len() as f64 + t1.elapsed().as_secs_f64();
            let tx = store.transaction()?;
            pool::write_pool(
                &tx,
                &new_pool(
                    ex,
                    generation_id,
                    args.n_neg,
                    &sampled.endings,
                    &features,
                    seconds,
                ),
            )?;
            tx.commit()?;
            summary.contexts += 1;
            summary.endings += sampled.endings.len();
            summary.shortfall += args.n_neg - sampled.endings.len();
            summary.draws += sampled.draws;
            summary.tokens_generated += sampled.tokens_generated;
            summary.feature_seconds += t1.elapsed().as_secs_f64();
            bar.inc(1);
            bar.set_message(format!(
                "{:.1} endings/s",
                summary.endings as f64 / started.elapsed().as_secs_f64()
            ));
        }
    }
    bar.finish_and_clear();
    summary.total_seconds = started.elapsed().as_secs_f64();
    summary.sampling_endings_per_second = summary.endings as f64 / summary.sampling_seconds;
    summary.sampling_tokens_per_second = summary.tokens_generated as f64 / summary.sampling_seconds;
    summary.endings_per_second = summary.endings as f64 / summary.total_seconds;
    summary.decode_gflops = summary.tokens_generated as f64 * lm.model.llama.cfg.flops_per_token()
        / summary.sampling_seconds
        / 1e9;
    summary.server_retries = remote
        .as_ref()
        .map(|r| r.retries_used.load(std::sync::atomic::Ordering::Relaxed));
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!(
            "{} contexts: {} endings (shortfall {}), {:.1} endings/s overall; sampling {:.1} endings/s, {:.0} tokens/s",
            summary.contexts,
            summary.endings,
            summary.shortfall,
            summary.endings_per_second,
            summary.sampling_endings_per_second,
            summary.sampling_tokens_per_second
        );
    }
    Ok(())
}

#[derive(serde::Deserialize)]
struct ImportRecord {
    id: String,
    endings: Vec<String>,
}

/// Reads and checks the whole file before anything is written: every line must parse and name
/// a known example.
fn read_import_file(store: &Store, path: &Path) -> Result<Vec<(i64, ImportRecord)>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut records = Vec::new();
    let mut seen = HashSet::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line =
            line.with_context(|| format!("{}:{}: cannot read the line", path.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let rec: ImportRecord = serde_json::from_str(&line).with_context(|| {
            format!(
                "{}:{}: expected {{\"id\": string, \"endings\": [string, ...]}}",
                path.display(),
                i + 1
            )
        })?;
        let Some(example_id) = store.example_id_by_ext_id(&rec.id)? else {
            bail!(
                "{}:{}: no example with id {:?} in the project",
                path.display(),
                i + 1,
                rec.id
            );
        };
        if !seen.insert(example_id) {
            bail!(
                "{}:{}: id {:?} appears twice",
                path.display(),
                i + 1,
                rec.id
            );
        }
        records.push((example_id, rec));
    }
    Ok(records)
}

pub fn import(args: ImportPoolArgs) -> Result<()> {
    let mut store = Store::open(&args.project)?;
    let template = PromptTemplate::load(&args.prompt)?;
    let records = read_import_file(&store, &args.file)?;
    let lm = load_local(&args.model, SamplingParams::default())?;
    let (_, scorer, sha) = lm.describe();
    let params = serde_json::json!({ "file": args.file.display().to_string(), "scorer": scorer });
    let generation_id = pool::find_or_insert_generation(
        store.conn(),
        &NewGeneration {
            backend: "import".into(),
            model: scorer,
            model_sha256: sha,
            prompt: template.name.clone(),
            params_json: params.to_string(),
            seed: 0,
        },
    )?;
    let bar = crate::progress::bar(records.len() as u64, "contexts");
    let (mut imported, mut skipped, mut endings) = (0, 0, 0);
    for (example_id, rec) in &records {
        crate::interrupt::check()?;
        bar.inc(1);
        if store.has_pool(*example_id)? {
            skipped += 1;
            continue;
        }
        let t0 = Instant::now();
        let ex = store.example(*example_id)?.expect("checked above");
        let mut seen: HashSet<String> = HashSet::from([normalise_ending(&ex.ending)]);
        let kept: Vec<SampledEnding> = rec
            .endings
            .iter()
            .map(|e| normalise_ending(e))
            .filter(|e| !e.is_empty() && seen.insert(e.clone()))
            .map(|text| SampledEnding { text, tokens: None })
            .collect();
        let prompt = template.render(&ex.sent1, &ex.sent2);
        let features = lm.features(&prompt, &ex.sent1, &ex.sent2, &ex.ending, &kept)?;
        let tx = store.transaction()?;
        endings += pool::write_pool(
            &tx,
            &new_pool(
                &ex,
                generation_id,
                rec.endings.len(),
                &kept,
                &features,
                t0.elapsed().as_secs_f64(),
            ),
        )?;
        tx.commit()?;
        imported += 1;
    }
    bar.finish_and_clear();
    let incomplete = records
        .iter()
        .flat_map(|(_, r)| &r.endings)
        .filter(|e| !acceptable_ending(&normalise_ending(e), usize::MAX))
        .count();
    println!(
        "imported {endings} endings for {imported} contexts; {skipped} contexts skipped (they already have a pool)"
    );
    if incomplete > 0 {
        eprintln!("note: {incomplete} imported endings do not end with . ! or ? (kept as given)");
    }
    Ok(())
}
