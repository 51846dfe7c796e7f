//! The `openai` backend: the same sampling job sent to any OpenAI-compatible `/v1/completions`
//! server (vLLM, llama.cpp's server, TGI, hosted APIs).
//!
//! Each draw is one completion (or `n` per request where the server honours `n`), sampled at the
//! sampling settings' temperature and `min_p` with the other truncation knobs explicitly off
//! (`top_p` 1, and `top_k` 0 / `repeat_penalty` 1 as extra fields, and `min_p` 0 where the
//! settings have none, since servers' defaults differ — llama.cpp's server penalises repeats
//! unless told not to). Many requests are in flight from a bounded set of scoped
//! threads; requests go round-robin over the endpoints. A failed request (HTTP 429 / 5xx, a
//! timeout, a dropped connection, a body that is not a completions response) is retried with
//! exponential back-off and jitter, honouring `Retry-After`; when the retries are spent the
//! context fails as a whole, so nothing partial is ever stored.
//!
//! Servers strip the stop string from the text. The sentence end is recovered from the token log
//! (llama-cpp-python's server keeps the stopping token there), from vLLM's `stop_reason`, or, for
//! llama.cpp's server, which gives neither, from the one stop string sent (`.` by default; an
//! ending is cut at its first `.`, `!` or `?`); a draw whose end cannot be recovered is discarded
//! like a draw that hit the token cap.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use rand::Rng;
use serde_json::{json, Map, Value};

use super::sampler::{
    goes_on_the_last_word, normalise_ending, EndingSampler, Rejection, SampleRequest,
    SampledEnding, SampledPool, SamplingParams,
};
use super::tokenizer::GgufTokenizer;
use crate::seed::Seed;

pub mod echo;

/// How to reach the server and what to ask it (`afkit generate --backend openai`).
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Base URL of an OpenAI-compatible completions server (e.g. http://127.0.0.1:8000);
    /// `/v1/completions` is appended unless the URL already ends with `/completions`. Repeat the
    /// flag to spread requests over several servers (round-robin).
    pub endpoints: Vec<String>,
    /// Name of the environment variable holding the API key (sent as a Bearer token; never
    /// stored in the project).
    pub api_key_env: Option<String>,
    /// The `model` field of each request (servers hosting several models need it); also recorded
    /// as the generation's model name.
    pub model_name: Option<String>,
    /// Requests in flight at once, over all endpoints.
    pub concurrency: usize,
    /// Seconds one request may take before it is abandoned and retried.
    pub request_timeout: f64,
    /// Retries per request after the first attempt (429, 5xx, timeouts, dropped connections,
    /// malformed responses); then the context fails and the command stops with a report.
    pub retries: u32,
    /// First back-off in seconds; doubles per retry, with jitter, capped at 30 s.
    pub backoff: f64,
    /// Completions asked for per request (`n`). Keep 1 for servers that ignore `n`
    /// (llama.cpp's server does).
    pub n_per_request: usize,
    /// Stop strings sent to the server (the sentence end).
    pub stop: Vec<String>,
    /// Extra request fields as KEY=JSON, overriding the defaults `top_k=0`, `min_p=0`,
    /// `repeat_penalty=1`; `KEY=null` removes a field (for servers that reject it).
    pub server_params: Vec<String>,
    /// Do not send `seed` (for servers that reject it).
    pub no_seed: bool,
    /// How a context reaches its fold's adapter on the server; `None`: the server's model
    /// samples every context.
    pub fold_adapters: Option<FoldAdapters>,
    /// Where the LM features come from.
    pub features: FeatureSource,
}

/// Where `generate --backend openai` gets the LM features (context, found ending and each
/// sampled ending scored after the context and alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FeatureSource {
    /// From the server where it echoes prompt log-probs (`echo` with `logprobs` on
    /// `/v1/completions`, as vLLM does); otherwise scored locally, with a note saying why.
    #[default]
    Auto,
    /// From the server; stop with the reason where it cannot give them.
    Server,
    /// Scored locally with the scoring model (`--model`).
    Local,
}

