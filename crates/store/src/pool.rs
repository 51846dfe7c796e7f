//! Generate's tables: generation jobs, per-context pools and the LM features of every ending.
//!
//! A context's pool (its candidate endings, the gold ending's features and the `pools` row) is
//! written by [`Store::write_pool`] inside one transaction: a context either has a whole pool or none,
//! so an interrupted `afkit generate` resumes at the first context without a `pools` row.

use afkit_engine::lm::features::EndingFeatures;
use anyhow::Result;
use rusqlite::{params, Connection, OptionalExtension};

use super::examples::Example;
use super::{now, SqlSeed, Store};

/// A generation job: backend, model, prompt template, sampling parameters and seed.
#[derive(Debug, Clone, PartialEq)]
pub struct NewGeneration {
    pub backend: String,
    pub model: String,
    pub model_sha256: Option<String>,
    pub prompt: String,
    /// JSON object of every sampling parameter.
    pub params_json: String,
    pub seed: afkit_engine::seed::Seed,
}

/// Everything stored for one context's pool.
#[derive(Debug, Clone, PartialEq)]
pub struct NewPool {
    pub example_id: i64,
    pub generation_id: i64,
    pub requested: usize,
    pub ctx_logprob: f64,
    pub n_tok_sent1: usize,
    pub n_tok_sent2: usize,
    pub seconds: f64,
    /// The found ending's LM features (with the candidates', the inputs of the AF perplexity
    /// MLP).
    pub gold: EndingFeatures,
    /// Candidate endings (unique, normalised, gold excluded) with their features.
    pub candidates: Vec<(String, EndingFeatures)>,
    /// Examples whose pairs were shown before the context (style priming).
    pub style_examples: Vec<i64>,
    /// Sequences sampled and why the ones not kept were rejected (`None` for imported pools).
    pub draws: Option<(usize, std::collections::BTreeMap<&'static str, usize>)>,
}

impl Store {
    /// Reuses the row of an identical earlier job (a resumed run), else records a new one.
    pub fn find_or_insert_generation(&self, g: &NewGeneration) -> Result<i64> {
        let conn = &self.conn;
        let existing: Option<i64> = conn
        .query_row(
            "SELECT id FROM generations WHERE backend = ?1 AND model = ?2 AND model_sha256 IS ?3
               AND prompt = ?4 AND params = ?5 AND seed = ?6 ORDER BY id DESC LIMIT 1",
            params![
                g.backend,
                g.model,
                g.model_sha256,
                g.prompt,
                g.params_json,
                SqlSeed(g.seed)
            ],
            |r| r.get(0),
        )
        .optional()?;
        if let Some(id) = existing {
            return Ok(id);
        }
        conn.execute(
        "INSERT INTO generations(backend, model, model_sha256, prompt, params, seed, started_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            g.backend,
            g.model,
            g.model_sha256,
            g.prompt,
            g.params_json,
            SqlSeed(g.seed),
            now()
        ],
    )?;
        Ok(conn.last_insert_rowid())
    }

