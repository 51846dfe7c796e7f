//! `afkit generate` and `afkit import-pool`: flags → `generate::Config`, a progress bar, the
//! summary.

use std::path::PathBuf;

use anyhow::Result;

use super::device::DeviceArgs;
use afkit_engine::device::Compute;
use afkit_engine::lm::openai::{AdapterNames, FeatureSource, FoldAdapters, OpenAiConfig};
use afkit_engine::lm::sampler::SamplingParams;
use afkit_engine::models::generator_gguf;
use afkit_engine::seed::Seed;
use afkit_engine::text::counted;
use afkit_generate::prompt::PromptTemplate;
use afkit_generate::{self as generate, AdapterUse, Growth, ImportConfig, ImportSummary, Summary};
use afkit_store::Store;

// Help headings, most used first.
const WHAT: &str = "What to generate";
const SAMPLING: &str = "Sampling";
const SERVER: &str = "Server (--backend openai)";
const OUTPUT: &str = "Output";

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// The project file.
    pub project: PathBuf,
    /// `smollm2`, `gemma3` or the path of a GGUF file.
    ///
    /// `smollm2` and `gemma3` are fetched if needed; a GGUF file may hold a llama, qwen2, qwen3
    /// or gemma3 model. With `--backend openai` it is the scoring model: point the server at the same GGUF.
    #[arg(long, default_value = "smollm2", help_heading = WHAT)]
    pub model: String,
    /// Unique endings to sample per context (N⁻).
    #[arg(long, default_value_t = 64, help_heading = WHAT)]
    pub n_neg: usize,
    /// Sample at most N contexts in this run.
    ///
    /// They are the first N (by id) that have no pool yet. It counts per run: contexts finished by an earlier run (also one that was stopped) have pools, so
    /// running the same command again samples the next N.
    #[arg(long, help_heading = WHAT)]
    pub limit: Option<usize>,
    /// Seed for sampling, recorded in the project.
    ///
    /// Each context's stream is derived from it and the example id, so a resumed run samples
    /// what an uninterrupted one would have.
    #[arg(long, default_value_t = Seed::default(), help_heading = WHAT)]
    pub seed: Seed,
    /// Prompt template: `continuation` (built in) or a file with `{startphrase}`.
    ///
    /// A file's text contains `{startphrase}` (or `{sent1}` and `{sent2}`); the endings
    /// continue the filled template.
    #[arg(long, default_value = "continuation", help_heading = WHAT, hide_short_help = true)]
    pub prompt: String,
    /// Real context + ending pairs shown before each context, so the model writes in the
    /// corpus's style.
    ///
    /// The pairs come from the project's other groups (videos), one per line, chosen per
    /// context from the seed and recorded with its pool. 0 shows none. With the adapters of
    /// `lm adapt` four are as good as twelve and the prompt is a third as long.
    #[arg(long, default_value_t = 4, help_heading = WHAT, hide_short_help = true)]
    pub style_examples: usize,
    /// Keep sampled endings that no found ending could be.
    ///
    /// By default an ending must pass the rules ingest applies to found ones: 5 to 25 tokens,
    /// and a verb phrase that the splitter would cut right after `sent2` (so not "of the man
    /// throws ...").
    #[arg(long, help_heading = WHAT, hide_short_help = true)]
    pub no_ending_rules: bool,
    /// Also score every ending after the document start alone (the AF MLP's `lp_alone` input).
    ///
    /// Off by default: the pass runs every kept ending through the model a second time, and on
    /// held-out contexts neither this reading nor the same one by `filter`'s scorer model moved
    /// an audit row beyond its noise. Turn it on for pools that will be filtered without a
    /// scorer (`filter --no-scorer`), whose MLP then has little else to read.
    #[arg(long, help_heading = WHAT, hide_short_help = true)]
    pub alone_scores: bool,
    /// Grow starved pools instead of making new ones: this many more endings per context.
    ///
    /// A pool is starved when the latest finished AF run scored its found ending above all of
    /// its candidates (AF had nothing left to swap in). Then run `afkit filter` again.
    #[arg(long, help_heading = WHAT, hide_short_help = true)]
    pub grow: Option<usize>,
    /// Fail without the project's adapters (`afkit lm adapt`, same --model).
    ///
    /// By default a project that holds adapters for the model samples each context with its
    /// fold's adapter (the model fine-tuned on the project's other groups, which writes in the
    /// corpus's register without having read the context's found ending), and one without
    /// them samples with the model alone.
    #[arg(long, conflicts_with = "no_adapters", help_heading = WHAT)]
    pub adapted: bool,
    /// Sample with the model alone even where the project holds adapters.
    #[arg(long, help_heading = WHAT, hide_short_help = true)]
    pub no_adapters: bool,
    /// With --grow: leave pools that already hold this many candidates as they are.
    #[arg(long, default_value_t = 512, help_heading = WHAT, hide_short_help = true)]
    pub max_pool: usize,
    /// Sampling temperature.
    ///
    /// Above 1 with --min-p: the truncation keeps endings fluent, and the higher temperature
    /// spreads the kept tokens again, so that the endings are not all likelier than the found
    /// ones (an artifact the stylistic classifiers pick up). Use 1 with --min-p 0 for plain
    /// sampling.
    #[arg(long, default_value_t = SamplingParams::default().temperature, help_heading = SAMPLING, hide_short_help = true)]
    pub temperature: f32,
    /// Keep only the k most probable tokens (off by default).
    #[arg(long, help_heading = SAMPLING, hide_short_help = true)]
    pub top_k: Option<usize>,
    /// Nucleus sampling threshold (off by default).
    #[arg(long, help_heading = SAMPLING, hide_short_help = true)]
    pub top_p: Option<f32>,
    /// Drop tokens less than this fraction as probable as the best one (0: keep every token).
    ///
    /// Cuts the rare tokens after which a small model's ending derails into non-words, so fewer
    /// distractors are broken; alone it also leaves almost every ending likelier than the found
    /// one, which the stylistic classifiers then spot: pair it with a --temperature above 1.
    #[arg(long, default_value_t = SamplingParams::default().min_p.unwrap_or(0.0), help_heading = SAMPLING, hide_short_help = true)]
    pub min_p: f32,
    /// Token cap per ending; endings that reach it without ending a sentence are discarded.
    #[arg(long, default_value_t = SamplingParams::default().max_tokens, help_heading = SAMPLING, hide_short_help = true)]
    pub max_tokens: usize,
    /// Sequences decoded together.
    ///
    /// Continuous batching: a finished sequence's place goes to the next one, from any
    /// context. Bigger keeps the matrix products efficient; the key/value cache grows with it
    /// (and with --max-tokens).
    #[arg(long, default_value_t = SamplingParams::default().batch, help_heading = SAMPLING, hide_short_help = true)]
    pub batch: usize,
    /// Draws allowed per requested ending before a context is left with fewer endings.
    ///
    /// A context whose pool is still short of --n-neg after this many draws per ending keeps
    /// what it has; the summary counts the endings missing.
    #[arg(long, default_value_t = SamplingParams::default().max_draws_per_ending, help_heading = SAMPLING, hide_short_help = true)]
    pub max_draws_per_ending: usize,
    /// Where endings are sampled: `local` or `openai` (a server).
    ///
    /// `local`: the model, on this machine. `openai`: an OpenAI-compatible completions server (see --endpoint); the local model then
    /// only scores the LM features.
    #[arg(long, value_enum, default_value = "local", hide_possible_values = true, help_heading = SERVER)]
    pub backend: Backend,
    /// Boxed: the server flags would otherwise make every `Command` value large.
    #[command(flatten, next_help_heading = SERVER)]
    pub openai: Box<OpenAiArgs>,
    /// Print a JSON summary (counts, timings) on stdout.
    #[arg(long, help_heading = OUTPUT, hide_short_help = true)]
    pub json: bool,
    /// Where the local model samples (`--backend local`) and scores the LM features.
    #[command(flatten, next_help_heading = "Device")]
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
    /// JSONL, one context per line: {"id", "endings": ["...", ...]} (`id` is the example's id).
    ///
    /// Or a pool scored elsewhere, {"id", "endings": [{"text", "lp_cond", "lp_alone",
    /// "lp_final_punct", "n_tok"}, ...], "gold": {"lp_cond", "lp_alone", "lp_final_punct",
    /// "n_tok"}, "context": {"ctx_logprob", "n_tok_sent1", "n_tok_sent2"}} (the LM features:
    /// mean log-probs, each at most 0, the final punctuation's log-prob or null, `lp_alone` null
    /// or left out when not scored, lengths in LM tokens, whole numbers up to 1000000). The whole file is checked before anything is
    /// written. A context whose endings are all blank or copies of its found ending gets no pool
    /// (it is listed, and `generate` samples one for it).
    pub file: PathBuf,
    /// The model that scores endings imported without features: `smollm2` or a GGUF path (not
    /// loaded when every line brings its features).
    #[arg(long, default_value = "smollm2")]
    pub model: String,
    /// Prompt template the endings are scored after (see `generate --prompt`).
    #[arg(long, default_value = "continuation")]
    pub prompt: String,
    /// Also score the endings it scores after the document start alone (see `generate
    /// --alone-scores`).
    #[arg(long)]
    pub alone_scores: bool,
}