/// How a server holds the project's fold adapters (`lm adapt`), and so what a request for a
/// context of fold k asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum FoldAdapters {
    /// Adapters served as models (vLLM's `--lora-modules NAME=PATH`): the request's `model` is
    /// fold k's name.
    Names(AdapterNames),
    /// llama.cpp's server with every fold's adapter loaded unapplied, in fold order: the request
    /// applies adapter k alone (`lora: [{"id": k, "scale": 1}]`).
    LoraIds,
}

/// The served name of each fold's adapter.
#[derive(Debug, Clone, PartialEq)]
pub enum AdapterNames {
    /// `{fold}` replaced by the fold's number: `fold{fold}`.
    Template(String),
    /// One name per fold, as `fold0=NAME,fold1=NAME`.
    Listed(std::collections::BTreeMap<usize, String>),
}

impl std::str::FromStr for AdapterNames {
    type Err = anyhow::Error;

    /// Reads `--adapter-names`: a template with `{fold}`, or `fold0=NAME,fold1=NAME,...`.
    fn from_str(text: &str) -> Result<AdapterNames> {
        if text.contains("{fold}") {
            return Ok(AdapterNames::Template(text.to_string()));
        }
        let mut listed = std::collections::BTreeMap::new();
        for item in text.split(',') {
            let (fold, name) = item
                .split_once('=')
                .and_then(|(f, n)| Some((f.trim().strip_prefix("fold")?.parse().ok()?, n.trim())))
                .filter(|(_, n)| !n.is_empty())
                .ok_or_else(|| {
                    anyhow!(
                        "--adapter-names {text}: expected a template with {{fold}} (fold{{fold}}) \
                         or fold0=NAME,fold1=NAME,..., not {item:?}"
                    )
                })?;
            listed.insert(fold, name.to_string());
        }
        Ok(AdapterNames::Listed(listed))
    }
}

impl AdapterNames {
    fn name(&self, fold: usize) -> Result<String> {
        match self {
            AdapterNames::Template(t) => Ok(t.replace("{fold}", &fold.to_string())),
            AdapterNames::Listed(names) => names
                .get(&fold)
                .cloned()
                .ok_or_else(|| anyhow!("--adapter-names names no adapter for fold {fold}")),
        }
    }
}

impl OpenAiConfig {
    /// The configuration for the contexts of `fold`: its adapter's name as the model, or its
    /// adapter applied alone. Unchanged without fold adapters.
    fn for_fold(&self, fold: usize) -> Result<OpenAiConfig> {
        let mut config = self.clone();
        match &self.fold_adapters {
            None => {}
            Some(FoldAdapters::Names(names)) => config.model_name = Some(names.name(fold)?),
            Some(FoldAdapters::LoraIds) => config
                .server_params
                .push(format!("lora=[{{\"id\": {fold}, \"scale\": 1.0}}]")),
        }
        Ok(config)
    }
}

/// The request fields beyond the standard ones: truncation off for servers that default it on.
fn extra_fields(overrides: &[String]) -> Result<Map<String, Value>> {
    let mut fields = Map::new();
    fields.insert("top_k".into(), json!(0));
    fields.insert("min_p".into(), json!(0.0));
    fields.insert("repeat_penalty".into(), json!(1.0));
    for item in overrides {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| anyhow!("--server-param {item}: expected KEY=JSON, e.g. top_k=0"))?;
        let value: Value = serde_json::from_str(value)
            .with_context(|| format!("--server-param {item}: the value is not JSON"))?;
        if value.is_null() {
            fields.remove(key);
        } else {
            fields.insert(key.to_string(), value);
        }
    }
    Ok(fields)
}

fn completions_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with("/completions") {
        base.to_string()
    } else if base.ends_with("/v1") {
        format!("{base}/completions")
    } else {
        format!("{base}/v1/completions")
    }
}

/// One completion as the server returned it.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub text: String,
    pub finish_reason: Option<String>,
    /// vLLM's matched stop string.
    pub stop_reason: Option<String>,
    /// `(token strings, log-probs)` when the server returned them.
    pub logprobs: Option<(Vec<String>, Vec<f32>)>,
}

