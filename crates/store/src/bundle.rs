//! What a pool bundle (`afkit pool export` / `afkit pool import`) reads from and writes to
//! generate's tables: the generation jobs, each context's pool row, its endings with their LM
//! features and scorer scores, its growth rounds and the generation jobs that could not use it,
//! all as stored (project ids included; the stage turns them into the bundle's own keys).

use anyhow::{bail, Result};
use rusqlite::{params, OptionalExtension};

use super::Store;

/// A `generations` row as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRow {
    pub id: i64,
    pub backend: String,
    pub model: String,
    pub model_sha256: Option<String>,
    pub prompt: String,
    pub params: String,
    pub seed: i64,
    pub started_at: String,
}

/// A `pools` row as stored (`style_examples` the JSON array of example ids).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolRow {
    pub generation_id: i64,
    pub requested: i64,
    pub produced: i64,
    pub ctx_logprob: Option<f64>,
    pub n_tok_sent1: Option<i64>,
    pub n_tok_sent2: Option<i64>,
    pub seconds: f64,
    pub finished_at: String,
    pub style_examples: Option<String>,
    pub draws: Option<i64>,
    pub rejected: Option<String>,
}

/// One score of an ending by a scorer model (the model's SHA-256).
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreRow {
    pub model: String,
    pub ll_cond: f64,
    pub ll_alone: f64,
    pub n_tok: i64,
}

/// An `endings` row with its scorer scores (by model).
#[derive(Debug, Clone, PartialEq)]
pub struct EndingRow {
    pub is_gold: bool,
    pub text: String,
    pub generation_id: Option<i64>,
    pub lp_cond: Option<f64>,
    pub lp_alone: Option<f64>,
    pub lp_final_punct: Option<f64>,
    pub n_tok_ending: Option<i64>,
    pub scores: Vec<ScoreRow>,
}

/// A `pool_growth` row; `af_run` is the AF run's id where the pool was grown (`af_run_id`, or
/// `bundle_af_run` for a pool imported from a bundle).
#[derive(Debug, Clone, PartialEq)]
pub struct GrowthRow {
    pub af_run: i64,
    pub generation_id: i64,
    pub requested: i64,
    pub produced: i64,
    pub draws: i64,
    pub rejected: String,
    pub seconds: f64,
    pub finished_at: String,
}

/// An `unusable_contexts` row.
#[derive(Debug, Clone, PartialEq)]
pub struct UnusableRow {
    pub generation_id: i64,
    pub reason: String,
    pub recorded_at: String,
}

/// Everything generate stored for one context: its pool (if it has one), its endings (the found
/// one first, then the candidates in the order they were stored), growth rounds and unusable
/// records.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ContextRows {
    pub pool: Option<PoolRow>,
    pub endings: Vec<EndingRow>,
    pub growth: Vec<GrowthRow>,
    pub unusable: Vec<UnusableRow>,
}

/// Contexts that have a pool or an unusable record.
const IN_A_BUNDLE: &str = "(x.id IN (SELECT example_id FROM pools)
                            OR x.id IN (SELECT example_id FROM unusable_contexts))";

