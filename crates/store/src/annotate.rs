//! Annotate's tables: tasks (items to verify), claims (who holds which item), skips,
//! submissions and labels; plus the reads of the filter stage's results that tasks are made from,
//! and the re-annotation tasks that assemble queues ([`Store::create_reannotation_task`]): the one place
//! where a later stage writes annotate's tables, kept here so that neither stage imports the other.
//!
//! Every write that decides who gets what runs in a `BEGIN IMMEDIATE` transaction: it takes the
//! file's write lock before reading, so two annotator processes never both see an item as free.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::{get_meta, now, set_meta, SqlSeed, Store};
use crate::dataset::{Judgement, Rank};
use afkit_engine::seed::{Key, Seed};

/// How items are handed out: the first `agreement_items` round-0 tasks go to `replicas`
/// annotators each, the rest to one; `seed` fixes the order of contexts and every shuffle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub agreement_items: i64,
    pub replicas: i64,
    pub seed: Seed,
}

impl Policy {
    const KEYS: [&'static str; 3] = [
        "annotate.agreement_items",
        "annotate.replicas",
        "annotate.seed",
    ];
}

/// The policy of a project that has recorded none (no task made yet).
pub const DEFAULT_POLICY: Policy = Policy {
    agreement_items: 100,
    replicas: 3,
    seed: Seed::new(0),
};

impl Store {
    /// The policy recorded in the project, if tasks were made before.
    pub fn stored_policy(&self) -> Result<Option<Policy>> {
        let conn = &self.conn;
        let mut values = Vec::new();
        for key in Policy::KEYS {
            match get_meta(conn, key)? {
                Some(v) => values.push(v),
                None => return Ok(None),
            }
        }
        let parse = |i: usize| -> Result<i64> {
            values[i].parse().with_context(|| {
                format!(
                    "meta {} = {:?} is not an integer",
                    Policy::KEYS[i],
                    values[i]
                )
            })
        };
        Ok(Some(Policy {
            agreement_items: parse(0)?,
            replicas: parse(1)?,
            seed: Seed::new(parse(2)? as u64),
        }))
    }

    pub fn record_policy(&self, policy: &Policy) -> Result<()> {
        let conn = &self.conn;
        set_meta(conn, Policy::KEYS[0], &policy.agreement_items.to_string())?;
        set_meta(conn, Policy::KEYS[1], &policy.replicas.to_string())?;
        set_meta(
            conn,
            Policy::KEYS[2],
            &(policy.seed.value() as i64).to_string(),
        )?;
        Ok(())
    }

    /// Sets `replicas` of every round-0 task from the policy: R for the first M by id, else 1.
    pub fn apply_replicas(&self, policy: &Policy) -> Result<()> {
        let conn = &self.conn;
        conn.execute(
            "UPDATE tasks SET replicas = CASE WHEN id IN
            (SELECT id FROM tasks WHERE round = 0 ORDER BY id LIMIT ?1) THEN ?2 ELSE 1 END
         WHERE round = 0",
            params![policy.agreement_items, policy.replicas],
        )?;
        Ok(())
    }
}

/// A context of an AF run that has no task yet, with its candidates for one.
#[derive(Debug, Clone, PartialEq)]
pub struct UntaskedContext {
    pub example_id: i64,
    pub gold_ending_id: i64,
    /// The assigned negatives, hardest (highest final ensemble score) first; endings without a
    /// score come last, in id order.
    pub negatives: Vec<i64>,
}

impl Store {
    /// Contexts of `run_id` that no task (of any run or round) shows yet, in example id order.
    /// Whether some context of `run_id` has assigned negatives but no task yet.
    pub fn has_untasked_contexts(&self, run_id: i64) -> Result<bool> {
        Ok(self.conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM af_assignments a WHERE a.run_id = ?1
               AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.example_id = a.example_id))",
            [run_id],
            |r| r.get(0),
        )?)
    }

    pub fn untasked_contexts(&self, run_id: i64) -> Result<Vec<UntaskedContext>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare(
            "SELECT a.example_id, g.id, a.ending_id
         FROM af_assignments a
         JOIN endings g ON g.example_id = a.example_id AND g.is_gold = 1
         LEFT JOIN af_scores s ON s.run_id = a.run_id AND s.ending_id = a.ending_id
         WHERE a.run_id = ?1
           AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.example_id = a.example_id)
         ORDER BY a.example_id, s.score IS NULL, s.score DESC, a.ending_id",
        )?;
        let mut out: Vec<UntaskedContext> = Vec::new();
        let mut rows = stmt.query([run_id])?;
        while let Some(r) = rows.next()? {
            let (example_id, gold, ending): (i64, i64, i64) = (r.get(0)?, r.get(1)?, r.get(2)?);
            match out.last_mut() {
                Some(last) if last.example_id == example_id => last.negatives.push(ending),
                _ => out.push(UntaskedContext {
                    example_id,
                    gold_ending_id: gold,
                    negatives: vec![ending],
                }),
            }
        }
        Ok(out)
    }
}

