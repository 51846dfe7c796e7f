//! "Could be right": whether a wrong answer of an unverified question may be a second plausible
//! continuation of its context, judged from what `generate` and `filter` already stored.
//!
//! AF keeps the negatives its models find as likely as the real ending, so it pushes toward
//! negatives a reader accepts as right too ("She adds shots of alcohol to the glass. She then …"
//! with the wrong answer "drinks a shot of scotch"). Without a human label nothing proves an
//! ending wrong; what this module does is name the negatives a strong reader rates as likely as
//! the found ending, so that assembly takes others first, flags a question it cannot fill
//! without one, export marks it, and annotators see such items first.
//!
//! The rule (thresholds in [`THRESHOLDS`]): a negative could be right when
//! - **likelihood**: a language model reading the context finds it at least as likely per token
//!   as the found ending: any `--scorer` model that scored both, else the generator's own
//!   log-probability (`lp_cond`) when the pool was sampled here; or
//! - **paraphrase**: its sentence vector is nearly the found ending's (cosine at or above the
//!   threshold): a restatement of the right answer is right.
//!
//! A negative with neither kind of evidence is *unjudged*, never "safe".
//!
//! The fine-tuned adversary's final score (`af_scores`) is left out on purpose: AF selects the
//! negatives that score high on it, so it rates nearly half of the assigned negatives at or
//! above the found ending, and on the labelled set below it added one catch of 15 for about 30
//! more false alarms.

use std::collections::HashMap;

use anyhow::Result;
use serde::Serialize;

use crate::risk_evidence::Evidence;
use crate::Store;

/// The rule's thresholds, in one place.
///
/// Measured on a blind reading of 100 questions (300 wrong answers, 15 of them marked "also
/// plausible" by the reader) of a 150-context project sampled by SmolLM2 with SmolLM2 as scorer:
/// a likelihood margin of 0 flags 13 of the 15 and 104 of the 285 others; a margin of 0.5 nats
/// per token flags 11 and 67, of 1.0 10 and 37. A miss costs a bad question, a false alarm one
/// candidate of the nine AF assigns, so the margin is the plain comparison "at least as likely
/// as the found ending". A cosine of 0.8 flagged one "also plausible" answer and no other (the
/// next one down, 0.7, flagged two of each).
pub(crate) struct Thresholds {
    /// A negative whose per-token log-likelihood after the context, minus the found ending's
    /// (nats per token), is at least this could be right.
    pub likelihood_margin: f64,
    /// A negative whose sentence vector's cosine with the found ending's is at least this is a
    /// paraphrase of it.
    pub paraphrase_cosine: f32,
}

/// The thresholds afkit uses (see [`Thresholds`] for how they were chosen).
pub(crate) const THRESHOLDS: Thresholds = Thresholds {
    likelihood_margin: 0.0,
    paraphrase_cosine: 0.8,
};

/// What the rule says of one negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Neither likelihood nor sentence vectors say it could be right.
    Safe,
    /// A strong reader rates it as likely as the found ending, or it restates it.
    CouldBeRight,
    /// No evidence: no likelihood of both endings from one model, no vectors of both.
    Unjudged,
}

/// What the rule finds of one negative, assessed against its context's found ending.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Assessment {
    pub verdict: Verdict,
    /// The negative's per-token log-likelihood minus the found ending's: the largest over the
    /// scorer models that scored both, else the generator's; `None` without either.
    pub margin: Option<f64>,
    /// Cosine of the two sentence vectors (from the same encoder), if both exist.
    pub cosine: Option<f32>,
}

impl Assessment {
    pub fn could_be_right(&self) -> bool {
        self.verdict == Verdict::CouldBeRight
    }

    /// How close the negative comes to being right, for ordering (higher: riskier): its margin,
    /// or how far its cosine is from the paraphrase threshold when it has no margin.
    pub fn closeness(&self) -> f64 {
        match (self.margin, self.cosine) {
            (Some(m), _) => m,
            (None, Some(c)) => f64::from(c - THRESHOLDS.paraphrase_cosine),
            (None, None) => f64::NEG_INFINITY,
        }
    }
}

/// Judges a negative against the found ending of its context.
pub(crate) fn judge(found: &Evidence, negative: &Evidence) -> Assessment {
    let scorer_margin = negative
        .scorers
        .iter()
        .filter_map(|(model, ll)| found.scorers.get(model).map(|f| ll - f))
        .reduce(f64::max);
    let margin = scorer_margin.or_else(|| Some(negative.generator? - found.generator?));
    let cosine = match (&found.vector, &negative.vector) {
        (Some((a_model, a)), Some((b_model, b))) if a_model == b_model => cosine(a, b),
        _ => None,
    };
    let right = margin.is_some_and(|m| m >= THRESHOLDS.likelihood_margin)
        || cosine.is_some_and(|c| c >= THRESHOLDS.paraphrase_cosine);
    let verdict = if right {
        Verdict::CouldBeRight
    } else if margin.is_none() && cosine.is_none() {
        Verdict::Unjudged
    } else {
        Verdict::Safe
    };
    Assessment {
        verdict,
        margin,
        cosine,
    }
}

