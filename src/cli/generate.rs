//! `afkit generate` and `afkit import-pool`: flags → `generate::Config`, a progress bar, the
//! summary.

use std::path::PathBuf;

use anyhow::Result;

use super::device::DeviceArgs;
use crate::generate::prompt::PromptTemplate;
use crate::generate::{self, AdapterUse, Growth, ImportConfig, ImportSummary, Summary};
use crate::lm::openai::OpenAiConfig;
use crate::lm::sampler::SamplingParams;
use crate::models::generator_gguf;
use crate::store::Store;

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
    pub openai: Box<OpenAiArgs>,
    /// `smollm2` (the default model), `gemma3` (both fetched if needed) or the path of a GGUF file
    /// (llama, qwen2, qwen3 or gemma3).
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
    /// Require the project's adapters (`afkit lm adapt`, same --model) and fail without them.
    /// By default a project that holds adapters for the model samples each context with its
    /// fold's adapter (the model fine-tuned on the project's other groups, which writes in the
    /// corpus's register without having read the context's found ending), and one without
    /// them samples with the model alone.
    #[arg(long, conflicts_with = "no_adapters")]
    pub adapted: bool,
    /// Sample with the model alone even where the project holds adapters.
    #[arg(long)]
    pub no_adapters: bool,
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
    pub device: DeviceArgs,
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

/// Flags of `afkit generate --backend openai`.
#[derive(clap::Args, Debug, Clone)]
pub struct OpenAiArgs {
    /// Base URL of an OpenAI-compatible completions server (e.g. http://127.0.0.1:8000);
    /// `/v1/completions` is appended unless the URL already ends with `/completions`. Repeat the
    /// flag to spread requests over several servers (round-robin).
    #[arg(long = "endpoint")]
    pub endpoints: Vec<String>,
    /// Name of the environment variable holding the API key (sent as a Bearer token; never
    /// stored in the project).
    #[arg(long)]
    pub api_key_env: Option<String>,
    /// The `model` field of each request (servers hosting several models need it); also recorded
    /// as the generation's model name.
    #[arg(long)]
    pub model_name: Option<String>,
    /// Requests in flight at once, over all endpoints.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Seconds one request may take before it is abandoned and retried.
    #[arg(long, default_value_t = 60.0)]
    pub request_timeout: f64,
    /// Retries per request after the first attempt (429, 5xx, timeouts, dropped connections,
    /// malformed responses); then the context fails and the command stops with a report.
    #[arg(long, default_value_t = 5)]
    pub retries: u32,
    /// First back-off in seconds; doubles per retry, with jitter, capped at 30 s.
    #[arg(long, default_value_t = 0.5)]
    pub backoff: f64,
    /// Completions asked for per request (`n`). Keep 1 for servers that ignore `n`
    /// (llama.cpp's server does).
    #[arg(long, default_value_t = 1)]
    pub n_per_request: usize,
    /// Stop strings sent to the server (the sentence end).
    #[arg(long = "stop", default_values_t = [".".to_string(), "!".to_string(), "?".to_string()])]
    pub stop: Vec<String>,
    /// Extra request fields as KEY=JSON, overriding the defaults `top_k=0`, `min_p=0`,
    /// `repeat_penalty=1`; `KEY=null` removes a field (for servers that reject it).
    #[arg(long = "server-param", value_name = "KEY=JSON")]
    pub server_params: Vec<String>,
    /// Do not send `seed` (for servers that reject it).
    #[arg(long)]
    pub no_seed: bool,
}

impl From<OpenAiArgs> for OpenAiConfig {
    fn from(a: OpenAiArgs) -> Self {
        OpenAiConfig {
            endpoints: a.endpoints,
            api_key_env: a.api_key_env,
            model_name: a.model_name,
            concurrency: a.concurrency,
            request_timeout: a.request_timeout,
            retries: a.retries,
            backoff: a.backoff,
            n_per_request: a.n_per_request,
            stop: a.stop,
            server_params: a.server_params,
            no_seed: a.no_seed,
        }
    }
}