/// Endings shown per task: the found one and five negatives, as in SWAG.
pub const ENDINGS_PER_TASK: usize = 6;

/// A task to store: `endings` in the order they are shown.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTask {
    pub example_id: i64,
    pub run_id: i64,
    pub round: i64,
    pub replicas: i64,
    pub seed: Seed,
    pub endings: Vec<i64>,
}

impl Store {
    pub fn insert_task(&self, task: &NewTask) -> Result<i64> {
        let conn = &self.conn;
        conn.execute(
            "INSERT INTO tasks(example_id, run_id, round, replicas, seed, status, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'open', ?6)",
            params![
                task.example_id,
                task.run_id,
                task.round,
                task.replicas,
                SqlSeed(task.seed),
                now()
            ],
        )?;
        let task_id = conn.last_insert_rowid();
        let mut stmt = conn.prepare(
            "INSERT INTO task_endings(task_id, position, ending_id) VALUES (?1, ?2, ?3)",
        )?;
        for (position, ending) in task.endings.iter().enumerate() {
            stmt.execute(params![task_id, position as i64, ending])?;
        }
        Ok(task_id)
    }

    pub fn count_round0_tasks(&self) -> Result<i64> {
        let conn = &self.conn;
        Ok(
            conn.query_row("SELECT COUNT(*) FROM tasks WHERE round = 0", [], |r| {
                r.get(0)
            })?,
        )
    }

