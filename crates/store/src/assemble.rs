//! Assemble's tables (`splits`, `assembled`, `assembled_distractors`) and the reads assemble makes
//! of the filter and annotate stages' tables (assignments and scores of the latest finished AF
//! run, current tasks and labels).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use anyhow::{Context, Result};
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSqlOutput, ValueRef};
use rusqlite::{params, Connection, ToSql, TransactionBehavior};

use super::Store;
use crate::annotate::labels::SubmissionRecord;
use crate::dataset::{Judgement, Split};

/// What an AF run decided, as assembly reads it for every context.
#[derive(Debug, Clone, PartialEq)]
pub struct AfDecisions {
    /// The assigned negatives of every context, in slot order.
    pub assignments: BTreeMap<i64, Vec<i64>>,
    /// Final cross-fitted score (higher = harder) of the endings assembly decides between: the
    /// assigned negatives and every ending shown in a task. The rest of the pool (most of the
    /// `af_scores` rows in a big project) is read per context, when a re-annotation needs it
    /// ([`Store::scored_pool`]).
    pub scores: HashMap<i64, f64>,
    /// The cross-fitting fold (SWAG's `fold-ind`) of every context.
    pub folds: HashMap<i64, i64>,
    /// The assigned negatives under the run's fluency floor (none without a floor).
    pub refused: HashSet<i64>,
}

impl Store {
    /// What AF run `run_id` decided: see [`AfDecisions`].
    pub fn af_decisions(&self, run_id: i64) -> Result<AfDecisions> {
        Ok(AfDecisions {
            assignments: self.assignments(run_id)?,
            scores: self.decision_scores(run_id)?,
            folds: self.folds(run_id)?,
            refused: self.refused_by_fluency_floor(run_id)?,
        })
    }

