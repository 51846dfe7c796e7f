//! What a project holds, stage by stage: the data behind `afkit status`.

use std::collections::BTreeMap;

use anyhow::Result;
use rusqlite::OptionalExtension;
use serde::Serialize;

use super::Store;

/// Counts for `afkit status --json`; the field names are a stable interface for scripts.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Status {
    /// Kept examples (contexts with a found ending).
    pub examples: i64,
    /// Input records not kept, by reason.
    pub dropped: BTreeMap<String, i64>,
    /// Generator adapters recorded by `lm adapt` (one per fold, all sets).
    pub adapters: i64,
    /// Contexts whose generated pool is complete.
    pub contexts_with_pool: i64,
    /// Candidate endings in all pools, the found endings excluded.
    pub candidates: i64,
    /// Contexts that got fewer unique endings than requested.
    pub pool_shortfalls: i64,
    /// Finished iterations of the latest AF run.
    pub af_iterations: i64,
    /// Whether the latest AF run finished its final cross-fitted scoring pass.
    pub af_finished: bool,
    /// Contexts with at least one complete (non-broken) label submission.
    pub labelled_items: i64,
    /// Assembled examples across all splits.
    pub assembled: i64,
    /// The assembly the project holds (its number and AF run).
    pub assembly: Option<super::assemble::AssemblyInfo>,
    /// Question reviews stored, the review items (questions as reviewers saw them) they
    /// answer, and the items that still want a review.
    pub reviews: i64,
    pub review_items: i64,
    pub review_items_wanting: i64,
    /// The newest finished AF run.
    pub latest_finished_af_run: Option<i64>,
    /// What the latest export holds.
    pub last_export: Option<super::export::ExportInfo>,
    /// Examples that have no pool yet.
    pub contexts_without_pool: i64,
    /// Of those, the ones `generate` found unusable with its model (prompt too long).
    pub unusable_contexts: i64,
    /// Contexts with a pool of at least k candidates that the latest AF run did not filter (they
    /// were generated after it: its results are stale for them).
    pub af_stale_contexts: i64,
    /// Contexts whose pool has fewer than the latest AF run's k candidates, which AF leaves out.
    pub af_too_few_candidates: i64,
}

impl Store {
    pub fn status(&self) -> Result<Status> {
        let count = |sql: &str| -> Result<i64> { Ok(self.conn.query_row(sql, [], |r| r.get(0))?) };
        let af = self.af_progress()?;
        Ok(Status {
            examples: self.count_examples()?,
            dropped: self.dropped_by_reason()?,
            adapters: count("SELECT COUNT(*) FROM adapters")?,
            contexts_with_pool: count("SELECT COUNT(*) FROM pools")?,
            candidates: count("SELECT COUNT(*) FROM endings WHERE is_gold = 0")?,
            pool_shortfalls: count("SELECT COUNT(*) FROM pools WHERE produced < requested")?,
            af_iterations: af.iterations,
            af_finished: af.finished,
            labelled_items: count(
                "SELECT COUNT(DISTINCT t.example_id) FROM submissions s
                 JOIN tasks t ON t.id = s.task_id WHERE s.broken = 0",
            )?,
            assembled: count("SELECT COUNT(*) FROM assembled")?,
            assembly: self.assembly_info()?,
            reviews: count("SELECT COUNT(*) FROM reviews")?,
            review_items: count("SELECT COUNT(*) FROM review_items")?,
            review_items_wanting: count(
                "SELECT COUNT(*) FROM review_items i
                 WHERE (SELECT COUNT(*) FROM reviews r WHERE r.item_id = i.id) < i.reviewers",
            )?,
            latest_finished_af_run: self.latest_finished_af_run()?.map(|r| r.id),
            last_export: self.last_export()?,
            contexts_without_pool: count(
                "SELECT COUNT(*) FROM examples x WHERE NOT EXISTS
                   (SELECT 1 FROM pools p WHERE p.example_id = x.id)",
            )?,
            unusable_contexts: count(
                "SELECT COUNT(DISTINCT u.example_id) FROM unusable_contexts u WHERE NOT EXISTS
                   (SELECT 1 FROM pools p WHERE p.example_id = u.example_id)",
            )?,
            af_stale_contexts: af.stale,
            af_too_few_candidates: af.too_few,
        })
    }
}

/// Where the latest AF run stands, and the pools it did not filter.
#[derive(Default)]
struct AfProgress {
    iterations: i64,
    finished: bool,
    /// Pools of at least the run's k candidates that it never saw (added after it).
    stale: i64,
    /// Pools below the run's k, which AF leaves out.
    too_few: i64,
}

impl Store {
    fn af_progress(&self) -> Result<AfProgress> {
        let run: Option<(i64, i64, bool)> = self
            .conn
            .query_row(
                "SELECT id, k, finished_at IS NOT NULL FROM af_runs ORDER BY id DESC LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?;
        let Some((run, k, finished)) = run else {
            return Ok(AfProgress::default());
        };
        let iterations = self.conn.query_row(
            "SELECT COUNT(*) FROM af_iterations WHERE run_id = ?1",
            [run],
            |r| r.get(0),
        )?;
        let (stale, too_few) = self.conn.query_row(
            "SELECT COALESCE(SUM(n >= ?2), 0), COALESCE(SUM(n < ?2), 0) FROM
               (SELECT (SELECT COUNT(*) FROM endings e
                        WHERE e.example_id = p.example_id AND e.is_gold = 0) AS n
                FROM pools p WHERE NOT EXISTS
                  (SELECT 1 FROM af_assignments a WHERE a.run_id = ?1 AND a.example_id = p.example_id))",
            [run, k],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        Ok(AfProgress {
            iterations,
            finished,
            stale,
            too_few,
        })
    }
}