impl Store {
    /// The ids of the contexts a bundle holds (with a pool or an unusable record), in id order.
    pub fn bundle_context_ids(&self) -> Result<Vec<i64>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT x.id FROM examples x WHERE {IN_A_BUNDLE} ORDER BY x.id"
        ))?;
        let ids = stmt
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(ids)
    }

    /// The generation jobs that a bundle's contexts name, in id order.
    pub fn bundle_generations(&self) -> Result<Vec<GenerationRow>> {
        let mut stmt = self.conn.prepare(
            "SELECT id, backend, model, model_sha256, prompt, params, seed, started_at
             FROM generations WHERE id IN (
                 SELECT generation_id FROM pools
                 UNION SELECT generation_id FROM endings
                       WHERE example_id IN (SELECT example_id FROM pools)
                 UNION SELECT generation_id FROM pool_growth
                 UNION SELECT generation_id FROM unusable_contexts)
             ORDER BY id",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(GenerationRow {
                id: r.get(0)?,
                backend: r.get(1)?,
                model: r.get(2)?,
                model_sha256: r.get(3)?,
                prompt: r.get(4)?,
                params: r.get(5)?,
                seed: r.get(6)?,
                started_at: r.get(7)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The scorer models (SHA-256) that scored an ending of a pool, sorted.
    pub fn bundle_scorer_models(&self) -> Result<Vec<String>> {
        let mut stmt = self.conn.prepare(
            "SELECT DISTINCT s.model FROM scorer_scores s JOIN endings e ON e.id = s.ending_id
             WHERE e.example_id IN (SELECT example_id FROM pools) ORDER BY s.model",
        )?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Everything generate stored for one context.
    pub fn bundle_context(&self, example_id: i64) -> Result<ContextRows> {
        let pool = self.bundle_pool(example_id)?;
        let endings = if pool.is_some() {
            self.bundle_endings(example_id)?
        } else {
            Vec::new()
        };
        Ok(ContextRows {
            pool,
            endings,
            growth: self.bundle_growth(example_id)?,
            unusable: self.bundle_unusable(example_id)?,
        })
    }

    fn bundle_pool(&self, example_id: i64) -> Result<Option<PoolRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT generation_id, requested, produced, ctx_logprob, n_tok_sent1, n_tok_sent2,
                    seconds, finished_at, style_examples, draws, rejected
             FROM pools WHERE example_id = ?1",
        )?;
        let pool = stmt
            .query_row([example_id], |r| {
                Ok(PoolRow {
                    generation_id: r.get(0)?,
                    requested: r.get(1)?,
                    produced: r.get(2)?,
                    ctx_logprob: r.get(3)?,
                    n_tok_sent1: r.get(4)?,
                    n_tok_sent2: r.get(5)?,
                    seconds: r.get(6)?,
                    finished_at: r.get(7)?,
                    style_examples: r.get(8)?,
                    draws: r.get(9)?,
                    rejected: r.get(10)?,
                })
            })
            .optional()?;
        Ok(pool)
    }

    fn bundle_endings(&self, example_id: i64) -> Result<Vec<EndingRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, is_gold, text, generation_id, lp_cond, lp_alone, lp_final_punct,
                    n_tok_ending
             FROM endings WHERE example_id = ?1 ORDER BY is_gold DESC, id",
        )?;
        let rows = stmt
            .query_map([example_id], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    EndingRow {
                        is_gold: r.get(1)?,
                        text: r.get(2)?,
                        generation_id: r.get(3)?,
                        lp_cond: r.get(4)?,
                        lp_alone: r.get(5)?,
                        lp_final_punct: r.get(6)?,
                        n_tok_ending: r.get(7)?,
                        scores: Vec::new(),
                    },
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let mut scores = self.conn.prepare_cached(
            "SELECT model, ll_cond, ll_alone, n_tok FROM scorer_scores WHERE ending_id = ?1
             ORDER BY model",
        )?;
        rows.into_iter()
            .map(|(id, mut ending)| {
                ending.scores = scores
                    .query_map([id], |r| {
                        Ok(ScoreRow {
                            model: r.get(0)?,
                            ll_cond: r.get(1)?,
                            ll_alone: r.get(2)?,
                            n_tok: r.get(3)?,
                        })
                    })?
                    .collect::<rusqlite::Result<_>>()?;
                Ok(ending)
            })
            .collect()
    }

    fn bundle_growth(&self, example_id: i64) -> Result<Vec<GrowthRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT COALESCE(af_run_id, bundle_af_run), generation_id, requested, produced, draws,
                    rejected, seconds, finished_at
             FROM pool_growth WHERE example_id = ?1 ORDER BY rowid",
        )?;
        let rows = stmt.query_map([example_id], |r| {
            Ok(GrowthRow {
                af_run: r.get(0)?,
                generation_id: r.get(1)?,
                requested: r.get(2)?,
                produced: r.get(3)?,
                draws: r.get(4)?,
                rejected: r.get(5)?,
                seconds: r.get(6)?,
                finished_at: r.get(7)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn bundle_unusable(&self, example_id: i64) -> Result<Vec<UnusableRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT generation_id, reason, recorded_at FROM unusable_contexts
             WHERE example_id = ?1 ORDER BY generation_id",
        )?;
        let rows = stmt.query_map([example_id], |r| {
            Ok(UnusableRow {
                generation_id: r.get(0)?,
                reason: r.get(1)?,
                recorded_at: r.get(2)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The id of a generation job identical to `g` in every column (its start time too), or of a
    /// new row holding it.
    pub fn find_or_insert_bundle_generation(&self, g: &GenerationRow) -> Result<i64> {
        let existing: Option<i64> = self
            .conn
            .query_row(
                "SELECT id FROM generations WHERE backend = ?1 AND model = ?2
                   AND model_sha256 IS ?3 AND prompt = ?4 AND params = ?5 AND seed = ?6
                   AND started_at = ?7 ORDER BY id LIMIT 1",
                params![
                    g.backend,
                    g.model,
                    g.model_sha256,
                    g.prompt,
                    g.params,
                    g.seed,
                    g.started_at
                ],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(id) = existing {
            return Ok(id);
        }
        self.conn.execute(
            "INSERT INTO generations(backend, model, model_sha256, prompt, params, seed, started_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                g.backend,
                g.model,
                g.model_sha256,
                g.prompt,
                g.params,
                g.seed,
                g.started_at
            ],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Writes a context's rows from a bundle (generation ids already this project's): the found
    /// ending's features and scores, the candidates with theirs, the pool row, growth rounds
    /// (under `bundle_af_run`) and unusable records (kept if already recorded). Call it inside
    /// [`Store::write_transaction`], after checking that the context has no pool.
    pub fn write_bundle_context(&self, example_id: i64, rows: &ContextRows) -> Result<()> {
        for ending in &rows.endings {
            let ending_id = self.write_bundle_ending(example_id, ending)?;
            let mut insert = self.conn.prepare_cached(
                "INSERT INTO scorer_scores(ending_id, model, ll_cond, ll_alone, n_tok)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for s in &ending.scores {
                insert.execute(params![ending_id, s.model, s.ll_cond, s.ll_alone, s.n_tok])?;
            }
        }
        if let Some(p) = &rows.pool {
            self.conn.execute(
                "INSERT INTO pools(example_id, generation_id, requested, produced, ctx_logprob,
                                   n_tok_sent1, n_tok_sent2, seconds, finished_at, style_examples,
                                   draws, rejected)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                params![
                    example_id,
                    p.generation_id,
                    p.requested,
                    p.produced,
                    p.ctx_logprob,
                    p.n_tok_sent1,
                    p.n_tok_sent2,
                    p.seconds,
                    p.finished_at,
                    p.style_examples,
                    p.draws,
                    p.rejected
                ],
            )?;
        }
        self.write_bundle_growth(example_id, rows)
    }

    /// The found ending's features (its row exists since ingest), or a new candidate; its id.
    fn write_bundle_ending(&self, example_id: i64, e: &EndingRow) -> Result<i64> {
        if e.is_gold {
            let id: i64 = self.conn.query_row(
                "UPDATE endings SET lp_cond = ?2, lp_alone = ?3, lp_final_punct = ?4,
                                    n_tok_ending = ?5
                 WHERE example_id = ?1 AND is_gold = 1 RETURNING id",
                params![
                    example_id,
                    e.lp_cond,
                    e.lp_alone,
                    e.lp_final_punct,
                    e.n_tok_ending
                ],
                |r| r.get(0),
            )?;
            return Ok(id);
        }
        let mut insert = self.conn.prepare_cached(
            "INSERT INTO endings(example_id, text, is_gold, generation_id, lp_cond, lp_alone,
                                 lp_final_punct, n_tok_ending)
             VALUES (?1, ?2, 0, ?3, ?4, ?5, ?6, ?7)",
        )?;
        insert.execute(params![
            example_id,
            e.text,
            e.generation_id,
            e.lp_cond,
            e.lp_alone,
            e.lp_final_punct,
            e.n_tok_ending
        ])?;
        Ok(self.conn.last_insert_rowid())
    }

    fn write_bundle_growth(&self, example_id: i64, rows: &ContextRows) -> Result<()> {
        for g in &rows.growth {
            self.conn.execute(
                "INSERT INTO pool_growth(example_id, bundle_af_run, generation_id, requested,
                                         produced, draws, rejected, seconds, finished_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    example_id,
                    g.af_run,
                    g.generation_id,
                    g.requested,
                    g.produced,
                    g.draws,
                    g.rejected,
                    g.seconds,
                    g.finished_at
                ],
            )?;
        }
        for u in &rows.unusable {
            self.conn.execute(
                "INSERT OR IGNORE INTO unusable_contexts(example_id, generation_id, reason,
                                                         recorded_at)
                 VALUES (?1, ?2, ?3, ?4)",
                params![example_id, u.generation_id, u.reason, u.recorded_at],
            )?;
        }
        Ok(())
    }

    /// The ext ids of examples by id, in the order asked; fails on an id that is not stored.
    pub fn ext_ids_of(&self, ids: &[i64]) -> Result<Vec<String>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT ext_id FROM examples WHERE id = ?1")?;
        ids.iter()
            .map(|&id| match stmt.query_row([id], |r| r.get(0)).optional()? {
                Some(ext) => Ok(ext),
                None => bail!("example {id} named by a pool is not in the project"),
            })
            .collect()
    }
}
