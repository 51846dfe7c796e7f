//! What a pool bundle (`afkit pool export` / `afkit pool import`) carries of generate's tables:
//! the generation jobs, each context's pool row, its endings with their LM features and scorer
//! scores, its growth rounds and the generation jobs that could not use it. The rows are in the
//! bundle's own terms, as the generate stage writes them into its lines: a generation job or
//! scorer model by its index in the bundle's lists, a context by its ext id. The store turns this
//! project's ids into those keys on export, and back on import.

use anyhow::{anyhow, bail, Context as _, Result};
use rusqlite::{params, OptionalExtension};
use serde::{Deserialize, Serialize};

use super::Store;

/// A generation job: its `generations` row without the project's id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleGeneration {
    pub backend: String,
    pub model: String,
    pub model_sha256: Option<String>,
    pub prompt: String,
    pub params: String,
    pub seed: i64,
    pub started_at: String,
}

/// A context's `pools` row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundlePool {
    pub generation: usize,
    pub requested: i64,
    pub produced: i64,
    pub ctx_logprob: Option<f64>,
    pub n_tok_sent1: Option<i64>,
    pub n_tok_sent2: Option<i64>,
    pub seconds: f64,
    pub finished_at: String,
    /// The ext ids of the contexts shown before this one (style priming).
    pub style_examples: Option<Vec<String>>,
    pub draws: Option<i64>,
    pub rejected: Option<String>,
}

/// A scorer model's reading of an ending: (scorer index, ll_cond, ll_alone, n_tok). `ll_alone`
/// is null in readings made since the scorer reads endings after their context only.
pub type BundleScore = (usize, f64, Option<f64>, i64);

/// An ending of a pool with its LM features and scorer scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleEnding {
    /// `None` for the found ending (its text is the corpus's).
    pub text: Option<String>,
    pub generation: Option<usize>,
    pub lp_cond: Option<f64>,
    pub lp_alone: Option<f64>,
    pub lp_final_punct: Option<f64>,
    pub n_tok: Option<i64>,
    pub scores: Vec<BundleScore>,
}

/// A `pool_growth` row; `af_run` is the AF run's id where the pool was grown (`af_run_id`, or
/// `bundle_af_run` for a pool imported from a bundle).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleGrowth {
    pub af_run: i64,
    pub generation: usize,
    pub requested: i64,
    pub produced: i64,
    pub draws: i64,
    pub rejected: String,
    pub seconds: f64,
    pub finished_at: String,
}

/// An `unusable_contexts` row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleUnusable {
    pub generation: usize,
    pub reason: String,
    pub recorded_at: String,
}

/// Everything generate stored for one context: its pool (if it has one), its endings (the found
/// one first, then the candidates in the order they were stored), growth rounds and unusable
/// records.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ContextRows {
    pub pool: Option<BundlePool>,
    pub endings: Vec<BundleEnding>,
    pub growth: Vec<BundleGrowth>,
    pub unusable: Vec<BundleUnusable>,
}

/// What a bundle of this project's pools holds: its contexts, and the lists its lines name by
/// index.
#[derive(Debug, Clone, PartialEq)]
pub struct BundleContents {
    /// The contexts with a pool or an unusable record, in id order.
    pub contexts: Vec<i64>,
    /// The generation jobs the contexts name, in id order.
    pub generations: Vec<BundleGeneration>,
    /// The scorer models (SHA-256) that scored an ending of a pool, sorted.
    pub scorers: Vec<String>,
    /// This project's ids of `generations`.
    generation_ids: Vec<i64>,
}

/// Contexts that have a pool or an unusable record.
const IN_A_BUNDLE: &str = "(x.id IN (SELECT example_id FROM pools)
                            OR x.id IN (SELECT example_id FROM unusable_contexts))";

/// Index of a stored id in the bundle's list.
fn index_of<T: PartialEq + std::fmt::Debug>(list: &[T], item: &T) -> Result<usize> {
    list.iter()
        .position(|x| x == item)
        .ok_or_else(|| anyhow!("{item:?} is not among the bundle's records"))
}