    /// Stores a context's candidates, the gold ending's features and the pool row. Call it inside
    /// [`Store::transaction`]. Returns the number of candidates stored (`pools.produced`).
    pub fn write_pool(&self, pool: &NewPool) -> Result<usize> {
        let conn = &self.conn;
        let gold_updated = conn.execute(
            "UPDATE endings SET lp_cond = ?2, lp_alone = ?3, lp_final_punct = ?4, n_tok_ending = ?5
         WHERE example_id = ?1 AND is_gold = 1",
            params![
                pool.example_id,
                pool.gold.lp_cond,
                pool.gold.lp_alone,
                pool.gold.lp_final_punct,
                pool.gold.n_tok as i64
            ],
        )?;
        if gold_updated != 1 {
            anyhow::bail!("example {} has no found ending to score", pool.example_id);
        }
        let produced = insert_candidates(conn, pool)?;
        conn.execute(
            "INSERT INTO pools(example_id, generation_id, requested, produced, ctx_logprob,
                           n_tok_sent1, n_tok_sent2, seconds, finished_at, style_examples,
                           draws, rejected)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            params![
                pool.example_id,
                pool.generation_id,
                pool.requested as i64,
                produced as i64,
                pool.ctx_logprob,
                pool.n_tok_sent1 as i64,
                pool.n_tok_sent2 as i64,
                pool.seconds,
                now(),
                (!pool.style_examples.is_empty())
                    .then(|| serde_json::to_string(&pool.style_examples))
                    .transpose()?,
                pool.draws.as_ref().map(|(n, _)| *n as i64),
                pool.draws
                    .as_ref()
                    .map(|(_, why)| serde_json::to_string(why))
                    .transpose()?
            ],
        )
        .map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::ConstraintViolation) => already_pooled(conn, pool.example_id),
            _ => e.into(),
        })?;
        Ok(produced)
    }
}

/// The plain message for a pool that another process stored first (two `generate` or
/// `import-pool` runs on one project at once).
fn already_pooled(conn: &Connection, example_id: i64) -> anyhow::Error {
    let ext_id: String = conn
        .query_row(
            "SELECT ext_id FROM examples WHERE id = ?1",
            [example_id],
            |r| r.get(0),
        )
        .unwrap_or_else(|_| format!("#{example_id}"));
    anyhow::anyhow!(
        "context {ext_id} already has a pool, stored by another process while this one worked \
         on it: is a second `afkit generate` or `afkit import-pool` running on this project? \
         Nothing of this context was written by this run; run one at a time"
    )
}

/// Stores the pool's candidates that are new to its context; returns how many.
fn insert_candidates(conn: &Connection, pool: &NewPool) -> Result<usize> {
    let mut insert = conn.prepare_cached(
        "INSERT OR IGNORE INTO endings(example_id, text, is_gold, generation_id, lp_cond, lp_alone,
                                       lp_final_punct, n_tok_ending)
         VALUES (?1, ?2, 0, ?3, ?4, ?5, ?6, ?7)",
    )?;
    let mut produced = 0;
    for (text, f) in &pool.candidates {
        produced += insert.execute(params![
            pool.example_id,
            text,
            pool.generation_id,
            f.lp_cond,
            f.lp_alone,
            f.lp_final_punct,
            f.n_tok as i64
        ])?;
    }
    Ok(produced)
}

/// A pool whose found ending outscored all of its candidates in an AF run's final pass.
#[derive(Debug, Clone, PartialEq)]
pub struct StarvedPool {
    pub example_id: i64,
    /// Candidates the run scored.
    pub candidates: usize,
    pub style_examples: Vec<i64>,
    /// Growth rounds the pool has had so far.
    pub rounds: usize,
    /// Whether it has been grown in answer to this very run.
    pub grown_for_run: bool,
}

