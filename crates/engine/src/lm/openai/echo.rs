//! LM features from the server: the questions the local engine answers for them (each token's
//! log-prob given the tokens before it) asked of a completions server that echoes the prompt with
//! its log-probs (`echo: true` with `logprobs`, as vLLM answers). The client then does no model
//! work. Prompts go as token ids, the scoring model's tokenisation, so the server scores exactly
//! the tokens the local model would; a probe first checks that the server echoes them with
//! log-probs and as the same token strings (the same vocabulary). llama.cpp's server ignores
//! `echo`: there the features are scored locally.

use anyhow::{anyhow, Context, Result};
use serde_json::{json, Value};

use super::{FeatureSource, OpenAiSampler};
use crate::lm::features::TokenScorer;
use crate::lm::tokenizer::GgufTokenizer;
use crate::seed::Seed;

/// Prompts per scoring request: a context's pool is a few requests, spread over `--concurrency`.
const PROMPTS_PER_REQUEST: usize = 16;

/// The text of the probe request.
const PROBE: &str = "A man walks to the door and opens it.";

/// One echoed prompt: the token strings and log-probs the server gave for positions
/// `1..prompt length` (the first token has no log-prob).
pub struct Echo {
    pub tokens: Vec<String>,
    pub logprobs: Vec<f32>,
}

impl OpenAiSampler<'_> {
    /// Whether the server scores the LM features (echoing prompt log-probs in the scoring
    /// model's vocabulary): where it is asked to give them (`--features auto` or `server`) and
    /// passes the probe; otherwise the local model does. A refusal of `--features server` is an
    /// error; a refusal of `--features auto` is told to `refused`, with why.
    pub fn scores_features(&self, refused: &mut dyn FnMut(&str)) -> Result<bool> {
        if self.config.features == FeatureSource::Local {
            return Ok(false);
        }
        let why = match self.probe_echo() {
            Ok(()) => return Ok(true),
            Err(e) => format!("{e:#}"),
        };
        if self.config.features == FeatureSource::Server {
            anyhow::bail!("--features server: the server cannot give the LM features: {why}");
        }
        refused(&why);
        Ok(false)
    }

    /// Asks for the probe's prompt log-probs and checks that they come back for every token,
    /// as the scoring model's token strings.
    fn probe_echo(&self) -> Result<()> {
        let ids = self.with_doc_start(&[], PROBE)?;
        // An answer that is no echo is final (llama.cpp's server ignores `echo`), not retried.
        let body = self.echo_body(std::slice::from_ref(&ids)).to_string();
        let answer = self.post(&body, Seed::default(), &|text| Ok(text.to_string()))?;
        let echo = parse_echo(&answer, &[ids.len()])?
            .pop()
            .ok_or_else(|| anyhow!("no answer to the probe"))?;
        for (position, (&id, said)) in ids[1..].iter().zip(&echo.tokens).enumerate() {
            let ours = self.tokenizer.decode(&[id])?;
            if *said != ours {
                anyhow::bail!(
                    "the server's token {} is {said:?} where the scoring model has {ours:?}: \
                     it does not share the scoring model's vocabulary",
                    position + 1
                );
            }
        }
        Ok(())
    }

    /// `[doc_start] + prefix + tokens of text`.
    fn with_doc_start(&self, prefix: &[u32], text: &str) -> Result<Vec<u32>> {
        let mut ids = vec![self.tokenizer.doc_start];
        ids.extend_from_slice(prefix);
        ids.extend(self.tokenizer.encode(text)?);
        Ok(ids)
    }

    /// The echoed log-probs of every token sequence in `prompts`, in order.
    fn echo(&self, prompts: &[Vec<u32>]) -> Result<Vec<Echo>> {
        let chunks: Vec<&[Vec<u32>]> = prompts.chunks(PROMPTS_PER_REQUEST).collect();
        let answers = self.in_parallel(chunks.len(), &|c| {
            let lengths: Vec<usize> = chunks[c].iter().map(Vec::len).collect();
            let body = self.echo_body(chunks[c]).to_string();
            self.post(&body, Seed::new(c as u64), &|text| {
                parse_echo(text, &lengths)
            })
        })?;
        Ok(answers.into_iter().flatten().collect())
    }

    /// A request that generates one token, greedily, and echoes the prompts with the log-prob
    /// of each of their tokens; it asks for the same model or fold adapter as sampling does.
    fn echo_body(&self, prompts: &[Vec<u32>]) -> Value {
        let mut body = json!({
            "prompt": prompts,
            "max_tokens": 1,
            "temperature": 0.0,
            "echo": true,
            "logprobs": 1,
        });
        let obj = body.as_object_mut().expect("an object");
        if let Some(name) = &self.config.model_name {
            obj.insert("model".into(), json!(name));
        }
        for (k, v) in &self.extra {
            obj.insert(k.clone(), v.clone());
        }
        body
    }
}

