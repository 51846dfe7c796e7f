//! The `generate` stage (`afkit generate`, `afkit import-pool`): per context, sample (or read)
//! candidate endings, compute their LM features and store the pool in one transaction.

mod adapters;
pub mod bundle;
mod config;
mod grow;
mod import;
mod pool;
pub mod prompt;
mod style;

pub use import::{check_import_lines, import, ImportConfig, ImportSummary};

use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use adapters::AdapterSet;
use afkit_engine::lm::features::{features, TokenScorer};
use afkit_engine::lm::local::LocalLm;
use afkit_engine::lm::model::{LanguageModel, ModelFile};
use afkit_engine::lm::openai::OpenAiSampler;
use afkit_engine::lm::sampler::{EndingRule, EndingSampler, SampleRequest, SampledPool};
use afkit_engine::seed::{Key, Seed};
use afkit_engine::text::rules::{generated_ending_problem, generated_ending_refused_early};
use afkit_store::adapters::AdapterRecord;
use afkit_store::examples::Example;
use afkit_store::pool::NewGeneration;
use afkit_store::Store;
pub use config::{AdapterUse, Config, Growth, Observer};
use pool::new_pool;
use prompt::PromptTemplate;

/// A context's own sampling seed, derived from the run's seed with the context's ext id (or
/// its growth round and ext id) as the key. Independent of the order contexts are processed in, so a resumed run gives what an
/// uninterrupted one would.
fn context_seed(seed: Seed, key: Key) -> Seed {
    seed.key(key)
}

/// The seed of a context's style primer: apart from its sampling stream, so that the primer
/// can change without changing how the context's rows are seeded.
fn style_seed(seed: Seed, ext_id: &str) -> Seed {
    seed.key(Key::Style(ext_id))
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

/// What a `generate` call did (`--json` prints it as is).
#[derive(Debug, Default, Serialize)]
pub struct Summary {
    pub contexts: usize,
    /// Contexts skipped because they do not fit the model (recorded with the reason).
    pub unusable: usize,
    pub endings: usize,
    pub shortfall: usize,
    pub draws: usize,
    /// Draws not kept, by reason.
    pub rejected: std::collections::BTreeMap<&'static str, usize>,
    pub tokens_generated: usize,
    pub sampling_seconds: f64,
    pub feature_seconds: f64,
    pub total_seconds: f64,
    pub sampling_endings_per_second: f64,
    pub sampling_tokens_per_second: f64,
    pub endings_per_second: f64,
    /// Requests retried (openai backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server_retries: Option<usize>,
    /// Weight-matrix arithmetic of the sampled tokens per second of sampling, in GFLOP/s.
    pub decode_gflops: f64,
}

/// Samples and scores the pools `config` asks for, one committed transaction per context, so
/// that an interrupted call loses nothing it reported as done.
pub fn run(store: &mut Store, config: &Config, observer: &mut dyn Observer) -> Result<Summary> {
    config.validate()?;
    let todo = Todo::asked_by(store, config)?;
    if todo.is_empty() {
        observer.note(&todo.nothing_to_do());
        return Ok(Summary::default());
    }
    // Read and hashed once: the adapter sets are recorded per model hash, every fold's model is
    // loaded from these bytes, and the generation record carries the hash.
    let model = ModelFile::read(&config.model)?;
    let adapters = adapters::choose(store, config, &model.sha256)?;
    let routed = check_adapters(config, adapters.as_ref(), observer)?;
    let parts = todo.by_fold(adapters.as_ref());
    let style = (config.style_examples > 0)
        .then(|| style::StyleCorpus::load(store))
        .transpose()?;
    let jobs = Jobs {
        config,
        style: style.as_ref(),
    };
    let mut summary = Summary::default();
    observer.started(
        parts.iter().map(|(_, todo)| todo.len()).sum(),
        config.grow.map_or(config.n_neg, |g| g.per_context),
    );
    let started = Instant::now();
    let mut generation_id = None;
    for (adapter, todo) in parts.iter().filter(|(_, todo)| !todo.is_empty()) {
        let lm = load_fold_model(store, config, *adapter, &model, observer)?;
        let remote = server_sampler(config, *adapter, &lm)?;
        let sampler: &dyn EndingSampler = match &remote {
            Some(remote) => remote,
            None => &lm,
        };
        let server_features = server_scores(&remote, observer)?;
        let scorer: &dyn TokenScorer = match &remote {
            Some(remote) if server_features => remote,
            _ => &lm,
        };
        let record = Recorded {
            sampler,
            lm: &lm,
            remote: &remote,
            server_features,
            adapters: &adapters,
        };
        let id = fold_generation(store, config, (generation_id, routed), &record, observer)?;
        generation_id = Some(id);
        let mut stored = Stored {
            store,
            generation_id: id,
            alone_scores: config.alone_scores,
            summary: &mut summary,
            observer,
        };
        stored.sample_all(todo, &jobs, sampler, scorer, &lm)?;
        summary.finish(started, &lm, &remote);
    }
    Ok(summary)
}

/// Whether contexts go to their fold's adapter on the server (refused without the project's
/// adapters); says so when the default recipe's adapters are missing.
fn check_adapters(
    config: &Config,
    adapters: Option<&AdapterSet>,
    observer: &mut dyn Observer,
) -> Result<bool> {
    let routed = config
        .server
        .as_ref()
        .is_some_and(|s| s.fold_adapters.is_some());
    if routed && adapters.is_none() {
        bail!(
            "--adapter-names and --adapter-lora-ids send each context to its fold's adapter on \
             the server, but the project has no adapters for this model: run `afkit lm adapt` \
             with the same --model first"
        );
    }
    if adapters.is_none() && config.adapters == AdapterUse::Auto && config.server.is_none() {
        observer.note(
            "the project has no adapters for this model: sampling with the model alone. The \
             default recipe runs `afkit lm adapt` first, whose endings are much harder to tell \
             from the corpus's (--no-adapters says you mean it)",
        );
    }
    Ok(routed)
}

/// The server's sampler for the contexts of `adapter`'s fold (asking for that fold's adapter
/// where the server holds them), or `None` when the local model samples.
fn server_sampler<'a>(
    config: &Config,
    adapter: Option<&AdapterRecord>,
    lm: &'a LocalLm,
) -> Result<Option<OpenAiSampler<'a>>> {
    let Some(server) = &config.server else {
        return Ok(None);
    };
    Ok(Some(OpenAiSampler::new(
        server,
        adapter.map(|record| record.fold),
        config.sampling.clone(),
        &lm.model.tokenizer,
    )?))
}