impl Store {
    /// The contexts, generation jobs and scorer models of a bundle of this project's pools.
    pub fn bundle_contents(&self) -> Result<BundleContents> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT x.id FROM examples x WHERE {IN_A_BUNDLE} ORDER BY x.id"
        ))?;
        let contexts = stmt
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let (generation_ids, generations) = self.bundle_generations()?.into_iter().unzip();
        Ok(BundleContents {
            contexts,
            generations,
            scorers: self.bundle_scorer_models()?,
            generation_ids,
        })
    }

    /// The generation jobs that a bundle's contexts name, with their ids, in id order.
    fn bundle_generations(&self) -> Result<Vec<(i64, BundleGeneration)>> {
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
            Ok((
                r.get(0)?,
                BundleGeneration {
                    backend: r.get(1)?,
                    model: r.get(2)?,
                    model_sha256: r.get(3)?,
                    prompt: r.get(4)?,
                    params: r.get(5)?,
                    seed: r.get(6)?,
                    started_at: r.get(7)?,
                },
            ))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn bundle_scorer_models(&self) -> Result<Vec<String>> {
        let mut stmt = self.conn.prepare(
            "SELECT DISTINCT s.model FROM scorer_scores s JOIN endings e ON e.id = s.ending_id
             WHERE e.example_id IN (SELECT example_id FROM pools) ORDER BY s.model",
        )?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Everything generate stored for one context of `contents`, keyed as the bundle keys it.
    pub fn bundle_context(
        &self,
        contents: &BundleContents,
        example_id: i64,
    ) -> Result<ContextRows> {
        let pool = self.bundle_pool(contents, example_id)?;
        let endings = if pool.is_some() {
            self.bundle_endings(contents, example_id)?
        } else {
            Vec::new()
        };
        Ok(ContextRows {
            pool,
            endings,
            growth: self.bundle_growth(contents, example_id)?,
            unusable: self.bundle_unusable(contents, example_id)?,
        })
    }

    fn bundle_pool(
        &self,
        contents: &BundleContents,
        example_id: i64,
    ) -> Result<Option<BundlePool>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT generation_id, requested, produced, ctx_logprob, n_tok_sent1, n_tok_sent2,
                    seconds, finished_at, style_examples, draws, rejected
             FROM pools WHERE example_id = ?1",
        )?;
        let row = stmt
            .query_row([example_id], |r| {
                let keys: (i64, Option<String>) = (r.get(0)?, r.get(8)?);
                let pool = BundlePool {
                    generation: 0,
                    requested: r.get(1)?,
                    produced: r.get(2)?,
                    ctx_logprob: r.get(3)?,
                    n_tok_sent1: r.get(4)?,
                    n_tok_sent2: r.get(5)?,
                    seconds: r.get(6)?,
                    finished_at: r.get(7)?,
                    style_examples: None,
                    draws: r.get(9)?,
                    rejected: r.get(10)?,
                };
                Ok((keys, pool))
            })
            .optional()?;
        let Some(((generation_id, style_examples), pool)) = row else {
            return Ok(None);
        };
        let style_examples = match style_examples {
            None => None,
            Some(json) => Some(self.ext_ids_of(&serde_json::from_str::<Vec<i64>>(&json)?)?),
        };
        Ok(Some(BundlePool {
            generation: index_of(&contents.generation_ids, &generation_id)?,
            style_examples,
            ..pool
        }))
    }

    fn bundle_endings(
        &self,
        contents: &BundleContents,
        example_id: i64,
    ) -> Result<Vec<BundleEnding>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, is_gold, text, generation_id, lp_cond, lp_alone, lp_final_punct,
                    n_tok_ending
             FROM endings WHERE example_id = ?1 ORDER BY is_gold DESC, id",
        )?;
        let rows = stmt
            .query_map([example_id], |r| {
                let keys: (i64, Option<i64>) = (r.get(0)?, r.get(3)?);
                let is_gold: bool = r.get(1)?;
                let ending = BundleEnding {
                    text: if is_gold { None } else { Some(r.get(2)?) },
                    generation: None,
                    lp_cond: r.get(4)?,
                    lp_alone: r.get(5)?,
                    lp_final_punct: r.get(6)?,
                    n_tok: r.get(7)?,
                    scores: Vec::new(),
                };
                Ok((keys, ending))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        rows.into_iter()
            .map(|((id, generation_id), ending)| {
                Ok(BundleEnding {
                    generation: generation_id
                        .map(|id| index_of(&contents.generation_ids, &id))
                        .transpose()?,
                    scores: self.bundle_scores(contents, id)?,
                    ..ending
                })
            })
            .collect()
    }

    /// An ending's scores, each scorer model by its index in the bundle's list.
    fn bundle_scores(&self, contents: &BundleContents, ending_id: i64) -> Result<Vec<BundleScore>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT model, ll_cond, ll_alone, n_tok FROM scorer_scores WHERE ending_id = ?1
             ORDER BY model",
        )?;
        let rows = stmt
            .query_map([ending_id], |r| {
                Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        rows.into_iter()
            .map(|(model, ll_cond, ll_alone, n_tok)| {
                Ok((
                    index_of(&contents.scorers, &model)?,
                    ll_cond,
                    ll_alone,
                    n_tok,
                ))
            })
            .collect()
    }

    fn bundle_growth(
        &self,
        contents: &BundleContents,
        example_id: i64,
    ) -> Result<Vec<BundleGrowth>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT COALESCE(af_run_id, bundle_af_run), generation_id, requested, produced, draws,
                    rejected, seconds, finished_at
             FROM pool_growth WHERE example_id = ?1 ORDER BY rowid",
        )?;
        let rows = stmt
            .query_map([example_id], |r| {
                let generation_id: i64 = r.get(1)?;
                let growth = BundleGrowth {
                    af_run: r.get(0)?,
                    generation: 0,
                    requested: r.get(2)?,
                    produced: r.get(3)?,
                    draws: r.get(4)?,
                    rejected: r.get(5)?,
                    seconds: r.get(6)?,
                    finished_at: r.get(7)?,
                };
                Ok((generation_id, growth))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        rows.into_iter()
            .map(|(generation_id, growth)| {
                Ok(BundleGrowth {
                    generation: index_of(&contents.generation_ids, &generation_id)?,
                    ..growth
                })
            })
            .collect()
    }

    fn bundle_unusable(
        &self,
        contents: &BundleContents,
        example_id: i64,
    ) -> Result<Vec<BundleUnusable>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT generation_id, reason, recorded_at FROM unusable_contexts
             WHERE example_id = ?1 ORDER BY generation_id",
        )?;
        let rows = stmt
            .query_map([example_id], |r| {
                Ok((r.get::<_, i64>(0)?, r.get(1)?, r.get(2)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        rows.into_iter()
            .map(|(generation_id, reason, recorded_at)| {
                Ok(BundleUnusable {
                    generation: index_of(&contents.generation_ids, &generation_id)?,
                    reason,
                    recorded_at,
                })
            })
            .collect()
    }

    /// The ext ids of examples by id, in the order asked; fails on an id that is not stored.
    fn ext_ids_of(&self, ids: &[i64]) -> Result<Vec<String>> {
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

    /// This project's ids of a bundle's generation jobs, in the bundle's order: of a job
    /// identical in every column (its start time too), or of a new row holding it.
    pub fn find_or_insert_bundle_generations(
        &self,
        generations: &[BundleGeneration],
    ) -> Result<Vec<i64>> {
        generations
            .iter()
            .map(|g| self.find_or_insert_bundle_generation(g))
            .collect()
    }

    fn find_or_insert_bundle_generation(&self, g: &BundleGeneration) -> Result<i64> {
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

    /// Writes a context's rows from a bundle, `generation_ids` being this project's ids of the
    /// bundle's generation jobs ([`Store::find_or_insert_bundle_generations`]) and `scorers` its
    /// scorer models: the found ending's features and scores, the candidates with theirs, the
    /// pool row (its style examples ingested here), growth rounds (under `bundle_af_run`) and
    /// unusable records (kept if already recorded). Call it inside [`Store::write_transaction`],
    /// after checking that the context has no pool.
    pub fn write_bundle_context(
        &self,
        example_id: i64,
        rows: &ContextRows,
        generation_ids: &[i64],
        scorers: &[String],
    ) -> Result<()> {
        for ending in &rows.endings {
            let generation_id = ending.generation.map(|g| generation_ids[g]);
            let ending_id = self.write_bundle_ending(example_id, ending, generation_id)?;
            let mut insert = self.conn.prepare_cached(
                "INSERT INTO scorer_scores(ending_id, model, ll_cond, ll_alone, n_tok)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for &(scorer, ll_cond, ll_alone, n_tok) in &ending.scores {
                insert.execute(params![
                    ending_id,
                    scorers[scorer],
                    ll_cond,
                    ll_alone,
                    n_tok
                ])?;
            }
        }
        if let Some(p) = &rows.pool {
            let style_examples = match &p.style_examples {
                None => None,
                Some(ext_ids) => Some(serde_json::to_string(&self.ids_of(ext_ids)?)?),
            };
            self.conn.execute(
                "INSERT INTO pools(example_id, generation_id, requested, produced, ctx_logprob,
                                   n_tok_sent1, n_tok_sent2, seconds, finished_at, style_examples,
                                   draws, rejected)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                params![
                    example_id,
                    generation_ids[p.generation],
                    p.requested,
                    p.produced,
                    p.ctx_logprob,
                    p.n_tok_sent1,
                    p.n_tok_sent2,
                    p.seconds,
                    p.finished_at,
                    style_examples,
                    p.draws,
                    p.rejected
                ],
            )?;
        }
        self.write_bundle_growth(example_id, rows, generation_ids)
    }

    /// The ids of examples by ext id, in the order asked; fails on one that is not ingested.
    fn ids_of(&self, ext_ids: &[String]) -> Result<Vec<i64>> {
        ext_ids
            .iter()
            .map(|ext_id| {
                self.example_id_by_ext_id(ext_id)?
                    .with_context(|| format!("context {ext_id} is not in the project"))
            })
            .collect()
    }

    /// The found ending's features (its row exists since ingest), or a new candidate; its id.
    fn write_bundle_ending(
        &self,
        example_id: i64,
        e: &BundleEnding,
        generation_id: Option<i64>,
    ) -> Result<i64> {
        let Some(text) = &e.text else {
            let id: i64 = self.conn.query_row(
                "UPDATE endings SET lp_cond = ?2, lp_alone = ?3, lp_final_punct = ?4,
                                    n_tok_ending = ?5
                 WHERE example_id = ?1 AND is_gold = 1 RETURNING id",
                params![example_id, e.lp_cond, e.lp_alone, e.lp_final_punct, e.n_tok],
                |r| r.get(0),
            )?;
            return Ok(id);
        };
        let mut insert = self.conn.prepare_cached(
            "INSERT INTO endings(example_id, text, is_gold, generation_id, lp_cond, lp_alone,
                                 lp_final_punct, n_tok_ending)
             VALUES (?1, ?2, 0, ?3, ?4, ?5, ?6, ?7)",
        )?;
        insert.execute(params![
            example_id,
            text,
            generation_id,
            e.lp_cond,
            e.lp_alone,
            e.lp_final_punct,
            e.n_tok
        ])?;
        Ok(self.conn.last_insert_rowid())
    }

    fn write_bundle_growth(
        &self,
        example_id: i64,
        rows: &ContextRows,
        generation_ids: &[i64],
    ) -> Result<()> {
        for g in &rows.growth {
            self.conn.execute(
                "INSERT INTO pool_growth(example_id, bundle_af_run, generation_id, requested,
                                         produced, draws, rejected, seconds, finished_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    example_id,
                    g.af_run,
                    generation_ids[g.generation],
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
                params![
                    example_id,
                    generation_ids[u.generation],
                    u.reason,
                    u.recorded_at
                ],
            )?;
        }
        Ok(())
    }
}
