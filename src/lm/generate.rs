//! `afkit generate` and `afkit import-pool`: per context, sample (or read) candidate endings,
//! compute their LM features and store the pool in one transaction.

use std::collections::HashSet;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
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

/// The contexts of `chunk` that fit the model. The others are recorded as unusable with the
/// reason and reported, so that one overlong context does not stop this run or the next ones.
fn fitting_contexts<'e>(
    store: &Store,
    lm: &LocalLm,
    template: &PromptTemplate,
    generation_id: i64,
    chunk: &'e [Example],
    bar: &indicatif::ProgressBar,
) -> Result<Vec<&'e Example>> {
    let mut fitting = Vec::with_capacity(chunk.len());
    for ex in chunk {
        let prompt = template.render(&ex.sent1, &ex.sent2);
        match lm.misfit(&prompt, &ex.ending)? {
            None => fitting.push(ex),
            Some(reason) => {
                store.record_unusable_context(ex.id, generation_id, &reason)?;
                bar.suspend(|| eprintln!("skipping {}: {reason}", ex.ext_id));
                bar.inc(1);
            }
        }
    }
    Ok(fitting)
}

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

/// The local model on `compute`'s device.
fn load_local(model: &str, params: SamplingParams, compute: &Compute) -> Result<LocalLm> {
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
    /// Contexts skipped because they do not fit the model (recorded with the reason).
    unusable: usize,
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
    let lm = load_local(&args.model, params.clone(), &compute)?;
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
        let all = chunk.len();
        let chunk = fitting_contexts(&store, &lm, &template, generation_id, chunk, &bar)?;
        summary.unusable += all - chunk.len();
        if chunk.is_empty() {
            continue;
        }
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
        if summary.unusable > 0 {
            println!(
                "{} contexts skipped: too long for the model (listed above, counted by `afkit status`)",
                summary.unusable
            );
        }
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
#[serde(untagged)]
enum ImportedEnding {
    Text(String),
    Scored {
        text: String,
        #[serde(flatten)]
        features: EndingFeatures,
    },
}

impl ImportedEnding {
    fn text(&self) -> &str {
        match self {
            ImportedEnding::Text(text) | ImportedEnding::Scored { text, .. } => text,
        }
    }

    fn features(&self) -> Option<&EndingFeatures> {
        match self {
            ImportedEnding::Text(_) => None,
            ImportedEnding::Scored { features, .. } => Some(features),
        }
    }
}

#[derive(serde::Deserialize)]
struct ImportedContext {
    ctx_logprob: f64,
    n_tok_sent1: usize,
    n_tok_sent2: usize,
}

/// One line of an `import-pool` file. Either every ending is a plain string (afkit scores them
/// with `--model`), or the pool comes scored: every ending an object with its features, plus the
/// gold ending's and the context's features.
#[derive(serde::Deserialize)]
struct ImportRecord {
    id: String,
    endings: Vec<ImportedEnding>,
    #[serde(default)]
    gold: Option<EndingFeatures>,
    #[serde(default)]
    context: Option<ImportedContext>,
}

const IMPORT_FORMAT: &str = "expected {\"id\": string, \"endings\": [string, ...]} or, scored, \
     {\"id\", \"endings\": [{\"text\", \"lp_cond\", \"lp_alone\", \"lp_final_punct\", \"n_tok\"}, ...], \
     \"gold\": {\"lp_cond\", \"lp_alone\", \"lp_final_punct\", \"n_tok\"}, \
     \"context\": {\"ctx_logprob\", \"n_tok_sent1\", \"n_tok_sent2\"}}";

impl ImportRecord {
    /// Whether the line brings its own features; an error for a line that brings only some.
    fn is_scored(&self) -> std::result::Result<bool, &'static str> {
        let scored = self
            .endings
            .iter()
            .filter(|e| e.features().is_some())
            .count();
        match (scored, &self.gold, &self.context) {
            (0, None, None) => Ok(false),
            (n, Some(_), Some(_)) if n == self.endings.len() => Ok(true),
            (n, _, _) if n != 0 && n != self.endings.len() => {
                Err("some endings have features and some do not")
            }
            _ => Err("scored endings need both \"gold\" and \"context\" features"),
        }
    }
}