/// Whether the server scores the endings (`--features`: where it can give the LM features);
/// otherwise the local model does, and a server that was asked is reported with why not.
fn server_scores(remote: &Option<OpenAiSampler>, observer: &mut dyn Observer) -> Result<bool> {
    let Some(server) = remote else {
        return Ok(false);
    };
    server.scores_features(&mut |why| {
        observer.note(&format!(
            "note: the server does not give the LM features ({why}); they are scored locally"
        ))
    })
}

/// The local model, with the adapter of `fold` merged in (if any), from `file`: the model file
/// read and hashed once per call.
fn load_fold_model(
    store: &Store,
    config: &Config,
    fold: Option<&AdapterRecord>,
    file: &ModelFile,
    observer: &mut dyn Observer,
) -> Result<LocalLm> {
    let name = file.path.display();
    let adapter = match fold {
        None => {
            observer.note(&format!("loading {name}"));
            None
        }
        Some(record) => {
            observer.note(&format!(
                "loading {name} with the adapter of fold {} of {}",
                record.fold, record.folds
            ));
            Some(AdapterSet::load(store, record)?)
        }
    };
    let model = LanguageModel::load_adapted_from(file, &config.compute, adapter.as_ref())?;
    Ok(LocalLm::new(
        model,
        config.sampling.clone(),
        Some(file.sha256.clone()),
    ))
}

/// The contexts a `generate` call works on.
enum Todo {
    /// Contexts without a pool.
    NewPools(Vec<Example>),
    /// Pools the latest AF run found starved.
    Growth(grow::GrowthRequest),
}

