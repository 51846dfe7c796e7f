//! Multiple-choice scoring as lm-evaluation-harness scores its `multiple_choice` tasks, so that a
//! zero-shot accuracy measured here is the one the harness reports for the same model and data.
//!
//! The harness poses every option as a log-likelihood request (context, `" " + option`):
//! whitespace that ends the context moves to the front of the continuation; the context is
//! tokenised alone and context + continuation whole, and the continuation is the whole's tokens
//! after as many tokens as the context alone has. The model reads the context's tokens and then
//! the continuation's, and an option's score is the sum of its continuation tokens'
//! log-probabilities. A tokenizer adds its BOS token only where the model's own tokenizer does
//! (`tokenizer.ggml.add_bos_token`). `acc` picks the highest score, `acc_norm` the highest score
//! per character of the option (Python's `len`: code points, the delimiter not counted); ties go
//! to the first option, as numpy's `argmax` gives them.

use anyhow::{Context, Result};
use candle_core::quantized::gguf_file::Content;
use rayon::prelude::*;

use super::model::LanguageModel;

/// What the harness puts between the context and each option.
pub(crate) const TARGET_DELIMITER: &str = " ";

/// One question: the context and its options, as the harness reads them.
pub struct ChoiceQuestion<'a> {
    pub context: &'a str,
    pub options: &'a [String],
}

/// The scores of one question's options.
#[derive(Debug, Clone, PartialEq)]
pub struct OptionScores {
    /// Summed log-probability of each option's continuation tokens.
    pub loglikelihood: Vec<f64>,
    /// Each option's length in characters (code points), the `acc_norm` divisor.
    pub chars: Vec<usize>,
    /// Each option's continuation tokens.
    pub tokens: Vec<usize>,
}

impl OptionScores {
    /// The option `acc` picks: the highest log-likelihood, the first of equals.
    pub fn pick(&self) -> usize {
        first_max(self.loglikelihood.iter().copied())
    }

    /// The option `acc_norm` picks: the highest log-likelihood per character.
    pub fn pick_per_char(&self) -> usize {
        first_max(
            self.loglikelihood
                .iter()
                .zip(&self.chars)
                .map(|(ll, &n)| ll / n as f64),
        )
    }
}

