//! The stored verdicts: submissions (an item labelled, or flagged broken) with a label per
//! ending, skips, undo, and the reads of them (an annotator's progress, every submission for
//! agreement and assembly).

use anyhow::{bail, Context, Result};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::annotate::claims::{remaining_for, Holder};
use crate::annotate::tasks::TaskView;
use crate::dataset::{Judgement, Rank};
use crate::{now, Store};

impl Store {
    /// Makes every submission, skip and undo reach the disk before it returns: a label, once
    /// the next item shows, survives even a power cut, not only a killed process.
    pub(crate) fn sync_every_label(&mut self) {
        self.sync_labels = true;
    }
}

/// Where a submission came from: the terminal UI ([`Store::submit`]) or a crowd results file
/// ([`Store::import_submission`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Tui,
    Crowd,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Origin::Tui => "tui",
            Origin::Crowd => "crowd",
        }
    }
}

/// One ending's label in a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndingLabel {
    pub ending_id: i64,
    pub judgement: Judgement,
    pub rank: Option<Rank>,
}

/// A complete submission to store: labels for every ending, or `broken` with no labels.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSubmission {
    pub task_id: i64,
    pub annotator: String,
    pub broken: bool,
    /// Time the annotator spent on the item.
    pub seconds: Option<f64>,
    /// When it was submitted; `None` = now.
    pub submitted_at: Option<String>,
    pub labels: Vec<EndingLabel>,
}

impl Store {
    /// Inserts a submission from a crowd results file and its labels (the caller provides the
    /// transaction).
    pub fn import_submission(&self, sub: &NewSubmission) -> Result<i64> {
        self.insert_submission(sub, Origin::Crowd)
    }

    fn insert_submission(&self, sub: &NewSubmission, origin: Origin) -> Result<i64> {
        let conn = &self.conn;
        let at = sub.submitted_at.clone().unwrap_or_else(now);
        conn.prepare_cached(
            "INSERT INTO submissions(task_id, annotator, origin, broken, seconds, submitted_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![
            sub.task_id,
            sub.annotator,
            origin.as_str(),
            sub.broken,
            sub.seconds,
            at
        ])
        .with_context(|| {
            format!(
                "cannot store the submission of task {} by {}",
                sub.task_id, sub.annotator
            )
        })?;
        let id = conn.last_insert_rowid();
        let mut stmt = conn.prepare_cached(
            "INSERT INTO labels(submission_id, ending_id, judgement, rank) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for l in &sub.labels {
            stmt.execute(params![
                id,
                l.ending_id,
                l.judgement.as_str(),
                l.rank.map(Rank::as_str)
            ])?;
        }
        Ok(id)
    }
}

impl Store {
    /// Stores a submission from the UI and releases the claim, in one durable transaction.
    pub fn submit(&mut self, sub: &NewSubmission) -> Result<i64> {
        let tx = self.begin(TransactionBehavior::Immediate)?;
        let id = self.insert_submission(sub, Origin::Tui)?;
        tx.prepare_cached("DELETE FROM claims WHERE task_id = ?1 AND annotator = ?2")?
            .execute(params![sub.task_id, sub.annotator])?;
        tx.commit()?;
        self.make_durable()?;
        Ok(id)
    }

    /// Records that the holder skips `task_id` (it will not be offered to them again).
    pub fn skip(&mut self, holder: &Holder, task_id: i64) -> Result<()> {
        let tx = self.begin(TransactionBehavior::Immediate)?;
        tx.execute(
            "INSERT OR IGNORE INTO skips(task_id, annotator, skipped_at) VALUES (?1, ?2, ?3)",
            params![task_id, holder.annotator, now()],
        )?;
        tx.execute(
            "DELETE FROM claims WHERE task_id = ?1 AND annotator = ?2",
            params![task_id, holder.annotator],
        )?;
        tx.commit()?;
        self.make_durable()?;
        Ok(())
    }
}