impl Todo {
    /// The contexts `config` asks for: those without a pool, or with `--grow` the pools the
    /// latest AF run found starved.
    fn asked_by(store: &Store, config: &Config) -> Result<Todo> {
        Ok(match config.grow {
            None => Todo::NewPools(store.examples_without_pool(config.limit)?),
            Some(growth) => Todo::Growth(grow::starved(store, growth.max_pool, config.limit)?),
        })
    }

    /// The contexts per fold adapter that samples them, or all of them with no adapter.
    fn by_fold(self, adapters: Option<&AdapterSet>) -> Vec<(Option<&AdapterRecord>, Todo)> {
        match adapters {
            None => vec![(None, self)],
            Some(set) => set
                .records
                .iter()
                .map(|r| (Some(r), self.only(|ex| set.fold_of(ex) == r.fold)))
                .collect(),
        }
    }

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
    fn jobs(&self, range: std::ops::Range<usize>, jobs: &Jobs) -> Result<Vec<Job>> {
        match self {
            Todo::NewPools(examples) => {
                Ok(examples[range].iter().map(|ex| jobs.new_pool(ex)).collect())
            }
            Todo::Growth(growth) => growth.contexts[range]
                .iter()
                .map(|c| jobs.growth(c, growth.af_run_id))
                .collect(),
        }
    }

    /// The same work for only the contexts `keep` keeps.
    fn only(&self, keep: impl Fn(&Example) -> bool) -> Todo {
        match self {
            Todo::NewPools(examples) => {
                Todo::NewPools(examples.iter().filter(|ex| keep(ex)).cloned().collect())
            }
            Todo::Growth(growth) => Todo::Growth(growth.only(keep)),
        }
    }

    fn nothing_to_do(&self) -> String {
        match self {
            Todo::NewPools(_) => "every context already has a pool; nothing to generate".into(),
            Todo::Growth(growth) => growth.nothing_to_do(),
        }
    }
}

/// What a generation record is made from.
struct Recorded<'a> {
    sampler: &'a dyn EndingSampler,
    lm: &'a LocalLm,
    remote: &'a Option<OpenAiSampler<'a>>,
    /// Whether the server gives the LM features.
    server_features: bool,
    adapters: &'a Option<AdapterSet>,
}

/// The generation a fold's pools belong to: the one an earlier fold of the call recorded
/// (`previous`), else a record of its own. Routed to the server's fold adapters, each fold is a
/// generation of its own, so each pool's generation says which adapter sampled it.
fn fold_generation(
    store: &Store,
    config: &Config,
    (previous, routed): (Option<i64>, bool),
    record: &Recorded,
    observer: &mut dyn Observer,
) -> Result<i64> {
    match previous {
        Some(id) if !routed => Ok(id),
        _ => record_generation(store, config, record, observer),
    }
}

/// The generation record: backend, model and every setting, found again on a resumed run.
fn record_generation(
    store: &Store,
    config: &Config,
    record: &Recorded,
    observer: &mut dyn Observer,
) -> Result<i64> {
    let Recorded {
        sampler,
        lm,
        remote,
        server_features,
        adapters,
    } = record;
    let (backend, model_name, sha) = sampler.describe();
    // Through text: a value tree widens each f32 to f64 (0.1 would read 0.10000000149011612),
    // while the text writes the shortest decimal that gives the f32 back.
    let mut params_json: serde_json::Value =
        serde_json::from_str(&serde_json::to_string(&config.sampling)?)?;
    params_json["n_neg"] = config.n_neg.into();
    params_json["style_examples"] = config.style_examples.into();
    params_json["ending_rules"] = config.ending_rules.into();
    params_json["alone_scores"] = config.alone_scores.into();
    if let Some(growth) = config.grow {
        params_json["grow"] = growth.per_context.into();
    }
    if let Some(set) = adapters {
        params_json["adapters"] = set.record();
    }
    if let Some(remote) = remote {
        let (_, scorer, scorer_sha) = lm.describe();
        observer.note(&if *server_features {
            format!(
                "note: the server samples and gives the LM features (echoed prompt log-probs \
                 over the tokens of the scoring model, {scorer})"
            )
        } else {
            format!("note: the server samples; the LM features are scored locally ({scorer})")
        });
        params_json["server"] = remote.record(*server_features);
        params_json["scorer"] = scorer.into();
        params_json["scorer_sha256"] = scorer_sha.into();
    }
    store.find_or_insert_generation(&NewGeneration {
        backend,
        model: model_name,
        model_sha256: sha,
        prompt: config.template.name.clone(),
        params_json: params_json.to_string(),
        seed: config.seed,
    })
}