/// Flags of `afkit generate --backend openai`: shown by `--help`, left out of `-h`.
#[derive(clap::Args, Debug, Clone)]
pub struct OpenAiArgs {
    /// Base URL of an OpenAI-compatible completions server (e.g. http://127.0.0.1:8000);
    /// `/v1/completions` is appended unless the URL already ends with `/completions`. Repeat the
    /// flag to spread requests over several servers (round-robin).
    #[arg(long = "endpoint", hide_short_help = true)]
    pub endpoints: Vec<String>,
    /// Name of the environment variable holding the API key (sent as a Bearer token; never
    /// stored in the project).
    #[arg(long, hide_short_help = true)]
    pub api_key_env: Option<String>,
    /// The `model` field of each request (servers hosting several models need it); also recorded
    /// as the generation's model name.
    #[arg(long, hide_short_help = true)]
    pub model_name: Option<String>,
    /// Requests in flight at once, over all endpoints.
    #[arg(long, default_value_t = 8, hide_short_help = true)]
    pub concurrency: usize,
    /// Seconds one request may take before it is abandoned and retried.
    #[arg(long, default_value_t = 60.0, hide_short_help = true)]
    pub request_timeout: f64,
    /// Retries per request after the first attempt (429, 5xx, timeouts, dropped connections,
    /// malformed responses); then the context fails and the command stops with a report.
    #[arg(long, default_value_t = 5, hide_short_help = true)]
    pub retries: u32,
    /// First back-off in seconds; doubles per retry, with jitter, capped at 30 s.
    #[arg(long, default_value_t = 0.5, hide_short_help = true)]
    pub backoff: f64,
    /// Completions asked for per request (`n`). Keep 1 for servers that ignore `n`
    /// (llama.cpp's server does).
    #[arg(long, default_value_t = 1, hide_short_help = true)]
    pub n_per_request: usize,
    /// Stop strings sent to the server. An ending is the first sentence of a completion, up to
    /// its first `.`, `!` or `?`, as the local engine samples it; `.` alone is the default since
    /// llama.cpp's server does not say which of several stop strings matched (a `!` or `?`
    /// sentence then runs on a few tokens and is cut here).
    #[arg(long = "stop", default_values_t = [".".to_string()], hide_short_help = true)]
    pub stop: Vec<String>,
    /// Extra request fields as KEY=JSON, overriding the defaults `top_k=0`, `min_p=0`,
    /// `repeat_penalty=1`; `KEY=null` removes a field (for servers that reject it).
    #[arg(long = "server-param", value_name = "KEY=JSON", hide_short_help = true)]
    pub server_params: Vec<String>,
    /// Do not send `seed` (for servers that reject it).
    #[arg(long, hide_short_help = true)]
    pub no_seed: bool,
    /// Send each context to its fold's adapter, served as a model (vLLM's `--lora-modules`):
    /// a template such as `fold{fold}`, or `fold0=NAME,fold1=NAME,...`.
    ///
    /// The adapters are `lm adapt`'s PEFT folders (`PROJECT.adapters/*.peft`); the local model
    /// still scores with the same adapter, so the LM features match the sampler.
    #[arg(long, value_name = "NAMES", value_parser = parse_adapter_names, hide_short_help = true)]
    pub adapter_names: Option<AdapterNames>,
    /// Send each context to its fold's adapter on llama.cpp's server, which loaded every fold's
    /// `.lora.gguf` in fold order with `--lora-init-without-apply`: the request applies adapter
    /// k alone (`lora: [{"id": k, "scale": 1}]`).
    #[arg(long, conflicts_with = "adapter_names", hide_short_help = true)]
    pub adapter_lora_ids: bool,
    /// Where the LM features come from: `auto` asks the server for them where it echoes
    /// prompt log-probs (`echo` with `logprobs`, as vLLM does) and otherwise scores locally with
    /// `--model`, saying why (llama.cpp's server ignores `echo`); `server` stops where the
    /// server cannot give them; `local` always scores locally.
    #[arg(long, value_enum, default_value_t = FeatureSource::Auto, hide_short_help = true)]
    pub features: FeatureSource,
}

