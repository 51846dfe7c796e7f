//! Scores of pool endings from further language models (`afkit filter --scorer MODEL`), kept per
//! ending and model (the GGUF file's SHA-256): scored once, read by every later AF run, and an
//! interrupted scoring resumes at the first context with an ending left to score.

use anyhow::Result;
use rusqlite::{params, OptionalExtension, TransactionBehavior};

use super::Store;

/// One ending as a scorer model reads it: summed log-likelihood of its tokens after the context,
/// and how many tokens it has.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScorerScore {
    pub ll_cond: f64,
    /// The same after the document start alone, in readings stored by an afkit that still took
    /// it (`None` in every reading made now).
    pub ll_alone: Option<f64>,
    pub n_tok: usize,
}

/// Endings a language model has yet to read, each read once per model and stored: by a scorer
/// model (here) or by the fluency reader for an AF run's floor (`fluency_scores`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unread<'a> {
    /// Every pool ending (found or generated) without a score from the scorer model keyed
    /// `model`.
    Scorer { model: &'a str },
    /// AF run `run_id`'s found endings and assigned negatives the fluency reader keyed `model`
    /// has not read.
    Fluency { run_id: i64, model: &'a str },
}

/// A context with the endings a model has yet to read.
#[derive(Debug, Clone, PartialEq)]
pub struct UnreadContext {
    pub example_id: i64,
    pub sent1: String,
    pub sent2: String,
    /// (ending id, text), in id order.
    pub endings: Vec<(i64, String)>,
}

/// Endings of pools without a score from the model named `?1`.
const UNSCORED: &str = "e.example_id IN (SELECT example_id FROM pools)
    AND NOT EXISTS (SELECT 1 FROM scorer_scores s WHERE s.ending_id = e.id AND s.model = ?1)";

impl Store {
    /// How many endings `unread` names.
    pub fn count_unread(&self, unread: Unread<'_>) -> Result<usize> {
        match unread {
            Unread::Scorer { model } => self.count_unscored(model),
            Unread::Fluency { run_id, model } => self.count_unread_for_fluency(run_id, model),
        }
    }

    /// The first `limit` contexts (in example order) with endings `unread` names, each with
    /// those endings.
    pub fn unread_contexts(&self, unread: Unread<'_>, limit: usize) -> Result<Vec<UnreadContext>> {
        match unread {
            Unread::Scorer { model } => self.contexts_without_scorer_scores(model, limit),
            Unread::Fluency { run_id, model } => {
                self.contexts_unread_for_fluency(run_id, model, limit)
            }
        }
    }

    /// How many pool endings have no score from `model` yet.
    fn count_unscored(&self, model: &str) -> Result<usize> {
        let n: i64 = self.conn.query_row(
            &format!("SELECT COUNT(*) FROM endings e WHERE {UNSCORED}"),
            [model],
            |r| r.get(0),
        )?;
        Ok(n as usize)
    }

    /// The first `limit` contexts (in example order) with pool endings `model` has not scored,
    /// each with those endings.
    fn contexts_without_scorer_scores(
        &self,
        model: &str,
        limit: usize,
    ) -> Result<Vec<UnreadContext>> {
        let mut ids_stmt = self.conn.prepare(&format!(
            "SELECT DISTINCT e.example_id FROM endings e WHERE {UNSCORED}
             ORDER BY e.example_id LIMIT ?2"
        ))?;
        let ids: Vec<i64> = ids_stmt
            .query_map(params![model, limit as i64], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let mut endings_stmt = self.conn.prepare(&format!(
            "SELECT e.id, e.text FROM endings e WHERE e.example_id = ?2 AND {UNSCORED}
             ORDER BY e.id"
        ))?;
        let mut contexts = Vec::with_capacity(ids.len());
        for example_id in ids {
            let (sent1, sent2) = self.conn.query_row(
                "SELECT sent1, sent2 FROM examples WHERE id = ?1",
                [example_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            let endings = endings_stmt
                .query_map(params![model, example_id], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            contexts.push(UnreadContext {
                example_id,
                sent1,
                sent2,
                endings,
            });
        }
        Ok(contexts)
    }

    /// Stores scores made by `model`, in one transaction.
    pub fn put_scorer_scores(&mut self, model: &str, rows: &[(i64, ScorerScore)]) -> Result<()> {
        let tx = self.begin(TransactionBehavior::Immediate)?;
        {
            let mut stmt = tx.prepare(
                "INSERT OR REPLACE INTO scorer_scores(ending_id, model, ll_cond, ll_alone, n_tok)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for (id, s) in rows {
                stmt.execute(params![id, model, s.ll_cond, s.ll_alone, s.n_tok as i64])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// The stored score of an ending from `model`, if any.
    pub(crate) fn scorer_score(&self, model: &str, ending_id: i64) -> Result<Option<ScorerScore>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT ll_cond, ll_alone, n_tok FROM scorer_scores WHERE ending_id = ?1 AND model = ?2",
        )?;
        Ok(stmt
            .query_row(params![ending_id, model], |r| {
                Ok(ScorerScore {
                    ll_cond: r.get(0)?,
                    ll_alone: r.get(1)?,
                    n_tok: r.get::<_, i64>(2)? as usize,
                })
            })
            .optional()?)
    }
}