/// What to sample for one context, and where its endings go.
struct Job {
    ex: Example,
    prompt: ContextPrompt,
    request: SampleRequest,
    /// `None`: a new pool; `Some(run)`: a growth round asked for by AF run `run`.
    grows_for_run: Option<i64>,
}

/// Builds the jobs of a call from its settings.
struct Jobs<'a> {
    config: &'a Config,
    style: Option<&'a style::StyleCorpus>,
}

impl Jobs<'_> {
    fn rule(&self, ex: &Example) -> EndingRule {
        if !self.config.ending_rules {
            return EndingRule::default();
        }
        let sent2 = ex.sent2.clone();
        let early_sent2 = sent2.clone();
        EndingRule::new(move |ending| generated_ending_problem(&sent2, ending))
            .refusing_early(move |words| generated_ending_refused_early(&early_sent2, words))
    }

    fn new_pool(&self, ex: &Example) -> Job {
        let style_examples = self.style.map_or_else(Vec::new, |corpus| {
            corpus.choose(
                &ex.group,
                self.config.style_examples,
                style_seed(self.config.seed, &ex.ext_id),
            )
        });
        let prompt = context_prompt(ex, &self.config.template, self.style, style_examples);
        Job {
            request: SampleRequest {
                prompt: prompt.text.clone(),
                exclude: vec![ex.ending.clone()],
                n: self.config.n_neg,
                seed: context_seed(self.config.seed, Key::Context(&ex.ext_id)),
                rule: self.rule(ex),
            },
            ex: ex.clone(),
            prompt,
            grows_for_run: None,
        }
    }

    /// A growth round reads the pool's own primer again, so that the new endings' conditional
    /// log-probs are comparable with the found ending's and the first endings'.
    fn growth(&self, c: &grow::StarvedContext, af_run_id: i64) -> Result<Job> {
        let style = match self.style {
            Some(corpus) => Some(corpus),
            None if c.style_examples.is_empty() => None,
            None => bail!(
                "the pool of {} was primed with style examples; grow it with --style-examples > 0",
                c.ex.ext_id
            ),
        };
        let prompt = context_prompt(
            &c.ex,
            &self.config.template,
            style,
            c.style_examples.clone(),
        );
        let mut exclude = c.candidate_texts.clone();
        exclude.push(c.ex.ending.clone());
        let round_key = Key::Growth {
            round: c.round,
            ext_id: &c.ex.ext_id,
        };
        Ok(Job {
            request: SampleRequest {
                prompt: prompt.text.clone(),
                exclude,
                n: self
                    .config
                    .grow
                    .expect("growth jobs come with a growth")
                    .per_context,
                seed: context_seed(self.config.seed, round_key),
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
    observer: &mut dyn Observer,
) -> Result<Vec<Job>> {
    let mut fitting = Vec::with_capacity(jobs.len());
    for job in jobs {
        match lm.misfit(&job.prompt.text, &job.ex.ending)? {
            None => fitting.push(job),
            Some(reason) => {
                store.record_unusable_context(job.ex.id, generation_id, &reason)?;
                summary.unusable += 1;
                observer.skipped(&job.ex.ext_id, &reason);
            }
        }
    }
    Ok(fitting)
}

/// Where a chunk's pools go, and who hears of them.
struct Stored<'a> {
    store: &'a mut Store,
    generation_id: i64,
    /// Whether each ending is also scored alone ([`Config::alone_scores`]).
    alone_scores: bool,
    summary: &'a mut Summary,
    observer: &'a mut dyn Observer,
}

impl Stored<'_> {
    /// Samples every context of `todo`, a chunk of contexts per sampler call.
    fn sample_all(
        &mut self,
        todo: &Todo,
        jobs: &Jobs,
        sampler: &dyn EndingSampler,
        scorer: &dyn TokenScorer,
        lm: &LocalLm,
    ) -> Result<()> {
        let config = jobs.config;
        let per_call =
            sampler.contexts_per_call(config.grow.map_or(config.n_neg, |g| g.per_context));
        for first in (0..todo.len()).step_by(per_call.max(1)) {
            let chunk = todo.jobs(first..(first + per_call).min(todo.len()), jobs)?;
            let chunk = fitting(
                chunk,
                lm,
                self.store,
                self.generation_id,
                self.summary,
                self.observer,
            )?;
            if !chunk.is_empty() {
                self.sample_and_store(&chunk, sampler, scorer)?;
            }
        }
        Ok(())
    }

    /// Samples a chunk of contexts together, scores each context's endings and stores each
    /// context in its own transaction.
    fn sample_and_store(
        &mut self,
        jobs: &[Job],
        sampler: &dyn EndingSampler,
        scorer: &dyn TokenScorer,
    ) -> Result<()> {
        afkit_engine::interrupt::check()?;
        let t0 = Instant::now();
        let requests: Vec<SampleRequest> = jobs.iter().map(|j| j.request.clone()).collect();
        let observer = &mut *self.observer;
        let pools = sampler
            .sample_many_telling(&requests, &mut || observer.ending_kept())
            .with_context(|| {
                let ids: Vec<&str> = jobs.iter().map(|j| j.ex.ext_id.as_str()).collect();
                format!("sampling endings for {}", ids.join(", "))
            })?;
        let sampling_seconds = t0.elapsed().as_secs_f64();
        self.summary.sampling_seconds += sampling_seconds;
        for (job, sampled) in jobs.iter().zip(pools) {
            afkit_engine::interrupt::check()?;
            let t1 = Instant::now();
            let ex = &job.ex;
            let features = features(
                scorer,
                &job.prompt.text,
                &job.prompt.context,
                (&ex.sent1, &ex.sent2),
                &ex.ending,
                &sampled.endings,
                self.alone_scores,
            )
            .with_context(|| format!("scoring endings of {}", ex.ext_id))?;
            // The batch's sampling time is shared equally by its contexts.
            let seconds = sampling_seconds / jobs.len() as f64 + t1.elapsed().as_secs_f64();
            let mut new = new_pool(
                ex,
                self.generation_id,
                job.request.n,
                &sampled.endings,
                &features,
                seconds,
            );
            new.style_examples = job.prompt.style_examples.clone();
            new.draws = Some((sampled.draws, sampled.rejected.clone()));
            self.store.transaction(|store| match job.grows_for_run {
                None => store.write_pool(&new),
                Some(af_run_id) => store.write_growth(&new, af_run_id),
            })?;
            self.summary
                .add(job.request.n, &sampled, t1.elapsed().as_secs_f64());
            self.observer.context_done(
                sampled.endings.len(),
                Some(self.summary.endings_per_second_so_far()),
            );
        }
        Ok(())
    }
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

    /// Endings per second of sampling and scoring so far.
    fn endings_per_second_so_far(&self) -> f64 {
        self.endings as f64 / (self.sampling_seconds + self.feature_seconds).max(1e-9)
    }

    fn finish(&mut self, started: Instant, lm: &LocalLm, remote: &Option<OpenAiSampler>) {
        self.total_seconds = started.elapsed().as_secs_f64();
        self.sampling_endings_per_second = self.endings as f64 / self.sampling_seconds;
        self.sampling_tokens_per_second = self.tokens_generated as f64 / self.sampling_seconds;
        self.endings_per_second = self.endings as f64 / self.total_seconds;
        self.decode_gflops =
            self.tokens_generated as f64 * lm.model.flops_per_token() / self.sampling_seconds / 1e9;
        self.server_retries = remote
            .as_ref()
            .map(|r| r.retries_used.load(std::sync::atomic::Ordering::Relaxed));
    }
}