/// Parses a completions response body; an error means "not a completions response".
pub fn parse_completions(body: &str) -> Result<Vec<Completion>> {
    let value: Value = serde_json::from_str(body).context("the response is not JSON")?;
    let choices = value["choices"]
        .as_array()
        .ok_or_else(|| anyhow!("the response has no `choices` array"))?;
    choices
        .iter()
        .map(|choice| {
            let text = choice["text"]
                .as_str()
                .ok_or_else(|| anyhow!("a choice has no `text`"))?
                .to_string();
            let logprobs = token_log(&choice["logprobs"]);
            Ok(Completion {
                text,
                finish_reason: choice["finish_reason"].as_str().map(String::from),
                stop_reason: choice["stop_reason"].as_str().map(String::from),
                logprobs,
            })
        })
        .collect()
}

/// A choice's token strings and log-probs, in either form servers give them: the completions
/// API's parallel `tokens` / `token_logprobs` lists (vLLM, llama-cpp-python), or a `content` list
/// of `{token, logprob}` entries (llama.cpp's server).
fn token_log(logprobs: &Value) -> Option<(Vec<String>, Vec<f32>)> {
    let logprob = |l: &Value| l.as_f64().map_or(f32::NAN, |l| l as f32);
    let token = |t: &Value| t.as_str().unwrap_or_default().to_string();
    if let (Some(tokens), Some(lps)) = (
        logprobs["tokens"].as_array(),
        logprobs["token_logprobs"].as_array(),
    ) {
        return (tokens.len() == lps.len()).then(|| {
            (
                tokens.iter().map(token).collect(),
                lps.iter().map(logprob).collect(),
            )
        });
    }
    let content = logprobs["content"].as_array()?;
    Some(
        content
            .iter()
            .map(|e| (token(&e["token"]), logprob(&e["logprob"])))
            .unzip(),
    )
}

/// Whether `text` ends a sentence.
fn ends_sentence(text: &str) -> bool {
    text.ends_with(['.', '!', '?'])
}

/// The ending a completion stands for, with its sentence end restored; `None`: not a whole
/// sentence.
pub fn recover_ending(c: &Completion, stop: &[String]) -> Option<String> {
    let mut text = c.text.clone();
    if let Some((strs, _)) = &c.logprobs {
        // llama-cpp-python's server keeps the stopping token in its token log.
        let log: String = strs.concat();
        if let Some(rest) = log.strip_prefix(text.as_str()) {
            if let Some(s) = stop.iter().find(|s| rest.starts_with(s.as_str())) {
                text.push_str(s);
            }
        }
    }
    let finished_by_stop = c.finish_reason.as_deref() == Some("stop");
    if !ends_sentence(&text) && finished_by_stop {
        // vLLM names the stop string that matched; llama.cpp's server names none and leaves it
        // out of the token log, which is unambiguous only when one stop string was sent.
        let matched = c.stop_reason.as_ref().filter(|s| stop.contains(s));
        if let Some(s) = matched.or(stop.first().filter(|_| stop.len() == 1)) {
            text.push_str(s);
        }
    }
    // The ending is the first sentence, as the local engine stops at the first token that ends
    // one: with `.` the only stop string, a `!` or `?` sentence runs on and is cut here.
    if let Some(end) = text.find(['.', '!', '?']) {
        text.truncate(end + 1);
    }
    ends_sentence(&text).then_some(text)
}

/// Sampling on a completions server.
pub struct OpenAiSampler<'a> {
    config: OpenAiConfig,
    urls: Vec<String>,
    params: SamplingParams,
    extra: Map<String, Value>,
    api_key: Option<String>,
    agent: ureq::Agent,
    next_endpoint: AtomicUsize,
    /// The scoring model's tokenizer: the features asked of the server are over its tokens.
    tokenizer: &'a GgufTokenizer,
    /// Retries spent so far (reported at the end).
    pub retries_used: AtomicUsize,
}

/// Why one HTTP attempt failed, and whether trying again may help.
struct AttemptError {
    retryable: bool,
    retry_after: Option<Duration>,
    message: String,
}

