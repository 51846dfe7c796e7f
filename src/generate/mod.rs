//! The `generate` stage (`afkit generate`, `afkit import-pool`): per context, sample (or read)
//! candidate endings, compute their LM features and store the pool in one transaction.

mod grow;
mod import;
pub mod prompt;
pub mod style;

pub use import::{check_import_lines, import};

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::device::Compute;
use crate::lm::features::{ContextFeatures, EndingFeatures};
use crate::lm::local::LocalLm;
use crate::lm::model::LanguageModel;
use crate::lm::openai::OpenAiSampler;
use crate::lm::sampler::{
    EndingRule, EndingSampler, SampleRequest, SampledEnding, SampledPool, SamplingParams,
};
use crate::models::{sha256_file, DefaultModel};
use crate::store::examples::Example;
use crate::store::pool::{self, EndingLmFeatures, NewGeneration, NewPool};
use crate::store::Store;
use crate::text::rules::generated_ending_problem;
use prompt::PromptTemplate;

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// The project file.
    pub project: PathBuf,
    /// Where endings are sampled: `local` (the candle model) or `openai` (an OpenAI-compatible
    /// completions server, see --endpoint; the local model then only scores the LM features).
    #[arg(long, value_enum, default_value = "local")]
    pub backend: Backend,
    /// Boxed: the server flags would otherwise make every `Command` value large.
    #[command(flatten)]
    pub openai: Box<crate::lm::openai::OpenAiArgs>,
    /// `smollm2` (the default model, fetched if needed) or the path of a llama-family GGUF file.
    /// With `--backend openai` it is the scoring model: point the server at the same GGUF.
    #[arg(long, default_value = "smollm2")]
    pub model: String,
    /// Unique endings to sample per context (N⁻).
    #[arg(long, default_value_t = 64)]
    pub n_neg: usize,
    /// Only generate for the first N contexts that have no pool yet.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Seed for sampling (recorded in the project; each context's stream is derived from it and
    /// the example id, so a resumed run samples what an uninterrupted one would have).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Prompt template: a built-in name (`continuation`) or a file whose text contains
    /// `{startphrase}` (or `{sent1}` and `{sent2}`); the endings continue the filled template.
    #[arg(long, default_value = "continuation")]
    pub prompt: String,
    /// Real context + ending pairs from the project's other groups (videos) shown before each
    /// context, one per line, so that the model writes in the corpus's own style; chosen per
    /// context from the seed and recorded with its pool. 0 shows none.
    #[arg(long, default_value_t = 12)]
    pub style_examples: usize,
    /// Keep sampled endings that no found ending could be. By default an ending must pass the
    /// rules ingest applies to found ones: 5 to 25 tokens, and a verb phrase that the splitter
    /// would cut right after `sent2` (so not "of the man throws ...").
    #[arg(long)]
    pub no_ending_rules: bool,
    /// Grow starved pools instead of making new ones: sample this many more endings for every
    /// context whose found ending the latest finished AF run scored above all of its candidates
    /// (AF had nothing left to swap in). Then run `afkit filter` again.
    #[arg(long)]
    pub grow: Option<usize>,
    /// With --grow: leave pools that already hold this many candidates as they are.
    #[arg(long, default_value_t = 512)]
    pub max_pool: usize,
    /// Sampling temperature. Keep 1: cooler sampling lowers perplexity, an artifact that the
    /// stylistic classifiers pick up.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Keep only the k most probable tokens (off by default).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Nucleus sampling threshold (off by default).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Drop tokens less than this fraction as probable as the best one (off by default).
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Token cap per ending; endings that reach it without ending a sentence are discarded.
    #[arg(long, default_value_t = 40)]
    pub max_tokens: usize,
    /// Sequences decoded together (continuous batching: a finished sequence's place goes to the
    /// next one, from any context). Bigger keeps the matrix products efficient; the key/value
    /// cache grows with it (about 0.5 GB for SmolLM2 at 256 × --max-tokens 40).
    #[arg(long, default_value_t = 256)]
    pub batch: usize,
    /// Draws allowed per requested ending before a context's shortfall is accepted.
    #[arg(long, default_value_t = 4)]
    pub max_draws_per_ending: usize,
    /// Print a JSON summary (counts, timings) on stdout.
    #[arg(long)]
    pub json: bool,
    /// Where the local model samples (`--backend local`) and scores the LM features.
    #[command(flatten)]
    pub device: crate::device::DeviceArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Local,
    Openai,
}

