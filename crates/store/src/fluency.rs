//! The fluency floor's data: each reader model's log-likelihood of the endings it read (found
//! endings and an AF run's assigned negatives, after their context), and per AF run the floor
//! it was given. Kept per ending and model, so a resumed `filter` reads only what is missing and
//! another quantile needs no reading at all.

use std::collections::HashSet;

use anyhow::Result;
use rusqlite::{params, OptionalExtension, TransactionBehavior};

use super::scorer::UnreadContext;
use super::Store;

/// The floor an AF run's negatives were held to.
#[derive(Debug, Clone, PartialEq)]
pub struct FluencyFloor {
    /// The reader's name as the user gave it.
    pub reader: String,
    /// SHA-256 of the reader's GGUF file.
    pub model: String,
    /// Share of the found endings allowed under the floor.
    pub quantile: f64,
    /// Per-token log-likelihood under which a negative is refused.
    pub threshold: f64,
}

/// What a reader model gave an AF run's endings, per token, each in ending order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FluencyReadings {
    /// The found endings of the run's contexts.
    pub found: Vec<f64>,
    /// The assigned negatives, with their ids.
    pub negatives: Vec<(i64, f64)>,
}

/// Every ending an AF run's floor reads: the found ending and the assigned negatives of each of
/// its contexts (`?1` the run), without a score from the model named `?2`.
const UNREAD: &str = "e.example_id IN (SELECT example_id FROM af_assignments WHERE run_id = ?1)
    AND (e.is_gold = 1 OR e.id IN (SELECT ending_id FROM af_assignments WHERE run_id = ?1))
    AND NOT EXISTS (SELECT 1 FROM fluency_scores f WHERE f.ending_id = e.id AND f.model = ?2)";

impl Store {
    /// How many of AF run `run_id`'s found endings and assigned negatives `model` has not read.
    pub(crate) fn count_unread_for_fluency(&self, run_id: i64, model: &str) -> Result<usize> {
        let n: i64 = self.conn.query_row(
            &format!("SELECT COUNT(*) FROM endings e WHERE {UNREAD}"),
            params![run_id, model],
            |r| r.get(0),
        )?;
        Ok(n as usize)
    }

    /// The first `limit` contexts (in example order) of AF run `run_id` with endings `model` has
    /// not read for the fluency floor, each with those endings.
    pub(crate) fn contexts_unread_for_fluency(
        &self,
        run_id: i64,
        model: &str,
        limit: usize,
    ) -> Result<Vec<UnreadContext>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT e.example_id, e.id, e.text FROM endings e
             WHERE e.example_id IN (
                 SELECT DISTINCT e.example_id FROM endings e WHERE {UNREAD}
                 ORDER BY e.example_id LIMIT ?3)
               AND {UNREAD}
             ORDER BY e.example_id, e.id"
        ))?;
        let rows = stmt.query_map(params![run_id, model, limit as i64], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?;
        let mut contexts: Vec<UnreadContext> = Vec::new();
        for row in rows {
            let (example_id, ending_id, text) = row?;
            if contexts.last().map(|c| c.example_id) != Some(example_id) {
                let (sent1, sent2) = self.conn.query_row(
                    "SELECT sent1, sent2 FROM examples WHERE id = ?1",
                    [example_id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?;
                contexts.push(UnreadContext {
                    example_id,
                    sent1,
                    sent2,
                    endings: Vec::new(),
                });
            }
            contexts
                .last_mut()
                .expect("pushed above")
                .endings
                .push((ending_id, text));
        }
        Ok(contexts)
    }

    /// Stores what `model` read: (ending id, summed log-likelihood, tokens), in one transaction.
    pub fn put_fluency_scores(&mut self, model: &str, rows: &[(i64, f64, usize)]) -> Result<()> {
        let tx = self.begin(TransactionBehavior::Immediate)?;
        {
            let mut stmt = tx.prepare(
                "INSERT OR REPLACE INTO fluency_scores(ending_id, model, ll_cond, n_tok)
                 VALUES (?1, ?2, ?3, ?4)",
            )?;
            for (id, ll, n_tok) in rows {
                stmt.execute(params![id, model, ll, *n_tok as i64])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Per-token log-likelihoods `model` gave AF run `run_id`'s found endings and its assigned
    /// negatives. Endings of no tokens are left out.
    pub fn fluency_per_token(&self, run_id: i64, model: &str) -> Result<FluencyReadings> {
        let mut stmt = self.conn.prepare(
            "SELECT e.id, e.is_gold, f.ll_cond / f.n_tok FROM fluency_scores f
             JOIN endings e ON e.id = f.ending_id
             WHERE f.model = ?2 AND f.n_tok > 0 AND e.example_id IN
                 (SELECT example_id FROM af_assignments WHERE run_id = ?1)
               AND (e.is_gold = 1 OR e.id IN
                 (SELECT ending_id FROM af_assignments WHERE run_id = ?1))
             ORDER BY e.id",
        )?;
        let mut readings = FluencyReadings::default();
        let rows = stmt.query_map(params![run_id, model], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, bool>(1)?,
                r.get::<_, f64>(2)?,
            ))
        })?;
        for row in rows {
            match row? {
                (_, true, value) => readings.found.push(value),
                (id, false, value) => readings.negatives.push((id, value)),
            }
        }
        Ok(readings)
    }

    /// Records (or replaces) the floor of AF run `run_id`; `None` forgets it, so that its
    /// negatives are all taken as they are.
    pub fn set_fluency_floor(&mut self, run_id: i64, floor: Option<&FluencyFloor>) -> Result<()> {
        match floor {
            Some(floor) => self.conn.execute(
                "INSERT OR REPLACE INTO af_fluency(run_id, reader, model, quantile, threshold)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    run_id,
                    floor.reader,
                    floor.model,
                    floor.quantile,
                    floor.threshold
                ],
            )?,
            None => self
                .conn
                .execute("DELETE FROM af_fluency WHERE run_id = ?1", [run_id])?,
        };
        Ok(())
    }

    /// The floor of AF run `run_id`, if it was given one.
    pub(crate) fn fluency_floor(&self, run_id: i64) -> Result<Option<FluencyFloor>> {
        Ok(self
            .conn
            .query_row(
                "SELECT reader, model, quantile, threshold FROM af_fluency WHERE run_id = ?1",
                [run_id],
                |r| {
                    Ok(FluencyFloor {
                        reader: r.get(0)?,
                        model: r.get(1)?,
                        quantile: r.get(2)?,
                        threshold: r.get(3)?,
                    })
                },
            )
            .optional()?)
    }

    /// The assigned negatives of AF run `run_id` under its floor (none without a floor).
    pub(crate) fn refused_by_fluency_floor(&self, run_id: i64) -> Result<HashSet<i64>> {
        let Some(floor) = self.fluency_floor(run_id)? else {
            return Ok(HashSet::new());
        };
        Ok(self
            .fluency_per_token(run_id, &floor.model)?
            .negatives
            .into_iter()
            .filter(|&(_, value)| value < floor.threshold)
            .map(|(id, _)| id)
            .collect())
    }
}