impl GenerateArgs {
    fn config(self) -> Result<generate::Config> {
        Ok(generate::Config {
            model: generator_gguf(&self.model)?,
            server: match self.backend {
                Backend::Local => None,
                Backend::Openai => Some((*self.openai).into()),
            },
            n_neg: self.n_neg,
            limit: self.limit,
            seed: self.seed,
            template: PromptTemplate::load(&self.prompt)?,
            style_examples: self.style_examples,
            ending_rules: !self.no_ending_rules,
            adapters: match (self.adapted, self.no_adapters) {
                (true, _) => AdapterUse::Require,
                (_, true) => AdapterUse::Off,
                _ => AdapterUse::Auto,
            },
            grow: self.grow.map(|per_context| Growth {
                per_context,
                max_pool: self.max_pool,
            }),
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                max_tokens: self.max_tokens,
                batch: self.batch,
                max_draws_per_ending: self.max_draws_per_ending,
                ..SamplingParams::default()
            },
        })
    }
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let compute = args.device.open()?;
    let mut store = Store::open(&args.project)?;
    let json = args.json;
    let config = args.config()?;
    let mut observer = Progress::default();
    let summary = generate::run(&mut store, &config, &compute, &mut observer)?;
    observer.0.clear();
    if summary.contexts + summary.unusable > 0 {
        print_summary(&summary, json)?;
    }
    Ok(())
}

/// A progress bar over contexts; notes and skipped contexts printed above it, on stderr.
#[derive(Default)]
struct Progress(crate::progress::Lines);

impl generate::Observer for Progress {
    fn note(&mut self, message: &str) {
        self.0.say(message, false);
    }

    fn started(&mut self, contexts: usize) {
        self.0.start(contexts, "contexts");
    }

    fn skipped(&mut self, ext_id: &str, reason: &str) {
        self.0.say(&format!("skipping {ext_id}: {reason}"), false);
        self.context_done(None);
    }

    fn context_done(&mut self, endings_per_second: Option<f64>) {
        if let Some(bar) = self.0.bar() {
            bar.inc(1);
            if let Some(rate) = endings_per_second {
                bar.set_message(format!("{rate:.1} endings/s"));
            }
        }
    }
}

fn print_summary(summary: &Summary, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(summary)?);
        return Ok(());
    }
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
    let rejected: Vec<String> = summary
        .rejected
        .iter()
        .map(|(why, n)| format!("{why} {n}"))
        .collect();
    println!(
        "{} draws, not kept: {}",
        summary.draws,
        if rejected.is_empty() {
            "none".to_string()
        } else {
            rejected.join(", ")
        }
    );
    Ok(())
}

pub fn import(args: ImportPoolArgs) -> Result<()> {
    let mut store = Store::open(&args.project)?;
    let config = ImportConfig {
        file: args.file,
        scorer: args.model,
        template: PromptTemplate::load(&args.prompt)?,
    };
    let mut observer = Progress::default();
    let summary = generate::import(&mut store, &config, &mut observer)?;
    observer.0.clear();
    print_import_summary(&summary);
    Ok(())
}

fn print_import_summary(counts: &ImportSummary) {
    println!(
        "imported {} endings for {} contexts; {} contexts skipped (they already have a pool)",
        counts.endings, counts.imported, counts.skipped
    );
    if counts.dropped_at_ingest > 0 {
        println!(
            "{} lines skipped: their records were dropped at ingest (see `afkit status`)",
            counts.dropped_at_ingest
        );
    }
    if counts.scored_elsewhere > 0 {
        println!(
            "{} contexts came with their own LM features; {} were scored with the local model",
            counts.scored_elsewhere, counts.scored_here
        );
    }
    if counts.incomplete > 0 {
        eprintln!(
            "note: {} imported endings do not end with . ! or ? (kept as given)",
            counts.incomplete
        );
    }
}