fn parse_adapter_names(text: &str) -> std::result::Result<AdapterNames, String> {
    text.parse::<AdapterNames>().map_err(|e| e.to_string())
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
            fold_adapters: match (a.adapter_names, a.adapter_lora_ids) {
                (Some(names), _) => Some(FoldAdapters::Names(names)),
                (None, true) => Some(FoldAdapters::LoraIds),
                (None, false) => None,
            },
            features: a.features,
        }
    }
}

impl GenerateArgs {
    fn config(self, compute: Compute) -> Result<generate::Config> {
        Ok(generate::Config {
            compute,
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
            alone_scores: self.alone_scores,
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
                min_p: (self.min_p > 0.0).then_some(self.min_p),
                max_tokens: self.max_tokens,
                batch: self.batch,
                max_draws_per_ending: self.max_draws_per_ending,
                ..SamplingParams::default()
            },
        })
    }
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let json = args.json;
    // The device first: a build without CUDA says so before any file is touched; the model
    // (which may be fetched) only once the project is known to exist.
    let compute = args.device.open()?;
    let mut store = Store::open(&args.project)?;
    let config = args.config(compute)?;
    let mut observer = GenerateBars {
        limit: config.limit,
        ..GenerateBars::default()
    };
    let summary = generate::run(&mut store, &config, &mut observer)?;
    observer.lines.clear();
    if summary.contexts + summary.unusable > 0 {
        print_summary(&summary, json)?;
    }
    Ok(())
}