    /// The assigned negatives of every context in a run, in slot order.
    fn assignments(&self, run_id: i64) -> Result<BTreeMap<i64, Vec<i64>>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare(
            "SELECT example_id, ending_id FROM af_assignments WHERE run_id = ?1
         ORDER BY example_id, slot",
        )?;
        let mut out: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
        for row in stmt.query_map([run_id], |r| Ok((r.get(0)?, r.get(1)?)))? {
            let (example, ending) = row?;
            out.entry(example).or_default().push(ending);
        }
        Ok(out)
    }

    /// See [`AfDecisions::scores`].
    fn decision_scores(&self, run_id: i64) -> Result<HashMap<i64, f64>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare(
            "SELECT s.ending_id, s.score FROM af_scores s
         WHERE s.run_id = ?1 AND s.ending_id IN
           (SELECT ending_id FROM af_assignments WHERE run_id = ?1
            UNION SELECT ending_id FROM task_endings)",
        )?;
        let rows = stmt.query_map([run_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The final scores unverified distractors are matched on ([`FinalPoint`]) of every
    /// context's found ending (by example) and of every assigned negative (by ending).
    pub(crate) fn matching_scores(&self, run_id: i64) -> Result<MatchingScores> {
        let conn = &self.conn;
        let mut found = conn.prepare(
            "SELECT e.example_id, s.score, s.sentence_score, s.style_score FROM af_scores s
         JOIN endings e ON e.id = s.ending_id AND e.is_gold = 1
         WHERE s.run_id = ?1",
        )?;
        let mut assigned = conn.prepare(
            "SELECT s.ending_id, s.score, s.sentence_score, s.style_score FROM af_scores s
         JOIN af_assignments a ON a.run_id = s.run_id AND a.ending_id = s.ending_id
         WHERE s.run_id = ?1",
        )?;
        let row = |r: &rusqlite::Row| Ok((r.get(0)?, FinalPoint::from_row(r)?));
        let found = found
            .query_map([run_id], row)?
            .collect::<rusqlite::Result<_>>()?;
        let assigned = assigned
            .query_map([run_id], row)?
            .collect::<rusqlite::Result<_>>()?;
        Ok(MatchingScores { found, assigned })
    }

    /// Every scored generated candidate of one context (its pre-AF pool), with its final
    /// scores, in id order.
    pub fn scored_pool(&self, run_id: i64, example_id: i64) -> Result<Vec<(i64, FinalPoint)>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare_cached(
            "SELECT e.id, s.score, s.sentence_score, s.style_score FROM endings e
         JOIN af_scores s ON s.run_id = ?1 AND s.ending_id = e.id
         WHERE e.example_id = ?2 AND e.is_gold = 0 ORDER BY e.id",
        )?;
        let rows = stmt.query_map([run_id, example_id], |r| {
            Ok((r.get(0)?, FinalPoint::from_row(r)?))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The cross-fitting fold (SWAG's `fold-ind`) of every context of a run.
    pub(crate) fn folds(&self, run_id: i64) -> Result<HashMap<i64, i64>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare("SELECT example_id, fold FROM af_folds WHERE run_id = ?1")?;
        let rows = stmt.query_map([run_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Every ending of one context, found and generated: its text and the generator's mean
    /// log-probability of it after the context (`None` where not stored), by ending id.
    pub fn ending_readings(&self, example_id: i64) -> Result<HashMap<i64, (String, Option<f64>)>> {
        let conn = &self.conn;
        let mut stmt =
            conn.prepare_cached("SELECT id, text, lp_cond FROM endings WHERE example_id = ?1")?;
        let rows = stmt.query_map([example_id], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Every generated candidate of one context (its pre-AF pool) with its text, in id order.
    pub fn pool_candidate_texts(&self, example_id: i64) -> Result<Vec<(i64, String)>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare_cached(
            "SELECT id, text FROM endings WHERE example_id = ?1 AND is_gold = 0 ORDER BY id",
        )?;
        let rows = stmt.query_map([example_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

/// An ending's scores from the final cross-fitted pass, as distractors are matched on them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FinalPoint {
    /// The deciding model's score.
    pub ensemble: f64,
    /// The sentence model's own head; `None` for runs without a sentence model and for runs
    /// finished before afkit kept it.
    pub sentence: Option<f64>,
    /// The word-level heads' standardised mean; `None` for runs without those heads, runs where
    /// they found no style, and runs finished before afkit kept it.
    pub style: Option<f64>,
}

impl FinalPoint {
    /// From a row whose columns 1–3 are `score, sentence_score, style_score`.
    fn from_row(r: &rusqlite::Row) -> rusqlite::Result<FinalPoint> {
        Ok(FinalPoint {
            ensemble: r.get(1)?,
            sentence: r.get(2)?,
            style: r.get(3)?,
        })
    }
}

/// See [`Store::matching_scores`].
pub(crate) struct MatchingScores {
    /// By example: its found ending's scores.
    pub found: HashMap<i64, FinalPoint>,
    /// By ending: an assigned negative's scores.
    pub assigned: HashMap<i64, FinalPoint>,
}

/// The current (highest-round, open) annotation task of a context with its submissions.
#[derive(Debug, Clone, PartialEq)]
pub struct CurrentTask {
    pub task_id: i64,
    pub example_id: i64,
    pub round: i64,
    /// Ending ids in the shown order.
    pub endings: Vec<i64>,
    pub submissions: Vec<SubmissionRecord>,
    /// Every ending ever shown to annotators for the context (all rounds), so that a
    /// re-annotation never brings back an ending people already judged.
    pub ever_shown: BTreeSet<i64>,
    /// The context's superseded tasks, earliest round first: assembly finds the round that
    /// decided the question among them, and what the rounds after it add.
    pub earlier: Vec<EarlierRound>,
}

/// A superseded task of a context (a round before its open one), with its submissions.
#[derive(Debug, Clone, PartialEq)]
pub struct EarlierRound {
    pub round: i64,
    /// Ending ids in the shown order.
    pub endings: Vec<i64>,
    pub submissions: Vec<SubmissionRecord>,
}

/// Where a task's rows go: the open task of a context or one of its earlier rounds.
#[derive(Debug, Clone, Copy)]
enum TaskSlot {
    Open { example: i64 },
    Earlier { example: i64, index: usize },
}

impl TaskSlot {
    fn example(self) -> i64 {
        match self {
            TaskSlot::Open { example } | TaskSlot::Earlier { example, .. } => example,
        }
    }
}

/// The open task of every context that has one (the latest round) with its context's earlier
/// rounds, all without endings or submissions, by context; and where each task's rows go.
fn open_tasks(conn: &Connection) -> Result<(BTreeMap<i64, CurrentTask>, HashMap<i64, TaskSlot>)> {
    let mut tasks: BTreeMap<i64, CurrentTask> = BTreeMap::new();
    let mut stmt = conn.prepare(
        "SELECT t.id, t.example_id, t.round FROM tasks t
         WHERE t.status = 'open'
           AND t.round = (SELECT MAX(round) FROM tasks u WHERE u.example_id = t.example_id)
         ORDER BY t.example_id",
    )?;
    let mut slots: HashMap<i64, TaskSlot> = HashMap::new();
    for row in stmt.query_map([], |r| {
        Ok(CurrentTask {
            task_id: r.get(0)?,
            example_id: r.get(1)?,
            round: r.get(2)?,
            endings: Vec::new(),
            submissions: Vec::new(),
            ever_shown: BTreeSet::new(),
            earlier: Vec::new(),
        })
    })? {
        let task = row?;
        let example = task.example_id;
        slots.insert(task.task_id, TaskSlot::Open { example });
        tasks.insert(example, task);
    }
    let mut stmt = conn.prepare(
        "SELECT id, example_id, round FROM tasks WHERE status = 'superseded'
         ORDER BY example_id, round",
    )?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    for row in rows {
        let (task_id, example, round): (i64, i64, i64) = row?;
        let Some(current) = tasks.get_mut(&example) else {
            continue;
        };
        if round >= current.round {
            continue;
        }
        let index = current.earlier.len();
        current.earlier.push(EarlierRound {
            round,
            endings: Vec::new(),
            submissions: Vec::new(),
        });
        slots.insert(task_id, TaskSlot::Earlier { example, index });
    }
    Ok((tasks, slots))
}

/// Adds to each task of `tasks` (by context; `slots`: where each task's rows go) its endings in
/// the shown order, and every ending any task of its context showed.
fn add_endings(
    conn: &Connection,
    tasks: &mut BTreeMap<i64, CurrentTask>,
    slots: &HashMap<i64, TaskSlot>,
) -> Result<()> {
    let mut stmt = conn.prepare(
        "SELECT te.task_id, t.example_id, te.ending_id FROM task_endings te
         JOIN tasks t ON t.id = te.task_id ORDER BY te.task_id, te.position",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get(2)?))
    })?;
    for row in rows {
        let (task, example, ending) = row?;
        let Some(current) = tasks.get_mut(&example) else {
            continue;
        };
        current.ever_shown.insert(ending);
        match slots.get(&task) {
            Some(TaskSlot::Open { .. }) => current.endings.push(ending),
            Some(TaskSlot::Earlier { index, .. }) => current.earlier[*index].endings.push(ending),
            None => {}
        }
    }
    Ok(())
}

impl Store {
    /// The open task of every context that has one (the latest round), with all its submissions
    /// and its context's earlier rounds.
    pub fn current_tasks(&self) -> Result<BTreeMap<i64, CurrentTask>> {
        let (mut tasks, slots) = open_tasks(&self.conn)?;
        add_endings(&self.conn, &mut tasks, &slots)?;
        for submission in self.all_submissions()? {
            let Some(slot) = slots.get(&submission.task_id) else {
                continue;
            };
            let task = tasks.get_mut(&slot.example()).expect("task indexed");
            match *slot {
                TaskSlot::Open { .. } => task.submissions.push(submission),
                TaskSlot::Earlier { index, .. } => task.earlier[index].submissions.push(submission),
            }
        }
        Ok(tasks)
    }
}

/// A split is stored under its name.
impl ToSql for Split {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for Split {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Split> {
        value
            .as_str()?
            .parse()
            .map_err(|e: anyhow::Error| FromSqlError::Other(e.into()))
    }
}

impl Store {
    /// Which split each group (video) belongs to.
    pub fn load_splits(&self) -> Result<BTreeMap<String, Split>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare("SELECT grp, split FROM splits")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Replaces the split table with `splits` (call inside the assembly transaction).
    fn replace_splits(&self, splits: &BTreeMap<String, Split>) -> Result<()> {
        let conn = &self.conn;
        conn.execute("DELETE FROM splits", [])?;
        let mut stmt = conn.prepare("INSERT INTO splits(grp, split) VALUES (?1, ?2)")?;
        for (group, split) in splits {
            stmt.execute(params![group, split])?;
        }
        Ok(())
    }
}

/// A final example as assemble writes it.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAssembled {
    pub example_id: i64,
    pub split: Split,
    pub gold_ending_id: i64,
    pub gold_source: String,
    pub gold_type: Option<Judgement>,
    pub verified: bool,
    pub fold: Option<i64>,
    /// `(ending id, likely or unlikely; None when unverified)`, hardest first; up to four
    /// (`ending1..3` take three, `distractor-3` the fourth).
    pub distractors: Vec<(i64, Option<Judgement>)>,
}

impl Store {
    /// Deletes the previous assembly and writes `examples` in the given order (call inside a
    /// transaction so that the swap is atomic).
    fn replace_assembly(&self, examples: &[NewAssembled]) -> Result<()> {
        let conn = &self.conn;
        conn.execute("DELETE FROM assembled_distractors", [])?;
        conn.execute("DELETE FROM assembled", [])?;
        let mut insert = conn.prepare(
        "INSERT INTO assembled(example_id, split, gold_ending_id, gold_source, gold_type, verified, fold)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
        let mut insert_distractor = conn.prepare(
            "INSERT INTO assembled_distractors(assembled_id, position, ending_id, type)
         VALUES (?1, ?2, ?3, ?4)",
        )?;
        for ex in examples {
            insert.execute(params![
                ex.example_id,
                ex.split,
                ex.gold_ending_id,
                ex.gold_source,
                ex.gold_type.map(Judgement::as_str),
                ex.verified,
                ex.fold
            ])?;
            let id = conn.last_insert_rowid();
            for (position, (ending_id, kind)) in ex.distractors.iter().enumerate() {
                insert_distractor.execute(params![
                    id,
                    position as i64,
                    ending_id,
                    kind.map(Judgement::as_str)
                ])?;
            }
        }
        Ok(())
    }
}

/// A stored final example with the texts export needs.
#[derive(Debug, Clone, PartialEq)]
pub struct AssembledExample {
    pub id: i64,
    pub example_id: i64,
    pub ext_id: String,
    pub group: String,
    pub sent1: String,
    pub sent2: String,
    pub split: Split,
    pub gold_ending_id: i64,
    pub gold: String,
    pub gold_source: String,
    pub gold_type: Option<String>,
    pub verified: bool,
    pub fold: Option<i64>,
    /// (ending id, text, type), hardest first.
    pub distractors: Vec<(i64, String, Option<String>)>,
    /// The context's found ending (differs from `gold` for `gen-orig` examples).
    pub found_ending_id: i64,
}

impl Store {
    /// All assembled examples in assembly order.
    pub fn assembled_examples(&self) -> Result<Vec<AssembledExample>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare(
        "SELECT a.id, a.example_id, x.ext_id, x.grp, x.sent1, x.sent2, a.split, a.gold_ending_id,
                g.text, a.gold_source, a.gold_type, a.verified, a.fold, f.id
         FROM assembled a
         JOIN examples x ON x.id = a.example_id
         JOIN endings g ON g.id = a.gold_ending_id
         JOIN endings f ON f.example_id = a.example_id AND f.is_gold = 1
         ORDER BY a.id",
    )?;
        let mut out: Vec<AssembledExample> = stmt
            .query_map([], |r| {
                Ok(AssembledExample {
                    id: r.get(0)?,
                    example_id: r.get(1)?,
                    ext_id: r.get(2)?,
                    group: r.get(3)?,
                    sent1: r.get(4)?,
                    sent2: r.get(5)?,
                    split: r.get(6)?,
                    gold_ending_id: r.get(7)?,
                    gold: r.get(8)?,
                    gold_source: r.get(9)?,
                    gold_type: r.get(10)?,
                    verified: r.get::<_, i64>(11)? != 0,
                    fold: r.get(12)?,
                    distractors: Vec::new(),
                    found_ending_id: r.get(13)?,
                })
            })?
            .collect::<rusqlite::Result<_>>()?;
        let index: HashMap<i64, usize> = out.iter().enumerate().map(|(i, a)| (a.id, i)).collect();
        let mut stmt = conn.prepare(
            "SELECT d.assembled_id, d.ending_id, e.text, d.type FROM assembled_distractors d
         JOIN endings e ON e.id = d.ending_id ORDER BY d.assembled_id, d.position",
        )?;
        for row in stmt.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<String>>(3)?,
            ))
        })? {
            let (assembled, ending, text, kind) = row?;
            out[index[&assembled]]
                .distractors
                .push((ending, text, kind));
        }
        Ok(out)
    }
}

impl Store {
    /// Replaces the splits (each group's) and the previous assembly with `examples` (stored in
    /// that order), queues the `reannotations` (contexts sent back to annotation, with the
    /// endings their new task shows: the hand-off to annotate,
    /// [`Store::create_reannotation_task`]) and records the assembly's parameters under the
    /// `meta` key `assemble`, in one transaction: a re-run swaps the whole assembly at once, and
    /// the tasks it queues are committed with it or not at all.
    pub fn commit_assembly(
        &mut self,
        splits: &BTreeMap<String, Split>,
        examples: &[NewAssembled],
        reannotations: &[(i64, Vec<i64>)],
        record_json: &str,
    ) -> Result<()> {
        let tx = self.begin(TransactionBehavior::Deferred)?;
        self.replace_splits(splits)?;
        self.replace_assembly(examples)?;
        for (example_id, endings) in reannotations {
            self.create_reannotation_task(*example_id, endings)
                .with_context(|| format!("queueing re-annotation of example {example_id}"))?;
        }
        self.set_meta("assemble", record_json)?;
        let number = self.meta(ASSEMBLIES)?.and_then(|n| n.parse::<i64>().ok());
        self.set_meta(ASSEMBLIES, &(number.unwrap_or(0) + 1).to_string())?;
        tx.commit()?;
        Ok(())
    }

    /// Which assembly the project holds and the AF run it was made from; `None` before the
    /// first assembly.
    pub fn assembly_info(&self) -> Result<Option<AssemblyInfo>> {
        let Some(record) = self.meta("assemble")? else {
            return Ok(None);
        };
        let record: serde_json::Value = serde_json::from_str(&record)
            .context("the project's assembly record cannot be read")?;
        let af_run = record["af_run"]
            .as_i64()
            .context("the project's assembly record names no AF run")?;
        // Assemblies made before they were numbered count as the first.
        let number = self
            .meta(ASSEMBLIES)?
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        Ok(Some(AssemblyInfo { number, af_run }))
    }
}

/// The `meta` key counting the project's assemblies.
const ASSEMBLIES: &str = "assemblies";

/// An assembly: its number in the project (1 for the first) and the AF run it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AssemblyInfo {
    pub number: i64,
    pub af_run: i64,
}
