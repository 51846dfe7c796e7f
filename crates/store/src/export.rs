//! Export's table (`exports`) and the provenance the dataset card reads from every stage.

use std::collections::BTreeMap;

use anyhow::Result;
use rusqlite::params;

use super::{now, SqlSeed, Store};

/// What the latest export holds, as `status` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ExportInfo {
    pub dir: String,
    pub negatives: String,
    pub seed: afkit_engine::seed::Seed,
    /// The assembly exported and its AF run.
    pub assembly: Option<super::assemble::AssemblyInfo>,
}

/// The `meta` key of the latest export.
const LAST_EXPORT: &str = "last_export";

impl Store {
    /// Records a finished export: where, which negatives, the seed and each file's SHA-256, and
    /// (for `status`) which assembly it holds.
    pub fn record_export(&self, info: &ExportInfo, files_json: &str) -> Result<i64> {
        let tx = self.conn.unchecked_transaction()?;
        tx.execute(
            "INSERT INTO exports(dir, negatives, seed, files, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![info.dir, info.negatives, SqlSeed(info.seed), files_json, now()],
        )?;
        let id = tx.last_insert_rowid();
        super::set_meta(&tx, LAST_EXPORT, &serde_json::to_string(info)?)?;
        tx.commit()?;
        Ok(id)
    }

    /// The latest export, if the project recorded one.
    pub(crate) fn last_export(&self) -> Result<Option<ExportInfo>> {
        match self.meta(LAST_EXPORT)? {
            None => Ok(None),
            Some(text) => Ok(serde_json::from_str(&text).ok()),
        }
    }
}

/// What the dataset card reports of the stages before export, read in one call: the ingested
/// files, the generation jobs, the found-vs-generated log-prob gap, and the human verification.
#[derive(Debug, Clone, PartialEq)]
pub struct Provenance {
    pub sources: Vec<SourceInfo>,
    pub generations: Vec<GenerationInfo>,
    pub gap: Option<LogProbGap>,
    /// Every label of every non-broken submission.
    pub labels: Vec<LabelRow>,
    /// Annotation tasks per round.
    pub tasks_per_round: BTreeMap<i64, i64>,
}

impl Store {
    /// The provenance the dataset card reports.
    pub fn provenance(&self) -> Result<Provenance> {
        Ok(Provenance {
            sources: self.sources()?,
            generations: self.generations()?,
            gap: self.logprob_gap()?,
            labels: self.label_rows()?,
            tasks_per_round: self.tasks_per_round()?,
        })
    }
}

/// An ingested input file.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceInfo {
    pub path: String,
    pub format: String,
    pub sha256: String,
    pub examples: i64,
}

impl Store {
    fn sources(&self) -> Result<Vec<SourceInfo>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare(
        "SELECT s.path, s.format, s.sha256, (SELECT COUNT(*) FROM examples x WHERE x.source_id = s.id)
         FROM sources s ORDER BY s.id",
    )?;
        let rows = stmt.query_map([], |r| {
            Ok(SourceInfo {
                path: r.get(0)?,
                format: r.get(1)?,
                sha256: r.get(2)?,
                examples: r.get(3)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

/// A generation job, as the card reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationInfo {
    pub backend: String,
    pub model: String,
    pub model_sha256: Option<String>,
    pub prompt: String,
    pub params: String,
    pub seed: i64,
    pub contexts: i64,
    pub candidates: i64,
}

impl Store {
    fn generations(&self) -> Result<Vec<GenerationInfo>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare(
            "SELECT g.backend, g.model, g.model_sha256, g.prompt, g.params, g.seed,
                (SELECT COUNT(*) FROM pools p WHERE p.generation_id = g.id),
                (SELECT COUNT(*) FROM endings e WHERE e.generation_id = g.id AND e.is_gold = 0)
         FROM generations g ORDER BY g.id",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(GenerationInfo {
                backend: r.get(0)?,
                model: r.get(1)?,
                model_sha256: r.get(2)?,
                prompt: r.get(3)?,
                params: r.get(4)?,
                seed: r.get(5)?,
                contexts: r.get(6)?,
                candidates: r.get(7)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

/// Mean conditional log-prob (per token) of found vs generated endings, over contexts that have
/// a pool (the LM may have seen the found endings).
#[derive(Debug, Clone, PartialEq)]
pub struct LogProbGap {
    pub found_mean: f64,
    pub found_n: i64,
    pub generated_mean: f64,
    pub generated_n: i64,
}

impl Store {
    fn logprob_gap(&self) -> Result<Option<LogProbGap>> {
        let conn = &self.conn;
        let (found_mean, found_n, generated_mean, generated_n): (Option<f64>, i64, Option<f64>, i64) = conn.query_row(
        "SELECT AVG(CASE WHEN e.is_gold = 1 THEN e.lp_cond END), COUNT(CASE WHEN e.is_gold = 1 THEN e.lp_cond END),
                AVG(CASE WHEN e.is_gold = 0 THEN e.lp_cond END), COUNT(CASE WHEN e.is_gold = 0 THEN e.lp_cond END)
         FROM endings e JOIN pools p ON p.example_id = e.example_id",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )?;
        Ok(match (found_mean, generated_mean) {
            (Some(found_mean), Some(generated_mean)) => Some(LogProbGap {
                found_mean,
                found_n,
                generated_mean,
                generated_n,
            }),
            _ => None,
        })
    }
}

/// One label of one non-broken submission, with what the dataset card's agreement summary needs.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelRow {
    pub task_id: i64,
    pub annotator: String,
    pub ending_id: i64,
    pub is_found: bool,
    pub judgement: String,
    pub rank: Option<String>,
}

impl Store {
    fn label_rows(&self) -> Result<Vec<LabelRow>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare(
        "SELECT s.task_id, s.annotator, l.ending_id, e.is_gold, l.judgement, l.rank
         FROM labels l JOIN submissions s ON s.id = l.submission_id JOIN endings e ON e.id = l.ending_id
         WHERE s.broken = 0 ORDER BY s.task_id, s.annotator, l.ending_id",
    )?;
        let rows = stmt.query_map([], |r| {
            Ok(LabelRow {
                task_id: r.get(0)?,
                annotator: r.get(1)?,
                ending_id: r.get(2)?,
                is_found: r.get::<_, i64>(3)? != 0,
                judgement: r.get(4)?,
                rank: r.get(5)?,
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Number of annotation tasks per round.
    fn tasks_per_round(&self) -> Result<BTreeMap<i64, i64>> {
        let conn = &self.conn;
        let mut stmt =
            conn.prepare("SELECT round, COUNT(*) FROM tasks GROUP BY round ORDER BY round")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}
