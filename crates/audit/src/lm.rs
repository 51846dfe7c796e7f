//! Zero-shot accuracy of language models on the audited questions (`--lm MODEL`): how often a
//! model that was never trained on the benchmark gives the real ending the highest likelihood.
//! Each question is posed as lm-evaluation-harness poses the export's SWAG-style task (the
//! startphrase, sent1 + " " + sent2, then each ending after a space; `lm::choice`), so `acc`
//! and `acc_norm` here are the harness's for the same model and questions.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;

use super::dataset::Question;
use afkit_engine::lm::choice::{ChoiceQuestion, ChoiceScorer, OptionScores};
use afkit_engine::lm::model::LanguageModel;
use afkit_store::dataset::startphrase;

/// A model to audit with: the name the user gave and the GGUF file it resolves to.
#[derive(Debug, Clone)]
pub struct LmSpec {
    pub name: String,
    pub path: PathBuf,
}

/// One model's zero-shot accuracies over the audited questions.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LmResult {
    /// The `--lm` value.
    pub model: String,
    /// The GGUF file it ran.
    pub file: String,
    pub questions: usize,
    /// Share of questions whose real ending has the highest log-likelihood.
    pub acc: f64,
    /// Standard error of `acc` as the harness gives it: √(p(1 − p) / (n − 1)).
    pub acc_se: f64,
    /// The same with the log-likelihood divided by the ending's length in characters.
    pub acc_norm: f64,
    pub acc_norm_se: f64,
    /// The same two with the context removed (each ending read after nothing): far above
    /// chance, the endings alone give the answer away.
    pub acc_no_context: f64,
    pub acc_no_context_se: f64,
    pub acc_norm_no_context: f64,
    pub acc_norm_no_context_se: f64,
    /// Wall time of the scoring, the model's loading included.
    pub seconds: f64,
}

/// Standard error of a mean of 0/1 outcomes as lm-evaluation-harness reports it: the sample
/// standard deviation over √n.
pub(crate) fn proportion_se(p: f64, n: usize) -> f64 {
    if n < 2 {
        return 0.0;
    }
    let n = n as f64;
    (p * (1.0 - p) * n / (n - 1.0) / n).sqrt()
}

/// What a model reads before each ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Posed {
    /// The startphrase, as the harness poses the export's SWAG-style task.
    WithContext,
    /// Nothing: the zero-prompt check of whether the endings alone give the answer away.
    EndingsAlone,
}

/// The model's scores of each question's endings, posed as `posed` says; `done` hears each
/// finished question.
pub(crate) fn score_questions(
    model: &LanguageModel,
    questions: &[Question],
    posed: Posed,
    done: &(dyn Fn() + Sync),
) -> Result<Vec<OptionScores>> {
    let contexts: Vec<String> = questions
        .iter()
        .map(|q| match posed {
            Posed::WithContext => startphrase(&q.sent1, &q.sent2),
            Posed::EndingsAlone => String::new(),
        })
        .collect();
    let posed: Vec<ChoiceQuestion> = questions
        .iter()
        .zip(&contexts)
        .map(|(q, context)| ChoiceQuestion {
            context,
            options: &q.endings,
        })
        .collect();
    ChoiceScorer::new(model)?.score_all(&posed, done)
}

/// Scores every question (all labelled) with the model, with its context and without;
/// `done` hears each finished question of each pass.
pub(crate) fn zero_shot(
    spec: &LmSpec,
    questions: &[Question],
    done: &(dyn Fn() + Sync),
) -> Result<LmResult> {
    let started = Instant::now();
    let model = LanguageModel::load(&spec.path)
        .with_context(|| format!("--lm {}: cannot load {}", spec.name, spec.path.display()))?;
    let with_context = score_questions(&model, questions, Posed::WithContext, done)?;
    let alone = score_questions(&model, questions, Posed::EndingsAlone, done)?;
    let n = questions.len();
    let share = |scores: &[OptionScores], pick: fn(&OptionScores) -> usize| -> f64 {
        let right = questions
            .iter()
            .zip(scores)
            .filter(|(q, s)| q.label == Some(pick(s)))
            .count();
        right as f64 / n.max(1) as f64
    };
    let acc = share(&with_context, OptionScores::pick);
    let acc_norm = share(&with_context, OptionScores::pick_per_char);
    let acc_no_context = share(&alone, OptionScores::pick);
    let acc_norm_no_context = share(&alone, OptionScores::pick_per_char);
    Ok(LmResult {
        model: spec.name.clone(),
        file: spec.path.display().to_string(),
        questions: n,
        acc,
        acc_se: proportion_se(acc, n),
        acc_norm,
        acc_norm_se: proportion_se(acc_norm, n),
        acc_no_context,
        acc_no_context_se: proportion_se(acc_no_context, n),
        acc_norm_no_context,
        acc_norm_no_context_se: proportion_se(acc_norm_no_context, n),
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_error_is_the_harness_sample_one() {
        // 3 right of 4: outcomes 1 1 1 0, sample variance 0.25, se = √(0.25 / 4).
        assert!((proportion_se(0.75, 4) - (0.25f64 / 4.0).sqrt()).abs() < 1e-12);
        assert_eq!(proportion_se(0.5, 1), 0.0);
    }
}