#[derive(clap::Args)]
pub struct ImportPoolArgs {
    /// The project file.
    pub project: PathBuf,
    /// JSONL, one context per line: {"id", "endings": ["...", ...]} (`id` is the example's id),
    /// or a pool scored elsewhere, {"id", "endings": [{"text", "lp_cond", "lp_alone",
    /// "lp_final_punct", "n_tok"}, ...], "gold": {"lp_cond", "lp_alone", "lp_final_punct",
    /// "n_tok"}, "context": {"ctx_logprob", "n_tok_sent1", "n_tok_sent2"}} (the LM features:
    /// mean log-probs, the final punctuation's log-prob or null, lengths in LM tokens). The whole
    /// file is checked before anything is written.
    pub file: PathBuf,
    /// The model that scores endings imported without features: `smollm2` or a GGUF path (not
    /// loaded when every line brings its features).
    #[arg(long, default_value = "smollm2")]
    pub model: String,
    /// Prompt template the endings are scored after (see `generate --prompt`).
    #[arg(long, default_value = "continuation")]
    pub prompt: String,
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
pub(crate) fn load_local(
    model: &str,
    params: SamplingParams,
    compute: &Compute,
) -> Result<LocalLm> {
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

/// The seed of a context's style primer: apart from its sampling stream, so that the primer
/// can change without changing how the context's rows are seeded.
fn style_seed(seed: u64, ext_id: &str) -> u64 {
    context_seed(seed, &format!("style\u{0}{ext_id}"))
}

/// What the model reads for one context: the style primer, then the filled template.
struct ContextPrompt {
    text: String,
    /// The filled template alone, whose log-probability is the context's LM feature whatever
    /// primer came before it.
    context: String,
    style_examples: Vec<i64>,
}

fn context_prompt(
    ex: &Example,
    template: &PromptTemplate,
    style: Option<&style::StyleCorpus>,
    style_examples: Vec<i64>,
) -> ContextPrompt {
    let context = template.render(&ex.sent1, &ex.sent2);
    let primer = style.map_or_else(String::new, |corpus| corpus.primer(&style_examples));
    ContextPrompt {
        text: format!("{primer}{context}"),
        context,
        style_examples,
    }
}

fn stored(f: &EndingFeatures) -> EndingLmFeatures {
    EndingLmFeatures {
        lp_cond: f.lp_cond,
        lp_alone: f.lp_alone,
        lp_final_punct: f.lp_final_punct,
        n_tok_ending: f.n_tok,
    }
}

pub(crate) fn new_pool(
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
        style_examples: Vec::new(),
        draws: None,
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
    /// Draws not kept, by reason.
    rejected: std::collections::BTreeMap<&'static str, usize>,
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

/// Sampling settings from the flags.
fn sampling_params(args: &GenerateArgs) -> SamplingParams {
    SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        max_tokens: args.max_tokens,
        batch: args.batch.max(1),
        max_draws_per_ending: args.max_draws_per_ending.max(1),
        ..SamplingParams::default()
    }
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let compute = args.device.open()?;
    let mut store = Store::open(&args.project)?;
    let template = PromptTemplate::load(&args.prompt)?;
    if args.n_neg == 0 {
        bail!("--n-neg must be at least 1");
    }
    let todo = match args.grow {
        None => Todo::NewPools(store.examples_without_pool(args.limit)?),
        Some(0) => bail!("--grow must be at least 1"),
        Some(_) => grow::starved(&store, args.max_pool, args.limit)?,
    };
    if todo.is_empty() {
        eprintln!("{}", todo.nothing_to_do());
        return Ok(());
    }
    let params = sampling_params(&args);
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
    let generation_id =
        record_generation(&store, &args, &template, &params, sampler, &lm, &remote)?;
    let style = (args.style_examples > 0)
        .then(|| style::StyleCorpus::load(&store))
        .transpose()?;
    let jobs = Jobs {
        args: &args,
        template: &template,
        style: style.as_ref(),
    };
    let mut summary = Summary::default();
    let bar = crate::progress::bar(todo.len() as u64, "contexts");
    let started = Instant::now();
    let per_call = sampler.contexts_per_call(args.grow.unwrap_or(args.n_neg));
    for first in (0..todo.len()).step_by(per_call.max(1)) {
        let chunk = todo.jobs(first..(first + per_call).min(todo.len()), &jobs, &store)?;
        let chunk = fitting(chunk, &lm, &store, generation_id, &mut summary, &bar)?;
        if !chunk.is_empty() {
            sample_and_store(
                &chunk,
                sampler,
                &lm,
                &mut store,
                generation_id,
                &mut summary,
                &bar,
            )?;
        }
    }
    bar.finish_and_clear();
    summary.finish(started, &lm, &remote);
    summary.print(args.json)
}

/// The contexts a `generate` call works on.
enum Todo {
    /// Contexts without a pool.
    NewPools(Vec<Example>),
    /// Pools the latest AF run found starved.
    Growth(grow::Growth),
}

impl Todo {
    fn len(&self) -> usize {
        match self {
            Todo::NewPools(examples) => examples.len(),
            Todo::Growth(growth) => growth.contexts.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The jobs of the contexts in `range`.
    fn jobs(&self, range: std::ops::Range<usize>, jobs: &Jobs, store: &Store) -> Result<Vec<Job>> {
        match self {
            Todo::NewPools(examples) => {
                Ok(examples[range].iter().map(|ex| jobs.new_pool(ex)).collect())
            }
            Todo::Growth(growth) => growth.contexts[range]
                .iter()
                .map(|c| jobs.growth(c, growth.af_run_id, store))
                .collect(),
        }
    }

    fn nothing_to_do(&self) -> String {
        match self {
            Todo::NewPools(_) => "every context already has a pool; nothing to generate".into(),
            Todo::Growth(growth) => growth.nothing_to_do(),
        }
    }
}

/// The generation record: backend, model and every setting, found again on a resumed run.
fn record_generation(
    store: &Store,
    args: &GenerateArgs,
    template: &PromptTemplate,
    params: &SamplingParams,
    sampler: &dyn EndingSampler,
    lm: &LocalLm,
    remote: &Option<OpenAiSampler>,
) -> Result<i64> {
    let (backend, model_name, sha) = sampler.describe();
    let mut params_json = serde_json::to_value(params)?;
    params_json["n_neg"] = args.n_neg.into();
    params_json["style_examples"] = args.style_examples.into();
    params_json["ending_rules"] = (!args.no_ending_rules).into();
    if let Some(grow) = args.grow {
        params_json["grow"] = grow.into();
    }
    if let Some(remote) = remote {
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
    pool::find_or_insert_generation(
        store.conn(),
        &NewGeneration {
            backend,
            model: model_name,
            model_sha256: sha,
            prompt: template.name.clone(),
            params_json: params_json.to_string(),
            seed: args.seed,
        },
    )
}

/// What to sample for one context, and where its endings go.
struct Job {
    ex: Example,
    prompt: ContextPrompt,
    request: SampleRequest,
    /// `None`: a new pool; `Some(run)`: a growth round asked for by AF run `run`.
    grows_for_run: Option<i64>,
}

/// Builds the jobs of a call from its flags.
struct Jobs<'a> {
    args: &'a GenerateArgs,
    template: &'a PromptTemplate,
    style: Option<&'a style::StyleCorpus>,
}

impl Jobs<'_> {
    fn rule(&self, ex: &Example) -> EndingRule {
        if self.args.no_ending_rules {
            return EndingRule::default();
        }
        let sent2 = ex.sent2.clone();
        EndingRule::new(move |ending| generated_ending_problem(&sent2, ending))
    }

    fn new_pool(&self, ex: &Example) -> Job {
        let style_examples = self.style.map_or_else(Vec::new, |corpus| {
            corpus.choose(
                &ex.group,
                self.args.style_examples,
                style_seed(self.args.seed, &ex.ext_id),
            )
        });
        let prompt = context_prompt(ex, self.template, self.style, style_examples);
        Job {
            request: SampleRequest {
                prompt: prompt.text.clone(),
                exclude: vec![ex.ending.clone()],
                n: self.args.n_neg,
                seed: context_seed(self.args.seed, &ex.ext_id),
                rule: self.rule(ex),
            },
            ex: ex.clone(),
            prompt,
            grows_for_run: None,
        }
    }

    /// A growth round reads the pool's own primer again, so that the new endings' conditional
    /// log-probs are comparable with the found ending's and the first endings'.
    fn growth(&self, c: &grow::StarvedContext, af_run_id: i64, store: &Store) -> Result<Job> {
        let style = match self.style {
            Some(corpus) => Some(corpus),
            None if c.style_examples.is_empty() => None,
            None => bail!(
                "the pool of {} was primed with style examples; grow it with --style-examples > 0",
                c.ex.ext_id
            ),
        };
        let prompt = context_prompt(&c.ex, self.template, style, c.style_examples.clone());
        let mut exclude = store.pool_texts(c.ex.id)?;
        exclude.push(c.ex.ending.clone());
        let round_key = format!("grow{}\u{0}{}", c.round, c.ex.ext_id);
        Ok(Job {
            request: SampleRequest {
                prompt: prompt.text.clone(),
                exclude,
                n: self.args.grow.expect("growth jobs come with --grow"),
                seed: context_seed(self.args.seed, &round_key),
                rule: self.rule(&c.ex),
            },
            ex: c.ex.clone(),
            prompt,
            grows_for_run: Some(af_run_id),
        })
    }
}

/// The jobs whose context fits the model. The others are recorded as unusable with the reason
/// and reported, so that one overlong context does not stop this run or the next ones.
fn fitting(
    jobs: Vec<Job>,
    lm: &LocalLm,
    store: &Store,
    generation_id: i64,
    summary: &mut Summary,
    bar: &indicatif::ProgressBar,
) -> Result<Vec<Job>> {
    let mut fitting = Vec::with_capacity(jobs.len());
    for job in jobs {
        match lm.misfit(&job.prompt.text, &job.ex.ending)? {
            None => fitting.push(job),
            Some(reason) => {
                store.record_unusable_context(job.ex.id, generation_id, &reason)?;
                bar.suspend(|| eprintln!("skipping {}: {reason}", job.ex.ext_id));
                bar.inc(1);
                summary.unusable += 1;
            }
        }
    }
    Ok(fitting)
}

/// Samples a chunk of contexts together, scores each context's endings and stores each
/// context in its own transaction.
fn sample_and_store(
    jobs: &[Job],
    sampler: &dyn EndingSampler,
    lm: &LocalLm,
    store: &mut Store,
    generation_id: i64,
    summary: &mut Summary,
    bar: &indicatif::ProgressBar,
) -> Result<()> {
    crate::interrupt::check()?;
    let t0 = Instant::now();
    let requests: Vec<SampleRequest> = jobs.iter().map(|j| j.request.clone()).collect();
    let pools = sampler.sample_many(&requests).with_context(|| {
        let ids: Vec<&str> = jobs.iter().map(|j| j.ex.ext_id.as_str()).collect();
        format!("sampling endings for {}", ids.join(", "))
    })?;
    let sampling_seconds = t0.elapsed().as_secs_f64();
    summary.sampling_seconds += sampling_seconds;
    for (job, sampled) in jobs.iter().zip(pools) {
        crate::interrupt::check()?;
        let t1 = Instant::now();
        let ex = &job.ex;
        let mut features = lm
            .features(
                &job.prompt.text,
                &ex.sent1,
                &ex.sent2,
                &ex.ending,
                &sampled.endings,
            )
            .with_context(|| format!("scoring endings of {}", ex.ext_id))?;
        if job.prompt.text != job.prompt.context {
            features.ctx_logprob = lm.prompt_logprob(&job.prompt.context)?;
        }
        // The batch's sampling time is shared equally by its contexts.
        let seconds = sampling_seconds / jobs.len() as f64 + t1.elapsed().as_secs_f64();
        let mut new = new_pool(
            ex,
            generation_id,
            job.request.n,
            &sampled.endings,
            &features,
            seconds,
        );
        new.style_examples = job.prompt.style_examples.clone();
        new.draws = Some((sampled.draws, sampled.rejected.clone()));
        let tx = store.transaction()?;
        match job.grows_for_run {
            None => pool::write_pool(&tx, &new)?,
            Some(af_run_id) => pool::write_growth(&tx, &new, af_run_id)?,
        };
        tx.commit()?;
        summary.add(job.request.n, &sampled, t1.elapsed().as_secs_f64());
        bar.inc(1);
        bar.set_message(format!(
            "{:.1} endings/s",
            summary.endings as f64 / summary.started_seconds()
        ));
    }
    Ok(())
}

impl Summary {
    fn add(&mut self, requested: usize, sampled: &SampledPool, feature_seconds: f64) {
        self.contexts += 1;
        self.endings += sampled.endings.len();
        self.shortfall += requested - sampled.endings.len();
        self.draws += sampled.draws;
        for (why, n) in &sampled.rejected {
            *self.rejected.entry(why).or_insert(0) += n;
        }
        self.tokens_generated += sampled.tokens_generated;
        self.feature_seconds += feature_seconds;
    }

    fn started_seconds(&self) -> f64 {
        (self.sampling_seconds + self.feature_seconds).max(1e-9)
    }

    fn finish(&mut self, started: Instant, lm: &LocalLm, remote: &Option<OpenAiSampler>) {
        self.total_seconds = started.elapsed().as_secs_f64();
        self.sampling_endings_per_second = self.endings as f64 / self.sampling_seconds;
        self.sampling_tokens_per_second = self.tokens_generated as f64 / self.sampling_seconds;
        self.endings_per_second = self.endings as f64 / self.total_seconds;
        self.decode_gflops = self.tokens_generated as f64 * lm.model.llama.cfg.flops_per_token()
            / self.sampling_seconds
            / 1e9;
        self.server_retries = remote
            .as_ref()
            .map(|r| r.retries_used.load(std::sync::atomic::Ordering::Relaxed));
    }

    fn print(&self, json: bool) -> Result<()> {
        if json {
            println!("{}", serde_json::to_string(self)?);
            return Ok(());
        }
        if self.unusable > 0 {
            println!(
                "{} contexts skipped: too long for the model (listed above, counted by `afkit status`)",
                self.unusable
            );
        }
        println!(
            "{} contexts: {} endings (shortfall {}), {:.1} endings/s overall; sampling {:.1} endings/s, {:.0} tokens/s",
            self.contexts,
            self.endings,
            self.shortfall,
            self.endings_per_second,
            self.sampling_endings_per_second,
            self.sampling_tokens_per_second
        );
        let rejected: Vec<String> = self
            .rejected
            .iter()
            .map(|(why, n)| format!("{why} {n}"))
            .collect();
        println!(
            "{} draws, not kept: {}",
            self.draws,
            if rejected.is_empty() {
                "none".to_string()
            } else {
                rejected.join(", ")
            }
        );
        Ok(())
    }
}