fn cosine(a: &[f32], b: &[f32]) -> Option<f32> {
    if a.len() != b.len() || a.is_empty() {
        return None;
    }
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    let denominator = norm(a) * norm(b);
    (denominator > 0.0).then(|| dot / denominator)
}

/// Every one of `negatives` judged against `found` (the context's found ending), from the
/// project's stored evidence.
pub fn judge_context(
    store: &Store,
    found: i64,
    negatives: &[i64],
) -> Result<HashMap<i64, Assessment>> {
    let ids: Vec<i64> = std::iter::once(found)
        .chain(negatives.iter().copied())
        .collect();
    let evidence = store.risk_evidence(&ids)?;
    let none = Evidence::default();
    let found = evidence.get(&found).unwrap_or(&none);
    Ok(negatives
        .iter()
        .map(|&n| (n, judge(found, evidence.get(&n).unwrap_or(&none))))
        .collect())
}

/// Whether a question whose wrong answers are `shown` could have a second right answer: one of
/// them could be right.
pub fn question_could_be_right(store: &Store, found: i64, shown: &[i64]) -> Result<bool> {
    Ok(judge_context(store, found, shown)?
        .values()
        .any(Assessment::could_be_right))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn evidence(scorer: Option<f64>, generator: Option<f64>, vector: Option<Vec<f32>>) -> Evidence {
        Evidence {
            scorers: scorer.map(|s| ("m".to_string(), s)).into_iter().collect(),
            generator,
            vector: vector.map(|v| ("minilm".to_string(), v)),
        }
    }

    #[test]
    fn as_likely_as_the_found_ending_could_be_right() {
        let found = evidence(Some(-2.0), Some(-3.0), None);
        assert!(judge(&found, &evidence(Some(-2.0), None, None)).could_be_right());
        assert!(judge(&found, &evidence(Some(-1.0), None, None)).could_be_right());
        let less = judge(&found, &evidence(Some(-2.5), Some(-1.0), None));
        assert_eq!(
            less.verdict,
            Verdict::Safe,
            "the scorer outranks the generator"
        );
        assert_eq!(less.margin, Some(-0.5));
    }

    #[test]
    fn the_generator_judges_where_no_scorer_scored_both() {
        let found = evidence(None, Some(-3.0), None);
        assert!(judge(&found, &evidence(Some(-1.0), Some(-2.9), None)).could_be_right());
        assert_eq!(
            judge(&found, &evidence(None, Some(-3.5), None)).verdict,
            Verdict::Safe
        );
    }

    #[test]
    fn a_paraphrase_could_be_right_however_unlikely() {
        let found = evidence(Some(-1.0), None, Some(vec![1.0, 0.0]));
        let paraphrase = judge(&found, &evidence(Some(-9.0), None, Some(vec![0.9, 0.1])));
        assert!(paraphrase.could_be_right());
        let other = judge(&found, &evidence(Some(-9.0), None, Some(vec![0.0, 1.0])));
        assert_eq!(other.verdict, Verdict::Safe);
    }

    #[test]
    fn without_evidence_nothing_is_judged_safe() {
        let found = evidence(None, None, Some(vec![1.0, 0.0]));
        let j = judge(&found, &evidence(Some(-1.0), None, None));
        assert_eq!(j.verdict, Verdict::Unjudged);
        assert_eq!(j.closeness(), f64::NEG_INFINITY);
        // Vectors of different encoders are not compared.
        let mut other = evidence(None, None, Some(vec![1.0, 0.0]));
        other.vector.as_mut().unwrap().0 = "another".into();
        assert_eq!(judge(&found, &other).verdict, Verdict::Unjudged);
    }

    proptest! {
        #[test]
        fn raising_a_negatives_likelihood_never_makes_it_safer(
            found in -8.0f64..0.0, negative in -8.0f64..0.0, raise in 0.0f64..4.0,
            use_scorer in any::<bool>(),
        ) {
            let e = |v: f64| if use_scorer { evidence(Some(v), None, None) } else { evidence(None, Some(v), None) };
            let before = judge(&e(found), &e(negative));
            let after = judge(&e(found), &e(negative + raise));
            prop_assert!(after.could_be_right() || !before.could_be_right());
            prop_assert_eq!(before.could_be_right(), negative - found >= THRESHOLDS.likelihood_margin);
            prop_assert!(after.closeness() >= before.closeness());
        }

        #[test]
        fn an_ending_identical_to_the_found_one_could_be_right(
            v in prop::collection::vec(-1.0f32..1.0, 4..8), ll in -8.0f64..0.0,
        ) {
            prop_assume!(v.iter().any(|x| x.abs() > 1e-3));
            let e = evidence(Some(ll), None, Some(v));
            prop_assert!(judge(&e, &e).could_be_right());
        }
    }
}