    /// The open task of a context (its latest round), if any: `(task_id, run_id, round)`.
    fn open_task_of(&self, example_id: i64) -> Result<Option<(i64, i64, i64)>> {
        let conn = &self.conn;
        Ok(conn
            .query_row(
                "SELECT id, run_id, round FROM tasks WHERE example_id = ?1 AND status = 'open'
             ORDER BY round DESC LIMIT 1",
                [example_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()?)
    }

    fn max_round(&self, example_id: i64) -> Result<Option<i64>> {
        let conn = &self.conn;
        Ok(conn.query_row(
            "SELECT MAX(round) FROM tasks WHERE example_id = ?1",
            [example_id],
            |r| r.get(0),
        )?)
    }

    /// Marks every open task of a context superseded and drops claims on them.
    fn supersede_tasks_of(&self, example_id: i64) -> Result<()> {
        let conn = &self.conn;
        conn.execute(
            "DELETE FROM claims WHERE task_id IN
           (SELECT id FROM tasks WHERE example_id = ?1 AND status = 'open')",
            [example_id],
        )?;
        conn.execute(
            "UPDATE tasks SET status = 'superseded' WHERE example_id = ?1 AND status = 'open'",
            [example_id],
        )?;
        Ok(())
    }

    /// Endings of a context that the caller may show: `(ending_id, is_gold)` of every ending row.
    fn endings_of_example(&self, example_id: i64) -> Result<HashMap<i64, bool>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare("SELECT id, is_gold FROM endings WHERE example_id = ?1")?;
        let rows = stmt.query_map([example_id], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? != 0)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

// ----- re-annotation: the hand-off from assemble -----

impl Store {
    /// Queues a re-annotation of a context (SWAG fn. 6): a new task one round after its current one,
    /// showing `endings` (the found ending among them, 2 to 6 distinct endings of this context) in an
    /// order shuffled with a seed derived from the project's annotation seed, the context and the
    /// round, and recorded in the task. The old open task is marked superseded and its claims
    /// dropped. One annotator per re-annotated item, as SWAG did after its agreement sample.
    /// Assemble calls it inside its own transaction, so that the assembly and the tasks it queues
    /// are committed together; returns the new task id.
    pub(crate) fn create_reannotation_task(&self, example_id: i64, endings: &[i64]) -> Result<i64> {
        self.check_reannotation_endings(example_id, endings)?;
        let (run_id, round) = self.next_round(example_id)?;
        let policy_seed = self.stored_policy()?.unwrap_or(DEFAULT_POLICY).seed;
        let seed = task_seed(policy_seed, example_id, round);
        let mut order = endings.to_vec();
        shuffle_endings(&mut order, seed);
        self.supersede_tasks_of(example_id)?;
        self.insert_task(&NewTask {
            example_id,
            run_id,
            round,
            replicas: 1,
            seed,
            endings: order,
        })
    }

    /// A re-annotation shows 2 to [`ENDINGS_PER_TASK`] distinct endings of the context, its found
    /// ending among them.
    fn check_reannotation_endings(&self, example_id: i64, endings: &[i64]) -> Result<()> {
        let known = self.endings_of_example(example_id)?;
        if !(2..=ENDINGS_PER_TASK).contains(&endings.len()) {
            bail!(
                "a re-annotation task of example {example_id} needs 2 to {ENDINGS_PER_TASK} endings, got {}",
                endings.len()
            );
        }
        let mut seen = std::collections::HashSet::new();
        for id in endings {
            if !known.contains_key(id) {
                bail!("ending {id} does not belong to example {example_id}");
            }
            if !seen.insert(id) {
                bail!("ending {id} is listed twice for example {example_id}");
            }
        }
        if !endings.iter().any(|id| known[id]) {
            bail!("a re-annotation task of example {example_id} must show its found ending");
        }
        Ok(())
    }

    /// The AF run and round of a context's next task: its open task's run, one round later; else
    /// the latest finished run, after any closed rounds.
    fn next_round(&self, example_id: i64) -> Result<(i64, i64)> {
        Ok(match self.open_task_of(example_id)? {
            Some((_, run, _)) => (run, self.max_round(example_id)?.expect("a task exists") + 1),
            None => (
                self.latest_finished_af_run()?
                    .context("no finished AF run to attach a re-annotation task to")?
                    .id,
                self.max_round(example_id)?.map_or(0, |r| r + 1),
            ),
        })
    }
}

// ----- task seeds: recorded in `tasks.seed`, so a task's order can be reproduced -----

/// The shuffle seed of one task, recorded in `tasks.seed`: derived from the annotation policy's
/// seed with the context and the round as the key.
pub fn task_seed(policy_seed: Seed, example_id: i64, round: i64) -> Seed {
    policy_seed.key(Key::Task {
        example: example_id,
        round,
    })
}

/// The order in which a run's new contexts are handed out: from the annotation policy's seed,
/// with the AF run as the key.
pub fn handout_rng(policy_seed: Seed, run_id: i64) -> ChaCha8Rng {
    policy_seed.key(Key::Handout(run_id)).rng()
}

/// Puts `endings` in the order a task with this seed shows them.
pub fn shuffle_endings(endings: &mut [i64], seed: Seed) {
    endings.shuffle(&mut seed.rng());
}

/// One ending as a task shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskEnding {
    pub ending_id: i64,
    pub text: String,
    pub is_gold: bool,
}

/// Everything a task shows (the found ending is among `endings`; the UI never says which).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskView {
    pub task_id: i64,
    pub example_id: i64,
    pub ext_id: String,
    pub round: i64,
    pub replicas: i64,
    pub open: bool,
    pub sent1: String,
    pub sent2: String,
    /// In display order (position 0 is "1" on screen).
    pub endings: Vec<TaskEnding>,
}

impl TaskView {
    pub fn startphrase(&self) -> String {
        crate::dataset::startphrase(&self.sent1, &self.sent2)
    }
}

impl Store {
    pub fn task_view(&self, task_id: i64) -> Result<Option<TaskView>> {
        let conn = &self.conn;
        let head = conn
        .query_row(
            "SELECT t.id, t.example_id, x.ext_id, t.round, t.replicas, t.status = 'open', x.sent1, x.sent2
             FROM tasks t JOIN examples x ON x.id = t.example_id WHERE t.id = ?1",
            [task_id],
            |r| {
                Ok(TaskView {
                    task_id: r.get(0)?,
                    example_id: r.get(1)?,
                    ext_id: r.get(2)?,
                    round: r.get(3)?,
                    replicas: r.get(4)?,
                    open: r.get(5)?,
                    sent1: r.get(6)?,
                    sent2: r.get(7)?,
                    endings: Vec::new(),
                })
            },
        )
        .optional()?;
        let Some(mut view) = head else {
            return Ok(None);
        };
        let mut stmt = conn.prepare_cached(
        "SELECT e.id, e.text, e.is_gold FROM task_endings te JOIN endings e ON e.id = te.ending_id
         WHERE te.task_id = ?1 ORDER BY te.position",
    )?;
        let rows = stmt.query_map([task_id], |r| {
            Ok(TaskEnding {
                ending_id: r.get(0)?,
                text: r.get(1)?,
                is_gold: r.get::<_, i64>(2)? != 0,
            })
        })?;
        view.endings = rows.collect::<rusqlite::Result<_>>()?;
        Ok(Some(view))
    }

