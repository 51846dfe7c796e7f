//! What an audit found: the train → val report, the cross-validated one, and the rows the
//! verdicts read from either.

use serde::Serialize;

use super::timing::Timing;
use super::{cv, dataset, knn, lm, ppmi, verdict};
use afkit_engine::seed::Seed;

/// KNN result, or why it was not measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(untagged)]
pub enum Knn {
    Measured(knn::KnnReport),
    Skipped { skipped: String },
}

/// How many of the audited questions the export flags as possibly having a second right answer
/// (afkit's `could-be-right` column): measured only when every question carries the flag.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct CouldBeRight {
    pub flagged: usize,
    pub questions: usize,
    /// `flagged / questions`.
    pub share: f64,
}

impl CouldBeRight {
    /// The flagged share of `questions`; `None` when one lacks the flag (or there are none).
    pub(crate) fn of<'a>(
        questions: impl IntoIterator<Item = &'a dataset::Question>,
    ) -> Option<Self> {
        let (mut flagged, mut n) = (0, 0);
        for q in questions {
            flagged += usize::from(q.could_be_right?);
            n += 1;
        }
        (n > 0).then(|| CouldBeRight {
            flagged,
            questions: n,
            share: flagged as f64 / n as f64,
        })
    }

    /// The report's line on it.
    pub fn sentence(&self) -> String {
        format!(
            "{} of {} questions ({:.1}%) are flagged could-be-right by the export: a distractor \
             that a language model finds as likely as the real ending, or that restates it, may be \
             a second right answer",
            self.flagged,
            self.questions,
            100.0 * self.share
        )
    }
}

/// What every audit reports beside its baselines, whichever way it measured them.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Findings {
    /// Zero-shot accuracies of the `--lm` models, with the context and without.
    pub lm: Vec<lm::LmResult>,
    /// Every measured row, with the control's beside it.
    pub summary: Vec<verdict::Row>,
    pub verdicts: Vec<verdict::Verdict>,
    /// Seconds per family and per `--lm` model (`lm:NAME`), in the order they ran.
    pub timings: Vec<Timing>,
    /// The flagged share of the questions, when the export carries the flag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub could_be_right: Option<CouldBeRight>,
}

/// The audit's findings; `--json` prints this (accuracies are fractions).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AuditReport {
    pub n_train: usize,
    pub n_val: usize,
    pub seed: Seed,
    pub random: f64,
    pub shortest: f64,
    pub longest: f64,
    pub ngram_end: f64,
    pub ngram_s2: f64,
    pub ngram_ctx: f64,
    /// Regularisation strengths chosen for ngram_end, ngram_s2, ngram_ctx.
    pub lambda: [f64; 3],
    pub ppmi: Vec<ppmi::Association>,
    pub knn: Knn,
    /// On val (the flagged share: on train and val; the timings: per baseline family —
    /// `length`, `ngram_end`, ..., `knn` — and per `--lm` model). The summary's rows leave out
    /// random and carry a proportion's standard error.
    #[serde(flatten)]
    pub findings: Findings,
    /// The control dataset's audit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control: Option<Box<AuditReport>>,
}

impl AuditReport {
    pub(crate) fn accuracies(&self) -> [(&'static str, f64); 6] {
        [
            ("random", self.random),
            ("shortest", self.shortest),
            ("longest", self.longest),
            ("ngram_end", self.ngram_end),
            ("ngram_s2", self.ngram_s2),
            ("ngram_ctx", self.ngram_ctx),
        ]
    }

    /// The rows the verdicts read: every measured baseline but random, with the standard error
    /// of a proportion over the val questions, and the language models'.
    pub(super) fn rows(&self) -> Vec<verdict::Row> {
        let se = |p: f64| lm::proportion_se(p, self.n_val);
        let mut rows: Vec<verdict::Row> = self
            .accuracies()
            .into_iter()
            .filter(|(name, _)| *name != "random")
            .map(|(name, p)| verdict::Row::new(name, p, se(p)))
            .collect();
        rows.extend(lm_rows(&self.findings.lm));
        rows
    }
}

/// A row per measured baseline. Its se is that of its fold means, but never below a
/// proportion's at chance over all the questions (a few folds that happen to agree, two folds at
/// 0.125 on 16 questions, would otherwise claim a precision the questions cannot give), nor below
/// the scatter of its relabelled copies (what the same baseline reaches on a benchmark of this
/// size with nothing to find).
pub(crate) fn baseline_rows(cv: &cv::CvReport) -> Vec<verdict::Row> {
    let floor = lm::proportion_se(verdict::CHANCE, cv.questions);
    cv.baselines
        .iter()
        .filter_map(|(b, result)| match result {
            cv::CvResult::Measured {
                mean, se, chance, ..
            } => {
                let scatter = chance.as_ref().map_or(0.0, |c| c.sd);
                Some(verdict::Row::new(
                    b.name(),
                    *mean,
                    se.max(floor).max(scatter),
                ))
            }
            cv::CvResult::Skipped { .. } => None,
        })
        .collect()
}

/// Four rows per language model: `lm:MODEL:acc` and `lm:MODEL:acc_norm`, then the same with the
/// context removed (`acc_no_context`, `acc_norm_no_context`).
fn lm_rows(results: &[lm::LmResult]) -> Vec<verdict::Row> {
    results
        .iter()
        .flat_map(|r| {
            let name = |metric: &str| format!("{}{}:{metric}", verdict::LM_PREFIX, r.model);
            let alone = |metric: &str| name(&format!("{metric}{}", verdict::NO_CONTEXT_SUFFIX));
            [
                verdict::Row::new(name("acc"), r.acc, r.acc_se),
                verdict::Row::new(name("acc_norm"), r.acc_norm, r.acc_norm_se),
                verdict::Row::new(alone("acc"), r.acc_no_context, r.acc_no_context_se),
                verdict::Row::new(
                    alone("acc_norm"),
                    r.acc_norm_no_context,
                    r.acc_norm_no_context_se,
                ),
            ]
        })
        .collect()
}

/// What an audit found: the train → val report, or the cross-validated one (`--json` prints
/// either as it is).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Summary {
    Holdout(AuditReport),
    CrossValidated(CvAudit),
}

/// The cross-validated audit; `--cv K --json` prints this.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CvAudit {
    pub cv: cv::CvReport,
    /// The split files and how many questions each gave to the pool.
    pub files: Vec<dataset::PooledFile>,
    /// PPMI word-label associations over the pooled questions.
    pub ppmi: Vec<ppmi::Association>,
    /// On every pooled question (the timings: per baseline — its features, then its fits summed
    /// over the folds, which run in parallel —, then `ppmi` and each `--lm` model).
    #[serde(flatten)]
    pub findings: Findings,
    /// The control dataset's audit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control: Option<Box<CvAudit>>,
}

impl CvAudit {
    /// The rows the verdicts read: every measured baseline ([`baseline_rows`]) and the
    /// language models'.
    pub(super) fn rows(&self) -> Vec<verdict::Row> {
        let mut rows = baseline_rows(&self.cv);
        rows.extend(lm_rows(&self.findings.lm));
        rows
    }
}