/// The echoes of a response to prompts of `lengths` tokens: one choice per prompt (in `index`
/// order where the server numbers them), each with a log-prob for every prompt token but the
/// first.
pub fn parse_echo(body: &str, lengths: &[usize]) -> Result<Vec<Echo>> {
    let value: Value = serde_json::from_str(body).context("the response is not JSON")?;
    let mut choices: Vec<&Value> = value["choices"]
        .as_array()
        .ok_or_else(|| anyhow!("the response has no `choices` array"))?
        .iter()
        .collect();
    if choices.len() != lengths.len() {
        anyhow::bail!("{} choices for {} prompts", choices.len(), lengths.len());
    }
    choices.sort_by_key(|c| c["index"].as_u64().unwrap_or(0));
    choices
        .iter()
        .zip(lengths)
        .map(|(choice, &n)| {
            let logprobs = &choice["logprobs"];
            let (Some(tokens), Some(values)) = (
                logprobs["tokens"].as_array(),
                logprobs["token_logprobs"].as_array(),
            ) else {
                anyhow::bail!("a choice has no token log-probs (is `echo` supported?)");
            };
            if tokens.len() < n || values.len() < n {
                anyhow::bail!(
                    "{} echoed log-probs for a prompt of {n} tokens (the server does not echo \
                     the prompt)",
                    values.len()
                );
            }
            let logprobs = values
                .iter()
                .take(n)
                .skip(1)
                .map(|v| {
                    v.as_f64()
                        .filter(|lp| lp.is_finite() && *lp <= 1e-3)
                        .map(|lp| lp as f32)
                        .ok_or_else(|| anyhow!("a prompt token's log-prob is {v}"))
                })
                .collect::<Result<Vec<f32>>>()?;
            Ok(Echo {
                tokens: tokens
                    .iter()
                    .take(n)
                    .skip(1)
                    .map(|t| t.as_str().unwrap_or_default().to_string())
                    .collect(),
                logprobs,
            })
        })
        .collect()
}

impl TokenScorer for OpenAiSampler<'_> {
    fn tokenizer(&self) -> &GgufTokenizer {
        self.tokenizer
    }

    fn prompt_logprobs(&self, prompt: &str) -> Result<Vec<f32>> {
        let ids = self.with_doc_start(&[], prompt)?;
        Ok(self.echo(&[ids])?.remove(0).logprobs)
    }

    fn after_prompt(&self, prompt: &str, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let context = self.with_doc_start(&[], prompt)?;
        let prompts: Vec<Vec<u32>> = seqs.iter().map(|s| [&context, *s].concat()).collect();
        Ok(self
            .echo(&prompts)?
            .into_iter()
            .zip(seqs)
            .map(|(e, s)| e.logprobs[e.logprobs.len() - s.len()..].to_vec())
            .collect())
    }

    fn alone(&self, seqs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let prompts: Vec<Vec<u32>> = seqs
            .iter()
            .map(|s| [&[self.tokenizer.doc_start][..], s].concat())
            .collect();
        Ok(self
            .echo(&prompts)?
            .into_iter()
            .map(|e| e.logprobs)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echoes_are_read_in_index_order_without_the_first_token() {
        let body = json!({"choices": [
            {"index": 1, "text": "x", "logprobs": {"tokens": ["a", "b", "c"], "token_logprobs": [null, -1.0, -2.0]}},
            {"index": 0, "text": "y", "logprobs": {"tokens": ["d", "e", "f", "g"], "token_logprobs": [null, -0.5, -0.25, -3.0]}},
        ]})
        .to_string();
        let echoes = parse_echo(&body, &[3, 2]).unwrap();
        assert_eq!(echoes[0].logprobs, vec![-0.5, -0.25]);
        assert_eq!(echoes[0].tokens, vec!["e", "f"]);
        assert_eq!(echoes[1].logprobs, vec![-1.0]);
    }

    #[test]
    fn a_server_that_echoes_nothing_is_refused() {
        // llama.cpp's server: log-probs of the generated token only.
        let body = json!({"choices": [
            {"text": "x", "logprobs": {"tokens": ["x"], "token_logprobs": [-0.1]}},
        ]})
        .to_string();
        assert!(parse_echo(&body, &[4]).is_err());
        let missing = json!({"choices": [{"text": "x"}]}).to_string();
        assert!(parse_echo(&missing, &[4]).is_err());
        let null = json!({"choices": [
            {"text": "x", "logprobs": {"tokens": ["a", "b"], "token_logprobs": [null, null]}},
        ]})
        .to_string();
        assert!(parse_echo(&null, &[2]).is_err());
        assert!(parse_echo("{\"choices\": []}", &[2]).is_err());
        // Prompts of no or one token have no log-probs to read (and no panic).
        let short = json!({"choices": [
            {"text": "x", "logprobs": {"tokens": ["a"], "token_logprobs": [null]}},
            {"text": "y", "logprobs": {"tokens": [], "token_logprobs": []}},
        ]})
        .to_string();
        assert!(parse_echo(&short, &[1, 0])
            .unwrap()
            .iter()
            .all(|e| e.logprobs.is_empty()));
    }
}