impl<'a> OpenAiSampler<'a> {
    /// A sampler for the contexts of `fold` (asking for that fold's adapter as `config`'s
    /// `fold_adapters` say), or for any context with `None`.
    pub fn new(
        config: &OpenAiConfig,
        fold: Option<usize>,
        params: SamplingParams,
        tokenizer: &'a GgufTokenizer,
    ) -> Result<Self> {
        let config = match fold {
            Some(fold) => config.for_fold(fold)?,
            None => config.clone(),
        };
        if config.endpoints.is_empty() {
            bail!("--backend openai needs at least one --endpoint URL");
        }
        if config.concurrency == 0 || config.n_per_request == 0 {
            bail!("--concurrency and --n-per-request must be at least 1");
        }
        if config.request_timeout.is_nan() || config.request_timeout <= 0.0 {
            bail!("--request-timeout must be a positive number of seconds");
        }
        let api_key = match &config.api_key_env {
            Some(var) => Some(std::env::var(var).with_context(|| {
                format!("--api-key-env {var}: the environment variable is not set")
            })?),
            None => None,
        };
        let agent_config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs_f64(config.request_timeout)))
            .max_idle_connections_per_host(config.concurrency)
            .build();
        Ok(OpenAiSampler {
            urls: config
                .endpoints
                .iter()
                .map(|e| completions_url(e))
                .collect(),
            extra: extra_fields(&config.server_params)?,
            api_key,
            agent: ureq::Agent::new_with_config(agent_config),
            next_endpoint: AtomicUsize::new(0),
            tokenizer,
            retries_used: AtomicUsize::new(0),
            params,
            config,
        })
    }

    /// What is recorded with the generation (no key); `server_features`: whether the server
    /// gives the LM features ([`Self::scores_features`]).
    pub fn record(&self, server_features: bool) -> Value {
        let features = if server_features {
            "every LM feature from the server's echoed prompt log-probs, over the scoring \
             model's tokens"
        } else {
            "every LM feature computed locally with the scoring model"
        };
        json!({
            "endpoints": self.urls,
            "n_per_request": self.config.n_per_request,
            "stop": self.config.stop,
            "extra_fields": self.extra,
            "seed_sent": !self.config.no_seed,
            "fold_adapter": match &self.config.fold_adapters {
                None => Value::Null,
                Some(FoldAdapters::Names(_)) => json!({"model": self.config.model_name}),
                Some(FoldAdapters::LoraIds) => json!({"lora": self.extra.get("lora")}),
            },
            "features": features,
        })
    }

    fn body(&self, prompt: &str, seed: Seed) -> Value {
        let mut body = json!({
            "prompt": prompt,
            "max_tokens": self.params.max_tokens,
            "temperature": self.params.temperature,
            "top_p": self.params.top_p.unwrap_or(1.0),
            "n": self.config.n_per_request,
            "stop": self.config.stop,
            "logprobs": 1,
        });
        let obj = body.as_object_mut().expect("an object");
        if let Some(name) = &self.config.model_name {
            obj.insert("model".into(), json!(name));
        }
        if !self.config.no_seed {
            // Servers take 32-bit seeds at most.
            obj.insert("seed".into(), json!(seed.value() & 0x7fff_ffff));
        }
        for (k, v) in &self.extra {
            obj.insert(k.clone(), v.clone());
        }
        if let Some(k) = self.params.top_k {
            obj.insert("top_k".into(), json!(k));
        }
        if let Some(p) = self.params.min_p {
            obj.insert("min_p".into(), json!(p));
        }
        body
    }

    fn attempt<T>(
        &self,
        url: &str,
        body: &str,
        parse: &dyn Fn(&str) -> Result<T>,
    ) -> std::result::Result<T, AttemptError> {
        let transport = |e: ureq::Error| AttemptError {
            retryable: true,
            retry_after: None,
            message: format!("{e}"),
        };
        let mut req = self
            .agent
            .post(url)
            .header("Content-Type", "application/json");
        if let Some(key) = &self.api_key {
            req = req.header("Authorization", &format!("Bearer {key}"));
        }
        let mut resp = req.send(body).map_err(transport)?;
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|s| Duration::from_secs_f64(s.clamp(0.0, 300.0)));
        let text = resp.body_mut().read_to_string().map_err(transport)?;
        if status != 200 {
            let snippet: String = text.chars().take(300).collect();
            return Err(AttemptError {
                retryable: status == 429 || status == 408 || status >= 500,
                retry_after,
                message: format!("HTTP {status}: {snippet}"),
            });
        }
        parse(&text).map_err(|e| AttemptError {
            retryable: true,
            retry_after: None,
            message: format!("malformed response ({e:#})"),
        })
    }

    /// One sampling request with retries.
    fn complete(&self, prompt: &str, seed: Seed) -> Result<Vec<Completion>> {
        self.post(
            &self.body(prompt, seed).to_string(),
            seed,
            &parse_completions,
        )
    }

    /// One request with retries (their jitter drawn from `seed`); the endpoint advances
    /// round-robin on every attempt, so a dead server's work moves to the others.
    fn post<T>(&self, body: &str, seed: Seed, parse: &dyn Fn(&str) -> Result<T>) -> Result<T> {
        let mut jitter = seed.rng();
        let mut attempt = 0;
        loop {
            let url =
                &self.urls[self.next_endpoint.fetch_add(1, Ordering::Relaxed) % self.urls.len()];
            match self.attempt(url, body, parse) {
                Ok(answer) => return Ok(answer),
                Err(e) if e.retryable && attempt < self.config.retries => {
                    let backoff = (self.config.backoff * 2f64.powi(attempt as i32)).min(30.0);
                    let wait = e.retry_after.unwrap_or(Duration::from_secs_f64(
                        backoff * jitter.random_range(0.5..1.5),
                    ));
                    self.retries_used.fetch_add(1, Ordering::Relaxed);
                    attempt += 1;
                    std::thread::sleep(wait);
                }
                Err(e) => {
                    bail!(
                        "POST {url} failed after {} attempt(s): {}",
                        attempt + 1,
                        e.message
                    )
                }
            }
        }
    }

    /// Completions requests for `prompt`, one per seed, in parallel; results in seed order.
    fn complete_many(&self, prompt: &str, seeds: &[Seed]) -> Result<Vec<Vec<Completion>>> {
        self.in_parallel(seeds.len(), &|i| self.complete(prompt, seeds[i]))
    }

    /// `request(0..n)` with at most `--concurrency` in flight; results in order, or the first
    /// error (no new request starts after one fails).
    fn in_parallel<T: Send>(
        &self,
        n: usize,
        request: &(dyn Fn(usize) -> Result<T> + Sync),
    ) -> Result<Vec<T>> {
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<Option<Result<T>>>> = Mutex::new((0..n).map(|_| None).collect());
        let failed = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            for _ in 0..self.config.concurrency.min(n) {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n || failed.load(Ordering::Relaxed) {
                        return;
                    }
                    let r = request(i);
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    results.lock().expect("results lock")[i] = Some(r);
                });
            }
        });
        let mut out = Vec::with_capacity(n);
        for r in results
            .into_inner()
            .expect("results lock")
            .into_iter()
            .flatten()
        {
            out.push(r?);
        }
        Ok(out)
    }
}