/// A progress bar over the endings a call aims for (contexts × endings each), moved by every
/// ending kept, so that it moves while a batch of contexts decodes; over contexts for
/// `import-pool`. Notes and skipped contexts are printed above it, on stderr.
#[derive(Default)]
struct GenerateBars {
    lines: super::progress::Lines,
    contexts: usize,
    endings_each: usize,
    contexts_done: usize,
    /// Endings kept so far, and those of them in contexts already done.
    kept: usize,
    kept_in_done: usize,
    /// `--limit`, said at the start so that a second run's count surprises no one.
    limit: Option<usize>,
}

impl GenerateBars {
    /// Done contexts count whole (what they fell short of is not coming); the others count
    /// their endings kept so far, but each holds back one unit until it is done (its endings
    /// are still to be scored), so the bar is full only when every context is.
    fn show(&self) {
        let Some(bar) = self.lines.bar() else {
            return;
        };
        if self.endings_each == 0 {
            bar.set_position(self.contexts_done as u64);
            return;
        }
        let in_flight = self.kept.saturating_sub(self.kept_in_done);
        let open = self.contexts.saturating_sub(self.contexts_done);
        let in_flight = in_flight.min(open * self.endings_each.saturating_sub(1));
        bar.set_position((self.contexts_done * self.endings_each + in_flight) as u64);
        // The bar's own rate is the one rate shown: mean units a second, scoring included.
        bar.set_message(format!(
            "{}/{} done",
            self.contexts_done,
            counted(self.contexts, "context", "contexts")
        ));
    }
}

impl generate::Observer for GenerateBars {
    fn note(&mut self, message: &str) {
        self.lines.say(message, false);
    }

    fn started(&mut self, contexts: usize, endings_each: usize) {
        if let Some(limit) = self.limit {
            self.lines.say(
                &format!(
                    "this run samples {} (--limit {limit} counts this run's contexts: the first \
                     without a pool)",
                    counted(contexts, "context", "contexts")
                ),
                false,
            );
        }
        self.contexts = contexts;
        self.endings_each = endings_each;
        if endings_each == 0 {
            self.lines.start(contexts, "contexts");
        } else {
            self.lines.start(contexts * endings_each, "endings");
        }
        self.show();
    }

    fn skipped(&mut self, ext_id: &str, reason: &str) {
        self.lines
            .say(&format!("skipping {ext_id}: {reason}"), false);
        self.context_done(0, None);
    }

    fn ending_kept(&mut self) {
        self.kept += 1;
        self.show();
    }

    fn context_done(&mut self, kept: usize, _endings_per_second: Option<f64>) {
        self.contexts_done += 1;
        self.kept_in_done += kept;
        self.show();
    }
}

fn print_summary(summary: &Summary, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(summary)?);
        return Ok(());
    }
    if summary.unusable > 0 {
        println!(
            "{} skipped: too long for the model (listed above, counted by `afkit status`)",
            counted(summary.unusable, "context", "contexts")
        );
    }
    let missing = if summary.shortfall == 0 {
        "every pool full".to_string()
    } else {
        format!(
            "{} short of the number asked for",
            counted(summary.shortfall, "ending", "endings")
        )
    };
    println!(
        "{}: {} ({missing}), {:.1} endings/s overall; sampling {:.1} endings/s, {:.0} tokens/s",
        counted(summary.contexts, "context", "contexts"),
        counted(summary.endings, "ending", "endings"),
        summary.endings_per_second,
        summary.sampling_endings_per_second,
        summary.sampling_tokens_per_second
    );
    let rejected: Vec<String> = summary
        .rejected
        .iter()
        .map(|(why, n)| format!("{} {n}", rejection_words(why)))
        .collect();
    println!(
        "{} sampled in all; not kept: {}",
        counted(summary.draws, "ending", "endings"),
        if rejected.is_empty() {
            "none".to_string()
        } else {
            rejected.join(", ")
        }
    );
    Ok(())
}