    /// Open tasks in hand-out order; with `unfinished_only`, only those still short of annotators.
    pub fn open_tasks(&self, unfinished_only: bool) -> Result<Vec<TaskView>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare(
            "SELECT t.id FROM tasks t WHERE t.status = 'open' AND (?1 = 0 OR t.submitted < t.replicas)
         ORDER BY t.id",
        )?;
        let ids: Vec<i64> = stmt
            .query_map([unfinished_only as i64], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        ids.into_iter()
            .map(|id| Ok(self.task_view(id)?.expect("task listed above exists")))
            .collect()
    }
}

/// The process that holds claims for an annotator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub annotator: String,
    pub pid: u32,
    pub host: String,
}

impl Holder {
    /// This process, on this machine.
    pub fn this_process(annotator: &str) -> Holder {
        Holder {
            annotator: annotator.to_string(),
            pid: std::process::id(),
            host: hostname(),
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".to_string())
}

/// Whether a process of this machine still runs. Without /proc (not Linux) nothing is known, and
/// claims expire by age only.
fn process_alive(pid: u32) -> bool {
    let proc_root = std::path::Path::new("/proc");
    !proc_root.join("self").exists() || proc_root.join(pid.to_string()).exists()
}

/// A claim not refreshed for this long no longer reserves its item (the holder heartbeats
/// every [`HEARTBEAT`] while the item is on screen).
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(10 * 60);
/// How often a running session refreshes its claim.
pub const HEARTBEAT: Duration = Duration::from_secs(60);

fn cutoff(age: Duration) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
        - age.as_secs_f64();
    super::format_timestamp(secs)
}

/// A session's hand-out preference: per connection, in SQLite's temporary database.
const HANDOUT_PRIORITY: &str = "CREATE TEMP TABLE IF NOT EXISTS handout_priority (
    task_id INTEGER PRIMARY KEY,
    rank    INTEGER NOT NULL UNIQUE
);";

/// SQL condition: task `t` still wants a submission. Written as the partial index
/// `tasks_wanting` states it, so that queries with it read that index: finished tasks are never
/// looked at again, however many there are.
const WANTING: &str = "t.status = 'open' AND t.submitted < t.replicas";

/// SQL condition on a wanting task `t`: it can take one more annotator other than ?1 (annotator)
/// given the live claims of others (?2 = stale cutoff), and ?1 has neither submitted nor skipped
/// it. Every task it rules out is one ?1 submitted or skipped or one others have claimed.
const TAKES_ANNOTATOR: &str = "
    NOT EXISTS (SELECT 1 FROM submissions s WHERE s.task_id = t.id AND s.annotator = ?1)
    AND NOT EXISTS (SELECT 1 FROM skips k WHERE k.task_id = t.id AND k.annotator = ?1)
    AND t.submitted
      + (SELECT COUNT(*) FROM claims c WHERE c.task_id = t.id AND c.annotator <> ?1
           AND c.pid IS NOT NULL AND c.seen_at > ?2) < t.replicas";

/// The tasks [`TAKES_ANNOTATOR`] can rule out for ?1: those ?1 submitted or skipped, and those
/// others hold a live claim on.
const RULED_OUT_CANDIDATES: &str = "SELECT task_id FROM submissions WHERE annotator = ?1
    UNION SELECT task_id FROM skips WHERE annotator = ?1
    UNION SELECT task_id FROM claims WHERE annotator <> ?1 AND pid IS NOT NULL AND seen_at > ?2";

impl Store {
    /// Makes every submission, skip and undo reach the disk before it returns: a label, once
    /// the next item shows, survives even a power cut, not only a killed process.
    pub fn sync_every_label(&mut self) {
        self.sync_labels = true;
    }
}

impl Store {
    /// Makes this connection hand out the tasks `task_ids` first, in that order (then the rest in
    /// id order): a session's own preference (`annotate --order risk`), kept in a temporary table
    /// that other processes never see.
    pub fn set_handout_priority(&self, task_ids: &[i64]) -> Result<()> {
        self.conn
            .execute_batch(&format!("{HANDOUT_PRIORITY} DELETE FROM handout_priority;"))?;
        let mut stmt = self
            .conn
            .prepare("INSERT OR IGNORE INTO handout_priority(task_id, rank) VALUES (?1, ?2)")?;
        for (rank, id) in task_ids.iter().enumerate() {
            stmt.execute(params![id, rank as i64])?;
        }
        Ok(())
    }