impl EndingSampler for OpenAiSampler<'_> {
    fn describe(&self) -> (String, String, Option<String>) {
        let name = self
            .config
            .model_name
            .clone()
            .unwrap_or_else(|| "server default".into());
        ("openai".into(), name, None)
    }

    fn sample(&self, request: &SampleRequest) -> Result<SampledPool> {
        let mut seen = request.seen_endings();
        let mut pool = SampledPool::default();
        let max_draws = self.params.max_draws(request.n);
        let mut seed_rng = request.seed.rng();
        while pool.endings.len() < request.n && pool.draws < max_draws {
            let draws = pool.draws_to_cover(request.n, max_draws);
            let requests = draws.div_ceil(self.config.n_per_request).max(1);
            let seeds: Vec<Seed> = (0..requests)
                .map(|_| Seed::new(seed_rng.random()))
                .collect();
            for completion in self
                .complete_many(&request.prompt, &seeds)?
                .into_iter()
                .flatten()
            {
                pool.draws += 1;
                pool.tokens_generated += completion.logprobs.as_ref().map_or(0, |(t, _)| t.len());
                if pool.endings.len() >= request.n {
                    pool.reject(Rejection::Surplus);
                    continue;
                }
                let Some(raw) = recover_ending(&completion, &self.config.stop) else {
                    pool.reject(Rejection::NoSentenceEnd);
                    continue;
                };
                if goes_on_the_last_word(&request.prompt, &raw) {
                    pool.reject(Rejection::MidWord);
                    continue;
                }
                // The server's log-probs of what it sampled are not the features: it read the
                // prompt without the document-start token the features are scored after.
                let text = normalise_ending(&raw);
                pool.offer(
                    SampledEnding { text, tokens: None },
                    request,
                    self.params.max_words,
                    &mut seen,
                );
            }
        }
        Ok(pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(text: &str, tokens: &[&str], finish: &str) -> Completion {
        Completion {
            text: text.into(),
            finish_reason: Some(finish.into()),
            stop_reason: None,
            logprobs: Some((
                tokens.iter().map(|t| t.to_string()).collect(),
                vec![-1.0; tokens.len()],
            )),
        }
    }

    fn stops() -> Vec<String> {
        vec![".".into(), "!".into(), "?".into()]
    }

    #[test]
    fn the_stop_token_from_the_token_log_restores_the_sentence_end() {
        let c = completion(" dances around", &[" dances", " around", "!"], "stop");
        assert_eq!(recover_ending(&c, &stops()).unwrap(), " dances around!");
    }

    #[test]
    fn vllm_stop_reason_restores_the_sentence_end_without_token_log() {
        let mut c = completion(" dances", &[], "stop");
        c.logprobs = None;
        c.stop_reason = Some("?".into());
        assert_eq!(recover_ending(&c, &stops()).unwrap(), " dances?");
    }

    #[test]
    fn capped_or_end_of_text_draws_are_not_endings() {
        let c = completion(
            " dances around the",
            &[" dances", " around", " the"],
            "length",
        );
        assert!(recover_ending(&c, &stops()).is_none());
        let c = completion(" dances", &[" dances", "<|endoftext|>"], "stop");
        assert!(recover_ending(&c, &stops()).is_none());
    }

    #[test]
    fn one_stop_string_restores_an_end_the_server_left_out_and_the_first_sentence_is_kept() {
        // llama.cpp's server: no stop_reason, and the stopping token is not in its token log.
        let period = vec![".".to_string()];
        let c = completion(" is hungry", &[" is", " hungry"], "stop");
        assert_eq!(recover_ending(&c, &period).unwrap(), " is hungry.");
        assert!(
            recover_ending(&c, &stops()).is_none(),
            "ambiguous with three stops"
        );
        // A `!` sentence runs on to the next `.`: the first sentence is the ending.
        let c = completion(
            " waves! Then he sits",
            &[" waves", "!", " Then", " he", " sits"],
            "stop",
        );
        assert_eq!(recover_ending(&c, &period).unwrap(), " waves!");
    }

    #[test]
    fn llama_cpp_servers_token_log_is_read() {
        let body = r#"{"choices":[{"text":" is hungry","index":0,"finish_reason":"stop",
            "logprobs":{"content":[{"id":1,"token":" is","logprob":-0.5},
                                   {"id":2,"token":" hungry","logprob":-1.5}]}}]}"#;
        let c = &parse_completions(body).unwrap()[0];
        assert_eq!(
            c.logprobs,
            Some((vec![" is".into(), " hungry".into()], vec![-0.5, -1.5]))
        );
    }

    #[test]
    fn malformed_bodies_are_errors() {
        assert!(parse_completions("{\"choices\": [{\"text\": ").is_err());
        assert!(parse_completions("{\"error\": \"busy\"}").is_err());
        let ok = parse_completions(r#"{"choices":[{"text":" a.","finish_reason":"stop"}]}"#);
        assert_eq!(ok.unwrap()[0].text, " a.");
    }

    #[test]
    fn server_params_override_and_remove_defaults() {
        let f = extra_fields(&["top_k=40".into(), "repeat_penalty=null".into()]).unwrap();
        assert_eq!(f["top_k"], json!(40));
        assert!(!f.contains_key("repeat_penalty"));
        assert!(extra_fields(&["top_k".into()]).is_err());
        assert_eq!(completions_url("http://h:1/"), "http://h:1/v1/completions");
        assert_eq!(
            completions_url("http://h:1/v1"),
            "http://h:1/v1/completions"
        );
    }
}