impl Store {
    /// Adds a growth round's endings to an existing pool (`pool.candidates`, already scored after the
    /// pool's own prompt) and records the round; returns the candidates stored.
    pub fn write_growth(&self, pool: &NewPool, af_run_id: i64) -> Result<usize> {
        let conn = &self.conn;
        let produced = insert_candidates(conn, pool)?;
        let (draws, rejected) = pool.draws.clone().unwrap_or_default();
        conn.execute(
        "INSERT INTO pool_growth(example_id, af_run_id, generation_id, requested, produced, draws,
                                 rejected, seconds, finished_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            pool.example_id,
            af_run_id,
            pool.generation_id,
            pool.requested as i64,
            produced as i64,
            draws as i64,
            serde_json::to_string(&rejected)?,
            pool.seconds,
            now()
        ],
    )?;
        conn.execute(
            "UPDATE pools SET produced = produced + ?2 WHERE example_id = ?1",
            params![pool.example_id, produced as i64],
        )?;
        Ok(produced)
    }

    /// The pools whose found ending scored above every candidate in AF run `run_id`'s final
    /// pass, in example id order, with their candidates' texts.
    pub fn starved_pools(&self, run_id: i64) -> Result<Vec<StarvedPool>> {
        let mut stmt = self.conn.prepare(
            "SELECT e.example_id,
                    SUM(e.is_gold = 0),
                    (SELECT style_examples FROM pools p WHERE p.example_id = e.example_id),
                    (SELECT COUNT(*) FROM pool_growth g WHERE g.example_id = e.example_id),
                    EXISTS (SELECT 1 FROM pool_growth g
                            WHERE g.example_id = e.example_id AND g.af_run_id = ?1)
             FROM af_scores s JOIN endings e ON e.id = s.ending_id
             WHERE s.run_id = ?1
             GROUP BY e.example_id
             HAVING MAX(CASE WHEN e.is_gold = 1 THEN s.score END)
                  > MAX(CASE WHEN e.is_gold = 0 THEN s.score END)
             ORDER BY e.example_id",
        )?;
        let rows = stmt.query_map([run_id], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, Option<String>>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, bool>(4)?,
            ))
        })?;
        rows.map(|row| {
            let (example_id, candidates, style, rounds, grown_for_run) = row?;
            Ok(StarvedPool {
                example_id,
                candidates: candidates as usize,
                style_examples: style
                    .map(|s| serde_json::from_str(&s))
                    .transpose()?
                    .unwrap_or_default(),
                rounds: rounds as usize,
                grown_for_run,
            })
        })
        .collect()
    }

    /// Examples that have no pool yet, in insertion order (at most `limit`).
    pub fn examples_without_pool(&self, limit: Option<usize>) -> Result<Vec<Example>> {
        let limit = limit.map_or(-1, |l| l as i64);
        let mut stmt = self.conn.prepare(
            "SELECT x.id FROM examples x
             WHERE NOT EXISTS (SELECT 1 FROM pools p WHERE p.example_id = x.id)
             ORDER BY x.id LIMIT ?1",
        )?;
        let ids: Vec<i64> = stmt
            .query_map([limit], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        ids.into_iter()
            .map(|id| Ok(self.example(id)?.expect("example exists")))
            .collect()
    }

    /// Records that `generation_id` cannot use this example, and why (kept if already recorded).
    pub fn record_unusable_context(
        &self,
        example_id: i64,
        generation_id: i64,
        reason: &str,
    ) -> Result<()> {
        self.conn.execute(
            "INSERT OR IGNORE INTO unusable_contexts(example_id, generation_id, reason, recorded_at)
             VALUES (?1, ?2, ?3, ?4)",
            params![example_id, generation_id, reason, now()],
        )?;
        Ok(())
    }

    /// An example by its external id (`video#index` or the input's id).
    pub fn example_id_by_ext_id(&self, ext_id: &str) -> Result<Option<i64>> {
        Ok(self
            .conn
            .query_row("SELECT id FROM examples WHERE ext_id = ?1", [ext_id], |r| {
                r.get(0)
            })
            .optional()?)
    }

    /// Why ingest dropped the record with this external id, if it did.
    pub fn dropped_reason(&self, ext_id: &str) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row(
                "SELECT reason FROM dropped WHERE ext_id = ?1",
                [ext_id],
                |r| r.get(0),
            )
            .optional()?)
    }

    pub fn has_pool(&self, example_id: i64) -> Result<bool> {
        Ok(self.conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM pools WHERE example_id = ?1)",
            [example_id],
            |r| r.get(0),
        )?)
    }
}

/// A stored ending with its features, as the tests read it back.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq)]
struct StoredEnding {
    id: i64,
    text: String,
    is_gold: bool,
    features: Option<EndingFeatures>,
}