/// The lines of an import file, parsed and checked one at a time, with their line numbers and
/// whether they bring their own features.
fn import_lines(
    path: &Path,
) -> Result<impl Iterator<Item = Result<(usize, ImportRecord, bool)>> + '_> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    Ok(std::io::BufReader::new(file)
        .lines()
        .enumerate()
        .filter(|(_, line)| line.as_ref().map_or(true, |l| !l.trim().is_empty()))
        .map(move |(i, line)| {
            let line = line
                .with_context(|| format!("{}:{}: cannot read the line", path.display(), i + 1))?;
            let (rec, scored) = parse_import_line(&line)
                .map_err(|why| anyhow!("{}:{}{why}; {IMPORT_FORMAT}", path.display(), i + 1))?;
            Ok((i + 1, rec, scored))
        }))
}

/// One line: well-formed, with at least one ending, and scored either fully or not at all. The
/// error starts with `:COLUMN: ` when the JSON itself is malformed, else with `: `.
fn parse_import_line(line: &str) -> std::result::Result<(ImportRecord, bool), String> {
    let rec: ImportRecord = serde_json::from_str(line).map_err(|e| {
        format!(
            ":{}: {}",
            e.column(),
            crate::ingest::input::json_error_without_position(&e)
        )
    })?;
    if rec.endings.is_empty() {
        return Err(
            ": \"endings\" is empty, so the context would count as done without a pool \
                    to filter"
                .into(),
        );
    }
    let scored = rec.is_scored().map_err(|why| format!(": {why}"))?;
    Ok((rec, scored))
}

/// Reads every line of an `import-pool` file as the command does before it looks the ids up in
/// the project; returns the number of records. The entry point of the parser's fuzz target.
pub fn check_import_lines(path: &Path) -> Result<usize> {
    import_lines(path)?.try_fold(0, |records, line| line.map(|_| records + 1))
}

/// What a first pass over the whole file found: every line parses, names a known example once,
/// and is consistently scored or not. Nothing is written unless the whole file passes.
struct ImportCheck {
    /// Per line, in order: its example, or `None` for a record that ingest dropped (a pool made
    /// elsewhere for every input record).
    example_ids: Vec<Option<i64>>,
    unscored: usize,
}

impl ImportCheck {
    fn contexts(&self) -> usize {
        self.example_ids.iter().flatten().count()
    }

    fn dropped_at_ingest(&self) -> usize {
        self.example_ids.len() - self.contexts()
    }
}

fn check_import_file(store: &Store, path: &Path) -> Result<ImportCheck> {
    let mut seen = HashSet::new();
    let mut check = ImportCheck {
        example_ids: Vec::new(),
        unscored: 0,
    };
    for line in import_lines(path)? {
        let (n, rec, scored) = line?;
        let Some(example_id) = store.example_id_by_ext_id(&rec.id)? else {
            if store.dropped_reason(&rec.id)?.is_some() {
                check.example_ids.push(None);
                continue;
            }
            bail!(
                "{}:{n}: no example with id {:?} in the project",
                path.display(),
                rec.id
            );
        };
        if !seen.insert(example_id) {
            bail!("{}:{n}: id {:?} appears twice", path.display(), rec.id);
        }
        check.unscored += usize::from(!scored);
        check.example_ids.push(Some(example_id));
    }
    Ok(check)
}

/// Endings a pool commit gathers before it is written: big enough that SQLite's per-transaction
/// cost vanishes, small enough that an interrupted import loses seconds of work.
const IMPORT_COMMIT_ENDINGS: usize = 8192;

/// Writes whole pools in one transaction; returns the candidates stored.
fn write_pools(store: &mut Store, batch: &mut Vec<NewPool>) -> Result<usize> {
    let tx = store.transaction()?;
    let mut written = 0;
    for p in batch.drain(..) {
        written += pool::write_pool(&tx, &p)?;
    }
    tx.commit()?;
    Ok(written)
}