/// What an undo brought back.
#[derive(Debug, Clone, PartialEq)]
pub struct Undone {
    pub task: TaskView,
    /// The labels of the undone submission (empty for a skip or a broken flag).
    pub labels: Vec<EndingLabel>,
    pub was: UndoneKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UndoneKind {
    Submission,
    Broken,
    Skip,
}

impl Store {
    /// Takes back the annotator's latest UI submission, broken flag or skip (whichever came last),
    /// and claims its item again, in one transaction. `None` when there is nothing to undo.
    pub fn undo_last(&mut self, holder: &Holder) -> Result<Option<Undone>> {
        let tx = self.begin(TransactionBehavior::Immediate)?;
        let last_submission: Option<(i64, i64, bool, String)> = tx
            .query_row(
                "SELECT id, task_id, broken, submitted_at FROM submissions
             WHERE annotator = ?1 AND origin = 'tui' ORDER BY submitted_at DESC, id DESC LIMIT 1",
                [&holder.annotator],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()?;
        let last_skip: Option<(i64, String)> = tx
            .query_row(
                "SELECT task_id, skipped_at FROM skips WHERE annotator = ?1
             ORDER BY skipped_at DESC, rowid DESC LIMIT 1",
                [&holder.annotator],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let skip_is_later = match (&last_submission, &last_skip) {
            (Some((_, _, _, sub_at)), Some((_, skip_at))) => skip_at > sub_at,
            (None, Some(_)) => true,
            _ => false,
        };
        let (task_id, labels, was) = if skip_is_later {
            let (task_id, _) = last_skip.expect("checked above");
            tx.execute(
                "DELETE FROM skips WHERE task_id = ?1 AND annotator = ?2",
                params![task_id, holder.annotator],
            )?;
            (task_id, Vec::new(), UndoneKind::Skip)
        } else if let Some((id, task_id, broken, _)) = last_submission {
            let labels = submission_labels(&tx, id)?;
            tx.execute("DELETE FROM submissions WHERE id = ?1", [id])?;
            let was = if broken {
                UndoneKind::Broken
            } else {
                UndoneKind::Submission
            };
            (task_id, labels, was)
        } else {
            return Ok(None);
        };
        tx.execute(
            "DELETE FROM claims WHERE annotator = ?1",
            [&holder.annotator],
        )?;
        let at = now();
        tx.execute(
            "INSERT INTO claims(task_id, annotator, claimed_at, seen_at, pid, host)
         VALUES (?1, ?2, ?3, ?3, ?4, ?5)",
            params![task_id, holder.annotator, at, holder.pid, holder.host],
        )?;
        let task = self.task_view(task_id)?.expect("undone task exists");
        tx.commit()?;
        self.make_durable()?;
        Ok(Some(Undone { task, labels, was }))
    }
}

fn submission_labels(conn: &Connection, submission_id: i64) -> Result<Vec<EndingLabel>> {
    let mut stmt = conn.prepare(
        "SELECT ending_id, judgement, rank FROM labels WHERE submission_id = ?1 ORDER BY ending_id",
    )?;
    let mut rows = stmt.query([submission_id])?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        out.push(label_from_row(
            r.get(0)?,
            &r.get::<_, String>(1)?,
            r.get(2)?,
        )?);
    }
    Ok(out)
}

fn label_from_row(ending_id: i64, judgement: &str, rank: Option<String>) -> Result<EndingLabel> {
    let Some(j) = Judgement::parse(judgement) else {
        bail!("unknown judgement {judgement:?} stored for ending {ending_id}");
    };
    let rank = match rank {
        None => None,
        Some(r) => Some(
            Rank::parse(&r)
                .with_context(|| format!("unknown rank {r:?} stored for ending {ending_id}"))?,
        ),
    };
    Ok(EndingLabel {
        ending_id,
        judgement: j,
        rank,
    })
}

/// An annotator's standing, for the progress line.
#[derive(Debug, Clone, PartialEq)]
pub struct AnnotatorProgress {
    /// Submissions (labelled or flagged broken).
    pub done: i64,
    /// `(submitted_at, seconds on the item)` of each submission, oldest first.
    pub items: Vec<(String, Option<f64>)>,
    /// Items this annotator could still be given (the one on screen included).
    pub remaining: i64,
}

impl Store {
    pub fn annotator_progress(&self, annotator: &str) -> Result<AnnotatorProgress> {
        let conn = &self.conn;
        let mut stmt = conn.prepare_cached(
        "SELECT submitted_at, seconds FROM submissions WHERE annotator = ?1 ORDER BY submitted_at",
    )?;
        let items: Vec<(String, Option<f64>)> = stmt
            .query_map([annotator], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(AnnotatorProgress {
            done: items.len() as i64,
            items,
            remaining: remaining_for(conn, annotator)?,
        })
    }

    /// Whether `annotator` already submitted `task_id` (any origin).
    pub fn has_submitted(&self, task_id: i64, annotator: &str) -> Result<bool> {
        let conn = &self.conn;
        Ok(conn
            .query_row(
                "SELECT 1 FROM submissions WHERE task_id = ?1 AND annotator = ?2",
                params![task_id, annotator],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }
}

/// A stored submission with its labels, for agreement statistics and assembly.
#[derive(Debug, Clone, PartialEq)]
pub struct SubmissionRecord {
    pub submission_id: i64,
    pub task_id: i64,
    pub example_id: i64,
    pub annotator: String,
    pub broken: bool,
    pub seconds: Option<f64>,
    pub submitted_at: String,
    /// Submitted in `afkit annotate` (not imported from crowd results): its submission time is
    /// when the annotator finished the item.
    pub in_terminal: bool,
    /// `(label, is_gold)` per ending; empty when broken.
    pub labels: Vec<(EndingLabel, bool)>,
}

impl Store {
    /// Every submission, ordered by task then submission id.
    pub fn all_submissions(&self) -> Result<Vec<SubmissionRecord>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare(
        "SELECT s.id, s.task_id, t.example_id, s.annotator, s.broken, s.seconds, s.submitted_at,
                s.origin = 'tui', l.ending_id, l.judgement, l.rank, e.is_gold
         FROM submissions s JOIN tasks t ON t.id = s.task_id
         LEFT JOIN labels l ON l.submission_id = s.id
         LEFT JOIN endings e ON e.id = l.ending_id
         ORDER BY s.task_id, s.id, l.ending_id",
    )?;
        let mut rows = stmt.query([])?;
        let mut out: Vec<SubmissionRecord> = Vec::new();
        while let Some(r) = rows.next()? {
            let id: i64 = r.get(0)?;
            if out.last().map(|s| s.submission_id) != Some(id) {
                out.push(SubmissionRecord {
                    submission_id: id,
                    task_id: r.get(1)?,
                    example_id: r.get(2)?,
                    annotator: r.get(3)?,
                    broken: r.get(4)?,
                    seconds: r.get(5)?,
                    submitted_at: r.get(6)?,
                    in_terminal: r.get(7)?,
                    labels: Vec::new(),
                });
            }
            if let Some(ending_id) = r.get::<_, Option<i64>>(8)? {
                let label = label_from_row(ending_id, &r.get::<_, String>(9)?, r.get(10)?)?;
                let is_gold = r.get::<_, i64>(11)? != 0;
                out.last_mut()
                    .expect("pushed above")
                    .labels
                    .push((label, is_gold));
            }
        }
        Ok(out)
    }
}