/// Index of the first largest value (a NaN never wins).
fn first_max(values: impl Iterator<Item = f64>) -> usize {
    let mut best: Option<(usize, f64)> = None;
    for (i, v) in values.enumerate() {
        if best.map_or(!v.is_nan(), |(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map_or(0, |(i, _)| i)
}

/// Scores options with one model, posing them as the harness does.
pub struct ChoiceScorer<'m> {
    model: &'m LanguageModel,
    /// The token every encoding starts with, where the model's tokenizer adds one.
    bos: Option<u32>,
    /// What an empty context stands for: BOS where the vocabulary names one, else EOS.
    empty_context: u32,
}

impl<'m> ChoiceScorer<'m> {
    /// Reads from the model's GGUF metadata whether its tokenizer adds BOS.
    pub fn new(model: &'m LanguageModel) -> Result<Self> {
        let path = &model.path;
        let mut file = std::fs::File::open(path)
            .with_context(|| format!("cannot open model file {}", path.display()))?;
        let content = Content::read(&mut file)
            .with_context(|| format!("{} is not a readable GGUF file", path.display()))?;
        let number = |key: &str| content.metadata.get(key).and_then(|v| v.to_u32().ok());
        let bos = number("tokenizer.ggml.bos_token_id");
        let adds_bos = content
            .metadata
            .get("tokenizer.ggml.add_bos_token")
            .and_then(|v| v.to_bool().ok())
            .unwrap_or(false);
        let fallback = number("tokenizer.ggml.eos_token_id").unwrap_or(model.tokenizer.doc_start);
        Ok(ChoiceScorer {
            model,
            bos: bos.filter(|_| adds_bos),
            empty_context: bos.unwrap_or(fallback),
        })
    }

    /// Token ids of `text` as the model's tokenizer gives them (with BOS where it adds one).
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids: Vec<u32> = self.bos.into_iter().collect();
        ids.extend(self.model.tokenizer.encode(text)?);
        Ok(ids)
    }

    /// The context's and the continuation's tokens of one request, split as the harness splits
    /// them (its `_encode_pair`).
    pub(crate) fn encode_pair(
        &self,
        context: &str,
        continuation: &str,
    ) -> Result<(Vec<u32>, Vec<u32>)> {
        let kept = context.trim_end().len();
        let (context, continuation) = (
            &context[..kept],
            format!("{}{continuation}", &context[kept..]),
        );
        if context.is_empty() {
            return Ok((vec![self.empty_context], self.encode(&continuation)?));
        }
        let whole = self.encode(&format!("{context}{continuation}"))?;
        let context_ids = self.encode(context)?;
        let split = context_ids.len().min(whole.len());
        Ok((context_ids, whole[split..].to_vec()))
    }

    /// Every option's log-likelihood after `context`: the context runs once, its keys and
    /// values shared by the options, which run as one batch.
    pub(crate) fn score(&self, question: &ChoiceQuestion) -> Result<OptionScores> {
        let per_token = self.token_log_probs(question)?;
        Ok(OptionScores {
            loglikelihood: per_token
                .iter()
                .map(|lps| lps.iter().map(|&lp| f64::from(lp)).sum())
                .collect(),
            chars: question.options.iter().map(|o| o.chars().count()).collect(),
            tokens: per_token.iter().map(Vec::len).collect(),
        })
    }

    /// Each option's tokens' log-probabilities after `context`, posed as [`Self::score`] poses
    /// them: where in an option the model is surprised, not only how much in all.
    pub fn token_log_probs(&self, question: &ChoiceQuestion) -> Result<Vec<Vec<f32>>> {
        let mut context_ids = None;
        let mut continuations = Vec::with_capacity(question.options.len());
        for option in question.options {
            let (ctx, cont) =
                self.encode_pair(question.context, &format!("{TARGET_DELIMITER}{option}"))?;
            // The context's tokens never depend on the option; keep the first encoding.
            context_ids.get_or_insert(ctx);
            continuations.push(cont);
        }
        let Some(context_ids) = context_ids else {
            return Ok(Vec::new());
        };
        let llama = &self.model.llama;
        let prefix = llama.prefix(&context_ids)?;
        llama.score_continuations(&prefix, &continuations)
    }

    /// Every question's option scores (each question as `score` does it), several questions at
    /// once; `done` hears each finished question. Results are in the questions' order.
    pub fn score_all(
        &self,
        questions: &[ChoiceQuestion],
        done: &(dyn Fn() + Sync),
    ) -> Result<Vec<OptionScores>> {
        questions
            .par_iter()
            .map(|q| {
                let scores = self
                    .score(q)
                    .with_context(|| format!("cannot score the options of {:?}", q.context))?;
                done();
                Ok(scores)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{write_random_gguf, RANDOM_GGUF_VOCAB};
    use crate::lm::config::LlamaConfig;
    use crate::seed::Seed;

    fn tiny_model(dir: &std::path::Path) -> LanguageModel {
        let cfg = LlamaConfig {
            vocab: RANDOM_GGUF_VOCAB,
            d_model: 64,
            n_layer: 2,
            n_head: 4,
            n_kv_head: 2,
            d_ff: 128,
            rope_theta: 10_000.0,
            rms_eps: 1e-5,
            arch: Default::default(),
        };
        let path = dir.join("tiny.gguf");
        write_random_gguf(&path, &cfg, Seed::new(7)).unwrap();
        LanguageModel::load(&path).unwrap()
    }

    /// The log-likelihood of `continuation` after `context`, one forward pass over the whole
    /// sequence: what a per-option scorer without a shared prefix computes.
    fn direct(model: &LanguageModel, context: &[u32], continuation: &[u32]) -> f64 {
        let whole: Vec<u32> = context.iter().chain(continuation).copied().collect();
        let (_, lps) = model.llama.prefill(&whole).unwrap();
        lps[context.len() - 1..].iter().map(|&x| f64::from(x)).sum()
    }

    #[test]
    fn batched_scores_equal_one_pass_per_option_and_picks_follow_them() {
        let dir = tempfile::tempdir().unwrap();
        let model = tiny_model(dir.path());
        let scorer = ChoiceScorer::new(&model).unwrap();
        let options: Vec<String> = [
            "walks the dog.",
            "eats the whole thing in one bite, then leaves.",
            "a",
            "then the man in the red hat sits down.",
        ]
        .map(String::from)
        .to_vec();
        let questions = [
            ChoiceQuestion {
                context: "A man is seen in a park. He",
                options: &options,
            },
            ChoiceQuestion {
                context: "The girl ends her routine ",
                options: &options,
            },
        ];
        let all = scorer.score_all(&questions, &|| ()).unwrap();
        for (q, scores) in questions.iter().zip(&all) {
            for (o, option) in options.iter().enumerate() {
                let (ctx, cont) = scorer
                    .encode_pair(q.context, &format!(" {option}"))
                    .unwrap();
                let want = direct(&model, &ctx, &cont);
                let got = scores.loglikelihood[o];
                assert!(
                    (got - want).abs() < 1e-3 * want.abs().max(1.0),
                    "{got} vs {want}"
                );
                assert_eq!(scores.chars[o], option.chars().count());
            }
            let ll = &scores.loglikelihood;
            assert!(ll.iter().all(|&x| x <= ll[scores.pick()]));
            let norm: Vec<f64> = ll
                .iter()
                .zip(&scores.chars)
                .map(|(l, &n)| l / n as f64)
                .collect();
            assert!(norm.iter().all(|&x| x <= norm[scores.pick_per_char()]));
        }
        // The context's trailing space is the continuation's first character, as in the harness.
        let (ctx, cont) = scorer.encode_pair("ends her routine ", " x").unwrap();
        assert_eq!(ctx, model.tokenizer.encode("ends her routine").unwrap());
        let whole = model.tokenizer.encode("ends her routine  x").unwrap();
        assert_eq!(cont, whole[ctx.len()..]);
    }

    #[test]
    fn ties_go_to_the_first_option() {
        let scores = OptionScores {
            loglikelihood: vec![-2.0, -1.0, -1.0, -4.0],
            chars: vec![1, 1, 2, 8],
            tokens: vec![1, 1, 1, 3],
        };
        assert_eq!(scores.pick(), 1);
        assert_eq!(scores.pick_per_char(), 2);
        let equal = OptionScores {
            loglikelihood: vec![-3.0; 4],
            chars: vec![3; 4],
            tokens: vec![1; 4],
        };
        assert_eq!((equal.pick(), equal.pick_per_char()), (0, 0));
    }
}