pub fn import(args: ImportPoolArgs) -> Result<()> {
    let mut store = Store::open(&args.project)?;
    let template = PromptTemplate::load(&args.prompt)?;
    let check = check_import_file(&store, &args.file)?;
    // The scoring model is loaded only when some line brings no features of its own.
    let lm = if check.unscored > 0 {
        Some(load_local(
            &args.model,
            SamplingParams::default(),
            &Compute::cpu(),
        )?)
    } else {
        None
    };
    let (scorer, sha) = match &lm {
        Some(lm) => {
            let (_, scorer, sha) = lm.describe();
            (scorer, sha)
        }
        None => ("features imported".to_string(), None),
    };
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
    let bar = crate::progress::bar(check.contexts() as u64, "contexts");
    let (mut imported, mut skipped, mut endings, mut incomplete) = (0, 0, 0, 0);
    let mut batch: Vec<NewPool> = Vec::new();
    let mut batch_endings = 0;
    for (line, example_id) in import_lines(&args.file)?.zip(&check.example_ids) {
        if let Err(stop) = crate::interrupt::check() {
            write_pools(&mut store, &mut batch)?;
            return Err(stop.into());
        }
        let (_, rec, _) = line?;
        let Some(example_id) = *example_id else {
            continue; // dropped at ingest
        };
        bar.inc(1);
        if store.has_pool(example_id)? {
            skipped += 1;
            continue;
        }
        let t0 = Instant::now();
        let ex = store
            .example(example_id)?
            .expect("checked by the first pass");
        incomplete += rec
            .endings
            .iter()
            .filter(|e| !acceptable_ending(&normalise_ending(e.text()), usize::MAX))
            .count();
        let mut seen: HashSet<String> = HashSet::from([normalise_ending(&ex.ending)]);
        let (kept, imported_endings): (Vec<SampledEnding>, Vec<&ImportedEnding>) = rec
            .endings
            .iter()
            .map(|e| (normalise_ending(e.text()), e))
            .filter(|(text, _)| !text.is_empty() && seen.insert(text.clone()))
            .map(|(text, e)| (SampledEnding { text, tokens: None }, e))
            .unzip();
        let features = match (&rec.gold, &rec.context) {
            (Some(gold), Some(context)) => ContextFeatures {
                ctx_logprob: context.ctx_logprob,
                n_tok_sent1: context.n_tok_sent1,
                n_tok_sent2: context.n_tok_sent2,
                gold: gold.clone(),
                endings: imported_endings
                    .iter()
                    .map(|e| e.features().cloned().expect("checked by the first pass"))
                    .collect(),
            },
            _ => {
                let lm = lm.as_ref().expect("loaded when a line has no features");
                let prompt = template.render(&ex.sent1, &ex.sent2);
                lm.features(&prompt, &ex.sent1, &ex.sent2, &ex.ending, &kept)?
            }
        };
        batch_endings += kept.len();
        batch.push(new_pool(
            &ex,
            generation_id,
            rec.endings.len(),
            &kept,
            &features,
            t0.elapsed().as_secs_f64(),
        ));
        imported += 1;
        if batch_endings >= IMPORT_COMMIT_ENDINGS {
            endings += write_pools(&mut store, &mut batch)?;
            batch_endings = 0;
        }
    }
    endings += write_pools(&mut store, &mut batch)?;
    bar.finish_and_clear();
    println!(
        "imported {endings} endings for {imported} contexts; {skipped} contexts skipped (they already have a pool)"
    );
    if check.dropped_at_ingest() > 0 {
        println!(
            "{} lines skipped: their records were dropped at ingest (see `afkit status`)",
            check.dropped_at_ingest()
        );
    }
    if check.unscored < check.contexts() {
        println!(
            "{} contexts came with their own LM features; {} were scored with the local model",
            check.contexts() - check.unscored,
            check.unscored
        );
    }
    if incomplete > 0 {
        eprintln!("note: {incomplete} imported endings do not end with . ! or ? (kept as given)");
    }
    Ok(())
}