/// A recorded rejection reason (a stable key in the project and `--json`) in plain words.
fn rejection_words(why: &str) -> String {
    match why {
        "surplus" => "finished after the pool was full".to_string(),
        "duplicate" => "duplicates".to_string(),
        other => other.replace('_', " "),
    }
}

pub fn import(args: ImportPoolArgs) -> Result<()> {
    let mut store = Store::open(&args.project)?;
    let config = ImportConfig {
        file: args.file,
        scorer: args.model,
        template: PromptTemplate::load(&args.prompt)?,
        alone_scores: args.alone_scores,
    };
    let mut observer = GenerateBars::default();
    let summary = generate::import(&mut store, &config, &mut observer)?;
    observer.lines.clear();
    print_import_summary(&summary, &config.file);
    Ok(())
}

fn print_import_summary(counts: &ImportSummary, file: &std::path::Path) {
    println!(
        "imported {} for {}; {} skipped (they already have a pool)",
        counted(counts.endings, "ending", "endings"),
        counted(counts.imported, "context", "contexts"),
        counted(counts.skipped, "context", "contexts")
    );
    if counts.dropped_at_ingest > 0 {
        println!(
            "{} skipped: their records were dropped at ingest (see `afkit status`)",
            counted(counts.dropped_at_ingest, "line", "lines")
        );
    }
    if counts.scored_elsewhere > 0 {
        println!(
            "{} came with their own LM features; {} scored with the local model",
            counted(counts.scored_elsewhere, "context", "contexts"),
            counts.scored_here
        );
    }
    if counts.incomplete > 0 {
        eprintln!(
            "note: {} imported endings do not end with . ! or ? (kept as given)",
            counts.incomplete
        );
    }
    if !counts.refused_endings.is_empty() {
        let reasons: Vec<String> = counts
            .refused_endings
            .iter()
            .map(|(reason, n)| format!("{n} {reason}"))
            .collect();
        eprintln!("note: imported endings refused: {}", reasons.join(", "));
    }
    for (line, id) in &counts.without_usable_endings {
        eprintln!(
            "{}:{line}: every ending of {id:?} was refused (blank, invisible characters or \
             punctuation only, or the found ending): no pool imported for it (`afkit generate` \
             will sample one)",
            file.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use generate::Observer;

    #[test]
    fn the_bar_moves_with_every_ending_kept_and_done_contexts_count_whole() {
        let mut p = GenerateBars::default();
        p.started(3, 4);
        let position = |p: &GenerateBars| p.lines.bar().map(|b| b.position());
        // Two contexts sampled together: endings arrive before either is done.
        for _ in 0..5 {
            p.ending_kept();
        }
        assert_eq!(position(&p), Some(5));
        // The first is done with 3 of its 4 endings: it counts whole, the other's 2 still count.
        p.context_done(3, Some(10.0));
        assert_eq!(position(&p), Some(4 + 2));
        p.context_done(2, Some(10.0));
        assert_eq!(position(&p), Some(8));
        p.skipped("v9#0", "too long");
        assert_eq!(position(&p), Some(12));
        assert_eq!(p.lines.bar().map(|b| b.length()), Some(Some(12)));
    }

    #[test]
    fn the_bar_is_full_only_when_every_context_is_done() {
        let mut p = GenerateBars::default();
        p.started(4, 3);
        let position = |p: &GenerateBars| p.lines.bar().map(|b| b.position());
        let message = |p: &GenerateBars| p.lines.bar().map(|b| b.message().to_string());
        // Every ending of all four contexts sampled, none of them scored and done yet.
        for _ in 0..12 {
            p.ending_kept();
        }
        assert_eq!(
            position(&p),
            Some(8),
            "each open context holds back one unit"
        );
        for done in 1..=3 {
            p.context_done(3, Some(10.0));
            assert_eq!(position(&p), Some(12 - (4 - done)));
        }
        assert_eq!(message(&p).as_deref(), Some("3/4 contexts done"));
        p.context_done(3, Some(10.0));
        assert_eq!(position(&p), Some(12));
    }
}