/// What the tests read back of a written pool.
#[cfg(test)]
impl Store {
    /// The gold ending and every candidate of a context, gold first, with their features.
    fn pool_endings(&self, example_id: i64) -> Result<Vec<StoredEnding>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, text, is_gold, lp_cond, lp_alone, lp_final_punct, n_tok_ending
             FROM endings WHERE example_id = ?1 ORDER BY is_gold DESC, id",
        )?;
        let rows = stmt.query_map([example_id], |r| {
            let lp_cond: Option<f64> = r.get(3)?;
            let features = match lp_cond {
                None => None,
                Some(lp_cond) => Some(EndingFeatures {
                    lp_cond,
                    lp_alone: r.get(4)?,
                    lp_final_punct: r.get(5)?,
                    n_tok: r.get::<_, i64>(6)? as usize,
                }),
            };
            Ok(StoredEnding {
                id: r.get(0)?,
                text: r.get(1)?,
                is_gold: r.get(2)?,
                features,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Per-context LM features of a pool: `(ctx_logprob, n_tok_sent1, n_tok_sent2)`.
    fn pool_context_features(&self, example_id: i64) -> Result<Option<(f64, i64, i64)>> {
        Ok(self
            .conn
            .query_row(
                "SELECT ctx_logprob, n_tok_sent1, n_tok_sent2 FROM pools WHERE example_id = ?1",
                [example_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::examples::NewExample;

    fn features(x: f64) -> EndingFeatures {
        EndingFeatures {
            lp_cond: x,
            lp_alone: Some(x - 1.0),
            lp_final_punct: Some(-0.5),
            n_tok: 4,
        }
    }

    #[test]
    fn a_pool_is_written_whole_and_found_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::create(&dir.path().join("p.sqlite")).unwrap();
        let src = store.upsert_source("a", "jsonl", "h", "{}").unwrap();
        for id in ["v#0", "v#1"] {
            let ex = NewExample {
                ext_id: id.into(),
                group: "v".into(),
                sent1: "A man stands.".into(),
                sent2: "He".into(),
                ending: "sits down.".into(),
                gold_source: None,
            };
            store.insert_example(src, &ex).unwrap();
        }
        let g = NewGeneration {
            backend: "local".into(),
            model: "m.gguf".into(),
            model_sha256: None,
            prompt: "continuation".into(),
            params_json: "{}".into(),
            seed: afkit_engine::seed::Seed::new(3),
        };
        let gen = store.find_or_insert_generation(&g).unwrap();
        assert_eq!(store.find_or_insert_generation(&g).unwrap(), gen);
        let todo = store.examples_without_pool(None).unwrap();
        assert_eq!(todo.len(), 2);
        let pool = NewPool {
            example_id: todo[0].id,
            generation_id: gen,
            requested: 3,
            ctx_logprob: -3.0,
            n_tok_sent1: 4,
            n_tok_sent2: 1,
            seconds: 0.1,
            gold: features(-2.0),
            candidates: vec![
                ("runs away.".into(), features(-3.0)),
                ("jumps.".into(), features(-4.0)),
            ],
            style_examples: vec![2],
            draws: Some((5, [("duplicate", 3)].into())),
        };
        assert_eq!(store.transaction(|s| s.write_pool(&pool)).unwrap(), 2);
        assert_eq!(store.examples_without_pool(None).unwrap()[0].ext_id, "v#1");
        assert_eq!(store.examples_without_pool(Some(0)).unwrap().len(), 0);
        let endings = store.pool_endings(todo[0].id).unwrap();
        assert_eq!(endings.len(), 3);
        assert!(endings[0].is_gold);
        assert_eq!(endings[0].features, Some(features(-2.0)));
        assert_eq!(endings[2].features, Some(features(-4.0)));
        assert_eq!(
            store.pool_context_features(todo[0].id).unwrap(),
            Some((-3.0, 4, 1))
        );
        assert!(store.has_pool(todo[0].id).unwrap());
        let status = store.status().unwrap();
        assert_eq!(
            (
                status.contexts_with_pool,
                status.candidates,
                status.pool_shortfalls
            ),
            (1, 2, 1)
        );
    }
}