    /// Hands `holder` its next item, atomically: its own unfinished claim first (the item it had on
    /// screen when it stopped), else the first eligible open task in the session's priority order
    /// ([`Store::set_handout_priority`]), then in id order. `None` when nothing is left for this
    /// annotator.
    pub fn claim_next(&mut self, holder: &Holder) -> Result<Option<TaskView>> {
        self.conn.execute_batch(HANDOUT_PRIORITY)?;
        let tx = self.begin(TransactionBehavior::Immediate)?;
        forget_dead_holders(&tx, holder)?;
        let stale = cutoff(STALE_AFTER);
        let mine: Option<i64> = tx
            .query_row(
                "SELECT task_id FROM claims WHERE annotator = ?1 ORDER BY claimed_at DESC LIMIT 1",
                [&holder.annotator],
                |r| r.get(0),
            )
            .optional()?;
        let still_eligible = match mine {
            Some(task) => tx
                .query_row(
                    &format!(
                        "SELECT 1 FROM tasks t WHERE t.id = ?3 AND {WANTING} AND {TAKES_ANNOTATOR}"
                    ),
                    params![holder.annotator, stale, task],
                    |_| Ok(()),
                )
                .optional()?
                .is_some(),
            None => false,
        };
        let task = if still_eligible {
            mine
        } else {
            next_wanting(&tx, holder, &stale)?
        };
        tx.execute(
            "DELETE FROM claims WHERE annotator = ?1 AND task_id IS NOT ?2",
            params![holder.annotator, task],
        )?;
        let Some(task) = task else {
            tx.commit()?;
            return Ok(None);
        };
        let at = now();
        tx.execute(
            "INSERT INTO claims(task_id, annotator, claimed_at, seen_at, pid, host)
         VALUES (?1, ?2, ?3, ?3, ?4, ?5)
         ON CONFLICT(task_id, annotator) DO UPDATE
           SET seen_at = excluded.seen_at, pid = excluded.pid, host = excluded.host",
            params![task, holder.annotator, at, holder.pid, holder.host],
        )?;
        let view = self.task_view(task)?.expect("claimed task exists");
        tx.commit()?;
        Ok(Some(view))
    }
}

/// The first task `holder` may take: in the session's priority order, else in id order.
fn next_wanting(conn: &Connection, holder: &Holder, stale: &str) -> Result<Option<i64>> {
    let first = |sql: String| -> Result<Option<i64>> {
        Ok(conn
            .query_row(&sql, params![holder.annotator, stale], |r| r.get(0))
            .optional()?)
    };
    let prioritised = first(format!(
        "SELECT t.id FROM handout_priority p JOIN tasks t ON t.id = p.task_id
         WHERE {WANTING} AND {TAKES_ANNOTATOR} ORDER BY p.rank LIMIT 1"
    ))?;
    match prioritised {
        Some(task) => Ok(Some(task)),
        None => first(format!(
            "SELECT t.id FROM tasks t WHERE {WANTING} AND {TAKES_ANNOTATOR} ORDER BY t.id LIMIT 1"
        )),
    }
}

/// Claims held by processes of this machine that have exited lose their pid: their items are
/// free for others at once (their annotators still get them back first).
fn forget_dead_holders(conn: &Connection, holder: &Holder) -> Result<()> {
    let mut stmt = conn.prepare(
        "SELECT DISTINCT pid FROM claims WHERE host = ?1 AND pid IS NOT NULL AND pid <> ?2",
    )?;
    let pids: Vec<u32> = stmt
        .query_map(params![holder.host, holder.pid], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for pid in pids.into_iter().filter(|&p| !process_alive(p)) {
        conn.execute(
            "UPDATE claims SET pid = NULL WHERE host = ?1 AND pid = ?2",
            params![holder.host, pid],
        )?;
    }
    Ok(())
}

impl Store {
    /// Ends the holder's session: its claims lose their pid, so their items are free for others at
    /// once, on any machine, while the annotator still gets them back first when it resumes.
    pub fn release_claims(&self, holder: &Holder) -> Result<()> {
        self.conn.execute(
            "UPDATE claims SET pid = NULL WHERE annotator = ?1 AND pid = ?2 AND host = ?3",
            params![holder.annotator, holder.pid, holder.host],
        )?;
        Ok(())
    }

    /// Refreshes the holder's claim on `task_id` so that it stays reserved while on screen.
    pub fn heartbeat(&self, holder: &Holder, task_id: i64) -> Result<()> {
        self.conn.execute(
        "UPDATE claims SET seen_at = ?3, pid = ?4, host = ?5 WHERE task_id = ?1 AND annotator = ?2",
        params![task_id, holder.annotator, now(), holder.pid, holder.host],
    )?;
        Ok(())
    }
}

/// Where a submission came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
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
    pub origin: Origin,
    pub broken: bool,
    /// Time the annotator spent on the item.
    pub seconds: Option<f64>,
    /// When it was submitted; `None` = now.
    pub submitted_at: Option<String>,
    pub labels: Vec<EndingLabel>,
}

impl Store {
    /// Inserts a submission and its labels (the caller provides the transaction).
    pub fn insert_submission(&self, sub: &NewSubmission) -> Result<i64> {
        let conn = &self.conn;
        let at = sub.submitted_at.clone().unwrap_or_else(now);
        conn.prepare_cached(
            "INSERT INTO submissions(task_id, annotator, origin, broken, seconds, submitted_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![
            sub.task_id,
            sub.annotator,
            sub.origin.as_str(),
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
        let id = self.insert_submission(sub)?;
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
        // Every wanting task less those ruled out for this annotator, counted among the few
        // candidates: a count over every wanting task would cost each item a scan of the project.
        let remaining = conn.query_row(
            &format!(
                "SELECT (SELECT COUNT(*) FROM tasks t WHERE {WANTING})
                      - (SELECT COUNT(*) FROM tasks t WHERE t.id IN ({RULED_OUT_CANDIDATES})
                           AND {WANTING} AND NOT ({TAKES_ANNOTATOR}))"
            ),
            params![annotator, cutoff(STALE_AFTER)],
            |r| r.get(0),
        )?;
        Ok(AnnotatorProgress {
            done: items.len() as i64,
            items,
            remaining,
        })
    }

    /// Submissions of a task so far, by any annotator.
    pub fn submission_count(&self, task_id: i64) -> Result<i64> {
        let conn = &self.conn;
        Ok(conn.query_row(
            "SELECT COUNT(*) FROM submissions WHERE task_id = ?1",
            [task_id],
            |r| r.get(0),
        )?)
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
    /// `(label, is_gold)` per ending; empty when broken.
    pub labels: Vec<(EndingLabel, bool)>,
}

impl Store {
    /// Every submission, ordered by task then submission id.
    pub fn all_submissions(&self) -> Result<Vec<SubmissionRecord>> {
        let conn = &self.conn;
        let mut stmt = conn.prepare(
        "SELECT s.id, s.task_id, t.example_id, s.annotator, s.broken, s.seconds, s.submitted_at,
                l.ending_id, l.judgement, l.rank, e.is_gold
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
                    labels: Vec::new(),
                });
            }
            if let Some(ending_id) = r.get::<_, Option<i64>>(7)? {
                let label = label_from_row(ending_id, &r.get::<_, String>(8)?, r.get(9)?)?;
                let is_gold = r.get::<_, i64>(10)? != 0;
                out.last_mut()
                    .expect("pushed above")
                    .labels
                    .push((label, is_gold));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pid no process has (above Linux's pid_max).
    const DEAD_PID: u32 = 4_000_000_000;

    /// A filtered project with a round-0 task per context, in example order: the first `m` for
    /// `r` annotators each, the rest for one (the hand-out these tests exercise, without the
    /// annotate stage's seeded order).
    fn project(contexts: usize, m: i64, r: i64) -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::create(&dir.path().join("p.sqlite")).unwrap();
        let run_id = store.synthetic_af_project(contexts, 6, 3).unwrap();
        for (index, context) in (0..).zip(store.untasked_contexts(run_id).unwrap()) {
            let mut endings = vec![context.gold_ending_id];
            endings.extend(&context.negatives[..ENDINGS_PER_TASK - 1]);
            let task = NewTask {
                example_id: context.example_id,
                run_id,
                round: 0,
                replicas: if index < m { r } else { 1 },
                seed: Seed::new(0),
                endings,
            };
            store.insert_task(&task).unwrap();
        }
        (dir, store)
    }

    fn holder(name: &str, pid: u32) -> Holder {
        Holder {
            annotator: name.into(),
            pid,
            host: "testhost".into(),
        }
    }

    fn complete(task: &TaskView, who: &str) -> NewSubmission {
        NewSubmission {
            task_id: task.task_id,
            annotator: who.into(),
            origin: Origin::Tui,
            broken: false,
            seconds: Some(1.0),
            submitted_at: None,
            labels: task
                .endings
                .iter()
                .enumerate()
                .map(|(i, e)| EndingLabel {
                    ending_id: e.ending_id,
                    judgement: Judgement::Likely,
                    rank: [Some(Rank::Best), Some(Rank::Second)]
                        .get(i)
                        .copied()
                        .flatten(),
                })
                .collect(),
        }
    }

    #[test]
    fn flushed_labels_are_kept_across_checkpoints_by_other_connections() {
        let (dir, mut store) = project(4, 0, 1);
        store.sync_every_label();
        let a = holder("a", std::process::id());
        let other = Connection::open(dir.path().join("p.sqlite")).unwrap();
        for round in 0..3 {
            let task = store.claim_next(&a).unwrap().unwrap();
            if round == 1 {
                // Another process empties the log while this store keeps it open.
                other
                    .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                    .unwrap();
            }
            store.submit(&complete(&task, "a")).unwrap();
        }
        let task = store.claim_next(&a).unwrap().unwrap();
        store.skip(&a, task.task_id).unwrap();
        assert!(store.undo_last(&a).unwrap().is_some());
        let stored: i64 = other
            .query_row("SELECT COUNT(*) FROM submissions", [], |r| r.get(0))
            .unwrap();
        assert_eq!(stored, 3);
    }

    #[test]
    fn submission_counts_follow_every_submission_and_survive_the_upgrade() {
        let (dir, mut store) = project(5, 2, 2);
        let me = std::process::id();
        let (a, b) = (holder("a", me), holder("b", me));
        for who in [&a, &b, &a, &a] {
            let task = store.claim_next(who).unwrap().unwrap();
            store.submit(&complete(&task, &who.annotator)).unwrap();
        }
        let undone = store.undo_last(&a).unwrap().unwrap();
        let counts = |store: &Store| -> Vec<(i64, i64)> {
            store
                .conn
                .prepare(
                    "SELECT t.submitted, (SELECT COUNT(*) FROM submissions s WHERE s.task_id = t.id)
                     FROM tasks t ORDER BY t.id",
                )
                .unwrap()
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap()
        };
        // A live claim of b's and a skip of a's rule items out as well.
        store.claim_next(&b).unwrap().unwrap();
        let skipped = store.claim_next(&holder("c", me)).unwrap().unwrap();
        store.skip(&holder("c", me), skipped.task_id).unwrap();
        for who in ["a", "b", "c", "d"] {
            let by_scan: i64 = store
                .conn
                .query_row(
                    &format!("SELECT COUNT(*) FROM tasks t WHERE {WANTING} AND {TAKES_ANNOTATOR}"),
                    params![who, cutoff(STALE_AFTER)],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(
                store.annotator_progress(who).unwrap().remaining,
                by_scan,
                "{who}"
            );
        }
        let kept = counts(&store);
        assert!(kept.iter().all(|(kept, real)| kept == real), "{kept:?}");
        assert_eq!(kept.iter().map(|c| c.1).sum::<i64>(), 3);
        let remaining = store.annotator_progress("a").unwrap().remaining;
        // A project of schema 5 (no counts) gets them from its submissions when opened.
        let path = dir.path().join("p.sqlite");
        drop(store);
        crate::fixtures::Fixtures::on(&Connection::open(&path).unwrap())
            .back_to_schema_5()
            .unwrap();
        let mut store = Store::open(&path).unwrap();
        assert_eq!(counts(&store), kept);
        assert_eq!(store.annotator_progress("a").unwrap().remaining, remaining);
        let again = store.claim_next(&a).unwrap().unwrap();
        assert_eq!(
            again.task_id, undone.task.task_id,
            "the undone item comes back"
        );
    }

    #[test]
    fn claims_fill_replicas_and_nobody_gets_an_item_twice() {
        let (_dir, mut store) = project(3, 1, 2);
        let me = std::process::id();
        let (a, b, c) = (holder("a", me), holder("b", me), holder("c", me));
        let ta = store.claim_next(&a).unwrap().unwrap();
        let tb = store.claim_next(&b).unwrap().unwrap();
        assert_eq!(
            ta.task_id, tb.task_id,
            "the agreement item goes to two annotators"
        );
        assert_eq!(ta.replicas, 2);
        let tc = store.claim_next(&c).unwrap().unwrap();
        assert_ne!(
            tc.task_id, ta.task_id,
            "a third annotator gets the next item"
        );
        // Asking again returns the same claimed item (the resume point).
        assert_eq!(store.claim_next(&a).unwrap().unwrap().task_id, ta.task_id);
        store.submit(&complete(&ta, "a")).unwrap();
        let next = store.claim_next(&a).unwrap().unwrap();
        assert!(next.task_id != ta.task_id && next.task_id != tc.task_id);
        store.submit(&complete(&next, "a")).unwrap();
        assert_eq!(store.claim_next(&a).unwrap(), None, "c holds the last item");
        assert_eq!(store.annotator_progress("a").unwrap().done, 2);
    }

    #[test]
    fn items_of_dead_processes_go_to_others_but_come_back_to_their_owner_first() {
        let (_dir, mut store) = project(2, 0, 1);
        let me = std::process::id();
        let ghost = holder("ghost", DEAD_PID);
        let held = store.claim_next(&ghost).unwrap().unwrap();
        // The ghost's process is gone: its item is free for others.
        let other = store.claim_next(&holder("other", me)).unwrap().unwrap();
        assert_eq!(other.task_id, held.task_id);
        // Back under the same name, the ghost gets another item, since "other" holds its old one.
        let back = store.claim_next(&holder("ghost", me)).unwrap().unwrap();
        assert_ne!(back.task_id, held.task_id);
        // Without competition the owner's claim comes back first.
        let (_d2, mut store) = project(2, 0, 1);
        let first = store.claim_next(&holder("ann", DEAD_PID)).unwrap().unwrap();
        let resumed = store.claim_next(&holder("ann", me)).unwrap().unwrap();
        assert_eq!(resumed.task_id, first.task_id);
    }

    #[test]
    fn skip_and_undo() {
        let (_dir, mut store) = project(2, 0, 1);
        let a = holder("a", std::process::id());
        let first = store.claim_next(&a).unwrap().unwrap();
        store.skip(&a, first.task_id).unwrap();
        let second = store.claim_next(&a).unwrap().unwrap();
        assert_ne!(
            second.task_id, first.task_id,
            "a skipped item is not offered again"
        );
        store.submit(&complete(&second, "a")).unwrap();
        assert_eq!(store.claim_next(&a).unwrap(), None);
        // Undo takes back the submission (the latest action) with its labels, then the skip.
        let undone = store.undo_last(&a).unwrap().unwrap();
        assert_eq!(
            (undone.task.task_id, undone.was),
            (second.task_id, UndoneKind::Submission)
        );
        assert_eq!(undone.labels.len(), second.endings.len());
        assert_eq!(store.annotator_progress("a").unwrap().done, 0);
        assert_eq!(
            store.claim_next(&a).unwrap().unwrap().task_id,
            second.task_id
        );
        let undone = store.undo_last(&a).unwrap().unwrap();
        assert_eq!(
            (undone.task.task_id, undone.was),
            (first.task_id, UndoneKind::Skip)
        );
        assert_eq!(store.undo_last(&a).unwrap(), None);
    }

    #[test]
    fn reannotation_supersedes_the_open_task() {
        let (_dir, store) = project(2, 0, 1);
        let old = store.open_tasks(false).unwrap()[0].clone();
        let mut endings: Vec<i64> = old.endings.iter().map(|e| e.ending_id).collect();
        endings.truncate(4);
        if !old.endings[..4].iter().any(|e| e.is_gold) {
            endings[0] = old.endings.iter().find(|e| e.is_gold).unwrap().ending_id;
        }
        let new_id = store
            .create_reannotation_task(old.example_id, &endings)
            .unwrap();
        let new = store.task_view(new_id).unwrap().unwrap();
        assert_eq!((new.round, new.replicas, new.open), (1, 1, true));
        let mut shown: Vec<i64> = new.endings.iter().map(|e| e.ending_id).collect();
        shown.sort();
        endings.sort();
        assert_eq!(shown, endings);
        assert!(!store.task_view(old.task_id).unwrap().unwrap().open);
        // Endings of another context, or no found ending, are refused.
        let other = store.open_tasks(false).unwrap()[0].clone();
        assert_ne!(other.example_id, old.example_id);
        let foreign: Vec<i64> = other.endings.iter().map(|e| e.ending_id).collect();
        assert!(store
            .create_reannotation_task(old.example_id, &foreign)
            .is_err());
        let no_gold: Vec<i64> = new
            .endings
            .iter()
            .filter(|e| !e.is_gold)
            .map(|e| e.ending_id)
            .collect();
        assert!(store
            .create_reannotation_task(old.example_id, &no_gold)
            .is_err());
    }
}
